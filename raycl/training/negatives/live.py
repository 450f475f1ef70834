"""Negatives mined while training: the trainer's end of the negative stream (its consumer in
``raycl.distributed.consumer``: the exactly-once ledger's deliveries, the staleness bound, weight publication)."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any, Generic

from torch import nn

from raycl.miners.records import MinedNegatives
from raycl.training.negatives.base import E, StreamEnd
from raycl.training.prefetch import Call


class LiveEnd:
    """The trainer's end of a live stream: its weight version, the staleness bound on what it gives, resuming."""

    def __init__(self, consumer: StreamEnd) -> None:
        self.consumer = consumer
        self.taken: dict[str, MinedNegatives] = {}  # the pool just taken, by id

    @property
    def version(self) -> int:
        return self.consumer.version

    def take(self, n: int, epoch: int) -> list[MinedNegatives]:
        items = self.consumer.take(n, epoch=epoch)  # refuses (re-mines) what is too stale
        self.taken = {it.id: it for it in items}
        return items

    def fresh(self, ids: Sequence[str], version: int) -> list[tuple[str, ...]]:
        floor = version - self.consumer.max_staleness
        items = [self.taken[i] for i in ids]
        stale = [it.id for it in items if it.model_version < floor]
        if stale:  # the take refused these: a version moved on between the take and this ask
            raise RuntimeError(f"negatives of {stale[:3]} mined with weights older than version {floor}")
        return [it.negatives for it in items]

    def resume(self, state: dict[str, Any], model: nn.Module) -> None:
        """The checkpoint is the truth. If the dead run published past the checkpoint's version, miners may hold
        weights the checkpoint never saw: the restored ones go out under a newer version (and ``max_staleness``
        refuses what those mined). Otherwise the miners' weights are the checkpoint's (the paper's GEC schedule:
        version 0 throughout)."""
        self.consumer.version = int(state.get("version", 0))
        newest = self.consumer.store_version()
        if newest > self.consumer.version:
            self.consumer.publish(model, after=newest)

    def state(self) -> dict[str, Any]:
        return {"version": self.consumer.version}


class StreamNegatives(LiveEnd, Generic[E]):
    """Negatives from the miner pool, in the order they are delivered. ``sync_every`` updates move the weight
    version on (rank 0 publishes); ``refresh_every`` epochs publish before the epoch, so everything is mined again
    with newer weights. An interrupted epoch is delivered again from its start."""

    def __init__(
        self,
        consumer: StreamEnd,
        shards: list[list[E]],
        *,
        batch_size: int,
        sync_every: int,
        refresh_every: int,
    ) -> None:
        super().__init__(consumer)
        self.shards, self.batch_size = shards, batch_size
        self.sync_every, self.refresh_every = sync_every, refresh_every
        self.by_id = {ex.id: ex for ex in shards[consumer.rank]}
        self.read_ahead = sync_every <= 0  # publications between updates: each take sees the version they set

    def pools(self, epoch: int, start: int, model: nn.Module) -> Iterator[list[E] | Call]:
        if epoch > 0 and self.refresh_every > 0 and epoch % self.refresh_every == 0:
            yield Call(functools.partial(self.consumer.publish, model))  # in the training thread
        self.consumer.start_epoch(epoch, self.shards)
        while items := self.take(self.batch_size, epoch):
            yield [self.by_id[it.id] for it in items]

    def negatives(self, ids: Sequence[str], version: int) -> list[list[Any]]:
        return [list(negs) for negs in self.fresh(ids, version)]

    def after_update(self, step: int, model: nn.Module) -> None:
        if self.sync_every > 0 and step % self.sync_every == 0:
            self.consumer.publish(model)

    def metrics(self) -> dict[str, float]:
        out = {**self.consumer.stats.metrics(), "stream/version": float(self.consumer.version)}
        return {**out, **self.consumer.buffer()} if self.consumer.rank == 0 else out
