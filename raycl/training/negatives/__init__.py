"""The one place a trainer's negatives come from: a :class:`NegativeSource`, below the loop.

A negative goes one way (docs/architecture.md, "A negative's path")::

    miners → stream → source → batches → loop → step → loss

The driver names the source from the recipe's mining section (``cfg.mining.source(...)``: a record of
:mod:`raycl.miners.sources`, with the handles of the actors it started) and puts it in the job; each worker opens
it through its session (``w.session.open_source``: ``raycl.distributed.session``, the one place that builds
a source from a spec) with what only the worker knows — its rank, its examples, their order
(:class:`Place`). Its loop then asks the source two things an epoch: the order of this rank's examples, pool by
pool (:meth:`NegativeSource.pools`: the plan's where negatives are known ahead, else the order miners deliver
them), and each pool's negatives by example id and the weight version the trainer holds
(:meth:`NegativeSource.negatives`). The stream, its exactly-once ledger, the staleness bound and the weight
publication stay behind the source (``raycl.distributed``; a live source holds the stream's end as a
:class:`StreamEnd`): neither this package nor any recipe imports them, nor Ray.

The sources, one module each: :class:`StaticNegatives` (``static``: pre-mined Parquet, or none),
:class:`StreamNegatives` (``live``: mined while training), :class:`NBestNegatives` (``nbest``: the sweep's shared
n-best, selected per trial), :class:`PermutationNegatives` (``permutations``: coherence's own permutations, then
the miners' ranking of them). A new kind is a record of :mod:`raycl.miners.sources`, a module here and one branch
of the session's ``open_source``.
"""

from __future__ import annotations

from typing import Any

from raycl.miners.sources import Permutations, PreMined, SourceSpec
from raycl.training.negatives.base import PAD, NegativeSource, Place, Plan, StreamEnd
from raycl.training.negatives.live import StreamNegatives
from raycl.training.negatives.nbest import NBestNegatives
from raycl.training.negatives.permutations import PermutationNegatives
from raycl.training.negatives.static import StaticNegatives, open_static

__all__ = [
    "PAD",
    "NBestNegatives",
    "NegativeSource",
    "PermutationNegatives",
    "Place",
    "Plan",
    "StaticNegatives",
    "StreamEnd",
    "StreamNegatives",
    "open_unmined",
]


def open_unmined(spec: SourceSpec | None, at: Place[Any]) -> NegativeSource[Any] | None:
    """The sources no miner stands behind — pre-mined Parquet, none, coherence's own permutations — which any
    session opens; None for the others (their stream is Ray's: ``raycl.distributed.session.open_source``)."""
    if spec is None or isinstance(spec, PreMined):
        return open_static(spec, at)
    if isinstance(spec, Permutations) and spec.stream is None:
        return PermutationNegatives(
            at.shards, at.rank, batch_size=at.batch_size, rank_every=spec.rank_every, consumer=None
        )
    return None
