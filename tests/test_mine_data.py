"""Corpus mining on Ray Data (``raycl.distributed.corpus``) and the library call ``raycl.mine_negatives``,
on the session's local Ray: ranges read from byte offsets, an actor pool of 2, resume by range, one-line errors,
and reading back only the ids a training rank needs."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import ending

import raycl
from raycl.data.gec import GecExample, load_examples
from raycl.data.m2 import Edit, M2Sentence, write_m2
from raycl.errors import UserError
from raycl.miners.beam_search import build_beam_miner
from raycl.miners.corpus import read_range, scan_ranges
from raycl.miners.shards import read_negatives, shard_files
from raycl.models.presets import build_model

WORDS = "the a cat dog sat ran on under mat house is are was were big small".split()
SENTS = [
    M2Sentence(
        " ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(3 + i % 5)) + " .",
        (Edit(0, 1, "R:DET", "A"),) if i % 3 else (),
    )
    for i in range(23)
]
OPTS = dict(k=2, max_len_b=6, batch_size=8)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("corpus")
    write_m2(d / "c.m2", SENTS)
    (d / "c.tsv").write_text("".join(f"{s.source}\t{s.target()}\n" for s in SENTS), encoding="utf-8")
    texts = [t for s in SENTS for t in (s.source, s.target())] * 3
    tiny = dict(d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_layers=1, decoder_layers=1)
    model = ending(build_model("smoke", out_dir=d / "model", texts=texts, vocab_size=200, **tiny))
    return {"m2": d / "c.m2", "tsv": d / "c.tsv", "model": model}


def test_ranges_read_back_exactly_the_whole_file_readers_examples(files: dict[str, Path]) -> None:
    for spec in (str(files["m2"]), str(files["tsv"]), f"{files['m2']}[4:19]", f"{files['tsv']}[-7:]"):
        ranges = list(scan_ranges([spec], range_size=4))
        got = [ex for r in ranges for ex in read_range(r)]
        assert got == load_examples([spec]), spec
        assert [r.index for r in ranges] == list(range(len(ranges))) and all(r.count <= 4 for r in ranges)


def test_actor_pool_equals_in_process_mining_and_resumes_by_range(
    ray_local, files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datasets

    examples = load_examples([str(files["m2"])])
    reference = build_beam_miner(str(files["model"]), {"beam": 3, **OPTS})  # the pool's engine (auto), in process
    want = {m.id: m.negatives for m in reference.mine(examples)}
    out, cache = tmp_path / "negs", tmp_path / "hf-cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    ds = raycl.mine_negatives(
        files["model"],
        [str(files["m2"])],
        num_miners=2,
        cpus_per_miner=0.5,
        out=out,
        shard_size=5,
        progress=False,
        **OPTS,
    )
    assert not list(cache.rglob("*.arrow"))  # the shards are the dataset: not copied into an Arrow cache
    assert ds.column_names == ["id", "source", "target", "negatives", "scores", "model_version", "references"]
    assert {r["id"]: tuple(r["negatives"]) for r in ds} == want
    assert [len(pq.read_table(p)) for p in shard_files(out)] == [5, 5, 5, 5, 3]
    stamps = {p.name: p.stat().st_mtime_ns for p in shard_files(out)}
    shard_files(out)[2].unlink()  # lost: only that range is mined again
    raycl.mine_negatives(
        files["model"],
        [str(files["m2"])],
        num_miners=2,
        cpus_per_miner=0.5,
        out=out,
        shard_size=5,
        progress=False,
        **OPTS,
    )
    again = {p.name: p.stat().st_mtime_ns for p in shard_files(out)}
    assert [n for n in again if again[n] != stamps.get(n)] == ["part-00002.parquet"]
    assert {i: m.negatives for i, m in read_negatives(out).items()} == want
    # a training rank reads only its own rows
    mine = [examples[i].id for i in (0, 7, 22)]
    assert sorted(read_negatives(out, ids=mine)) == sorted(mine)
    assert sorted(read_negatives(out / "part-00000.parquet", ids=mine)) == [examples[0].id]


def test_tsv_and_in_memory_examples(ray_local, files: dict[str, Path]) -> None:
    ds = raycl.mine_negatives(
        files["model"], str(files["tsv"]), num_miners=1, cpus_per_miner=0.5, progress=False, **OPTS
    )
    assert len(ds) == 23 and ds[0]["id"] == "c.tsv:0"
    rows = [
        GecExample("a", "the cat sat .", "The cat sat ."),
        {"id": "b", "source": "a dog .", "target": "a dog ."},
    ]
    local = raycl.mine_negatives(files["model"], rows, num_miners=0, progress=False, **OPTS)
    pooled = raycl.mine_negatives(files["model"], rows, num_miners=1, cpus_per_miner=0.5, progress=False, **OPTS)
    assert local["id"] == pooled["id"] == ["a", "b"] and local["negatives"] == pooled["negatives"]
    assert "a dog ." not in local[1]["negatives"]  # s = t: no source negative


def test_in_memory_examples_write_shards_as_they_come_and_resume_by_id(
    ray_local, files: dict[str, Path], tmp_path: Path
) -> None:
    rows = [{"id": f"m{i}", "source": s.source, "target": s.target()} for i, s in enumerate(SENTS[:9])][::-1]
    opts = {**OPTS, "batch_size": 2}  # five batches come back from a pool of 2, in any order
    out = tmp_path / "negs"
    ds = raycl.mine_negatives(
        files["model"], rows, num_miners=2, cpus_per_miner=0.5, out=out, shard_size=2, progress=False, **opts
    )
    assert ds["id"] == [r["id"] for r in rows]  # the caller's order, not the shards'
    assert sorted(len(pq.read_table(p)) for p in shard_files(out)) == [1, 2, 2, 2, 2]
    want = dict(zip(ds["id"], ds["negatives"], strict=True))
    lost = set(pq.read_table(shard_files(out)[1]).column("id").to_pylist())
    shard_files(out)[1].unlink()
    again = raycl.mine_negatives(files["model"], rows, num_miners=0, out=out, progress=False, **opts)
    assert again["id"] == [r["id"] for r in rows]
    assert dict(zip(again["id"], again["negatives"], strict=True)) == want
    newest = shard_files(out)[-1]  # in index order
    assert set(pq.read_table(newest).column("id").to_pylist()) == lost  # only the lost rows were mined again


def test_a_malformed_line_in_a_range_is_one_line_naming_file_and_line(
    ray_local, files: dict[str, Path], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.m2"
    text = files["m2"].read_text(encoding="utf-8").splitlines()
    text[20] = "X broken line"
    bad.write_text("\n".join(text) + "\n", encoding="utf-8")
    with pytest.raises(UserError) as err:
        raycl.mine_negatives(
            files["model"],
            str(bad),
            num_miners=2,
            cpus_per_miner=0.5,
            out=tmp_path / "o",
            shard_size=4,
            progress=False,
            **OPTS,
        )
    assert "bad.m2:21" in str(err.value) and "\n" not in str(err.value)


def test_relative_paths_reach_remote_miners_absolute(
    ray_local, files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The miners run in Ray's worker processes, whose working directory is not the driver's (on a cluster: not
    even its machine): a relative data spec or OUT given to them as written names another file."""
    import shutil

    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(files["m2"], work / "rel.m2")
    monkeypatch.chdir(work)
    ds = raycl.mine_negatives(
        files["model"],
        "rel.m2[:6]",
        num_miners=1,
        cpus_per_miner=0.5,
        out="negs",
        shard_size=3,
        progress=False,
        **OPTS,
    )
    assert sorted(r["id"] for r in ds) == [f"rel.m2:{i}" for i in range(6)]
    assert [p.name for p in shard_files(work / "negs")] == ["part-00000.parquet", "part-00001.parquet"]
