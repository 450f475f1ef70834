"""Mined negatives as a directory of Parquet shards, written as mining goes, resumable (issue 3 item 5).

A shard directory holds ``part-00000.parquet``, ``part-00001.parquet``, … with the columns of
:func:`raycl.miners.beam_search.write_negatives_parquet` (``id, source, target, negatives, scores,
model_version``; here ``model_version`` is per row, since pooled miners may hold different versions). Each
shard is written to a hidden temp name and renamed, so a shard file is either complete or absent: a re-run
reads the ``id`` column of the shards present and mines only the rest. The directory loads with
``pyarrow.parquet.read_table(dir)`` (hidden temp files are skipped), ``datasets.load_dataset("parquet",
data_files=f"{dir}/part-*.parquet")`` and :func:`read_negatives` (what ``mining.negatives=PATH`` should use).

The input side streams too: :func:`stream_examples` yields a data spec's examples without holding the corpus.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raycl.data.gec import GecExample, _target
from raycl.data.m2 import iter_lines, iter_m2
from raycl.data.specs import Spec, parse_spec
from raycl.errors import UserError, at
from raycl.miners.beam_search import MinedNegatives, read_negatives_parquet

if TYPE_CHECKING:
    import pyarrow as pa

SHARD_GLOB = "part-*.parquet"
_SHARD = re.compile(r"^part-(\d{5,})\.parquet$")


def shard_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def shard_files(out_dir: str | Path) -> list[Path]:
    """The complete shards of ``out_dir``, in index order (temp files of an interrupted write are not shards)."""
    out = Path(out_dir)
    if not out.is_dir():
        return []
    found = [(int(m[1]), p) for p in out.iterdir() if (m := _SHARD.match(p.name)) and p.is_file()]
    return [p for _, p in sorted(found)]


def schema() -> pa.Schema:
    """The negatives schema, shared with the single-file output."""
    import pyarrow as pa

    return pa.schema([("id", pa.string()), ("source", pa.string()), ("target", pa.string()),
                      ("negatives", pa.list_(pa.string())), ("scores", pa.list_(pa.float64())),
                      ("model_version", pa.int64())])  # fmt: skip


def done_ids(out_dir: str | Path) -> set[str]:
    """Ids already written to ``out_dir``'s shards; only the ``id`` column is read."""
    import pyarrow.parquet as pq

    ids: set[str] = set()
    for path in shard_files(out_dir):
        try:
            ids.update(pq.read_table(path, columns=["id"]).column("id").to_pylist())
        except (OSError, ValueError, KeyError) as err:
            why = f"not a negatives shard ({err}); delete it to re-mine its examples"
            raise UserError(f"{at(path)}: {why}") from None
    return ids


class ShardWriter:
    """Buffers mined rows and writes every ``shard_size`` of them as the next shard, atomically.

    Resumes: the ids of the shards already in ``out_dir`` are ``done``; adding one of them (or an id added
    before, e.g. from a retried task) is refused and counted in ``duplicates``. Memory: one shard of rows plus
    the set of done ids. One writer per directory at a time.
    """

    def __init__(self, out_dir: str | Path, *, shard_size: int) -> None:
        if shard_size < 1:
            raise ValueError(f"shard_size must be ≥ 1, got {shard_size}")
        self.out_dir, self.shard_size = Path(out_dir), shard_size
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise UserError(f"{at(self.out_dir)}: exists and is not a directory, expected a shard directory")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.out_dir.glob(".part-*.tmp"):  # an interrupted write of ours: never a shard
            stale.unlink()
        existing = shard_files(self.out_dir)
        self.done = done_ids(self.out_dir)
        self.resumed = len(self.done)
        self.next_index = int(_SHARD.match(existing[-1].name)[1]) + 1 if existing else 0  # type: ignore[index]
        self.written: list[Path] = []
        self.duplicates = 0
        self._rows: list[tuple[GecExample, MinedNegatives, int]] = []

    def add(self, example: GecExample, mined: MinedNegatives, *, model_version: int) -> bool:
        """Queue one row; False (and nothing queued) when its id is already done."""
        if mined.id != example.id:
            raise ValueError(f"mined record {mined.id!r} is not for example {example.id!r}")
        if example.id in self.done:
            self.duplicates += 1
            return False
        self.done.add(example.id)
        self._rows.append((example, mined, model_version))
        if len(self._rows) >= self.shard_size:
            self.flush()
        return True

    def flush(self) -> Path | None:
        """Write the queued rows (if any) as the next shard."""
        if not self._rows:
            return None
        import pyarrow as pa
        import pyarrow.parquet as pq

        exs, mined, versions = zip(*self._rows, strict=True)
        table = pa.table({
            "id": [e.id for e in exs], "source": [e.source for e in exs], "target": [e.target for e in exs],
            "negatives": [list(m.negatives) for m in mined], "scores": [list(m.scores) for m in mined],
            "model_version": list(versions),
        }, schema=schema())  # fmt: skip
        path = self.out_dir / shard_name(self.next_index)
        tmp = self.out_dir / f".{path.name}.tmp"
        pq.write_table(table, tmp)
        tmp.replace(path)  # a shard appears complete or not at all: resume trusts every part-*.parquet
        self.next_index += 1
        self.written.append(path)
        self._rows = []
        return path

    def close(self) -> None:
        self.flush()


def read_negatives(path: str | Path, ids: Iterable[str] | None = None) -> dict[str, MinedNegatives]:
    """The records of a negatives Parquet file or shard directory by example id (``mining.negatives=PATH``).

    ``ids``: only those rows are read (a pushed-down filter on the id column, shard by shard), so a training
    rank holds its own examples' negatives, not the whole set."""
    path = Path(path)
    wanted = None if ids is None else list(ids)
    if not path.is_dir():
        return read_negatives_parquet(path) if wanted is None else _read_ids(path, wanted)
    shards = shard_files(path)
    if not shards:
        raise UserError(f"{at(path)}: no {SHARD_GLOB} files, expected a negatives file or shard directory")
    out: dict[str, MinedNegatives] = {}
    for shard in shards:
        part = read_negatives_parquet(shard) if wanted is None else _read_ids(shard, wanted)
        again = next((i for i in part if i in out), None)
        if again is not None:
            raise UserError(f"{at(shard)}: id {again!r} is also in an earlier shard, expected each id once")
        out.update(part)
    return out


def _read_ids(path: Path, ids: list[str]) -> dict[str, MinedNegatives]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=["id", "negatives", "scores"],
                              filters=pc.field("id").isin(pa.array(ids, pa.string())))  # fmt: skip
    except (OSError, ValueError, pa.ArrowInvalid) as err:
        raise UserError(f"{at(path)}: cannot read a negatives Parquet file ({err})") from None
    cols = (table.column(c).to_pylist() for c in ("id", "negatives", "scores"))
    return {i: MinedNegatives(i, tuple(n), tuple(math.nan if x is None else x for x in sc))
            for i, n, sc in zip(*cols, strict=True)}


def stream_examples(specs: Sequence[str], *, annotator: int = 0) -> Iterator[GecExample]:
    """The examples of ``specs`` in order, like :func:`raycl.data.gec.load_examples`, read lazily.

    Non-negative slices (and none) stream; a negative bound needs the file's length, so that spec is read
    whole. Two specs of one file name must not overlap (ids are ``name:index``), checked from the slices.
    """
    parsed = [parse_spec(text) for text in specs]
    _check_disjoint(parsed, specs)
    for spec in parsed:
        yield from _stream_spec(spec, annotator=annotator)


def _stream_spec(spec: Spec, *, annotator: int) -> Iterator[GecExample]:
    name = spec.path.name
    if spec.format == "m2":
        for i, sent in _select(spec, iter_m2(spec.path)):
            yield GecExample(f"{name}:{i}", sent.source, _target(sent, annotator))
        return
    for i, (src, tgt) in _select(spec, _stream_parallel(spec)):
        yield GecExample(f"{name}:{i}", src, tgt)


def _select(spec: Spec, items: Iterable[Any]) -> Iterable[tuple[int, Any]]:
    if (spec.start or 0) >= 0 and (spec.stop is None or spec.stop >= 0):
        return islice(enumerate(items), spec.start, spec.stop)
    return spec.select(items)


def _stream_parallel(spec: Spec) -> Iterator[tuple[str, str]]:
    if spec.target_path is None:
        for lineno, line in iter_lines(spec.path):
            fields = line.split("\t")
            if len(fields) != 2:
                raise UserError(f"{at(spec.path, lineno)}: {len(fields)} tab-separated fields, "
                                "expected 'source<TAB>target'")  # fmt: skip
            yield fields[0], fields[1]
        return
    try:
        for (_, src), (_, tgt) in zip(iter_lines(spec.path), iter_lines(spec.target_path), strict=True):
            yield src, tgt
    except ValueError:  # zip(strict=True): one file ended first
        raise UserError(f"data spec '{spec}': {spec.path} and {spec.target_path} differ in line count, "
                        "expected one target line per source line") from None


def _check_disjoint(parsed: Sequence[Spec], texts: Sequence[str]) -> None:
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
