"""False negatives of GEC mining: selected negatives that another annotator's correction equals.

CWEB has two annotators per sentence and the paper trains on annotator 0's correction t only; the source s and
every beam output ≠ t become negatives. Where annotator 1 left the sentence unchanged (46% of annotator 0's edited
sentences in CWEB-G dev, 57% in CWEB-S dev) the source negative is a sentence a human judged correct, and a beam
output equal to annotator 1's correction is a correct sentence pushed below t. Retrieval handles the same thing as
denoised or positive-aware negatives (RocketQA, Qu et al. 2021; NV-Retriever, Moreira et al. 2024).

A negative n of an example with references R (every annotator's correction, the unchanged source for an annotator
who made no edit) is *refuted* iff norm(n) ∈ norm(R) and norm(n) ≠ norm(t), norm = whitespace-normalised. Counts
are kept per kind: ``source`` (n = s) and ``beam`` (any other negative, a hypothesis). Degenerate case: one
annotator, R = {t}, so nothing is ever refuted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

MODES = ("keep", "drop")  # mining.false_negatives / raycl.mine --false-negatives; keep = the paper
KINDS = ("source", "beam")


def normalize(text: str) -> str:
    return " ".join(text.split())


def refuted_set(references: Iterable[str], target: str) -> frozenset[str]:
    """The normalised corrections a negative may not equal: every annotator's but the target's own text."""
    tgt = normalize(target)
    return frozenset(r for r in map(normalize, references) if r != tgt)


@dataclass
class FalseNegativeCounts:
    """Negatives the rule selected and, of those, the refuted ones, per kind (``source`` | ``beam``)."""

    selected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    refuted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))

    def add(self, negatives: Sequence[str], *, source: str, refuted: frozenset[str]) -> None:
        """Count one example's selected ``negatives`` (normalised texts) against its ``refuted`` set."""
        src = normalize(source)
        for neg in negatives:
            kind = "source" if neg == src else "beam"
            self.selected[kind] += 1
            self.refuted[kind] += neg in refuted

    def merge(self, other: FalseNegativeCounts | Mapping[str, Mapping[str, int]]) -> FalseNegativeCounts:
        got = other.as_dict() if isinstance(other, FalseNegativeCounts) else other
        for kind in KINDS:
            self.selected[kind] += int(got[kind]["selected"])
            self.refuted[kind] += int(got[kind]["refuted"])
        return self

    def as_dict(self) -> dict[str, dict[str, int]]:
        """``{"source": {"selected": N, "refuted": M}, "beam": {...}}``, as ``raycl.mine --json`` prints it."""
        return {k: {"selected": self.selected[k], "refuted": self.refuted[k]} for k in KINDS}

    def flat(self) -> list[int]:
        """source selected, source refuted, beam selected, beam refuted: four integer columns of a summary."""
        return [self.selected["source"], self.refuted["source"], self.selected["beam"], self.refuted["beam"]]

    @classmethod
    def of_flat(cls, values: Sequence[int]) -> FalseNegativeCounts:
        s_sel, s_ref, b_sel, b_ref = map(int, values)
        return cls({"source": s_sel, "beam": b_sel}, {"source": s_ref, "beam": b_ref})


def rate_text(counts: Mapping[str, Mapping[str, int]], kind: str) -> str:
    """``refuted/selected (r%)`` of one kind, for reports."""
    sel, ref = int(counts[kind]["selected"]), int(counts[kind]["refuted"])
    return f"{ref}/{sel} ({100 * ref / sel:.1f}%)" if sel else "0/0 (–)"
