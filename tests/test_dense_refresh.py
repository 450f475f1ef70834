"""Dense negatives refreshed while training (``mining.refresh``), on a real local Ray: the miners re-embed the
corpus with each published weight version and select as the static pool does; the trainer never reads a negative
staler than ``mining.max_staleness``; a miner killed mid-round loses and duplicates no anchor; bad settings end in
one line, exit 2."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from raycl.config.tasks import load_space
from raycl.errors import UserError
from raycl.models.sentence_encoder import SentenceEncoder, build_sentence_encoder
from raycl.recipes import recipe_for

sts = recipe_for("sts")
REFRESH = [
    "mining.dense=true",
    "mining.pool=8",
    "mining.refresh=true",
    "mining.refresh_every=2",
    "mining.cpus_per_miner=0.25",
    "mining.task_size=8",
]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _pool_selection(cfg: Any, model: Path, out: Path) -> dict[str, list[str]]:
    """The static path: a pool mined in this process with ``model`` (``mine_dense_negatives``), the trial's
    selection from it."""
    from raycl.distributed.dense_api import mine_pool
    from raycl.miners.dense_io import read_anchor_negatives as read_negatives
    from raycl.recipes.sts.negatives import checked_pairs

    pool = read_negatives(
        mine_pool(*checked_pairs(cfg), model, out, pool=cfg.mining.pool, batch_size=cfg.eval.batch_size)
    )
    return {a: n for a, v in pool.items() if (n := v.select(cfg.mining, anchor=a))}


def _table(refreshed: Any) -> dict[str, list[str]]:
    return {a: n for a, (n, _) in refreshed.table.items() if n}


def test_miners_re_mine_with_each_version_as_the_pool_would_and_a_killed_miner_loses_no_anchor(
    ray_local, tmp_path: Path
) -> None:
    """Two miners, one killed after its first task (before handing it back). Round 1 (version 1 = the base
    weights) equals the static pool's selection with its margin; after the weights change, round 2 (version 2)
    equals a pool mined afresh with the changed model — the corpus was embedded again — and differs from round 1.
    Every anchor arrives once per round. Right after a publication, with no wait, every version-2 entry is past
    the bound (``max_staleness`` 0) and reads as absent."""
    from raycl.distributed.dense_refresh_feed import RefreshedNegatives
    from raycl.distributed.miner_pool import MinerFactory
    from raycl.distributed.mining_service import MiningService
    from raycl.miners.dense_io import read_anchor_negatives as read_negatives
    from raycl.recipes.sts.recipe import KIND, miner_options, mining_section
    from raycl.testing.faults import Chaos
    from raycl.training.negatives.dense import refresh_anchors, selected

    space = load_space(
        "sts",
        preset="smoke",
        overrides=[
            *REFRESH,
            "mining.num_negatives=2",
            "mining.num_miners=2",
            "mining.relative_margin=0.003",
            "mining.max_staleness=0",
        ],
    )
    cfg, _ = sts.with_data(space.config, tmp_path / "data")
    from raycl.recipes.sts.negatives import checked_pairs

    rows, corpus = checked_pairs(cfg)
    base = build_sentence_encoder("smoke", tmp_path / "base", texts=corpus, seed=0)
    options = miner_options(cfg, tmp_path / "refresh")
    factory = MinerFactory(KIND, str(base), options, faults=Chaos(fail_after_tasks=1, miners=(0,)))
    service = MiningService.start(factory, mining_section(cfg), world_size=1, seed=0)
    try:
        service.pool.ready()  # both built and asking: round 1's first tasks go to both, miner 0 dies holding one
        anchors = refresh_anchors(rows, 1)  # the rows a refreshing STS trial re-mines
        got = RefreshedNegatives(
            {},
            anchors,
            stream=service.stream,
            store=service.store,
            rank=0,
            world_size=1,
            refresh_every=1,
            max_staleness=0,
            wait_s=120,
        )
        model = SentenceEncoder.from_pretrained(base)
        got.after_update(1, model)  # version 1: the base weights
        n = len(anchors[0])
        assert got.counts["received"] == n and got.counts["rounds_done"] == 1 and got.counts["duplicates"] == 0
        assert {v for _, v in got.table.values()} == {1}
        assert service.stats()["reassigned"] > 0  # the killed miner's task went back and was mined again
        first = _table(got)
        assert len(first) > n // 4 and all(a not in negs for a, negs in first.items())
        assert first == _pool_selection(cfg, base, tmp_path / "pool1")
        pool = read_negatives(tmp_path / "pool1")  # the static path never hands an anchor its own copy either
        assert any(a in v.negatives[:2] for a, v in pool.items())  # its nearest text, in the pool
        static = selected(dataclasses.replace(cfg.mining, relative_margin=None, negatives=str(tmp_path / "pool1")))
        assert static and all(a not in negs and len(negs) == 2 for a, negs in static.items())
        with torch.no_grad():  # another model: the negatives must follow it
            torch.manual_seed(1)
            for p in model.encoder.parameters():
                p.add_(0.5 * torch.randn_like(p) * p.std().nan_to_num(0.02))
        got.after_update(2, model)  # version 2
        assert got.counts["received"] == 2 * n and got.counts["duplicates"] == 0
        assert {v for _, v in got.table.values()} == {2} and got.counts["mined_version_max"] == 2
        second = _table(got)
        assert second != first
        model.save_pretrained(tmp_path / "v2")
        assert second == _pool_selection(cfg, tmp_path / "v2", tmp_path / "pool2")
        assert {a: got.get(a) for a in second} == second and got.counts["staleness_max"] == 0
        got.wait_s = 0.0
        got.after_update(3, model)  # version 3, no wait: nothing mined with 3 taken yet
        assert [got.get(a) for a in second] == [None] * len(second)
        assert got.counts["skipped_stale"] == len(second)
    finally:
        service.close()


def test_refresh_settings_are_checked_in_one_line(tmp_path: Path) -> None:
    for bad, line in (
        ("mining.refresh_every=0", "mining.refresh_every': expected an integer ≥ 1 with mining.refresh"),
        ("mining.max_staleness=-1", "mining.max_staleness': expected an integer ≥ 0"),
        ("mining.num_miners=0", "mining.num_miners': expected an integer ≥ 1"),
        ("mining.wait_s=-2", "mining.wait_s': expected a number of seconds ≥ 0"),
    ):
        with pytest.raises(UserError, match=line):
            load_space(
                "sts", overrides=["mining.dense=true", "mining.refresh=true", "mining.refresh_every=5", bad]
            )
    cfg = load_space("sts", overrides=["mining.refresh=true", "mining.refresh_every=5"]).config
    dense = dataclasses.replace(cfg, mining=dataclasses.replace(cfg.mining, dense=True))
    assert not cfg.refreshes and dense.refreshes  # a rung without dense negatives refreshes none
    out = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "raycl.train",
            "sts",
            "--preset",
            "smoke",
            "--out",
            str(out),
            "--set",
            "mining.dense=true",
            "--set",
            "mining.refresh=true",
            "--set",
            "mining.refresh_every=0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAY_ADDRESS": ""},
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().count("\n") == 0
    assert "config key 'mining.refresh_every': expected an integer ≥ 1 with mining.refresh" in done.stderr
    assert not (out / "ray").exists()
