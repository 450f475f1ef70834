"""The mining pipeline's state reaches the local Ray's Prometheus export (``raycl.distributed.metrics``)."""

from __future__ import annotations

import time
import urllib.request
from collections import defaultdict
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from test_consumer import _epoch_with_a_publication


def _scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """``ray_raycl_*`` samples of the node's metrics endpoint: name → [(labels, value)]."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("ray_raycl_"):
                out[s.name].append((s.labels, s.value))
    return out


def _by(samples: list[tuple[dict[str, str], float]], tag: str) -> dict[str, float]:
    """The largest value per value of ``tag`` (earlier tests' processes may still be exported)."""
    best: dict[str, float] = {}
    for labels, value in samples:
        best[labels[tag]] = max(value, best.get(labels[tag], value))
    return best


EXPECTED = (
    "ray_raycl_stream_depth",
    "ray_raycl_miner_negatives_total",
    "ray_raycl_miner_negatives_per_s",
    "ray_raycl_trainer_mine_wait_s_total",
    "ray_raycl_trainer_staleness",
    "ray_raycl_trainer_refused_total",
    "ray_raycl_weight_version",
)


def test_the_mining_pipeline_is_exported_as_ray_metrics(ray_local: Any) -> None:
    """An echo miner, the stream, the weight store and a rank-0 consumer that refuses stale items (max_staleness
    0, two publications): every metric appears on the node's Prometheus endpoint (exported every few seconds)."""
    port = next(n["MetricsExportPort"] for n in ray_local.nodes() if n["Alive"])
    seen: dict[str, list[tuple[dict[str, str], float]]] = {}

    def exported(m: dict[str, list[tuple[dict[str, str], float]]]) -> bool:
        """Every metric there, and the weight versions at their last values (exported every few seconds: the
        first scrape that names them all may still hold a value from before the second publication)."""
        if not all(k in m for k in EXPECTED):
            return False
        versions = _by(m["ray_raycl_weight_version"], "holder")
        return all(versions.get(h, 0) >= 2 for h in ("store", "rank0", "miner0"))

    def poll() -> None:  # while the actors live: a process's last values die with it unless already exported
        nonlocal seen
        deadline = time.monotonic() + 60
        while not exported(seen := _scrape(port)) and time.monotonic() < deadline:
            time.sleep(1.0)

    consumer, got, stats = _epoch_with_a_publication(ray_local, max_staleness=0, before_close=poll)
    assert consumer.stats.refused >= 4
    assert all(k in seen for k in EXPECTED), sorted(seen)
    assert {"fill", "ready"} <= set(_by(seen["ray_raycl_stream_depth"], "state"))
    assert _by(seen["ray_raycl_miner_negatives_total"], "miner")["0"] >= 16  # k=1 negative per example, 16+
    assert _by(seen["ray_raycl_miner_negatives_per_s"], "miner")["0"] > 0
    assert _by(seen["ray_raycl_trainer_refused_total"], "rank")["0"] >= consumer.stats.refused
    assert _by(seen["ray_raycl_trainer_staleness"], "rank")["0"] == 0  # max_staleness 0: only fresh items used
    versions = _by(seen["ray_raycl_weight_version"], "holder")
    assert versions["store"] >= 2 and versions["rank0"] >= 2 and versions["miner0"] >= 2
