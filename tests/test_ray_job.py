"""raycl as a Ray job (issue 25): a real 2-node cluster started with Ray's CLI on localhost, token authentication
on, jobs submitted through Ray's own job server. A job whose runtime env sets HF_HUB_OFFLINE trains and reports
where its last log line says; a relative ``--out`` is refused in one line; a driver without the cluster's token,
or with a wrong one, ends in one line (exit 2) within seconds. The nodes share this test's Python environment."""

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
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from raycl import cli
from raycl.distributed import runtime
from raycl.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))
EXCLUDES = [".git", ".venv", "runs", "**/__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"]
TINY = ["--set", "data.setting=zero_shot", "--set", "optim.epochs=1"]


@dataclass
class LocalCluster:
    gcs: str  # 127.0.0.1:PORT, what `--address` takes
    dashboard: str  # http://127.0.0.1:PORT, Ray's job server
    token: str

    def jobs(self) -> Any:
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(self.dashboard, headers={"Authorization": f"Bearer {self.token}"})


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _node_args(temp_dir: Path) -> list[str]:
    """Every port a node listens on, free, and its own temp dir (other Rays may run on this host)."""
    names = [
        "--node-manager-port",
        "--object-manager-port",
        "--metrics-export-port",
        "--runtime-env-agent-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
    ]
    ports = [a for name, port in zip(names, _free_ports(len(names)), strict=True) for a in (name, str(port))]
    return [
        *ports,
        "--temp-dir",
        str(temp_dir),
        "--num-cpus",
        "1",
        "--node-ip-address",
        "127.0.0.1",
        "--disable-usage-stats",
        "--block",
    ]


def _get(url: str, token: str) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)


def _wait(
    cond: Any, what: str, procs: list[subprocess.Popen[bytes]], logs: list[Path], timeout: float = 120
) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for p, log in zip(procs, logs, strict=True):
            assert p.poll() is None, f"{log} ended while waiting for {what}:\n{log.read_text()[-3000:]}"
        try:
            if cond():
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{what}:\n" + "\n".join(log.read_text()[-2000:] for log in logs))


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Head and one worker node, each `ray start … --block` of its own; both ended by PID (never `ray stop`)."""
    base = Path(tempfile.mkdtemp(prefix="rj", dir="/tmp"))  # short: Ray's socket paths live under --temp-dir
    token = secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", runtime.JOB_CONFIG_ENV)}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, PYTHONPATH=str(ROOT))
    gcs, dash, client = _free_ports(3)
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []

    def start(args: list[str], log: str) -> None:
        logs.append(base / log)
        with open(logs[-1], "wb") as f:
            procs.append(subprocess.Popen([RAY, "start", *args], env=env, stdout=f, stderr=subprocess.STDOUT))

    try:
        start(
            [
                "--head",
                "--port",
                str(gcs),
                "--dashboard-port",
                str(dash),
                "--dashboard-host",
                "127.0.0.1",
                "--ray-client-server-port",
                str(client),
                *_node_args(base / "h"),
            ],
            "head.log",
        )
        url = f"http://127.0.0.1:{dash}"
        _wait(lambda: _get(f"{url}/api/version", token), "the head's dashboard", procs, logs)
        start(["--address", f"127.0.0.1:{gcs}", *_node_args(base / "w")], "worker.log")
        alive = lambda: sum(  # noqa: E731
            n["state"] == "ALIVE" for n in _get(f"{url}/api/v0/nodes", token)["data"]["result"]["result"]
        )
        _wait(lambda: alive() == 2, "2 alive nodes", procs, logs)
        yield LocalCluster(f"127.0.0.1:{gcs}", url, token)
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(base, ignore_errors=True)


def _run_job(cluster: LocalCluster, args: list[str], timeout: float = 300) -> tuple[str, str]:
    """Submit ``python -m raycl.train ARGS`` as a job (working dir: this checkout); its end status and logs."""
    from ray.job_submission import JobStatus

    client = cluster.jobs()
    env_vars = {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}  # this checkout's raycl, not the venv's
    job = client.submit_job(
        entrypoint=" ".join([sys.executable, "-m", "raycl.train", *args]),
        runtime_env={"working_dir": str(ROOT), "excludes": EXCLUDES, "env_vars": env_vars},
    )
    end = time.monotonic() + timeout
    while (status := client.get_job_status(job)) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
        assert time.monotonic() < end, f"job still {status} after {timeout} s:\n{client.get_job_logs(job)[-3000:]}"
        time.sleep(1)
    logs = client.get_job_logs(job)
    print(f"\n--- job {job}: {status}\n{logs[-2000:]}")
    return str(status), logs


@pytest.mark.cluster
def test_a_job_with_hf_offline_in_its_runtime_env_trains_and_reports_where_it_says(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    out = tmp_path / "idiom"
    status, logs = _run_job(cluster, ["idiom", "--preset", "smoke", "--out", str(out), *TINY])
    assert status == "SUCCEEDED", logs[-3000:]
    last = logs.strip().splitlines()[-1]
    assert last == f"report: {out / 'report.md'}"
    assert (out / "report.md").is_file() and (out / "trials" / "zero_shot" / "history.jsonl").is_file()


@pytest.mark.cluster
def test_a_job_with_a_relative_out_is_refused_in_one_line(cluster: LocalCluster) -> None:
    status, logs = _run_job(cluster, ["idiom", "--preset", "smoke", "--out", "runs/idiom", *TINY], timeout=120)
    assert status == "FAILED"
    assert "Traceback" not in logs
    assert (
        logs.strip()
        .splitlines()[-1]
        .startswith(
            "raycl: error: --out runs/idiom is relative: inside a Ray job it would land in the job's working_dir"
        )
    )


@pytest.mark.cluster
@pytest.mark.parametrize(
    "auth", [{}, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 32}], ids=["no-token", "wrong-token"]
)
def test_a_driver_the_cluster_refuses_ends_in_one_line(
    cluster: LocalCluster, tmp_path: Path, auth: dict[str, str]
) -> None:
    drop = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", runtime.JOB_CONFIG_ENV)
    env = {**{k: v for k, v in os.environ.items() if k not in drop}, "PYTHONPATH": str(ROOT), **auth}
    t0 = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "raycl.train",
            "idiom",
            "--preset",
            "smoke",
            "--address",
            cluster.gcs,
            "--out",
            str(tmp_path / "run"),
            *TINY,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - t0  # printed for the note, not asserted
    print(f"\n{auth or 'no token'}: exit {done.returncode} after {took:.1f} s: {done.stderr.strip()}")
    # refused by raycl's probe before ray.init (the subprocess's timeout bounds the wait): its one line, not what
    # ray.init says after retrying a refused connection (Ray's own warnings and a traceback), nor a time asserted
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().count("\n") == 0, done.stderr[-3000:]
    assert "refused the connection: the authentication token is missing or wrong" in done.stderr
    assert "RAY_AUTH_TOKEN" in done.stderr


# ---------------------------------------------------------------------------------------------- no cluster
def _in_job(monkeypatch: pytest.MonkeyPatch, env_vars: dict[str, str]) -> None:
    monkeypatch.setenv(runtime.JOB_CONFIG_ENV, json.dumps({"runtime_env": {"env_vars": env_vars}, "metadata": {}}))


def test_inside_a_job_workers_get_only_what_the_jobs_runtime_env_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PYTHONPATH", "/x")
    assert runtime._propagated_env()["HF_HUB_OFFLINE"] == "1"  # outside a job: raycl passes it on itself
    _in_job(monkeypatch, {"HF_HUB_OFFLINE": "1"})
    env = runtime._propagated_env()
    assert "HF_HUB_OFFLINE" not in env and env["PYTHONPATH"] == "/x" and env["TOKENIZERS_PARALLELISM"] == "false"


def test_train_controllers_poll_their_workers_twice_a_second_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray Train's 2 s default makes every training's end wait for polls; raycl's workers (the controllers among
    them) get 0.5 s, or the driver's own setting."""
    monkeypatch.delenv(runtime.TRAIN_POLL_ENV, raising=False)
    assert runtime._propagated_env()[runtime.TRAIN_POLL_ENV] == "0.5"
    monkeypatch.setenv(runtime.TRAIN_POLL_ENV, "3")
    assert runtime._propagated_env()[runtime.TRAIN_POLL_ENV] == "3"
    _in_job(monkeypatch, {runtime.TRAIN_POLL_ENV: "1"})  # a job that sets it: its workers have it already
    assert runtime.TRAIN_POLL_ENV not in runtime._propagated_env()


def test_an_embedded_ray_starts_no_preemption_watcher_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """A PreemptionWatcher actor per training (a process of its own) watches for node drains that a one-node Ray
    this process started never gets (bench/trial_cost.py): off on an embedded Ray, Ray's default on a cluster,
    the driver's own setting either way."""
    watcher = runtime.PREEMPTION_WATCHER_ENV
    monkeypatch.delenv(watcher, raising=False)
    assert runtime._propagated_env(embedded=True)[watcher] == "0"
    assert watcher not in runtime._propagated_env(embedded=False)  # a cluster: Ray's default (on)
    monkeypatch.setenv(watcher, "1")
    assert runtime._propagated_env(embedded=True)[watcher] == "1"
    _in_job(monkeypatch, {watcher: "1"})  # a job that sets it: its workers have it already
    assert watcher not in runtime._propagated_env(embedded=True)


def test_inside_a_job_a_relative_or_default_out_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert cli.run_folder(Path("runs/x"), "idiom") == Path("runs/x").resolve()  # outside a job: as before
    _in_job(monkeypatch, {})
    for out in (Path("runs/x"), None):
        with pytest.raises(UserError, match="is relative: inside a Ray job"):
            cli.run_folder(out, "idiom")
    assert cli.run_folder(tmp_path / "x", "idiom") == tmp_path / "x"


def test_a_run_folder_that_holds_a_run_says_it_is_resumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli.say_resumed(cli.run_folder(tmp_path, "idiom"))
    assert "resumed run" not in capsys.readouterr().err  # an empty folder is a new run
    (tmp_path / "config.yaml").write_text("task: idiom\n")
    cli.say_resumed(cli.run_folder(tmp_path, "idiom"))
    assert capsys.readouterr().err == f"resumed run: {tmp_path}\n"
