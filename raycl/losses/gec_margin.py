"""The GEC contrastive margin loss of Cao, Yang & Ng (2021), as their fairseq criterion computes it.

h_ij = max(0, γ − S(t_i|s_i) + S(t~_ij|s_i));  MML = Σ_i (1/n_i) Σ_{j≤n_i} h_ij;
L = ((1−λ)·CE_ls + λ·MML) / ntokens.

References:
    Hannan Cao, Wenmian Yang, Hwee Tou Ng. "Grammatical Error Correction with Contrastive Learning in
    Low Error Density Domains." Findings of EMNLP 2021, Eq. 4 (margin term) and Eq. 5 (total loss).
    The released fairseq criterion ``new_max_margin_loss`` is what this module reproduces.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from raycl.losses.label_smoothed_nll import smoothed_nll_from_token_scores
from raycl.losses.token_log_probs import TokenLogProbs

CITATION = """@inproceedings{cao-etal-2021-grammatical,
    title = "Grammatical Error Correction with Contrastive Learning in Low Error Density Domains",
    author = "Cao, Hannan and Yang, Wenmian and Ng, Hwee Tou",
    booktitle = "Findings of the Association for Computational Linguistics: EMNLP 2021",
    year = "2021",
}"""


def margin_loss(s_pos: Tensor, s_neg: Tensor, n_neg: Tensor, *, margin: float) -> Tensor:
    """Per-sentence margin term h_i = (1/n_i) Σ_{j<n_i} max(0, γ − S_pos_i + S_neg_ij); h_i = 0 when n_i = 0.

    Args:
        s_pos: (B,) S(t_i|s_i), summed token log-probs of the gold target.
        s_neg: (B, M) S(t~_ij|s_i); slots j ≥ n_i are filler and ignored whatever they hold.
        n_neg: (B,) number of real negatives n_i (0 ≤ n_i ≤ M).
        margin: γ.

    Returns:
        (B,) h_i. Cao et al. (2021) Eq. 4; the code's TripletMarginWithDistanceLoss with a zero anchor and
        d(x1, x2) = Σx2 − Σx1 reduces exactly to this hinge.
    """
    slots = torch.arange(s_neg.size(1), device=s_neg.device)  # (M,)
    real = slots.unsqueeze(0) < n_neg.unsqueeze(1)  # (B, M)
    hinge = torch.relu(margin - s_pos.unsqueeze(1) + s_neg)  # (B, M)
    total = hinge.masked_fill(~real, 0.0).sum(1)  # (B,)
    return total / n_neg.clamp(min=1).to(total.dtype)  # (B,) n_i = 0 -> 0 / 1 = 0


@dataclass(frozen=True)
class GecLossOutput:
    """One batch's loss and its parts (all sums are over the batch, before the division by ntokens). The tensors
    stay where the model ran: read them back once a report, not once a step."""

    loss: Tensor  # () ((1−λ)·ce + λ·mml) / ntokens — backpropagate this
    ce: Tensor  # () label-smoothed CE, summed over non-pad target tokens
    nll: Tensor  # () plain NLL, summed (for perplexity logging)
    mml: Tensor  # () Σ_i h_i
    ntokens: int  # non-pad tokens of the positive targets, EOS included
    h: Tensor  # (B,) per-sentence margin term
    s_pos: Tensor  # (B,) S(t_i|s_i)
    s_neg: Tensor  # (B, M) S(t~_ij|s_i); filler slots j ≥ n_i hold 0


class GecContrastiveLoss(nn.Module):
    """L = ((1−λ)·CE_ls + λ·Σ_i h_i) / ntokens — Cao et al. (2021) Eq. 5, as the released code runs it.

    Args:
        margin: γ (released scripts: 0.25 for GEC-PD, 0.85 for GEC-BART).
        trade_off: λ (0.5 in every released script).
        label_smoothing: ε, applied to the CE term only; the margin term uses raw log-probs.

    Inputs (``forward``):
        pos: the positive pass's per-token scores (:class:`TokenLogProbs`, (B, T) each): ``target`` = log p_y
            and ``total`` = Σ_v log p_v. One pass supplies both CE and S_pos, so the two share one dropout mask.
        keep: (B, T) True at the positive targets' real tokens (EOS included), False at pads.
        s_neg: (B, M) summed log-probs of the negatives (each scored in its own row of the forward).
        n_neg: (B,) real negatives per sentence.
        ntokens: the positive targets' real tokens (fairseq's sample_size), a host integer: counted when the
            batch was collated, so the loss reads nothing back from the device.

    Relations: the paper writes NLL + CL; the code weighs them (1−λ, λ) = (½, ½), which only rescales the
    learning rate. Both terms are summed and divided by the positive target tokens, so the CL term is per-token
    normalised (fairseq's sample_size = ntokens), not per-sentence.

    Degenerate cases: λ = 0 gives label-smoothed CE / ntokens, fairseq's ``label_smoothed_cross_entropy``;
    a sentence with n_i = 0 contributes only its (1−λ)·CE.

    Example::

        loss_fn = GecContrastiveLoss(margin=0.25)
        pos = TokenLogProbs.from_log_probs(lprobs, target_ids)  # or scorer.token_log_probs(...)
        out = loss_fn(pos, target_ids.ne(pad_id), s_neg, n_neg, ntokens=int(target_ids.ne(pad_id).sum()))
        out.loss.backward()
    """

    citation = CITATION

    def __init__(self, *, margin: float, trade_off: float = 0.5, label_smoothing: float = 0.1) -> None:
        super().__init__()
        if not 0.0 <= trade_off <= 1.0:
            raise ValueError(f"trade_off λ must be in [0, 1], got {trade_off}")
        self.margin, self.trade_off, self.label_smoothing = margin, trade_off, label_smoothing

    def forward(
        self, pos: TokenLogProbs, keep: Tensor, s_neg: Tensor, n_neg: Tensor, *, ntokens: int
    ) -> GecLossOutput:
        nll, ce = smoothed_nll_from_token_scores(
            pos.target, pos.total, keep, epsilon=self.label_smoothing, vocab_size=pos.vocab_size
        )  # (), ()
        s_pos = pos.target.masked_fill(~keep, 0.0).sum(-1)  # (B,) S(t_i|s_i) raw, no smoothing, EOS included
        h = margin_loss(s_pos, s_neg, n_neg, margin=self.margin)  # (B,)
        mml = h.sum()
        loss = ((1.0 - self.trade_off) * ce + self.trade_off * mml) / max(ntokens, 1)
        return GecLossOutput(loss=loss, ce=ce, nll=nll, mml=mml, ntokens=ntokens, h=h, s_pos=s_pos, s_neg=s_neg)
