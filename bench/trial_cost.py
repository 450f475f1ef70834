"""What one smallest training costs in processes and CPU-seconds: ``python -m raycl.train|tune`` at a recipe's
smoke preset (idiom, one setting, one epoch by default), its process tree sampled from ``/proc`` every
``--every`` seconds — each Ray process by its title (``ray::TrainController``, ``ray::RayTrainWorker``, a miner
actor …), its CPU-seconds (user + system) at the last sample, the largest across its life.

Ray's own services (GCS, raylet, dashboard and their agents) and the CLI's process are reported apart: what a
training adds is the actors and workers (``per_title``). The machine's other load changes wall time much more than
CPU-seconds; repeat (``--repeat``) to see the noise. Runs from the repository root (its raycl is the one measured).
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
INFRA = ("gcs_server", "raylet", "dashboard", "log_monitor", "runtime_env", "monitor.py", "agent")


def _read(pid: int) -> tuple[int, float, str] | None:
    """(parent pid, CPU-seconds, title) of ``pid``, or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK, cmd


def _title(cmd: str) -> str:
    if cmd.startswith("ray::"):
        return cmd.split()[0]
    for name in INFRA:
        if name in cmd:
            return f"infra:{name}"
    return "driver" if "raycl." in cmd else "other:" + cmd[:60]


def _sample(root: int, seen: dict[int, dict[str, Any]]) -> None:
    procs = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (got := _read(int(entry))) is not None:
            procs[int(entry)] = got
    inside, changed = {root}, True
    while changed:
        changed = False  # repeat until no pid joins: a child may be listed before its parent
        for pid, (ppid, _, _) in procs.items():
            if pid not in inside and ppid in inside:
                inside.add(pid)
                changed = True
    for pid in inside & procs.keys():
        _, cpu, cmd = procs[pid]
        row = seen.setdefault(pid, {"cpu": 0.0, "title": "ray::IDLE" if cmd else "other:"})
        row["cpu"] = max(row["cpu"], cpu)
        title = _title(cmd) if cmd else row["title"]  # a process that ended (a zombie) has no command line
        if title != "ray::IDLE" or row["title"] == "ray::IDLE":
            row["title"] = title  # an actor's worker keeps the actor's name once it had it


def measure(argv: list[str], every: float, env: dict[str, str]) -> dict[str, Any]:
    seen: dict[int, dict[str, Any]] = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: nothing blocks on a full pipe meanwhile
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)
        while proc.poll() is None:
            _sample(proc.pid, seen)
            time.sleep(every)
        log.seek(0)
        err = log.read()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{err[-3000:]}")
    groups: dict[str, list[float]] = defaultdict(list)
    for row in seen.values():
        groups[row["title"]].append(round(row["cpu"], 2))
    per_title = {t: {"n": len(c), "cpu_s": round(sum(c), 2), "each": sorted(c)} for t, c in sorted(groups.items())}
    work = {t: g for t, g in per_title.items() if t.startswith("ray::")}
    return {
        "wall_s": round(wall, 1),
        "processes": sum(g["n"] for g in per_title.values()),
        "ray_worker_processes": sum(g["n"] for g in work.values()),
        "ray_worker_cpu_s": round(sum(g["cpu_s"] for g in work.values()), 2),
        "infra_cpu_s": round(sum(g["cpu_s"] for t, g in per_title.items() if t.startswith("infra:")), 2),
        "driver_cpu_s": per_title.get("driver", {}).get("cpu_s"),
        "per_title": per_title,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--verb", choices=["train", "tune"], default="tune")
    ap.add_argument("--space", default="idiom")
    ap.add_argument("--preset", default="smoke")
    ap.add_argument(
        "--set",
        action="append",
        default=None,
        help="overrides (default for idiom: one setting, one epoch, one baseline: two Tune trials)",
    )
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--every", type=float, default=0.05)
    ap.add_argument("--json", action="store_true", help="(always JSON; accepted for the bench/ convention)")
    args = ap.parse_args()
    sets = args.set if args.set is not None else _smallest(args.space)
    runs = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="trial-cost-") as tmp:
            env = {**os.environ, "RAY_ADDRESS": "", "PYTHONPATH": os.getcwd()}
            argv = [sys.executable, "-m", f"raycl.{args.verb}", args.space, "--preset", args.preset]
            argv += ["--out", f"{tmp}/run", *[x for s in sets for x in ("--set", s)]]
            row = measure(argv, args.every, env)
            runs.append(row)
            brief = {k: v for k, v in row.items() if k != "per_title"}
            print(json.dumps({"run": len(runs), **brief}), file=sys.stderr)
    print(
        json.dumps({"argv": f"raycl.{args.verb} {args.space} --preset {args.preset}", "set": sets, "runs": runs})
    )


def _smallest(space: str) -> list[str]:
    if space == "idiom":
        return ["data.setting=zero_shot", "optim.epochs=1", "ladder.baselines=[baseline]"]
    return []


if __name__ == "__main__":
    main()
