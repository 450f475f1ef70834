"""Coherence's negatives: an item's own permuted documents, then those the miners ranked highest."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any

from torch import nn

from raycl.data.coherence import CoherenceItem
from raycl.miners.permutation import decode_doc
from raycl.training.negatives.base import StreamEnd
from raycl.training.negatives.live import LiveEnd
from raycl.training.prefetch import Call


class PermutationNegatives:
    """Coherence: this rank's items of an epoch, resumable at ``start`` items, with their own permutations — or,
    with a stream, after the first chunk of the first epoch, the ones the miners ranked highest with the weights
    published at the start of the item's chunk (``rank_every`` items)."""

    read_ahead = True

    def __init__(
        self,
        shards: list[list[CoherenceItem]],
        rank: int,
        *,
        batch_size: int,
        rank_every: int,
        consumer: StreamEnd | None,
    ) -> None:
        self.shards, self.rank, self.batch_size, self.every = shards, rank, batch_size, rank_every
        self.live = LiveEnd(consumer) if consumer is not None else None
        self.by_id = {it.id: it for it in shards[rank]}
        self._ledger: dict[str, Any] | None = None  # a checkpoint's position in the stream, for its epoch
        self.saved_ledger: dict[str, Any] | None = None  # the stream's position a report's checkpoint holds

    @property
    def version(self) -> int:
        return self.live.version if self.live is not None else 0

    def _firsts(self, epoch: int) -> list[int]:
        """How many of each rank's first items train on their own negatives: the first chunk, in epoch 0 only."""
        return [min(self.every, len(s)) if epoch == 0 else 0 for s in self.shards]

    def pools(self, epoch: int, start: int, model: nn.Module) -> Iterator[list[CoherenceItem] | Call]:
        """Schedules the stream's part of ``epoch`` now (rank 0), or restores it from a checkpoint's ledger."""
        if self.live is not None:
            self._start_epoch(epoch, self.live)
        return self._pools(epoch, start, model)

    def _start_epoch(self, epoch: int, live: LiveEnd) -> None:
        live.taken, consumer = {}, live.consumer
        firsts, v0 = self._firsts(epoch), consumer.version
        # the version published at the start of an item's chunk, known now: miners wait for it (less the allowed
        # staleness) rather than rank with older weights what the trainer would refuse
        floors = {
            it.id: v0 + pos // self.every + (epoch > 0) - consumer.max_staleness
            for s, f in zip(self.shards, firsts, strict=True)
            for pos, it in enumerate(s)
            if pos >= f
        }
        consumer.start_epoch(
            epoch, [s[f:] for s, f in zip(self.shards, firsts, strict=True)], shuffle=False, min_versions=floors
        )
        ledger, self._ledger = self._ledger, None
        if ledger is not None and self.rank == 0:
            consumer.restore(ledger)

    def _pools(self, epoch: int, done: int, model: nn.Module) -> Iterator[list[CoherenceItem] | Call]:
        shard = self.shards[self.rank]
        first = self._firsts(epoch)[self.rank] if self.live is not None else len(shard)
        if shard[done:first]:
            yield shard[done:first]
        if self.live is None:
            return
        pos = max(done, first)
        while pos < len(shard):
            if pos % self.every == 0:  # a chunk starts: the miners rank it with these weights (or newer)
                yield Call(functools.partial(self.live.consumer.publish, model))
            got = self.live.take(min(self.batch_size, self.every - pos % self.every), epoch)
            if not got:
                return
            pos += len(got)
            yield [self.by_id[it.id] for it in got]

    def negatives(self, ids: Sequence[str], version: int) -> list[list[Any]]:
        """Documents (tuples of sentences), best first: an item's own, or those taken from the stream."""
        if self.live is None or not ids or ids[0] not in self.live.taken:  # a pool is all own or all taken
            return [list(self.by_id[i].negs) for i in ids]
        return [[decode_doc(d) for d in negs] for negs in self.live.fresh(ids, version)]

    def after_update(self, step: int, model: nn.Module) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        if self.live is None:
            return {"timing/mine_wait": 0.0, "timing/mine_wait_first": 0.0}
        return {**self.live.consumer.stats.metrics(), "stream/version": float(self.live.version)}

    def state(self) -> dict[str, Any]:
        return {"version": self.version, "ledger": self.saved_ledger}

    def resume(self, state: dict[str, Any], model: nn.Module) -> None:
        """The checkpoint's weight version (republished if the dead run went past it) and its position in the
        stream's ledger, restored when its epoch starts."""
        if self.live is not None:
            self.live.resume(state, model)
            self._ledger = state.get("ledger")

    def ledger_state(self, epoch: int, done: list[int]) -> dict[str, Any] | None:
        """Rank 0: the stream's position for a checkpoint, ``done[r]`` items of rank r's epoch trained on."""
        if self.live is None:
            return None
        firsts = self._firsts(epoch)
        return self.live.consumer.ledger_state([max(d - f, 0) for d, f in zip(done, firsts, strict=True)])
