"""The negative stream: a bounded, ordered buffer between miner actors and trainer workers (one async actor).

Miners ask for tasks (``next_task``) and hand back results (``put``); trainers ``take`` their rank's items.
Back-pressure is by credits, not drops (OpenRLHF's slot semaphore; RLlib's APPO, pacing with an unbounded deque,
starved its learner: ray-project/ray#59544): a miner waits in ``next_task`` while mined-but-undelivered items plus
ids out with miners would exceed ``capacity``, so memory stays bounded however fast miners are. The
:class:`~raycl.distributed.ledger.Ledger` underneath delivers every example exactly once per epoch, also when
miners die, stall or restart. Every accepted item is also cached (id → newest item) so a later epoch can reuse
negatives instead of re-mining them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import ray

from raycl.distributed import metrics
from raycl.distributed.ledger import Ledger
from raycl.distributed.messages import MinedBatch, MineTask
from raycl.distributed.weights import WeightStore
from raycl.miners.records import MinedNegatives

__all__ = ["MinedNegatives", "NegativeStream", "start_stream"]


class NegativeStream:
    """Ledger + bounded buffer + per-rank delivery order; a plain class made an async actor by ``start_stream``.

    Args:
        world_size: number of trainer ranks; each gets its own shard of every epoch.
        capacity: ``mining.queue_size``, the most items mined-and-undelivered plus being mined at once.
        task_size: ``mining.task_size``, examples per miner task (a beam-search batch).
        lease_s: a task not returned within this many seconds goes back to pending (a stalled miner).
        seed: shuffling seed (with the epoch).
        ordered: deliver each rank's items in the seeded order (the same batches whatever the miners do), or
            as they become ready (a rank never waits behind the task of a miner that died).
    """

    def __init__(
        self,
        *,
        world_size: int,
        capacity: int,
        task_size: int,
        lease_s: float = 60.0,
        seed: int = 0,
        ordered: bool = True,
    ) -> None:
        if capacity < task_size:
            raise ValueError(f"capacity ({capacity}) must be ≥ task_size ({task_size})")
        self.ledger = Ledger(
            world_size=world_size, task_size=task_size, lease_s=lease_s, seed=seed, ordered=ordered
        )
        self.capacity = capacity
        self.cache: dict[str, MinedNegatives] = {}
        self._tick = min(1.0, lease_s / 4)  # how often blocked callers re-check leases
        self._changed: asyncio.Condition | None = None
        self._closed = False
        self._max_fill = 0
        self.searched = 0  # examples miners handed back (accepted, repeated or late alike)
        self.mine_s = 0.0  # the miners' time on them

    @property
    def changed(self) -> asyncio.Condition:
        if self._changed is None:  # created on the actor's event loop, not in __init__'s thread
            self._changed = asyncio.Condition()
        return self._changed

    async def _notify(self) -> None:
        self._observe()
        async with self.changed:
            self.changed.notify_all()

    async def _wait(self, timeout: float) -> None:
        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait(), timeout=max(timeout, 0.0))
            except asyncio.TimeoutError:
                pass

    def _observe(self) -> None:
        """The buffer's depth as a Ray metric (``raycl.distributed.metrics``), after every change."""
        metrics.stream_depth(fill=self.ledger.fill, ready=sum(len(r) for r in self.ledger.ready))

    # ------------------------------------------------------------------------------------------ driver
    async def start_epoch(
        self,
        epoch: int,
        items_per_rank: Sequence[Sequence[Any]],
        *,
        reuse_version: int | None = None,
        shuffle: bool = True,
        min_versions: dict[str, int] | None = None,
    ) -> bool:
        """Schedule ``epoch`` (each rank's items, shuffled by epoch, cut into tasks). Cached negatives mined
        at version ≥ ``reuse_version`` are delivered without mining (None: re-mine everything); ``min_versions``
        are per-id version floors for the miners (``Ledger.start_epoch``). Calling it
        again for the epoch already running does nothing (every rank may call it); an earlier epoch is a replay
        and starts again. Returns True if it started.
        """
        if epoch == self.ledger.epoch:
            return False
        # epoch < the stream's: a trainer restarted from a checkpoint older than the stream's position (a worker
        # that dies right after reporting can lose that report): the epoch is scheduled again from its start
        cached = (
            {}
            if reuse_version is None
            else {
                item.id: self.cache[item.id]
                for items in items_per_rank
                for item in items
                if item.id in self.cache and self.cache[item.id].model_version >= reuse_version
            }
        )
        self.ledger.start_epoch(epoch, items_per_rank, cached=cached, shuffle=shuffle, min_versions=min_versions)
        await self._notify()
        return True

    async def close(self) -> None:
        """Miners' ``next_task`` returns None (their ``run`` loops end); trainers' ``take`` stops waiting."""
        self._closed = True
        await self._notify()

    # ------------------------------------------------------------------------------------------ miners
    async def next_task(self, miner_id: int) -> MineTask | None:
        """The next task for ``miner_id``, waiting while the buffer is full or nothing is pending; None once
        closed. Asking again while holding a task gives that task's unfinished ids back first."""
        while not self._closed:
            self.ledger.expire(time.monotonic())
            task = self.ledger.assign(miner_id, now=time.monotonic(), capacity=self.capacity)
            if task is not None:
                self._max_fill = max(self._max_fill, self.ledger.fill)
                self._observe()
                return task
            await self._wait(self._tick)
        return None

    async def put(self, batch: MinedBatch) -> int:
        """Hand back a mined task; returns how many ids were accepted (duplicates and late ones are dropped)."""
        accepted = self._accept(batch)
        await self._notify()
        return len(accepted)

    def _accept(self, batch: MinedBatch) -> list[MinedNegatives]:
        """The ledger's verdict on a mined task: its accepted items, now cached; the miners' counters."""
        accepted = set(self.ledger.complete(batch))
        self.searched += len(batch.ids)
        self.mine_s += batch.seconds
        items = [item for item in batch.records if item.id in accepted]
        self.cache.update((item.id, item) for item in items)
        return items

    # ------------------------------------------------------------------------------------------ trainers
    async def take(
        self, rank: int, n: int, timeout: float | None = None, *, epoch: int | None = None
    ) -> list[MinedNegatives]:
        """Up to ``n`` of ``rank``'s items in delivery order: waits until ``n`` are ready, the rank's epoch is
        exhausted, the stream closes or ``timeout`` s pass. With ``epoch``, first waits for that epoch to start
        (and returns [] if the stream is already past it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        got: list[MinedNegatives] = []
        while True:
            at = self.ledger.epoch
            if epoch is None or at == epoch:
                got += self.ledger.take(rank, n - len(got))
                if got:
                    await self._notify()  # credits freed for waiting miners
                if len(got) >= n or self.ledger.exhausted(rank):
                    return got
            elif at > epoch:
                return got
            left = self._tick if deadline is None else deadline - time.monotonic()
            if self._closed or left <= 0:
                return got
            await self._wait(min(left, self._tick))

    async def refuse(self, rank: int, ids: list[str], *, min_version: int = 0) -> None:
        """Items ``rank`` took but found too stale: back to pending, re-mined with weights ≥ ``min_version``."""
        self.ledger.refuse(rank, ids, min_version=min_version)
        await self._notify()

    async def ledger_state(self, *, consumed: list[int] | None = None) -> dict[str, Any]:
        """For a trainer checkpoint; ``consumed[r]`` = items rank r has trained on (later ones are re-sent)."""
        return self.ledger.state_dict(consumed=consumed)

    async def restore(self, state: dict[str, Any]) -> None:
        """After ``start_epoch(state["epoch"], ...)``: consumed ids stay consumed, the rest is delivered again."""
        self.ledger.load_state_dict(state)
        await self._notify()

    async def cached(self) -> list[MinedNegatives]:
        """The newest accepted item of every example mined so far (e.g. to write the negatives out)."""
        return list(self.cache.values())

    async def stats(self) -> dict[str, Any]:
        """fill (mined-undelivered + in flight), capacity, max_fill, counters, epoch, cached."""
        led = self.ledger
        return {
            "fill": led.fill,
            "capacity": self.capacity,
            "max_fill": self._max_fill,
            "epoch": led.epoch,
            "ready": sum(len(r) for r in led.ready),
            "in_flight": led.fill - len(led.fresh),
            "cached": len(self.cache),
            "closed": self._closed,
            "searched": self.searched,
            "mine_s": round(self.mine_s, 3),
            **{k: led.counters[k] for k in ("mined", "consumed", "refused", "reassigned", "duplicates", "late")},
        }


class StreamWithStore(NegativeStream, WeightStore):
    """A training's negative stream and its weight store in one actor: both sit beside the driver with no CPU
    reserved, live and die with the training, and answer in microseconds (the store's three methods are plain
    functions, run on the stream's event loop between its awaits). Two actors were two processes, each about
    1 CPU-second to start (bench/trial_cost.py). The one handle serves as both: ``stream.take``,
    ``store.pull_if_newer``."""

    def __init__(self, **stream: Any) -> None:
        NegativeStream.__init__(self, **stream)
        WeightStore.__init__(self)


def start_stream(
    *,
    world_size: int,
    capacity: int,
    task_size: int,
    lease_s: float = 60.0,
    seed: int = 0,
    ordered: bool = True,
    with_store: bool = False,
    **options: Any,
) -> Any:
    """The stream as an async actor (no CPU reserved); ``options`` go to ``.options()`` (name, scheduling);
    ``with_store``: the training's weight store too (:class:`StreamWithStore`)."""
    cls: Any = ray.remote(StreamWithStore if with_store else NegativeStream)
    return cls.options(num_cpus=0, max_concurrency=1000, **options).remote(
        world_size=world_size, capacity=capacity, task_size=task_size, lease_s=lease_s, seed=seed, ordered=ordered
    )
