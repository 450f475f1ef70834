"""Parquet files read as input (``mining.negatives``, a shard directory a run resumes from): bounded before any
page is decompressed, then read in batches.

A Parquet file says in its footer how many rows each row group holds and how many bytes each column chunk takes
compressed and uncompressed. A few kilobytes of zstd can decode to a gigabyte, so the footer is checked first
(:func:`open_checked`): rows per file, uncompressed bytes per row group and per row, and the compression ratio of
any large column chunk and of the whole file, each against a limit far above what a negatives file holds; over a
limit, one line naming the file (and row group), exit status 2. The file is then read a batch of rows at a time
(:func:`batches`), and its decoded size is held to what the footer declared (a footer that lies is refused too,
once its batches outgrow it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raycl.errors import UserError, at

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

MAX_ROWS = 100_000_000  # rows in one file
MAX_ROW_GROUP_BYTES = 2 << 30  # uncompressed bytes of one row group (what is decompressed while it is read)
MAX_ROW_BYTES = 16 << 20  # uncompressed bytes of one row, on average over a row group
MAX_RATIO = 100  # uncompressed / compressed bytes of a large column chunk (text compresses 2-10x)
RATIO_FROM = 16 << 20  # ... checked for chunks of at least this many uncompressed bytes
BATCH_ROWS = 4096
_SLACK = 4  # decoded Arrow bytes per declared uncompressed byte (offsets, validity), before the file is refused


def open_checked(path: str | Path) -> pq.ParquetFile:
    """``path`` opened as Parquet, its footer checked against the limits above (nothing decompressed yet)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
    except (OSError, ValueError, pa.ArrowException) as err:
        raise UserError(f"{at(path)}: cannot read a Parquet file ({err})") from None
    meta = file.metadata
    if meta.num_rows > MAX_ROWS:
        raise UserError(f"{at(path)}: {meta.num_rows} rows, expected at most {MAX_ROWS:,} in one file")
    for g in range(meta.num_row_groups):
        _check_row_group(path, g, meta.row_group(g))
    raw, packed = sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)), _size(path)
    if raw >= RATIO_FROM and raw / packed > MAX_RATIO:  # many small chunks, each under the per-chunk check
        raise UserError(f"{at(path)}: {packed:,} bytes decode to {raw:,} ({raw // packed:,}x), expected at most "
                        f"{MAX_RATIO}x (a decompression bomb): refused before decompressing it")  # fmt: skip
    return file


def _size(path: str | Path) -> int:
    try:
        return max(Path(path).stat().st_size, 1)
    except OSError:
        return 1


def _check_row_group(path: str | Path, g: int, rg: Any) -> None:
    where = f"{at(path)}: row group {g}"
    size, rows = rg.total_byte_size, max(rg.num_rows, 1)
    if size > MAX_ROW_GROUP_BYTES or size / rows > MAX_ROW_BYTES:
        raise UserError(f"{where} decodes to {size:,} bytes for {rg.num_rows} rows, expected at most "
                        f"{MAX_ROW_GROUP_BYTES:,} bytes and {MAX_ROW_BYTES:,} per row: refused before "
                        "decompressing it")  # fmt: skip
    for c in range(rg.num_columns):
        col = rg.column(c)
        raw, packed = col.total_uncompressed_size, max(col.total_compressed_size, 1)
        if raw >= RATIO_FROM and raw / packed > MAX_RATIO:
            raise UserError(f"{where}, column {col.path_in_schema!r}: {packed:,} compressed bytes decode to "
                            f"{raw:,} ({raw // packed:,}x), expected at most {MAX_RATIO}x (a decompression bomb): "
                            "refused before decompressing it")  # fmt: skip


def batches(path: str | Path, columns: Sequence[str],
            ids: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """``columns`` of the checked file ``path`` (:func:`open_checked`), :data:`BATCH_ROWS` rows at a time; with
    ``ids``, only the rows whose ``id`` is one of them (a training rank's own examples)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    file = open_checked(path)
    wanted = None if ids is None else pa.array(list(ids), pa.string())
    declared = sum(file.metadata.row_group(g).total_byte_size for g in range(file.metadata.num_row_groups))
    decoded, limit = 0, _SLACK * declared + (64 << 20)
    try:
        for batch in file.iter_batches(batch_size=BATCH_ROWS, columns=list(columns)):
            decoded += batch.nbytes
            if decoded > limit:
                raise UserError(f"{at(path)}: decodes to more than its footer declares ({declared:,} bytes), "
                                "refused")  # fmt: skip
            yield batch if wanted is None else batch.filter(pc.is_in(batch.column("id"), value_set=wanted))
    except (OSError, ValueError, pa.ArrowException) as err:
        raise UserError(f"{at(path)}: cannot read a Parquet file ({err})") from None


def column_names(path: str | Path) -> list[str]:
    """The columns of the checked file ``path`` (from its footer)."""
    return list(open_checked(path).schema_arrow.names)
