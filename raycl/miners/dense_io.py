"""Files of dense mining (Ray-free): the pairs and corpus readers, embedding shards, the per-run report.

A dense mining's OUT holds ``part-<block>.parquet`` (one block of unique queries each, in
sentence-transformers' columns, the block's filter counts in the footer, :data:`STATS_KEY`), ``_embeddings/``
(``part-<range>.parquet``: ``text``, ``key``, ``embedding`` of a range of the corpus; ``part-<range>.usearch``
beside it with the approximate index), ``_mining.json`` (the settings; a rerun with others is refused),
``_report.json`` and ``_scores.png``. A corpus given as JSON lines, CSV or text is first copied, streamed, to
``OUT/_corpus.parquet``, so that miners read ranges of rows from Parquet and no process holds the corpus.
Every name but the negatives' starts with ``_`` or ``.``, which Parquet readers of a folder skip:
``pyarrow.parquet.read_table(OUT)`` and ``datasets.load_dataset("parquet", data_dir=OUT)`` read the negatives.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raycl.data.bounded import bounded_lines, json_value
from raycl.errors import UserError, at
from raycl.files import atomic_file, write_atomic
from raycl.miners.dense import BINS, FILTERS, Stats, within_margins
from raycl.miners.parquet_input import (
    MAX_VALUE_BYTES,
    MAX_VALUES,
    batches,
    column_names,
    footer_metadata,
    open_checked,
    read_columns,
)
from raycl.miners.shards import shard_files, write_shard

STATS_KEY = b"raycl.dense_stats"
EMBEDDINGS = "_embeddings"
CORPUS_COLUMN = "text"  # the text column of a corpus written for refreshing miners (``_corpus.parquet``)
FORMATS = (".parquet", ".jsonl", ".json", ".csv", ".txt")
_BATCH = 8192
MAX_LINE = MAX_VALUE_BYTES  # characters of one JSON-lines, CSV or text line: a Parquet value's bound


def _suffix(path: Path, what: str) -> str:
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise UserError(f"{at(path)}: {what} in an unknown format, expected {', '.join(FORMATS)}")
    if not path.is_file():
        raise UserError(f"{at(path)}: no such file ({what})")
    return suffix


def read_pairs(path: str | Path) -> Any:
    """A pairs file (Parquet, JSON lines, CSV) as a ``datasets.Dataset`` (no cache, no bar), read within bounds:
    Parquet batch by batch, each measured before it decodes (:mod:`raycl.miners.parquet_input`); a JSON line
    within :mod:`raycl.data.bounded`'s depth and digits, any line at most :data:`MAX_LINE` characters."""
    import datasets
    import pyarrow as pa

    path = Path(path)
    suffix = _suffix(path, "the pairs")
    if suffix == ".txt":
        raise UserError(f"{at(path)}: the pairs as text, expected Parquet, JSON lines or CSV with two columns")
    if suffix == ".parquet":
        return datasets.Dataset(read_columns(path, column_names(path)))
    expected = "expected one JSON object per line (pairs)"
    rows = list(_csv_rows(path)) if suffix == ".csv" else _json_rows(path, expected)
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    try:
        return datasets.Dataset(pa.table({n: [r.get(n) for r in rows] for n in names}))
    except (ValueError, TypeError, pa.ArrowException) as err:  # a column of mixed types
        raise UserError(
            f"{at(path)}: cannot read the pairs ({type(err).__name__}: {str(err).splitlines()[0][:200]})"
        ) from None


def _json_rows(path: Path, expected: str) -> list[dict[str, Any]]:
    rows, shown = [], at(path)  # once: at() redacts against the environment, too slow for a million lines
    with _text(path) as f:
        for lineno, line in enumerate(bounded_lines(f, path, MAX_LINE, expected="one JSON value per line"), 1):
            if line.strip():
                row = json_value(f"{shown}:{lineno}", line, expected)
                if not isinstance(row, dict):
                    raise UserError(f"{shown}:{lineno}: a JSON {type(row).__name__}, {expected}")
                rows.append(row)
    return rows


def _csv_rows(path: Path) -> Iterator[dict[str, str]]:
    """The rows of a CSV file with a header, as strings, streamed; a row of another width is one line."""
    import csv

    with _text(path) as f:
        reader = csv.reader(bounded_lines(f, path, MAX_LINE))
        try:
            header = next(reader, None)
            if header is None:
                raise UserError(f"{at(path)}: empty, expected a CSV header and rows")
            for row in reader:
                if row and len(row) != len(header):
                    raise UserError(
                        f"{at(path, reader.line_num)}: {len(row)} fields, expected {len(header)} "
                        f"(the header's {header})"
                    )
                if row:
                    yield dict(zip(header, row, strict=True))
        except csv.Error as err:
            raise UserError(f"{at(path, reader.line_num)}: not CSV ({err}), expected a header and rows") from None


def _text(path: Path) -> Any:
    """``path`` opened as UTF-8 text (a byte that is not UTF-8: one line, not a traceback)."""
    return open(path, encoding="utf-8", errors="strict", newline="")


def check_columns(names: Sequence[str], anchor: str | None, positive: str | None, where: str) -> tuple[str, str]:
    """sentence-transformers' defaults (the first and second columns); a named column that is not there is an
    error here (sentence-transformers falls back to the first columns silently)."""
    if len(names) < 2 and (anchor is None or positive is None):
        raise UserError(f"{where}: columns {list(names)}, expected at least two (anchor, positive)")
    anchor, positive = anchor or names[0], positive or names[1]
    for key, col in (("anchor_column_name", anchor), ("positive_column_name", positive)):
        if col not in names:
            raise UserError(f"{where}: no column {col!r} ({key}), expected one of {list(names)}")
    return anchor, positive


# ---------------------------------------------------------------------------------------------- the corpus
def corpus_parquet(path: str | Path, out_dir: Path, column: str | None) -> tuple[Path, str]:
    """The corpus as a Parquet file and its text column: a Parquet file as it is, any other format streamed to
    ``out_dir/_corpus.parquet`` (once: a rerun reuses it while its source is unchanged)."""
    import pyarrow.parquet as pq

    path = Path(path)
    suffix = _suffix(path, "the corpus")
    if suffix == ".parquet":
        return path, _text_column(column_names(path), column, path)
    dst = out_dir / "_corpus.parquet"
    stamp = out_dir / ".corpus.source"
    source = json.dumps([str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns, column])
    if dst.is_file() and stamp.is_file() and stamp.read_text(encoding="utf-8") == source:
        return dst, "text"
    import pyarrow as pa

    with atomic_file(dst, "wb") as f, pq.ParquetWriter(f, pa.schema([("text", pa.string())])) as writer:
        for batch in _text_batches(path, suffix, column):
            writer.write_table(pa.table({"text": pa.array(batch, pa.string())}))
    write_atomic(stamp, source)
    return dst, "text"


def _text_column(names: Sequence[str], column: str | None, path: Path) -> str:
    if column is not None and column not in names:
        raise UserError(f"{at(path)}: no column {column!r}, expected one of {list(names)} (corpus column)")
    if column is None and "text" not in names and len(names) != 1:
        raise UserError(f"{at(path)}: columns {list(names)}, expected a 'text' column or one column (corpus)")
    return column or ("text" if "text" in names else names[0])


def _text_batches(path: Path, suffix: str, column: str | None) -> Iterator[list[str]]:
    if suffix == ".csv":
        name = None
        batch: list[str] = []
        for row in _csv_rows(path):
            name = name or _text_column(list(row), column, path)
            batch.append(row[name])
            if len(batch) >= _BATCH:
                yield batch
                batch = []
        yield batch
        return
    batch, shown = [], at(path)  # once: at() redacts against the environment
    with _text(path) as f:
        for lineno, line in enumerate(bounded_lines(f, path, MAX_LINE, expected="one text per line"), 1):
            if suffix == ".txt":
                batch.append(line.rstrip("\r\n"))
            elif line.strip():
                batch.append(_json_text(line, column, path, f"{shown}:{lineno}"))
            if len(batch) >= _BATCH:
                yield batch
                batch = []
    yield batch


def _json_text(line: str, column: str | None, path: Path, where: str) -> str:
    row = json_value(where, line, "expected a JSON object or string per line (corpus)")
    if isinstance(row, str):
        return row
    if not isinstance(row, dict):
        raise UserError(f"{where}: expected a JSON object or string (corpus)")
    name = _text_column(list(row), column, path)
    return str(row[name])


def corpus_ranges(path: Path, column: str, size: int) -> list[dict[str, Any]]:
    """Ranges of ``size`` rows of a Parquet corpus (footer only: no row is read here)."""
    rows = open_checked(path).metadata.num_rows
    return [
        {"path": str(path), "column": column, "start": s, "stop": min(s + size, rows)}
        for s in range(0, rows, size)
    ]


def read_corpus_range(path: str, column: str, start: int, stop: int) -> list[str]:
    """Rows ``start``…``stop``−1 of a Parquet corpus: only the row groups that hold them are read, each batch
    measured before it decodes (:func:`raycl.miners.parquet_input.batches`)."""
    import pyarrow as pa

    f = open_checked(path)
    first, groups = 0, []
    for g in range(f.metadata.num_row_groups):
        n = f.metadata.row_group(g).num_rows
        if first < stop and first + n > start:
            groups.append((g, first))
        first += n
    if not groups:
        return []
    parts = list(batches(path, [column], row_groups=[g for g, _ in groups]))
    table = pa.Table.from_batches(parts, schema=pa.schema([f.schema_arrow.field(column)]))
    col = table.column(column).slice(start - groups[0][1], stop - start)
    return [("" if t is None else str(t)) for t in pa.chunked_array(col).to_pylist()]


def file_digest(path: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def texts_digest(*columns: Sequence[Any]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for col in columns:
        for t in col:
            h.update(json.dumps(t).encode("utf-8") + b"\n")
        h.update(b"\x00")
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------- embeddings
def embedding_table(texts: Sequence[str], keys: np.ndarray, emb: np.ndarray) -> Any:
    import pyarrow as pa

    flat = pa.array(np.ascontiguousarray(emb, np.float32).reshape(-1))
    return pa.table(
        {
            "text": pa.array(list(texts), pa.string()),
            "key": pa.array(keys, pa.int64()),
            "embedding": pa.FixedSizeListArray.from_arrays(flat, emb.shape[1]),
        }
    )


def read_embeddings(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An embedding shard: texts (object array), keys (int64), embeddings (N, D) float32 (read within the bounds of
    :mod:`raycl.miners.parquet_input`)."""
    t = read_columns(path, ["text", "key", "embedding"])
    emb = t.column("embedding").combine_chunks()
    dim = emb.type.list_size
    matrix = np.array(emb.values.to_numpy(zero_copy_only=False).reshape(-1, dim), np.float32)  # writable: torch
    texts = np.array(t.column("text").to_pylist(), dtype=object)
    return texts, t.column("key").to_numpy(), matrix


def write_embeddings(folder: Path, index: int, table: Any) -> Path:
    """An embedding shard in row groups of at most half :data:`~raycl.miners.parquet_input.MAX_VALUES` values, so
    that :func:`read_embeddings` reads back any width (a 4096-wide embedding: 4,096 rows a group)."""
    width = table.schema.field("embedding").type.list_size
    return write_shard(folder, index, table, row_group_size=max(1, MAX_VALUES // 2 // max(width, 1)))


def embedding_shards(out_dir: Path) -> list[Path]:
    return shard_files(out_dir / EMBEDDINGS)


# ---------------------------------------------------------------------------------------------- the report
def with_stats(table: Any, stats: Stats) -> Any:
    return table.replace_schema_metadata({**(table.schema.metadata or {}), STATS_KEY: json.dumps(stats.as_dict())})


def read_stats(out_dir: Path) -> Stats:
    """The filter counts of every output shard of ``out_dir`` (resumed ones included), from the footers."""
    total = Stats()
    for path in shard_files(out_dir):
        got = footer_metadata(path).get(STATS_KEY)
        if got is not None:
            total.merge(json.loads(got))
    return total


def write_report(out_dir: Path, stats: Stats, *, summary: dict[str, Any]) -> dict[str, Any]:
    """``_report.json`` (the summary, every filter's drops, the score histograms) and ``_scores.png``."""
    from raycl.records import atomic_write

    report = {**summary, **stats.as_dict(), "bins": [float(b) for b in BINS]}
    atomic_write(out_dir / "_report.json", json.dumps(report, indent=1))
    _plot(out_dir / "_scores.png", stats)
    return report


def _plot(path: Path, stats: Stats) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from raycl.records import save_png

    fig, ax = plt.subplots(figsize=(7, 4))
    mids = (BINS[:-1] + BINS[1:]) / 2
    for name, color in (("positive", "tab:green"), ("kept", "tab:blue"), ("dropped", "tab:red")):
        counts = np.asarray(stats.hist[name], float)
        total = counts.sum()
        ax.step(mids, counts / max(total, 1.0), where="mid", color=color, label=f"{name} ({int(total):,})")
    dropped = ", ".join(f"{k} {stats.dropped.get(k, 0):,}" for k in FILTERS)
    ax.set(xlabel="score s(q, ·)", ylabel="share of its kind", title=f"dropped: {dropped}")
    ax.title.set_fontsize(8)
    ax.legend()
    save_png(fig, path)
    plt.close(fig)


# ------------------------------------------------------------------------------ mined negatives, by anchor
@dataclass(frozen=True)
class AnchorNegatives:
    """One anchor's mined candidates, hardest first, and its hardest positive's score (None: no scores)."""

    negatives: tuple[str, ...]
    scores: tuple[float, ...] | None
    positive_score: float | None

    def select(self, m: Any, *, anchor: str | None = None) -> list[str]:
        """The first ``m.num_negatives`` that pass the margins of ``m`` (a mining section; the pool is in
        descending score), never ``anchor``
        itself: the corpus holds every training sentence, so an anchor's nearest text is its own copy, which
        no margin-free selection may hand its InfoNCE as a negative of itself."""
        kept = (
            range(len(self.negatives))
            if self.scores is None
            else within_margins(
                self.scores,
                self.positive_score,
                absolute_margin=m.absolute_margin,
                relative_margin=m.relative_margin,
            )
        )
        return [self.negatives[i] for i in kept if self.negatives[i] != anchor][: m.num_negatives]


def read_anchor_negatives(path: str | Path) -> dict[str, AnchorNegatives]:
    """``{anchor: its candidates}`` from a Parquet file or a folder of shards (bad input: one line)."""
    import pyarrow.parquet as pq

    p = Path(path)
    files = [p] if p.is_file() else (shard_files(p) or sorted(p.glob("*.parquet"))) if p.is_dir() else []
    if not files:
        raise UserError(f"mining.negatives: {path}: expected a Parquet file or a folder of Parquet shards")
    rows: list[dict[str, Any]] = []
    for f in files:
        try:
            rows += pq.read_table(f).to_pylist()
        except Exception as e:  # pyarrow's errors are many types; all mean "not Parquet"
            raise UserError(f"mining.negatives: {f}: not a readable Parquet file ({type(e).__name__})") from None
    return group_negatives(rows, where=str(path))


def group_negatives(rows: list[dict[str, Any]], *, where: str) -> dict[str, AnchorNegatives]:
    """Rows of ``triplet``, ``n-tuple`` or ``labeled-list`` (with or without ``scores``), grouped by anchor (the
    first column): distinct negatives in descending score (row order without scores), the hardest positive."""
    if not rows:
        return {}
    cols = list(rows[0])
    anchor, second = cols[0], cols[1] if len(cols) > 1 else ""
    listed = isinstance(rows[0].get(second), list)
    neg_cols = [c for c in cols if c == "negative" or c.startswith("negative_")]
    if not listed and not neg_cols:
        raise UserError(
            f"mining.negatives: {where}: columns {', '.join(cols)}: expected a negative or "
            "negative_1… column (triplet, n-tuple) or a list column (labeled-list)"
        )
    found: dict[str, tuple[dict[str, float | None], list[float]]] = {}
    for r in rows:
        negs, pos_score = _row_negatives(r, second, neg_cols, listed)
        seen, positives = found.setdefault(r[anchor], ({}, []))
        for text, s in negs:
            seen.setdefault(text, s)
        if pos_score is not None:
            positives.append(pos_score)
    out = {}
    for a, (seen, positives) in found.items():
        scored = all(s is not None for s in seen.values()) and bool(positives)
        items = sorted(seen.items(), key=lambda kv: -float(kv[1])) if scored else list(seen.items())  # type: ignore[arg-type]
        out[a] = AnchorNegatives(
            tuple(t for t, _ in items),
            tuple(float(s) for _, s in items) if scored else None,  # type: ignore[arg-type]
            min(positives) if scored else None,
        )
    return out


def _row_negatives(
    r: dict[str, Any], second: str, neg_cols: list[str], listed: bool
) -> tuple[list[tuple[str, float | None]], float | None]:
    scores = r.get("scores")
    if listed:  # labeled-list: [positive, negatives…] with scores, or labels 1 then 0s
        texts = r[second]
        if scores is not None:
            return list(zip(texts[1:], scores[1:], strict=True)), float(scores[0])
        return [(t, None) for t, lab in zip(texts, r.get("labels") or [], strict=False) if lab == 0], None
    texts = [r[c] for c in neg_cols]
    if scores is not None:
        return list(zip(texts, scores[1:], strict=True)), float(scores[0])
    return [(t, None) for t in texts], None
