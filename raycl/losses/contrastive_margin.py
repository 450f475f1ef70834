"""The contrastive coherence loss with a margin on the negatives (Jwalapuram, Joty & Lin 2022, Eq. 2, as coded).

L = −log( e^{f(x⁺)} / (e^{f(x⁺)} + Σ_{j=1..N} e^{f(x⁻_j) − τ}) ) = −log_softmax([f⁻_1−τ, …, f⁻_N−τ, f⁺])[N].

The margin is **subtracted from the negatives**, as the released code does (the easier direction;
docs/recipes/coherence.md). N = 5 in the paper (the script's default is 1).

References:
    Lin Jwalapuram, Shafiq Joty, Xiang Lin. "Rethinking Self-Supervision Objectives for Generalizable
    Coherence Modeling." ACL 2022, §3.3, Eq. 2; the released ``contrastive/`` code.
"""

from __future__ import annotations

import torch
from torch import Tensor

from raycl.losses.pairwise_margin import CITATION

__all__ = ["CITATION", "contrastive_margin_loss"]


def contrastive_margin_loss(f_pos: Tensor, f_neg: Tensor, *, margin: float = 0.1) -> tuple[Tensor, Tensor]:
    """Per-example −log softmax at the positive over [f⁻ − τ, f⁺], and the batch mean.

    Args:
        f_pos: (B,) scores f(x⁺).
        f_neg: (B, N) scores f(x⁻_j) of each example's N negatives (N ≥ 1).
        margin: τ, subtracted from every negative's score.

    Returns:
        ``(per_example (B,), loss ())`` with loss = mean_b L_b (= L_0 at the paper's batch size 1).

    Degenerate case: N = 1 and τ = 0 give the logistic pairwise loss log(1 + e^{f⁻ − f⁺}).
    """
    if f_pos.dim() != 1 or f_neg.dim() != 2 or f_neg.size(0) != f_pos.size(0) or f_neg.size(1) < 1:
        raise ValueError(f"expected f_pos (B,) and f_neg (B, N≥1), got {tuple(f_pos.shape)}, {tuple(f_neg.shape)}")
    logits = torch.cat([f_neg - margin, f_pos.unsqueeze(1)], dim=1)  # (B, N+1), the positive last as in the code
    per_example = -torch.log_softmax(logits, dim=1)[:, -1]  # (B,)
    return per_example, per_example.mean()
