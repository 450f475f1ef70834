"""The GEC recipe end to end, small: in-process (Ray Train local mode) and as a Tune sweep on a local Ray."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import GEC_TINY

from raycl import driver
from raycl.config.tasks import load_space
from raycl.data.m2 import read_m2
from raycl.recipes import recipe_for
from raycl.recipes.gec.report import FN_DROPPED

gec = recipe_for("gec")

TINY = GEC_TINY


def test_train_in_process_writes_every_output(ray_local, tmp_path: Path) -> None:
    """Trainer in-process (Ray Train local mode), miners as actors on the local Ray."""
    space = load_space("gec_pd", preset="smoke", overrides=[*TINY, "scaling.num_workers=0"])
    summary = driver.run_train(gec, space, tmp_path)
    for name in ("config.yaml", "results.csv", "best.json", "report.md", "negatives.parquet", "dev_curves.png"):
        assert (tmp_path / name).exists(), name
    assert (tmp_path / "base_model" / "config.json").exists()
    best = summary["best"]
    for key in ("dev_f05", "test/S/f05", "test/G/p", "test/G/ann0/f05", "test/G/ann1/f05", "test/S/oe"):
        assert key in best and 0.0 <= best[key] <= 1.0, key
    assert 0.0 <= best["timing/mine_wait_fraction"] <= 1.0 and best["stream/staleness_max"] == 0.0
    table = (tmp_path / "report.md").read_text()
    assert "Table 2" in table and "| CL " in table and "Table 1" in table
    negs = pq.read_table(tmp_path / "negatives.parquet").to_pylist()
    assert {"id", "source", "target", "negatives", "scores", "model_version"} <= set(negs[0])
    assert len(negs) == 40 and {r["model_version"] for r in negs} == {0}  # the paper: all from the base model
    for row in negs:
        assert row["target"] not in row["negatives"] and len(row["negatives"]) == len(set(row["negatives"]))
        assert len(row["negatives"]) <= 2 + (row["source"] != row["target"])
        if row["source"] != row["target"]:
            assert row["negatives"][-1] == row["source"]  # CL: the source is a negative (strategy 2)


def test_builtin_dev_and_test_have_two_annotators(tmp_path: Path) -> None:
    cfg, filled = gec.with_data(load_space("gec_pd", preset="smoke", overrides=TINY).config, tmp_path)
    assert filled == ["train", "finetune", "dev", "test"] and set(cfg.data.test) == {"S", "G"}
    sents = read_m2(cfg.data.test["G"][0])
    assert {a for s in sents for a in s.annotators()} == {0, 1}


def test_tune_sweep_and_baselines_on_local_ray(ray_local, tmp_path: Path) -> None:
    # every trial trains in its own process (scaling.num_workers=0: no Ray Train controller, worker or helper
    # actors; the four baselines alone took 148 s on Ray Train, 84 s so); a sweep on Ray Train workers, killed and
    # resumed: test_resume_driver.py
    over = [*TINY, "scaling.num_workers=0", "tune.driver_cpus=0.5", "tune.max_concurrent_trials=2"]
    space = load_space("gec_pd", preset="smoke", overrides=over)
    space.search = {"loss.margin": {"grid": [0.25, 0.85]}, "mining.k": {"grid": [2]}}
    summary = driver.run_tune(gec, space, tmp_path)
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert sorted(r["method"] for r in rows) == sorted(["CL", "CL", "DI", "NLL", "CL⁻", FN_DROPPED])
    assert not summary["failed_trials"] and summary["trials"] == len(rows)
    assert [r["method"] for r in summary["table"]] == ["DI", "NLL", "CL⁻", "CL", FN_DROPPED]
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["loss.margin"] in (0.25, 0.85) and "test/S/f05" in best
    di = next(r for r in summary["table"] if r["method"] == "DI")
    assert di["epoch"] == 0 and "test/G/f05" in di  # direct inference: the base model, no fine-tuning
    assert (tmp_path / "sweep.png").exists()
    _check_mined_once(tmp_path, space.config)
    _check_false_negatives(tmp_path, rows, summary)
    # every trial's CPUs are back once the sweep is over (its placement group released)
    import ray._common.test_utils as tu

    tu.wait_for_condition(lambda: ray_local.available_resources().get("CPU", 0) == 2.0, timeout=30)


def _check_false_negatives(run_dir: Path, rows: list[dict[str, str]], summary: dict) -> None:  # type: ignore[type-arg]
    """Issue 24: each contrastive trial counted its selection's false negatives (before any drop), the report shows
    the rates and the sign test of the ladder's row without them against CL, from the kept test hypotheses."""
    by = {r["method"]: r for r in rows if r["method"] != "CL" or r["trial_id"] == summary["best"]["trial_id"]}
    counts = {
        m: [int(by[m][f"fn/{k}_{w}"]) for k in ("source", "beam") for w in ("selected", "refuted")]
        for m in ("CL", "CL⁻", FN_DROPPED)
    }
    assert counts[FN_DROPPED] == counts["CL"] and counts["CL"][1] > 0  # one selection, counted before the drop
    assert not by["NLL"].get("fn/source_selected")  # no negatives, no counts
    for method in ("CL", FN_DROPPED):  # recomputed from the trial's own negatives and references
        table = pq.read_table(run_dir / "trials" / by[method]["trial_id"] / "negatives.parquet").to_pylist()
        refuted = [n for r in table for n in r["negatives"] if n in r["references"] and n != r["target"]]
        assert len(refuted) == (counts["CL"][1] + counts["CL"][3] if method == "CL" else 0), method
    report = (run_dir / "report.md").read_text()
    assert "False negatives" in report and f"| {FN_DROPPED} |" in report
    assert f"Sign test, {FN_DROPPED} better than CL" in report and "p = " in report
    for method in ("CL", FN_DROPPED):
        assert (run_dir / "trials" / by[method]["trial_id"] / "test_hyps" / "S.txt").exists()


def test_malformed_m2_in_a_run_exits_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.m2"
    bad.write_text("S one two three\nA 1 9|||R:NOUN|||x|||REQUIRED|||-NONE-|||0\n")
    sets = [a for t in [*TINY, f"data.finetune={bad}", "scaling.num_workers=0"] for a in ("--set", t)]
    cmd = [sys.executable, "-m", "raycl.train", "gec_pd", "--preset", "smoke", "--out", str(tmp_path / "run")]
    proc = subprocess.run(
        [*cmd, *sets],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert f"{bad}:2:" in last and "Traceback" not in proc.stderr


def _check_mined_once(run_dir: Path, cfg) -> None:  # type: ignore[no-untyped-def]
    """Version-0 negatives: the run beam-searched every D_F sentence once, no trial ran miners of its own, and each
    trial's negatives are those today's per-trial miner (``BeamSearchMiner.mine``) gives for its k and CL/CL⁻."""
    from raycl.data.gec import load_examples
    from raycl.miners.beam_search import build_beam_miner

    meta = json.loads((run_dir / "nbest" / "meta.json").read_text())
    finetune = load_examples([str(p) for p in sorted((run_dir / "data").glob("finetune*"))])
    assert meta["complete"] and meta["examples"] == len(finetune) == 40
    assert meta["beam_searched"] == 40  # once per sentence, for 3 contrastive trials (2 CL points and CL⁻)
    report = (run_dir / "report.md").read_text()
    assert "mined once for the whole run" in report and "engine ctranslate2 (auto)" in report
    method = {r["trial_id"]: r["method"] for r in csv.DictReader(open(run_dir / "results.csv"))}
    trials = [d for d in (run_dir / "trials").iterdir() if (d / "negatives.parquet").exists()]
    assert sorted(method[d.name] for d in trials) == ["CL", "CL", FN_DROPPED, "CL⁻"]
    assert not any((d / "mining.json").exists() for d in trials)  # no trial had a miner pool of its own
    # mining.engine=auto mined with CTranslate2 (a BART it converts): the base model's one conversion is cached
    from raycl.models.ct2_engine import _cache_root

    ct2 = _cache_root(run_dir / "base_model")
    assert [p.name.split("-")[0] for p in ct2.iterdir() if p.is_dir() and not p.name.startswith(".")] == ["v0"]
    m = cfg.mining
    for d in trials:
        got = {r["id"]: r["negatives"] for r in pq.read_table(d / "negatives.parquet").to_pylist()}
        cl, drop = method[d.name] != "CL⁻", method[d.name] == FN_DROPPED
        miner = build_beam_miner(
            str(run_dir / "base_model"),
            {  # a per-trial miner, as before: same engine
                "k": m.k,
                "beam": m.beam,
                "source_negative": cl,
                "max_len_b": m.max_len_b,
                "batch_size": m.task_size,
                "engine": m.engine,
                "precision": m.precision,
                "false_negatives": "drop" if drop else "keep",
            },
        )
        want = {r.id: list(r.negatives) for r in miner.mine(finetune)}
        assert got == want, (d.name, method[d.name])


def test_a_trial_in_its_own_process_is_the_one_worker_and_refuses_a_gpu() -> None:
    """``scaling.num_workers=0`` in a sweep (the baselines of the sweep test above train so): the trial is rank 0
    of 1, and asked for a GPU (``scaling.use_gpu``) it says in one line that its bundle holds none."""
    from raycl.distributed.session import TuneTrialSession
    from raycl.errors import UserError

    session = TuneTrialSession()
    assert session.world() == (0, 1)
    with pytest.raises(UserError, match="scaling.use_gpu=true with scaling.num_workers=0 in a sweep"):
        session.device()
