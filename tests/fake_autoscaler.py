"""An autoscaling Ray cluster on this machine, its node types read from ``cluster.yaml`` (or ``cluster-s3.yaml``).

Ray's ``fake_multinode`` provider starts raylets on this machine as the autoscaler's "nodes" (GPUs are resources
only: no CUDA behind them). ``ray up`` cannot drive it in Ray 2.60 (``KeyError: 'node'`` in the provider), so the
head is started as cluster.yaml's own ``head_start_ray_commands`` start it — ``ray start --head
--autoscaling-config=…`` with ``RAY_AUTH_MODE=token`` — on a port and temp dir of its own (other Rays may run
here), the config written from cluster.yaml's node types scaled to this machine: the head type renamed
``ray.head.default`` (the provider's fixed name), CPUs capped to the cores here, at most one node of each worker
type, a short idle timeout. Ended by PID with SIGTERM, never ``ray stop``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))
HEAD_TYPE = "ray.head.default"  # the fake provider hard-codes the head's type name


def scaled(cluster_file: str = "cluster.yaml", *, cores: int = 2, idle_minutes: float = 0.1) -> dict[str, Any]:
    """``cluster_file``'s node types for the fake provider: same names, resources and min workers; CPUs capped to
    ``cores``, one node at most of each worker type, ``idle_minutes`` to scale down."""
    raw = yaml.safe_load((ROOT / cluster_file).read_text())
    types: dict[str, Any] = {}
    for name, node in raw["available_node_types"].items():
        res = {k: (min(float(v), cores) if k == "CPU" else float(v)) for k, v in node["resources"].items() if v}
        head = name == raw["head_node_type"]
        types[HEAD_TYPE if head else name] = {
            "resources": res,
            "node_config": {},
            "min_workers": 0 if head else min(node.get("min_workers", 0), 1),
            "max_workers": 0 if head else min(node.get("max_workers", 1), 1),
        }
    return {"types": types, "head": raw["head_node_type"]}


@dataclass
class FakeCluster:
    address: str  # 127.0.0.1:PORT, what --address takes
    token: str
    env: dict[str, str]  # a client's environment: token auth, this checkout's raycl
    config: Path  # the autoscaler's config (what `--autoscaling-config` names)
    types: dict[str, Any]
    log: Path

    def raycl(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``python -m raycl.ARGS --address`` this cluster, as a user on the head would run it."""
        return subprocess.run(
            [sys.executable, "-m", *args, "--address", self.address],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def popen(self, *args: str, out: Path) -> subprocess.Popen[str]:
        with open(out, "w") as f:
            return subprocess.Popen(
                [sys.executable, "-m", *args, "--address", self.address],
                env=self.env,
                cwd=ROOT,
                stdout=f,
                stderr=subprocess.STDOUT,
                text=True,
            )

    def python(self, code: str, timeout: float = 60) -> Any:
        """Run ``code`` as a driver of this cluster; its last stdout line, parsed as JSON."""
        done = subprocess.run(
            [sys.executable, "-c", code],
            env={**self.env, "RAY_ADDRESS": self.address},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


NODES = """
import json, ray
ray.init(address="{address}", log_to_driver=False)
print(json.dumps([{{"id": n["NodeID"], "alive": n["Alive"], "resources": n["Resources"]}} for n in ray.nodes()]))
"""


def node_types(cluster: FakeCluster) -> dict[str, list[str]]:
    """The alive nodes by node type (each known by its marker resource: ``miner``, ``trainer``, ``raycl_head``)."""
    markers = {name: {k for k in t["resources"] if k not in ("CPU", "GPU")} for name, t in cluster.types.items()}
    found: dict[str, list[str]] = {name: [] for name in markers}
    for node in cluster.python(NODES.format(address=cluster.address)):
        if node["alive"]:
            name = next((n for n, m in markers.items() if m and m <= set(node["resources"])), "?")
            found.setdefault(name, []).append(node["id"])
    return found


@contextmanager
def fake_cluster(cluster_file: str = "cluster.yaml", *, idle_minutes: float = 0.1) -> Iterator[FakeCluster]:
    base = Path(tempfile.mkdtemp(prefix="fa", dir="/tmp"))  # short: Ray's socket paths live under it
    spec = scaled(cluster_file, idle_minutes=idle_minutes)
    port, dash = free_port(), free_port()
    head = spec["types"][HEAD_TYPE]["resources"]
    config = base / "autoscaling.yaml"
    workers = sum(t["max_workers"] for t in spec["types"].values())
    config.write_text(
        yaml.safe_dump(
            {
                "cluster_name": "raycl-fake",
                "max_workers": workers,
                "upscaling_speed": 1.0,
                "idle_timeout_minutes": idle_minutes,
                "provider": {
                    "type": "fake_multinode",
                    "use_node_id_as_ip": True,
                    "disable_node_updaters": True,
                    "disable_launch_config_check": True,
                    "gcs_address": f"127.0.0.1:{port}",
                },
                "auth": {"ssh_user": "ubuntu"},
                "docker": {},
                "head_node_type": HEAD_TYPE,
                "available_node_types": spec["types"],
                "file_mounts": {},
                "cluster_synced_files": [],
                "initialization_commands": [],
                "setup_commands": [],
                "head_setup_commands": [],
                "worker_setup_commands": [],
                "head_start_ray_commands": [],
                "worker_start_ray_commands": [],
            }
        )
    )
    token = secrets.token_hex(16)
    drop = ("RAY_ADDRESS", "RAY_JOB_CONFIG_JSON_ENV_VAR")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, PYTHONPATH=str(ROOT))
    custom = {k: v for k, v in head.items() if k not in ("CPU", "GPU")}
    log = base / "head.log"
    args = [
        RAY,
        "start",
        "--head",
        f"--port={port}",
        f"--autoscaling-config={config}",
        f"--temp-dir={base / 't'}",
        f"--num-cpus={int(head.get('CPU', 0))}",
        "--num-gpus=0",
        f"--resources={json.dumps(custom)}",
        f"--dashboard-port={dash}",
        f"--ray-client-server-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        "--node-ip-address=127.0.0.1",
        "--disable-usage-stats",
        "--block",
    ]
    with open(log, "wb") as f:
        proc = subprocess.Popen(args, env={**env, "RAY_FAKE_CLUSTER": "1"}, stdout=f, stderr=subprocess.STDOUT)
    cluster = FakeCluster(f"127.0.0.1:{port}", token, env, config, spec["types"], log)
    try:
        end = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                if node_types(cluster).get(HEAD_TYPE):
                    break
            except AssertionError:
                if time.monotonic() > end:
                    raise
            time.sleep(1)
        yield cluster
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(base, ignore_errors=True)


def wait_for(cond: Any, timeout: float, what: str, step: float = 1.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(step)
    raise TimeoutError(f"{what} within {timeout:g} s")
