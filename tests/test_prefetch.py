"""Batches prepared ahead of the step (``raycl.training.prefetch``): the same batches in the same order as the
step's own thread would make them, collated in the background, calls run in the training thread at their place
(nothing read past a call before it ran), errors surfacing where the step runs, the thread gone when the epoch is
left, and tensors moved inside the containers a task collates into."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import namedtuple
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from raycl.training.prefetch import Call, Prefetcher, move
from raycl.training.task import Batch


def _collate(seen_threads: list[str]) -> Any:
    def collate(data: int) -> dict[str, torch.Tensor]:
        seen_threads.append(threading.current_thread().name)
        return {"x": torch.full((2,), float(data))}

    return collate


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_the_batches_come_in_order_collated_and_the_thread_ends(depth: int) -> None:
    threads: list[str] = []
    with Prefetcher(
        [Batch(i, optimizer=i % 2) for i in range(7)], _collate(threads), device=torch.device("cpu"), depth=depth
    ) as feed:
        got = list(feed)
    assert [b.data["x"].tolist() for b in got] == [[float(i)] * 2 for i in range(7)]
    assert [b.optimizer for b in got] == [i % 2 for i in range(7)]  # the rest of the batch travels with it
    main = threading.current_thread().name
    assert all(t == main for t in threads) if depth == 0 else all(t == "raycl-prefetch" for t in threads)
    assert not any(t.name == "raycl-prefetch" and t.is_alive() for t in threading.enumerate())


def test_a_call_runs_in_the_training_thread_before_anything_after_it_is_read() -> None:
    """A chunk's weights are published (the call) before the miners' negatives for it are read: the feed reads
    what comes after the call only once the training thread has run it."""
    state = {"version": 0}
    call_threads: list[str] = []

    def publish() -> None:
        call_threads.append(threading.current_thread().name)
        state["version"] += 1

    def items() -> Iterator[Batch | Call]:
        for _ in range(3):
            yield Call(publish)
            for i in range(4):
                yield Batch((state["version"], i))  # read with the version the feed sees now

    with Prefetcher(items(), lambda d: d, device=torch.device("cpu"), depth=3) as feed:
        taken = []
        for batch in feed:
            taken.append(batch.data)
            time.sleep(0.01)  # the thread runs ahead within a chunk meanwhile
    assert taken == [(v, i) for v in (1, 2, 3) for i in range(4)]  # every batch read with its chunk's version
    assert call_threads == [threading.current_thread().name] * 3


def test_a_call_waits_for_the_batches_before_it() -> None:
    """When the call runs, the training thread has taken every batch before it (the trainer's weights then hold
    their updates)."""
    taken: list[int] = []
    at_call: list[list[int]] = []

    def items() -> Iterator[Batch | Call]:
        yield from (Batch(i) for i in range(3))
        yield Call(lambda: at_call.append(list(taken)))
        yield from (Batch(i) for i in range(3, 5))

    with Prefetcher(items(), lambda d: d, device=torch.device("cpu"), depth=4) as feed:
        for batch in feed:
            taken.append(batch.data)
    assert at_call == [[0, 1, 2]] and taken == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("where", ["feed", "collate"])
def test_an_error_ahead_surfaces_in_the_training_thread(where: str) -> None:
    def items() -> Iterator[Batch]:
        yield Batch(1)
        if where == "feed":
            raise KeyError("the feed broke")
        yield Batch(2)

    def collate(d: int) -> int:
        if where == "collate" and d == 2:
            raise KeyError("the collate broke")
        return d

    got = []
    with pytest.raises(KeyError, match=f"the {where} broke"):
        with Prefetcher(items(), collate, device=torch.device("cpu"), depth=2) as feed:
            for b in feed:
                got.append(b.data)
    assert got == [1]


def test_leaving_early_stops_the_thread_blocked_on_a_full_queue() -> None:
    with Prefetcher((Batch(i) for i in range(10_000)), lambda d: d, device=torch.device("cpu"), depth=2) as feed:
        for batch in feed:
            if batch.data == 3:
                break
    time.sleep(0.05)
    assert not any(t.name == "raycl-prefetch" and t.is_alive() for t in threading.enumerate())


def test_the_training_threads_wait_is_measured() -> None:
    def slow() -> Iterator[Batch]:
        for i in range(3):
            time.sleep(0.05)
            yield Batch(i)

    with Prefetcher(slow(), lambda d: d, device=torch.device("cpu"), depth=2) as feed:
        list(feed)
    assert feed.wait_s >= 0.1 and 0.03 <= feed.first_wait_s <= feed.wait_s


@dataclasses.dataclass(frozen=True)
class _Frozen:
    ids: torch.Tensor
    n: int
    inner: dict[str, Any]
    extra: Any = None


def test_move_reaches_every_tensor_a_collate_may_build() -> None:
    Pair = namedtuple("Pair", "a b")
    obj = _Frozen(
        torch.ones(2),
        3,
        {"m": torch.zeros(1), "l": [torch.ones(1), "s"], "t": Pair(torch.ones(1), 2)},
        extra=(torch.ones(1),),
    )
    out = move(obj, lambda t: t * 2)
    assert isinstance(out, _Frozen) and out.n == 3 and out.ids.tolist() == [2.0, 2.0]
    assert out.inner["m"].tolist() == [0.0] and out.inner["l"][0].tolist() == [2.0] and out.inner["l"][1] == "s"
    assert isinstance(out.inner["t"], Pair) and out.inner["t"].a.tolist() == [2.0] and out.inner["t"].b == 2
    assert out.extra[0].tolist() == [2.0] and obj.ids.tolist() == [1.0, 1.0]  # the original is left alone
