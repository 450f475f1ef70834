"""Where a training epoch's batches and their negatives come from.

:class:`StaticFeed`: negatives known before training (pre-mined Parquet, or none: pretraining, NLL), in a
seeded shuffle. :class:`StreamFeed`: negatives mined *while* training, pulled from the negative stream, so
fine-tuning starts as soon as the first task is mined (docs/architecture.md). Both yield
``(examples, negatives)`` batches and the same number of batches on every data-parallel rank.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from raycl.data.gec import GecExample

# the batch plan's (raycl.training.batching), named here as before
from raycl.training.batching import global_batches
from raycl.training.batching import token_batches as token_batches
from raycl.training.batching import token_groups as token_groups
from raycl.training.prefetch import Call

Batch = tuple[list[GecExample], list[list[str]]]


def shard(examples: Sequence[GecExample], rank: int, world_size: int) -> list[GecExample]:
    """Every ``world_size``-th example, padded by wrap-around so every rank has as many (DistributedSampler):
    ranks must take the same number of steps, or the gradient all-reduce waits forever. Padding copies get
    their own id (``#pad``), so every id of an epoch is unique across ranks."""
    per_rank = math.ceil(len(examples) / world_size)
    pad = [replace(ex, id=f"{ex.id}#pad") for ex in examples[: per_rank * world_size - len(examples)]]
    return [*examples, *pad][rank::world_size]


class Feed(Protocol):
    """An epoch's ``(examples, negatives)`` pools of this rank, read ahead of the step (a background thread); a
    :class:`~raycl.training.prefetch.Call` where something must run in the training thread first (publishing)."""

    def batches(self, epoch: int, model: torch.nn.Module) -> Iterator[Batch | Call]: ...
    def after_step(self, step: int, model: torch.nn.Module) -> None: ...
    def metrics(self) -> dict[str, float]: ...
    def state(self) -> dict[str, Any]: ...
    def resume(self, state: dict[str, Any], model: torch.nn.Module) -> None: ...


@dataclass
class StaticFeed:
    examples: list[GecExample]  # every rank's: each epoch's global batches are shared out (:func:`global_batches`)
    negatives: dict[str, list[str]]
    batch_size: int
    seed: int
    rank: int = 0
    world_size: int = 1

    def batches(self, epoch: int, model: torch.nn.Module) -> Iterator[Batch]:
        for idx in global_batches(len(self.examples), batch_size=self.batch_size, seed=self.seed * 1000 + epoch,
                                  rank=self.rank, world_size=self.world_size):  # fmt: skip
            chunk = [self.examples[i] for i in idx]
            yield chunk, [self.negatives.get(_base_id(ex.id), []) for ex in chunk]

    def after_step(self, step: int, model: torch.nn.Module) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {"timing/mine_wait": 0.0, "timing/mine_wait_first": 0.0}

    def state(self) -> dict[str, Any]:
        return {}

    def resume(self, state: dict[str, Any], model: torch.nn.Module) -> None:
        pass


class StreamFeed:
    """Negatives from the miner pool. ``sync_every`` steps move the weight version on (rank 0 publishes);
    ``refresh_every`` epochs publish before the epoch, so everything is mined again with newer weights."""

    def __init__(self, consumer: Any, shards: list[list[GecExample]], *, batch_size: int, sync_every: int,
                 refresh_every: int) -> None:  # fmt: skip
        self.consumer, self.shards, self.batch_size = consumer, shards, batch_size
        self.sync_every, self.refresh_every = sync_every, refresh_every
        self.by_id = {ex.id: ex for ex in shards[consumer.rank]}

    def batches(self, epoch: int, model: torch.nn.Module) -> Iterator[Batch | Call]:
        if epoch > 0 and self.refresh_every > 0 and epoch % self.refresh_every == 0:
            yield Call(functools.partial(self.consumer.publish, model))  # in the training thread
        self.consumer.start_epoch(epoch, self.shards)
        while items := self.consumer.take(self.batch_size, epoch=epoch):
            yield [self.by_id[it.id] for it in items], [list(it.negatives) for it in items]

    def after_step(self, step: int, model: torch.nn.Module) -> None:
        if self.sync_every > 0 and step % self.sync_every == 0:
            self.consumer.publish(model)

    def metrics(self) -> dict[str, float]:
        out = {**self.consumer.stats.metrics(), "stream/version": float(self.consumer.version)}
        return {**out, **self.consumer.buffer()} if self.consumer.rank == 0 else out

    def state(self) -> dict[str, Any]:
        return {"version": self.consumer.version}

    def resume(self, state: dict[str, Any], model: torch.nn.Module) -> None:
        """The checkpoint is the truth. If the dead run published past the checkpoint's version, miners may hold
        weights the checkpoint never saw: the restored ones go out under a newer version (and ``max_staleness``
        refuses what those mined). Otherwise the miners' weights are the checkpoint's (the paper's GEC schedule:
        version 0 throughout). The interrupted epoch is delivered again from its start."""
        self.consumer.version = int(state.get("version", 0))
        newest = self.consumer.store_version()
        if newest > self.consumer.version:
            self.consumer.publish(model, after=newest)


class NBestFeed:
    """Negatives selected from the run's shared n-best (``raycl.distributed.nbest``): version 0, mined once per
    run. While it is being mined, an epoch's batches are this rank's share of the epoch in the order their lists
    arrive (the first trials train as the n-best is mined); once this rank has them all, the global batches of
    :class:`StaticFeed`."""

    def __init__(self, stream: Any, examples: list[GecExample], *, batch_size: int, seed: int,
                 select: Callable[[Any, float, GecExample], list[str]], poll_s: float = 1.0, rank: int = 0,
                 world_size: int = 1) -> None:  # fmt: skip
        self.stream, self.shard, self.batch_size, self.seed = stream, examples, batch_size, seed
        self.select, self.poll_s, self.rank, self.world_size = select, poll_s, rank, world_size
        self.negatives: dict[str, list[str]] = {}  # by base id: this rank's selected negatives
        self.mine_wait = self.first_wait = 0.0
        self.delivered = 0  # negatives in this epoch's batches

    def batches(self, epoch: int, model: torch.nn.Module) -> Iterator[Batch]:
        self.mine_wait = self.first_wait = 0.0
        self.delivered = 0
        shares = global_batches(len(self.shard), batch_size=self.batch_size, seed=self.seed * 1000 + epoch,
                                rank=self.rank, world_size=self.world_size)  # fmt: skip
        chunks: Iterator[list[int]] = iter(shares)
        if not all(_base_id(self.shard[i].id) in self.negatives for idx in shares for i in idx):
            chunks = self._as_mined([i for idx in shares for i in idx])
        for idx in chunks:
            chunk = [self.shard[i] for i in idx]
            negatives = [self.negatives[_base_id(ex.id)] for ex in chunk]
            self.delivered += sum(map(len, negatives))
            yield chunk, negatives

    def _as_mined(self, order: list[int]) -> Iterator[list[int]]:
        import ray

        from raycl.miners.beam_search import MinedNegatives, split_nbest

        waiting, ready, first = list(order), list[int](), True
        while waiting or ready:
            if len(ready) < self.batch_size and waiting:
                t0 = time.perf_counter()
                missing = sorted({_base_id(self.shard[i].id) for i in waiting} - set(self.negatives))
                got = ray.get(self.stream.wait_ready.remote(missing, self.poll_s)) if missing else []
                for it in got:
                    nbest, source_score = split_nbest(MinedNegatives(it.id, tuple(it.negatives), tuple(it.scores)))
                    self.negatives[it.id] = self.select(nbest, source_score, self._by_base[it.id])
                now_ready = [i for i in waiting if _base_id(self.shard[i].id) in self.negatives]
                ready += now_ready
                waiting = [i for i in waiting if _base_id(self.shard[i].id) not in self.negatives]
                waited = time.perf_counter() - t0
                self.mine_wait += waited
                if first:
                    self.first_wait += waited
                if len(ready) < self.batch_size and waiting:
                    continue
            batch, ready = ready[: self.batch_size], ready[self.batch_size :]
            first = False
            yield batch

    @property
    def _by_base(self) -> dict[str, GecExample]:
        if not hasattr(self, "_base_map"):
            self._base_map = {_base_id(ex.id): ex for ex in self.shard}
        return self._base_map

    def after_step(self, step: int, model: torch.nn.Module) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {"timing/mine_wait": self.mine_wait, "timing/mine_wait_first": self.first_wait,
                "stream/negatives": float(self.delivered), "stream/version": 0.0, "stream/staleness_max": 0.0,
                "stream/refused": 0.0}  # fmt: skip

    def state(self) -> dict[str, Any]:
        return {}

    def resume(self, state: dict[str, Any], model: torch.nn.Module) -> None:
        pass


def _base_id(id_: str) -> str:
    return id_.removesuffix("#pad")
