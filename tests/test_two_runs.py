"""Two raycl sweeps at once on one machine, each on its own embedded Ray, where Tune stops a trial early (ASHA):
both finish. A trial Tune stops leaves its Ray Train workers' placement group for something else to remove. Train's
own cleaner asked the dashboard's State API whether the controller lived: beside another Ray on the machine it
failed (``Found multiple active Ray instances``), and once, in CI, the third trial of one sweep failed after about
``scaling.start_timeout_s`` (a left group, inferred: no logs survived) although each Ray process knew its cluster.
raycl's reaper (``raycl.distributed.placement``) asks the controller itself. Here each trial's driver and worker
fill the 2 CPUs of its Ray, so a left group would stop the sweep. CI saw it once more with the reaper (sweep a's
third trial, the stopped one past its second epoch): a removal that failed ended the reaper's watch, and an abort
or a failed shutdown ended the reaper before the group was gone — all three mended, and it still happened twice in
seven runs of ``make test-cluster`` on a 2-core machine. The timeline this test now prints showed why: Tune
removed the stopped trial's bundle, its worker died first, its controller restarted the worker group on a new
placement group (14 ms after the old one went) before it died too, and the reaper — told of a group only once
it has started — knew only the old one (not mended yet). Each sweep's Ray lives in a folder of the test's own,
and a failure prints its placement groups' timeline and the reaper's lines.

``make test-cluster`` (``-m cluster``): about 3 minutes on 2 cores."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from raycl.records import DONE, read_history

ROOT = Path(__file__).resolve().parents[1]


def _space(tmp_path: Path) -> Path:
    """idiom's smoke sweep over three learning rates, judged by the learning rate a trial reports: ASHA (grace 1,
    reduction 4) stops the second trial at its first report, deterministically; the third runs after it."""
    space = yaml.safe_load((ROOT / "tune_spaces" / "idiom.yaml").read_text(encoding="utf-8"))
    space["baselines"] = {}
    space["presets"]["smoke"].update(
        search={"optim.lr": {"grid": [0.001, 0.0001, 0.001]}},
        ladder={"baselines": [], "settings": []},
        tune={
            "max_concurrent_trials": 1,
            "driver_cpus": 1,
            "scheduler": "asha",
            "grace_period": 1,
            "metric": "lr",
            "mode": "max",
        },
    )
    path = tmp_path / "idiom_two.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False), encoding="utf-8")
    return path


# what a sweep's Ray logs of its placement groups (gcs_server.out), for a failure's message
_GCS_EVENTS = ("Registering placement group", "Successfully created placement group", "is removed successfully")


def _ray_story(ray_tmp: Path) -> str:
    """The placement groups' lives in a sweep's Ray and what raycl said in its workers' logs: the timeline that
    tells which group a waiting trial waited behind (the test's failure message)."""
    lines: list[str] = []
    for logs in sorted(ray_tmp.glob("ray/session_2*/logs")):
        gcs = (logs / "gcs_server.out").read_text(encoding="utf-8", errors="replace").splitlines()
        # "[2026-11-29 05:25:27,345 I 5156 5156] (gcs_server) file.cc:392: what": the time and the what
        lines += [f"{g[12:24]} {g.split(': ', 1)[-1][:140]}" for g in gcs if any(e in g for e in _GCS_EVENTS)]
        for log in sorted(logs.glob("worker-*.err")):
            said = log.read_text(encoding="utf-8", errors="replace").splitlines()
            lines += [f"{log.name[:15]} {w[:200]}" for w in said if "raycl:" in w]
    return "\n".join(lines[-120:])


@pytest.mark.cluster
def test_two_sweeps_at_once_on_one_machine_both_finish(tmp_path: Path) -> None:
    space = _space(tmp_path)
    env = {
        **os.environ,
        "RAY_ADDRESS": "",
        "PYTHONPATH": str(ROOT),
        "RAYCL_WORKER_LOGS": "0",
        "TUNE_DISABLE_STRICT_METRIC_CHECKING": "1",
    }  # a trial's last report (its test scores) has no lr
    sets = ["data.setting=zero_shot", "optim.epochs=2", "scaling.start_timeout_s=240"]
    # each sweep's Ray in a folder of its own, read back if the test fails (short: Ray's socket paths end there)
    ray_tmp = {name: Path(tempfile.mkdtemp(prefix="rc2-")) for name in ("a", "b")}
    try:
        _two_sweeps(tmp_path, space, env, sets, ray_tmp)
    finally:
        for folder in ray_tmp.values():
            shutil.rmtree(folder, ignore_errors=True)


def _two_sweeps(
    tmp_path: Path, space: Path, env: dict[str, str], sets: list[str], ray_tmp: dict[str, Path]
) -> None:
    procs = []
    for name in ("a", "b"):
        cmd = [
            sys.executable,
            "-m",
            "raycl.tune",
            str(space),
            "--preset",
            "smoke",
            "--out",
            str(tmp_path / name),
            *(a for s in sets for a in ("--set", s)),
        ]
        procs.append(
            subprocess.Popen(
                cmd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                env={**env, "RAY_TMPDIR": str(ray_tmp[name])},
            )
        )
        time.sleep(2)  # both Rays up while the other runs
    errs = [p.communicate(timeout=900)[1] for p in procs]
    for p, err in zip(procs, errs, strict=True):
        assert p.returncode == 0, err[-4000:]
    for name, err in zip(("a", "b"), errs, strict=True):
        trials = sorted((tmp_path / name / "trials").iterdir())
        with (tmp_path / name / "results.csv").open(encoding="utf-8") as f:  # a failed trial's error, to say why
            why = {r["trial_id"]: r["error"] for r in csv.DictReader(f) if r.get("error")}
        reports = [len([r for r in read_history(t) if "epoch" in r and "final" not in r]) for t in trials]
        # ASHA stops the low-lr trial at its first report; the stop reaches a trial this small when it may already
        # have reported its second epoch (seen once: [2, 2, 2]): the stopped one is told by its missing done.json
        ended = [(t / DONE).exists() for t in trials]
        assert len(trials) == 3 and ended == [True, False, True] and reports[1] >= 1 and not why, (
            f"sweep {name}: epochs reported {reports}, ended {ended}, errors {why}\n{err[-3000:]}\n"
            f"its Ray's placement groups:\n{_ray_story(ray_tmp[name])}"
        )
