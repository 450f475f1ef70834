"""Numerically sensitive parts of a loss in full precision, whatever autocast the step runs under."""

from __future__ import annotations

import contextlib
from typing import Any

import torch


def autocast_off(device_type: str) -> contextlib.AbstractContextManager[Any]:
    """Autocast off on ``device_type`` (a device without autocast, such as ``meta``, has nothing to turn off)."""
    available = torch.amp.is_autocast_available(device_type)
    return torch.autocast(device_type, enabled=False) if available else contextlib.nullcontext()
