"""What a run asks of Ray, checked against what the cluster has before anything starts.

A training reserves its Ray Train workers (``scaling``: CPUs, a GPU or a share of one, custom resources each) and,
where its recipe mines while it trains, its miners (``mining``); in a sweep each trial also reserves its driver's
bundle (``tune.driver_cpus``), and its miners go into that trial's placement group — unless the run mines once for
all trials (GEC's shared n-best). Ray takes a request that can never be met and waits for ever (Ray Train V2
retries a worker group that cannot start with no limit); here such a request ends in one line naming the settings
and what the cluster has (an autoscaling cluster: the most its autoscaler may start). A sweep whose concurrent
trials would hold the resources their own workers wait for (Tune reserves the trials, Ray Train then asks for each
trial's workers, which would wait — and a worker group that waits too long ends its run) runs fewer at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raycl.distributed.runtime import HEAD_RESOURCE
from raycl.errors import UserError

if TYPE_CHECKING:
    from raycl.config import MiningSection

Bundle = dict[str, float]
EPS = 1e-9
# The head-only resource: cluster.yaml's head, the KubeRay manifest's head group and the embedded Ray provide it;
# the driver side (trial drivers — and so Ray Train's controllers, which Ray places on their driver's node —, the
# negative stream, the weight store) asks for a share of it, so that it stays on the on-demand head. Ray counts a
# custom resource down to 1e-4: a share of 1e-3 of the head's 1 allows 1000 such actors at once.
HEAD_SHARE = 0.001  # of HEAD_RESOURCE (raycl.distributed.runtime)


@dataclass(frozen=True)
class Ask:
    """``count`` equal bundles of the run, what they are for and the settings that size them."""

    what: str  # "Ray Train worker", "miner", "trial driver"
    count: int
    bundle: Bundle
    settings: str  # the config keys that set it, for messages

    def total(self) -> Bundle:
        return {k: v * self.count for k, v in self.bundle.items()}

    def label(self) -> str:
        return f"{self.count} {self.what}{'s' * (self.count != 1)} × {{{fmt(self.bundle)}}}"

    def __str__(self) -> str:
        return f"{self.label()} ({self.settings})"


@dataclass(frozen=True)
class MiningPlan:
    """The miners that run while a config trains, as its recipe plans them (``Recipe.mining_plan``)."""

    mining: MiningSection | None = None  # their section; None: no miners while training
    shared: bool = False  # one pool serves the whole run (GEC's shared n-best), not one per training


@dataclass(frozen=True)
class Plan:
    """What one run holds at once: each trial's reservation (its driver and miners), each trial's workers (asked by
    Ray Train once the trial runs), what the run holds once for all trials, and how many trials run at once."""

    per_trial: list[Ask]
    workers: Ask | None
    shared: list[Ask]
    trials: int = 1

    def asks(self) -> list[Ask]:
        return [*self.shared, *self.per_trial, *([self.workers] if self.workers else [])]

    def need(self, trials: int = 1) -> Bundle:
        """What ``trials`` trials running at once hold, their workers started."""
        one = add(*(a.total() for a in self.per_trial), self.workers.total() if self.workers else {})
        return add(*(a.total() for a in self.shared), {k: v * trials for k, v in one.items()})


@dataclass(frozen=True)
class Cluster:
    """What Ray has: in all (an autoscaling cluster: at most), and each node's (or node type's) resources."""

    total: Bundle
    nodes: list[Bundle]
    autoscaling: bool = False
    embedded: bool = False  # the local Ray raycl starts on this machine
    unknown: bool = False  # an autoscaler whose node types raycl cannot see: what it may start is not known
    types: Any = None  # the autoscaler's NodeTypes (raycl.distributed.autoscaler), where known

    def __str__(self) -> str:
        """``the cluster has {CPU 8, GPU 1} in all, on 2 nodes ({CPU 4}; {CPU 4, GPU 1})`` and the like."""
        gpus = "" if self.total.get("GPU") else " and no GPU"
        if self.embedded:
            return f"the embedded Ray on this machine has {{{fmt(self.total)}}}{gpus}"
        shapes = "; ".join(f"{{{s}}}" for s in sorted({fmt(n) for n in self.nodes})[:4])
        source = f", {self.types.source}" if self.types is not None else ""
        most = f" at most (its autoscaler's maximum{source})" if self.autoscaling else " in all"
        n = len(self.nodes)
        if self.autoscaling:  # the alive nodes and the node types the autoscaler may start, as one list of shapes
            return f"the cluster has {{{fmt(self.total)}}}{gpus}{most}, its node types and nodes: {shapes}"
        return f"the cluster has {{{fmt(self.total)}}}{gpus}{most}, on {n} node{'s' * (n != 1)} ({shapes})"


# ---------------------------------------------------------------------------------------------- bundles
def add(*bundles: Bundle) -> Bundle:
    out: Bundle = {}
    for b in bundles:
        for k, v in b.items():
            out[k] = out.get(k, 0.0) + v
    return out


def fmt(bundle: Bundle) -> str:
    """``CPU 2, GPU 0.5, miner 1``: Ray's own resources first, custom ones after; none of Ray's bookkeeping."""
    order = {"CPU": 0, "GPU": 1}
    keys = sorted((k for k in bundle if _shown(k)), key=lambda k: (order.get(k, 2), k))
    return ", ".join(f"{k} {bundle[k]:g}" for k in keys) or "nothing"


def _shown(key: str) -> bool:
    bookkeeping = ("node:", "accelerator_type:", "memory", "object_store_memory")
    return not key.startswith(bookkeeping) and "_group_" not in key


def worker_bundle(scaling: Any) -> Bundle:
    """One Ray Train worker's resources (``scaling``)."""
    gpu = {"GPU": float(scaling.gpus_per_worker)} if scaling.use_gpu else {}
    return {"CPU": float(scaling.cpus_per_worker), **gpu, **scaling.resources}


def miner_bundle(mining: Any) -> Bundle:
    """One miner's resources (``mining``)."""
    gpu = {"GPU": float(mining.gpus_per_miner)} if mining.gpus_per_miner else {}
    return {"CPU": float(mining.cpus_per_miner), **gpu, **mining.resources}


def _settings(name: str, section: Any, keys: list[str]) -> str:
    """``scaling.num_workers=2, scaling.cpus_per_worker=0.75``: the keys as the user would ``--set`` them."""

    def value(v: Any) -> str:
        return str(v).lower() if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else str(v)

    return ", ".join(f"{name}.{k}={value(getattr(section, k))}" for k in keys)


def workers_ask(scaling: Any) -> Ask | None:
    if scaling.num_workers == 0:  # local mode: the training runs in the driver's (or the trial's) process
        return None
    keys = [
        "num_workers",
        "cpus_per_worker",
        *(["use_gpu", "gpus_per_worker"] if scaling.use_gpu else []),
        *(["resources"] if scaling.resources else []),
    ]
    settings = _settings("scaling", scaling, keys)
    return Ask("Ray Train worker", scaling.num_workers, worker_bundle(scaling), settings)


def miners_ask(mining: Any) -> Ask:
    keys = [
        "num_miners",
        "cpus_per_miner",
        *(["gpus_per_miner"] if mining.gpus_per_miner else []),
        *(["resources"] if mining.resources else []),
    ]
    return Ask("miner", mining.num_miners, miner_bundle(mining), _settings("mining", mining, keys))


def plan(cfg: Any, *, sweep: bool, mining: Any = None, shared: bool = False) -> Plan:
    """What a run of ``cfg`` holds: its workers, its miners (``mining``: the section of a recipe that mines while
    it trains, else None; ``shared``: one miner pool for the whole run) and, in a sweep, each trial's driver."""
    miners = [miners_ask(mining)] if mining is not None else []
    bundle = {"CPU": float(cfg.tune.driver_cpus)}
    driver = [Ask("trial driver", 1, bundle, _settings("tune", cfg.tune, ["driver_cpus"]))] if sweep else []
    return Plan(
        per_trial=driver + ([] if shared else miners),
        workers=workers_ask(cfg.scaling),
        shared=miners if shared else [],
        trials=cfg.tune.max_concurrent_trials if sweep else 1,
    )


# ---------------------------------------------------------------------------------------------- the check
def fits(need: Bundle, have: Bundle) -> bool:
    return all(v <= have.get(k, 0.0) + EPS for k, v in need.items() if v > 0)


def short(need: Bundle, have: Bundle) -> Bundle:
    """What ``need`` asks beyond ``have``."""
    return {k: v for k, v in need.items() if v > have.get(k, 0.0) + EPS}


def check(p: Plan, cluster: Cluster) -> int:
    """How many trials may run at once (≤ ``p.trials``), every one with its workers; a run that cannot start even
    alone is a :class:`UserError` naming the settings and what the cluster has."""
    if cluster.unknown:  # what an autoscaler may start is not known here: the request waits for it (check_run)
        return p.trials
    for ask in p.asks():
        if cluster.nodes and not any(fits(ask.bundle, node) for node in cluster.nodes):
            raise UserError(
                f"one {ask.what} asks {{{fmt(ask.bundle)}}} ({ask.settings}), more than any node has: {cluster}"
            )
    need = p.need(1)
    if not fits(need, cluster.total):
        lacking = short(need, cluster.total)
        asks = " + ".join(str(a) for a in p.asks())
        raise UserError(
            f"the run asks {{{fmt(lacking)}}} at once — {asks} — and {cluster}: lower these "
            "settings, or join a larger cluster (--address)"
        )
    trials = p.trials
    while trials > 1 and not fits(p.need(trials), cluster.total):
        trials -= 1
    return trials


# ---------------------------------------------------------------------------------------------- the cluster
_CHECKED: list[Cluster] = []  # the cluster the last run was checked against (for its progress line)


def cluster(config: str | None = None, *, fixed: bool = False) -> Cluster:
    """The connected Ray's resources: the alive nodes', or, where the autoscaler's node types are known
    (:func:`raycl.distributed.autoscaler.node_types`; ``config``: ``--cluster-config``), the most it may start —
    each node type a node shape. ``fixed``: the embedded Ray raycl started (its nodes are all it has)."""
    import ray

    from raycl.distributed.autoscaler import UNKNOWN, NodeTypes, node_types

    nodes = [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]
    total = dict(ray.cluster_resources())
    found = None if fixed and not config else node_types(config)
    if not isinstance(found, NodeTypes):
        return Cluster(total, nodes, unknown=found == UNKNOWN)
    most = found.most()
    shapes = [t.resources for t in found.types if t.max_count > 0]
    return Cluster(
        {k: max(total.get(k, 0.0), most.get(k, 0.0)) for k in {*total, *most}},
        nodes + shapes,
        autoscaling=True,
        types=found,
    )


def of_types(found: Any) -> Cluster:
    """What an autoscaler's node types (``NodeTypes``) may start, before the alive nodes are known."""
    return Cluster(
        found.most(), [t.resources for t in found.types if t.max_count > 0], autoscaling=True, types=found
    )


def unknown_line(p: Plan, have: Cluster, cfg: Any) -> str | None:
    """The one line said where the autoscaler's node types are unknown and the alive nodes cannot hold the run:
    it waits for the autoscaler, for as long as ``scaling.start_timeout_s`` lets a worker group wait."""
    alive = Cluster(have.total, have.nodes)
    try:
        check(p, alive)
        return None
    except UserError:
        pass
    bound = (
        f"up to scaling.start_timeout_s={cfg.scaling.start_timeout_s:g} s"
        if cfg.scaling.start_timeout_s
        else "with no time limit (scaling.start_timeout_s=0)"
    )
    asks = " + ".join(a.label() for a in p.asks())
    return (
        f"the autoscaler's node types are not known here (no autoscaling config on this machine; give "
        f"--cluster-config CLUSTER.yaml to check against them): {asks} waits for the autoscaler to start "
        f"nodes that hold it, {bound}; the alive nodes have {{{fmt(have.total)}}}"
    )


def check_run(
    space: Any, *, sweep: bool, recipe: Any, cluster_: Cluster | None = None, config: str | None = None
) -> Any:
    """Before a run starts on the connected Ray: its request checked against the cluster (a :class:`UserError` if
    it can never fit); returns the config, ``tune.max_concurrent_trials`` lowered (and said) where more trials at
    once would hold what their own workers wait for. ``cluster_``: the cluster, when not the connected Ray's;
    ``config``: ``--cluster-config``, the autoscaler's node types."""
    from raycl.config import set_dotted
    from raycl.progress import say

    cfg = space.config
    miners: MiningPlan = recipe.mining_plan(cfg, space)
    p = plan(cfg, sweep=sweep, mining=miners.mining, shared=miners.shared)
    have = cluster_ or cluster(config)
    _CHECKED[:] = [have]
    if have.unknown and (line := unknown_line(p, have, cfg)):
        say(line)
    trials = check(p, have)
    if trials == p.trials:
        return cfg
    say(
        f"tune.max_concurrent_trials {p.trials} → {trials}: a trial holds {{{fmt(p.need(1))}}} with its workers "
        f"(and what the run shares); {have}"
    )
    return set_dotted(cfg, {"tune.max_concurrent_trials": trials}, where="resources")


def embedded_cluster(cfg: Any) -> Cluster:
    """What the embedded local Ray that ``raycl.train``/``raycl.tune`` start for ``cfg`` will have: the CPUs
    :func:`~raycl.distributed.runtime.local_cpus` gives it and the GPUs Ray detects on this machine (as
    ``ray.init`` counts them: ``CUDA_VISIBLE_DEVICES``, else the driver's devices)."""
    from ray._private.accelerators import get_accelerator_manager_for_resource

    from raycl.distributed.runtime import cpus_of_a_run, local_cpus

    manager = get_accelerator_manager_for_resource("GPU")
    gpus = manager.get_current_node_num_accelerators() if manager is not None else 0
    node = {"CPU": float(local_cpus(cpus_of_a_run(cfg), quiet=True)), **({"GPU": float(gpus)} if gpus else {})}
    return Cluster(node, [node], embedded=True)


def head_share() -> Bundle:
    """``{raycl_head: 0.001}`` where the connected cluster provides :data:`HEAD_RESOURCE`, else ``{}`` (a user's
    own cluster: the driver side runs wherever Ray puts it)."""
    import ray

    have = ray.is_initialized() and ray.cluster_resources().get(HEAD_RESOURCE, 0.0) > 0
    return {HEAD_RESOURCE: HEAD_SHARE} if have else {}


def driver_bundle(driver_cpus: float) -> Bundle:
    """A trial's first bundle, its driver's: ``tune.driver_cpus`` CPU and, where the head provides it, a share of
    the head-only resource (Tune rejects a bundle of no CPU, not one of CPU and a custom resource)."""
    return {"CPU": float(driver_cpus), **head_share()}


def on_head() -> dict[str, Any]:
    """``.options()`` of a driver-side actor outside a placement group: a share of the head-only resource."""
    share = head_share()
    return {"resources": share} if share else {}


def waiting_line(scaling: Any) -> str | None:
    """What a training's progress line says until its workers report: the worker group it waits for."""
    ask = workers_ask(scaling)
    if ask is None:
        return None
    bound = f"the run ends after {scaling.start_timeout_s:g} s" if scaling.start_timeout_s else "no time limit"
    types = _CHECKED[-1].types if _CHECKED else None
    names = types.holding(ask.bundle) if types is not None else []
    kinds = " or ".join(n for n in names if n != "ray.head.default")
    autoscaler = f" — the autoscaler starts a {kinds} node for it if none is up" if kinds else ""
    return f"{ask.label()} to start{autoscaler} ({bound})"


def start_attempts_limit(start_timeout_s: float, attempt_s: float) -> int:
    """Ray Train's ``FailureConfig.controller_failure_limit`` for a worker group given ``start_timeout_s`` in all
    (attempts of ``attempt_s``: ``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S``); -1 (for ever) for 0."""
    if start_timeout_s <= 0:
        return -1
    return max(math.ceil(start_timeout_s / attempt_s) - 1, 0)


def gpu_share() -> float | None:
    """This Ray worker's share of its GPU (``{"GPU": 0.5}`` → 0.5), or None: no fraction, or not a Ray worker."""
    import ray

    if not ray.is_initialized():
        return None
    try:
        share = float(ray.get_runtime_context().get_assigned_resources().get("GPU", 0.0))
    except AssertionError:  # the driver (Ray Train's local mode): no assigned resources
        return None
    return share if 0 < share < 1 else None


def gpu_problem(who: str, setting: str, *, nccl: bool = False) -> str | None:
    """On a Ray worker given a GPU: why it cannot use it — torch on this node has no CUDA (or, with ``nccl``, no
    NCCL) — as one line naming the node, the setting and the fix; None where it can."""
    import os

    import ray
    import torch

    if torch.cuda.is_available() and (not nccl or torch.distributed.is_nccl_available()):
        return None
    lacks = "NCCL" if torch.cuda.is_available() else "CUDA"
    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "?"
    kind = os.environ.get("RAY_NODE_TYPE_NAME")
    where = f"node {node} ({f'type {kind}, ' if kind else ''}{ray.util.get_node_ip_address()})"
    return (
        f"{who} was given a GPU ({setting}) on {where}, but torch {torch.__version__} there has no {lacks}: "
        f"give that node type an image with a CUDA build of torch (cluster.yaml's docker image and "
        f"setup_commands), or run without the GPU"
    )


def cap_gpu_memory(device: Any) -> float | None:
    """Cap this process's CUDA memory at its share of the GPU: Ray accounts fractional GPUs but does not isolate
    them, so a trainer on 0.5 and a miner on 0.5 of one GPU would otherwise each grow into the other's half. Done
    once, where a worker learns its device; returns the fraction set."""
    import torch

    share = gpu_share() if getattr(device, "type", "") == "cuda" and torch.cuda.is_available() else None
    if share is not None:  # (a logical GPU on a machine without CUDA, as in tests, has no memory to cap)
        index = device.index if device.index is not None else torch.cuda.current_device()  # "cuda" names no index
        torch.cuda.set_per_process_memory_fraction(share, index)
    return share
