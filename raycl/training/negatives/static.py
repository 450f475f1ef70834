"""Negatives known before training: pre-mined Parquet (``mining.negatives``), or none (pretraining, NLL)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Generic

from torch import nn

from raycl import storage
from raycl.miners.shards import read_negatives, without_false_negatives
from raycl.miners.sources import PreMined
from raycl.training.negatives.base import E, Example, Place, Plan, base_id
from raycl.training.prefetch import Call


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
        return [self.by_id.get(base_id(i), []) for i in ids]

    def after_update(self, step: int, model: nn.Module) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {"timing/mine_wait": 0.0, "timing/mine_wait_first": 0.0}

    def state(self) -> dict[str, Any]:
        return {}

    def resume(self, state: dict[str, Any], model: nn.Module) -> None:
        pass


def open_static(spec: PreMined | None, at: Place[E]) -> StaticNegatives[E]:
    """Pre-mined negatives (or none) in the plan's order: the sources no miner stands behind."""
    return StaticNegatives(at.examples, read_premined(spec, at.examples) if spec is not None else {}, at.planned())


def read_premined(spec: PreMined, examples: Sequence[Example]) -> dict[str, list[str]]:
    """The pre-mined negatives of ``examples`` by id: every rank's epoch draws its share of the global batches from
    all of the data, so every row is read (by id, a filter pushed down)."""
    where = storage.fetch(spec.uri)  # a URI: fetched once to this node's cache
    mined = read_negatives(where, ids={ex.id for ex in examples})
    negatives = {i: list(m.negatives) for i, m in mined.items()}
    return without_false_negatives(spec.uri, negatives) if spec.drop_false_negatives else negatives
