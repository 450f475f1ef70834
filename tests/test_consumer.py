"""The trainer's side of the stream: ``StreamConsumer`` refuses items mined with weights older than
``version − max_staleness`` (they are mined again with the newer weights) and uses the rest."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from raycl.data.gec import GecExample
from raycl.distributed.consumer import StreamConsumer
from raycl.distributed.miner_pool import MinerFactory, MinerPool
from raycl.distributed.stream import start_stream
from raycl.distributed.weights import start_weight_store
from raycl.testing.miners import ECHO


def _epoch_with_a_publication(
    ray: Any, max_staleness: int, *, before_close: Callable[[], None] = lambda: None
) -> tuple[StreamConsumer, list[Any], dict[str, Any]]:
    """Take 4 items at version 0, publish twice while the buffer is full of version-0 items, take the rest;
    ``before_close`` runs while the actors are still alive."""
    store, stream = start_weight_store(), start_stream(world_size=1, capacity=8, task_size=2)
    pool = MinerPool(MinerFactory(ECHO, options={"k": 1}), num_miners=1, cpus_per_miner=0, weight_store=store)
    pool.start(stream)
    consumer = StreamConsumer(stream, store, rank=0, world_size=1, max_staleness=max_staleness)
    items = [GecExample(f"x{i}", "s", "t") for i in range(16)]
    consumer.start_epoch(0, [items])
    got = consumer.take(4, epoch=0)
    deadline = time.monotonic() + 30
    while ray.get(stream.stats.remote())["fill"] < 8 and time.monotonic() < deadline:
        time.sleep(0.05)  # miners run ahead: the buffer holds version-0 items when the version moves on
    model = torch.nn.Linear(1, 1, bias=False)
    for value in (1.0, 2.0):
        torch.nn.init.constant_(model.weight, value)
        consumer.publish(model)
    while batch := consumer.take(4, epoch=0):
        got += batch
    stats = ray.get(stream.stats.remote())
    before_close()
    ray.get(stream.close.remote())
    pool.join(timeout=30)
    pool.shutdown()
    return consumer, got, stats


@pytest.mark.parametrize("max_staleness", [0, 1, 2])
def test_items_older_than_max_staleness_are_refused_and_mined_again(ray_local, max_staleness: int) -> None:
    consumer, got, stats = _epoch_with_a_publication(ray_local, max_staleness)
    assert consumer.version == 2 and sorted(i.id for i in got) == sorted(f"x{i}" for i in range(16))
    after = got[4:]  # taken once the version was 2
    assert all(consumer.version - i.model_version <= max_staleness for i in after)
    assert max(consumer.stats.staleness) <= max_staleness
    if max_staleness < 2:  # the buffered version-0 items were too old: refused, re-mined with version 2
        assert consumer.stats.refused >= 4 and stats["refused"] == consumer.stats.refused
        assert any(i.model_version == 2 and i.scores == (2.0,) for i in after)  # mined with the new weights
    else:  # version 0 is still fresh enough: nothing refused, the buffered items are used as they are
        assert consumer.stats.refused == 0 and any(i.model_version == 0 for i in after)
