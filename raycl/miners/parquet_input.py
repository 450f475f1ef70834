"""Parquet files read as input (``mining.negatives``, a shard directory a run resumes from, the n-best shards of a
run): bounded before any page is decompressed, then bounded again as each small batch decodes.

A Parquet file says in its footer how many rows each row group holds, how many values each column chunk holds and
how many bytes it takes compressed and uncompressed. A few kilobytes of zstd can decode to a gigabyte, so the
footer is checked first (:func:`open_checked`): rows per file, values per column chunk, uncompressed bytes per row
group and per row, and the compression ratio of any large column chunk and of the whole file, each against a limit
far above what a negatives file holds; over a limit, one line naming the file (and row group), exit status 2.

The footer is not enough: the uncompressed size of a dictionary-encoded column counts each distinct value once,
however many rows repeat it (one 256 KiB string in 4,096 rows is 256 KiB in the footer, 1 GiB decoded). So the
file is then read :data:`BATCH_ROWS` rows at a time with every string column kept dictionary-encoded
(:func:`batches`), and each batch's size *as it would decode* — the lengths of the values its indices point at —
is checked before it is materialized: no value over :data:`MAX_VALUE_BYTES`, no batch over :data:`MAX_BATCH_BYTES`,
and the whole file at most :data:`MAX_RATIO` times its size on disk (beyond :data:`RATIO_FROM`). A bomb is refused
with what pyarrow holds of it: the dictionary and one batch of indices.
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
MAX_VALUES = 1 << 25  # values of one column chunk (list elements count one each): the levels pyarrow decodes
MAX_ROW_GROUP_BYTES = 2 << 30  # uncompressed bytes of one row group (what is decompressed while it is read)
MAX_ROW_BYTES = 16 << 20  # uncompressed bytes of one row, on average over a row group
MAX_VALUE_BYTES = 16 << 20  # decoded bytes of one string (a sentence, a document)
MAX_BATCH_BYTES = 256 << 20  # decoded bytes of one batch of BATCH_ROWS rows, dictionaries expanded
MAX_RATIO = 100  # decoded / compressed bytes (text compresses 2-10x)
RATIO_FROM = 16 << 20  # ... checked for chunks and files of at least this many decoded bytes
BATCH_ROWS = 16_384  # rows measured, then decoded, at a time (a batch repeats its dictionary: not too small)


def open_checked(path: str | Path, *, dictionaries: bool = False) -> pq.ParquetFile:
    """``path`` opened as Parquet, its footer checked against the limits above (nothing decompressed yet);
    ``dictionaries``: its string columns read dictionary-encoded (what :func:`batches` measures)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
        if dictionaries:
            leaves = [c.path for c in file.schema if c.physical_type in ("BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY")]
            file = pq.ParquetFile(path, read_dictionary=leaves) if leaves else file
    except (OSError, ValueError, KeyError, pa.ArrowException) as err:
        raise UserError(f"{at(path)}: cannot read a Parquet file ({_one_line(err)})") from None
    meta = file.metadata
    if meta.num_rows > MAX_ROWS:
        raise UserError(f"{at(path)}: {meta.num_rows} rows, expected at most {MAX_ROWS:,} in one file")
    shown = at(path)  # once: it redacts against the environment, and a file may hold thousands of row groups
    for g in range(meta.num_row_groups):
        _check_row_group(shown, g, meta.row_group(g))
    raw, packed = sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)), _size(path)
    if raw >= RATIO_FROM and raw / packed > MAX_RATIO:  # many small chunks, each under the per-chunk check
        raise UserError(
            f"{at(path)}: {packed:,} bytes decode to {raw:,} ({raw // packed:,}x), expected at most "
            f"{MAX_RATIO}x (a decompression bomb): refused before decompressing it"
        )
    return file


def _one_line(err: Exception) -> str:
    """pyarrow's message on one line (a corrupt file's spans several), cut to a few hundred characters."""
    text = " ".join(str(err).split())
    return text if len(text) <= 300 else text[:300] + "…"


def _size(path: str | Path) -> int:
    try:
        return max(Path(path).stat().st_size, 1)
    except OSError:
        return 1


def _check_row_group(shown: str, g: int, rg: Any) -> None:
    where = f"{shown}: row group {g}"
    size, rows = rg.total_byte_size, max(rg.num_rows, 1)
    if size > MAX_ROW_GROUP_BYTES or size / rows > MAX_ROW_BYTES:
        raise UserError(
            f"{where} decodes to {size:,} bytes for {rg.num_rows} rows, expected at most "
            f"{MAX_ROW_GROUP_BYTES:,} bytes and {MAX_ROW_BYTES:,} per row: refused before "
            "decompressing it"
        )
    for c in range(rg.num_columns):
        col = rg.column(c)
        if col.num_values > MAX_VALUES:  # pyarrow decodes as many levels as the chunk declares values
            raise UserError(
                f"{where}, column {col.path_in_schema!r}: {col.num_values:,} values, expected at most "
                f"{MAX_VALUES:,} in one column chunk (write smaller row groups)"
            )
        raw, packed = col.total_uncompressed_size, max(col.total_compressed_size, 1)
        if raw >= RATIO_FROM and raw / packed > MAX_RATIO:
            raise UserError(
                f"{where}, column {col.path_in_schema!r}: {packed:,} compressed bytes decode to "
                f"{raw:,} ({raw // packed:,}x), expected at most {MAX_RATIO}x (a decompression bomb): "
                "refused before decompressing it"
            )


def batches(
    path: str | Path,
    columns: Sequence[str],
    ids: Sequence[str] | None = None,
    *,
    row_groups: Sequence[int] | None = None,
) -> Iterator[pa.RecordBatch]:
    """``columns`` of the checked file ``path`` (:func:`open_checked`), :data:`BATCH_ROWS` rows at a time, each
    batch's decoded size checked before it is decoded; with ``ids``, only the rows whose ``id`` is one of them (a
    training rank's own examples); with ``row_groups``, only those row groups (a range of a corpus)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    plain = open_checked(path).schema_arrow  # the columns' own types, strings not dictionary-encoded
    file = open_checked(path, dictionaries=True)
    wanted = None if ids is None else pa.array(list(ids), pa.string())
    missing = [c for c in columns if c not in plain.names]
    if missing:
        raise UserError(f"{at(path)}: no column {missing[0]!r}, expected the columns {list(columns)}")
    target = pa.schema([plain.field(c) for c in columns])
    decoded, budget = 0, max(RATIO_FROM, MAX_RATIO * _size(path))
    try:
        groups = range(file.metadata.num_row_groups) if row_groups is None else row_groups
        for g in groups:  # a reader per row group: its dictionaries start afresh
            for batch in file.iter_batches(batch_size=BATCH_ROWS, row_groups=[g], columns=list(columns)):
                decoded += _check_batch(path, batch, budget - decoded)
                if wanted is not None:  # rows chosen while still encoded: only they are decoded
                    batch = batch.filter(pc.is_in(batch.column("id"), value_set=wanted))
                batch = batch.cast(target)  # decoded now: it was measured
                batch.validate(full=True)  # strings that are UTF-8, offsets inside buffers: else ArrowInvalid
                yield batch
    except (OSError, ValueError, pa.ArrowException) as err:
        raise UserError(f"{at(path)}: cannot read a Parquet file ({_one_line(err)})") from None


def _check_batch(path: str | Path, batch: pa.RecordBatch, room: int) -> int:
    """The bytes ``batch`` decodes to (dictionaries expanded), refused over the value and batch limits and over
    ``room``, what is left of the file's budget."""
    total = 0
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        size, longest = decoded_size(column)
        if longest > MAX_VALUE_BYTES:
            raise UserError(
                f"{at(path)}: column {name!r} holds a value of {longest:,} bytes, expected at most "
                f"{MAX_VALUE_BYTES:,}: refused before decoding it"
            )
        total += size
    packed = _size(path)
    if total > room:
        raise UserError(
            f"{at(path)}: {packed:,} bytes on disk decode to more than "
            f"{max(RATIO_FROM, MAX_RATIO * packed):,}, expected at most {MAX_RATIO}x its size (a "
            "decompression bomb): refused before decoding them"
        )
    if total > MAX_BATCH_BYTES:
        raise UserError(
            f"{at(path)}: {batch.num_rows} rows decode to {total:,} bytes, expected at most "
            f"{MAX_BATCH_BYTES:,}: refused before decoding them"
        )
    return total


def decoded_size(array: pa.Array) -> tuple[int, int]:
    """(bytes ``array`` takes once its dictionaries are expanded, its longest string or binary value in bytes),
    counted from the dictionary's value lengths and the indices: nothing is expanded to count it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = array.type
    if pa.types.is_dictionary(t):
        lengths = pc.take(pc.binary_length(array.dictionary), array.indices)  # one length per row, from indices
        return int(pc.sum(lengths).as_py() or 0) + 8 * len(array), int(pc.max(lengths).as_py() or 0)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        size, longest = decoded_size(array.flatten())  # flatten: only the elements of these rows (a slice)
        return size + 8 * len(array), longest
    if pa.types.is_struct(t):
        parts = [decoded_size(child) for child in array.flatten()]
        return sum(p[0] for p in parts) + len(array), max((p[1] for p in parts), default=0)
    if any(
        test(t)
        for test in (pa.types.is_string, pa.types.is_binary, pa.types.is_large_string, pa.types.is_large_binary)
    ):
        return array.nbytes, int(pc.max(pc.binary_length(array)).as_py() or 0)
    return array.nbytes, 0


def read_columns(path: str | Path, columns: Sequence[str], schema: pa.Schema | None = None) -> pa.Table:
    """``columns`` of ``path`` as one table, read through :func:`batches` (``schema``: cast to it)."""
    import pyarrow as pa

    parts = list(batches(path, columns))
    plain = pa.schema([open_checked(path).schema_arrow.field(c) for c in columns])
    table = pa.Table.from_batches(parts, schema=plain)
    if schema is None:
        return table
    try:
        return table.cast(schema)
    except (ValueError, pa.ArrowException) as err:
        raise UserError(
            f"{at(path)}: expected the columns {schema.names} of types {schema.types} ({_one_line(err)})"
        ) from None


def column_names(path: str | Path) -> list[str]:
    """The columns of the checked file ``path`` (from its footer)."""
    return list(open_checked(path).schema_arrow.names)


def footer_metadata(path: str | Path) -> dict[bytes, bytes]:
    """The key-value metadata of the checked file ``path`` (from its footer)."""
    return dict(open_checked(path).schema_arrow.metadata or {})
