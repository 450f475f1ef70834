"""The cross-attention layer of ZhichunRoad's SemEval-2022 Task 2 Subtask B model, and mean pooling.

One multi-head attention layer whose queries come from one sentence and keys/values from the other:
A' = softmax(Q_A K_Bᵀ/√d + M_B)·V_B and B' = softmax(Q_B K_Aᵀ/√d + M_A)·V_A, with the same Q/K/V weights
both ways and M = (1 − mask)·(−10000) on the keys. There is no output projection, no residual and no
LayerNorm: the pooled output is the attention read-out alone. Each side is then mean-pooled over its own mask.

References:
    Xuange Cui, Wei Xiong, Songlin Wang. "ZhichunRoad at SemEval-2022 Task 2: Adversarial Training and
    Contrastive Learning for Multiword Representations." SemEval 2022, §3.3 and Figure 1 (cross-attention).
    The released ``subtaskB`` ``CrossAttention`` module (docs/recipes/sts.md).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

MASK_VALUE = -10000.0  # BERT's additive mask constant, as upstream (not −inf: an all-padding row stays finite)


def mean_pool(h: Tensor, mask: Tensor) -> Tensor:
    """Mean of the token states over real tokens: (B, T, H), (B, T) -> (B, H); sentence-transformers' Pooling."""
    m = mask.unsqueeze(-1).to(h.dtype)  # (B, T, 1)
    return (h * m).sum(1) / m.sum(1).clamp(min=1e-9)  # (B, H)


class CrossAttention(nn.Module):
    """Pairwise cross-attention: A's tokens attend to B's and B's to A's with shared Q/K/V, then mean pooling.

    Args:
        hidden: H, the encoder's hidden size (768 for mBERT).
        heads: number of heads; H must divide by it (12 × 64 for mBERT).
        dropout: dropout on the attention probabilities (0.1).

    Inputs (``forward``): h_a (B, Ta, H), mask_a (B, Ta), h_b (B, Tb, H), mask_b (B, Tb); masks are 1 for
    real tokens.

    Returns: (pooled_a (B, H), pooled_b (B, H)).

    Degenerate case: with an identity value map and a single real key token in B, every token of A reads
    out exactly that token's state, so pooled_a equals it (no residual adds A back).
    """

    def __init__(self, hidden: int = 768, heads: int = 12, *, dropout: float = 0.1) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not a multiple of the number of heads {heads}")
        self.hidden, self.heads, self.head_dim = hidden, heads, hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)

    def attend(self, h_q: Tensor, h_kv: Tensor, mask_kv: Tensor) -> Tensor:
        """Tokens of ``h_q`` read out ``h_kv``: (B, Tq, H), (B, Tk, H), (B, Tk) -> (B, Tq, H)."""
        B, Tq, H = h_q.shape
        Tk = h_kv.size(1)
        q = self.query(h_q).view(B, Tq, self.heads, self.head_dim).transpose(1, 2)  # (B, h, Tq, d)
        k = self.key(h_kv).view(B, Tk, self.heads, self.head_dim).transpose(1, 2)  # (B, h, Tk, d)
        v = self.value(h_kv).view(B, Tk, self.heads, self.head_dim).transpose(1, 2)  # (B, h, Tk, d)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)  # (B, h, Tq, Tk)
        key_mask = (1.0 - mask_kv.to(scores.dtype)) * MASK_VALUE  # (B, Tk)
        probs = torch.softmax(scores + key_mask[:, None, None, :], dim=-1)  # (B, h, Tq, Tk)
        out = self.dropout(probs) @ v  # (B, h, Tq, d)
        return out.transpose(1, 2).reshape(B, Tq, H)  # (B, Tq, H) heads concatenated, no output projection

    def forward(self, h_a: Tensor, mask_a: Tensor, h_b: Tensor, mask_b: Tensor) -> tuple[Tensor, Tensor]:
        a_reads_b = self.attend(h_a, h_b, mask_b)  # (B, Ta, H)
        b_reads_a = self.attend(h_b, h_a, mask_a)  # (B, Tb, H)
        return mean_pool(a_reads_b, mask_a), mean_pool(b_reads_a, mask_b)  # (B, H), (B, H)
