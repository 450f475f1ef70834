"""The momentum-queue loss of the full coherence model and its total (Jwalapuram, Joty & Lin 2022, Eq. 3, 5).

L_m = −log( e^{cos(q, k⁺)} / (e^{cos(q, k⁺)} + Σ_{k∈Q} e^{cos(q, k) − τ}) ),
L   = λ·L_c + (1 − λ)·L_m   (λ = 0.85, τ = 0.1).

q is the main encoder's document rep of x⁺ (with gradient), k⁺ the momentum encoder's rep of the
length-invariance slice of x⁺, Q the queue of momentum reps of *negative* documents only (paper §3.4;
the released code never enqueues a positive).
The similarity is the plain cosine, **no temperature**; the margin is subtracted from the queue terms, as the
code does. The queue is updated *before* the loss, so it holds the current item's negatives too.

References:
    Lin Jwalapuram, Shafiq Joty, Xiang Lin. "Rethinking Self-Supervision Objectives for Generalizable
    Coherence Modeling." ACL 2022, Eq. 3 (momentum loss) and Eq. 5 (total); He et al. "Momentum Contrast for
    Unsupervised Visual Representation Learning", CVPR 2020 (the queue and momentum encoder).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from raycl.losses.pairwise_margin import CITATION

__all__ = ["CITATION", "momentum_contrastive_loss", "total_loss"]


def momentum_contrastive_loss(
    q: Tensor, k_pos: Tensor, queue: Tensor, *, margin: float = 0.1
) -> tuple[Tensor, Tensor]:
    """Per-example L_m and the batch mean.

    Args:
        q: (B, H) main-encoder reps of the positives (gradients flow through q only).
        k_pos: (B, H) momentum reps of the positives' prefix slices (detached).
        queue: (K, H) momentum reps of negative documents, K ≥ 0, shared by the batch (detached).
        margin: τ, subtracted from each queue similarity.

    Returns:
        ``(per_example (B,), loss ())`` with loss = mean_b L_m,b.

    Degenerate case: an empty queue (K = 0) gives L_m = −log 1 = 0 exactly (the first step of training).
    """
    if q.shape != k_pos.shape or q.dim() != 2 or queue.dim() != 2 or queue.size(1) != q.size(1):
        raise ValueError(f"expected q, k_pos (B, H) and queue (K, H); got {q.shape}, {k_pos.shape}, {queue.shape}")
    q_unit = F.normalize(q, dim=1)  # (B, H)
    pos = (q_unit * F.normalize(k_pos.detach(), dim=1)).sum(1)  # (B,) cos(q, k⁺)
    neg = q_unit @ F.normalize(queue.detach(), dim=1).T  # (B, K) cos(q, k) for every queue entry
    logits = torch.cat([pos.unsqueeze(1), neg - margin], dim=1)  # (B, 1+K)
    per_example = -torch.log_softmax(logits, dim=1)[:, 0]  # (B,)
    return per_example, per_example.mean()


def total_loss(l_c: Tensor, l_m: Tensor, *, lam: float = 0.85) -> Tensor:
    """L = λ·L_c + (1 − λ)·L_m (Eq. 5); λ = 1 gives the contrastive loss alone, λ = 0 the momentum loss alone."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"λ must be in [0, 1], got {lam}")
    return lam * l_c + (1.0 - lam) * l_m
