"""Progress that a log can show (``ray job logs``, nohup, CI): a command whose stderr is a pipe prints a progress
line when training moves, no more often than ``RAYCL_PROGRESS_MIN_S`` and at least every ``RAYCL_PROGRESS_MAX_S``
seconds (10 and 30 by default; shortened here), with the step, the loss, the rate and the ETA."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from raycl import progress
from raycl.progress import LineBar, said, say

MIN_S, MAX_S = 0.5, 1.0  # a smoke epoch takes well under a second on an idle machine


def test_a_training_through_a_pipe_prints_lines_within_the_asked_gaps(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAYCL_PROGRESS"}
    env.update(RAY_ADDRESS="", RAYCL_PROGRESS_MIN_S=str(MIN_S), RAYCL_PROGRESS_MAX_S=str(MAX_S))
    sets = ["scaling.num_workers=0", "data.setting=zero_shot", "optim.epochs=24"]
    cmd = [
        sys.executable,
        "-m",
        "raycl.train",
        "idiom",
        "--preset",
        "smoke",
        "--out",
        str(tmp_path / "run"),
        *(a for s in sets for a in ("--set", s)),
    ]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    lines = [(time.monotonic(), line.rstrip("\n")) for line in proc.stderr]
    assert proc.wait(timeout=300) == 0, "\n".join(line for _, line in lines[-30:])
    shown = [(t, line) for t, line in lines if line.startswith("[raycl] zero_shot: step ")]
    assert len(shown) >= 3, "\n".join(line for _, line in lines)
    gaps = [b[0] - a[0] for a, b in zip(shown, shown[1:], strict=False)]
    every = [b - a for a, b in zip([start, *(t for t, _ in lines)], [t for t, _ in lines], strict=False)]
    print(
        f"\nlargest gap between progress lines: {max(gaps):.2f} s ({len(shown)} lines, MIN_S {MIN_S}, MAX_S "
        f"{MAX_S}); between any two stderr lines from the start: {max(every):.2f} s ({len(lines)} lines, "
        f"{lines[-1][0] - start:.1f} s)"
    )
    assert max(gaps) <= MAX_S + 1.5 and min(gaps) >= MIN_S - 0.2, (gaps, shown)
    moving = [line for _, line in shown if "step/s" in line]
    assert moving and all(k in moving[-1] for k in ("/216 (", "loss ", "ETA ", "phase ")), moving


def test_a_line_bar_beats_while_nothing_moves_and_says_nothing_new_more_often(monkeypatch, capsys) -> None:
    """An evaluation or a stalled mining: nothing moves, yet a line comes every MAX_S; updates between two lines
    within MIN_S make no line of their own. Each line is stamped when it is seen: a heartbeat is never early, and
    the wait for two of them is bounded (a loaded machine may wake the bar's thread late)."""
    monkeypatch.setenv("RAYCL_PROGRESS_MIN_S", "0.6")
    monkeypatch.setenv("RAYCL_PROGRESS_MAX_S", "1.2")
    start = time.monotonic()
    said()  # the process's last line: the heartbeat counts from it (not before start)
    bar = LineBar(total=10, desc="mining", unit="sent")
    for _ in range(5):
        bar.update(1)  # within MIN_S of the bar's start: no line
    seen: list[tuple[float, str]] = []
    deadline = time.monotonic() + 30
    while len(seen) < 2 and time.monotonic() < deadline:
        seen += [(time.monotonic(), line) for line in capsys.readouterr().err.splitlines()]
        time.sleep(0.02)
    bar._stop.set()
    out = [line for _, line in seen]
    assert len(out) == 2 and all(line.startswith("[raycl] mining: sent 5/10 (50%)") for line in out), out
    assert seen[0][0] - start >= 1.2 and seen[1][0] - start >= 2.4, [t - start for t, _ in seen]


def test_a_bar_started_after_a_line_beats_within_max_s_of_that_line(monkeypatch, capsys) -> None:
    """The next training's bar (or any bar after a ``[raycl]`` line) counts its heartbeat from the process's last
    line, not from its own start: a gap between two lines stays within MAX_S across trainings. Read from the bar,
    not from a clock: a loaded machine may wake its thread late, which says nothing about what it counts from."""
    monkeypatch.setenv("RAYCL_PROGRESS_MIN_S", "0.5")
    monkeypatch.setenv("RAYCL_PROGRESS_MAX_S", "2.0")
    say("a training ended")
    ended = progress._last_line[0]
    time.sleep(0.05)  # the next training starts later
    with LineBar(total=10, desc="next", unit="step") as bar:
        assert bar.beat_from == ended < bar.t0  # its first heartbeat is due at ended + MAX_S, not t0 + MAX_S
    capsys.readouterr()
    monkeypatch.setattr(progress, "_last_line", [time.monotonic() - 10.0])  # the last line, 10 s ago
    with LineBar(total=10, desc="late", unit="step"):  # due at once: the thread's first look (0.5 s) beats
        deadline = time.monotonic() + 30  # bounds the wait for the line, not how soon it comes
        while "late" not in (err := capsys.readouterr().err) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert err.startswith("[raycl] late: step 0/10 (0%)"), err


def test_worker_output_reaches_the_driver_unless_turned_off(monkeypatch) -> None:
    """A job's logs show what Ray's workers print (a Tune trial's progress lines) without any setting."""
    from raycl.distributed import runtime

    monkeypatch.delenv("RAYCL_WORKER_LOGS", raising=False)
    assert runtime._log_to_driver()
    monkeypatch.setenv("RAYCL_WORKER_LOGS", "0")
    assert not runtime._log_to_driver()
    monkeypatch.setenv("RAYCL_PROGRESS", "lines")
    assert runtime._propagated_env()["RAYCL_PROGRESS"] == "lines"  # the driver's choice, for its workers


# A run that ends in a UserError while a Ray worker of it still prints (as a Ray Train controller prints its own
# report of the error that ended the run): `python -m raycl.train`'s driver with its `run` replaced by one that
# starts such a worker on the Ray the command started, lets its output stream, then fails.
CHATTY_RUN = """
import sys, threading, time
from raycl import cli
from raycl.errors import UserError


def failing_run(space, run_dir, *, sweep, track=None):
    import ray

    @ray.remote(num_cpus=0)
    class Chatter:
        def start(self):
            def chat():
                while True:
                    print("worker output", file=sys.stderr, flush=True)
                    time.sleep(0.005)

            threading.Thread(target=chat, daemon=True).start()
            return True

    chatter = Chatter.remote()
    ray.get(chatter.start.remote(), timeout=120)
    time.sleep(3)  # its lines stream to the driver meanwhile
    raise UserError("the run failed")


cli.run = failing_run
from raycl.train import main

main(["idiom", "--preset", "smoke", "--out", sys.argv[1]])
"""


def test_a_run_s_one_line_error_is_the_last_line_though_its_workers_still_print(tmp_path: Path) -> None:
    """The error's line comes after everything Ray streamed from the run's workers (the command leaves its Ray
    first): seen in CI as a controller's traceback printed after raycl's line."""
    env = {k: v for k, v in os.environ.items() if k != "RAYCL_WORKER_LOGS"}
    done = subprocess.run(
        [sys.executable, "-c", CHATTY_RUN, str(tmp_path / "run")],
        env={**env, "RAY_ADDRESS": "", "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr[-3000:]
    assert any("worker output" in line for line in lines), done.stderr[-3000:]  # the worker's output streamed
    assert lines[-1] == "raycl: error: the run failed", lines[-5:]


def test_every_environment_variable_raycl_reads_is_in_the_documented_table() -> None:
    root = Path(__file__).resolve().parents[1]
    code = "\n".join(p.read_text(encoding="utf-8") for p in (root / "raycl").rglob("*.py"))
    read = set(re.findall(r"""(?:environ\.get|getenv)\(\s*["']([A-Z_][A-Z0-9_]*)["']""", code))
    read |= set(re.findall(r"""environ\[["']([A-Z_][A-Z0-9_]*)["']\]""", code))
    keep = re.search(r"keep = \(([^)]*)\)", (root / "raycl/distributed/runtime.py").read_text(encoding="utf-8"))
    assert keep is not None
    read |= set(re.findall(r'"([A-Z_][A-Z0-9_]*)"', keep.group(1)))  # passed on to the workers
    page = (root / "docs" / "commands.md").read_text(encoding="utf-8")  # its "Environment variables" table
    table = page.split("\n## Environment variables\n", 1)[1].split("\n#", 1)[0]
    named = set(
        re.findall(
            r"`([A-Z_][A-Z0-9_]*)`", "\n".join(r.split("|")[1] for r in table.splitlines() if r.startswith("| `"))
        )
    )
    assert read - {"RAY_AIR_NEW_OUTPUT", "RAY_TRAIN_V2_ENABLED"} <= named, sorted(read - named)
