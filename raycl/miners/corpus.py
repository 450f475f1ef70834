"""A corpus in ranges, read from byte offsets, mined into one Parquet shard per range (Ray-free).

The parts of corpus mining that need no Ray (:mod:`raycl.distributed.corpus_mining` runs them on a Ray Data actor
pool, or in one process):

    scan_ranges            one pass over the files, keeping a byte offset per range of ``shard_size`` records
                           (both files of a ``SRC|TGT`` pair): O(#ranges) memory, never the sentences. The scan
                           also checks the M2 structure (S/A/blank lines), so a malformed line fails at once,
                           before Ray starts, and no block can hide between two ranges
    read_range             one range's examples: seek to the offset, then ``iter_m2`` / the TSV reader check every
                           line and decode as the whole-file readers do
    write_shard            ``part-<range>.parquet``, written to a temp name and renamed

Resume: the shard of range i is ``part-{i:05d}.parquet``, written atomically by whoever mined it (a crash
mid-write leaves a hidden temp file, never a shard), so a re-run skips every range whose shard exists: O(#shards)
memory, no id is read back. What makes range i the same sentences in every run — the data specs (file names,
slices, byte sizes), ``shard_size`` and the annotator — is kept in ``_mining.json`` next to the shards
(:func:`resume_settings`); a re-run with other data or another shard size is a one-line error instead of a
silently mixed directory (a resumed run without a shard size takes the stored one).

Ids are ``<file name>:<index in the file>``, as :func:`raycl.data.gec.load_examples` makes them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice, zip_longest
from pathlib import Path
from typing import Any

from raycl.data.gec import GecExample, _target
from raycl.data.m2 import iter_lines, iter_m2
from raycl.data.specs import Spec, parse_spec
from raycl.errors import UserError, at
from raycl.miners.shards import SHARD_GLOB, schema, shard_files
from raycl.records import atomic_write

DEFAULT_SHARD_SIZE = 10_000
MANIFEST = "_mining.json"  # pyarrow and datasets skip ``_``-prefixed files when they read the directory


@dataclass(frozen=True)
class Range:
    """``count`` consecutive records of one data spec, from byte ``start`` (line ``first_line``) of its file."""

    index: int  # the shard number: part-{index:05d}.parquet
    path: str
    target_path: str  # "" unless a SRC|TGT pair
    fmt: str  # m2 | tsv | pair
    start: int
    first_line: int
    target_start: int
    target_first_line: int
    first_index: int  # the index in the file of the first record (ids are name:index)
    count: int


# ---------------------------------------------------------------------------------------------- the scan
def scan_ranges(specs: Sequence[str], *, range_size: int) -> Iterator[Range]:
    """The ranges of ``specs`` in order, ``range_size`` records each (the last of a spec may be shorter)."""
    parsed = [parse_spec(text) for text in specs]
    check_disjoint(parsed, specs)
    index = 0
    for spec in parsed:
        lo, hi = _bounds(spec)
        run: tuple[int, int, int, int, int] | None = None  # (index, offset, line, target offset, target line)
        last = -1
        for i, start in enumerate(_record_starts(spec)):
            if hi is not None and i >= hi:
                break
            if i < lo:
                continue
            if (i - lo) % range_size == 0:
                if run is not None:
                    yield _range(index, spec, run, i - run[0])
                    index += 1
                run = (i, *start)
            last = i
        if run is not None:
            yield _range(index, spec, run, last + 1 - run[0])
            index += 1


def check_disjoint(parsed: Sequence[Spec], texts: Sequence[str]) -> None:
    """Ids are ``<file name>:<index>``: two specs of one file name must not share an index."""
    seen: dict[str, list[tuple[Spec, str]]] = {}
    for spec, text in zip(parsed, texts, strict=True):
        for other, other_text in seen.get(spec.path.name, []):
            if not _disjoint(spec, other):
                raise UserError(f"data spec {text!r}: its example ids overlap those of {other_text!r} (same file "
                                "name), expected distinct file names and non-overlapping slices")
        seen.setdefault(spec.path.name, []).append((spec, text))


def _disjoint(a: Spec, b: Spec) -> bool:
    bounds = (a.start, a.stop, b.start, b.stop)
    if any(x is not None and x < 0 for x in bounds):
        return False  # cannot tell without the length: refuse rather than silently merge ids
    a0, b0 = a.start or 0, b.start or 0
    a1 = a.stop if a.stop is not None else float("inf")
    b1 = b.stop if b.stop is not None else float("inf")
    return a1 <= b0 or b1 <= a0 or a0 >= a1 or b0 >= b1


def _range(index: int, spec: Spec, first: tuple[int, int, int, int, int], count: int) -> Range:
    i, offset, line, t_offset, t_line = first
    return Range(index, str(spec.path), str(spec.target_path or ""), spec.format, offset, line, t_offset, t_line,
                 i, count)  # fmt: skip


def _bounds(spec: Spec) -> tuple[int, int | None]:
    lo, hi = spec.start, spec.stop
    if (lo is not None and lo < 0) or (hi is not None and hi < 0):  # needs the file's length: one more pass
        n = sum(1 for _ in _record_starts(spec))
        lo, hi = slice(lo, hi).indices(n)[:2]
    return max(lo or 0, 0), hi


def _record_starts(spec: Spec) -> Iterator[tuple[int, int, int, int]]:
    """(byte offset, line number) of each record's first line, and of its target line for a pair."""
    if spec.format == "pair":
        assert spec.target_path is not None
        for src, tgt in zip_longest(_line_starts(spec.path), _line_starts(spec.target_path)):
            if src is None or tgt is None:
                raise UserError(f"data spec '{spec}': {spec.path} and {spec.target_path} differ in line count, "
                                "expected one target line per source line")  # fmt: skip
            yield (*src, *tgt)
        return
    if spec.format == "tsv":
        yield from ((a, la, 0, 0) for a, la in _line_starts(spec.path))
        return
    yield from _m2_starts(spec.path)


def _m2_starts(path: Path) -> Iterator[tuple[int, int, int, int]]:
    """The M2 blocks' ``S`` lines, checking the structure as :func:`raycl.data.m2.iter_m2` does (the ``A``
    lines' fields are parsed by the miners): a stray line between two blocks would otherwise fall between two
    ranges, read by no one."""
    offset, in_block, seen = 0, False, False
    with _open(path) as f:
        for lineno, raw in enumerate(f, 1):
            line = raw[3:] if lineno == 1 and raw.startswith(b"\xef\xbb\xbf") else raw  # a BOM, as iter_lines
            if line.startswith(b"S ") or line.rstrip(b"\r\n") == b"S":
                if in_block:
                    raise UserError(f"{at(path, lineno)}: second 'S' line in a block, expected 'A ' lines or a "
                                    "blank line between sentences")  # fmt: skip
                in_block = seen = True
                yield offset, lineno, 0, 0
            elif line.startswith(b"A "):
                if not in_block:
                    raise UserError(f"{at(path, lineno)}: 'A' line outside a block, expected an 'S ' line first")
            elif not line.strip() or not _text(path, lineno, line).strip():  # blank (any Unicode space)
                in_block = False
            else:
                text = _text(path, lineno, line).removesuffix("\n").removesuffix("\r")
                raise UserError(f"{at(path, lineno)}: line starts with {text[:10]!r}, expected 'S ', 'A ' or a "
                                "blank line")  # fmt: skip
            offset += len(raw)
    if not seen:
        raise UserError(f"{at(path)}: empty M2 file, expected 'S ' lines")


def _text(path: Path, lineno: int, line: bytes) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{at(path, lineno)}: not UTF-8 text ({err.reason})") from None


def _line_starts(path: Path) -> Iterator[tuple[int, int]]:
    offset = 0
    with _open(path) as f:
        for lineno, raw in enumerate(f, 1):
            yield offset, lineno
            offset += len(raw)


def _open(path: Path) -> Any:
    try:
        return open(path, "rb")
    except OSError as err:
        raise UserError(f"{at(path)}: cannot read ({err.strerror or err})") from None


# ---------------------------------------------------------------------------------------------- reading
def read_range(r: Range, *, annotator: int = 0) -> list[GecExample]:
    """The examples of one range, read from its offset; every line is checked as the whole-file readers do."""
    name = Path(r.path).name
    if r.fmt == "m2":
        lines = iter_lines(r.path, start=r.start, first_line=r.first_line)
        sents = islice(iter_m2(r.path, lines), r.count)
        return [GecExample(f"{name}:{r.first_index + j}", s.source, _target(s, annotator))
                for j, s in enumerate(sents)]  # fmt: skip
    if r.fmt == "pair":
        src = islice(iter_lines(r.path, start=r.start, first_line=r.first_line), r.count)
        tgt = islice(iter_lines(r.target_path, start=r.target_start, first_line=r.target_first_line), r.count)
        pairs = enumerate(zip(src, tgt, strict=True))
        return [GecExample(f"{name}:{r.first_index + j}", s, t) for j, ((_, s), (_, t)) in pairs]
    out = []
    lines = islice(iter_lines(r.path, start=r.start, first_line=r.first_line), r.count)
    for j, (lineno, line) in enumerate(lines):
        fields = line.split("\t")
        if len(fields) != 2:
            raise UserError(f"{at(r.path, lineno)}: {len(fields)} tab-separated fields, "
                            "expected 'source<TAB>target'")  # fmt: skip
        out.append(GecExample(f"{name}:{r.first_index + j}", fields[0], fields[1]))
    return out


# ---------------------------------------------------------------------------------------------- resuming
def spec_key(text: str) -> dict[str, Any]:
    """What fixes a spec's ids and texts: file names (ids are ``name:index``), slice and byte sizes."""
    spec = parse_spec(text)
    files = [spec.path] if spec.target_path is None else [spec.path, spec.target_path]
    try:
        sizes = [p.stat().st_size for p in files]
    except OSError as err:
        raise UserError(f"{at(err.filename)}: cannot read ({err.strerror or err})") from None
    return {"files": [p.name for p in files], "slice": [spec.start, spec.stop], "bytes": sizes}


def _describe(key: dict[str, Any]) -> str:
    lo, hi = key["slice"]
    cut = "" if lo is None and hi is None else f"[{'' if lo is None else lo}:{'' if hi is None else hi}]"
    return "|".join(key["files"]) + cut + f" ({'+'.join(map(str, key['bytes']))} bytes)"


def resume_settings(out_dir: Path, *, mode: str, shard_size: int | None, **fixed: Any) -> int:
    """The shard size for ``out_dir``: its manifest's when it has shards to resume (``fixed`` must equal what
    the manifest stored), else ``shard_size`` (default 10,000), then recorded with ``fixed``. ``mode``: ``ranges``
    (data specs: the shard of range i is always the same sentences) or ``ids`` (in-memory examples)."""
    if shard_size is not None and shard_size < 1:
        raise UserError(f"shard_size: expected an integer ≥ 1, got {shard_size}")
    path = out_dir / MANIFEST
    has_shards = bool(shard_files(out_dir))
    if has_shards and path.is_file():  # no shards: nothing to resume, the manifest is rewritten
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
            old_mode, old_size = old["mode"], int(old["shard_size"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise UserError(f"{at(path)}: not a raycl mining manifest ({err}); delete {out_dir} to mine again"
                            ) from None  # fmt: skip
        if old_mode != mode:
            what = {"ranges": "data files", "ids": "in-memory examples"}
            raise UserError(f"{at(out_dir)}: shards mined from {what.get(old_mode, old_mode)}, this run mines "
                            f"{what[mode]}; expected a new output directory")  # fmt: skip
        if shard_size is not None and shard_size != old_size and mode == "ranges":
            raise UserError(f"{at(out_dir)}: shards of {old_size} sentences each, this run asks for shard size "
                            f"{shard_size}; leave it out to resume, or use a new output directory")  # fmt: skip
        for key, value in fixed.items():
            if old.get(key) != value:
                was, now = old.get(key), value
                if key == "data":
                    was, now = ", ".join(map(_describe, was or [])), ", ".join(map(_describe, now))
                raise UserError(f"{at(out_dir)}: its shards were mined with {key} {was}, this run has {now}; "
                                "expected the same to resume, or a new output directory")  # fmt: skip
        return old_size
    if has_shards:
        raise UserError(f"{at(out_dir)}: holds {SHARD_GLOB} files but no {MANIFEST}, expected an empty directory "
                        "or one raycl mining wrote (delete the shards to mine again)")  # fmt: skip
    size = shard_size or DEFAULT_SHARD_SIZE
    atomic_write(path, json.dumps({"mode": mode, "shard_size": size, **fixed}, indent=1))
    return size


# ---------------------------------------------------------------------------------------------- mining
def negatives_table(examples: Sequence[GecExample], mined: Sequence[Any], version: int = 0) -> Any:
    import pyarrow as pa

    return pa.table({
        "id": [e.id for e in examples], "source": [e.source for e in examples],
        "target": [e.target for e in examples],
        "negatives": [list(m.negatives) for m in mined], "scores": [list(m.scores) for m in mined],
        "model_version": [version] * len(examples),
    }, schema=schema())  # fmt: skip
