"""Label-smoothed negative log-likelihood, exactly fairseq's ``label_smoothed_nll_loss`` (summed).

CE = Σ_tok [(1−ε)(−log p_y) + (ε/|V|)(−Σ_v log p_v)] over non-pad tokens (Cao et al. 2021 use ε = 0.1, for the
CE term only). Degenerate case: ε = 0 gives the plain summed NLL. Per token the loss needs only ``log p_y`` and
``Σ_v log p_v``: :func:`smoothed_nll_from_token_scores` takes those (from
:func:`raycl.losses.token_log_probs.token_log_probs`, which keeps no full log-softmax), :func:`label_smoothed_nll`
a full (N, V) log-softmax.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor


class LabelSmoothedNll(NamedTuple):
    nll: Tensor  # () Σ −log p_y over non-pad tokens
    smoothed: Tensor  # () the label-smoothed loss, summed


def label_smoothed_nll(lprobs: Tensor, target: Tensor, *, epsilon: float, ignore_index: int) -> LabelSmoothedNll:
    """Summed fairseq label-smoothed NLL.

    Args:
        lprobs: (N, V) log-probabilities (log-softmax output).
        target: (N,) gold ids; positions equal to ``ignore_index`` (the pad id) count for nothing.
        epsilon: ε, the smoothing mass spread uniformly over the |V| classes (fairseq's ``eps_i = ε/|V|``).

    Returns:
        ``(nll_sum, smoothed_sum)`` as a named tuple ``(nll, smoothed)``; both are scalars.
    """
    keep = target.ne(ignore_index)  # (N,)
    safe = target.masked_fill(~keep, 0)  # (N,) any valid index; masked out below
    target_lp = lprobs.gather(-1, safe.unsqueeze(-1)).squeeze(-1)  # (N,)
    return smoothed_nll_from_token_scores(
        target_lp, lprobs.sum(-1), keep, epsilon=epsilon, vocab_size=lprobs.size(-1)
    )


def smoothed_nll_from_token_scores(
    target_lp: Tensor, total_lp: Tensor, keep: Tensor, *, epsilon: float, vocab_size: int
) -> LabelSmoothedNll:
    """The same sums from per-token scores: ``target_lp`` = log p_y, ``total_lp`` = Σ_v log p_v, ``keep`` = not
    padding, all of one shape (e.g. (B, T)); masked positions may hold anything (they are replaced, not scaled)."""
    nll_sum = -target_lp.masked_fill(~keep, 0.0).sum()
    smooth_sum = -total_lp.masked_fill(~keep, 0.0).sum()
    eps_i = epsilon / vocab_size
    return LabelSmoothedNll(nll_sum, (1.0 - epsilon) * nll_sum + eps_i * smooth_sum)
