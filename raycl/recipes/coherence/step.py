"""One coherence training step (Jwalapuram et al., 2022, §3): score the positive and its negatives, the loss of
``loss.kind``.

``pairwise``: max(0, τ − f⁺ + f⁻) with the first negative. ``contrastive``: −log softmax([f⁻_j − τ …, f⁺]) at the
positive. ``momentum`` (the full model): λ·L_c + (1−λ)·L_m, where L_m compares the main encoder's rep of x⁺ with
the momentum encoder's rep of a prefix slice of x⁺ (the length-invariance positive) against a FIFO queue of
momentum reps of negative documents — the current item's negatives are enqueued before the loss, as the code.
The caller runs backward, then :func:`raycl.memory.momentum.momentum_update`, then the optimizer step.

A batch is collated on the CPU ahead of its step (:func:`collate`: tokenised documents, the prefix slices drawn);
the step itself only runs the model and the losses, and reads nothing back from the device.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from raycl.losses.contrastive_margin import contrastive_margin_loss
from raycl.losses.momentum_contrastive import momentum_contrastive_loss, total_loss
from raycl.losses.pairwise_margin import pairwise_margin_loss
from raycl.memory.negative_queue import NegativeQueue
from raycl.models.coherence import CoherenceScorer, MomentumEncoder, prefix_slice

Doc = tuple[str, ...]


@dataclass(frozen=True)
class CoherenceBatch:
    """B items with N negatives each, tokenised: the main encoder's input (positives, then each item's negatives)
    and, for the momentum loss, the momentum encoder's (the negatives alone, the positives' prefix slices)."""

    docs: dict[str, Tensor]  # input_ids (B + B·N, T)[, attention_mask where a row is padded]
    b: int  # items
    n: int  # negatives per item
    negatives: dict[str, Tensor] | None = None  # (B·N, T') the momentum encoder's reps of the negatives
    slices: dict[str, Tensor] | None = None  # (B, T'') the momentum positives: prefix slices of the positives
    rng_state: Any = None  # the prefix generator's state after this batch's slices were drawn


def inputs(
    scorer: CoherenceScorer, docs: Sequence[Doc], *, pad_to_multiple_of: int | None = None
) -> dict[str, Tensor]:
    """The scorer's CPU inputs of ``docs``, without the attention mask where no position is padding (the encoder
    then attends everywhere, as that mask would say, and skips its checks)."""
    enc = scorer.inputs(docs, pad_to_multiple_of=pad_to_multiple_of)
    return {"input_ids": enc["input_ids"]} if bool(enc["attention_mask"].all()) else enc


def collate(
    scorer: CoherenceScorer,
    pos: Sequence[Doc],
    negs: Sequence[Sequence[Doc]],
    *,
    momentum: bool,
    rng: random.Random | None = None,
    pad_to_multiple_of: int | None = None,
) -> CoherenceBatch:
    """B items (``pos``, ``negs``: B × N documents) as tensors on the CPU; ``momentum``: with the momentum
    encoder's inputs, the slices drawn from ``rng`` (whose state after the draws the batch carries)."""
    b, n = len(pos), len(negs[0])
    neg_docs = [d for item in negs for d in item]
    pad = {"pad_to_multiple_of": pad_to_multiple_of}
    docs = inputs(scorer, [*pos, *neg_docs], **pad)
    if not momentum:
        return CoherenceBatch(docs, b, n)
    assert rng is not None, "the momentum positives' slices need their generator"
    slices = inputs(scorer, [prefix_slice(d, rng) for d in pos], **pad)
    return CoherenceBatch(docs, b, n, inputs(scorer, neg_docs, **pad), slices, rng.getstate())


@dataclass
class StepOutput:
    loss: Tensor  # () to backpropagate
    l_c: Tensor  # () the pairwise / contrastive term, detached
    l_m: Tensor  # () the momentum term, detached (0 without the momentum encoder)


def coherence_loss(
    model: nn.Module,
    batch: CoherenceBatch,
    *,
    kind: str,
    margin: float,
    lam: float,
    momentum: MomentumEncoder | None = None,
    queue: NegativeQueue | None = None,
) -> StepOutput:
    """The loss of a collated batch (on the model's device). ``model`` is the scorer or its DDP wrapper (the
    forward that syncs gradients)."""
    b, n = batch.b, batch.n
    scores, reps = model(**batch.docs)  # (B + B·N,), (B + B·N, H)
    f_pos, f_neg = scores[:b], scores[b:].view(b, n)  # (B,), (B, N)
    zero = scores.new_zeros(())
    if kind == "pairwise":
        _, loss = pairwise_margin_loss(f_pos, f_neg[:, 0], margin=margin)
        return StepOutput(loss, loss.detach(), zero)
    _, l_c = contrastive_margin_loss(f_pos, f_neg, margin=margin)
    if kind == "contrastive":
        return StepOutput(l_c, l_c.detach(), zero)
    assert momentum is not None and queue is not None and batch.negatives is not None and batch.slices is not None
    with torch.no_grad():
        k_neg = momentum(**batch.negatives)  # (B·N, H)
        k_pos = momentum(**batch.slices)  # (B, H)
    queue.enqueue(k_neg)  # before the loss: the queue includes this item's negatives (the code's order)
    _, l_m = momentum_contrastive_loss(reps[:b], k_pos, queue.entries(), margin=margin)
    return StepOutput(total_loss(l_c, l_m, lam=lam), l_c.detach(), l_m.detach())
