"""The ledger of one epoch's example ids: pending → assigned → mined (ready) → consumed, exactly once per rank.

Plain Python (no Ray, no clock of its own): the :class:`~raycl.distributed.stream.NegativeStream` actor drives
it. Each rank's items are shuffled (seeded by epoch) into a delivery order; tasks are cut from the front of
the pending ids. With ``ordered=True`` a rank receives its mined items in that order, so batches are the same
however many miners there are and however fast they run (but a rank waits while its next item is with a miner
that died, until the restarted miner asks again or the lease runs out); with ``ordered=False`` it receives
ready items as they come, never waiting behind a lost task. A miner's task is leased: a restarted miner
asking again (``reclaim``) or a lease running out (``expire``) puts its unfinished ids back to pending. A result
is accepted for ids still pending or assigned (first result wins); duplicates and late results are dropped.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raycl.distributed.messages import MinedBatch, MineTask
from raycl.miners.records import MinedNegatives

PENDING, ASSIGNED, READY, CONSUMED = "pending", "assigned", "ready", "consumed"


@dataclass
class _Lease:
    miner_id: int
    rank: int
    ids: tuple[str, ...]
    deadline: float  # in the caller's clock (the stream uses time.monotonic)
    exempt: bool = False  # went out over capacity, holding its rank's next item to deliver


class Ledger:
    """Per-epoch state of every id, per-rank delivery order, task leases and counters.

    ``fill`` (mined-but-undelivered items of this epoch + ids out with miners) is what the stream bounds by
    its capacity; items delivered from a cache of an earlier epoch do not count (they cost no mining).
    """

    def __init__(
        self, *, world_size: int, task_size: int, lease_s: float = 60.0, seed: int = 0, ordered: bool = True
    ) -> None:
        if world_size < 1 or task_size < 1:
            raise ValueError(f"world_size and task_size must be ≥ 1, got {world_size}, {task_size}")
        self.world_size, self.task_size, self.lease_s, self.seed = world_size, task_size, lease_s, seed
        self.ordered = ordered
        self.epoch = -1
        self.counters: Counter[str] = Counter()  # mined consumed refused reassigned duplicates late
        self._next_task = 0
        self._clear()

    def _clear(self) -> None:
        n = self.world_size
        self.items: dict[str, Any] = {}
        self.rank_of: dict[str, int] = {}
        self.state: dict[str, str] = {}
        self.seq: dict[str, int] = {}  # delivery position within the rank
        self.min_version: dict[str, int] = {}
        self.task_of: dict[str, int] = {}  # for ASSIGNED ids
        self.leases: dict[int, _Lease] = {}
        self.miner_task: dict[int, int] = {}
        self.ready: list[dict[str, MinedNegatives]] = [{} for _ in range(n)]
        self.fresh: set[str] = set()  # ready ids mined in this epoch (they count against capacity)
        self.consumed: list[dict[str, None]] = [{} for _ in range(n)]  # ordered sets
        self._deliver: list[deque[tuple[int, str]]] = [deque() for _ in range(n)]  # (seq, id), lazily pruned
        self._pending: list[list[tuple[int, str]]] = [[] for _ in range(n)]  # heaps of (seq, id), lazily pruned
        self._n_pending = [0] * n
        self._n_assigned = [0] * n
        self._n_exempt = [0] * n  # exempt leases out per rank (at most 1)
        self._next_seq = 0

    # ------------------------------------------------------------------------------------------ epochs
    def start_epoch(
        self,
        epoch: int,
        items_per_rank: Sequence[Sequence[Any]],
        *,
        cached: Mapping[str, MinedNegatives] | None = None,
        shuffle: bool = True,
        min_versions: Mapping[str, int] | None = None,
    ) -> None:
        """Schedule ``epoch``: each rank's items (objects with an ``id``), shuffled by (seed, epoch, rank).

        Ids found in ``cached`` are ready at once, with that item. Ids must be unique across ranks.
        ``min_versions``: ids that must be mined with weights of at least that version (known in advance when
        a trainer publishes on a schedule: miners wait for the version instead of mining what would be refused).
        """
        if len(items_per_rank) != self.world_size:
            raise ValueError(f"expected items for {self.world_size} ranks, got {len(items_per_rank)}")
        self._clear()
        self.min_version.update(min_versions or {})
        self.epoch, cached = epoch, cached or {}
        for rank, items in enumerate(items_per_rank):
            order = list(items)
            if shuffle:
                random.Random(f"{self.seed}/{epoch}/{rank}").shuffle(order)
            for item in order:
                if item.id in self.state:
                    raise ValueError(f"example id {item.id!r} is scheduled twice in epoch {epoch}")
                self.items[item.id], self.rank_of[item.id] = item, rank
                self._enqueue(item.id)
                if item.id in cached:
                    self._make_ready(cached[item.id], fresh=False)

    def _enqueue(self, id_: str) -> None:
        """Put ``id_`` at the end of its rank's delivery order, pending."""
        rank = self.rank_of[id_]
        self.seq[id_], self._next_seq = self._next_seq, self._next_seq + 1
        self._deliver[rank].append((self.seq[id_], id_))
        self._to_pending(id_)

    def _to_pending(self, id_: str) -> None:
        rank = self.rank_of[id_]
        self.state[id_] = PENDING
        self.task_of.pop(id_, None)
        heapq.heappush(self._pending[rank], (self.seq[id_], id_))
        self._n_pending[rank] += 1

    def _leave(self, id_: str) -> None:
        """Bookkeeping for ``id_`` leaving its current state."""
        rank, state = self.rank_of[id_], self.state[id_]
        if state == PENDING:
            self._n_pending[rank] -= 1
        elif state == ASSIGNED:
            self._n_assigned[rank] -= 1
            del self.task_of[id_]
        elif state == READY:
            del self.ready[rank][id_]
            self.fresh.discard(id_)

    def _make_ready(self, item: MinedNegatives, *, fresh: bool) -> None:
        self._leave(item.id)
        self.state[item.id] = READY
        self.ready[self.rank_of[item.id]][item.id] = item
        if fresh:
            self.fresh.add(item.id)

    # ------------------------------------------------------------------------------------------ miners
    @property
    def fill(self) -> int:
        return len(self.fresh) + sum(self._n_assigned)

    def assign(self, miner_id: int, *, now: float, capacity: int | None = None) -> MineTask | None:
        """The next task for ``miner_id`` (its outstanding task, if any, is reclaimed first), or None.

        None when nothing is pending, or when the task would push ``fill`` over ``capacity`` — except one task
        per rank holding the rank's next item to deliver (else a reclaimed head could wait forever behind a
        full buffer of later items), so ``fill`` stays ≤ capacity + world_size × task_size.
        """
        self.reclaim(miner_id)
        for rank in self._ranks_by_need():
            size = min(self.task_size, self._n_pending[rank])
            if capacity is None or self.fill + size <= capacity:
                return self._lease(rank, size, miner_id, now=now, exempt=False)
            if self._head_pending(rank) and not self._n_exempt[rank]:
                return self._lease(rank, size, miner_id, now=now, exempt=True)
        return None

    def _lease(self, rank: int, size: int, miner_id: int, *, now: float, exempt: bool) -> MineTask:
        ids = [self._pop_pending(rank)]
        floor = self.min_version.get(ids[0], 0)
        # a task never mixes version floors: it would wait for the highest and hold back the others
        while (
            len(ids) < size
            and (nxt := self._peek_pending(rank)) is not None
            and self.min_version.get(nxt, 0) == floor
        ):
            ids.append(self._pop_pending(rank))
        task_id, self._next_task = self._next_task, self._next_task + 1
        for id_ in ids:
            self._leave(id_)
            self.state[id_], self.task_of[id_] = ASSIGNED, task_id
            self._n_assigned[rank] += 1
        self.leases[task_id] = _Lease(miner_id, rank, tuple(ids), now + self.lease_s, exempt)
        self._n_exempt[rank] += exempt
        self.miner_task[miner_id] = task_id
        min_version = max((self.min_version.get(i, 0) for i in ids), default=0)
        return MineTask(self.epoch, task_id, rank, tuple(self.items[i] for i in ids), min_version)

    def head(self, rank: int) -> str | None:
        """The rank's next id to deliver in order (dropping delivered or re-queued entries from the front)."""
        queue = self._deliver[rank]
        while queue and (self.state[queue[0][1]] == CONSUMED or self.seq[queue[0][1]] != queue[0][0]):
            queue.popleft()
        return queue[0][1] if queue else None

    def undelivered(self, rank: int) -> list[str]:
        """The rank's ids not delivered yet, in delivery order."""
        return [i for q, i in self._deliver[rank] if self.state[i] != CONSUMED and self.seq[i] == q]

    def _head_pending(self, rank: int) -> bool:
        head = self.head(rank)
        return head is not None and self.state[head] == PENDING

    def _ranks_by_need(self) -> list[int]:
        """Ranks with pending ids: those whose next delivery is pending first, then fewest items on the way."""
        ranks = [r for r in range(self.world_size) if self._n_pending[r] > 0]
        return sorted(ranks, key=lambda r: (not self._head_pending(r), len(self.ready[r]) + self._n_assigned[r]))

    def _peek_pending(self, rank: int) -> str | None:
        """The rank's next pending id without taking it (stale heap entries are dropped on the way)."""
        heap = self._pending[rank]
        while heap:
            seq, id_ = heap[0]
            if self.state[id_] == PENDING and self.seq[id_] == seq:
                return id_
            heapq.heappop(heap)
        return None

    def _pop_pending(self, rank: int) -> str:
        heap = self._pending[rank]
        while True:
            seq, id_ = heapq.heappop(heap)
            if self.state[id_] == PENDING and self.seq[id_] == seq:  # else a stale entry
                return id_

    def complete(self, batch: MinedBatch) -> list[str]:
        """Accept the batch's ids that are still pending or assigned; returns them. Others are dropped."""
        if batch.epoch != self.epoch:
            self.counters["late"] += len(batch.ids)
            return []
        lease = self.leases.get(batch.task_id)
        if lease is not None and lease.miner_id == batch.miner_id:
            self._end_lease(batch.task_id)
        accepted = []
        for item in batch.records:
            if self.state.get(item.id) in (PENDING, ASSIGNED):
                self._make_ready(item, fresh=True)
                accepted.append(item.id)
            else:
                self.counters["duplicates" if item.id in self.state else "late"] += 1
        self.counters["mined"] += len(accepted)
        if lease is not None and lease.miner_id == batch.miner_id:
            self._release(batch.task_id, lease)  # ids the miner left out of its batch go back
        return accepted

    def _end_lease(self, task_id: int) -> _Lease:
        lease = self.leases.pop(task_id)
        self._n_exempt[lease.rank] -= lease.exempt
        if self.miner_task.get(lease.miner_id) == task_id:
            del self.miner_task[lease.miner_id]
        return lease

    def _release(self, task_id: int, lease: _Lease) -> int:
        back = [i for i in lease.ids if self.state[i] == ASSIGNED and self.task_of[i] == task_id]
        for id_ in back:
            self._leave(id_)
            self._to_pending(id_)
        self.counters["reassigned"] += len(back)
        return len(back)

    def reclaim(self, miner_id: int) -> int:
        """A (restarted) miner asks again while holding a task: that task's unfinished ids go back to pending."""
        task_id = self.miner_task.get(miner_id)
        return 0 if task_id is None else self._release(task_id, self._end_lease(task_id))

    def expire(self, now: float) -> int:
        """Leases past their deadline: their unfinished ids go back to pending (the miner stalled or died)."""
        late = [t for t, lease in self.leases.items() if lease.deadline < now]
        return sum(self._release(t, self._end_lease(t)) for t in late)

    # ------------------------------------------------------------------------------------------ trainers
    def take(self, rank: int, n: int) -> list[MinedNegatives]:
        """Up to ``n`` of ``rank``'s items that are ready now, which become consumed: the next ones in delivery
        order (``ordered``), else the ready ones in the order they became ready."""
        out: list[MinedNegatives] = []
        if self.ordered:
            while len(out) < n and (head := self.head(rank)) is not None and self.state[head] == READY:
                out.append(self._deliver_one(head))
        else:
            out = [self._deliver_one(i) for i in list(itertools.islice(self.ready[rank], n))]  # insertion order
        self.counters["consumed"] += len(out)
        return out

    def _deliver_one(self, id_: str) -> MinedNegatives:
        rank = self.rank_of[id_]
        item = self.ready[rank][id_]
        self._leave(id_)
        self.state[id_] = CONSUMED
        self.consumed[rank][id_] = None
        return item

    def exhausted(self, rank: int) -> bool:
        """True when every item of ``rank`` in this epoch has been delivered."""
        return self.head(rank) is None

    def refuse(self, rank: int, ids: Sequence[str], *, min_version: int = 0) -> None:
        """Consumed ids the trainer found too stale: re-mined with weights ≥ ``min_version``, delivered later."""
        wrong = [i for i in ids if self.state.get(i) != CONSUMED or self.rank_of[i] != rank]
        if wrong or len(set(ids)) != len(ids):
            raise ValueError(
                f"rank {rank} refused {wrong or ids}: expected distinct ids it consumed in epoch {self.epoch}"
            )
        for id_ in ids:
            del self.consumed[rank][id_]
            self.min_version[id_] = max(self.min_version.get(id_, 0), min_version)
            self._enqueue(id_)
        self.counters["consumed"] -= len(ids)
        self.counters["refused"] += len(ids)

    # ------------------------------------------------------------------------------------------ checkpoints
    def state_dict(self, *, consumed: Sequence[int] | None = None) -> dict[str, Any]:
        """``{"epoch", "consumed": [[ids of rank r, in order]]}``; ``consumed[r]`` keeps only the first n of r."""
        per_rank = [list(c) for c in self.consumed]
        if consumed is not None:
            per_rank = [ids[:n] for ids, n in zip(per_rank, consumed, strict=True)]
        return {"epoch": self.epoch, "consumed": per_rank}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a checkpoint of the current epoch (``start_epoch`` it first): its consumed ids stay consumed;
        every other id not ready or out with a miner is pending again, in the original delivery order."""
        if state["epoch"] != self.epoch:
            raise ValueError(f"ledger state is of epoch {state['epoch']}, the stream is at epoch {self.epoch}")
        keep = [list(ids) for ids in state["consumed"]]
        for rank, ids in enumerate(keep):
            for id_ in ids:
                if self.rank_of.get(id_) != rank:
                    raise ValueError(f"ledger state: {id_!r} is not an item of rank {rank} in epoch {self.epoch}")
        kept = {i for ids in keep for i in ids}
        for id_ in self.state:
            if self.state[id_] == CONSUMED and id_ not in kept:
                self.state[id_] = PENDING  # delivered after the checkpoint: deliver again
            elif id_ in kept and self.state[id_] != CONSUMED:
                self._leave(id_)
                self.state[id_] = CONSUMED
        self._rebuild(keep)

    def _rebuild(self, consumed: list[list[str]]) -> None:
        """Derived structures (delivery queues, pending heaps, counts) from ``state`` and ``seq``."""
        n = self.world_size
        self.consumed = [dict.fromkeys(ids) for ids in consumed]
        self._deliver, self._pending = [deque() for _ in range(n)], [[] for _ in range(n)]
        self._n_pending = [0] * n
        for id_ in sorted(self.state, key=self.seq.__getitem__):
            if self.state[id_] != CONSUMED:
                self._deliver[self.rank_of[id_]].append((self.seq[id_], id_))
            if self.state[id_] == PENDING:
                self._to_pending(id_)

    def check(self) -> None:
        """Recount everything from ``state`` and assert the incremental bookkeeping agrees (tests call this)."""
        for rank in range(self.world_size):
            mine = [i for i, r in self.rank_of.items() if r == rank]
            count = Counter(self.state[i] for i in mine)
            assert count[PENDING] == self._n_pending[rank] and count[ASSIGNED] == self._n_assigned[rank]
            assert set(self.ready[rank]) == {i for i in mine if self.state[i] == READY}
            assert set(self.consumed[rank]) == {i for i in mine if self.state[i] == CONSUMED}
            live = self.undelivered(rank)
            assert sorted(live, key=self.seq.__getitem__) == live
            assert set(live) == {i for i in mine if self.state[i] != CONSUMED}
        assert self.fresh <= {i for i, s in self.state.items() if s == READY}
        for task_id, lease in self.leases.items():
            assert self.miner_task.get(lease.miner_id) == task_id
        assert self._n_exempt == [
            sum(x.exempt for x in self.leases.values() if x.rank == r) for r in range(self.world_size)
        ]
