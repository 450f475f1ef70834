"""Exponential moving average of the trainable parameters, evaluated and saved in place of the live weights.

θ_s ← (1 − η)·θ + η·θ_s after each optimizer step, η = 0.999 (the released ``subtaskA`` code).

The shadow copy is taken at construction (the code takes it after ``accelerator.prepare``), from every
parameter with ``requires_grad``. Evaluation and saving run inside :meth:`EMA.applied`, so the saved best
checkpoint holds the EMA weights; the live weights come back bit-exactly afterwards.

References:
    Cui, Xiong, Wang. "ZhichunRoad at SemEval-2022 Task 2." SemEval 2022, §3.2, Eq. 1 ("Exponential
    Moving Average"); the ``EMA`` class of the released ``subtaskA/utils.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from raycl.errors import UserError
from raycl.memory.multi_tensor import momentum_


class EMA:
    """Shadow weights θ_s of ``model``'s trainable parameters.

    Args:
        model: the model being trained (its parameter names key the shadow).
        decay: η in [0, 1]; η = 0 makes the shadow equal the live weights after every :meth:`update`,
            η = 1 freezes it at the construction-time weights.

    Usage: ``update()`` after each ``optimizer.step()``; ``with ema.applied(): evaluate(); save()``.
    """

    def __init__(self, model: nn.Module, decay: float = 0.999) -> None:
        if not 0.0 <= decay <= 1.0:
            raise UserError(f"ema.decay: expected a value in [0, 1], got {decay}")
        self.model, self.decay = model, float(decay)
        self.shadow: dict[str, Tensor] = {n: p.detach().clone() for n, p in self._trainable()}
        self._backup: dict[str, Tensor] | None = None

    def _trainable(self) -> Iterator[tuple[str, nn.Parameter]]:
        return ((n, p) for n, p in self.model.named_parameters() if p.requires_grad)

    @torch.no_grad()
    def update(self) -> None:
        """θ_s ← (1 − η)·θ + η·θ_s for every trainable parameter (call after each optimizer step)."""
        if self._backup is not None:
            raise RuntimeError("EMA.update() while the shadow is swapped in: call swap_out() first")
        trainable = list(self._trainable())
        # in place, all at once: θ_s·η + θ·(1 − η) (the shadow keeps its dtype and device; no_grad: no detach)
        momentum_([self.shadow[n] for n, _ in trainable], [p for _, p in trainable], self.decay)

    @torch.no_grad()
    def swap_in(self) -> None:
        """Load the shadow into the model, keeping the live weights aside."""
        if self._backup is not None:
            raise RuntimeError("EMA.swap_in() twice without swap_out()")
        self._backup = {}
        for name, p in self._trainable():
            self._backup[name] = p.detach().clone()
            p.copy_(self.shadow[name])

    @torch.no_grad()
    def swap_out(self) -> None:
        """Put the live weights back, bit-exactly."""
        if self._backup is None:
            raise RuntimeError("EMA.swap_out() without swap_in()")
        for name, p in self._trainable():
            p.copy_(self._backup[name])
        self._backup = None

    @contextmanager
    def applied(self) -> Iterator[nn.Module]:
        """``with ema.applied() as model:`` — the model holds the EMA weights inside the block."""
        self.swap_in()
        try:
            yield self.model
        finally:
            self.swap_out()

    def state_dict(self) -> dict[str, Any]:
        """The decay and the shadow (CPU copies), for checkpoints."""
        return {"decay": self.decay, "shadow": {n: t.detach().cpu().clone() for n, t in self.shadow.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`; the parameter names must match this model's trainable ones."""
        shadow: dict[str, Tensor] = state["shadow"]
        expected = {n for n, _ in self._trainable()}
        if set(shadow) != expected:
            missing, extra = sorted(expected - set(shadow)), sorted(set(shadow) - expected)
            raise UserError(f"ema state: parameter names differ from the model (missing {missing}, extra {extra})")
        self.decay = float(state["decay"])
        for name, p in self._trainable():
            self.shadow[name] = shadow[name].to(device=p.device, dtype=p.dtype).clone()
