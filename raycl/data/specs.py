"""Data file specs: which file(s), which format, which sentences.

A spec is ``PATH`` or ``PATH[START:STOP]``, where the slice is Python's over the file's *sentences* (either
bound optional, negatives count from the end). The format follows from the spec:

- ``x.m2``: M2 (source + annotated edits);
- ``x.tsv``: parallel text, ``source<TAB>target`` per line;
- ``SRC|TGT``: parallel text in two files, one sentence per line, same number of lines.

Example (CWEB, as the GEC recipe uses it): ``CWEB-S.dev.m2[1000:]`` for fine-tuning, ``CWEB-S.dev.m2[:1000]``
for dev.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Literal, TypeVar

from raycl.data.m2 import MAX_LINE
from raycl.errors import UserError, shown

T = TypeVar("T")
Format = Literal["m2", "tsv", "pair"]

_SLICED = re.compile(r"^(?P<files>.*)\[(?P<start>[^\[\]:]*):(?P<stop>[^\[\]:]*)\]$")
_INT = re.compile(r"^[+-]?\d+$")
_EXPECTED = "expected PATH or PATH[START:STOP] with integer bounds"
MAX_BOUND = 10**12  # a slice bound, in sentences (BEA-2019's training data has 1.2 million)


@dataclass(frozen=True)
class Spec:
    """A parsed data spec; ``str(spec)`` gives back the spec string."""

    path: Path
    start: int | None = None
    stop: int | None = None
    target_path: Path | None = None  # the TGT file of a ``SRC|TGT`` pair
    kind: Format | None = None  # sniffed from the content when the name does not say (CWEB's *.tok.ann1)

    @property
    def format(self) -> Format:
        if self.target_path is not None:
            return "pair"
        if self.kind is not None:
            return self.kind
        return "m2" if self.path.suffix.lower() == ".m2" else "tsv"

    @property
    def is_sliced(self) -> bool:
        return self.start is not None or self.stop is not None

    def __str__(self) -> str:
        files = str(self.path) if self.target_path is None else f"{self.path}|{self.target_path}"
        if not self.is_sliced:
            return files
        start = "" if self.start is None else str(self.start)
        stop = "" if self.stop is None else str(self.stop)
        return f"{files}[{start}:{stop}]"

    def select(self, items: Iterable[T]) -> list[tuple[int, T]]:
        """``(index in the file, item)`` for the sentences this spec's slice keeps, in file order.

        With non-negative bounds the items are consumed lazily (``[:1000]`` of a huge file reads 1000).
        """
        if (self.start or 0) >= 0 and (self.stop is None or self.stop >= 0):
            return list(islice(enumerate(items), self.start, self.stop))
        indexed = list(enumerate(items))
        return indexed[self.start : self.stop]


def _bound(text: str, spec: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    if not _INT.match(text):
        raise UserError(f"data spec {spec!r}: {_EXPECTED}")
    if len(text.lstrip("+-")) > len(str(MAX_BOUND)) or abs(int(text)) > MAX_BOUND:  # digits counted first
        raise UserError(
            f"data spec {shown(spec)}: slice bound {shown(text)}, expected an integer of magnitude at "
            f"most {MAX_BOUND:,} (sentences)"
        )
    return int(text)


def parse_spec(spec: str, *, must_exist: bool = True) -> Spec:
    """Parse ``PATH``, ``PATH[START:STOP]``, ``SRC|TGT`` or ``SRC|TGT[START:STOP]``.

    Raises :class:`UserError` for a malformed slice, an unknown format, or (with ``must_exist``) a missing file.
    """
    files, start, stop = spec, None, None
    if spec.endswith("]"):
        m = _SLICED.match(spec)
        if m is None:
            raise UserError(f"data spec {spec!r}: {_EXPECTED}")
        files, start, stop = m["files"], _bound(m["start"], spec), _bound(m["stop"], spec)
    parts = files.split("|")
    if len(parts) > 2 or not all(p.strip() for p in parts):
        raise UserError(f"data spec {spec!r}: expected PATH, or SRC|TGT for a pair of parallel text files")
    paths = [Path(p.strip()) for p in parts]
    if must_exist:
        for p in paths:
            if not p.is_file():
                raise UserError(f"data spec {spec!r}: no such file {str(p)!r}")
    kind: Format | None = None
    if len(paths) == 1 and paths[0].suffix.lower() not in (".m2", ".tsv"):
        kind = _sniff(paths[0], spec) if paths[0].is_file() else None
        if kind is None:
            raise UserError(
                f"data spec {spec!r}: unknown format, expected an M2 file (first line 'S ...'), "
                "a .tsv file or SRC|TGT text files"
            )
    return Spec(paths[0], start, stop, paths[1] if len(paths) == 2 else None, kind)


def _sniff(path: Path, spec: str) -> Format | None:
    """M2 if the first non-blank line starts with ``S ``, TSV if it has a tab; None otherwise."""
    with open(path, "rb") as f:
        while raw := f.readline(MAX_LINE):  # a line of a sentence's length at most: the reader refuses longer
            line = raw.decode("utf-8", errors="replace").strip("\r\n")
            if line.strip():
                return "m2" if line.startswith("S ") else ("tsv" if "\t" in line else None)
    return None
