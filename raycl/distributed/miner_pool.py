"""The miner pool: M restartable Ray actors, each wrapping a plain miner (``BeamSearchMiner`` for GEC).

A ``MinerActor`` builds its plain miner from a small picklable :class:`MinerFactory` (never big object refs as
constructor arguments: restarts re-run ``__init__``; ray-project/ray#53727) and runs one loop: take a task from the
negative stream → pull newer weights → mine → hand the batch back. Actors have ``max_restarts=-1,
max_task_retries=-1``: after a crash Ray restarts the actor and re-submits ``run``; the restarted miner asks the
stream again, which reclaims the task it held (docs/architecture.md). ``MinerPool.map`` serves standalone mining.
Tests and benchmarks break miners through one typed seam, :class:`MinerFaults` (RLlib's ``CartPoleCrashing``
idea; the switches themselves are ``raycl.testing.faults.Chaos``, which no product module imports): a factory,
or a Ray Data mining's job, carries it to the actors, which call it around their work.
"""

from __future__ import annotations

import logging
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from raycl.distributed import metrics
from raycl.distributed.messages import MinedBatch, MineTask, WeightsRef
from raycl.distributed.weights import fetch_weights
from raycl.miners.registry import MinerKind, miner_device, miner_kind

if TYPE_CHECKING:
    from raycl.config import MiningSection

log = logging.getLogger(__name__)
ACTOR_KEYS = ("version_wait_s",)  # options the actor keeps; the rest go to the miner


# ---------------------------------------------------------------------------------------------- faults
@dataclass(frozen=True)
class FaultSite:
    """Where a miner stands when a test's fault may strike it."""

    miner_id: int
    first_life: bool  # False in an actor Ray has restarted (a crash switch fires once, not in every life)
    stage: str = "mine"  # dense mining's two pools: "embed" | "mine"


class MinerFaults(Protocol):
    """Faults a test or benchmark injects into miner processes (``raycl.testing.faults.Chaos``); a run has none.
    Picklable: it reaches the actors with their factory or job."""

    def before_range(self, index: int, site: FaultSite) -> None: ...
    def after_task(self, done: int, site: FaultSite) -> None: ...


@dataclass(frozen=True)
class MinerFactory:
    """Small and picklable: how to build the plain miner inside an actor (``model_path`` holds version 0).

    ``options``: the miner's keyword arguments (``{"k": 3, "beam": 5, "batch_size": 64, ...}`` for
    ``gec_beam``), plus ``ACTOR_KEYS``, which the actor keeps for itself: ``version_wait_s`` (how long a task
    needing newer weights waits for them; default 60). ``faults``: what a test or benchmark breaks in the miners
    (none in a run).
    """

    kind: str | MinerKind  # a registered name ("gec_beam", "coherence_rank") or the kind itself
    model_path: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    faults: MinerFaults | None = None

    def spec(self) -> MinerKind:
        return self.kind if isinstance(self.kind, MinerKind) else miner_kind(self.kind)

    def resolved(self) -> MinerFactory:
        """The same factory carrying its kind (pickled by reference: an actor imports the kind's module)."""
        return MinerFactory(self.spec(), self.model_path, self.options, self.faults)

    def build(self) -> Any:
        """The plain miner, on a GPU only when Ray reserved one for this process (``ray.get_gpu_ids()``)."""
        opts = {k: v for k, v in self.options.items() if k not in ACTOR_KEYS}
        gpus = ray.get_gpu_ids() if ray.is_initialized() else []
        opts.setdefault("device", miner_device(gpus))
        if gpus and opts["device"] == "cpu":
            said_gpu_fallback()
        return self.spec().build(self.model_path, opts)

    def load(self, miner: Any, state_dict: Mapping[str, torch.Tensor], *, version: int) -> None:
        self.spec().load(miner, state_dict, version=version)


def said_gpu_fallback() -> None:
    """A miner given a GPU share on a node without CUDA runs on the CPU — never silently: a warning naming the
    node, the setting and the fix (on the driver's terminal: Ray forwards the actor's stderr), and a Ray metric
    (``raycl_miner_gpu_fallback``)."""
    from raycl.distributed.resources import gpu_problem

    line = gpu_problem("a miner", "mining.gpus_per_miner") or "a miner was given a GPU it cannot use"
    print(f"raycl: warning: {line}; it mines on the CPU, much slower", file=sys.stderr, flush=True)
    log.warning("%s; it mines on the CPU", line)
    metrics.gpu_fallback(ray.get_runtime_context().get_node_id()[:12])


# ---------------------------------------------------------------------------------------------- the actor
def _cap_gpu_memory() -> None:
    from raycl.distributed.resources import cap_gpu_memory

    cap_gpu_memory(torch.device("cuda", 0))  # Ray shows a miner with a GPU share that GPU alone, as cuda:0


def first_life() -> bool:
    """False inside an actor Ray has restarted (chaos switches fire once, not in every life)."""
    if not ray.is_initialized():
        return True
    ctx = ray.get_runtime_context()
    with warnings.catch_warnings():  # Ray 2.60's property reads its own deprecated `actor_id`
        warnings.simplefilter("ignore", DeprecationWarning)
        return ctx.get_actor_id() is None or not ctx.was_current_actor_reconstructed


class MinerActor:
    """A plain miner behind a Ray actor; made remote by :class:`MinerPool` (restartable), usable in-process."""

    def __init__(self, miner_id: int, factory: MinerFactory, weight_store: Any | None = None) -> None:
        self.miner_id, self.factory = miner_id, factory
        self.store: Any = weight_store
        _cap_gpu_memory()  # a GPU share (mining.gpus_per_miner < 1): this process's memory capped to it
        self.miner = factory.build()
        self._version = 0  # the factory's model_path holds version 0
        self._done = 0
        self.faults, self.site = factory.faults, FaultSite(miner_id, first_life())
        self.version_wait_s = float(factory.options.get("version_wait_s", 60.0))

    def mine(self, task: MineTask) -> MinedBatch:
        """Mine one task with weights ≥ ``task.min_version`` (pulling newer ones first)."""
        self._sync(task.min_version)
        t0 = time.perf_counter()
        records = self.miner.mine(list(task.items))
        batch = MinedBatch.of(
            task, records, model_version=self._version, miner_id=self.miner_id, seconds=time.perf_counter() - t0
        )
        self._done += 1
        metrics.mined(self.miner_id, negatives=sum(len(r.negatives) for r in batch.records), seconds=batch.seconds)
        if self.faults is not None:
            self.faults.after_task(self._done, self.site)
        return batch

    def run(self, stream: Any) -> int:
        """pull_if_newer → next task → mine → put, until the stream closes; returns the tasks done in this life."""
        done = 0
        while (task := ray.get(stream.next_task.remote(self.miner_id))) is not None:
            ray.get(stream.put.remote(self.mine(task)))
            done += 1
        return done

    @ray.method(concurrency_group="control")
    def version(self) -> int:
        return self._version

    @ray.method(concurrency_group="control")
    def node_id(self) -> str:
        """The Ray node this (possibly restarted) miner runs on."""
        return ray.get_runtime_context().get_node_id()

    def _sync(self, min_version: int) -> None:
        """Pull newer weights; wait (up to ``version_wait_s``) while older than ``min_version``."""
        if self.store is None:
            return
        deadline = time.monotonic() + self.version_wait_s
        self._pull()
        while self._version < min_version and time.monotonic() < deadline:
            time.sleep(0.05)
            self._pull()

    def _pull(self) -> None:
        try:
            weights: WeightsRef | None = ray.get(self.store.pull_if_newer.remote(self._version))
            if weights is not None:
                self.factory.load(self.miner, fetch_weights(weights), version=weights.version)
                self._version = weights.version
                metrics.weight_version(f"miner{self.miner_id}", self._version)
        except ray.exceptions.RayError as err:  # store or buffer gone: keep mining with the weights we have
            log.warning("miner %d: weight pull failed, keeps version %d (%s)", self.miner_id, self._version, err)


# ---------------------------------------------------------------------------------------------- the pool
def miner_options(
    i: int,
    *,
    cpus: float,
    gpus: float,
    resources: dict[str, float] | None = None,
    placement_group: Any = None,
    first_bundle: int = 1,
    node_ids: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Ray actor options of miner ``i``: its resources, restarts, and placement (bundle or preferred node)."""
    opts: dict[str, Any] = dict(num_cpus=cpus, num_gpus=gpus, max_restarts=-1, max_task_retries=-1)
    if resources:
        opts["resources"] = dict(resources)
    if placement_group is not None:
        opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group, placement_group_bundle_index=first_bundle + i
        )
    elif node_ids:
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_ids[i % len(node_ids)], soft=True)
    return opts


class MinerPool:
    """Starts ``num_miners`` restartable ``MinerActor``s with ``cpus_per_miner``/``gpus_per_miner`` each
    (fractions allowed); with a placement group, miner i goes to bundle ``first_bundle + i`` (bundle 0 is
    the trial's driver); with ``node_ids``, miner i prefers node ``node_ids[i % len]`` (soft affinity)."""

    def __init__(
        self,
        factory: MinerFactory,
        *,
        num_miners: int,
        cpus_per_miner: float = 1.0,
        gpus_per_miner: float = 0.0,
        weight_store: Any | None = None,
        placement_group: Any | None = None,
        first_bundle: int = 1,
        node_ids: Sequence[str] | None = None,
        resources: dict[str, float] | None = None,
    ) -> None:
        self.factory = factory = factory.resolved()  # the kind travels with the factory; an unknown one fails here
        placement: dict[str, Any] = dict(
            cpus=cpus_per_miner,
            gpus=gpus_per_miner,
            resources=resources,
            placement_group=placement_group,
            first_bundle=first_bundle,
            node_ids=node_ids,
        )
        cls: Any = ray.remote(concurrency_groups={"control": 1})(MinerActor)  # type: ignore[call-overload]
        # the "control" group lets version()/node_id() answer while run() loops
        self._actors: list[Any] = [
            cls.options(**miner_options(i, **placement)).remote(i, factory, weight_store)
            for i in range(num_miners)
        ]
        self._runs: list[Any] = []

    @classmethod
    def from_config(cls, factory: MinerFactory, mining: MiningSection, **kwargs: Any) -> MinerPool:
        return cls(
            factory,
            num_miners=mining.num_miners,
            cpus_per_miner=mining.cpus_per_miner,
            gpus_per_miner=mining.gpus_per_miner,
            **kwargs,
        )

    def actors(self) -> list[Any]:
        return list(self._actors)

    def ready(self, timeout: float | None = None) -> list[int]:
        """Wait until every miner is built (model loaded); returns their weight versions."""
        return ray.get([a.version.remote() for a in self._actors], timeout=timeout)

    def start(self, stream: Any) -> None:
        """Every miner runs its loop against ``stream`` until ``stream.close()``."""
        self._runs = [a.run.remote(stream) for a in self._actors]

    def join(self, timeout: float | None = None) -> list[int]:
        """Wait for the run loops (after ``stream.close()``); tasks each did in its last life."""
        return ray.get(self._runs, timeout=timeout)

    def errors(self) -> list[str]:
        """Errors of run loops that ended with an exception (a bug or a bad factory; crashes restart instead).
        Non-blocking: a trainer waiting on the stream can check that its miners are still there."""
        done, _ = ray.wait(self._runs, num_returns=len(self._runs), timeout=0)
        out = []
        for ref in done:
            try:
                ray.get(ref)
            except ray.exceptions.RayError as err:
                out.append(str(err).strip().splitlines()[-1])
        return out

    def map(self, tasks: Iterable[MineTask], *, in_flight_per_miner: int = 2) -> Iterator[MinedBatch]:
        """Mine ``tasks`` (read lazily, so a corpus larger than memory streams), yielding batches as they finish
        (completion order). A crashed miner's calls are retried on its restarted actor."""
        todo, running = iter(tasks), dict[Any, int]()

        def submit(i: int) -> None:
            task = next(todo, None)
            if task is not None:
                running[self._actors[i].mine.remote(task)] = i

        for i in range(len(self._actors)):
            for _ in range(in_flight_per_miner):
                submit(i)
        while running:
            (ref,), _ = ray.wait(list(running), num_returns=1)
            i = running.pop(ref)
            batch = ray.get(ref)
            submit(i)
            yield batch

    def shutdown(self) -> None:
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors, self._runs = [], []
