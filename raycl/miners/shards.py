"""Mined negatives as a directory of Parquet shards (``raycl.mine``, ``raycl.mine_negatives``).

A shard directory holds ``part-00000.parquet``, ``part-00001.parquet``, … with the columns of
:func:`raycl.miners.beam_search.write_negatives_parquet` (``id, source, target, negatives, scores,
model_version, references``; here ``model_version`` is per row, since pooled miners may hold different versions;
each file's footer keeps its false-negative counts, :func:`shard_counts`). Each
shard is written to a hidden temp name, synced and renamed, so a shard file is either complete or absent; shard i
holds range i of the corpus (:mod:`raycl.miners.corpus`), so a re-run skips the shards present. The directory loads
with ``pyarrow.parquet.read_table(dir)`` (hidden temp files are skipped), ``datasets.load_dataset("parquet",
data_files=f"{dir}/part-*.parquet")`` and :func:`read_negatives` (what ``mining.negatives=PATH`` reads, all of
it or only the ids a training rank needs).
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from raycl.errors import UserError, at
from raycl.files import atomic_file
from raycl.miners.false_negatives import FalseNegativeCounts, normalize, refuted_set
from raycl.miners.parquet_input import batches, column_names, footer_metadata
from raycl.miners.records import MinedNegatives
from raycl.storage import LOCK, mirror

if TYPE_CHECKING:
    import pyarrow as pa

SHARD_GLOB = "part-*.parquet"
FN_KEY = b"raycl.false_negatives"
SHARD_NAME = _SHARD = re.compile(r"^part-(\d{5,})\.parquet$")


def shard_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def shard_files(out_dir: str | Path) -> list[Path]:
    """The complete shards of ``out_dir``, in index order (temp files of an interrupted write are not shards)."""
    out = Path(out_dir)
    if not out.is_dir():
        return []
    found = [(int(m[1]), p) for p in out.iterdir() if (m := _SHARD.match(p.name)) and p.is_file()]
    return [p for _, p in sorted(found)]


def next_shard_index(out_dir: str | Path) -> int:
    """The index after the highest shard in ``out_dir`` (never over a kept shard, whichever one was lost)."""
    existing = shard_files(out_dir)
    last = _SHARD.match(existing[-1].name) if existing else None  # shard_files keeps only names that match
    return int(last[1]) + 1 if last else 0


def prepare_out_dir(out_dir: Path) -> None:
    """``out_dir`` as a shard directory: created, and an interrupted write's temp files (never shards) removed."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{at(out_dir)}: exists and is not a directory, expected a shard directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob(".part-*.tmp"):
        stale.unlink(missing_ok=True)


@contextmanager
def locked_out_dir(out_dir: Path) -> Iterator[None]:
    """``out_dir`` prepared (:func:`prepare_out_dir`) and held by this run alone: an exclusive ``flock`` on
    ``out_dir/_mining.lock`` while the run lasts, so a second run on the same directory is refused instead of
    deleting the first's temp files or writing its shards twice. The kernel drops the lock when the process dies
    (a killed run never leaves the directory locked); the file stays, holding the last holder's pid and host."""
    import fcntl

    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{at(out_dir)}: exists and is not a directory, expected a shard directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / LOCK, "a+", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise UserError(
                f"{at(out_dir)}: another raycl run is mining into it ({holder}), expected one run per "
                "output directory (wait for it, or use another --out)"
            ) from None
        f.truncate(0)
        f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        f.flush()
        prepare_out_dir(out_dir)  # its temp files are stale only now that no other run can be writing them
        yield


def write_shard(out_dir: Path, index: int, table: pa.Table, *, row_group_size: int | None = None) -> Path:
    """``table`` as shard ``index`` of ``out_dir``, written to a temp name and renamed: complete or absent."""
    import pyarrow.parquet as pq

    path = out_dir / shard_name(index)
    with atomic_file(path, "wb") as f:
        pq.write_table(table, f, row_group_size=row_group_size)
    mirror(path)
    return path


def with_counts(table: pa.Table, counts: FalseNegativeCounts) -> pa.Table:
    """``table`` with its selection's false-negative counts in the Parquet metadata (``raycl.false_negatives``):
    a resumed directory's counts are its shards' sum, those of earlier runs included."""
    return table.replace_schema_metadata({**(table.schema.metadata or {}), FN_KEY: json.dumps(counts.as_dict())})


def shard_counts(out_dir: str | Path) -> FalseNegativeCounts:
    """The false-negative counts of every shard of ``out_dir`` (from each file's checked footer; none: zero)."""
    total = FalseNegativeCounts()
    for path in shard_files(out_dir):
        got = footer_metadata(path).get(FN_KEY)
        if got is not None:
            try:
                total.merge(json.loads(got))
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
                raise UserError(
                    f"{at(path)}: its footer's {FN_KEY.decode()} is not the counts raycl writes, "
                    "expected a shard written by raycl"
                ) from None
    return total


def schema() -> pa.Schema:
    """The negatives schema, shared with the single-file output."""
    # imported here, not above: a shard writer (the run's n-best stream, an actor) does without the miners' torch
    from raycl.miners.beam_search import negatives_schema

    return negatives_schema()


def done_ids(out_dir: str | Path) -> set[str]:
    """Ids already written to ``out_dir``'s shards (a resumed run's, perhaps pulled from a store); only the ``id``
    column is read, in batches, each shard's footer checked first (:mod:`raycl.miners.parquet_input`)."""
    ids: set[str] = set()
    for path in shard_files(out_dir):
        try:
            if "id" not in column_names(path):
                raise UserError(f"{at(path)}: not a negatives shard (no 'id' column)")
            for batch in batches(path, ["id"]):
                ids.update(batch.column("id").to_pylist())
        except UserError as err:
            raise UserError(f"{err}; delete it to re-mine its examples") from None
    return ids


def read_negatives(path: str | Path, ids: Iterable[str] | None = None) -> dict[str, MinedNegatives]:
    """The records of a negatives Parquet file or shard directory by example id (``mining.negatives=PATH``).

    ``ids``: only those rows are read (a pushed-down filter on the id column, shard by shard), so a training
    rank holds its own examples' negatives, not the whole set."""
    from raycl.miners.beam_search import read_negatives_parquet  # here: a shard writer needs no torch

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


def check_negatives(path: str | Path) -> None:
    """``mining.negatives=PATH`` read once through the bounded reader on the driver, nothing kept: a file that is
    not a negatives file, or that decodes past the limits (:mod:`raycl.miners.parquet_input`), ends the run in
    one line before Ray starts, not in a training worker."""
    path = Path(path)
    files = _files_of(path)
    if path.is_dir() and not files:
        raise UserError(f"{at(path)}: no {SHARD_GLOB} files, expected a negatives file or shard directory")
    for file in files:
        names = column_names(file)
        lacking = [c for c in ("id", "negatives", "scores") if c not in names]
        if lacking:
            raise UserError(f"{at(file)}: cannot read a negatives Parquet file (no column {lacking[0]!r})")
        for _ in batches(file, ["id", "negatives", "scores"]):
            pass


def _read_ids(path: Path, ids: list[str]) -> dict[str, MinedNegatives]:
    lacking = [c for c in ("id", "negatives", "scores") if c not in column_names(path)]
    if lacking:
        raise UserError(f"{at(path)}: cannot read a negatives Parquet file (no column {lacking[0]!r})")
    out = {}
    for batch in batches(path, ["id", "negatives", "scores"], ids=ids):
        for i, n, sc in zip(*(batch.column(c).to_pylist() for c in ("id", "negatives", "scores")), strict=True):
            if n is None or len(n) != len(sc or []):  # as read_negatives_parquet checks every row
                raise UserError(f"{at(path)}: id {i!r}: expected one score per negative")
            out[i] = MinedNegatives(i, tuple(n), tuple(math.nan if x is None else x for x in sc or ()))
    return out


def _files_of(path: Path) -> list[Path]:
    return shard_files(path) if path.is_dir() else [path]


def check_references(path: str | Path) -> None:
    """``mining.false_negatives=drop`` on pre-mined negatives needs each row's ``references`` (every annotator's
    correction): a file or shard mined without them is a one-line error (read from the checked footers only)."""
    for file in _files_of(Path(path)):
        names = column_names(file)
        if "references" not in names or "target" not in names:
            raise UserError(
                f"{at(file)}: no 'references' column, expected one for mining.false_negatives=drop "
                "(mine the file again with this raycl, or keep its false negatives)"
            )


def without_false_negatives(path: str | Path, negatives: dict[str, list[str]]) -> dict[str, list[str]]:
    """Pre-mined ``negatives`` (by id, read from ``path``) less those another annotator's correction equals, as the
    file's ``target`` and ``references`` columns say (:mod:`raycl.miners.false_negatives`)."""
    check_references(path)
    refuted: dict[str, frozenset[str]] = {}
    for file in _files_of(Path(path)):
        for batch in batches(file, ["id", "target", "references"], ids=list(negatives)):
            for id_, target, refs in zip(
                *(batch.column(c).to_pylist() for c in ("id", "target", "references")), strict=True
            ):
                refuted[id_] = refuted_set(refs or (), target)
    none: frozenset[str] = frozenset()
    return {i: [n for n in negs if normalize(n) not in refuted.get(i, none)] for i, negs in negatives.items()}
