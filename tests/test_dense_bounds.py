"""The dense miner under the project's file and input rules (raycl.files, raycl.miners.parquet_input,
raycl.data.bounded, raycl.storage.check_uri): fast, no Ray started, no model loaded. Each test names what undoing
its fix does."""

from __future__ import annotations

import http.server
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raycl.errors import UserError


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """``python -m raycl.mine ARGV`` ended in one line on stderr and exit status 2; that line."""
    from raycl.mine import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return err.strip()


def _pairs(tmp_path: Path) -> Path:
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"anchor": f"q{i}", "positive": f"p{i}"}) + "\n" for i in range(3)))
    return path


# ---------------------------------------------------------------------------------------------- 1. temp files
def test_a_link_planted_at_a_temp_name_writes_nothing_through_it(tmp_path: Path) -> None:
    """The corpus copy and a usearch index go through raycl.files' unplantable temp names: links planted at the
    names the dense miner used to build (``.corpus.parquet.tmp``, ``.part-00000.usearch.<pid>.tmp``) are never
    followed (undo: the old names write the corpus and the index into the victim)."""
    pytest.importorskip("usearch")
    from raycl.distributed.dense import _save_index
    from raycl.miners.dense_io import corpus_parquet, read_corpus_range

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".corpus.parquet.tmp").symlink_to(victim)
    (out / f".part-00000.usearch.{os.getpid()}.tmp").symlink_to(victim)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one\ntwo\nthree\n")
    path, column = corpus_parquet(corpus, out, None)
    _save_index(out / "part-00000.usearch", np.eye(3, 4, dtype=np.float32))
    assert victim.read_bytes() == b"precious"
    assert read_corpus_range(str(path), column, 0, 3) == ["one", "two", "three"]
    assert (out / "part-00000.usearch").stat().st_size > 0 and (out / ".corpus.source").is_file()


# ---------------------------------------------------------------------------------------------- 2. inputs
def _bomb(path: Path, column: str = "anchor") -> Path:
    """One 256 KiB string in 4,096 rows, dictionary-encoded: 1 GiB decoded, ~10 kB of zstd on disk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 4096
    once = pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()), pa.array(["x" * (256 << 10)]))
    pq.write_table(pa.table({column: once, "positive": ["p"] * n}), path, compression="zstd", store_schema=False)
    return path


def test_a_dictionary_bomb_as_pairs_or_corpus_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pairs file, a corpus range and the command each refuse the bomb before decoding it (undo: pyarrow's
    ``read_table`` / ``read_row_groups`` decode the whole gigabyte and the pairs are taken)."""
    from raycl.miners.dense_io import read_corpus_range, read_pairs

    bomb = _bomb(tmp_path / "pairs.parquet")
    assert bomb.stat().st_size < 100_000
    with pytest.raises(UserError, match=r"\(a decompression bomb\)") as err:
        read_pairs(bomb)
    assert "\n" not in str(err.value) and "pairs.parquet" in str(err.value)
    with pytest.raises(UserError, match=r"\(a decompression bomb\)"):
        read_corpus_range(str(_bomb(tmp_path / "corpus.parquet", "text")), "text", 0, 4096)
    line = _refused(["dense", "--model", str(tmp_path), "--data", str(bomb), "--out", str(tmp_path / "o")], capsys)
    assert "(a decompression bomb)" in line and not (tmp_path / "o" / "_embeddings").exists()


def test_json_lines_csv_and_text_inputs_are_held_to_their_bounds(tmp_path: Path) -> None:
    """A JSON line nested 5,000 deep, an integer of 5,000 digits, a CSV or text line over the line bound: one line
    naming the file and line (undo: pyarrow's JSON reader and Python's text lines have no such bounds)."""
    from raycl.miners import dense_io
    from raycl.miners.dense_io import corpus_parquet, read_pairs

    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"anchor": "a", "positive": "b"}\n' + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(UserError, match=r"deep.jsonl:2: JSON nested deeper than 64 levels"):
        read_pairs(deep)
    digits = tmp_path / "digits.jsonl"
    digits.write_text('{"anchor": "a", "positive": ' + "9" * 5000 + "}\n")
    with pytest.raises(UserError, match=r"digits.jsonl:1: an integer of 5,000 digits"):
        read_pairs(digits)
    long = "x" * (dense_io.MAX_LINE + 1)
    (tmp_path / "long.csv").write_text(f"anchor,positive\na,b\n{long},c\n")
    with pytest.raises(UserError, match=r"long.csv:3: a line longer than"):
        read_pairs(tmp_path / "long.csv")
    (tmp_path / "long.txt").write_text(f"a\n{long}\n")
    with pytest.raises(UserError, match=r"long.txt:2: a line longer than .* expected one text per line"):
        corpus_parquet(tmp_path / "long.txt", tmp_path, None)
    (tmp_path / "ok.csv").write_text('anchor,positive\n"a, with comma",b\nc,d\n')
    assert read_pairs(tmp_path / "ok.csv").to_list() == [
        {"anchor": "a, with comma", "positive": "b"},
        {"anchor": "c", "positive": "d"},
    ]


# ---------------------------------------------------------------------------------------------- 3. out, URIs
class _Counting(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.hits.append(self.path)
        self.send_response(404)
        self.end_headers()

    do_HEAD = do_GET  # noqa: N815

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server on 127.0.0.1; the requests it got."""
    _Counting.hits = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", _Counting.hits
    finally:
        srv.shutdown()
        srv.server_close()


def test_http_inputs_and_out_are_refused_before_any_request(
    server: tuple[str, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--data``, ``--corpus``, ``--model``, ``--cross-encoder``, ``--out`` (and the library's arguments) as
    http(s) URIs: check_uri's one line, zero requests (undo: 'no such file' or a hub lookup instead)."""
    import raycl

    base, hits = server
    pairs, out = _pairs(tmp_path), str(tmp_path / "out")
    for key in ("--data", "--corpus", "--model", "--cross-encoder", "--out"):
        argv = {"--model": str(tmp_path), "--data": str(pairs), "--out": out, key: f"{base}/x.parquet"}
        line = _refused(["dense", *(a for kv in argv.items() for a in kv)], capsys)
        assert f"{key}: {base}/x.parquet: not a storage raycl reads or writes, refused before any request" in line
    for key in ("dataset", "corpus", "model", "cross_encoder", "out"):
        kw = {"dataset": str(pairs), "model": str(tmp_path), "out": out, key: f"{base}/x.parquet"}
        with pytest.raises(UserError, match=f"^{key}: {base}/x.parquet: not a storage raycl reads or writes"):
            raycl.mine_dense_negatives(**kw, verbose=False)
    assert hits == [] and not Path(out).exists()


def test_an_out_others_can_write_is_refused_unless_trusted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A world-writable OUT (its shards and manifest are read back on a resume) and an OUT holding a link out of
    it: refused in the words of ``raycl.mine gec``, before anything is written; ``--trust-out`` / ``trust_out``
    take it (undo: the dense command writes into it)."""
    import raycl

    pairs, out = _pairs(tmp_path), tmp_path / "shared"
    out.mkdir()
    out.chmod(0o777)
    line = _refused(["dense", "--model", str(tmp_path), "--data", str(pairs), "--out", str(out)], capsys)
    assert line.endswith(
        "shared: writable by users other than its owner (mode drwxrwxrwx): refused, expected an "
        "output of raycl.mine that only you (or root) can have written; make it yours (chown -R, "
        "chmod -R go-w, or copy it: cp -r), or choose another --out; or, if you trust everyone "
        "who can write it, rerun with --trust-out"
    ), line
    with pytest.raises(UserError, match=r"choose another out; or, .* rerun with trust_out=True"):
        raycl.mine_dense_negatives(str(pairs), tmp_path, out=out, verbose=False)
    assert list(out.iterdir()) == []
    out.chmod(0o755)
    (out / "_mining.json").symlink_to(tmp_path / "elsewhere.json")
    assert "a symbolic link to" in _refused(
        ["dense", "--model", str(tmp_path), "--data", str(pairs), "--out", str(out)], capsys
    )
    # trusted: past the check, on to the model (this folder is none: its own one line)
    line = _refused(
        ["dense", "--model", str(tmp_path), "--data", str(pairs), "--out", str(out), "--trust-out"], capsys
    )
    assert "no config.json" in line


# ---------------------------------------------------------------------------------------------- 4. numbers
@pytest.mark.parametrize(
    "flag, value",
    [
        ("--max-score", "inf"),
        ("--relative-margin", "1e300"),
        ("--min-score", "1e400"),
        ("--num-negatives", "1" + "0" * 30),
        ("--batch-size", "10000000"),
        ("--range-max", "99999999999"),
        ("--gpus-per-miner", "inf"),
        ("--seed", "-1"),
        ("--num-miners", "1-100000000"),
    ],
)
def test_a_number_out_of_bounds_is_one_line_before_anything_starts(
    flag: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Infinite, NaN or absurd numbers: one line naming the option, exit 2, nothing written (undo: inf passes
    ``dense_options``, a 10^30 window or batch reaches the actors)."""
    out = tmp_path / "out"
    line = _refused(
        ["dense", "--model", str(tmp_path), "--data", str(_pairs(tmp_path)), "--out", str(out), flag, value],
        capsys,
    )
    assert f"{flag}: expected a" in line and not out.exists()


def test_the_library_bounds_its_numbers_too(tmp_path: Path) -> None:
    import raycl

    pairs = str(_pairs(tmp_path))
    for key, value in (
        ("batch_size", 10**30),
        ("absolute_margin", float("inf")),
        ("num_negatives", 2.5),
        ("cpus_per_miner", float("nan")),
        ("num_miners", (1, 10**9)),
    ):
        with pytest.raises(UserError, match=f"^{key}: expected a"):
            raycl.mine_dense_negatives(pairs, tmp_path, out=tmp_path / "out", verbose=False, **{key: value})
    assert not (tmp_path / "out").exists()
