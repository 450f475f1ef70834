"""The margin-based pairwise ranking loss of the coherence models (Jwalapuram, Joty & Lin 2022, Eq. 1).

L = max(0, τ − f(x⁺) + f(x⁻)), with f the coherence score and τ the margin (0.1 in the released scripts).

References:
    Lin Jwalapuram, Shafiq Joty, Xiang Lin. "Rethinking Self-Supervision Objectives for Generalizable
    Coherence Modeling." ACL 2022, §3.2, Eq. 1 (after Collobert et al. 2011). The released
    ``pairwise/train.py`` uses ``negs[0]`` and crashes on ``args.num_negs`` (docs/recipes/coherence.md).
"""

from __future__ import annotations

import torch
from torch import Tensor

CITATION = """@inproceedings{jwalapuram-etal-2022-rethinking,
    title = "Rethinking Self-Supervision Objectives for Generalizable Coherence Modeling",
    author = "Jwalapuram, Lin and Joty, Shafiq and Lin, Xiang",
    booktitle = "Proceedings of the 60th Annual Meeting of the Association for Computational Linguistics",
    year = "2022",
}"""


def pairwise_margin_loss(f_pos: Tensor, f_neg: Tensor, *, margin: float = 0.1) -> tuple[Tensor, Tensor]:
    """Per-example hinge h_b = max(0, τ − f⁺_b + f⁻_b) and the batch mean.

    Args:
        f_pos: (B,) scores f(x⁺) of the coherent documents.
        f_neg: (B,) scores f(x⁻) of one negative each (the code's ``negs[0]``).
        margin: τ.

    Returns:
        ``(per_example (B,), loss ())`` with loss = mean_b h_b (= h_0 at the paper's batch size 1).

    Degenerate case: τ = 0 gives the ranking ReLU max(0, f⁻ − f⁺), zero as soon as the positive ranks first.
    """
    if f_pos.shape != f_neg.shape or f_pos.dim() != 1:
        raise ValueError(f"f_pos and f_neg must both be (B,), got {tuple(f_pos.shape)} and {tuple(f_neg.shape)}")
    per_example = torch.relu(margin - f_pos + f_neg)  # (B,)
    return per_example, per_example.mean()
