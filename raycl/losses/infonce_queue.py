"""InfoNCE with in-batch negatives and a queue of momentum keys (ZhichunRoad's MultipleNegativesRankingLoss_MoCo).

ℓ_i = −log( e^{cos(h_i, h⁺_i)/τ} / (Σ_{j=1}^{B} e^{cos(h_i, h⁺_j)/τ} + Σ_{q=1}^{Q} e^{cos(h_i, k_q)/τ}
                                        + Σ_{k ∈ N(i)} e^{cos(h_i, n_ik)/τ}) );
L_con = (1/B) Σ_i ℓ_i.  The joint objective is L = L_mse + λ·L_con.  N(i): anchor i's own mined hard negatives
(none by default), SimCSE's supervised form with each anchor's negatives in its own denominator only.

References:
    Xuange Cui, Wei Xiong, Songlin Wang. "ZhichunRoad at SemEval-2022 Task 2: Adversarial Training and
    Contrastive Learning for Multiword Representations." SemEval 2022, §3.3, Eq. 4 (L_con) and Eq. 3
    (L_joint). Kaiming He et al. "Momentum Contrast for Unsupervised Visual Representation Learning."
    CVPR 2020 (the queue). Tianyu Gao, Xingcheng Yao, Danqi Chen. "SimCSE: Simple Contrastive Learning of
    Sentence Embeddings." EMNLP 2021, §4 (hard negatives as extra denominator terms). The released
    ``MultipleNegativesRankingLoss_MoCo`` (docs/recipes/sts.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raycl.losses.full_precision import autocast_off
from raycl.losses.mse_cosine import CITATION

TEMPERATURE = 0.05  # τ; sentence-transformers' scale 20 = 1/τ
LAMBDA = 0.15  # λ of the joint loss


@dataclass(frozen=True)
class InfoNCEOutput:
    loss: Tensor  # () mean of per_example — backpropagate this
    per_example: Tensor  # (B,) ℓ_i
    logits: Tensor  # (B, B+Q[+K]) [cos(h_i, h⁺_j) ‖ cos(h_i, k_q) ‖ cos(h_i, n_ik)] / τ (−inf: a masked
    # negative); the positive of row i is column i


class InfoNCEQueueLoss(nn.Module):
    """L_con = mean_i CE([cos(h_i, h⁺_j)]_j ‖ [cos(h_i, k_q)]_q) / τ, label i) — Cui et al. (2022) Eq. 4.

    Args:
        temperature: τ (0.05, i.e. the code's scale 20).

    Inputs (``forward``):
        h: (B, H) anchors h_i (SimCSE view 1: mean-pooled encoder output, cross-attention bypassed).
        h_pos: (B, H) positives h⁺_i (view 2: the same sentences, another dropout mask); h⁺_j, j ≠ i, are
            the in-batch negatives.
        queue: (Q, H) key embeddings k_q from the momentum encoder, negatives only; Q = 0 or ``None`` allowed.
            It is detached here: keys never carry gradient.
        negatives: (B, K, H) each anchor's own hard negatives n_ik (mined, embedded by the trained encoder, so
            they carry gradient as in SimCSE); K = 0 or ``None`` allowed.
        negatives_mask: (B, K) bool, True where n_ik is a real negative (anchors with fewer than K are padded);
            ``None``: all real.

    Relations: the queue only adds columns to the softmax's denominator; it supplies no positives. The caller
    enqueues this step's keys *after* computing the loss, as the released code does, so a key never meets its
    own anchor.

    Degenerate case: Q = 0 is sentence-transformers' MultipleNegativesRankingLoss (in-batch InfoNCE, SimCSE);
    no negatives (``None``, K = 0) is exactly the in-batch/queue loss, and a masked negative adds nothing.
    Anchor i's negatives appear in row i only: another anchor's mined negative may be one of *its* positives, which
    the miner checked only against i's.

    Example::

        out = InfoNCEQueueLoss()(model.embed(ids, mask), model.embed(ids, mask), moco.queued())
        moco.enqueue(moco.keys(ids, mask))
    """

    citation = CITATION

    def __init__(self, *, temperature: float = TEMPERATURE) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature τ must be > 0, got {temperature}")
        self.temperature = temperature

    def forward(
        self,
        h: Tensor,
        h_pos: Tensor,
        queue: Tensor | None = None,
        negatives: Tensor | None = None,
        negatives_mask: Tensor | None = None,
    ) -> InfoNCEOutput:
        # the logits stay fp32 under autocast: cosines / τ (τ = 0.05) in bf16 would keep ~2 significant digits
        dt = torch.promote_types(h.dtype, torch.float32)  # fp32, or fp64 for fp64 inputs
        with autocast_off(h.device.type):
            h_n, pos_n = F.normalize(h.to(dt), dim=-1), F.normalize(h_pos.to(dt), dim=-1)  # (B, H), (B, H)
            columns = pos_n
            if queue is not None and queue.size(0) > 0:
                keys = F.normalize(queue.detach().to(dt), dim=-1)  # (Q, H)
                columns = torch.cat([pos_n, keys], dim=0)  # (B+Q, H)
            logits = h_n @ columns.t() / self.temperature  # (B, B+Q)
            if negatives is not None and negatives.size(1) > 0:
                logits = torch.cat(
                    [logits, _own_logits(h_n, negatives.to(dt), negatives_mask, self.temperature)], dim=1
                )  # (B, B+Q+K)
        labels = torch.arange(h.size(0), device=h.device)  # (B,) the positive of row i is column i
        per_example = F.cross_entropy(logits, labels, reduction="none")  # (B,)
        return InfoNCEOutput(loss=per_example.mean(), per_example=per_example, logits=logits)


def _own_logits(h_n: Tensor, negatives: Tensor, mask: Tensor | None, temperature: float) -> Tensor:
    """(B, K) cos(h_i, n_ik) / τ, −inf where ``mask`` is False (e^{−inf} = 0: the term leaves the denominator)."""
    n = F.normalize(negatives, dim=-1)  # (B, K, H)
    logits = torch.einsum("bh,bkh->bk", h_n, n) / temperature  # (B, K)
    return logits if mask is None else logits.masked_fill(~mask, float("-inf"))


def joint_loss(l_mse: Tensor, l_con: Tensor, *, lam: float = LAMBDA) -> Tensor:
    """L_joint = L_mse + λ·L_con — Cui et al. (2022) Eq. 3, ``loss.joint=sum`` (docs/recipes/sts.md)."""
    return l_mse + lam * l_con
