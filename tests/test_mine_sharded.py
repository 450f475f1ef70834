"""Standalone mining at scale (issue 3 item 5): streamed input, sharded Parquet output, resume, the miner pool."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from conftest import ending

from raycl.data.gec import load_examples
from raycl.data.m2 import Edit, M2Sentence, write_m2
from raycl.errors import UserError
from raycl.miners.corpus import read_range, scan_ranges
from raycl.miners.shards import done_ids, read_negatives, shard_files
from raycl.models.presets import build_model
from raycl.testing.faults import Chaos

SENTENCES = [
    M2Sentence("He do n't like it .", (Edit(1, 2, "R:VERB:SVA", "does"),)),
    M2Sentence("This are a sentence .", (Edit(1, 2, "R:VERB:SVA", "is"),)),
    M2Sentence("Fine as it is ."),
    M2Sentence("I has went to the school yesterday .", (Edit(1, 3, "R:VERB", "went"), Edit(4, 5, "U:DET", ""))),
    M2Sentence("She go home every day .", (Edit(1, 2, "R:VERB:SVA", "goes"),)),
    M2Sentence("The cats sleeps on a mat .", (Edit(2, 3, "R:VERB:SVA", "sleep"),)),
    M2Sentence("We was late again ."),
    M2Sentence("A dog barked at the moon .", (Edit(0, 1, "R:DET", "The"),)),
    M2Sentence("They has two car .", (Edit(1, 2, "R:VERB:SVA", "have"), Edit(3, 4, "R:NOUN:NUM", "cars"))),
    M2Sentence("It rain a lot here .", (Edit(1, 2, "R:VERB:SVA", "rains"),)),
    M2Sentence("You is right ."),
]
N = len(SENTENCES)
FAST = ["--k", "2", "--max-len-b", "6", "--batch-size", "4"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "tiny.m2"
    write_m2(path, SENTENCES)
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Path:
    texts = [t for s in SENTENCES for t in (s.source, s.target())] * 4
    tiny = dict(d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_layers=1, decoder_layers=1)
    out = tmp_path_factory.mktemp("model")
    return ending(build_model("smoke", out_dir=out, texts=texts, vocab_size=300, **tiny))


def with_faults(monkeypatch: pytest.MonkeyPatch, faults: Chaos) -> None:
    """``python -m raycl.mine`` from here on gives its range miners ``faults`` (the CLI has no switch for them)."""
    from raycl.distributed import corpus as ray_corpus

    monkeypatch.setattr(ray_corpus, "mine_corpus", functools.partial(ray_corpus.mine_corpus, faults=faults))


def _mine(model_dir: Path, corpus: Path, out: Path, *extra: str, capsys: pytest.CaptureFixture[str]) -> dict:
    from raycl.mine import main

    assert (
        main(["gec", "--model", str(model_dir), "--data", str(corpus), "--out", str(out), *FAST, *extra, "--json"])
        == 0
    )
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def single_file(tmp_path_factory: pytest.TempPathFactory, model_dir: Path, corpus: Path) -> dict[str, Any]:
    """Today's in-process, one-file output: the reference every sharded run is compared with."""
    from raycl.mine import main

    out = tmp_path_factory.mktemp("single") / "neg.parquet"
    assert main(["gec", "--model", str(model_dir), "--data", str(corpus), "--out", str(out), *FAST]) == 0
    return {r["id"]: r for r in pq.read_table(out).to_pylist()}


def _same_rows(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Same ids, texts and negatives; scores equal up to float noise (batches pad differently)."""
    assert sorted(got) == sorted(want)
    for id_, row in got.items():
        ref = want[id_]
        assert (row["source"], row["target"], row["negatives"]) == (ref["source"], ref["target"], ref["negatives"])
        assert row["scores"] == pytest.approx(ref["scores"], abs=1e-3)
        assert row["model_version"] == ref["model_version"] == 0


def _rows(out: Path) -> dict[str, Any]:
    rows = pq.read_table(out).to_pylist()  # the directory, as pyarrow reads it
    assert len({r["id"] for r in rows}) == len(rows)
    return {r["id"]: r for r in rows}


def test_overlapping_specs_are_refused_and_adjacent_ones_are_read_in_order(corpus: Path) -> None:
    with pytest.raises(UserError, match="overlap"):
        list(scan_ranges([f"{corpus}[:5]", f"{corpus}[4:]"], range_size=3))
    ranges = list(scan_ranges([f"{corpus}[:5]", f"{corpus}[5:]"], range_size=3))
    assert [r.count for r in ranges] == [3, 2, 3, 3] and [r.index for r in ranges] == [0, 1, 2, 3]
    assert [ex for r in ranges for ex in read_range(r)] == load_examples([str(corpus)])


@pytest.mark.parametrize(
    ("text", "line", "expected"),
    [
        (
            "S a b .\nA 0 1|||R:DET|||the|||REQUIRED|||-NONE-|||0\n\nA 0 1|||R:DET|||x|||REQUIRED|||-NONE-|||0\n",
            4,
            "'A' line outside a block",
        ),
        ("S a b .\nS c d .\n", 2, "second 'S' line"),
        ("S a b .\n\nX stray\n\nS c d .\n", 3, "expected 'S ', 'A ' or a blank line"),
        ("", None, "empty M2 file"),
        # the records themselves (issue 19): fields, spans, bytes — also deep inside a large range
        ("S a b .\n\nS c d .\nA 0 1|||R:DET|||the|||REQUIRED|||-NONE-\n", 4, "expected 6"),
        ("S a b .\n\nS c d .\nA 1 4|||R:DET|||the|||REQUIRED|||-NONE-|||0\n", 4, "out of range"),
        ("S a b .\n\nS c d .\nA x 1|||R:DET|||the|||REQUIRED|||-NONE-|||0\n", 4, "two integers"),
        (b"S a b .\n\nS c \xff d .\n", 3, "not UTF-8"),
        (b"S a b .\n\nS c \x00 d .\n", 3, "NUL byte"),
    ],
)
def test_the_scan_checks_the_m2_structure_before_any_mining(
    tmp_path: Path, text: str | bytes, line: int | None, expected: str
) -> None:
    bad = tmp_path / "bad.m2"
    bad.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    with pytest.raises(UserError) as err:
        list(scan_ranges([str(bad)], range_size=2))
    where = f"bad.m2:{line}:" if line else "bad.m2"
    assert where in str(err.value) and expected in str(err.value) and "\n" not in str(err.value), err.value


def test_a_resumed_directory_keeps_its_shard_size_and_refuses_other_data(
    model_dir: Path, corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from raycl.mine import main

    out = tmp_path / "negs"
    first = _mine(model_dir, corpus, out, "--num-miners", "0", "--shard-size", "4", capsys=capsys)
    assert first["shard_size"] == 4 and json.loads((out / "_mining.json").read_text())["shard_size"] == 4
    shard_files(out)[1].unlink()
    again = _mine(model_dir, corpus, out, "--num-miners", "0", capsys=capsys)  # no --shard-size: the stored 4
    assert again["shard_size"] == 4 and again["examples"] == 4 and again["resumed"] == N - 4

    def refused(*argv: str) -> str:
        with pytest.raises(SystemExit) as exc:
            main(["gec", "--model", str(model_dir), "--out", str(out), *FAST, "--num-miners", "0", *argv])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        return err

    assert "shard size 5" in refused("--data", str(corpus), "--shard-size", "5")
    assert "tiny.m2[:6]" in refused("--data", f"{corpus}[:6]")  # other data: range i is other sentences
    assert "annotator" in refused("--data", str(corpus), "--annotator", "1")
    (out / "_mining.json").write_text("{not json")
    assert "_mining.json" in refused("--data", str(corpus))
    (out / "_mining.json").unlink()
    assert "no _mining.json" in refused("--data", str(corpus))
    assert read_negatives(out).keys() == {f"tiny.m2:{i}" for i in range(N)}  # nothing lost by the refusals


def test_read_negatives_accepts_a_file_or_a_directory_and_names_bad_shards(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no part-"):
        read_negatives(tmp_path)
    (tmp_path / "part-00000.parquet").write_bytes(b"not parquet")
    with pytest.raises(UserError, match="part-00000.parquet"):
        done_ids(tmp_path)


def test_sharded_in_process_equals_single_file_and_resumes(
    model_dir: Path, corpus: Path, single_file: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "negs"
    summary = _mine(model_dir, corpus, out, "--num-miners", "0", "--shard-size", "4", capsys=capsys)
    assert summary["examples"] == N and summary["shards"] == 3 and summary["num_miners"] == 0
    assert summary["negatives"] == sum(len(r["negatives"]) for r in single_file.values())
    assert [len(pq.read_table(p)) for p in shard_files(out)] == [4, 4, 3]
    _same_rows(_rows(out), single_file)
    last = shard_files(out)[-1]
    lost = set(pq.read_table(last, columns=["id"]).column("id").to_pylist())
    last.unlink()
    again = _mine(model_dir, corpus, out, "--num-miners", "0", "--shard-size", "4", capsys=capsys)
    assert again["examples"] == len(lost) == 3 and again["resumed"] == N - 3  # only the lost shard's ids
    assert set(pq.read_table(shard_files(out)[-1]).column("id").to_pylist()) == lost
    _same_rows(_rows(out), single_file)
    # false-negative counts: the shards' sum, those mined by the first run included; one annotator: none refuted
    sources = sum(r["source"] in r["negatives"] for r in single_file.values())
    beam = sum(len(r["negatives"]) for r in single_file.values()) - sources
    want = {"source": {"selected": sources, "refuted": 0}, "beam": {"selected": beam, "refuted": 0}}
    assert summary["false_negatives"] == again["false_negatives"] == want and sources > 0
    assert _mine(model_dir, corpus, out, "--num-miners", "0", capsys=capsys)["examples"] == 0
    got = read_negatives(out)  # what mining.negatives=DIR reads
    assert {i: m.negatives for i, m in got.items()} == {i: tuple(r["negatives"]) for i, r in single_file.items()}


def test_shards_load_with_datasets(
    model_dir: Path, corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import datasets

    out = tmp_path / "negs"
    _mine(model_dir, corpus, out, "--num-miners", "0", "--shard-size", "5", capsys=capsys)
    ds = datasets.load_dataset(
        "parquet", data_files=str(out / "part-*.parquet"), split="train", cache_dir=str(tmp_path / "cache")
    )
    assert ds.column_names == ["id", "source", "target", "negatives", "scores", "model_version", "references"]
    assert sorted(ds["id"]) == sorted(f"tiny.m2:{i}" for i in range(N))


def test_usage_errors_are_one_line(
    model_dir: Path, corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from raycl.mine import main

    (tmp_path / "file.parquet").write_bytes(b"")
    for extra, where in (
        (["--shard-size", "0"], "--shard-size"),
        (["--num-miners", "-1"], "--num-miners"),
        (["--engine", "hf", "--precision", "int8"], "--precision int8"),
        (["--out", str(tmp_path / "file.parquet"), "--shards"], "file.parquet"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(
                [
                    "gec",
                    "--model",
                    str(model_dir),
                    "--data",
                    str(corpus),
                    "--out",
                    str(tmp_path / "o"),
                    "--num-miners",
                    "0",
                    *extra,
                ]
            )
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.count("\n") == 1 and where in err, err


def _miner_actors() -> dict[str, int]:
    """Every Ray Data miner actor of this Ray session (dead ones too) → how often Ray restarted it."""
    import ray
    from ray.util.state import list_actors

    address = ray.get_runtime_context().gcs_address  # this session's Ray, not another one on the host
    actors = list_actors(address=address, detail=True, limit=10_000)
    return {a.actor_id: a.num_restarts for a in actors if "RangeMiner" in (a.class_name or "")}


@pytest.mark.slow
def test_pool_output_equals_single_file_even_when_miners_crash(
    ray_local: Any,
    model_dir: Path,
    corpus: Path,
    single_file: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each miner's first life dies (os._exit) after mining its first range, before writing it: Ray restarts the
    # actor, Ray Data retries the range, and the shards still hold every id exactly once.
    with_faults(monkeypatch, Chaos(fail_after_tasks=1))
    out, before = tmp_path / "negs", _miner_actors()
    summary = _mine(
        model_dir, corpus, out, "--num-miners", "2", "--cpus-per-miner", "0.5", "--shard-size", "4", capsys=capsys
    )
    assert summary["num_miners"] == 2 and summary["examples"] == N and summary["shards"] == 3
    ours = {a: n for a, n in _miner_actors().items() if a not in before}
    assert len(ours) == 2 and all(n >= 1 for n in ours.values()), ours  # both crashed and were restarted
    _same_rows(_rows(out), single_file)
    assert {r["id"] for r in pq.read_table(shard_files(out)[0]).to_pylist()} <= set(single_file)


# ---------------------------------------------------------------------------------------------- issue 19
def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], *, status: int = 2) -> str:
    from raycl.mine import main

    with pytest.raises(SystemExit) as exc:
        main(["gec", *argv])
    err = capsys.readouterr().err
    last = err.rstrip("\n").rsplit("\n", 1)[-1]  # the line after the progress bar, if one ran
    assert exc.value.code == status and last.startswith("raycl: error: ") and "Traceback" not in err, err
    return last


def test_a_resumed_directory_refuses_other_mining_settings_and_overwrite_starts_afresh(
    model_dir: Path, corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    out = tmp_path / "negs"
    _mine(model_dir, corpus, out, "--num-miners", "0", "--shard-size", "4", capsys=capsys)
    manifest = json.loads((out / "_mining.json").read_text())["mining"]
    assert manifest["model"].startswith("sha256:") and manifest["engine"] in ("hf", "ctranslate2")
    assert "transformers" in manifest["versions"] and manifest["beam"] == 3 and manifest["k"] == 2
    shard_files(out)[1].unlink()  # an interrupted run: a resume would mine range 1 with this run's settings
    other_model = tmp_path / "model2"
    shutil.copytree(model_dir, other_model, ignore=shutil.ignore_patterns(".*"))
    config = json.loads((other_model / "config.json").read_text())
    (other_model / "config.json").write_text(json.dumps({**config, "dropout": 0.123}))  # same shapes, other file
    base = ["--data", str(corpus), "--out", str(out), *FAST, "--num-miners", "0"]
    for extra, named in (
        (["--k", "3"], "mining.k 2 → 3"),
        (["--beam", "4"], "mining.beam 3 → 4"),
        (["--no-source-negative"], "mining.source_negative true → false"),
        (["--rank-by", "sum_logprob"], "mining.rank_by"),
        (["--refill"], "mining.refill"),
        (["--max-len-b", "7"], "mining.max_len_b 6 → 7"),
        (["--engine", "hf" if manifest["engine"] == "ctranslate2" else "ctranslate2"], "mining.engine"),
        (["--model", str(other_model)], "mining.model"),
    ):
        argv = ["--model", str(model_dir), *base, *extra] if "--model" not in extra else [*extra, *base]
        err = _refused(argv, capsys)
        assert named in err and "--overwrite" in err, err
    assert len(shard_files(out)) == 2  # nothing mined by the refused runs
    again = _mine(other_model, corpus, out, "--num-miners", "0", "--k", "3", "--overwrite", capsys=capsys)
    assert again["examples"] == N and again["resumed"] == 0 and again["shard_size"] == 10_000  # afresh
    assert json.loads((out / "_mining.json").read_text())["mining"]["k"] == 3


def test_data_is_known_by_its_content_and_a_resume_does_not_read_it_again(
    model_dir: Path,
    corpus: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    import raycl.miners.corpus

    data, out = tmp_path / "tiny.m2", tmp_path / "negs"
    data.write_bytes(corpus.read_bytes())
    _mine(model_dir, data, out, "--num-miners", "0", "--shard-size", "4", capsys=capsys)
    shard_files(out)[2].unlink()
    with monkeypatch.context() as m:  # the offsets come from the manifest: opening the corpus to scan it fails
        m.setattr(raycl.miners.corpus, "_open", lambda path: pytest.fail(f"the scan read {path} again"))
        again = _mine(model_dir, data, out, "--num-miners", "0", capsys=capsys)
    assert again["examples"] == 3 and again["resumed"] == N - 3
    os.utime(data, ns=(1, 1))  # touched, same bytes: scanned again, the same content, still resumable
    shard_files(out)[2].unlink()
    assert _mine(model_dir, data, out, "--num-miners", "0", capsys=capsys)["examples"] == 3
    text = data.read_bytes()
    data.write_bytes(text.replace(b"He do n't", b"He di n't"))  # same name, same size, other sentences
    assert data.stat().st_size == len(text)
    err = _refused(
        ["--model", str(model_dir), "--data", str(data), "--out", str(out), *FAST, "--num-miners", "0"], capsys
    )
    assert "data tiny.m2 (blake2b" in err, err


def test_a_second_run_on_one_out_is_refused_and_leaves_the_first_runs_files(
    model_dir: Path, corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from raycl.miners.shards import locked_out_dir

    out = tmp_path / "negs"
    with locked_out_dir(out):  # the first run, mid-way: a shard being written
        writing = out / ".part-00003.parquet.4242.tmp"
        writing.write_bytes(b"half a shard")
        err = _refused(
            ["--model", str(model_dir), "--data", str(corpus), "--out", str(out), *FAST, "--num-miners", "0"],
            capsys,
        )
        assert "another raycl run is mining into it (pid" in err and writing.exists(), err
        assert not shard_files(out)
    assert _mine(model_dir, corpus, out, "--num-miners", "0", capsys=capsys)["examples"] == N  # free again


def test_shards_and_manifest_are_synced_before_their_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from raycl.miners.corpus import negatives_table
    from raycl.miners.shards import write_shard
    from raycl.records import atomic_write

    events: list[str] = []
    fsync, replace = os.fsync, os.replace

    def spy_fsync(fd: int) -> None:
        events.append("sync " + os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[-1])
        fsync(fd)

    def spy_replace(src: Any, dst: Any) -> None:
        events.append(f"rename {Path(src).name}")
        replace(src, dst)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy_replace)
    writes = {
        "part-00007.parquet": lambda: write_shard(tmp_path, 7, negatives_table([], [])),
        "_mining.json": lambda: atomic_write(tmp_path / "_mining.json", "{}"),
    }
    for name, write in writes.items():
        events.clear()
        write()
        tmp = events[0].removeprefix("sync ")  # a fresh name nobody could guess (raycl.files)
        assert re.fullmatch(rf"\.{re.escape(name)}\.[0-9a-f]{{12}}\.tmp", tmp), tmp
        assert events == [f"sync {tmp}", f"rename {tmp}", f"sync {tmp_path.name}"]  # data, rename, folder entry


def test_a_failing_range_is_recorded_and_the_rerun_mines_only_it(
    model_dir: Path,
    corpus: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = tmp_path / "negs"
    argv = [
        "--model",
        str(model_dir),
        "--data",
        str(corpus),
        "--out",
        str(out),
        *FAST,
        "--num-miners",
        "0",
        "--shard-size",
        "4",
        "--range-retries",
        "1",
    ]
    with monkeypatch.context() as m:  # range 1 raises every time it is mined
        with_faults(m, Chaos(raise_in_ranges=(1,)))
        err = _refused(argv, capsys, status=1)  # default --max-failed-ranges 0: stops at the first
        assert "part-00001.parquet (tiny.m2:14: RuntimeError: chaos: mining range 1 raised)" in err, err
        assert "stopped early" in err
        assert [p.name for p in shard_files(out)] == ["part-00000.parquet"]  # range 2 was never started
        err = _refused([*argv, "--max-failed-ranges", "1"], capsys, status=1)  # goes on with the others
        assert "1 range(s) failed" in err and "the other ranges are mined" in err, err
    assert [p.name for p in shard_files(out)] == ["part-00000.parquet", "part-00002.parquet"]
    failures = json.loads((out / "_failures.json").read_text())
    got = [(f["range"], f["file"], f["first_line"], f["sentences"]) for f in failures]
    assert got == [(1, str(corpus), 14, 4)]
    again = _mine(model_dir, corpus, out, "--num-miners", "0", capsys=capsys)  # the cause is gone: only range 1
    assert again["examples"] == 4 and again["resumed"] == N - 4 and not (out / "_failures.json").exists()


@pytest.mark.slow
def test_a_range_whose_miner_dies_every_time_fails_alone_on_ray(
    ray_local: Any,
    model_dir: Path,
    corpus: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # range 1 kills its miner (os._exit, as an OOM kill would) in every life: Ray restarts the actor and Ray Data
    # gives it the range again, until the attempts counted in OUT run out
    with_faults(monkeypatch, Chaos(die_in_ranges=(1,)))
    out, before = tmp_path / "negs", _miner_actors()
    err = _refused(
        [
            "--model",
            str(model_dir),
            "--data",
            str(corpus),
            "--out",
            str(out),
            *FAST,
            "--num-miners",
            "1",
            "--cpus-per-miner",
            "0.5",
            "--shard-size",
            "4",
            "--range-retries",
            "1",
            "--max-failed-ranges",
            "1",
        ],
        capsys,
        status=1,
    )
    assert "part-00001.parquet (tiny.m2:14: its miner died in each of 2 attempts" in err, err
    assert [p.name for p in shard_files(out)] == ["part-00000.parquet", "part-00002.parquet"]
    assert [f["range"] for f in json.loads((out / "_failures.json").read_text())] == [1]
    assert sum(n for a, n in _miner_actors().items() if a not in before) >= 2  # died twice, restarted twice
