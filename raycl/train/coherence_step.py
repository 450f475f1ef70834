"""One coherence training step (SPEC §2.2): score the positive and its negatives, the loss of ``loss.kind``.

``pairwise``: max(0, τ − f⁺ + f⁻) with the first negative. ``contrastive``: −log softmax([f⁻_j − τ …, f⁺]) at the
positive. ``momentum`` (the full model): λ·L_c + (1−λ)·L_m, where L_m compares the main encoder's rep of x⁺ with
the momentum encoder's rep of a prefix slice of x⁺ (the length-invariance positive) against a FIFO queue of
momentum reps of negative documents — the current item's negatives are enqueued before the loss, as the code.
The caller runs backward, then :func:`raycl.memory.momentum.momentum_update`, then the optimizer step.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from raycl.losses.contrastive_margin import contrastive_margin_loss
from raycl.losses.momentum_contrastive import momentum_contrastive_loss, total_loss
from raycl.losses.pairwise_margin import pairwise_margin_loss
from raycl.memory.negative_queue import NegativeQueue
from raycl.models.coherence import CoherenceScorer, MomentumEncoder, prefix_slice

Doc = tuple[str, ...]


@dataclass
class StepOutput:
    loss: Tensor  # () to backpropagate
    l_c: float  # the pairwise / contrastive term
    l_m: float  # the momentum term (0 without the momentum encoder)


def coherence_loss(
    model: nn.Module, scorer: CoherenceScorer, pos: Sequence[Doc], negs: Sequence[Sequence[Doc]], *, kind: str,
    margin: float, lam: float, momentum: MomentumEncoder | None = None, queue: NegativeQueue | None = None,
    rng: random.Random | None = None,
) -> StepOutput:  # fmt: skip
    """The loss of B items: ``pos`` (B docs) and ``negs`` (B × N docs, N ≥ 1; pairwise uses the first).

    ``model`` is ``scorer`` or its DDP wrapper (the forward that syncs gradients); ``scorer`` encodes inputs.
    """
    b, n = len(pos), len(negs[0])
    docs = [*pos, *(d for item in negs for d in item)]
    enc = scorer.encode(docs)
    scores, reps = model(enc["input_ids"], enc["attention_mask"])  # (B + B·N,), (B + B·N, H)
    f_pos, f_neg = scores[:b], scores[b:].view(b, n)  # (B,), (B, N)
    if kind == "pairwise":
        _, loss = pairwise_margin_loss(f_pos, f_neg[:, 0], margin=margin)
        return StepOutput(loss, float(loss.detach()), 0.0)
    _, l_c = contrastive_margin_loss(f_pos, f_neg, margin=margin)
    if kind == "contrastive":
        return StepOutput(l_c, float(l_c.detach()), 0.0)
    assert momentum is not None and queue is not None and rng is not None, "the momentum loss needs its parts"
    neg_docs = docs[b:]
    with torch.no_grad():
        k_neg = momentum(**scorer.encode(neg_docs))  # (B·N, H)
        k_pos = momentum(**scorer.encode([prefix_slice(d, rng) for d in pos]))  # (B, H)
    queue.enqueue(k_neg)  # before the loss: the queue includes this item's negatives (the code's order)
    _, l_m = momentum_contrastive_loss(reps[:b], k_pos, queue.entries(), margin=margin)
    return StepOutput(total_loss(l_c, l_m, lam=lam), float(l_c.detach()), float(l_m.detach()))
