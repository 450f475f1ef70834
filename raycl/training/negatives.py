"""The one place a trainer's negatives come from: a :class:`NegativeSource`, below the loop.

A negative goes one way (docs/architecture.md, "A negative's path")::

    miners → stream → source → batches → loop → step → loss

The driver names the source from the recipe's mining section (``cfg.mining.source(...)``: a record of
:mod:`raycl.miners.sources`, with the handles of the actors it started) and puts it in the job; each worker opens
it here (:func:`open_source`) with what only the worker knows — its rank, its examples, their order
(:class:`Place`). Its loop then asks the source two things an epoch: the order of this rank's examples, pool by
pool (:meth:`NegativeSource.pools`: the plan's where negatives are known ahead, else the order miners deliver
them), and each pool's negatives by example id and the weight version the trainer holds
(:meth:`NegativeSource.negatives`). The stream, its exactly-once ledger, the staleness bound and the weight
publication stay behind the source (``raycl.distributed``): no recipe imports them, nor Ray.

The sources: :class:`StaticNegatives` (pre-mined Parquet, or none), :class:`StreamNegatives` (mined while
training), :class:`NBestNegatives` (the sweep's shared n-best, selected per trial), :class:`PermutationNegatives`
(coherence: an item's own permutations, then the miners' ranking of them).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from torch import nn

from raycl import storage
from raycl.data.coherence import CoherenceItem
from raycl.data.gec import GecExample
from raycl.distributed.consumer import StreamConsumer
from raycl.distributed.messages import StreamItem
from raycl.distributed.nbest import wait_nbest
from raycl.miners.beam_search import MinedNegatives, select_from_nbest
from raycl.miners.permutation import decode_doc
from raycl.miners.shards import read_negatives, without_false_negatives
from raycl.miners.sources import LiveStream, Permutations, PreMined, SharedNBest, SourceSpec
from raycl.training.prefetch import Call

PAD = "#pad"  # the id suffix of an example copied to even out the ranks' shares (its negatives are the original's)
Plan = Callable[[int], list[list[int]]]  # an epoch → this rank's batches of it, as indices into its examples


class Example(Protocol):
    @property
    def id(self) -> str: ...


E = TypeVar("E", bound=Example)


class NegativeSource(Protocol[E]):
    """Where a trainer's negatives come from. ``read_ahead``: whether pools may be read ahead of the step (in a
    background thread); False where each read must see the updates before it (a staleness rule against a version
    that updates move on)."""

    read_ahead: bool

    @property
    def version(self) -> int:
        """The weight version the trainer holds (0 for negatives mined once, by the base model)."""

    def pools(self, epoch: int, start: int, model: nn.Module) -> Iterator[list[E] | Call]:
        """This rank's examples of ``epoch`` from its ``start``-th, pool by pool, in the order their negatives can
        be given; a :class:`Call` where something must run in the training thread first (publishing weights)."""

    def negatives(self, ids: Sequence[str], version: int) -> list[list[Any]]:
        """The negatives of the examples ``ids`` (of the pool just given) for a trainer at weight ``version``."""

    def after_update(self, step: int, model: nn.Module) -> None: ...
    def metrics(self) -> dict[str, float]: ...
    def state(self) -> dict[str, Any]: ...

    def resume(self, state: dict[str, Any], model: nn.Module) -> None:
        """From a checkpoint's ``state()``."""


@dataclass(frozen=True)
class Place(Generic[E]):
    """What a worker knows that the driver does not."""

    rank: int
    world_size: int
    examples: Sequence[E]  # every rank's, in the data's order
    shards: list[list[E]]  # each rank's share: a stream schedules every rank's (rank 0)
    batch_size: int
    plan: Plan | None = None  # this rank's batches of an epoch, indices into ``examples``, where known ahead

    def planned(self) -> Plan:
        if self.plan is None:
            raise ValueError("negatives known ahead need the plan of an epoch's batches (Place.plan)")
        return self.plan


def _base(id_: str) -> str:
    return id_.removesuffix(PAD)


# ---------------------------------------------------------------------------------------------- known ahead
class StaticNegatives(Generic[E]):
    """Negatives known before training (pre-mined, or none: pretraining, NLL), by id, in the plan's order."""

    read_ahead = True
    version = 0

    def __init__(self, examples: Sequence[E], by_id: dict[str, list[str]], plan: Plan) -> None:
        self.examples, self.by_id, self.plan = examples, by_id, plan

    def pools(self, epoch: int, start: int, model: nn.Module) -> Iterator[list[E] | Call]:
        for idx in self.plan(epoch):
            yield [self.examples[i] for i in idx]

    def negatives(self, ids: Sequence[str], version: int) -> list[list[Any]]:
        return [self.by_id.get(_base(i), []) for i in ids]

    def after_update(self, step: int, model: nn.Module) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {"timing/mine_wait": 0.0, "timing/mine_wait_first": 0.0}

    def state(self) -> dict[str, Any]:
        return {}

    def resume(self, state: dict[str, Any], model: nn.Module) -> None:
        pass


def read_premined(spec: PreMined, examples: Sequence[Example]) -> dict[str, list[str]]:
    """The pre-mined negatives of ``examples`` by id: every rank's epoch draws its share of the global batches from
    all of the data, so every row is read (by id, a filter pushed down)."""
    where = storage.fetch(spec.uri)  # a URI: fetched once to this node's cache
    mined = read_negatives(where, ids={ex.id for ex in examples})
    negatives = {i: list(m.negatives) for i, m in mined.items()}
    return without_false_negatives(spec.uri, negatives) if spec.drop_false_negatives else negatives


# ---------------------------------------------------------------------------------------------- while training
class _Live:
    """The trainer's end of a live stream: its weight version, the staleness bound on what it gives, resuming."""

    def __init__(self, consumer: StreamConsumer) -> None:
        self.consumer = consumer
        self._taken: dict[str, StreamItem] = {}  # the pool just taken, by id

    @property
    def version(self) -> int:
        return self.consumer.version

    def _take(self, n: int, epoch: int) -> list[StreamItem]:
        items = self.consumer.take(n, epoch=epoch)  # refuses (re-mines) what is too stale
        self._taken = {it.id: it for it in items}
        return items

    def _fresh(self, ids: Sequence[str], version: int) -> list[tuple[str, ...]]:
        floor = version - self.consumer.max_staleness
        items = [self._taken[i] for i in ids]
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


class StreamNegatives(_Live, Generic[E]):
    """Negatives from the miner pool, in the order they are delivered. ``sync_every`` updates move the weight
    version on (rank 0 publishes); ``refresh_every`` epochs publish before the epoch, so everything is mined again
    with newer weights. An interrupted epoch is delivered again from its start."""

    def __init__(self, consumer: StreamConsumer, shards: list[list[E]], *, batch_size: int, sync_every: int,
                 refresh_every: int) -> None:  # fmt: skip
        super().__init__(consumer)
        self.shards, self.batch_size = shards, batch_size
        self.sync_every, self.refresh_every = sync_every, refresh_every
        self.by_id = {ex.id: ex for ex in shards[consumer.rank]}
        self.read_ahead = sync_every <= 0  # publications between updates: each take sees the version they set

    def pools(self, epoch: int, start: int, model: nn.Module) -> Iterator[list[E] | Call]:
        if epoch > 0 and self.refresh_every > 0 and epoch % self.refresh_every == 0:
            yield Call(functools.partial(self.consumer.publish, model))  # in the training thread
        self.consumer.start_epoch(epoch, self.shards)
        while items := self._take(self.batch_size, epoch):
            yield [self.by_id[it.id] for it in items]

    def negatives(self, ids: Sequence[str], version: int) -> list[list[Any]]:
        return [list(negs) for negs in self._fresh(ids, version)]

    def after_update(self, step: int, model: nn.Module) -> None:
        if self.sync_every > 0 and step % self.sync_every == 0:
            self.consumer.publish(model)

    def metrics(self) -> dict[str, float]:
        out = {**self.consumer.stats.metrics(), "stream/version": float(self.consumer.version)}
        return {**out, **self.consumer.buffer()} if self.consumer.rank == 0 else out


# ---------------------------------------------------------------------------------------------- the shared n-best
class NBestNegatives:
    """Negatives selected from the run's shared n-best (``raycl.distributed.nbest``): version 0, mined once per
    run. While it is being mined, an epoch's pools are this rank's share of the epoch in the order their lists
    arrive (the first trials train as the n-best is mined); once this rank has them all, the plan's."""

    read_ahead = True
    version = 0

    def __init__(self, stream: Any, examples: Sequence[GecExample], plan: Plan, *, batch_size: int,
                 select: Callable[[MinedNegatives, float, GecExample], list[str]], poll_s: float = 1.0
                 ) -> None:  # fmt: skip
        self.stream, self.shard, self.plan, self.batch_size = stream, examples, plan, batch_size
        self.select, self.poll_s = select, poll_s
        self.by_base = {_base(ex.id): ex for ex in examples}
        self.selected: dict[str, list[str]] = {}  # by base id: this rank's selected negatives
        self.mine_wait = self.first_wait = 0.0
        self.delivered = 0  # negatives in this epoch's pools

    def pools(self, epoch: int, start: int, model: nn.Module) -> Iterator[list[GecExample] | Call]:
        self.mine_wait = self.first_wait = 0.0
        self.delivered = 0
        shares = self.plan(epoch)
        chunks: Iterator[list[int]] = iter(shares)
        if not all(_base(self.shard[i].id) in self.selected for idx in shares for i in idx):
            chunks = self._as_mined([i for idx in shares for i in idx])
        for idx in chunks:
            yield [self.shard[i] for i in idx]

    def negatives(self, ids: Sequence[str], version: int) -> list[list[Any]]:
        out = [self.selected[_base(i)] for i in ids]
        self.delivered += sum(map(len, out))
        return out

    def _as_mined(self, order: list[int]) -> Iterator[list[int]]:
        waiting, ready, first = list(order), list[int](), True
        while waiting or ready:
            if len(ready) < self.batch_size and waiting:
                t0 = time.perf_counter()
                missing = sorted({_base(self.shard[i].id) for i in waiting} - set(self.selected))
                for id_, (nbest, source_score) in wait_nbest(self.stream, missing, self.poll_s).items():
                    self.selected[id_] = self.select(nbest, source_score, self.by_base[id_])
                ready += [i for i in waiting if _base(self.shard[i].id) in self.selected]
                waiting = [i for i in waiting if _base(self.shard[i].id) not in self.selected]
                waited = time.perf_counter() - t0
                self.mine_wait += waited
                if first:
                    self.first_wait += waited
                if len(ready) < self.batch_size and waiting:
                    continue
            batch, ready = ready[: self.batch_size], ready[self.batch_size :]
            first = False
            yield batch

    def after_update(self, step: int, model: nn.Module) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {"timing/mine_wait": self.mine_wait, "timing/mine_wait_first": self.first_wait,
                "stream/negatives": float(self.delivered), "stream/version": 0.0, "stream/staleness_max": 0.0,
                "stream/refused": 0.0}  # fmt: skip

    def state(self) -> dict[str, Any]:
        return {}

    def resume(self, state: dict[str, Any], model: nn.Module) -> None:
        pass


def _selected(nbest: MinedNegatives, source_score: float, example: GecExample, **rule: Any) -> list[str]:
    return list(select_from_nbest(nbest, source_score, example, **rule).negatives)


# ---------------------------------------------------------------------------------------------- coherence
class PermutationNegatives:
    """Coherence: this rank's items of an epoch, resumable at ``start`` items, with their own permutations — or,
    with a stream, after the first chunk of the first epoch, the ones the miners ranked highest with the weights
    published at the start of the item's chunk (``rank_every`` items)."""

    read_ahead = True

    def __init__(self, shards: list[list[CoherenceItem]], rank: int, *, batch_size: int, rank_every: int,
                 consumer: StreamConsumer | None) -> None:  # fmt: skip
        self.shards, self.rank, self.batch_size, self.every = shards, rank, batch_size, rank_every
        self.live = _Live(consumer) if consumer is not None else None
        self.by_id = {it.id: it for it in shards[rank]}
        self._ledger: dict[str, Any] | None = None  # a checkpoint's position in the stream, for its epoch

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

    def _start_epoch(self, epoch: int, live: _Live) -> None:
        live._taken, consumer = {}, live.consumer
        firsts, v0 = self._firsts(epoch), consumer.version
        # the version published at the start of an item's chunk, known now: miners wait for it (less the allowed
        # staleness) rather than rank with older weights what the trainer would refuse
        floors = {it.id: v0 + pos // self.every + (epoch > 0) - consumer.max_staleness
                  for s, f in zip(self.shards, firsts, strict=True) for pos, it in enumerate(s) if pos >= f}
        consumer.start_epoch(epoch, [s[f:] for s, f in zip(self.shards, firsts, strict=True)], shuffle=False,
                             min_versions=floors)  # fmt: skip
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
            got = self.live._take(min(self.batch_size, self.every - pos % self.every), epoch)
            if not got:
                return
            pos += len(got)
            yield [self.by_id[it.id] for it in got]

    def negatives(self, ids: Sequence[str], version: int) -> list[list[Any]]:
        """Documents (tuples of sentences), best first: an item's own, or those taken from the stream."""
        if self.live is None or not ids or ids[0] not in self.live._taken:  # a pool is all own or all taken
            return [list(self.by_id[i].negs) for i in ids]
        return [[decode_doc(d) for d in negs] for negs in self.live._fresh(ids, version)]

    def after_update(self, step: int, model: nn.Module) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        if self.live is None:
            return {}
        return {**self.live.consumer.stats.metrics(), "stream/version": float(self.live.version)}

    def state(self) -> dict[str, Any]:
        return {"version": self.version}

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


# ---------------------------------------------------------------------------------------------- opening one
def open_source(spec: SourceSpec | None, at: Place[Any]) -> NegativeSource[Any]:
    """The source a worker holds for the driver's ``spec`` (None: no negatives)."""
    if spec is None:
        return StaticNegatives(at.examples, {}, at.planned())
    if isinstance(spec, PreMined):
        return StaticNegatives(at.examples, read_premined(spec, at.examples), at.planned())
    if isinstance(spec, SharedNBest):
        select = functools.partial(_selected, k=spec.k, source_negative=spec.source_negative, refill=spec.refill,
                                   false_negatives=spec.false_negatives)  # fmt: skip
        return NBestNegatives(spec.stream, at.examples, at.planned(), batch_size=at.batch_size, select=select)
    if isinstance(spec, LiveStream):
        return StreamNegatives(_consumer(spec.stream, spec.store, spec.max_staleness, at), at.shards,
                               batch_size=at.batch_size, sync_every=spec.sync_every,
                               refresh_every=spec.refresh_every)  # fmt: skip
    if isinstance(spec, Permutations):
        consumer = _consumer(spec.stream, spec.store, spec.max_staleness, at) if spec.stream is not None else None
        return PermutationNegatives(at.shards, at.rank, batch_size=at.batch_size, rank_every=spec.rank_every,
                                    consumer=consumer)  # fmt: skip
    raise TypeError(f"no negative source opens {type(spec).__name__}: add it to open_source")


def _consumer(stream: Any, store: Any, max_staleness: int, at: Place[Any]) -> StreamConsumer:
    return StreamConsumer(stream, store, rank=at.rank, world_size=at.world_size, max_staleness=max_staleness)
