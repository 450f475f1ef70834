"""Crash and stall switches for miner processes (RLlib's ``CartPoleCrashing``): a :class:`Chaos` given to a
``MinerFactory`` (a miner pool), ``mine_corpus(faults=…)`` (corpus mining's range miners) or
``mine_dense_negatives(faults=…)`` (dense mining's two pools) — the product's seam is
:class:`raycl.distributed.miner_pool.MinerFaults`."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from raycl.distributed.miner_pool import FaultSite

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Chaos:
    """What breaks, and where (none by default). The task switches fire in an actor's first life only; the range
    switches in every life (a range that always kills its miner, as an out-of-memory one would)."""

    fail_after_tasks: int = 0  # os._exit(1) once this many tasks are mined (the last is never handed back)
    stall_s: float = 0.0  # sleep this long after the stall_after_tasks-th task (its lease may run out)
    stall_after_tasks: int = 1
    # corpus mining (RangeMiner): a range that always raises, or always kills its miner (an OOM)
    raise_in_ranges: tuple[int, ...] = ()
    die_in_ranges: tuple[int, ...] = ()
    miners: tuple[int, ...] | None = None  # the miners it strikes (None: all)
    stages: tuple[str, ...] = ("embed", "mine")  # dense mining's pools it strikes

    def _strikes(self, site: FaultSite) -> bool:
        return (self.miners is None or site.miner_id in self.miners) and site.stage in self.stages

    def before_range(self, index: int, site: FaultSite) -> None:
        if not self._strikes(site):
            return
        if index in self.die_in_ranges:
            log.warning("chaos crash in range %d", index)
            os._exit(1)
        if index in self.raise_in_ranges:
            raise RuntimeError(f"chaos: mining range {index} raised")

    def after_task(self, done: int, site: FaultSite) -> None:
        if not (self._strikes(site) and site.first_life):
            return
        if self.fail_after_tasks and done >= self.fail_after_tasks:
            log.warning("miner %d: chaos crash after %d tasks", site.miner_id, done)
            os._exit(1)
        if self.stall_s and done == self.stall_after_tasks:
            time.sleep(self.stall_s)
