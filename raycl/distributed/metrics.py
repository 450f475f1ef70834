"""The mining pipeline's state as Ray metrics, for the Ray dashboard's Grafana panels and Prometheus.

Every Ray node's metrics agent exports what its processes record with ``ray.util.metrics`` in Prometheus text
format (``http://NODE:METRICS_EXPORT_PORT/metrics``; Ray prefixes each name with ``ray_`` and a counter's with
``_total`` after it, and adds ``WorkerId``, ``NodeAddress`` and ``SessionName`` labels):

==================================  =======  ===========  ==============================================
metric                              kind     tags         recorded by
==================================  =======  ===========  ==============================================
``raycl_stream_depth``              gauge    ``state``    the negative stream: ``fill`` (mined-undelivered
                                                          plus in flight) and ``ready`` (mined-undelivered)
``raycl_miner_negatives``           counter  ``miner``    each miner: negatives mined (``rate()`` = /s)
``raycl_miner_negatives_per_s``     gauge    ``miner``    each miner: negatives/s of its last task
``raycl_trainer_mine_wait_s``       counter  ``rank``     each trainer rank: seconds blocked on the stream
``raycl_trainer_staleness``         gauge    ``rank``     each trainer rank: the largest version − item
                                                          version among the items it last took
``raycl_trainer_refused``           counter  ``rank``     each trainer rank: items refused as too stale
``raycl_weight_version``            gauge    ``holder``   the weight store (``store``), each miner
                                                          (``miner<i>``) and trainer rank (``rank<r>``)
==================================  =======  ===========  ==============================================

A process creates each metric once, on first use; outside Ray (a miner or consumer used in-process) nothing is
recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ray
from ray.util.metrics import Counter, Gauge

_METRICS: dict[str, tuple[type, str, tuple[str, ...]]] = {
    "raycl_stream_depth": (
        Gauge,
        "negative stream: items mined-undelivered (ready) or also in flight (fill)",
        ("state",),
    ),
    "raycl_miner_negatives": (Counter, "negatives mined", ("miner",)),
    "raycl_miner_negatives_per_s": (Gauge, "negatives per second of the miner's last task", ("miner",)),
    "raycl_trainer_mine_wait_s": (Counter, "seconds a trainer rank waited for negatives", ("rank",)),
    "raycl_trainer_staleness": (Gauge, "largest staleness (versions) of the items a rank last took", ("rank",)),
    "raycl_trainer_refused": (Counter, "items refused by a trainer rank as too stale", ("rank",)),
    "raycl_weight_version": (Gauge, "the weight version a holder has (store, miner<i>, rank<r>)", ("holder",)),
    "raycl_miner_gpu_fallback": (
        Counter,
        "miners given a GPU share that run on the CPU (no CUDA on the node)",
        ("node",),
    ),
}
_made: dict[str, Any] = {}


def _metric(name: str) -> Any | None:
    if not ray.is_initialized():
        return None
    if name not in _made:
        kind, doc, tags = _METRICS[name]
        _made[name] = kind(name, description=doc, tag_keys=tags)
    return _made[name]


def _set(name: str, value: float, **tags: str) -> None:
    if (m := _metric(name)) is not None:
        m.set(float(value), tags=tags)


def _inc(name: str, value: float, **tags: str) -> None:
    if value > 0 and (m := _metric(name)) is not None:
        m.inc(float(value), tags=tags)


def stream_depth(*, fill: int, ready: int) -> None:
    _set("raycl_stream_depth", fill, state="fill")
    _set("raycl_stream_depth", ready, state="ready")


def mined(miner_id: int, *, negatives: int, seconds: float) -> None:
    _inc("raycl_miner_negatives", negatives, miner=str(miner_id))
    if seconds > 0:
        _set("raycl_miner_negatives_per_s", negatives / seconds, miner=str(miner_id))


def took(rank: int, *, waited: float, staleness: Sequence[int], refused: int) -> None:
    """One ``take`` of a trainer rank: its wait, the staleness of the items it kept, how many it refused."""
    _inc("raycl_trainer_mine_wait_s", waited, rank=str(rank))
    _inc("raycl_trainer_refused", refused, rank=str(rank))
    if staleness:
        _set("raycl_trainer_staleness", max(staleness), rank=str(rank))


def gpu_fallback(node: str) -> None:
    """A miner was given a GPU share on a node whose torch has no CUDA, and runs on the CPU."""
    _inc("raycl_miner_gpu_fallback", 1, node=node)


def weight_version(holder: str, version: int) -> None:
    _set("raycl_weight_version", version, holder=holder)
