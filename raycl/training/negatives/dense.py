"""Dense hard negatives by anchor text (docs/dense.md): a pre-mined pool as the trainer's negative source.

The pool is a Parquet file or folder of ``raycl.mine dense``'s output (any format but ``labeled-pair``), mined
once with the base encoder (version 0) and no margin. Each training keeps, per anchor, the first
``num_negatives`` candidates that pass its own margins, with the miner's formulas (:mod:`raycl.miners.dense`;
p the anchor's hardest positive score): ``absolute_margin`` m keeps s ≤ p − m, ``relative_margin`` r keeps
s ≤ p − |p|·r. On a pool mined without margins that is what mining with the training's margins and
``range_max = pool`` gives, so a sweep over margins and counts mines once.

The source is the ``{anchor: its negatives}`` mapping a step reads as it collates its sentences (an anchor with
none is absent: that sentence gets in-batch negatives only) — :class:`DensePool`, or, refreshed while training
(``mining.refresh``), that selection as version 0 of the table the training's own miners re-mine
(:class:`raycl.distributed.dense_refresh_feed.RefreshedNegatives`). Its batches are the recipe's plan, not the
source's (no ``pools``): the loop resumes it, calls its ``after_update``, and reports and checkpoints it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from torch import nn

from raycl.errors import UserError
from raycl.miners.dense import group_pairs
from raycl.miners.dense_io import read_anchor_negatives
from raycl.miners.sources import DenseRefresh, RefreshAnchor
from raycl.training.task import Worker


class Selection(Protocol):
    """What a training keeps of the pool (its mining section): ``negatives`` is the pool's path."""

    negatives: str
    num_negatives: int
    relative_margin: float | None
    absolute_margin: float | None


def check_pool(m: Selection) -> int:
    """The driver's check of the pool ``m.negatives`` (before Ray starts): readable, and scored where a margin
    is set. Returns the anchors it holds."""
    found = read_anchor_negatives(m.negatives)
    margin = m.relative_margin is not None or m.absolute_margin is not None
    if margin and any(v.scores is None for v in found.values()):
        raise UserError(
            f"mining.negatives: {m.negatives}: no scores, expected them with mining.relative_margin "
            "or mining.absolute_margin (mine with --output-scores)"
        )
    return len(found)


def selected(m: Selection) -> dict[str, list[str]]:
    """A training's negatives: ``{anchor: its selection}`` (anchors left with none are left out)."""
    chosen = {a: v.select(m, anchor=a) for a, v in read_anchor_negatives(m.negatives).items()}
    return {a: n for a, n in chosen.items() if n}


def refresh_anchors(
    anchors: Sequence[str], positives: Sequence[str], world_size: int
) -> list[list[RefreshAnchor]]:
    """Every anchor (with its positives) of the (anchor, positive) rows for every trainer rank, ids unique across
    ranks (each rank's batches hold any sentence, so each rank receives every anchor's refreshed negatives)."""
    queries, grouped, _ = group_pairs(list(anchors), list(positives))
    return [
        [RefreshAnchor(f"{rank}/{i}", q, tuple(p)) for i, (q, p) in enumerate(zip(queries, grouped, strict=True))]
        for rank in range(world_size)
    ]


class DensePool(Mapping[str, list[str]]):
    """A pre-mined pool's selection: version 0 for the whole training, nothing to publish, resume or report."""

    read_ahead = True
    version = 0

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table

    def __getitem__(self, anchor: str) -> list[str]:
        return self.table[anchor]

    def __iter__(self) -> Iterator[str]:
        return iter(self.table)

    def __len__(self) -> int:
        return len(self.table)

    def after_update(self, step: int, model: nn.Module) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}

    def state(self) -> dict[str, Any]:
        return {}

    def resume(self, state: dict[str, Any], model: nn.Module) -> None:
        pass


def open_dense(
    m: Selection, spec: Any, pairs: tuple[list[str], list[str]] | None, w: Worker
) -> Mapping[str, list[str]]:
    """A worker's source: the pool's selection, or with ``pairs`` (the anchors and positives to re-mine) the
    table that the miners behind ``spec`` — the stream and weight store the driver started — refresh (opened by
    the worker's session)."""
    pool = DensePool(selected(m))
    if pairs is None:
        return pool
    if not isinstance(spec, DenseRefresh):
        raise RuntimeError(
            "mining.refresh: the training was started without a negative stream (train it through "
            "the recipe's driver, python -m raycl.train / raycl.tune)"
        )
    anchors = refresh_anchors(*pairs, w.world_size)
    return w.session.open_refreshed(spec, pool.table, anchors, rank=w.rank, world_size=w.world_size)
