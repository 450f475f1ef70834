"""Training-state checkpoints: the model as a Hugging Face folder plus optimiser, schedule and progress.

Layout of a checkpoint folder: ``model/`` (``save_pretrained``: loads with ``from_pretrained``) and
``state.pt`` (optimizer, scheduler, RNG, epoch, best-so-far). Written to a temporary name and renamed, so a
run killed mid-write never leaves a half checkpoint behind.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

STATE_FILE = "state.pt"
MODEL_DIR = "model"


def save_training_state(
    out_dir: Path, *, model: Any, optimizer: torch.optim.Optimizer, scheduler: Any, progress: dict[str, Any]
) -> Path:
    """Write ``model/`` and ``state.pt`` under ``out_dir`` atomically; returns ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp_model = out_dir / f".{MODEL_DIR}.tmp"
    shutil.rmtree(tmp_model, ignore_errors=True)
    model.save_pretrained(tmp_model)
    final_model = out_dir / MODEL_DIR
    shutil.rmtree(final_model, ignore_errors=True)
    tmp_model.replace(final_model)
    state = {
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "progress": progress,
        "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
    }
    tmp_state = out_dir / f".{STATE_FILE}.tmp"
    torch.save(state, tmp_state)
    tmp_state.replace(out_dir / STATE_FILE)
    return out_dir


def load_training_state(
    ckpt_dir: Path, *, optimizer: torch.optim.Optimizer, scheduler: Any
) -> dict[str, Any]:
    """Restore optimizer, scheduler and RNG from ``ckpt_dir``; returns the saved progress dict.

    The model weights are loaded by the caller from ``ckpt_dir / "model"`` with ``from_pretrained``.
    """
    state = torch.load(ckpt_dir / STATE_FILE, map_location="cpu", weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])
    torch.set_rng_state(state["rng"]["torch"])
    return dict(state["progress"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
