"""The run's shared n-best (``raycl.distributed.nbest``) on the session's local Ray: mined once, reused when its
content key matches, re-mined when the model or D_F changed, resumed after an interruption; and the feed that
lets a trial train on it while it is being mined."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow.parquet as pq
import pytest
import ray
from conftest import ending

from raycl.data.gec import GecExample
from raycl.distributed.messages import MinedBatch, MineTask
from raycl.distributed.miner_pool import MinerFactory
from raycl.distributed.nbest import nbest_records, shared_nbest, start_nbest_stream, wait_nbest
from raycl.miners.beam_search import GEC_BEAM, build_beam_miner, select_from_nbest
from raycl.miners.records import MinedNegatives
from raycl.models.presets import build_model
from raycl.training.batching import global_batches
from raycl.training.negatives import NBestNegatives
from raycl.training.prefetch import Call

WORDS = "the a cat dog sat ran on under mat house is are was were big small".split()
EXAMPLES = [
    GecExample(
        f"d:{i}",
        " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(3 + i % 4)) + " .",
        " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(3 + i % 4)) + " !",
    )
    for i in range(12)
]
OPTIONS = {"k": 2, "beam": 3, "batch_size": 4, "max_len_b": 8, "nbest": True}
MINING = SimpleNamespace(
    num_miners=1, cpus_per_miner=0.25, gpus_per_miner=0.0, resources={}, task_size=4, lease_s=60.0
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    texts = [t for e in EXAMPLES for t in (e.source, e.target)] * 3
    tiny = dict(d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_layers=1, decoder_layers=1)
    out = tmp_path_factory.mktemp("model")
    return ending(build_model("smoke", out_dir=out, texts=texts, vocab_size=200, **tiny))


def _mine(model_dir: Path, out: Path, examples: list[GecExample]) -> tuple[dict, dict]:
    factory = MinerFactory(GEC_BEAM, str(model_dir), OPTIONS)
    said: list[str] = []
    with shared_nbest(
        factory, MINING, examples, out, options={"beam": 3}, model_dir=model_dir, say=said.append, shard_size=4
    ) as stream:
        ray.get(stream.wait_ready.remote([ex.id for ex in examples], 0.0))
        while not ray.get(stream.progress.remote())["complete"]:
            ray.get(stream.wait_ready.remote(["never"], 0.2))
        records = nbest_records(stream)
    return records, {"meta": json.loads((out / "meta.json").read_text()), "said": said}


def test_mined_once_reused_resumed_and_remined_on_change(ray_local, model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "nbest"
    records, info = _mine(model_dir, out, EXAMPLES)
    assert info["meta"]["beam_searched"] == 12 and info["meta"]["complete"]
    # what ran, not the configured "auto": resolved before the miners start, with the versions that decoded
    assert info["meta"]["engine"] in ("hf", "ctranslate2") and info["meta"]["engine_requested"] == "auto"
    assert "transformers" in info["meta"]["engine_versions"]
    assert set(records) == {e.id for e in EXAMPLES}
    # the records are what the miner's own n-best + selection give: a trial selects exactly per-trial negatives
    miner = build_beam_miner(str(model_dir), {**OPTIONS, "nbest": False})  # the pool's engine (auto), in process
    for cl in (True, False):
        miner.source_negative = cl
        want = miner.mine(EXAMPLES)
        got = [select_from_nbest(*records[ex.id], ex, k=2, source_negative=cl) for ex in EXAMPLES]
        assert [m.negatives for m in got] == [m.negatives for m in want]
        for g, w in zip(got, want, strict=True):  # the same S, S(s|s) included
            assert list(g.scores) == pytest.approx(list(w.scores), rel=1e-5)

    again, info = _mine(model_dir, out, EXAMPLES)  # a resumed run: nothing is beam-searched again
    assert info["meta"]["beam_searched"] == 0 and info["meta"]["resumed"] == 12 and again == records
    assert any("reusing" in line for line in info["said"])

    # interrupted: one shard's rows lost (and a half-written temp file) -> only those are mined again
    shards = sorted(out.glob("part-*.parquet"))
    lost = pq.read_table(shards[0], columns=["id"]).column("id").to_pylist()
    assert len(shards) == 3
    shards[0].unlink()  # the first: new rows must not overwrite a kept shard
    (out / ".part-00009.parquet.tmp").write_bytes(b"half")
    again, info = _mine(model_dir, out, EXAMPLES)
    assert info["meta"]["beam_searched"] == len(lost) and again == records

    changed = [*EXAMPLES[:-1], GecExample(EXAMPLES[-1].id, EXAMPLES[-1].source, "another target .")]
    _, info = _mine(model_dir, out, changed)  # D_F changed: its key differs, everything is mined again
    assert info["meta"]["beam_searched"] == 12 and any("changed" in line for line in info["said"])


def test_feed_trains_on_lists_as_they_are_mined(ray_local, tmp_path: Path) -> None:
    """No miners here: the test hands records in by hand, in an order of its choosing, and watches the batches."""
    stream = start_nbest_stream(examples=EXAMPLES, out_dir=str(tmp_path), task_size=4, lease_s=60.0)
    try:

        def share(epoch: int, rank: int) -> list[str]:  # this rank's part of the epoch's global batches
            batches = global_batches(len(EXAMPLES), batch_size=2, seed=epoch, rank=rank, world_size=2)
            return sorted(EXAMPLES[i].id for b in batches for i in b)

        def select(nbest, source_score, ex):  # type: ignore[no-untyped-def]
            return [f"{ex.id}/{n}" for n in nbest.negatives]

        def plan(rank: int, epoch: int) -> list[list[int]]:  # the GEC recipe's, once every list is in
            return global_batches(len(EXAMPLES), batch_size=2, seed=epoch, rank=rank, world_size=2)

        def batches(feed: NBestNegatives, epoch: int) -> Iterator[tuple[list[Any], list[list[str]]]]:
            for pool in feed.pools(epoch, 0, None):  # type: ignore[arg-type]
                assert not isinstance(pool, Call)
                yield pool, feed.negatives([ex.id for ex in pool], feed.version)

        feeds = [
            NBestNegatives(
                functools.partial(wait_nbest, stream),
                EXAMPLES,
                functools.partial(plan, r),
                batch_size=2,
                select=select,
                poll_s=0.05,
            )
            for r in range(2)
        ]
        first_task = ray.get(stream.next_task.remote(0))
        ray.get(stream.put.remote(_records(first_task)))
        it = batches(feeds[0], 0)
        examples, negatives = next(it)  # rank 0's mined examples come first, before the rest exists
        assert {ex.id for ex in examples} <= set(first_task.ids)
        assert negatives == [[f"{ex.id}/{ex.id}~0"] for ex in examples]
        while (task := ray.get(stream.next_task.remote(0))) is not None:
            ray.get(stream.put.remote(_records(task)))
            if ray.get(stream.progress.remote())["complete"]:
                break
        rest = list(it)
        seen = [ex.id for ex in examples] + [ex.id for b, _ in rest for ex in b]
        assert sorted(seen) == share(0, 0) and len(rest) + 1 == 3  # ⌈6 / 2⌉ batches
        for r, feed in enumerate(feeds):  # once all is there: a seeded shuffle, the same batches every time
            e1 = [[ex.id for ex in b] for b, _ in batches(feed, 1)]
            e1_again = [[ex.id for ex in b] for b, _ in batches(feed, 1)]
            assert e1 == e1_again and len(e1) == 3 and sorted(sum(e1, [])) == share(1, r)
        assert sorted(share(1, 0) + share(1, 1)) == sorted(ex.id for ex in EXAMPLES)  # every example, once
        assert feeds[0].metrics()["stream/negatives"] == 6.0
    finally:
        ray.kill(stream)


def _records(task: MineTask) -> MinedBatch:
    """An n-best record per example: one hypothesis, then the source (last), as ``nbest=True`` miners send."""

    records = [MinedNegatives(ex.id, (f"{ex.id}~0", ex.source), (-1.0, -2.0)) for ex in task.items]
    return MinedBatch.of(task, records, model_version=0, miner_id=0)
