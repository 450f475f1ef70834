"""The M2 format (CoNLL-2014 / BEA-2019 / CWEB): source sentences with every annotator's edits.

::

    S This are a sentence .
    A 1 2|||R:VERB:SVA|||is|||REQUIRED|||-NONE-|||0
    A 0 0|||noop|||-NONE-|||REQUIRED|||-NONE-|||1

Token offsets are ``[start, end)`` over the whitespace-tokenised ``S`` line; the annotator id is the last
field of an ``A`` line. ``-1 -1`` with type ``noop`` says "this annotator made no edit".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

NOOP = "noop"


@dataclass(frozen=True)
class Edit:
    """One annotated edit: replace ``source[start:end]`` with ``correction`` (tokens, space-joined)."""

    start: int
    end: int
    type: str
    correction: str
    annotator: int = 0

    @property
    def is_noop(self) -> bool:
        return self.type == NOOP or self.start < 0

    def to_line(self) -> str:
        return f"A {self.start} {self.end}|||{self.type}|||{self.correction}|||REQUIRED|||-NONE-|||{self.annotator}"


@dataclass(frozen=True)
class M2Sentence:
    """A tokenised source sentence and the edits of all its annotators."""

    source: str
    edits: tuple[Edit, ...] = field(default_factory=tuple)

    @property
    def tokens(self) -> list[str]:
        return self.source.split()

    def annotators(self) -> list[int]:
        """Sorted annotator ids present (a sentence with no ``A`` line counts as annotator 0's no-edit)."""
        return sorted({e.annotator for e in self.edits}) or [0]

    def edits_of(self, annotator: int) -> list[Edit]:
        return [e for e in self.edits if e.annotator == annotator and not e.is_noop]

    def target(self, annotator: int = 0) -> str:
        """The corrected sentence: ``annotator``'s edits applied right to left to the source tokens."""
        tokens = self.tokens
        for e in sorted(self.edits_of(annotator), key=lambda e: (e.start, e.end), reverse=True):
            tokens[e.start : e.end] = e.correction.split()
        return " ".join(tokens)

    def to_block(self) -> str:
        lines = [f"S {self.source}"]
        edits = self.edits or (Edit(-1, -1, NOOP, "-NONE-", 0),)
        lines += [e.to_line() for e in edits]
        return "\n".join(lines)


def write_m2(path: str | Path, sentences: Iterable[M2Sentence]) -> None:
    """Write ``sentences`` as M2 (blank line after each block), atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for sent in sentences:
            f.write(sent.to_block() + "\n\n")
    tmp.replace(path)
