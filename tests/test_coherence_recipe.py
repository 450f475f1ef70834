"""The coherence recipe end to end, tiny: a run whose hard negatives are ranked by miner actors while it trains
(staleness 0 here; 1, the eval CLI on its model, and a Tune sweep with baselines are tracked runs of
``test_tracking.py``), the pooled ranking against the in-process miner, and a pickle that tries to import
something refused before anything runs."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from raycl import driver
from raycl.config.tasks import load_space
from raycl.data.coherence import read_pairs
from raycl.recipes import recipe_for
from raycl.recipes.coherence.recipe import train_items
from raycl.report import read_history

TINY = [
    "data.builtin.train=24",
    "data.builtin.dev=6",
    "data.builtin.test=6",
    "data.builtin.intrusion=6",
    "data.builtin.lmvlm=8",
    "data.permute.copies=2",
    "mining.num_rank=4",
    "mining.num_negs=2",
    "mining.rank_every=10",
    "mining.task_size=4",
    "mining.queue_size=12",
    "optim.eval_every=10",
    "eval.num_negs=2",
    "momentum.queue_size=8",
    "scaling.num_workers=0",
    "mining.cpus_per_miner=0.25",
]

COHERENCE = recipe_for("coherence")


def test_a_run_trains_on_negatives_ranked_by_the_miners(ray_local, tmp_path: Path) -> None:
    """Staleness 0; staleness 1 is the tracked training of ``test_tracking.py`` (the same checks, and the eval
    CLI on its model)."""
    space = load_space("coherence", preset="smoke", overrides=[*TINY, "mining.max_staleness=0"])
    check_a_mined_run(tmp_path, driver.run_train(COHERENCE, space, tmp_path), staleness=0)


def check_a_mined_run(tmp_path: Path, summary: dict, staleness: int) -> None:  # type: ignore[type-arg]
    """A smoke run whose hard negatives miner actors ranked while it trained: its outputs, one report every 10
    items, its weight versions and staleness, its scores; with staleness 1 the eval CLI on its model too."""
    for name in ("config.yaml", "results.csv", "best.json", "report.md", "dev_curves.png"):
        assert (tmp_path / name).exists(), name
    history = read_history(tmp_path / "trials" / "train")
    n_items = len(read_pairs(tmp_path / "data" / "train_items.jsonl"))
    assert history[-1]["step"] == n_items  # one pass, batch 1 (no item has fewer than 2 negatives)
    assert [h["step"] for h in history] == [*range(10, n_items, 10), n_items]
    # one weight version per mining chunk after the first (which trains on the items' own negatives)
    assert history[-1]["stream/version"] == (n_items - 1) // 10
    assert max(h["stream/staleness_max"] for h in history) <= staleness
    # each chunk's version is known when the epoch is scheduled: miners wait for it, so nothing is refused
    assert max(h["stream/refused"] for h in history) == 0
    best = summary["best"]
    for key in ("dev_acc", "test/permuted/acc", "test/intrusion/acc", "test/lmvlm/acc"):
        assert 0.0 <= best[key] <= 1.0, key
    assert -1.0 <= best["test/lmvlm/alpha"] <= 1.0 and -1.0 <= best["test/lmvlm/human_alpha"] <= 1.0
    report = (tmp_path / "report.md").read_text()
    assert "Table 1" in report and "| Full model |" in report and "mine_wait" in report
    if staleness == 1:
        _eval_cli_scores_the_trained_model(tmp_path)


def _eval(*args: str) -> dict:
    """``raycl.eval coherence … --json``: its ``main``, called in this process (the module's entry point runs as a
    command in ``test_eval_cli.py``); a fresh interpreter would pay its imports of torch and transformers again."""
    from raycl.eval import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["coherence", *args, "--json"]) == 0
    return json.loads(out.getvalue())


def _eval_cli_scores_the_trained_model(run_dir: Path) -> None:
    data, model = run_dir / "data", str(run_dir / "trials/train/best_model")
    out = _eval(
        "--model",
        model,
        "--pairs",
        str(data / "test.pkl"),
        "--pairs",
        str(data / "intrusion_test.pkl"),
        "--num-negs",
        "1",
    )
    assert out["files"][str(data / "test.pkl")]["n"] == len(read_pairs(data / "test.pkl"))
    best = json.loads((run_dir / "best.json").read_text())
    assert abs(out["files"][str(data / "intrusion_test.pkl")]["accuracy"] - best["test/intrusion/acc"]) < 1e-9
    out = _eval(
        "--model", model, "--pairs", str(data / "lmvlm.pkl"), "--annotations", str(data / "lmvlm_annotations.pkl")
    )
    assert abs(out["alpha"] - best["test/lmvlm/alpha"]) < 1e-9
    assert abs(out["human_alpha"] - best["test/lmvlm/human_alpha"]) < 1e-9


def test_the_pool_ranks_permutations_as_the_in_process_miner(ray_local, tmp_path: Path) -> None:
    from raycl.data.coherence import build_permuted_set
    from raycl.data.coherence_corpus import generate_documents
    from raycl.distributed.messages import MineTask
    from raycl.distributed.miner_pool import MinerFactory, MinerPool
    from raycl.miners.permutation import COHERENCE_RANK, PermutationMiner
    from raycl.models.coherence import CoherenceScorer
    from raycl.models.coherence_presets import build_coherence_model

    items = build_permuted_set(generate_documents(6, seed=3), num_negs=6, copies=1, seed=3)
    model = build_coherence_model("smoke", tmp_path / "m", texts=[s for it in items for s in it.pos], seed=2)
    local = PermutationMiner(CoherenceScorer.from_pretrained(model), num_rank=6, num_negs=3).mine(items)
    pool = MinerPool(
        MinerFactory(COHERENCE_RANK, str(model), {"num_rank": 6, "num_negs": 3}), num_miners=2, cpus_per_miner=0.25
    )
    tasks = [MineTask(0, i, 0, tuple(items[i : i + 2])) for i in range(0, len(items), 2)]
    pooled = {r.id: (r.negatives, r.scores) for b in pool.map(tasks) for r in b.records}
    pool.shutdown()
    for rec in local:
        negatives, scores = pooled[rec.id]
        assert negatives == rec.negatives  # the same three hardest permutations, in the same order
        assert scores == pytest.approx(rec.scores, abs=1e-5)


def sweep_space() -> Any:
    """Two sweep trials side by side, then one baseline (staleness 0 runs in test_a_run_trains_…): the sweep of
    ``test_tracking.py``'s tracked sweep, which checks it with :func:`check_the_sweep`. Every trial trains in its
    own process (``scaling.num_workers=0``: no Ray Train processes; what the tracking callbacks log is Tune's
    report either way), mining while it trains: a Tune trial's negative stream and miners beside a local-mode
    loop. Trials on Ray Train workers: the killed sweep's points (``test_resume_driver.py``), STS's refreshed
    dense row (``test_sts_recipe.py``)."""
    over = [
        *TINY,
        "scaling.num_workers=0",
        "tune.driver_cpus=0.5",
        # side by side in the test's 2-CPU Ray (the smoke preset, a 2-core demo, runs one at a time): a trial's
        # process and miner take 0.5 + 0.25 CPU (a miner's 0.25 or 0.5 gives it the same one thread)
        "tune.max_concurrent_trials=2",
        "mining.cpus_per_miner=0.25",
    ]
    space = load_space("coherence", preset="smoke", overrides=over)
    space.search = {"mining.max_staleness": {"grid": [1]}, "loss.margin": {"grid": [0.1, 0.3]}}
    space.baselines = {"pairwise": space.baselines["pairwise"]}
    return space


def check_the_sweep(ray_local: Any, tmp_path: Path, summary: dict) -> None:  # type: ignore[type-arg]
    assert not summary["failed_trials"]
    assert [r["method"] for r in summary["table"]] == ["Pairwise", "Full model"]
    assert summary["best"]["loss.margin"] in (0.1, 0.3) and summary["best"]["mining.max_staleness"] == 1
    assert (tmp_path / "sweep.png").exists() and (tmp_path / "dev_curves.png").exists()
    import ray._common.test_utils as tu

    tu.wait_for_condition(lambda: ray_local.available_resources().get("CPU", 0) == 2.0, timeout=30)


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {MARKER}",))


MARKER = Path("/tmp/raycl-coherence-pickle-marker")


def test_a_pickle_that_imports_is_refused_before_anything_runs(tmp_path: Path) -> None:
    MARKER.unlink(missing_ok=True)
    evil = tmp_path / "dev.pkl"
    evil.write_bytes(pickle.dumps([{"pos": ["a"], "neg": ["b"], "x": _Evil()}], protocol=3))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "raycl.train",
            "coherence",
            "--preset",
            "smoke",
            "--out",
            str(tmp_path / "run"),
            "--set",
            f"data.dev=[{evil}]",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "system'" in lines[0] and str(evil) in lines[0], lines
    assert not MARKER.exists() and not (tmp_path / "run" / "ray").exists()


def test_pairwise_and_contrastive_baselines_read_items_in_file_order(tmp_path: Path) -> None:
    """The released pairwise and contrastive scripts do not shuffle the training pairs; the momentum one does.
    Each trial orders the run's items (written once, in file order) by its own config."""
    from raycl.config import set_dotted
    from raycl.recipes.coherence.inputs import in_training_order, training_items

    space = load_space("coherence", preset="smoke", overrides=TINY)
    cfg, _ = COHERENCE.with_data(space.config, tmp_path / "data")
    run = driver.Run(cfg, tmp_path, tmp_path / "base_model", [], {})
    COHERENCE.base_model(run)
    written = read_pairs(train_items(run))

    def order(over: dict) -> list[str]:  # what a trial's worker trains on
        return [it.id for it in in_training_order(set_dotted(cfg, over, where="test"), written)]

    in_order = [it.id for it in written]
    assert order({}) == [it.id for it in training_items(cfg)] != in_order  # the full model: shuffled
    for name in ("pairwise", "contrastive", "contrastive_hn"):
        assert order(space.baselines[name]) == in_order, name
    assert order(space.baselines["full_no_hn"]) == order({})


class _Started(Exception):
    pass


@pytest.mark.parametrize("entry", ["raycl.train", "raycl.tune"])
def test_the_embedded_ray_has_the_cpus_two_workers_and_a_miner_reserve(
    tmp_path: Path, monkeypatch, entry: str
) -> None:
    """``raycl.train coherence --preset smoke --set scaling.num_workers=2`` on a 2-core laptop: 2 workers of 1 CPU
    and a miner of 0.5 wait for ever on an embedded Ray of 2 CPUs (Train V2 retries the worker group's start,
    silently). The embedded Ray gets at least what one run reserves."""
    import importlib

    from raycl.distributed import runtime

    started: dict[str, object] = {}

    def init_ray(address: str | None = None, **kwargs: object) -> None:
        started.update(address=address, **kwargs)
        raise _Started

    monkeypatch.setattr(runtime, "init_ray", init_ray)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    spec = load_space("coherence", preset="smoke", overrides=["scaling.num_workers=2"])
    cfg = spec.config
    reserved = 2 * cfg.scaling.cpus_per_worker + cfg.mining.num_miners * cfg.mining.cpus_per_miner
    assert reserved > 2
    with pytest.raises(_Started):
        importlib.import_module(entry).main(
            ["coherence", "--preset", "smoke", "--set", "scaling.num_workers=2", "--out", str(tmp_path / "run")]
        )
    assert started["address"] is None and float(started["num_cpus"]) >= reserved  # type: ignore[arg-type]
