"""Miner kinds: how to build a plain miner inside a miner actor and how to load published weights into it.

Each miner module registers its own kind (``raycl.miners.beam_search`` → ``gec_beam``, ``raycl.miners.permutation``
→ ``coherence_rank``), so the generic miner pool (``raycl.distributed``) names no recipe. A ``MinerFactory``
carries the :class:`MinerKind` itself (module-level functions, pickled by reference): an actor that unpickles it
imports the module that defines the kind.

The device: a miner uses a GPU only when Ray reserved one for it (``mining.gpus_per_miner`` > 0 gives the actor
``ray.get_gpu_ids()``); otherwise the CPU, also on a machine whose GPU a trainer holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class MinerKind:
    """How to build a plain miner of one kind and how to put published weights into it."""

    name: str
    build: Callable[[str, dict[str, Any]], Any]  # (model_path, options incl. device, precision) -> miner
    load: Callable[..., None]  # (miner, state_dict, *, version) -> None


MINER_KINDS: dict[str, MinerKind] = {}


def register_miner(
    name: str, *, build: Callable[[str, dict[str, Any]], Any], load: Callable[..., None]
) -> MinerKind:
    kind = MinerKind(name, build, load)
    MINER_KINDS[name] = kind
    return kind


def miner_kind(name: str) -> MinerKind:
    if name not in MINER_KINDS:
        raise ValueError(
            f"unknown miner kind {name!r}, expected one of {sorted(MINER_KINDS)} (a miner module "
            "registers its kind when it is imported)"
        )
    return MINER_KINDS[name]


def miner_device(gpu_ids: Sequence[Any]) -> str:
    """``cuda`` only when Ray reserved a GPU for this miner (``ray.get_gpu_ids()`` non-empty), else ``cpu``: a
    miner without a GPU share never lands on a GPU a trainer reserved."""
    return "cuda" if gpu_ids and torch.cuda.is_available() else "cpu"


def load_module(miner: Any, state_dict: Mapping[str, torch.Tensor], *, version: int = 0) -> None:
    """Load into the module the miner wraps (``BaseMiner.module``, the scorer): its own state dict, the same
    from a DDP-wrapped copy (``module.`` prefix), or the inner HF model's (``scorer.model``)."""
    module = miner.module
    sd = {k.removeprefix("module."): v for k, v in state_dict.items()}
    inner = getattr(module, "model", None)
    target = inner if inner is not None and set(sd) == set(inner.state_dict()) else module
    target.load_state_dict(sd)
