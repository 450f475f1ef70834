"""GEC evaluation on top of ERRANT: per-annotator and combined scores, OE/IE ratios, bootstrap sign test.

Cao, Yang, Ng (Findings EMNLP 2021): §3.3 significance ("one-tailed sign test with bootstrap resampling on
100 samples"), §3.6 over-/in-sufficient correction ratios, and CWEB scored separately per annotator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any

import numpy as np

from raycl.data.m2 import Edit, M2Sentence
from raycl.errors import UserError, at
from raycl.scoring.errant_scorer import (
    HypEdits,
    Score,
    accumulate,
    annotate_hypotheses,
    score_corpus,
    sentence_counts,
)


@dataclass(frozen=True)
class Overlap:
    """Edit-range overlap counts (paper §3.6); ratios with 0/0 = 0."""

    n_oe: int  # hypothesis edits that touch no gold edit
    n_hyp: int
    n_ie: int  # gold edits that no hypothesis edit touches
    n_gold: int

    @property
    def oe(self) -> float:
        return self.n_oe / self.n_hyp if self.n_hyp else 0.0

    @property
    def ie(self) -> float:
        return self.n_ie / self.n_gold if self.n_gold else 0.0


def _touches(a: Edit, b: Edit) -> bool:
    # closed token ranges [start, end], so an insertion at i touches an edit ending or starting at i
    return a.start <= b.end and b.start <= a.end


def overlap_ratios(hyp_edits: HypEdits, refs: Sequence[M2Sentence], *, annotator: int) -> Overlap:
    """OE ratio = #OE / #hyp edits, IE ratio = #IE / #gold edits of ``annotator``, over the corpus.

    A hypothesis edit is over-correction (OE) if its range ``[start, end]`` intersects no gold edit's range;
    a gold edit is in-sufficient correction (IE) if it intersects no hypothesis edit. Noops are excluded.
    Degenerate case: hypothesis = the annotator's own edits gives OE = IE = 0.
    """
    n_oe = n_hyp = n_ie = n_gold = 0
    for hyp, ref in zip(hyp_edits, refs, strict=True):
        hyp_real = [e for e in hyp if not e.is_noop]
        gold = ref.edits_of(annotator)
        n_hyp += len(hyp_real)
        n_gold += len(gold)
        n_oe += sum(not any(_touches(h, g) for g in gold) for h in hyp_real)
        n_ie += sum(not any(_touches(g, h) for h in hyp_real) for g in gold)
    return Overlap(n_oe, n_hyp, n_ie, n_gold)


def sign_test_p(wins: int, losses: int) -> float:
    """One-tailed sign test: P(X >= wins) for X ~ Binomial(wins + losses, 1/2); 1.0 with no decisive trial."""
    n = wins + losses
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n


def bootstrap_sign_test(
    edits_a: HypEdits,
    edits_b: HypEdits,
    refs: Sequence[M2Sentence],
    *,
    samples: int = 100,
    seed: int = 1,
    annotator: int | None = None,
    beta: float = 0.5,
) -> dict[str, float | int]:
    """Is system A better than B? Paper §3.3: one-tailed sign test over bootstrap resamples.

    Each of ``samples`` resamples draws ``len(refs)`` sentence indices with replacement and computes both
    systems' ERRANT F_beta on it (same indices, same order); A wins a sample if its F is higher. Ties are
    dropped and ``p_value`` is the one-tailed binomial tail for "A > B". A system against itself: all ties,
    p = 1.
    """
    counts_a = sentence_counts(edits_a, refs, annotator=annotator)
    counts_b = sentence_counts(edits_b, refs, annotator=annotator)
    rng = np.random.default_rng(seed)
    wins = losses = 0
    for _ in range(samples):
        order = rng.integers(0, len(refs), size=len(refs)).tolist()
        f_a = accumulate(counts_a, beta=beta, order=order, cats=False).f
        f_b = accumulate(counts_b, beta=beta, order=order, cats=False).f
        wins += f_a > f_b
        losses += f_a < f_b
    return {"wins": wins, "losses": losses, "ties": samples - wins - losses, "p_value": sign_test_p(wins, losses)}


class HypothesisEdits:
    """One system's output lines, annotated once per distinct source list and reused for every reference.

    CWEB ships one M2 file per annotator over the same sources: those share one annotation pass.
    """

    def __init__(self, hyps: Sequence[str], *, tokenize: bool = False, name: str = "hypotheses") -> None:
        self.hyps = list(hyps)
        self.tokenize = tokenize
        self.name = name
        self._cache: dict[tuple[str, ...], list[tuple[Edit, ...]]] = {}

    def for_ref(self, ref_name: str, refs: Sequence[M2Sentence]) -> list[tuple[Edit, ...]]:
        """The hypothesis edits against ``refs``' sources; a line-count mismatch is the user's mistake."""
        if len(self.hyps) != len(refs):
            raise UserError(
                f"{at(self.name)}: {len(self.hyps)} hypothesis lines, but {ref_name} has {len(refs)} "
                "sentences; expected one line per reference sentence"
            )
        sources = tuple(s.source for s in refs)
        if sources not in self._cache:
            self._cache[sources] = annotate_hypotheses(self.hyps, sources, tokenize=self.tokenize)
        return self._cache[sources]


def _row(score: Score, overlap: Overlap | None = None) -> dict[str, float | int]:
    row: dict[str, float | int] = {"tp": score.tp, "fp": score.fp, "fn": score.fn, "p": score.p, "r": score.r}
    row[f"f{score.beta:g}"] = score.f
    if overlap is not None:
        row |= {"oe": overlap.oe, "ie": overlap.ie}
    return row


def _mean_rows(rows: Sequence[Mapping[str, float | int]], keys: Sequence[str]) -> dict[str, float]:
    return {k: fmean(float(r[k]) for r in rows) for k in keys}


def ref_annotators(refs: Sequence[M2Sentence]) -> list[int]:
    """All annotator ids that occur in a reference file, sorted."""
    return sorted({a for s in refs for a in s.annotators()})


def score_reference(
    hyp_edits: HypEdits, refs: Sequence[M2Sentence], *, annotators: Sequence[int], beta: float = 0.5
) -> dict[str, Any]:
    """``{"annotators": {id: row}, "average": mean row, "combined": errant multi-annotator row}``."""
    rows = {
        str(a): _row(
            score_corpus(hyp_edits, refs, annotator=a, beta=beta), overlap_ratios(hyp_edits, refs, annotator=a)
        )
        for a in annotators
    }
    keys = ["p", "r", f"f{beta:g}", "oe", "ie"]
    # a single (chosen) annotator: the combined score is restricted to it too
    only = annotators[0] if len(annotators) == 1 else None
    return {
        "annotators": rows,
        "average": _mean_rows(list(rows.values()), keys),
        "combined": _row(score_corpus(hyp_edits, refs, annotator=only, beta=beta)),
    }


def evaluate_gec(
    hyps: Sequence[str] | HypothesisEdits,
    refs: Mapping[str, Sequence[M2Sentence]],
    *,
    tokenize: bool = False,
    beta: float = 0.5,
    annotator: int | None = None,
) -> dict[str, Any]:
    """ERRANT scores of one system against each reference file (paper: F0.5 averaged over annotators).

    Returns ``{"refs": {name: score_reference(...)}, "average": mean over names of their "average"}``.
    ``annotator`` restricts every file to that annotator (a file without it is a :class:`UserError`). Pass
    a :class:`HypothesisEdits` to reuse one annotation pass across calls.
    """
    if not refs:
        raise ValueError("evaluate_gec needs at least one reference")
    system = hyps if isinstance(hyps, HypothesisEdits) else HypothesisEdits(hyps, tokenize=tokenize)
    out: dict[str, Any] = {}
    for name, sents in refs.items():
        present = ref_annotators(sents)
        if annotator is not None and annotator not in present:
            raise UserError(f"{at(name)}: no annotator {annotator}; expected one of {present}")
        chosen = present if annotator is None else [annotator]
        out[name] = score_reference(system.for_ref(name, sents), sents, annotators=chosen, beta=beta)
    keys = ["p", "r", f"f{beta:g}", "oe", "ie"]
    return {"refs": out, "average": _mean_rows([r["average"] for r in out.values()], keys)}
