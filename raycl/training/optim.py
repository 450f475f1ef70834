"""Optimiser and learning-rate schedule from the ``optim`` section (Adam/AdamW, fixed or polynomial decay)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR


def build_optimizer(
    model: torch.nn.Module,
    lr: float,
    *,
    betas: Sequence[float] = (0.9, 0.98),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> torch.optim.Optimizer:
    """AdamW (= Adam when ``weight_decay`` is 0, which is GEC-PD's setting; GEC-BART uses 0.01)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return adamw(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def from_section(model: torch.nn.Module, o: Any, *, lr: float | None = None) -> torch.optim.Optimizer:
    """:func:`build_optimizer` from a recipe's ``optim`` section: its ``lr`` (unless ``lr``), ``eps`` and
    ``weight_decay``, and its ``betas`` where it has them (else AdamW's own, (0.9, 0.999))."""
    betas = getattr(o, "betas", (0.9, 0.999))
    return build_optimizer(model, o.lr if lr is None else lr, betas=betas, eps=o.eps, weight_decay=o.weight_decay)


def adamw(
    params: Iterable[Any],
    *,
    lr: float,
    betas: Sequence[float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> torch.optim.AdamW:
    """AdamW over ``params`` (tensors or parameter groups), with PyTorch's fused kernel where every parameter is on
    a CUDA device in a floating dtype: a few kernels an update for the whole model, where the per-tensor
    implementation launches several per parameter and the multi-tensor one several per group of them. The
    arithmetic is AdamW's either way; a checkpoint's optimizer state loads into both."""
    params = list(params)
    b1, b2 = betas
    return torch.optim.AdamW(
        params, lr=lr, betas=(b1, b2), eps=eps, weight_decay=weight_decay, fused=True if fusable(params) else None
    )


def fusable(params: Sequence[Any]) -> bool:
    """Whether PyTorch's fused AdamW takes ``params`` (tensors or parameter groups): some, every one of them on a
    CUDA device and floating point."""
    tensors = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
    return bool(tensors) and all(p.is_cuda and p.is_floating_point() for p in tensors)


def build_scheduler(
    optimizer: torch.optim.Optimizer, kind: str, *, warmup: int, total: int, end_factor: float = 0.0
) -> LambdaLR:
    """``fixed``: linear warm-up then constant (GEC-PD); ``polynomial``: warm-up then linear decay to
    ``end_factor`` at ``total`` updates (fairseq's polynomial_decay with power 1, GEC-BART)."""

    def factor(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        if kind == "fixed" or total <= warmup:
            return 1.0
        frac = min(1.0, (step - warmup) / max(1, total - warmup))
        return 1.0 - (1.0 - end_factor) * frac

    return LambdaLR(optimizer, factor)


def adamw_no_decay(model: torch.nn.Module, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """sentence-transformers' optimiser: AdamW (eps 1e-6), no weight decay on biases and LayerNorm weights."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    no_decay = [p for n, p in named if "bias" in n or "LayerNorm" in n]
    decay = [p for n, p in named if not ("bias" in n or "LayerNorm" in n)]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return adamw(groups, lr=lr, eps=1e-6)
