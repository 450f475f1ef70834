"""The M2 format (CoNLL-2014 / BEA-2019 / CWEB): source sentences with every annotator's edits.

::

    S This are a sentence .
    A 1 2|||R:VERB:SVA|||is|||REQUIRED|||-NONE-|||0
    A 0 0|||noop|||-NONE-|||REQUIRED|||-NONE-|||1

Token offsets are ``[start, end)`` over the whitespace-tokenised ``S`` line; the annotator id is the last
field of an ``A`` line. ``-1 -1`` with type ``noop`` says "this annotator made no edit".
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from raycl.errors import UserError, at
from raycl.files import atomic_file

NOOP = "noop"
DELETION = "-NONE-"  # some corpora write a deletion's correction so; ERRANT writes ''


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
        span = f"{self.start} {self.end}"
        return f"A {span}|||{self.type}|||{self.correction}|||REQUIRED|||-NONE-|||{self.annotator}"


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
            tokens[e.start : e.end] = [] if e.correction == DELETION else e.correction.split()
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
    with atomic_file(path, "w", encoding="utf-8") as f:
        for sent in sentences:
            f.write(sent.to_block() + "\n\n")


_A_FIELDS = "span|||type|||correction|||required|||comment|||annotator"


MAX_LINE = 1 << 20  # characters: an M2 'S' line or a parallel-text sentence (a long GEC sentence is ~2,000)


def iter_lines(
    path: str | Path, *, chunk_bytes: int = 1 << 22, start: int = 0, first_line: int = 1, max_line: int = MAX_LINE
) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of a UTF-8 text file, line ends (LF or CRLF) stripped; from byte ``start`` (a line
    start, numbered ``first_line``) when a reader takes one range of a large file (``raycl.miners.corpus``).

    Binary or undecodable content is a :class:`UserError` naming the line, so a wrong file given as data
    fails on the spot instead of as garbage tokens; so is a line longer than ``max_line`` characters (the
    format's limit: :data:`MAX_LINE` for a sentence), found in time and memory bounded by that limit. Decodes
    whole chunks (per-line decoding is 5x slower on BEA-sized files); a line across chunks is held as its pieces,
    and only each new chunk is searched for its end. Also used by the parallel-text readers.
    """
    try:
        f = open(path, "rb")  # closed by the ``with`` below; an open error gets its own message
    except OSError as err:
        raise UserError(f"{at(path)}: cannot read ({err.strerror or err})") from None
    lineno, pieces, held = first_line - 1, [], 0  # the unfinished line's pieces and their bytes
    with f:
        f.seek(start)
        while True:
            block = f.read(chunk_bytes)
            cut = len(block) if not block else block.rfind(b"\n") + 1
            if block and cut == 0:  # no line ends in this block: hold it
                pieces.append(block)
                held += len(block)
                if held > 4 * max_line:  # more bytes than a UTF-8 line of max_line characters can have
                    raise UserError(_too_long(path, lineno + 1, max_line))
                continue
            data, pieces, held = b"".join([*pieces, block[:cut]]), [block[cut:]], len(block) - cut
            text = _decode(path, data, first_line=lineno + 1)
            if lineno == 0 and start == 0:
                text = text.removeprefix("\ufeff")
            lines = text.split("\n")
            if lines[-1] == "":
                lines.pop()  # the file or chunk ends with a newline
            for line in lines:
                lineno += 1
                if len(line) > max_line:
                    raise UserError(_too_long(path, lineno, max_line))
                yield lineno, line.removesuffix("\r")
            if not block:
                return


def _too_long(path: str | Path, lineno: int, max_line: int) -> str:
    return f"{at(path, lineno)}: line longer than {max_line} characters, expected one sentence or document a line"


def _decode(path: str | Path, data: bytes, *, first_line: int) -> str:
    nul = data.find(b"\0")
    if nul >= 0:
        line = first_line + data.count(b"\n", 0, nul)
        raise UserError(f"{at(path, line)}: NUL byte, expected UTF-8 text (is this a binary file?)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = first_line + data.count(b"\n", 0, err.start)
        raise UserError(f"{at(path, line)}: not UTF-8 text ({err.reason})") from None


def _parse_edit(path: str | Path, lineno: int, line: str, n_tokens: int) -> Edit:
    fields = line[2:].split("|||")
    if len(fields) != 6:
        raise UserError(
            f"{at(path, lineno)}: 'A' line has {len(fields)} '|||'-separated fields, expected 6 ({_A_FIELDS})"
        )
    span = fields[0].split()
    try:
        if len(span) != 2:
            raise ValueError
        start, end = int(span[0]), int(span[1])
    except ValueError:
        raise UserError(f"{at(path, lineno)}: span {fields[0]!r}, expected two integers 'START END'") from None
    if (start, end) != (-1, -1):
        if start < 0 or start > end or end > n_tokens:
            raise UserError(
                f"{at(path, lineno)}: span {start} {end} out of range, expected "
                f"0 <= start <= end <= {n_tokens} (tokens in the S line) or '-1 -1' for noop"
            )
    try:
        annotator = int(fields[5])
    except ValueError:
        raise UserError(f"{at(path, lineno)}: annotator id {fields[5]!r}, expected an integer") from None
    # Kept as written: errant_compare compares correction strings verbatim, so a '-NONE-' deletion must stay
    # '-NONE-' for score parity; target() reads it as a deletion.
    return Edit(start, end, fields[1], fields[2], annotator)


def iter_m2(path: str | Path, lines: Iterable[tuple[int, str]] | None = None) -> Iterator[M2Sentence]:
    """Stream the sentences of an M2 file (strict: any malformed line is a ``file:line`` UserError).

    Blocks are separated by blank lines; each starts with one ``S`` line followed by zero or more ``A`` lines
    of exactly six ``|||`` fields. A ``-NONE-`` correction is kept verbatim (``target()`` deletes the span).
    """
    source: str | None = None
    n_tokens = 0
    edits: list[Edit] = []
    seen = False
    for lineno, line in iter_lines(path) if lines is None else lines:
        if not line.strip():
            if source is not None:
                yield M2Sentence(source, tuple(edits))
                source, edits = None, []
        elif line.startswith("S ") or line == "S":
            if source is not None:
                raise UserError(
                    f"{at(path, lineno)}: second 'S' line in a block, expected 'A ' lines or a "
                    "blank line between sentences"
                )
            source, seen = line[2:], True
            n_tokens = len(source.split())
        elif line.startswith("A "):
            if source is None:
                raise UserError(f"{at(path, lineno)}: 'A' line outside a block, expected an 'S ' line first")
            edits.append(_parse_edit(path, lineno, line, n_tokens))
        else:
            raise UserError(
                f"{at(path, lineno)}: line starts with {line[:10]!r}, expected 'S ', 'A ' or a blank line"
            )
    if source is not None:
        yield M2Sentence(source, tuple(edits))
    elif not seen:
        raise UserError(f"{at(path)}: empty M2 file, expected 'S ' lines")


def read_m2(path: str | Path) -> list[M2Sentence]:
    """All sentences of an M2 file; see :func:`iter_m2`."""
    # Millions of small immutable objects and no cycles: the cyclic GC would only rescan them (half the time).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return list(iter_m2(path))
    finally:
        if was_enabled:
            gc.enable()
