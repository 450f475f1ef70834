"""Training-state checkpoints: the names of a checkpoint folder's parts, and seeding.

Layout of a checkpoint folder: ``model/`` (``save_pretrained``: loads with ``from_pretrained``) and
``state.pt`` (optimizers, schedules, fp16 scaler, extras, progress, RNG — this worker's own CUDA device's), both
written by the one loop (:meth:`raycl.train.loop._Loop.save`) to temporary names and renamed, so a run killed
mid-write never leaves a half checkpoint behind.
"""

from __future__ import annotations

import random

import numpy as np
import torch

STATE_FILE = "state.pt"
MODEL_DIR = "model"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
