"""Padding masks in the form Hugging Face's attention takes as given, so that a training step reads nothing back.

Given a 2-D padding mask, transformers' mask helpers first ask the device whether every position is real (to skip
the mask and use a faster kernel): a host–device sync in every forward of every encoder layer stack. A 4-D mask is
taken as it is. A batch's padding is known on the CPU when it is collated, so a step passes no mask where there
is none, and a mask already in the attention's own form where there is.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def attention_mask(mask: Tensor, model: Any) -> Tensor:
    """``mask`` (B, S), 1 = a real token, as ``model``'s attention reads it: (B, 1, 1, S) boolean for SDPA (True =
    attend), additive in the model's dtype for eager attention (0 or the dtype's lowest), broadcast over heads and
    query positions (one tensor serves self- and cross-attention). Other implementations get ``mask`` itself."""
    impl = getattr(model.config, "_attn_implementation", None)
    keep = mask[:, None, None, :].bool()  # (B, 1, 1, S)
    if impl == "sdpa":
        return keep
    if impl == "eager":
        dtype = model.dtype
        return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, torch.finfo(dtype).min)
    return mask


def prepared(inputs: dict[str, Tensor], model: Any) -> dict[str, Tensor]:
    """A tokenizer's ``inputs`` with the attention mask as ``model``'s attention reads it (:func:`attention_mask`),
    or without one where no position is padding (read here, on the CPU, where the batch is collated)."""
    mask = inputs.get("attention_mask")
    if mask is None:
        return inputs
    rest = {k: v for k, v in inputs.items() if k != "attention_mask"}
    return rest if bool(mask.all()) else {**rest, "attention_mask": attention_mask(mask, model)}
