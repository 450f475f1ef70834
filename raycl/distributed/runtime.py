"""Connecting to Ray: an embedded local Ray on a laptop, the cluster with ``--address auto``, a Ray job's entry."""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from raycl.errors import UserError

log = logging.getLogger(__name__)

# Ray's job supervisor gives a job's entry point its JobConfig (the job's runtime env) in this variable; ray.init
# merges that runtime env with its own argument's and refuses any key both set (ray/_private/worker.py).
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
# The head-only custom resource of raycl's driver side (raycl.distributed.resources.head_share): cluster.yaml's
# head, the KubeRay manifest's head group and the embedded Ray below provide it.
HEAD_RESOURCE = "raycl_head"
TOKEN_HELP = (
    "give this shell the cluster's token: RAY_AUTH_MODE=token with RAY_AUTH_TOKEN=TOKEN or "
    "RAY_AUTH_TOKEN_PATH=FILE (docs/cluster.md: Cluster authentication)"
)


def init_ray(address: str | None = None, *, num_cpus: int | None = None) -> bool:
    """Start (or join) Ray once per process; whether this call did (False: this process was already connected).

    With no address and no ``RAY_ADDRESS`` this starts an embedded local Ray (``address="local"``: never another
    process's Ray on the same machine; ``--address auto`` joins a cluster), which ``ray[default]`` gives a
    dashboard. The placement groups of trials that Tune stops early are released without it
    (:mod:`raycl.distributed.placement`). A cluster that refuses us ends in one line (:func:`check_cluster`).
    Never calls ``ray stop``.
    """
    import ray

    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is not None:
        check_cluster(address)
    kwargs: dict[str, object] = {"ignore_reinit_error": True, "log_to_driver": _log_to_driver()}
    if address is None and num_cpus is not None:
        kwargs["num_cpus"] = num_cpus
    if address is None:  # this machine is the head: the driver side asks for a share of the head-only resource
        kwargs["resources"] = {HEAD_RESOURCE: 1.0}
    # Workers import raycl from this checkout even when it is not installed (a fresh clone, `make demo`).
    kwargs["runtime_env"] = {"env_vars": _propagated_env(embedded=address is None), **_setup_hook()}
    ray.init(address=address or "local", **kwargs)  # type: ignore[arg-type]
    log.info("ray: %s", ray.cluster_resources())
    return True


def stop_ray() -> None:
    """Leave Ray (an embedded Ray: stop it) before a run's one-line error is printed. Ray streams its workers'
    output to this process as it reads their log files: a Ray Train controller's own report of the error that
    ends the run (its traceback) could otherwise reach the terminal after raycl's line, which must be the last."""
    import ray

    ray.shutdown()


SETUP_HOOK = "raycl.distributed.runtime.know_own_cluster"


def know_own_cluster() -> None:
    """Every Ray worker process of a raycl run runs this at its start (the runtime env's
    ``worker_process_setup_hook``): ``RAY_ADDRESS`` names the worker's own cluster. Ray's State API without an
    address — what Ray's own helpers call (Train's run-state tracking, its placement-group cleaner where raycl's
    trainer does not replace it) and a user's callback may — otherwise finds "the" cluster by looking at the
    machine (``ray._private.services.get_ray_address_from_environment``): with two Rays on one machine (two runs,
    a test's Ray beside a run) it fails with ``Found multiple active Ray instances``, and beside a ``ray start``
    cluster it picks that one's recorded address, another cluster's."""
    import ray

    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address


def _setup_hook() -> dict[str, str]:
    """The runtime env's ``worker_process_setup_hook`` (:func:`know_own_cluster`), unless the Ray job this process
    runs in set its own (``ray.init`` refuses a key that both set)."""
    runtime_env = json.loads(os.environ[JOB_CONFIG_ENV]).get("runtime_env") or {} if in_ray_job() else {}
    return {} if "worker_process_setup_hook" in runtime_env else {"worker_process_setup_hook": SETUP_HOOK}


def local_cpus(wanted: float, *, quiet: bool = False) -> int:
    """Logical CPUs for an embedded Ray: at least what one run asks for, else its actors and workers would wait
    for CPUs that never come (2 coherence workers and a miner on 2 cores); oversubscribing is said on stderr."""
    cores = os.cpu_count() or 1
    if wanted > cores and not quiet:
        print(f"raycl: {wanted:g} CPUs asked on {cores} cores: the embedded Ray shares the cores", file=sys.stderr)
    return max(cores, math.ceil(wanted))


def cpus_of_a_run(cfg: Any) -> float:
    """The CPUs one training (one trial) reserves: its Ray Train workers and its miners."""
    need = max(cfg.scaling.num_workers, 1) * cfg.scaling.cpus_per_worker
    miners = getattr(getattr(cfg, "mining", None), "num_miners", 0)
    return need + (miners * cfg.mining.cpus_per_miner if miners else 0.0)


def in_ray_job() -> bool:
    """Whether this process is a Ray job's entry point (``ray job submit``, KubeRay's RayJob)."""
    return JOB_CONFIG_ENV in os.environ


def job_env_vars() -> dict[str, str]:
    """The ``env_vars`` of the runtime env of the Ray job this process runs in ({} outside a job)."""
    if not in_ray_job():
        return {}
    runtime_env = json.loads(os.environ[JOB_CONFIG_ENV]).get("runtime_env") or {}
    return dict(runtime_env.get("env_vars") or {})


def _log_to_driver() -> bool:
    """Workers' output (a Tune trial's progress lines, warnings, errors) reaches the driver's stderr — and so
    ``ray job logs`` — unless ``RAYCL_WORKER_LOGS=0``."""
    return os.environ.get("RAYCL_WORKER_LOGS", "1") != "0"


# How often a Ray Train controller polls its workers (Ray's default: 2 s). A training's end, a report and a
# worker's death are seen at the next poll, and a training ends after about two of them: at 2 s a smoke
# training's start and end cost seconds more than its steps. A poll is one small actor call per worker.
TRAIN_POLL_ENV, TRAIN_POLL_S = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5"
# Ray Train V2 starts a PreemptionWatcher actor for every worker group: a process of its own (about 1 CPU-second
# to start, then a poll every 5 s) that asks Ray whether a node of the run is being drained (a cloud node's
# preemption), so that the run can checkpoint and move. An embedded Ray is one node that this process started and
# stops, with no autoscaler to drain it and no other node to move to: the watcher is off there (the driver's
# environment may turn it on). On a cluster (``--address``) Ray's default stands.
PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"


def _propagated_env(*, embedded: bool = False) -> dict[str, str]:
    """What workers get from the driver's environment. Inside a Ray job, only what the job's runtime env lacks:
    its workers inherit the job's env_vars, and ray.init refuses a key set twice (even to the same value), so
    RAY_OVERRIDE_JOB_RUNTIME_ENV is not needed. ``RAYCL_CACHE_DIR``: a staged run (raycl.storage) is at the same
    path in every process. Ray Train's controllers poll their workers every ``TRAIN_POLL_S`` unless the
    driver's environment says otherwise; on an ``embedded`` Ray they start no preemption watcher
    (:data:`PREEMPTION_WATCHER_ENV`) unless it says otherwise."""
    keep = (
        "PYTHONPATH",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "TOKENIZERS_PARALLELISM",
        "RAYCL_WORKER_LOGS",
        "RAYCL_CACHE_DIR",
        "RAYCL_PROGRESS",
        "RAYCL_PROGRESS_MIN_S",
        "RAYCL_PROGRESS_MAX_S",
        TRAIN_POLL_ENV,
        PREEMPTION_WATCHER_ENV,
    )
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "0"))
    env.setdefault(TRAIN_POLL_ENV, TRAIN_POLL_S)
    if embedded:
        env.setdefault(PREEMPTION_WATCHER_ENV, "0")
    job = job_env_vars()
    return {k: v for k, v in env.items() if k not in job}


@functools.cache  # once a process: the CLI checks before it reads the inputs, init_ray again for library calls
def check_cluster(address: str) -> None:
    """Reach the cluster at ``address`` and pass its token check, or end in one line (exit 2) within seconds.

    Without this, ``ray.init`` against a cluster that refuses our token prints Ray's ``InvalidAuthToken`` warning
    every second for 20 s and ends in a ``ConnectionError`` traceback, and an unreachable address waits ~40 s.
    The probe is one GCS client (what ``ray.init`` opens first), its C++ warnings kept off the terminal.
    """
    if address == "local" or "://" in address:  # an embedded Ray; Ray Client and HTTP addresses check themselves
        return
    from ray._private.authentication.authentication_token_setup import (
        ensure_token_if_auth_enabled,
        maybe_enable_token_auth_if_token_available,
    )
    from ray._private.services import canonicalize_bootstrap_address_or_die
    from ray._raylet import GcsClient  # type: ignore[attr-defined]
    from ray.exceptions import AuthenticationError

    if address == "auto":  # as ray.init does: a local token file turns token auth on for a cluster found here
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    try:
        gcs = canonicalize_bootstrap_address_or_die(address)
    except (ConnectionError, ValueError) as err:
        raise UserError(f"--address {address}: {err}") from None
    host, port = gcs.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as err:
        raise UserError(
            f"--address {address}: no Ray cluster answers at {gcs} ({err.strerror or err}): is the "
            "address right and the head reachable from here?"
        ) from None
    try:
        with _quiet_stderr():
            ensure_token_if_auth_enabled(None, create_token_if_missing=False)
            GcsClient(address=gcs)  # type: ignore[attr-defined]
    except AuthenticationError:
        raise UserError(
            f"--address {address}: the Ray cluster at {gcs} refused the connection: the "
            f"authentication token is missing or wrong ({_token_source()}), or the address names "
            f"another cluster; {TOKEN_HELP}"
        ) from None


def _token_source() -> str:
    """Where this process's token came from, as the message to a refused client says it."""
    if os.environ.get("RAY_AUTH_MODE", "disabled").lower() != "token":
        return "RAY_AUTH_MODE is not 'token' here, so no token was sent"
    for var in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        if os.environ.get(var):
            return f"the token of {var} was sent"
    if (Path.home() / ".ray" / "auth_token").exists():
        return "the token of ~/.ray/auth_token was sent"
    return "RAY_AUTH_MODE is 'token' but no token was found"


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null: Ray's C++ client logs straight to it, past Python's ``sys.stderr``."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
