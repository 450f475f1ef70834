"""Where the test suite's CPU goes: ``pytest`` (by default ``make test``'s command: two pytest-xdist workers) as a
subprocess, its whole process tree sampled from ``/proc`` every ``--every`` seconds, each process's CPU-seconds
(user + system) attributed to what it was at each sample:

- ``pytest``: the pytest processes themselves (the tests' own Python, models trained in-process);
- ``raycl CLIs``: ``python -m raycl.VERB`` subprocesses the tests start (their drivers, not their Rays);
- ``Ray services``: GCS, raylet, dashboard (and its head processes), log monitor, autoscaler monitor, agents —
  of the session's Ray and of every Ray a CLI starts;
- ``Ray worker start``: a Ray worker process before it runs anything named (``default_worker.py``, then
  ``ray::IDLE``) — the interpreter, ``import ray``, and the imports of the class or function it is handed;
- ``Ray tasks and actors``: by title (``ray::RayTrainWorker``, ``ray::TrainController``, a Tune trial's
  ``ray::ImplicitFunc``, miners, Ray Data's map workers …), each with how many processes had it.

A suite on 2 cores is CPU-bound: its wall time follows its CPU-seconds, and these say what a faster suite must
start less of. Processes are told apart by pid and start time (pids wrap in a long suite); one that lives less
than a sampling interval may be missed (``--every`` smaller sees more and costs more). Runs from the repository
root with the project's environment; prints one JSON object.

Usage::

    .venv/bin/python bench/suite_cost.py                          # make test's pytest command
    .venv/bin/python bench/suite_cost.py -- -q tests/test_storage.py  # any pytest arguments
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")
MAKE_TEST = ["-q", "-m", "not cluster", "-n", "2", "--dist", "loadfile", "--no-loadscope-reorder", "tests"]
SERVICES = (
    "dashboard",
    "log_monitor.py",
    "monitor.py",
    "runtime_env",
    "multiprocessing.forkserver",
    "multiprocessing.resource_tracker",
)
SERVICE_TITLES = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")
STARTING = ("default_worker.py", "ray::IDLE")


def kind(cmd: str) -> tuple[str, str]:
    """(group, title) of a process from its command line (``ray::…`` titles as Ray sets them)."""
    first = cmd.split(" ", 1)[0]
    if cmd.startswith(SERVICE_TITLES) or first.endswith(("/raylet", "/gcs_server")):  # raylet's arguments name
        return "Ray services", Path(first).name  # default_worker.py and the dashboard's agent
    if cmd.startswith("ray::IDLE") or ("default_worker.py" in cmd and not cmd.startswith("ray::")):
        return "Ray worker start", "ray::IDLE"
    if cmd.startswith("ray::"):
        return "Ray tasks and actors", cmd.split()[0].split(".")[0].removesuffix(")")
    if cmd.startswith("ray-dashboard-"):
        return "Ray services", "dashboard"
    for name in SERVICES:
        if name in cmd:
            return "Ray services", name.split("/")[-1]
    args = cmd.split()
    if "-m" in args[:-1] and args[args.index("-m") + 1].startswith("raycl."):
        return "raycl CLIs", args[args.index("-m") + 1]
    if "pytest" in cmd or "execnet" in cmd:
        return "pytest", "pytest"
    return "other", " ".join(Path(a).name for a in args[:2])[:60]


def _processes() -> dict[int, tuple[int, int, float, str]]:
    """pid → (parent pid, start time in ticks, CPU-seconds, command line) of every process readable now."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        f = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": ppid 1, utime 11, stime 12, start 19
        out[int(entry)] = (int(f[1]), int(f[19]), (int(f[11]) + int(f[12])) / TICK, cmd.strip())
    return out


class Sampler:
    """CPU deltas of a process tree, by group and title; a process stays counted after it is re-parented."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.cpu: dict[tuple[int, int], float] = {}  # (pid, start) → CPU-seconds at its last sample
        self.by_group: dict[str, float] = defaultdict(float)
        self.by_title: dict[str, float] = defaultdict(float)
        self.titled: dict[str, set[tuple[int, int]]] = defaultdict(set)

    def sample(self) -> None:
        procs = _processes()
        inside = {pid for pid, (_, start, _, _) in procs.items() if (pid, start) in self.cpu} | {self.root}
        changed = True
        while changed:  # a child may be listed before its parent
            changed = False
            for pid, (ppid, _, _, _) in procs.items():
                if pid not in inside and ppid in inside:
                    inside.add(pid)
                    changed = True
        for pid in inside & procs.keys():
            _, start, cpu, cmd = procs[pid]
            if not cmd:  # a zombie: its CPU was counted while it ran
                continue
            key = (pid, start)
            delta = cpu - self.cpu.get(key, 0.0)
            self.cpu[key] = cpu
            group, title = kind(cmd)
            self.titled[title].add(key)
            if delta > 0:
                self.by_group[group] += delta
                self.by_title[title] += delta

    def result(self, top: int) -> dict[str, Any]:
        titles = sorted(self.by_title.items(), key=lambda kv: -kv[1])[:top]
        return {
            "cpu_s": round(sum(self.by_group.values()), 1),
            "processes": len(self.cpu),
            "by_group": {g: round(v, 1) for g, v in sorted(self.by_group.items(), key=lambda kv: -kv[1])},
            "by_title": {t: {"n": len(self.titled[t]), "cpu_s": round(v, 1)} for t, v in titles},
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", type=float, default=0.25, help="seconds between samples of /proc")
    ap.add_argument("--top", type=int, default=40, help="titles listed, most CPU first")
    ap.add_argument("--json", action="store_true", help="(always JSON; accepted for the bench/ convention)")
    ap.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default: make test's)")
    args = ap.parse_args()
    argv = [sys.executable, "-m", "pytest", *(args.pytest_args or MAKE_TEST)]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: nothing blocks on a full pipe meanwhile
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        sampler = Sampler(proc.pid)
        while proc.poll() is None:
            sampler.sample()
            time.sleep(args.every)
        log.seek(0)
        lines = [line for line in log.read().splitlines() if line.strip()]
    result = {
        "pytest": " ".join(argv[3:]),
        "exit_status": proc.returncode,
        "outcome": lines[-1] if lines else "",
        "wall_s": round(time.perf_counter() - t0, 1),
        "every_s": args.every,
        **sampler.result(args.top),
    }
    print(json.dumps(result, ensure_ascii=False))


if __name__ == "__main__":
    main()
