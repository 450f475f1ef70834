"""Two Rays on one machine: each run's Ray processes know their own cluster's address. Ray's State API without
an address (what Ray's own helpers in a run's processes call, and a user's callback may) otherwise looks at the
machine and fails beside another Ray: ``ConnectionError: Found multiple active Ray instances``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# a second embedded Ray (raycl's), beside the test session's: a detached actor made by an actor — where Train's
# cleaner runs — asks the State API for its own cluster's actors without an address
PROBE = """
import json, os, ray
from raycl.distributed.runtime import init_ray

init_ray(num_cpus=1)


@ray.remote(num_cpus=0)
class Probe:
    def ask(self):
        from ray.util.state import list_actors
        try:
            names = [a.class_name for a in list_actors(limit=50)]
            return {"ok": True, "sees_itself": "Probe" in names, "address": os.environ.get("RAY_ADDRESS")}
        except Exception as err:
            return {"ok": False, "error": f"{type(err).__name__}: {err}"[:300]}


@ray.remote(num_cpus=0)
class Controller:
    def probe(self):
        probe = Probe.options(lifetime="detached", name="raycl-probe", namespace="probe").remote()
        try:
            return ray.get(probe.ask.remote())
        finally:
            ray.kill(probe)


got = ray.get(Controller.remote().probe.remote())
print(json.dumps({**got, "gcs": ray.get_runtime_context().gcs_address}))
"""


def test_ray_processes_of_a_run_know_their_own_cluster_beside_another_ray(ray_local) -> None:  # noqa: ANN001
    """About 10 s on 2 cores (a second Ray with its dashboard)."""
    assert ray_local.is_initialized()  # the session's Ray: the other instance on this machine
    env = {**os.environ, "RAY_ADDRESS": "", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["ok"], got["error"]
    assert got["sees_itself"] and got["address"] == got["gcs"]
    assert got["gcs"] != ray_local.get_runtime_context().gcs_address
