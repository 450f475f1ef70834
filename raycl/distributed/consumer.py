"""The trainer's side of the negative stream: batches for this rank, the staleness rule, weight publication.

A Ray Train worker holds one :class:`StreamConsumer`. Per epoch it asks the stream for ``n`` items of its own
shard, refuses the ones mined with weights older than ``version − max_staleness`` (they go back to the miners),
and records how long it waited (``timing/mine_wait``). Rank 0 publishes its weights when the version moves on;
every rank moves the version at the same steps, so all ranks agree on it without talking.
``max_staleness = 0`` is the synchronous schedule: nothing mined before the last publication is used.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import ray
import torch

from raycl.collectives import broadcast_int
from raycl.distributed import metrics
from raycl.distributed.weights import publish_weights


@dataclass
class StreamStats:
    """Per-epoch counters the worker reports."""

    mine_wait: float = 0.0  # seconds blocked in take()
    first_wait: float = 0.0  # of which waiting for the epoch's first items (pipeline fill, not steady state)
    refused: int = 0  # items refused as too stale (re-mined)
    negatives: int = 0  # negatives delivered in fresh items
    staleness: list[int] = field(default_factory=list)  # version − item.model_version of the items used

    def metrics(self) -> dict[str, float]:
        s = self.staleness
        return {
            "timing/mine_wait": self.mine_wait,
            "timing/mine_wait_first": self.first_wait,
            "stream/refused": float(self.refused),
            "stream/negatives": float(self.negatives),
            "stream/staleness_mean": sum(s) / len(s) if s else 0.0,
            "stream/staleness_max": float(max(s)) if s else 0.0,
        }


class StreamConsumer:
    def __init__(
        self, stream: Any, store: Any, *, rank: int, world_size: int, max_staleness: int, version: int = 0
    ) -> None:
        self.stream, self.store, self.rank, self.world_size = stream, store, rank, world_size
        self.max_staleness, self.version = max_staleness, version
        self.stats = StreamStats()

    def start_epoch(
        self,
        epoch: int,
        items_per_rank: list[list[Any]],
        *,
        shuffle: bool = True,
        min_versions: dict[str, int] | None = None,
    ) -> None:
        """Rank 0 schedules ``epoch`` (shuffled by epoch, or in the given order); cached negatives fresh enough for
        ``max_staleness`` are reused. If the stream already runs this epoch, a restarted trainer is replaying it:
        every item is delivered again."""
        self.stats = StreamStats()
        if self.rank != 0:
            return
        started = ray.get(
            self.stream.start_epoch.remote(
                epoch,
                items_per_rank,
                shuffle=shuffle,
                reuse_version=self.version - self.max_staleness,
                min_versions=min_versions,
            )
        )
        if not started:
            empty: list[list[str]] = [[] for _ in range(self.world_size)]
            ray.get(self.stream.restore.remote({"epoch": epoch, "consumed": empty}))

    def ledger_state(self, consumed: list[int]) -> dict[str, Any] | None:
        """Rank 0: the stream's position for a checkpoint, ``consumed[r]`` items of rank r trained on."""
        return ray.get(self.stream.ledger_state.remote(consumed=consumed)) if self.rank == 0 else None

    def restore(self, state: dict[str, Any]) -> None:
        """Rank 0, after ``start_epoch``: items a checkpoint counted as trained on stay consumed."""
        if self.rank == 0:
            ray.get(self.stream.restore.remote(state))

    def take(self, n: int, *, epoch: int) -> list[Any]:
        """Up to ``n`` fresh items of this rank's ``epoch`` (fewer only at its end)."""
        out: list[Any] = []
        while len(out) < n:
            t0 = time.perf_counter()
            items = ray.get(self.stream.take.remote(self.rank, n - len(out), epoch=epoch))
            waited = time.perf_counter() - t0
            self.stats.mine_wait += waited
            if not self.stats.staleness and not out:
                self.stats.first_wait += waited
            if not items:
                break
            floor = self.version - self.max_staleness
            stale = [it.id for it in items if it.model_version < floor]
            if stale:
                self.stats.refused += len(stale)
                ray.get(self.stream.refuse.remote(self.rank, stale, min_version=floor))
            fresh = [it for it in items if it.model_version >= floor]
            staleness = [self.version - it.model_version for it in fresh]
            metrics.took(self.rank, waited=waited, staleness=staleness, refused=len(stale))
            self.stats.staleness += staleness
            self.stats.negatives += sum(len(it.negatives) for it in fresh)
            out += fresh
        return out

    def publish(self, model: torch.nn.Module, *, after: int | None = None) -> None:
        """The next version (or ``after + 1``): every rank counts it, rank 0 puts the weights in the object
        store once."""
        self.version = max(self.version, after if after is not None else self.version) + 1
        metrics.weight_version(f"rank{self.rank}", self.version)
        if self.rank == 0:
            publish_weights(self.store, self.version, model.state_dict())

    def store_version(self) -> int:
        """The newest version the store holds (a dead run may have published past our checkpoint). Rank 0 asks
        and tells the others, so every rank counts from the same number even if rank 0 publishes meanwhile."""
        return broadcast_int(int(ray.get(self.store.version.remote())) if self.rank == 0 else 0)

    def buffer(self) -> dict[str, float]:
        s = ray.get(self.stream.stats.remote())
        return {
            "stream/fill": float(s["fill"]),
            "stream/capacity": float(s["capacity"]),
            "stream/max_fill": float(s["max_fill"]),
            "stream/reassigned": float(s["reassigned"]),
        }
