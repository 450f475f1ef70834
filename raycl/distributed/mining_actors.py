"""What the Ray Data actor pools of corpus mining (``raycl.distributed.corpus``, the library call
``raycl.distributed.negatives_api``) and dense mining share: Ray started for the pool, the pool sized, Ray Data
kept quiet, a user's error unwrapped from Ray's, the decoding engine resolved once before any miner starts, and the
miner built in its actor on the device Ray gave it."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import ray

from raycl.errors import UserError
from raycl.miners.registry import MinerKind
from raycl.models.engines import choose_engine, engine_versions


@dataclass(frozen=True)
class MinersEngine:
    """The engine every miner of a pool decodes with (``hf`` | ``ctranslate2``) and its libraries' versions."""

    engine: str
    versions: dict[str, str]


def resolve_miners_engine(model: str, options: dict[str, Any], *, gpus_per_miner: float) -> MinersEngine:
    """The engine every miner decodes with, resolved before any miner starts (:func:`raycl.models.engines.
    choose_engine`): on the driver for CPU miners, by one Ray task on a GPU like theirs for GPU miners with
    ``auto`` (Ray must be up). The miners are then given it explicitly, so no two of them resolve ``auto``
    differently; an impossible choice (int8 without CTranslate2) is a one-line error here."""
    engine, precision = str(options.get("engine", "auto")), str(options.get("precision", "fp32"))
    got = choose_engine(
        engine, model, precision=precision, gpus_per_miner=gpus_per_miner, device=str(options.get("device", "cpu"))
    )
    if not got.deferred:
        return MinersEngine(got.engine, engine_versions(got.engine))
    return ray.get(
        ray.remote(_resolve_on_gpu).options(num_cpus=0, num_gpus=gpus_per_miner).remote(engine, model, precision)
    )


def _resolve_on_gpu(engine: str, model: str, precision: str) -> MinersEngine:
    got = choose_engine(engine, model, device="cuda", precision=precision).engine
    return MinersEngine(got, engine_versions(got))


def build_miner(kind: MinerKind, model: str, options: dict[str, Any]) -> Any:
    """A miner of ``kind`` in this actor: on ``cuda`` when Ray gave it a GPU, its memory capped to its share."""
    import torch

    from raycl.distributed.miner_pool import said_gpu_fallback
    from raycl.distributed.resources import cap_gpu_memory
    from raycl.miners.registry import miner_device

    opts = dict(options)
    gpus = ray.get_gpu_ids() if ray.is_initialized() else []
    opts.setdefault("device", miner_device(gpus))
    if gpus and opts["device"] == "cpu":
        said_gpu_fallback()
    cap_gpu_memory(torch.device(opts["device"]))  # a share of a GPU (--gpus-per-miner < 1): its memory capped
    return kind.build(model, opts)


def start_ray(address: str | None, num_miners: int | tuple[int, int], cpus_per_miner: float) -> None:
    """Join the cluster at ``address`` (or ``RAY_ADDRESS``), or start an embedded Ray with a CPU per miner."""
    from raycl.distributed.runtime import init_ray, local_cpus

    most = num_miners[1] if isinstance(num_miners, tuple) else num_miners
    on_cluster = bool(address or os.environ.get("RAY_ADDRESS"))
    init_ray(address, num_cpus=None if on_cluster else local_cpus(most * cpus_per_miner))


@contextmanager
def quiet_ray_data() -> Iterator[None]:
    """Ray Data without its progress bars, execution banners and per-task error logs (raycl's bar counts
    sentences; an error reaches the caller as the exception), restored afterwards."""
    ctx = ray.data.DataContext.get_current()
    saved = ctx.enable_progress_bars, ctx.print_on_execution_start
    logger = logging.getLogger("ray.data")
    level = logger.level
    ctx.enable_progress_bars = ctx.print_on_execution_start = False
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        ctx.enable_progress_bars, ctx.print_on_execution_start = saved
        logger.setLevel(level)


def actor_pool(num_miners: int | tuple[int, int], inputs: int) -> Any:
    """An actor pool of ``num_miners`` actors, or one that autoscales between ``(min, max)``; never more actors
    than inputs (a resumed run with one range left starts one miner)."""
    inputs = max(inputs, 1)
    if isinstance(num_miners, tuple):
        lo, hi = min(num_miners[0], inputs), min(num_miners[1], inputs)
        return ray.data.ActorPoolStrategy(min_size=lo, max_size=hi)
    return ray.data.ActorPoolStrategy(size=min(num_miners, inputs))


def user_error(err: BaseException) -> UserError | None:
    seen: set[int] = set()
    todo: list[Any] = [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, UserError):
            return e
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
    text = str(err)
    marker = "UserError: "
    if marker in text:
        return UserError(text.split(marker, 1)[1].strip().splitlines()[0])
    return None


def progress_bar(total: int, progress: bool) -> Any:
    from raycl.progress import bar

    return bar(total, desc="mining", unit="sent", enabled=progress)
