"""Negatives selected by each trial from the run's one shared n-best of the base model (version 0)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch import nn

from raycl.data.gec import GecExample
from raycl.miners.beam_search import select_from_nbest
from raycl.miners.records import MinedNegatives
from raycl.training.negatives.base import Plan, base_id
from raycl.training.prefetch import Call

# the n-best lists of those of some ids mined so far, by id: (the n-best, S(s|s)); waits up to a timeout while none
# is (``raycl.distributed.nbest.wait_nbest`` on the run's n-best stream)
WaitNBest = Callable[[list[str], float], dict[str, tuple[MinedNegatives, float]]]


class NBestNegatives:
    """Negatives selected from the run's shared n-best (``raycl.distributed.nbest``, read through ``wait``):
    version 0, mined once per run. While it is being mined, an epoch's pools are this rank's share of the epoch in
    the order their lists arrive (the first trials train as the n-best is mined); once this rank has them all, the
    plan's."""

    read_ahead = True
    version = 0

    def __init__(
        self,
        wait: WaitNBest,
        examples: Sequence[GecExample],
        plan: Plan,
        *,
        batch_size: int,
        select: Callable[[MinedNegatives, float, GecExample], list[str]],
        poll_s: float = 1.0,
    ) -> None:
        self.wait, self.shard, self.plan, self.batch_size = wait, examples, plan, batch_size
        self.select, self.poll_s = select, poll_s
        self.by_base = {base_id(ex.id): ex for ex in examples}
        self.selected: dict[str, list[str]] = {}  # by base id: this rank's selected negatives
        self.mine_wait = self.first_wait = 0.0
        self.delivered = 0  # negatives in this epoch's pools

    def pools(self, epoch: int, start: int, model: nn.Module) -> Iterator[list[GecExample] | Call]:
        self.mine_wait = self.first_wait = 0.0
        self.delivered = 0
        shares = self.plan(epoch)
        chunks: Iterator[list[int]] = iter(shares)
        if not all(base_id(self.shard[i].id) in self.selected for idx in shares for i in idx):
            chunks = self._as_mined([i for idx in shares for i in idx])
        for idx in chunks:
            yield [self.shard[i] for i in idx]

    def negatives(self, ids: Sequence[str], version: int) -> list[list[Any]]:
        out = [self.selected[base_id(i)] for i in ids]
        self.delivered += sum(map(len, out))
        return out

    def _as_mined(self, order: list[int]) -> Iterator[list[int]]:
        waiting, ready, first = list(order), list[int](), True
        while waiting or ready:
            if len(ready) < self.batch_size and waiting:
                t0 = time.perf_counter()
                missing = sorted({base_id(self.shard[i].id) for i in waiting} - set(self.selected))
                for id_, (nbest, source_score) in self.wait(missing, self.poll_s).items():
                    self.selected[id_] = self.select(nbest, source_score, self.by_base[id_])
                ready += [i for i in waiting if base_id(self.shard[i].id) in self.selected]
                waiting = [i for i in waiting if base_id(self.shard[i].id) not in self.selected]
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
        return {
            "timing/mine_wait": self.mine_wait,
            "timing/mine_wait_first": self.first_wait,
            "stream/negatives": float(self.delivered),
            "stream/version": 0.0,
            "stream/staleness_max": 0.0,
            "stream/refused": 0.0,
        }

    def state(self) -> dict[str, Any]:
        return {}

    def resume(self, state: dict[str, Any], model: nn.Module) -> None:
        pass


def selected(nbest: MinedNegatives, source_score: float, example: GecExample, **rule: Any) -> list[str]:
    return list(select_from_nbest(nbest, source_score, example, **rule).negatives)
