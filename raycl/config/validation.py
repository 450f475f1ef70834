"""Range and consistency checks that types alone cannot express: every number finite and bounded by the kind of
its key, the shared sections' own rules, then the task's (``config.validate(where)``). A refusal is one line naming
where the config came from, the key, what was expected and what was given."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from raycl.config.sections import PRECISIONS, LoopOptions, MiningSection, OptimSection, ScalingSection
from raycl.errors import UserError, shown
from raycl.models.decoding import ENGINES  # mining.engine's values, beside the other decoding options


def require(ok: bool, where: str, key: str, expected: str, value: Any) -> None:
    if not ok:
        raise UserError(f"{where}: config key '{key}': expected {expected}, got {shown(value)}")


# upper bounds of every number, by the kind of key (the lower bounds are the sections' own checks below)
MAX_SECONDS = 7 * 24 * 3600  # a key in seconds (*_s): a week; a wait longer than that is a stuck run
MAX_RESOURCES = 1024  # CPUs, GPUs or custom resource units that one worker, miner or trial driver asks for
MAX_EPOCHS = 100_000  # any *epochs key
MAX_SEED = 2**32 - 1  # a seed: what numpy's generators take
MAX_INT = 2**31 - 1  # every other integer (sizes, counts, steps): what torch's and Arrow's int32 indices hold
MAX_FLOAT = 1e6  # every other number (rates, margins, weights, ratios), in magnitude


def number_bound(key: str, value: int | float) -> tuple[float, str]:
    """The upper bound of the number at the dotted ``key`` and what the refusal says is expected."""
    leaf = key.rsplit(".", 2)
    if leaf[-1].endswith("_s"):
        return MAX_SECONDS, f"a finite number of seconds ≤ {MAX_SECONDS:,} (7 days)"
    if leaf[-1].startswith(("cpus_", "gpus_")) or leaf[-1] == "driver_cpus" or "resources" in leaf[:-1]:
        return MAX_RESOURCES, f"a finite amount ≤ {MAX_RESOURCES:,}"
    if leaf[-1].endswith("epochs"):
        return MAX_EPOCHS, f"an integer ≤ {MAX_EPOCHS:,}"
    if leaf[-1] == "seed":
        return MAX_SEED, f"an integer ≤ {MAX_SEED:,}"
    if isinstance(value, int):
        return MAX_INT, f"an integer of magnitude ≤ {MAX_INT:,}"
    return MAX_FLOAT, f"a finite number of magnitude ≤ {MAX_FLOAT:,.0f}"


def _check_numbers(node: Any, key: str, where: str) -> None:
    """Every number of the config ``node`` finite and within :func:`number_bound` (what Ray, torch and the clock
    would otherwise refuse after Ray starts, in a traceback, or never)."""
    if dataclasses.is_dataclass(node):
        for f in dataclasses.fields(node):
            _check_numbers(getattr(node, f.name), f"{key}.{f.name}" if key else f.name, where)
    elif isinstance(node, dict):
        for k, v in node.items():
            _check_numbers(v, f"{key}.{k}", where)
    elif isinstance(node, list | tuple):
        for v in node:
            _check_numbers(v, key, where)
    elif isinstance(node, int | float) and not isinstance(node, bool):
        bound, expected = number_bound(key, node)
        require(math.isfinite(node) and abs(node) <= bound, where, key, expected, node)


def validate(config: Any, *, where: str) -> None:
    """Range and consistency checks that types alone cannot express."""
    _check_numbers(config, "", where)
    _validate_common(config, where)
    check = getattr(config, "validate", None)
    if check is not None:  # the task's own checks (raycl/config/tasks/<task>.py)
        check(where)


def _validate_common(c: Any, where: str) -> None:
    require(c.scaling.num_workers >= 0, where, "scaling.num_workers", "an integer ≥ 0", c.scaling.num_workers)
    require(
        c.scaling.collective_timeout_s > 0,
        where,
        "scaling.collective_timeout_s",
        "a number of seconds > 0",
        c.scaling.collective_timeout_s,
    )
    require(c.scaling.cpus_per_worker > 0, where, "scaling.cpus_per_worker", "> 0", c.scaling.cpus_per_worker)
    require(
        c.scaling.max_failures >= -1,
        where,
        "scaling.max_failures",
        "an integer ≥ -1 (-1: retry forever)",
        c.scaling.max_failures,
    )
    require(
        c.scaling.start_timeout_s >= 0,
        where,
        "scaling.start_timeout_s",
        "seconds ≥ 0 (0: wait for ever)",
        c.scaling.start_timeout_s,
    )
    _validate_gpus(c.scaling, where)
    require(c.tune.scheduler in ("fifo", "asha"), where, "tune.scheduler", "fifo or asha", c.tune.scheduler)
    require(c.tune.mode in ("max", "min"), where, "tune.mode", "max or min", c.tune.mode)
    require(c.tune.num_samples >= 1, where, "tune.num_samples", "an integer ≥ 1", c.tune.num_samples)
    require(
        c.tune.max_concurrent_trials >= 1, where, "tune.max_concurrent_trials", "≥ 1", c.tune.max_concurrent_trials
    )
    require(c.tune.driver_cpus > 0, where, "tune.driver_cpus", "> 0 (Tune rejects 0)", c.tune.driver_cpus)
    if isinstance(c.optim, LoopOptions):
        require(
            c.optim.precision in PRECISIONS, where, "optim.precision", " | ".join(PRECISIONS), c.optim.precision
        )
        require(c.optim.update_freq >= 1, where, "optim.update_freq", "an integer ≥ 1", c.optim.update_freq)
        require(
            c.optim.prefetch >= 0,
            where,
            "optim.prefetch",
            "an integer ≥ 0 (0: no background thread)",
            c.optim.prefetch,
        )
        modes = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
        require(
            c.optim.compile_mode in modes, where, "optim.compile_mode", " | ".join(modes), c.optim.compile_mode
        )
    if isinstance(c.optim, OptimSection):
        _validate_optim(c.optim, where)
    if isinstance(getattr(c, "mining", None), MiningSection):
        _validate_mining(c.mining, where)


def _gpu_amount(value: float) -> bool:
    """What Ray takes as a GPU request: a fraction of one GPU, or whole GPUs."""
    return 0 <= value <= 1 or float(value).is_integer()


def _validate_gpus(s: ScalingSection, where: str) -> None:
    require(
        s.gpus_per_worker > 0 and _gpu_amount(s.gpus_per_worker),
        where,
        "scaling.gpus_per_worker",
        "a fraction in (0, 1] or whole GPUs",
        s.gpus_per_worker,
    )
    if s.use_gpu and s.num_workers >= 2 and s.gpus_per_worker <= 0.5:  # two ranks could get one GPU
        raise UserError(
            f"{where}: config key 'scaling.gpus_per_worker': expected > 0.5 with scaling.num_workers="
            f"{s.num_workers} GPU workers (Ray may put two workers of {s.gpus_per_worker:g} GPU on "
            "one GPU, and NCCL refuses two ranks of one run on one GPU), got "
            f"{s.gpus_per_worker:g}; share a GPU with one worker, or give each worker a GPU"
        )


def _validate_optim(o: OptimSection, where: str) -> None:
    require(o.lr > 0, where, "optim.lr", "> 0", o.lr)
    require(
        len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas),
        where,
        "optim.betas",
        "two numbers in [0, 1)",
        o.betas,
    )
    require(o.scheduler in ("fixed", "polynomial"), where, "optim.scheduler", "fixed or polynomial", o.scheduler)
    require(o.batch_size >= 1, where, "optim.batch_size", "an integer ≥ 1", o.batch_size)
    require(
        o.max_tokens >= 0, where, "optim.max_tokens", "an integer ≥ 0 (0 = batches by sentences)", o.max_tokens
    )
    require(o.epochs >= 0, where, "optim.epochs", "an integer ≥ 0", o.epochs)
    require(o.clip_norm >= 0, where, "optim.clip_norm", "≥ 0 (0 = no clipping)", o.clip_norm)


def _validate_mining(m: MiningSection, where: str) -> None:
    require(m.num_miners >= 1, where, "mining.num_miners", "an integer ≥ 1", m.num_miners)
    require(
        m.cpus_per_miner >= 0 and m.gpus_per_miner >= 0,
        where,
        "mining.cpus_per_miner",
        "non-negative resources",
        (m.cpus_per_miner, m.gpus_per_miner),
    )
    require(
        _gpu_amount(m.gpus_per_miner),
        where,
        "mining.gpus_per_miner",
        "a fraction in [0, 1] or whole GPUs",
        m.gpus_per_miner,
    )
    require(m.max_staleness >= 0, where, "mining.max_staleness", "an integer ≥ 0", m.max_staleness)
    require(m.sync_every >= 0, where, "mining.sync_every", "an integer ≥ 0", m.sync_every)
    require(m.refresh_every >= 0, where, "mining.refresh_every", "an integer ≥ 0", m.refresh_every)
    require(m.task_size >= 1, where, "mining.task_size", "an integer ≥ 1", m.task_size)
    require(
        m.queue_size >= m.task_size,
        where,
        "mining.queue_size",
        f"≥ mining.task_size = {m.task_size}",
        m.queue_size,
    )
    require(m.lease_s > 0, where, "mining.lease_s", "> 0 seconds", m.lease_s)
    engine = getattr(m, "engine", "hf")  # beam-search miners choose a decoding engine (GecMiningSection)
    require(engine in ENGINES, where, "mining.engine", " | ".join(ENGINES), engine)
    allowed = PRECISIONS + ("int8",) if engine != "hf" else PRECISIONS
    require(
        m.precision in allowed,
        where,
        "mining.precision",
        " | ".join(allowed) + ("" if engine != "hf" else " (int8 with mining.engine=ctranslate2 or auto)"),
        m.precision,
    )
