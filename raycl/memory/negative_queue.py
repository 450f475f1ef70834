"""The global queue of negative document reps of the full coherence model, as the released code runs it.

A FIFO of momentum-encoder reps of **negative documents only** (never positives). Per training item, *before*
the loss: if the queue holds ≥ ``size`` reps, drop the oldest ``num_negs``; then append the item's reps.
It starts empty and, with 5 negatives per item and size 1000, is full after 200 items; at most
``size + num_negs − 1`` reps are held. Contents and fill count are registered buffers, so the queue
checkpoints with ``state_dict`` and moves with ``.to(device)`` (as MoCo's ``queue``/``queue_ptr``).

References: Jwalapuram, Joty & Lin (ACL 2022) §3.4; He et al. (CVPR 2020), the MoCo queue.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


class NegativeQueue(nn.Module):
    """FIFO of (≤ size + num_negs − 1, H) reps, oldest first; ``size = 0`` keeps it empty.

    Args:
        dim: H, the rep width (768 for XLNet-base).
        size: the queue size (paper: 1000).
        num_negs: negatives per item (paper: 5); also how many of the oldest reps one item evicts.
    """

    keys: Tensor
    fill: Tensor

    def __init__(self, dim: int, *, size: int = 1000, num_negs: int = 5) -> None:
        super().__init__()
        if size < 0 or num_negs < 1:
            raise ValueError(f"queue size must be ≥ 0 and num_negs ≥ 1, got {size}, {num_negs}")
        self.size, self.num_negs = size, num_negs
        capacity = size + num_negs - 1 if size > 0 else 0
        self.register_buffer("keys", torch.zeros(capacity, dim))  # (C, H) slots [0, fill) hold reps, oldest first
        self.register_buffer("fill", torch.zeros((), dtype=torch.long))  # () how many slots are in use
        # ``fill`` on the host too: the rule depends only on how many reps came, so a step never reads the device
        self._fill = 0

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._fill = int(self.fill)  # a restored checkpoint: read once

    def __len__(self) -> int:
        return self._fill

    def entries(self) -> Tensor:
        """The queued reps, oldest first: (K, H), K = len(self); a view, not to be modified."""
        return self.keys[: self._fill]  # (K, H)

    @torch.no_grad()
    def enqueue(self, reps: Tensor) -> None:
        """Push ``reps`` (B·num_negs, H): the negatives of B items, item by item, each by the paper's rule."""
        if reps.dim() != 2 or reps.size(0) % self.num_negs:
            raise ValueError(f"expected (B·{self.num_negs}, H) reps, got {tuple(reps.shape)}")
        if self.size == 0:
            return
        for item in reps.detach().to(self.keys).split(self.num_negs):  # (num_negs, H) each
            n = self._fill
            if n >= self.size:  # evict the oldest num_negs, shifting the rest to the front
                self.keys[: n - self.num_negs] = self.keys[self.num_negs : n].clone()
                n -= self.num_negs
            self.keys[n : n + self.num_negs] = item
            self._fill = n + self.num_negs
        self.fill.fill_(self._fill)  # the checkpointed count: written, never read back in a step
