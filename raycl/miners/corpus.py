"""A corpus in ranges, read from byte offsets, mined into one Parquet shard per range (Ray-free).

The parts of corpus mining that need no Ray (:mod:`raycl.distributed.corpus` runs them on a Ray Data actor
pool, or in one process):

    scan_specs             one pass over the files, keeping a byte offset per range of ``shard_size`` records
                           (both files of a ``SRC|TGT`` pair): O(#ranges) memory, never the sentences. The scan
                           checks every record as the readers do (UTF-8, the M2 structure, the ``A`` lines' fields
                           and spans), so a malformed file fails at once, before Ray starts, and digests the bytes
                           it reads (blake2b), which identify the data
    read_range             one range's examples: seek to the offset, then ``iter_m2`` / the TSV reader decode
                           as the whole-file readers do
    write_shard            ``part-<range>.parquet``, written to a temp name, synced and renamed

Resume: the shard of range i is ``part-{i:05d}.parquet``, written atomically by whoever mined it (a crash
mid-write leaves a hidden temp file, never a shard), so a re-run skips every range whose shard exists: O(#shards)
memory, no id is read back. ``_mining.json`` next to the shards records everything that makes the shards what
they are — the data (file names, slices, content digests), ``shard_size``, the annotator and the mining settings
(model digest, resolved engine and library versions, k, beam, precision, decoding bounds, ...) — and the scan's
offsets: a re-run with any of them changed is a one-line error naming what differs (never a silently mixed
directory), and a re-run over unchanged files (same sizes and modification times) does not read the corpus
again. ``_failures.json`` lists the ranges a run could not mine (:func:`record_failures`).

Ids are ``<file name>:<index in the file>``, as :func:`raycl.data.gec.load_examples` makes them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice, zip_longest
from pathlib import Path
from typing import Any

from raycl import storage
from raycl.data.gec import GecExample, m2_example
from raycl.data.m2 import _decode, _parse_edit, iter_lines, iter_m2
from raycl.data.specs import Spec, parse_spec
from raycl.errors import UserError, at
from raycl.miners.shards import SHARD_GLOB, SHARD_NAME, schema, shard_files
from raycl.records import atomic_write

DEFAULT_SHARD_SIZE = 10_000
MANIFEST = "_mining.json"  # pyarrow and datasets skip ``_``-prefixed files when they read the directory
FAILURES = "_failures.json"


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
@dataclass(frozen=True)
class SpecScan:
    """One data spec as the scan found it: what identifies its content (compared when a directory is resumed), the
    files' sizes and modification times (while they hold, a resume trusts this scan instead of reading the files
    again) and its ranges (numbered from ``ranges[0].index``)."""

    text: str
    key: dict[str, Any]  # files (names: ids are name:index), slice, blake2b of the bytes the scan read
    stat: list[list[int]]  # [size, mtime_ns] per file
    ranges: list[Range]


def scan_ranges(specs: Sequence[str], *, range_size: int) -> Iterator[Range]:
    """The ranges of ``specs`` in order, ``range_size`` records each (the last of a spec may be shorter)."""
    for scan in scan_specs(specs, range_size=range_size):
        yield from scan.ranges


def scan_specs(specs: Sequence[str], *, range_size: int, cached: Sequence[dict[str, Any]] = ()) -> list[SpecScan]:
    """Each spec scanned (records checked, content digested, offsets kept), or taken from ``cached`` (a manifest's
    ``scan``) when that holds the same spec with the same file sizes and modification times."""
    parsed = [parse_spec(text) for text in specs]
    check_disjoint(parsed, specs)
    out: list[SpecScan] = []
    for spec, text in zip(parsed, specs, strict=True):
        first = out[-1].ranges[-1].index + 1 if out and out[-1].ranges else 0
        stat = _stat(spec)
        hit = next((c for c in cached if c.get("spec") == text and c.get("stat") == stat), None)
        out.append(_from_cache(spec, text, hit, first) if hit else _scan(spec, text, stat, range_size, first))
    return out


def scan_cache(scans: Sequence[SpecScan]) -> list[dict[str, Any]]:
    """The scans as the manifest keeps them: O(#ranges) numbers, so a resume never reads the corpus again."""
    return [
        {
            "spec": s.text,
            "stat": s.stat,
            "key": s.key,
            "ranges": [
                [r.start, r.first_line, r.target_start, r.target_first_line, r.first_index, r.count]
                for r in s.ranges
            ],
        }
        for s in scans
    ]


def _from_cache(spec: Spec, text: str, hit: dict[str, Any], first: int) -> SpecScan:
    ranges = [
        Range(first + j, str(spec.path), str(spec.target_path or ""), spec.format, *map(int, row))
        for j, row in enumerate(hit["ranges"])
    ]
    return SpecScan(text, hit["key"], hit["stat"], ranges)


def _scan(spec: Spec, text: str, stat: list[list[int]], range_size: int, first: int) -> SpecScan:
    hashes = [hashlib.blake2b(digest_size=16) for _ in _files(spec)]
    lo, hi = _bounds(spec)
    ranges: list[Range] = []
    run: tuple[int, int, int, int, int] | None = None  # (index, offset, line, target offset, target line)
    last = -1
    for i, start in enumerate(_record_starts(spec, hashes)):
        if hi is not None and i >= hi:
            break
        if i < lo:
            continue
        if (i - lo) % range_size == 0:
            if run is not None:
                ranges.append(_range(first + len(ranges), spec, run, i - run[0]))
            run = (i, *start)
        last = i
    if run is not None:
        ranges.append(_range(first + len(ranges), spec, run, last + 1 - run[0]))
    key = {
        "files": [p.name for p in _files(spec)],
        "slice": [spec.start, spec.stop],
        "blake2b": [h.hexdigest() for h in hashes],
    }
    return SpecScan(text, key, stat, ranges)


def _files(spec: Spec) -> list[Path]:
    return [spec.path] if spec.target_path is None else [spec.path, spec.target_path]


def _stat(spec: Spec) -> list[list[int]]:
    try:
        return [[st.st_size, st.st_mtime_ns] for st in (p.stat() for p in _files(spec))]
    except OSError as err:
        raise UserError(f"{at(err.filename)}: cannot read ({err.strerror or err})") from None


def check_disjoint(parsed: Sequence[Spec], texts: Sequence[str]) -> None:
    """Ids are ``<file name>:<index>``: two specs of one file name must not share an index."""
    seen: dict[str, list[tuple[Spec, str]]] = {}
    for spec, text in zip(parsed, texts, strict=True):
        for other, other_text in seen.get(spec.path.name, []):
            if not _disjoint(spec, other):
                raise UserError(
                    f"data spec {text!r}: its example ids overlap those of {other_text!r} (same file "
                    "name), expected distinct file names and non-overlapping slices"
                )
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
    return Range(
        index, str(spec.path), str(spec.target_path or ""), spec.format, offset, line, t_offset, t_line, i, count
    )


def _bounds(spec: Spec) -> tuple[int, int | None]:
    lo, hi = spec.start, spec.stop
    if (lo is not None and lo < 0) or (hi is not None and hi < 0):  # needs the file's length: one more pass
        n = sum(1 for _ in _record_starts(spec, [None, None]))
        lo, hi = slice(lo, hi).indices(n)[:2]
    return max(lo or 0, 0), hi


def _record_starts(spec: Spec, hashes: Sequence[Any]) -> Iterator[tuple[int, int, int, int]]:
    """(byte offset, line number) of each record's first line, and of its target line for a pair; every line is
    checked as the readers check it and fed to its file's hash."""
    if spec.format == "pair":
        assert spec.target_path is not None
        pairs = zip_longest(_text_lines(spec.path, hashes[0]), _text_lines(spec.target_path, hashes[1]))
        for src, tgt in pairs:
            if src is None or tgt is None:
                raise UserError(
                    f"data spec '{spec}': {spec.path} and {spec.target_path} differ in line count, "
                    "expected one target line per source line"
                )
            yield src[0], src[1], tgt[0], tgt[1]
        return
    if spec.format == "tsv":
        for offset, lineno, text in _text_lines(spec.path, hashes[0]):
            tsv_fields(spec.path, lineno, text)
            yield offset, lineno, 0, 0
        return
    yield from _m2_starts(spec.path, hashes[0])


def _m2_starts(path: Path, h: Any) -> Iterator[tuple[int, int, int, int]]:
    """The M2 blocks' ``S`` lines, checking every line as :func:`raycl.data.m2.iter_m2` does (UTF-8, the block
    structure, the ``A`` lines' six fields and spans inside their sentence): a malformed record fails here, before
    any miner starts, and a stray line cannot fall between two ranges, read by no one."""
    in_block, seen, n_tokens = False, False, 0
    for offset, lineno, line in _text_lines(path, h):
        if line.startswith("S ") or line == "S":
            if in_block:
                raise UserError(
                    f"{at(path, lineno)}: second 'S' line in a block, expected 'A ' lines or a "
                    "blank line between sentences"
                )
            in_block = seen = True
            n_tokens = len(line[2:].split())
            yield offset, lineno, 0, 0
        elif line.startswith("A "):
            if not in_block:
                raise UserError(f"{at(path, lineno)}: 'A' line outside a block, expected an 'S ' line first")
            _parse_edit(path, lineno, line, n_tokens)
        elif not line.strip():
            in_block = False
        else:
            raise UserError(
                f"{at(path, lineno)}: line starts with {line[:10]!r}, expected 'S ', 'A ' or a blank line"
            )
    if not seen:
        raise UserError(f"{at(path)}: empty M2 file, expected 'S ' lines")


def _text_lines(path: Path, h: Any) -> Iterator[tuple[int, int, str]]:
    """(byte offset, line number, text without its line end) of each line, decoded as UTF-8 as
    :func:`raycl.data.m2.iter_lines` decodes it; ``h`` (a hash, or None) is fed every byte."""
    offset = 0
    with _open(path) as f:
        for lineno, raw in enumerate(f, 1):
            if h is not None:
                h.update(raw)
            text = _decode(path, raw, first_line=lineno)
            if lineno == 1:
                text = text.removeprefix("\ufeff")
            yield offset, lineno, text.removesuffix("\n").removesuffix("\r")
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
        return [m2_example(f"{name}:{r.first_index + j}", s, annotator) for j, s in enumerate(sents)]
    if r.fmt == "pair":
        src = islice(iter_lines(r.path, start=r.start, first_line=r.first_line), r.count)
        tgt = islice(iter_lines(r.target_path, start=r.target_start, first_line=r.target_first_line), r.count)
        pairs = enumerate(zip(src, tgt, strict=True))
        return [GecExample(f"{name}:{r.first_index + j}", s, t, (t,)) for j, ((_, s), (_, t)) in pairs]
    lines = islice(iter_lines(r.path, start=r.start, first_line=r.first_line), r.count)
    return [
        GecExample(f"{name}:{r.first_index + j}", src, tgt, (tgt,))
        for j, (lineno, line) in enumerate(lines)
        for src, tgt in [tsv_fields(r.path, lineno, line)]
    ]


def tsv_fields(path: str | Path, lineno: int, line: str) -> tuple[str, str]:
    fields = line.split("\t")
    if len(fields) != 2:
        raise UserError(f"{at(path, lineno)}: {len(fields)} tab-separated fields, expected 'source<TAB>target'")
    return fields[0], fields[1]


# ---------------------------------------------------------------------------------------------- resuming
def load_manifest(out_dir: Path) -> dict[str, Any] | None:
    """``out_dir``'s manifest, or None without one. Shards depend on it: with shards it must be there and parse;
    without, an unreadable one is only a stale scan cache, dropped."""
    path, has_shards = out_dir / MANIFEST, bool(shard_files(out_dir))
    if not path.is_file():
        if has_shards:
            raise UserError(
                f"{at(out_dir)}: holds {SHARD_GLOB} files but no {MANIFEST}, expected an empty "
                "directory or one raycl mining wrote (--overwrite to mine afresh)"
            )
        return None
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
        str(old["mode"]), int(old["shard_size"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        if has_shards:
            raise UserError(
                f"{at(path)}: not a raycl mining manifest ({err}), expected the one raycl wrote "
                "(--overwrite to mine afresh)"
            ) from None
        return None
    return dict(old)


def resume_shard_size(out_dir: Path, old: dict[str, Any] | None, *, mode: str, shard_size: int | None) -> int:
    """The manifest's shard size when ``out_dir`` has shards to resume, else ``shard_size`` (default 10,000).
    ``mode``: ``ranges`` (data specs: the shard of range i is always the same sentences) or ``ids`` (in-memory
    examples)."""
    if shard_size is not None and shard_size < 1:
        raise UserError(f"shard_size: expected an integer ≥ 1, got {shard_size}")
    if old is None or not shard_files(out_dir):  # nothing to resume: the manifest is rewritten
        return shard_size or DEFAULT_SHARD_SIZE
    if old["mode"] != mode:
        what = {"ranges": "data files", "ids": "in-memory examples"}
        raise UserError(
            f"{at(out_dir)}: shards mined from {what.get(old['mode'], old['mode'])}, this run mines "
            f"{what[mode]}; expected a new output directory"
        )
    size = int(old["shard_size"])
    if shard_size is not None and shard_size != size and mode == "ranges":
        raise UserError(
            f"{at(out_dir)}: shards of {size} sentences each, this run asks for shard size "
            f"{shard_size}; leave it out to resume, or use a new output directory"
        )
    return size


def check_resume(out_dir: Path, old: dict[str, Any] | None, new: dict[str, Any]) -> None:
    """A directory holds one mining: with shards to resume, every setting of ``new`` must be the manifest's, else
    one line naming each that differs."""
    if old is None or not shard_files(out_dir):
        return
    diffs = []
    for key, now in new.items():
        was = old.get(key)
        if key == "scan" or was == now:
            continue
        if key == "data":
            diffs.append(f"data {', '.join(map(_describe, was or []))} → {', '.join(map(_describe, now))}")
        elif isinstance(now, dict) and isinstance(was, dict):
            diffs += [
                f"{key}.{k} {_short(was.get(k))} → {_short(now.get(k))}"
                for k in sorted(set(was) | set(now))
                if was.get(k) != now.get(k)
            ]
        else:
            diffs.append(f"{key} {_short(was)} → {_short(now)}")
    if diffs:
        raise UserError(
            f"{at(out_dir)}: its shards were mined with other settings ({'; '.join(diffs)}), "
            "expected the same to resume (--overwrite mines it afresh, or use a new output directory)"
        )


def _describe(key: dict[str, Any]) -> str:
    lo, hi = key["slice"]
    cut = "" if lo is None and hi is None else f"[{'' if lo is None else lo}:{'' if hi is None else hi}]"
    return "|".join(key["files"]) + cut + f" (blake2b {'+'.join(d[:12] for d in key.get('blake2b', []))})"


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 40 else text[:37] + "..."


def save_manifest(out_dir: Path, manifest: dict[str, Any]) -> None:
    atomic_write(out_dir / MANIFEST, json.dumps(manifest, indent=1))


def resume_settings(out_dir: Path, *, mode: str, shard_size: int | None, **fixed: Any) -> int:
    """The shard size for ``out_dir`` (:func:`resume_shard_size`); ``fixed`` checked against the manifest
    (:func:`check_resume`), then recorded."""
    old = load_manifest(out_dir)
    size = resume_shard_size(out_dir, old, mode=mode, shard_size=shard_size)
    new = {"mode": mode, "shard_size": size, **fixed}
    check_resume(out_dir, old, new)
    save_manifest(out_dir, new)
    return size


def clear_mining(out_dir: Path) -> None:
    """``--overwrite``: what a mining wrote into ``out_dir`` removed (shards, manifest, failures, attempts), and
    nothing else."""
    for path in [*shard_files(out_dir), out_dir / MANIFEST, out_dir / FAILURES, *out_dir.glob(".part-*.attempts")]:
        path.unlink(missing_ok=True)
    # on a store, the objects too (a resume reads what the store holds: shards of the old mining would stay)
    ours = (MANIFEST, FAILURES, storage.MANIFEST)
    storage.remove(out_dir, only=lambda rel: bool(SHARD_NAME.match(rel)) or rel in ours or rel.startswith(".part"))


# ---------------------------------------------------------------------------------------------- failed ranges
def next_attempt(out_dir: Path, index: int) -> int:
    """Count one more attempt at range ``index`` (1 for the first), kept in ``out_dir`` so that it survives the
    miner: an actor that dies on a range (out of memory, a segfault) is restarted by Ray and given it again."""
    path = out_dir / f".part-{index:05d}.attempts"
    try:
        done = int(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        done = 0
    atomic_write(path, str(done + 1))
    return done + 1


def reset_attempts(out_dir: Path) -> None:
    for path in out_dir.glob(".part-*.attempts"):
        path.unlink(missing_ok=True)


def record_failures(out_dir: Path, failures: Sequence[dict[str, Any]]) -> None:
    """``_failures.json``: the ranges this run could not mine (range, file, first line, error), or none."""
    if failures:
        atomic_write(out_dir / FAILURES, json.dumps(sorted(failures, key=lambda f: f["range"]), indent=1))
    else:
        (out_dir / FAILURES).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------- mining
def negatives_table(examples: Sequence[GecExample], mined: Sequence[Any], version: int = 0) -> Any:
    import pyarrow as pa

    return pa.table(
        {
            "id": [e.id for e in examples],
            "source": [e.source for e in examples],
            "target": [e.target for e in examples],
            "negatives": [list(m.negatives) for m in mined],
            "scores": [list(m.scores) for m in mined],
            "model_version": [version] * len(examples),
            "references": [list(e.references or (e.target,)) for e in examples],
        },
        schema=schema(),
    )
