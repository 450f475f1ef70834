"""Training-state checkpoints: the names of a checkpoint folder's parts, how ``state.pt`` is written and read, and
seeding.

Layout of a checkpoint folder: ``model/`` (``save_pretrained``: loads with ``from_pretrained``) and
``state.pt`` (optimizers, schedules, fp16 scaler, extras, progress, RNG — this worker's own CUDA device's), both
written by the one loop (:func:`raycl.training.state.save`) to temporary names and renamed, so a run killed
mid-write never leaves a half checkpoint behind.

A run folder may sit on a shared file system, so ``state.pt`` is data, never code: it is read with
``torch.load(weights_only=True)`` (tensors, numbers, strings, containers) and anything else is refused in one line.
NumPy's RNG state is written as a tensor and numbers (:func:`save_state`); checkpoints of earlier raycl versions,
which pickled it as an ``ndarray``, still load: for them only NumPy's array reconstructor, ``ndarray`` and the
``uint32`` dtype are allowed, under NumPy 1's and 2's module paths.
"""

from __future__ import annotations

import pickle
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raycl.errors import UserError, at
from raycl.files import atomic_file

STATE_FILE = "state.pt"
MODEL_DIR = "model"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def save_state(state: dict[str, Any], path: Path) -> None:
    """``state`` (a ``state.pt`` or a rank's part) to ``path`` through a temporary name; its RNG states as tensors
    and numbers, so that :func:`load_state` reads it back with ``weights_only=True``."""
    rng = state.get("rng")
    if rng is not None and isinstance(rng.get("numpy"), tuple):
        name, key, pos, has_gauss, cached = rng["numpy"]
        rng = {
            **rng,
            "numpy": {
                "bit_generator": name,
                "key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached),
            },
        }
        state = {**state, "rng": rng}
    with atomic_file(path, "wb") as f:
        torch.save(state, f)


def load_state(path: Path, *, mmap: bool = False) -> dict[str, Any]:
    """A ``state.pt`` (or a rank's part) read with ``weights_only=True``; a file holding anything but tensors,
    numbers, strings and containers is refused in one line. ``mmap``: tensors stay on disk (the driver's check)."""
    try:
        with torch.serialization.safe_globals(_legacy_numpy_rng()):
            saved = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        text = str(err)
        found = re.search(r"GLOBAL (\S+)", text)
        why = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\n\s*Check the documentation|$)", text, re.S)
        what = f"holds {found.group(1)}" if found else " ".join((why.group(1) if why else text).split())[:200]
        raise UserError(
            f"{at(path)}: refused: {what}; expected only tensors, numbers, strings and containers "
            "(read with torch.load(weights_only=True): a checkpoint may not run code)"
        ) from None
    except (OSError, RuntimeError, EOFError, ValueError) as err:
        raise UserError(
            f"{at(path)}: not a readable checkpoint ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:200] if str(err) else ''})"
        ) from None
    if not isinstance(saved, dict):
        raise UserError(f"{at(path)}: holds a {type(saved).__name__}, expected a dict (raycl's state.pt)")
    rng = saved.get("rng")
    if isinstance(rng, dict) and isinstance(rng.get("numpy"), dict):  # save_state's form: NumPy's tuple again
        n = rng["numpy"]
        saved["rng"] = {
            **rng,
            "numpy": (
                n["bit_generator"],
                n["key"].numpy().astype(np.uint32),
                n["pos"],
                n["has_gauss"],
                n["cached_gaussian"],
            ),
        }
    return saved


def check_checkpoints(root: Path) -> int:
    """Every checkpoint file under ``root`` (a run folder's Ray storage) read as a worker would resume it — on the
    driver, before any worker starts (a worker's error is retried, then re-raised as a traceback). Their count."""
    files = [p for p in sorted(root.rglob("*.pt")) if p.name == STATE_FILE or re.fullmatch(r"rank\d+\.pt", p.name)]
    for path in files:
        load_state(path, mmap=True)
    return len(files)


def _legacy_numpy_rng() -> list[Any]:
    """What an ``np.random.get_state()`` pickled by earlier raycl versions needs, and nothing more: the uint32 key
    array (an object dtype's type is not here, so an array of objects cannot be built)."""
    try:
        from numpy._core.multiarray import _reconstruct  # NumPy 2
    except ImportError:  # pragma: no cover - NumPy 1
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    paths = ("numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct")
    return [*((_reconstruct, p) for p in paths), np.ndarray, np.dtype, type(np.dtype(np.uint32))]
