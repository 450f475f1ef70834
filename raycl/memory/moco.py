"""MoCo's key encoder and key queue for the Subtask B contrastive loss (ZhichunRoad; docs/recipes/sts.md).

θ_k ← m·θ_k + (1 − m)·θ_q (no gradient into θ_k); the queue is a ring buffer of the last Q keys
k = mean-pool(f_k(x)) of SimCSE view 1, enqueued after the loss, and used only as negatives.

Laid out as facebookresearch/moco's ``builder.py``: ``encoder_k`` is a deep copy of the query encoder with
``requires_grad=False``, the queue (dim, K) and its pointer are registered buffers (they checkpoint with the
state dict), the initial queue is random-normal and normalised along dim 0, and the momentum update runs
under ``@torch.no_grad``. Unlike moco, K need not be a multiple of the batch size (upstream's Q = int(32·2.5)
= 80 with batch 32): ``enqueue`` wraps around the ring.

When is θ_k updated? In the released code once per contrastive pass: its MoCo loss runs the query encoder's
modules itself and calls the builder once, which computes that pass's keys and then moves θ_k; the MSE pairs,
both SimCSE views and the dev predictions do not go through it. raycl's default has the same cadence, once per
training step (:meth:`MoCoKeyEncoder.momentum_update`, called before the step's keys, as moco's builder does).
``update_every_forward=True`` is an ablation, not the released schedule: a forward hook on the query encoder
runs the update after each of its forwards, whatever called it (evaluation included).

References:
    Kaiming He, Haoqi Fan, Yuxin Wu, Saining Xie, Ross Girshick. "Momentum Contrast for Unsupervised Visual
    Representation Learning." CVPR 2020, Eq. 2 (momentum update) and §3.2 (queue). Cui, Xiong, Wang,
    SemEval 2022 Task 2 (ZhichunRoad), §3.3 and Eq. 4.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raycl.memory.multi_tensor import momentum_
from raycl.models.cross_attention import mean_pool

QUEUE_SIZE = 80  # int(32 · 2.5): upstream's batch 32 times 2.5
MOMENTUM = 0.999


class MoCoKeyEncoder(nn.Module):
    """A momentum copy f_k of a token encoder f_q and a ring buffer of its mean-pooled keys.

    Args:
        encoder_q: the query encoder, a module mapping (input_ids (B, T), attention_mask (B, T)) to token
            states (B, T, H) — e.g. :class:`raycl.models.sentence_encoder.SentenceEncoder`. It is deep-copied
            once; it is not kept here (its parameters belong to the model being trained).
        dim: H, the key size.
        queue_size: K ≥ 0 keys kept; K = 0 disables the queue (in-batch InfoNCE).
        m: momentum in [0, 1]; m = 0 copies f_q into f_k, m = 1 freezes f_k.
        update_every_forward: an ablation: update after every f_q forward instead of once per step (the released
            cadence).

    The key encoder runs in this module's train/eval mode: in train mode its dropout is on, as upstream,
    where the builder is one module of the trained pipeline.
    """

    queue: Tensor  # (dim, K) key k_q in column q
    queue_ptr: Tensor  # (1,) next column to overwrite

    def __init__(
        self,
        encoder_q: nn.Module,
        *,
        dim: int,
        queue_size: int = QUEUE_SIZE,
        m: float = MOMENTUM,
        update_every_forward: bool = False,
    ) -> None:
        super().__init__()
        if not 0.0 <= m <= 1.0:
            raise ValueError(f"momentum m must be in [0, 1], got {m}")
        if queue_size < 0:
            raise ValueError(f"queue size must be >= 0, got {queue_size}")
        self.K, self.m = queue_size, m
        self.encoder_k = copy.deepcopy(encoder_q)
        for param in self.encoder_k.parameters():
            param.requires_grad_(False)  # f_k only moves through the momentum update
        # Random unit keys, as moco: harmless filler until K real keys arrive, since the loss renormalises.
        self.register_buffer("queue", F.normalize(torch.randn(dim, queue_size), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))
        self._ptr = 0  # queue_ptr on the host too: it moves by batch sizes, so a step never reads the device
        self._hook = encoder_q.register_forward_hook(self._after_query_forward) if update_every_forward else None

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._ptr = int(self.queue_ptr[0])  # a restored checkpoint: read once

    def _after_query_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        self.momentum_update(module)

    @torch.no_grad()
    def momentum_update(self, encoder_q: nn.Module) -> None:
        """θ_k ← m·θ_k + (1 − m)·θ_q for every parameter, in a few multi-tensor ops (buffers are not averaged, as
        in moco)."""
        params_q = dict(encoder_q.named_parameters())
        params_k = dict(self.encoder_k.named_parameters())
        if params_q.keys() != params_k.keys():
            raise ValueError("the query encoder's parameters no longer match the key encoder's")
        momentum_(list(params_k.values()), [params_q[n] for n in params_k], self.m)  # no_grad: no detach

    @torch.no_grad()
    def keys(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """k = mean-pool(f_k(x)): (B, T), (B, T) -> (B, dim), without gradient."""
        h = self.encoder_k(input_ids, attention_mask)  # (B, T, dim)
        return mean_pool(h, attention_mask)  # (B, dim)

    @torch.no_grad()
    def enqueue(self, keys: Tensor) -> None:
        """Write ``keys`` (B, dim) into the ring at the pointer, wrapping; call it *after* the loss."""
        if self.K == 0:
            return
        n, ptr = keys.size(0), self._ptr
        kept = keys.detach().to(self.queue.dtype)[-self.K :]  # (min(B, K), dim) a longer batch laps the ring
        slots = (ptr + n - kept.size(0) + torch.arange(kept.size(0), device=self.queue.device)) % self.K
        self.queue[:, slots] = kept.t()  # (dim, min(B, K))
        self._ptr = (ptr + n) % self.K
        self.queue_ptr.fill_(self._ptr)  # the checkpointed pointer: written, never read back in a step

    def queued(self) -> Tensor:
        """The K queued keys as rows, (K, dim), in storage order (the loss does not depend on the order)."""
        return self.queue.t()  # (K, dim)
