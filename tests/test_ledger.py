"""The ledger (pure Python): exactly-once delivery per rank and epoch under reclaim, lease expiry, duplicate and
late results, refusals and checkpoint restores, checked against an independent record of what each rank got."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from raycl.distributed.ledger import Ledger
from raycl.distributed.messages import MinedBatch, MineTask
from raycl.miners.records import MinedNegatives


@dataclass(frozen=True)
class Ex:
    id: str


def items(rank: int, n: int) -> list[Ex]:
    return [Ex(f"r{rank}:{i}") for i in range(n)]


def mined(task: MineTask, miner_id: int, *, version: int = 0, drop: int = 0) -> MinedBatch:
    """A result for ``task``; each negative names the id and the miner, so a delivery can be traced back."""
    ids = task.ids[: len(task.ids) - drop]
    records = tuple(
        MinedNegatives(i, (f"{i}@{miner_id}",), (-1.0,), model_version=version, miner_id=miner_id) for i in ids
    )
    return MinedBatch(records, version, miner_id, task.epoch, task.task_id)


def drain(led: Ledger, *, capacity: int | None = None) -> list[list[MinedNegatives]]:
    """An honest miner and trainers until every rank is exhausted (tasks other miners hold expire first)."""
    led.expire(float("inf"))
    got: list[list[MinedNegatives]] = [[] for _ in range(led.world_size)]
    while not all(led.exhausted(r) for r in range(led.world_size)):
        task = led.assign(99, now=0.0, capacity=capacity)
        if task is not None:
            led.complete(mined(task, 99))
        taken = [led.take(r, 3) for r in range(led.world_size)]
        assert task is not None or any(taken), "no progress"
        for r in range(led.world_size):
            got[r] += taken[r]
        led.check()
    return got


def test_each_rank_gets_its_items_once_in_a_seeded_order() -> None:
    led = Ledger(world_size=2, task_size=4, seed=7)
    led.start_epoch(0, [items(0, 10), items(1, 7)])
    got = drain(led)
    assert [sorted(i.id for i in g) for g in got] == [
        sorted(e.id for e in items(r, n)) for r, n in ((0, 10), (1, 7))
    ]
    order0 = [i.id for i in got[0]]
    assert order0 != [e.id for e in items(0, 10)]  # shuffled
    again = Ledger(world_size=2, task_size=3, seed=7)  # other task size, same seed: same order
    again.start_epoch(0, [items(0, 10), items(1, 7)])
    assert [i.id for i in drain(again)[0]] == order0
    again.start_epoch(1, [items(0, 10), items(1, 7)])
    assert [i.id for i in drain(again)[0]] != order0  # a new epoch reshuffles
    with pytest.raises(ValueError, match="twice"):
        led.start_epoch(2, [items(0, 2), items(0, 1)])


def test_capacity_pauses_miners_but_never_a_ranks_next_item() -> None:
    led = Ledger(world_size=1, task_size=4)
    led.start_epoch(0, [items(0, 20)])
    a = led.assign(0, now=0.0, capacity=8)
    b = led.assign(1, now=0.0, capacity=8)
    assert a is not None and b is not None and led.fill == 8
    assert led.assign(2, now=0.0, capacity=8) is None  # full: in flight counts
    led.complete(mined(b, 1))
    assert led.fill == 8 and led.assign(2, now=0.0, capacity=8) is None  # mined-undelivered counts too
    assert led.take(0, 10) == []  # a's items come first in delivery order
    led.reclaim(0)  # miner 0 restarted: its items, the head of the order, are pending while b's fill the buffer
    assert led.fill == 4
    head = led.assign(3, now=0.0, capacity=4)
    assert head is not None and set(head.ids) == set(a.ids)  # goes out although fill + 4 > capacity
    led.complete(mined(head, 3))
    assert [i.id for i in led.take(0, 8)] == [*a.ids, *b.ids]
    led.check()


def test_reclaim_expire_and_duplicate_or_late_results() -> None:
    led = Ledger(world_size=1, task_size=3, lease_s=10.0)
    led.start_epoch(0, [items(0, 9)])
    t0 = led.assign(0, now=0.0)
    t1 = led.assign(0, now=1.0)  # miner 0 asks again while holding t0: t0 is reclaimed
    assert t0 is not None and t1 is not None and t1.ids == t0.ids and led.counters["reassigned"] == 3
    assert led.complete(mined(t0, 0)) == list(t0.ids)  # the first result wins, even from the reclaimed task
    assert led.complete(mined(t1, 0)) == [] and led.counters["duplicates"] == 3
    t2 = led.assign(1, now=2.0)
    assert t2 is not None and led.expire(11.0) == 0 and led.expire(12.5) == 3  # deadline 12.0
    t3 = led.assign(2, now=13.0)
    assert t3 is not None and t3.ids == t2.ids
    assert led.complete(mined(t2, 1, drop=1)) == list(t2.ids[:2])  # the stalled miner returns late, partly
    led.complete(mined(t3, 2))
    assert led.counters["duplicates"] == 5 and led.counters["mined"] == 6
    led.start_epoch(1, [items(0, 9)])
    assert led.complete(mined(t3, 2)) == [] and led.counters["late"] == 3
    led.check()


def test_unordered_delivery_does_not_wait_behind_a_lost_task() -> None:
    for ordered, want in ((True, 0), (False, 4)):
        led = Ledger(world_size=1, task_size=2, ordered=ordered)
        led.start_epoch(0, [items(0, 6)])
        lost, t1, t2 = (led.assign(m, now=0.0) for m in range(3))
        assert lost is not None and t1 is not None and t2 is not None
        led.complete(mined(t2, 2))
        led.complete(mined(t1, 1))
        got = led.take(0, 10)  # miner 0 died holding the first task
        assert len(got) == want
        if not ordered:
            assert [i.id for i in got] == [*t2.ids, *t1.ids]  # in the order they became ready
            assert not led.exhausted(0) and led.take(0, 10) == []
        led.reclaim(0)
        again = led.assign(3, now=0.0)
        assert again is not None and again.ids == lost.ids
        led.complete(mined(again, 3))
        assert [i.id for i in led.take(0, 10)] == ([*lost.ids, *t1.ids, *t2.ids] if ordered else list(lost.ids))
        assert led.exhausted(0)
        led.check()


def test_a_batch_missing_ids_gives_them_back() -> None:
    led = Ledger(world_size=1, task_size=4)
    led.start_epoch(0, [items(0, 4)])
    task = led.assign(0, now=0.0)
    assert task is not None and led.complete(mined(task, 0, drop=1)) == list(task.ids[:3])
    again = led.assign(0, now=0.0)
    assert again is not None and again.ids == task.ids[3:]


def test_refused_items_are_remined_with_newer_weights_and_delivered_last() -> None:
    led = Ledger(world_size=1, task_size=2)
    led.start_epoch(0, [items(0, 6)])
    task = led.assign(0, now=0.0)
    assert task is not None and task.min_version == 0
    led.complete(mined(task, 0))
    first = led.take(0, 2)
    led.refuse(0, [first[0].id], min_version=3)
    with pytest.raises(ValueError, match="consumed"):
        led.refuse(0, [first[0].id])  # no longer consumed
    assert led.counters["refused"] == 1 and led.counters["consumed"] == 1
    rest = drain(led)[0]
    assert rest[-1].id == first[0].id and len(rest) == 5
    tasks = [t for t in (led.leases.values())]
    assert tasks == []  # every task returned


def test_refused_id_task_carries_min_version() -> None:
    led = Ledger(world_size=1, task_size=8)
    led.start_epoch(0, [items(0, 2)])
    task = led.assign(0, now=0.0)
    assert task is not None
    led.complete(mined(task, 0))
    led.refuse(0, [i.id for i in led.take(0, 2)], min_version=5)
    again = led.assign(0, now=0.0)
    assert again is not None and again.min_version == 5 and set(again.ids) == set(task.ids)


def test_cached_items_are_ready_without_mining_and_take_no_capacity() -> None:
    led = Ledger(world_size=1, task_size=2)
    cached = {
        f"r0:{i}": MinedNegatives(f"r0:{i}", ("old",), (0.0,), model_version=4, miner_id=1) for i in range(3)
    }
    led.start_epoch(0, [items(0, 5)], cached=cached)
    assert led.fill == 0
    got = drain(led, capacity=2)[0]
    assert sorted(i.id for i in got) == [f"r0:{i}" for i in range(5)]
    assert {i.id for i in got if i.negatives == ("old",)} == set(cached) and led.counters["mined"] == 2


def test_checkpoint_restore_keeps_consumed_and_redelivers_the_rest() -> None:
    led = Ledger(world_size=2, task_size=3)
    led.start_epoch(0, [items(0, 8), items(1, 8)])
    for _ in range(4):
        task = led.assign(0, now=0.0)
        assert task is not None
        led.complete(mined(task, 0))
    seen = [led.take(0, 2), led.take(1, 3)]
    state = led.state_dict(consumed=[2, 1])  # rank 1 trained on 1 item only when the checkpoint was taken
    assert state == {"epoch": 0, "consumed": [[i.id for i in seen[0]], [seen[1][0].id]]}
    led.take(0, 1)
    led.load_state_dict(state)  # a trainer worker died and resumes
    led.check()
    rest = drain(led)
    assert [i.id for i in rest[1]][:2] == [i.id for i in seen[1][1:]]  # re-delivered first, in order
    for r in range(2):
        ids = state["consumed"][r] + [i.id for i in rest[r]]
        assert sorted(ids) == sorted(e.id for e in items(r, 8))
    fresh = Ledger(world_size=2, task_size=3)
    fresh.start_epoch(0, [items(0, 8), items(1, 8)])
    fresh.load_state_dict(state)  # a new stream restored from the checkpoint
    left = set(e.id for e in items(0, 8)) - set(state["consumed"][0])
    assert sorted(i.id for i in drain(fresh)[0]) == sorted(left)
    with pytest.raises(ValueError, match="epoch"):
        fresh.load_state_dict({"epoch": 3, "consumed": [[], []]})
    with pytest.raises(ValueError, match="not an item of rank 1"):
        fresh.load_state_dict({"epoch": 0, "consumed": [[], ["r0:1"]]})


def _random_schedule(seed: int) -> None:
    """Miners that crash (reclaim), stall (expire), send results twice or late; trainers that refuse items and
    crash back to their last checkpoint. Independent record: what each rank trained on (net of refusals and
    rollbacks) must be exactly its items."""
    rng = random.Random(seed)
    world, cap, size = rng.randint(1, 3), rng.randint(4, 12), rng.randint(1, 4)
    cap = max(cap, size)
    led = Ledger(world_size=world, task_size=size, lease_s=5.0, seed=seed, ordered=seed % 2 == 0)
    sched = [items(r, rng.randint(0, 25)) for r in range(world)]
    led.start_epoch(0, sched)
    trained: list[list[str]] = [[] for _ in range(world)]  # the trainers' truth
    checkpoint = (led.state_dict(), [list(t) for t in trained])
    held: dict[int, MineTask] = {}
    now = 0.0
    for _step in range(400):
        now += rng.random()
        op = rng.random()
        if op < 0.30:
            miner = rng.randrange(4)
            led.reclaim(miner)
            fill, heads = led.fill, [led.head(r) for r in range(world)]
            task = led.assign(miner, now=now, capacity=cap)
            held.pop(miner, None)
            if task is not None:
                held[miner] = task
                # over capacity only with the rank's next item, one such task per rank at a time
                assert fill + len(task.ids) <= cap or heads[task.rank] in task.ids
                assert sum(x.exempt for x in led.leases.values() if x.rank == task.rank) <= 1
        elif op < 0.55 and held:
            miner = rng.choice(sorted(held))
            task = held.pop(miner) if rng.random() < 0.8 else held[miner]  # sometimes sent twice
            led.complete(mined(task, miner, drop=rng.choice([0, 0, 0, 1])))
        elif op < 0.60:
            led.expire(now)
        elif op < 0.85:
            r = rng.randrange(world)
            trained[r] += [i.id for i in led.take(r, rng.randint(1, 5))]
        elif op < 0.90 and any(trained):
            r = rng.choice([r for r in range(world) if trained[r]])
            refused = rng.sample(trained[r], rng.randint(1, min(3, len(trained[r]))))
            if all(i in led.consumed[r] for i in refused):
                led.refuse(r, refused, min_version=1)
                trained[r] = [i for i in trained[r] if i not in refused]
        elif op < 0.95:
            checkpoint = (led.state_dict(), [list(t) for t in trained])
        else:
            led.load_state_dict(checkpoint[0])  # trainer crash: back to the checkpoint
            trained = [list(t) for t in checkpoint[1]]
        led.check()
    for r, got in enumerate(drain(led, capacity=cap)):
        trained[r] += [i.id for i in got]
        assert all(i.negatives[0].startswith(f"{i.id}@") for i in got)
    for r in range(world):
        assert sorted(trained[r]) == sorted(e.id for e in sched[r]), f"seed {seed}, rank {r}"


@pytest.mark.parametrize("seed", range(60))
def test_random_schedules_deliver_every_item_exactly_once(seed: int) -> None:
    _random_schedule(seed)


def test_scheduled_version_floors_cut_tasks_at_chunk_boundaries() -> None:
    """Floors known in advance (a trainer publishing every 5 items) go on the tasks, and no task mixes two:
    a task holding the end of one chunk and the start of the next would wait for the later weights."""
    led = Ledger(world_size=1, task_size=4, seed=0)
    xs = items(0, 12)
    led.start_epoch(0, [xs], shuffle=False, min_versions={x.id: i // 5 for i, x in enumerate(xs)})
    tasks = []
    while (task := led.assign(0, now=0.0)) is not None:
        tasks.append(task)
        led.complete(mined(task, 0, version=task.min_version))
    assert [[x.id for x in t.items] for t in tasks] == [
        [x.id for x in xs[a:b]] for a, b in ((0, 4), (4, 5), (5, 9), (9, 10), (10, 12))
    ]
    assert [t.min_version for t in tasks] == [0, 0, 1, 1, 2]
