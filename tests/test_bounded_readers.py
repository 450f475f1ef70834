"""Readers bounded before they decode (docs/security.md, "Bounded readers"): a Parquet file whose dictionary
repeats one large value (the footer counts it once) is refused by every Parquet reader of raycl while its memory
stays under a stated ceiling, measured in a fresh process; honest files read back exactly; JSON lines and CSV
files are held to their depth, digits and line lengths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raycl.errors import UserError

CEILING_MB = 600  # the peak RSS that reading the bomb may add to a process that has imported raycl's readers

_BOMB = """
import json, resource, sys
import pyarrow as pa, pyarrow.parquet as pq
from pathlib import Path
from raycl.errors import UserError

root = Path(sys.argv[1])
value, n = "x" * (256 << 10), 4096  # one 256 KiB string in 4,096 rows: 1 GiB decoded, ~10 kB of zstd
# built dictionary-encoded, as the file holds it (never 1 GiB here); no Arrow schema stored: the columns read
# back as the strings a writer of plain strings would have written
once = pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()), pa.array([value]))
negatives = pa.ListArray.from_arrays(pa.array(range(n + 1), pa.int32()), once)
columns = {"id": [f"id{i}" for i in range(n)], "source": ["s"] * n, "target": ["t"] * n, "negatives": negatives,
           "scores": [[0.0]] * n, "model_version": [0] * n, "references": [["t"]] * n}
for name in ("negs", "nbest", "shards"):
    (root / name).mkdir()
    pq.write_table(pa.table(columns), root / name / "part-00000.parquet", compression="zstd", store_schema=False)
def high_water_mb():
    # this process's own high-water mark (VmHWM): getrusage's ru_maxrss survives exec, so a child of a large
    # process (a pytest worker holding torch, Ray and models) would report its parent's size from before the exec
    hwm = [line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM:")]
    return int(hwm[0].split()[1]) / 1024


before = high_water_mb()
from raycl.distributed.negatives_api import _read_shards, _stream_shards
from raycl.distributed.nbest import read_nbest_shards
from raycl.miners.shards import read_negatives
readers = {"read_negatives(ids)": lambda: read_negatives(root / "negs", ids=["id1"]),
           "read_negatives": lambda: read_negatives(root / "negs" / "part-00000.parquet"),
           "read_nbest_shards": lambda: read_nbest_shards(root / "nbest"),
           "corpus _read_shards": lambda: _read_shards(root / "shards"),
           "corpus _stream_shards": lambda: list(_stream_shards(root / "shards"))}
out = {"size": (root / "negs" / "part-00000.parquet").stat().st_size, "refused": {}}
# what the process holds once the imports are done (torch, Ray, datasets: their size varies with the installed
# versions and what their imports pull in): the reads' own growth is measured from here
out["imported_rss_mb"] = int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20
pool = pa.proxy_memory_pool(pa.default_memory_pool())
pa.set_memory_pool(pool)
for name, read in readers.items():
    try:
        read()
        out["refused"][name] = None
    except UserError as err:
        out["refused"][name] = str(err)
out["arrow_peak_mb"] = pool.max_memory() / 2**20
out["peak_rss_mb"] = high_water_mb()
out["written_rss_mb"] = before
print(json.dumps(out))
"""


def test_a_dictionary_bomb_is_refused_by_every_parquet_reader_under_the_memory_ceiling(tmp_path: Path) -> None:
    """The issue's file: one 256 KiB string repeated 4,096 times, zstd, ~10 kB. Its footer declares 256 KiB
    (the dictionary holds the value once); decoded it is 1 GiB. Each reader refuses it in one line, in a
    process whose peak RSS rises less than 600 MB over what its imports hold, and whose Arrow pool never holds more
    than a few MiB (decoded, the file would take 1 GiB at least)."""
    proc = subprocess.run(
        [sys.executable, "-c", _BOMB, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["size"] < 16 * 1024
    for name, message in got["refused"].items():
        assert message is not None, f"{name} accepted the bomb"
        assert "\n" not in message and "expected at most 100x its size (a decompression bomb)" in message, message
    assert got["arrow_peak_mb"] < 16, got
    assert got["peak_rss_mb"] - got["imported_rss_mb"] < CEILING_MB, got


def _write(path: Path, table: pa.Table, **kwargs: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, **kwargs)  # type: ignore[arg-type]
    return path


def test_an_honest_dictionary_encoded_file_reads_back_exactly(tmp_path: Path) -> None:
    """Strings read dictionary-encoded and measured come back as the file's own types and values (nulls, empty
    lists, repeated values, several batches), through every reader."""
    from raycl.miners import parquet_input
    from raycl.miners.beam_search import negatives_schema
    from raycl.miners.shards import read_negatives

    n = 2500  # three batches
    table = pa.table(
        {
            "id": [f"x:{i}" for i in range(n)],
            "source": ["same source"] * n,
            "target": [None if i % 7 == 0 else f"t{i % 3}" for i in range(n)],
            "negatives": [[f"n{i % 5}", "shared"] if i % 11 else [] for i in range(n)],
            "scores": [[-1.0, -2.0] if i % 11 else [] for i in range(n)],
            "model_version": [i % 4 for i in range(n)],
            "references": [[f"t{i % 3}"] for i in range(n)],
        },
        schema=negatives_schema(),
    )
    path = _write(tmp_path / "negs.parquet", table, compression="zstd")
    assert parquet_input.read_columns(path, table.schema.names).equals(table)
    assert pa.Table.from_batches(list(parquet_input.batches(path, ["id", "negatives"]))).equals(
        table.select(["id", "negatives"])
    )
    got = read_negatives(path)
    assert [got[f"x:{i}"].negatives for i in (0, 1, 11)] == [(), ("n1", "shared"), ()]
    assert sorted(read_negatives(path, ids=["x:3", "x:2400", "nope"])) == ["x:2400", "x:3"]


def test_one_value_over_the_limit_is_refused_before_it_is_decoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from raycl.miners import parquet_input

    monkeypatch.setattr(parquet_input, "MAX_VALUE_BYTES", 1000)
    path = _write(tmp_path / "v.parquet", pa.table({"id": ["a", "b"], "text": ["x" * 1000, "y" * 1001]}))
    with pytest.raises(UserError) as err:
        list(parquet_input.batches(path, ["id", "text"]))
    assert (
        str(err.value) == f"{path}: column 'text' holds a value of 1,001 bytes, expected at most 1,000: "
        "refused before decoding it"
    )
    monkeypatch.setattr(parquet_input, "MAX_VALUE_BYTES", 1001)
    assert len(list(parquet_input.batches(path, ["id", "text"]))) == 1


def test_a_batch_over_the_limit_is_refused_and_a_missing_column_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from raycl.miners import parquet_input

    monkeypatch.setattr(parquet_input, "MAX_BATCH_BYTES", 10_000)
    monkeypatch.setattr(parquet_input, "BATCH_ROWS", 10)
    path = _write(tmp_path / "b.parquet", pa.table({"id": [str(i) for i in range(30)], "text": ["z" * 1200] * 30}))
    with pytest.raises(UserError, match=r"b.parquet: 10 rows decode to 12,\d{3} bytes, expected at most 10,000"):
        list(parquet_input.batches(path, ["id", "text"]))
    with pytest.raises(UserError) as err:
        list(parquet_input.batches(path, ["id", "negatives"]))
    assert str(err.value) == f"{path}: no column 'negatives', expected the columns ['id', 'negatives']"


def test_json_lines_are_held_to_their_depth_and_integer_digits(tmp_path: Path) -> None:
    """A 5,000-deep line raised RecursionError, a 5,000-digit integer ValueError (Python's int limit): now one
    line each, naming the file and line."""
    from raycl.data.coherence import read_documents, read_pairs

    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": "a", "sentences": ["one."]}\n' + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(UserError) as err:
        read_documents(docs)
    assert str(err.value) == f"{docs}:2: JSON nested deeper than 64 levels, expected one object per line"
    docs.write_text('{"id": "a", "sentences": ["one."], "n": ' + "7" * 5000 + "}\n")
    with pytest.raises(UserError) as err:
        read_documents(docs)
    assert str(err.value) == f"{docs}:1: an integer of 5,000 digits, expected at most 20"
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"pos": ["a."], "neg": ' + "[" * 70 + "]" * 70 + "}\n")  # under Python's limit, over ours
    with pytest.raises(UserError) as err:
        read_pairs(pairs)
    assert str(err.value) == f"{pairs}:1: JSON nested deeper than 64 levels, expected one object per line"


def test_a_csv_line_is_held_to_its_length(tmp_path: Path) -> None:
    from raycl.data.bounded import MAX_CSV_LINE
    from raycl.data.semeval import read_rows

    path = tmp_path / "gold.csv"
    path.write_text("a,b\n1,2\n" + "x" * (MAX_CSV_LINE + 1) + ",y\n", encoding="utf-8")
    with pytest.raises(UserError) as err:
        list(read_rows(path, ["a", "b"]))
    assert str(err.value) == f"{path}:3: a line longer than 1,048,576 characters, expected one CSV row per line"
    path.write_text('a,b\n1,2\n"x\ny",3\n', encoding="utf-8")  # a quoted field across lines is still one row
    assert list(read_rows(path, ["a", "b"])) == [(2, ["1", "2"]), (3, ["x\ny", "3"])]


def test_what_the_fuzz_test_found_in_parquet_is_one_line_each(tmp_path: Path) -> None:
    """Found by tests/test_fuzz_readers.py: a string column that is not UTF-8 (``UnicodeDecodeError`` from
    ``to_pylist``), a row without negatives read by id (``TypeError``), pyarrow's multi-line messages."""
    from raycl.miners.shards import read_negatives

    ids = pa.array([b"\xc3\x28", b"ok"], pa.binary()).view(pa.string())  # not UTF-8, labelled a string
    bad = _write(
        tmp_path / "utf8.parquet", pa.table({"id": ids, "negatives": [["a"], ["b"]], "scores": [[0.0], [0.0]]})
    )
    with pytest.raises(UserError) as err:
        read_negatives(bad)
    why = "In column 0: Invalid: Invalid UTF8 sequence at string index 0"
    assert str(err.value) == f"{bad}: cannot read a Parquet file ({why})"
    assert list(read_negatives(bad, ids=["ok"])) == ["ok"]  # rows are chosen before they decode
    nulls = _write(
        tmp_path / "nulls.parquet",
        pa.table(
            {
                "id": ["a", "b"],
                "negatives": pa.array([["x"], None], pa.list_(pa.string())),
                "scores": pa.array([[0.0], None], pa.list_(pa.float64())),
            }
        ),
    )
    with pytest.raises(UserError) as err:
        read_negatives(nulls, ids=["b"])
    assert str(err.value) == f"{nulls}: id 'b': expected one score per negative"
    assert read_negatives(nulls, ids=["a"])["a"].negatives == ("x",)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(nulls.read_bytes()[:-30])  # a footer cut short
    with pytest.raises(UserError) as err:
        read_negatives(cut)
    assert str(err.value).startswith(f"{cut}: cannot read a Parquet file (") and "\n" not in str(err.value)
