"""Coherence metrics (Jwalapuram, Joty, Lin, ACL 2022): pairwise accuracy and LMvLM agreement.

Accuracy is the code's ``eval.py``: an item is right iff its positive scores *strictly* higher than every
negative. LMvLM agreement appends the model as one more coder to the human label lists and computes
Krippendorff's α with the nominal metric, as ``krips_alpha.py`` (T. Grill's implementation) does, except
that a model tie is a missing value instead of being dropped (the code's drop misaligns the lists).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Score = float
NegScores = float | Sequence[float]


def _max_neg(negs: NegScores, index: int) -> float:
    try:
        values = [float(x) for x in negs]  # type: ignore[union-attr]
    except TypeError:  # a scalar (float, numpy or 0-d tensor): the item's only negative
        return float(negs)  # type: ignore[arg-type]
    if not values:
        raise ValueError(f"item {index} has no negative scores")
    return max(values)


def pairwise_accuracy(pos_scores: Sequence[Score], neg_scores: Sequence[NegScores]) -> float:
    """Share of items with ``f(pos) > max_j f(neg_j)``; ties (and NaN scores) count as wrong.

    Args:
        pos_scores: ``(N,)`` score of each item's coherent document.
        neg_scores: ``(N,)`` per item a score or a sequence of scores of its negatives (any length ≥ 1).

    Degenerate case: one negative per item gives the pairwise test sets' accuracy. No items gives NaN.
    """
    if len(pos_scores) != len(neg_scores):
        raise ValueError(f"{len(pos_scores)} positive scores but {len(neg_scores)} negative-score entries")
    if not pos_scores:
        return math.nan
    right = sum(float(p) > _max_neg(n, i) for i, (p, n) in enumerate(zip(pos_scores, neg_scores, strict=True)))
    return right / len(pos_scores)


def model_labels(pos_scores: Sequence[Score], neg_scores: Sequence[Score]) -> list[str | None]:
    """The model as an LMvLM coder: ``'0'`` if pos scores higher, ``'1'`` if neg does, ``None`` on a tie."""
    if len(pos_scores) != len(neg_scores):
        raise ValueError(f"{len(pos_scores)} positive scores but {len(neg_scores)} negative scores")
    return ["0" if p > n else "1" if n > p else None for p, n in zip(pos_scores, neg_scores, strict=True)]


def krippendorff_alpha_nominal(coders: Sequence[Sequence[str | None]]) -> float:
    """Krippendorff's α, nominal metric: ``α = 1 − D_o / D_e`` (Krippendorff 2011, "Computing K's α").

    Args:
        coders: ``(C, U)`` label of each coder for each unit; ``None`` is missing. Labels are compared as
            floats (``'0'`` and ``'0.0'`` agree), as ``krips_alpha.py`` casts them.

    Units with fewer than 2 values are dropped; ``n`` = number of remaining (pairable) values;
    ``D_o = Σ_u Σ_{a,b ∈ u} [a ≠ b] / (m_u − 1) / n`` over ordered pairs of distinct positions of unit ``u``
    (``m_u`` values), ``D_e = Σ_{a,b} [a ≠ b] / (n (n − 1))`` over ordered pairs of all pairable values.
    Degenerate cases: ``D_o = 0`` (perfect agreement, including one value used throughout) gives 1.0; no
    pairable value gives NaN.
    """
    if len({len(c) for c in coders}) > 1:
        raise ValueError(f"coders label different numbers of units: {[len(c) for c in coders]}")
    units: list[list[float]] = [[] for _ in range(len(coders[0]) if coders else 0)]
    for labels in coders:
        for u, value in enumerate(labels):
            if value is not None:
                units[u].append(float(value))
    pairable = [values for values in units if len(values) >= 2]
    n = sum(len(values) for values in pairable)
    if n == 0:
        return math.nan
    # nominal: Σ_{a,b}[a ≠ b] over ordered pairs = m² − Σ_v count_v², per unit and over all pairable values
    d_o = sum(_disagreeing_pairs(values) / (len(values) - 1) for values in pairable) / n
    if d_o == 0:
        return 1.0
    d_e = _disagreeing_pairs([v for values in pairable for v in values]) / (n * (n - 1))
    return 1.0 - d_o / d_e


def alpha_with_model(
    coders: Sequence[Sequence[str | None]], pos_scores: Sequence[Score], neg_scores: Sequence[Sequence[Score]]
) -> float:
    """α of the human ``coders`` with the model as one more coder (:func:`model_labels` of each pair's one
    negative: a tie is a missing label)."""
    return krippendorff_alpha_nominal([*coders, model_labels(pos_scores, [n[0] for n in neg_scores])])


def _disagreeing_pairs(values: Sequence[float]) -> int:
    counts: dict[float, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return len(values) ** 2 - sum(c * c for c in counts.values())
