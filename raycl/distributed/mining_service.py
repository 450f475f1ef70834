"""A run's mining side: the weight store, the negative stream and the miner pool, started and stopped together.

In a Tune trial the miners go into the trial's own placement group (bundle 0 is the trial driver, bundles
1…M the miners), so they are reserved with the trial and die with it; outside Tune they take plain resources.
The store and the stream are one actor (``raycl.distributed.stream.StreamWithStore``: one process, not two),
reserve no CPU and sit with the driver that owns them (fate-shared with it): in its bundle in a trial, else on
the head (a share of ``raycl_head``, where the cluster has it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray
from ray.tune.execution.placement_groups import PlacementGroupFactory
from ray.util.placement_group import get_current_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raycl.config import MiningSection
from raycl.distributed import dense_refresh as _dense_refresh  # noqa: F401  registers the dense_refresh kind
from raycl.distributed.miner_pool import MinerFactory, MinerPool
from raycl.distributed.resources import driver_bundle, on_head
from raycl.distributed.stream import start_stream
from raycl.miners.records import MinedNegatives


def trial_resources(driver_cpus: float, mining: MiningSection | None) -> PlacementGroupFactory:
    """One placement group per trial: the driver's bundle, then one bundle per miner (none without mining)."""
    miners = (
        []
        if mining is None
        else [
            {
                "CPU": mining.cpus_per_miner,
                **({"GPU": mining.gpus_per_miner} if mining.gpus_per_miner else {}),
                **mining.resources,
            }
            for _ in range(mining.num_miners)
        ]
    )
    return PlacementGroupFactory([driver_bundle(driver_cpus), *miners])


@dataclass
class MiningService:
    stream: Any  # the StreamWithStore actor: the negative stream and the weight store
    pool: MinerPool

    @property
    def store(self) -> Any:
        """The weight store's handle: the stream's own (one actor, both roles)."""
        return self.stream

    @classmethod
    def start(cls, factory: MinerFactory, mining: MiningSection, *, world_size: int, seed: int) -> MiningService:
        pg = get_current_placement_group()
        near_driver: dict[str, Any] = on_head() if pg is None else {}  # outside Tune: on the head where it is one
        if pg is not None:
            near_driver["scheduling_strategy"] = PlacementGroupSchedulingStrategy(pg, 0)
        stream = start_stream(
            world_size=world_size,
            capacity=mining.queue_size,
            task_size=mining.task_size,
            lease_s=mining.lease_s,
            seed=seed,
            with_store=True,
            **near_driver,
        )
        pool = MinerPool.from_config(
            factory,
            mining,
            weight_store=stream,
            placement_group=pg,
            first_bundle=1,
            resources=mining.resources or None,
        )
        pool.start(stream)
        return cls(stream, pool)

    def negatives(self) -> list[MinedNegatives]:
        """The newest mined item of every example (what the trainers were given)."""
        return list(ray.get(self.stream.cached.remote()))

    def stats(self) -> dict[str, Any]:
        return dict(ray.get(self.stream.stats.remote()))

    def close(self) -> None:
        """Stop the miners' loops, then the miners, then the stream and its store (miners may pull until then)."""
        ray.get(self.stream.close.remote())
        try:
            self.pool.join(timeout=30)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
            pass
        self.pool.shutdown()
        ray.kill(self.stream)
