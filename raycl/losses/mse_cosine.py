"""The supervised STS loss of ZhichunRoad's Subtask B model: MSE between a cosine and a similarity label.

ℓ_i = (cos(u_i, v_i) − y_i)²;  L_mse = (1/B) Σ_i ℓ_i, with y_i = STS score / 5 ∈ [0, 1].

References:
    Xuange Cui, Wei Xiong, Songlin Wang. "ZhichunRoad at SemEval-2022 Task 2: Adversarial Training and
    Contrastive Learning for Multiword Representations." SemEval 2022, §3.3, Eq. 3 (L_mse).
    sentence-transformers' ``CosineSimilarityLoss`` (MSE of the cosine), which the released code uses on the
    cross-attended pair embeddings (docs/recipes/sts.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

CITATION = """@inproceedings{cui-etal-2022-zhichunroad,
    title = "{Z}hichun{R}oad at {S}em{E}val-2022 Task 2: Adversarial Training and Contrastive Learning for
             Multiword Representations",
    author = "Cui, Xuange and Xiong, Wei and Wang, Songlin",
    booktitle = "Proceedings of the 16th International Workshop on Semantic Evaluation (SemEval-2022)",
    year = "2022",
}"""


@dataclass(frozen=True)
class MSECosineOutput:
    loss: Tensor  # () mean of per_example — backpropagate this
    per_example: Tensor  # (B,) (cos(u_i, v_i) − y_i)²
    cos: Tensor  # (B,) cos(u_i, v_i), the predicted similarity


class MSECosineLoss(nn.Module):
    """L_mse = (1/B) Σ_i (cos(u_i, v_i) − y_i)² — Cui et al. (2022) Eq. 3, as CosineSimilarityLoss computes it.

    Inputs (``forward``):
        u: (B, H) embeddings of the first sentences (cross-attended and mean-pooled in the Subtask B model).
        v: (B, H) embeddings of the second sentences.
        labels: (B,) target similarities y_i; the caller scales them (STS score / 5 ∈ [0, 1]).

    Relations: a zero vector has cosine 0 (torch's eps), so it is pulled towards y = 0 only through its
    partner. Degenerate case: u_i = v_i gives cos = 1 and ℓ_i = (1 − y_i)².

    Example::

        out = MSECosineLoss()(*model.pair_embeddings(a, b), scores / 5.0)
        out.loss.backward()
    """

    citation = CITATION

    def forward(self, u: Tensor, v: Tensor, labels: Tensor) -> MSECosineOutput:
        cos = torch.cosine_similarity(u, v, dim=-1)  # (B,)
        per_example = (cos - labels.to(cos.dtype)) ** 2  # (B,)
        return MSECosineOutput(loss=per_example.mean(), per_example=per_example, cos=cos)
