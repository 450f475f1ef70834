"""The loop's state, RNG and checkpoints: what a checkpoint folder holds of a worker's training, how a worker
writes it (rank 0 the shared state, every rank its own RNG and per-rank extras) and how a restarted worker reads
it back. File formats and seeding: :mod:`raycl.training.checkpoint`."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raycl.records import save_dir_atomic
from raycl.training.checkpoint import MODEL_DIR, STATE_FILE, load_state, save_state
from raycl.training.task import TrainState


class CheckpointedRandom(random.Random):
    """A generator a task draws from as it collates (coherence's prefix slices), kept in ``TrainState.extras``
    (in ``per_rank`` where each rank has its own): checkpointed with the state, so that a resumed run draws what
    the uninterrupted one would have drawn."""

    def state_dict(self) -> dict[str, Any]:
        return {"state": self.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.setstate(state["state"])


def rank_file(rank: int) -> str:
    """The file of a checkpoint that holds rank ``rank``'s own part: its RNG states and per-rank extras."""
    return f"rank{rank}.pt"


def rng_state(device: torch.device) -> dict[str, Any]:
    """This worker's RNG states: Python's, NumPy's, the CPU generator and the CUDA one of its *own* device only
    (not every device the process sees: a restarted worker may see fewer, and could not restore that list)."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def restore_rng(rng: dict[str, Any], device: torch.device) -> None:
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if device.type == "cuda" and isinstance(rng.get("cuda"), torch.Tensor):
        torch.cuda.set_rng_state(rng["cuda"], device)  # this worker's own device


def read_saved(ckpt: Path | None, rank: int) -> dict[str, Any] | None:
    """A checkpoint's ``state.pt`` with rank ``rank``'s own part (RNG, per-rank extras) merged in, or None."""
    saved = load_state(ckpt / STATE_FILE) if ckpt else None
    if ckpt is not None and saved is not None and (ckpt / rank_file(rank)).exists():  # this rank's own part
        own = load_state(ckpt / rank_file(rank))
        saved["rng"], saved["extras"] = own["rng"], {**saved["extras"], **own["extras"]}
    return saved


def restore(
    st: TrainState, saved: dict[str, Any], scaler: torch.amp.GradScaler | None, device: torch.device
) -> None:
    """Optimizers (their moments land on their parameters' device), schedules, scaler, extras, RNG."""
    for opt, state in zip(st.optimizers, saved["optimizers"], strict=True):
        opt.load_state_dict(state)
    for sched, state in zip(st.schedulers, saved["schedulers"], strict=True):
        if sched is not None and state is not None:
            sched.load_state_dict(state)
    if scaler is not None and saved.get("scaler"):
        scaler.load_state_dict(saved["scaler"])
    for name, obj in st.extras.items():
        if saved["extras"].get(name) is not None:
            obj.load_state_dict(saved["extras"][name])
    st.progress = dict(saved["progress"])
    restore_rng(saved["rng"], device)


def loop_state(st: TrainState, scaler: torch.amp.GradScaler | None, device: torch.device) -> dict[str, Any]:
    """What ``state.pt`` holds: optimizers, schedules, scaler, extras, progress and the RNG states (the CUDA one of
    this worker's own device: another worker may see fewer devices)."""
    return {
        "optimizers": [o.state_dict() for o in st.optimizers],
        "schedulers": [s.state_dict() if s is not None else None for s in st.schedulers],
        "scaler": scaler.state_dict() if scaler is not None else None,
        "extras": {k: v.state_dict() for k, v in st.extras.items()},
        "progress": st.progress,
        "rng": rng_state(device),
    }


def save(
    st: TrainState,
    save_model: Callable[[Path], None],
    scaler: torch.amp.GradScaler | None,
    device: torch.device,
    folder: Path,
) -> None:
    """``model/`` (``save_model``: the task's ``save_pretrained``) and ``state.pt``, each written to a temporary
    name and renamed."""
    save_dir_atomic(save_model, folder / MODEL_DIR)
    save_state(loop_state(st, scaler, device), folder / STATE_FILE)


def save_rank(st: TrainState, device: torch.device, folder: Path, rank: int) -> None:
    """Rank ``rank``'s own part of a checkpoint: its RNG (its dropout masks) and its per-rank extras (queues)."""
    mine = {k: st.extras[k].state_dict() for k in st.per_rank if k in st.extras}
    save_state({"rng": rng_state(device), "extras": mine}, folder / rank_file(rank))
