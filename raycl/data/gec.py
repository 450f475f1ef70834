"""GEC examples (source, target) loaded from data specs, and the reference M2 sets for dev/test.

Training data may be M2 or parallel text (see :mod:`raycl.data.specs`); dev/test references must be M2,
since ERRANT scoring needs the annotators' edits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from raycl.data.m2 import NOOP, Edit, M2Sentence, iter_lines, iter_m2
from raycl.data.specs import Spec, parse_spec
from raycl.errors import UserError, at
from raycl.files import atomic_file


@dataclass(frozen=True)
class GecExample:
    """One training pair; ``id`` is ``"<file name>:<sentence index in the file>"`` (stable across slices).

    ``references``: every annotator's correction of an M2 sentence (the unchanged source for one who made no edit),
    the target's among them; ``(target,)`` for parallel text; ``()`` unknown. A negative equal to one of them but
    the target is a false negative (:mod:`raycl.miners.false_negatives`)."""

    id: str
    source: str
    target: str
    references: tuple[str, ...] = ()


def read_parallel(spec: Spec) -> list[tuple[str, str]]:
    """All ``(source, target)`` lines of a ``.tsv`` file or a ``SRC|TGT`` pair (the slice is not applied)."""
    if spec.target_path is None:
        pairs = []
        for lineno, line in iter_lines(spec.path):
            fields = line.split("\t")
            if len(fields) != 2:
                raise UserError(
                    f"{at(spec.path, lineno)}: {len(fields)} tab-separated fields, expected 'source<TAB>target'"
                )
            pairs.append((fields[0], fields[1]))
        return pairs
    sources = [line for _, line in iter_lines(spec.path)]
    targets = [line for _, line in iter_lines(spec.target_path)]
    if len(sources) != len(targets):
        raise UserError(
            f"data spec '{spec}': {spec.path} has {len(sources)} lines but {spec.target_path} has "
            f"{len(targets)}, expected one target line per source line"
        )
    return list(zip(sources, targets, strict=True))


def _target(sent: M2Sentence, annotator: int) -> str:
    present = sent.annotators()
    return sent.target(annotator if annotator in present else present[0])


def m2_example(id_: str, sent: M2Sentence, annotator: int) -> GecExample:
    """An M2 sentence as a training pair: ``annotator``'s target, every annotator's correction as references."""
    refs = tuple(dict.fromkeys(sent.target(a) for a in sent.annotators()))
    return GecExample(id_, sent.source, _target(sent, annotator), refs)


def _examples_of(spec: Spec, *, annotator: int) -> list[GecExample]:
    name = spec.path.name
    if spec.format == "m2":
        return [m2_example(f"{name}:{i}", s, annotator) for i, s in spec.select(iter_m2(spec.path))]
    return [GecExample(f"{name}:{i}", src, tgt, (tgt,)) for i, (src, tgt) in spec.select(read_parallel(spec))]


def load_examples(specs: Iterable[str], *, annotator: int = 0) -> list[GecExample]:
    """The examples of all ``specs``, in order.

    For M2 the target is ``annotator``'s correction; a sentence without that annotator uses the lowest
    annotator id it has (so a 2-annotator set read with ``annotator=1`` never silently yields source = target
    for sentences only annotator 0 saw). Ids must be unique across specs: the same file name twice (or
    overlapping slices of one file) is a UserError.
    """
    examples: list[GecExample] = []
    origin: dict[str, str] = {}
    for text in specs:
        spec = parse_spec(text)
        for ex in _examples_of(spec, annotator=annotator):
            if ex.id in origin:
                raise UserError(
                    f"data spec {text!r}: example id {ex.id!r} also comes from {origin[ex.id]!r}, "
                    "expected distinct file names and non-overlapping slices"
                )
            origin[ex.id] = text
            examples.append(ex)
    return examples


def load_references(specs: Iterable[str]) -> list[M2Sentence]:
    """The M2 sentences of a dev/test set (slices applied).

    Several specs are concatenated (CWEB dev = ``CWEB-S.dev.m2[:1000]`` + ``CWEB-G.dev.m2[:1000]``) — unless
    they hold the same source sentences in the same order, as CWEB's per-annotator test files do
    (``CWEB-S.test.ann0.m2``, ``…ann1.m2``): then they are one set with one annotator per file, so the set is
    scored per annotator and averaged, as the paper does.
    """
    parts: list[list[M2Sentence]] = []
    for text in specs:
        spec = parse_spec(text)
        if spec.format != "m2":
            raise UserError(f"data spec {text!r}: references must be M2 (.m2) files, expected PATH.m2[START:STOP]")
        parts.append([s for _, s in spec.select(iter_m2(spec.path))])
    if len(parts) > 1 and all([s.source for s in p] == [s.source for s in parts[0]] for p in parts[1:]):
        return merge_annotators(parts)
    return [s for part in parts for s in part]


def merge_annotators(parts: list[list[M2Sentence]]) -> list[M2Sentence]:
    """Files of the same sentences → one set; file j's annotators are renumbered after those of files < j."""
    merged = [M2Sentence(s.source, ()) for s in parts[0]]
    offset = 0
    for part in parts:
        ids = sorted({a for s in part for a in s.annotators()})
        renumber = {a: offset + i for i, a in enumerate(ids)}
        merged = [
            M2Sentence(m.source, m.edits + _renumbered(s, renumber)) for m, s in zip(merged, part, strict=True)
        ]
        offset += len(ids)
    return merged


def _renumbered(sent: M2Sentence, renumber: dict[int, int]) -> tuple[Edit, ...]:
    if not sent.edits:  # no A line at all: this annotator saw nothing to correct
        return (Edit(-1, -1, NOOP, "-NONE-", min(renumber.values())),)
    return tuple(dataclasses.replace(e, annotator=renumber[e.annotator]) for e in sent.edits)


def write_parallel(path: str | Path, lines: Iterable[str]) -> None:
    """Write one sentence per line (hypotheses, sources), atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "w", encoding="utf-8") as f:
        for line in lines:
            if "\n" in line:
                raise ValueError(f"line {line!r} contains a newline; one sentence per line expected")
            f.write(line + "\n")
