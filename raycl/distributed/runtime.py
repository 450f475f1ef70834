"""Connecting to Ray: an embedded local Ray on a laptop, the cluster with ``--address auto``."""

from __future__ import annotations

import logging
import os

import ray

log = logging.getLogger(__name__)


def init_ray(address: str | None = None, *, num_cpus: int | None = None) -> None:
    """Start (or join) Ray once per process.

    With no address and no ``RAY_ADDRESS`` this starts an embedded local Ray (``address="local"``: never another
    process's Ray on the same machine; ``--address auto`` joins a cluster), which ``ray[default]`` gives a
    dashboard: Train V2 needs its State API to release the placement groups of trials that Tune stops early
    (RAY_NOTES 2.2). Never calls ``ray stop``.
    """
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    kwargs: dict[str, object] = {"ignore_reinit_error": True, "log_to_driver": _log_to_driver()}
    if address is None and num_cpus is not None:
        kwargs["num_cpus"] = num_cpus
    # Workers import raycl from this checkout even when it is not installed (a fresh clone, `make demo`).
    kwargs["runtime_env"] = {"env_vars": _propagated_env()}
    ray.init(address=address or "local", **kwargs)  # type: ignore[arg-type]
    log.info("ray: %s", ray.cluster_resources())


def _log_to_driver() -> bool:
    """Workers' output (a Tune trial's progress lines, warnings, errors) reaches the driver's stderr — and so
    ``ray job logs`` — unless ``RAYCL_WORKER_LOGS=0``."""
    return os.environ.get("RAYCL_WORKER_LOGS", "1") != "0"


def _propagated_env() -> dict[str, str]:
    keep = ("PYTHONPATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM", "RAYCL_WORKER_LOGS",
            "RAYCL_PROGRESS", "RAYCL_PROGRESS_MIN_S", "RAYCL_PROGRESS_MAX_S")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "0"))
    return env
