"""The live stream as a worker's negative source, on a real local Ray with echo miners: every example of an epoch
once, with the negatives mined for it, in pools of at most the batch size; the staleness bound checked where a
pool's negatives are asked for; weights published every ``sync_every`` updates."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from raycl.config.tasks.gec import GecMiningSection
from raycl.data.gec import GecExample
from raycl.distributed.session import open_source
from raycl.training.negatives import Place, StreamNegatives
from raycl.training.prefetch import Call


def test_the_stream_gives_each_example_its_mined_negatives_once_within_the_staleness_bound(ray_local: Any) -> None:
    from raycl.distributed.miner_pool import MinerFactory, MinerPool
    from raycl.distributed.stream import start_stream
    from raycl.distributed.weights import start_weight_store
    from raycl.testing.miners import ECHO

    store, stream = start_weight_store(), start_stream(world_size=1, capacity=8, task_size=2)
    pool = MinerPool(MinerFactory(ECHO, options={"k": 2}), num_miners=1, cpus_per_miner=0, weight_store=store)
    pool.start(stream)
    try:
        exs = [GecExample(f"x{i}", "s", "t") for i in range(6)]
        spec = GecMiningSection(max_staleness=1, sync_every=2).source(stream=stream, store=store)
        source = open_source(spec, Place(0, 1, exs, [exs], 4))
        assert isinstance(source, StreamNegatives) and not source.read_ahead  # publications between updates
        got: list[tuple[str, list[str]]] = []
        for p in source.pools(0, 0, None):  # type: ignore[arg-type]
            assert not isinstance(p, Call) and len(p) <= 4
            ids = [ex.id for ex in p]
            with pytest.raises(RuntimeError, match="mined with weights older than version 1"):
                source.negatives(ids, source.version + 2)  # two versions on: past max_staleness = 1
            got += zip(ids, source.negatives(ids, source.version), strict=True)
        assert sorted(got) == [(f"x{i}", [f"x{i}~0", f"x{i}~1"]) for i in range(6)]  # each once, as mined
        source.after_update(1, torch.nn.Linear(1, 1))  # not a sync step
        assert source.version == 0 and source.state() == {"version": 0}
        source.after_update(2, torch.nn.Linear(1, 1))  # sync_every = 2: the weights go out as version 1
        assert source.version == 1 and source.metrics()["stream/version"] == 1.0
    finally:
        import ray

        ray.get(stream.close.remote())
        pool.join(timeout=30)
        pool.shutdown()
