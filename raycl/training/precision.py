"""Numeric precision of training and mining: ``fp32 | bf16 | fp16`` autocast, fp16's gradient scaler, TF32.

Autocast runs the matrix products in the low precision and keeps numerically sensitive ops in fp32; raycl's losses
also cast their logits to fp32 themselves (log-softmax sums over a vocabulary, InfoNCE logits), so a loss is an
fp32 number under every setting. bf16 needs no loss scaling; fp16 does (``torch.amp.GradScaler``), so the loop
unscales before clipping and the scaler skips steps whose gradients overflowed. TF32 (``allow_tf32``) speeds up
the fp32 matmuls that remain on Ampere and newer GPUs; it is a no-op elsewhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Precision:
    """One run's precision on one device."""

    name: str  # fp32 | bf16 | fp16
    device: torch.device

    @property
    def dtype(self) -> torch.dtype | None:
        return _DTYPES.get(self.name)

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """The forward passes' context: autocast to bf16/fp16 on this device, nothing at fp32."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def scaler(self, init_scale: float = 2.0**16) -> torch.amp.GradScaler | None:
        """fp16's dynamic loss scaler (None for fp32/bf16, whose range needs none). ``init_scale``: 2¹⁶ (PyTorch's)
        for losses that are means; a loss summed over a batch's tokens starts lower (fairseq: 2⁷), or its first
        updates overflow and are skipped while the schedule moves on."""
        if self.name != "fp16":
            return None
        return torch.amp.GradScaler(self.device.type, init_scale=init_scale)


def enable_tf32(device: torch.device, *, on: bool = True) -> bool:
    """TF32 matmuls and convolutions on CUDA devices that have them (compute capability ≥ 8.0); returns whether
    they are on."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    major, _ = torch.cuda.get_device_capability(device)
    use = on and major >= 8
    torch.backends.cuda.matmul.allow_tf32 = use
    torch.backends.cudnn.allow_tf32 = use
    return use


@contextlib.contextmanager
def inference(precision: Precision) -> Iterator[None]:
    """No gradients, under the precision's autocast: evaluation and mining."""
    with torch.no_grad(), precision.autocast():
        yield
