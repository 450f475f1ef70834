"""Dense hard negatives by anchor text (docs/dense.md): a pre-mined pool as the trainer's negative source.

The pool is a Parquet file or folder of ``raycl.mine dense``'s output (any format but ``labeled-pair``), mined
once with the base encoder (version 0) and no margin. Each training keeps, per anchor, the first
``num_negatives`` candidates that pass its own margins, with the miner's formulas (:mod:`raycl.miners.dense`;
p the anchor's hardest positive score): ``absolute_margin`` m keeps s ≤ p − m, ``relative_margin`` r keeps
s ≤ p − |p|·r. On a pool mined without margins that is what mining with the training's margins and
``range_max = pool`` gives, so a sweep over margins and counts mines once.

A run mines its pool once (:func:`raycl.distributed.dense_api.mine_pool_once`): the first training that needs it,
in its process, under a lock that a training coming meanwhile waits on.

The source is the ``{anchor: its negatives}`` mapping a step reads as it collates its sentences (an anchor with
none is absent: that sentence gets in-batch negatives only) — :class:`DensePool`, or, refreshed while training
(``mining.refresh``), that selection as version 0 of the table the training's own miners re-mine
(:class:`raycl.distributed.dense_refresh_feed.RefreshedNegatives`). Its batches are the recipe's plan, not the
source's (no ``pools``): the loop resumes it, calls its ``after_update``, and reports and checkpoints it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from torch import nn

from raycl.errors import UserError
from raycl.files import atomic_file
from raycl.miners.dense import group_pairs
from raycl.miners.dense_io import CORPUS_COLUMN, read_anchor_negatives
from raycl.miners.sources import DenseRefresh, RefreshAnchor
from raycl.training.task import Worker

ANCHOR, POSITIVE = "anchor", "positive"  # the pool's (anchor, positive) columns


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


def refresh_options(rows: list[dict[str, str]], corpus: list[str], work: Path, **selection: Any) -> dict[str, Any]:
    """The options of the miners that refresh a pool of the (anchor, positive) ``rows`` (kind ``dense_refresh``,
    ``raycl.distributed.dense_refresh``): their candidates — ``corpus`` and every positive, each once — written
    into ``<work>/_corpus.parquet``, their work folder, the most positives an anchor has, and the pool's and the
    training's ``selection`` (``pool``, ``num_negatives``, the margins, ``batch_size``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    _, positives, max_positives = group_pairs([r[ANCHOR] for r in rows], [r[POSITIVE] for r in rows])
    texts = list(dict.fromkeys([*corpus, *(p for ps in positives for p in ps)]))
    work.mkdir(parents=True, exist_ok=True)
    with atomic_file(work / "_corpus.parquet", "wb") as f:
        pq.write_table(pa.table({CORPUS_COLUMN: pa.array(texts, pa.string())}), f)
    return {
        **selection,
        "corpus": str(work / "_corpus.parquet"),
        "work_dir": str(work),
        "max_positives": max_positives,
    }


def refresh_anchors(rows: list[dict[str, str]], world_size: int) -> list[list[RefreshAnchor]]:
    """Every anchor (with its positives) of the (anchor, positive) rows for every trainer rank, ids unique across
    ranks (each rank's batches hold any sentence, so each rank receives every anchor's refreshed negatives)."""
    queries, grouped, _ = group_pairs([r[ANCHOR] for r in rows], [r[POSITIVE] for r in rows])
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


def open_dense(m: Selection, spec: Any, rows: list[dict[str, str]] | None, w: Worker) -> Mapping[str, list[str]]:
    """A worker's source: the pool's selection, or with ``rows`` (the (anchor, positive) rows to re-mine) the
    table that the miners behind ``spec`` — the stream and weight store the driver started — refresh (opened by
    the worker's session)."""
    pool = DensePool(selected(m))
    if rows is None:
        return pool
    if not isinstance(spec, DenseRefresh):
        raise RuntimeError(
            "mining.refresh: the training was started without a negative stream (train it through "
            "the recipe's driver, python -m raycl.train / raycl.tune)"
        )
    anchors = refresh_anchors(rows, w.world_size)
    return w.session.open_refreshed(spec, pool.table, anchors, rank=w.rank, world_size=w.world_size)
