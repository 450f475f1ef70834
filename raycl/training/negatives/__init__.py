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

The sources, one module each: :class:`StaticNegatives` (``static``: pre-mined Parquet, or none),
:class:`StreamNegatives` (``live``: mined while training), :class:`NBestNegatives` (``nbest``: the sweep's shared
n-best, selected per trial), :class:`PermutationNegatives` (``permutations``: coherence's own permutations, then
the miners' ranking of them). A new kind is a record of :mod:`raycl.miners.sources`, a module here and one branch
of :func:`open_source`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from raycl.distributed.consumer import StreamConsumer
from raycl.miners.sources import (
    DenseRefresh,
    LiveStream,
    Permutations,
    PreMined,
    RefreshAnchor,
    SharedNBest,
    SourceSpec,
)
from raycl.training.negatives.base import PAD, NegativeSource, Place, Plan
from raycl.training.negatives.live import StreamNegatives
from raycl.training.negatives.nbest import NBestNegatives, selected
from raycl.training.negatives.permutations import PermutationNegatives
from raycl.training.negatives.static import StaticNegatives, read_premined

__all__ = [
    "PAD",
    "NBestNegatives",
    "NegativeSource",
    "PermutationNegatives",
    "Place",
    "Plan",
    "StaticNegatives",
    "StreamNegatives",
    "open_refreshed",
    "open_source",
]


def open_source(spec: SourceSpec | None, at: Place[Any]) -> NegativeSource[Any]:
    """The source a worker holds for the driver's ``spec`` (None: no negatives)."""
    if spec is None:
        return StaticNegatives(at.examples, {}, at.planned())
    if isinstance(spec, PreMined):
        return StaticNegatives(at.examples, read_premined(spec, at.examples), at.planned())
    if isinstance(spec, SharedNBest):
        select = functools.partial(
            selected,
            k=spec.k,
            source_negative=spec.source_negative,
            refill=spec.refill,
            false_negatives=spec.false_negatives,
        )
        return NBestNegatives(spec.stream, at.examples, at.planned(), batch_size=at.batch_size, select=select)
    if isinstance(spec, LiveStream):
        return StreamNegatives(
            _consumer(spec.stream, spec.store, spec.max_staleness, at),
            at.shards,
            batch_size=at.batch_size,
            sync_every=spec.sync_every,
            refresh_every=spec.refresh_every,
        )
    if isinstance(spec, Permutations):
        consumer = _consumer(spec.stream, spec.store, spec.max_staleness, at) if spec.stream is not None else None
        return PermutationNegatives(
            at.shards, at.rank, batch_size=at.batch_size, rank_every=spec.rank_every, consumer=consumer
        )
    raise TypeError(f"no negative source opens {type(spec).__name__}: add it to open_source")


def open_refreshed(
    spec: DenseRefresh,
    initial: Mapping[str, Sequence[str]],
    anchors: list[list[RefreshAnchor]],
    *,
    rank: int,
    world_size: int,
) -> Any:
    """STS's dense negatives refreshed while training: the ``{anchor: negatives}`` mapping its step reads, from the
    pre-mined ``initial`` (version 0) on, refreshed by the miners behind ``spec``
    (:class:`raycl.distributed.dense_refresh_feed.RefreshedNegatives`)."""
    from raycl.distributed.dense_refresh_feed import RefreshedNegatives

    return RefreshedNegatives(
        initial,
        anchors,
        stream=spec.stream,
        store=spec.store,
        rank=rank,
        world_size=world_size,
        refresh_every=spec.refresh_every,
        max_staleness=spec.max_staleness,
        wait_s=spec.wait_s,
    )


def _consumer(stream: Any, store: Any, max_staleness: int, at: Place[Any]) -> StreamConsumer:
    return StreamConsumer(stream, store, rank=at.rank, world_size=at.world_size, max_staleness=max_staleness)
