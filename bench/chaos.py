"""Exactly-once under chaos (issue 3): ``python bench/chaos.py --json``.

A mining run on three logical Ray nodes on this machine (``ray.cluster_utils.Cluster`` with fast health checks: a
removed node is seen dead in ~3 s, not ~15 s): the head holds the negative stream and the weight store, two worker
nodes hold ``--miners`` real ``gec_beam`` miners (an untrained smoke-preset model, beam search capped at
``--max-new-tokens``). Two trainer ranks (threads of this driver) consume ``--epochs`` epochs of ``--per-rank``
built-in sentences each, rank 0 publishing new weights every ``--sync-every`` batches. While they consume,
``--kills`` miner actors are killed (``ray.kill``, Ray restarts them) and one worker node is removed without grace
(its miners move to the other).

Prints one JSON object: ``miner_kills``, ``node_kills``, ``lost`` (ids of an epoch never delivered to their
rank), ``duplicated`` (ids delivered more than once in an epoch), ``completed`` (every epoch ended and every
miner's loop returned), plus the stream's counters (``reassigned``: tasks that came back from a dead miner) and
timings. The run passes when ``lost == duplicated == 0`` and ``completed`` is true (exit status 1 otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
FAST_HEALTH = {"health_check_period_ms": 500, "health_check_failure_threshold": 3, "health_check_timeout_ms": 500}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/chaos.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--miners", type=int, default=4, help="miner actors on the two worker nodes (default 4)")
    p.add_argument("--kills", type=int, default=3, help="miner kills during the run (default 3)")
    p.add_argument("--per-rank", type=int, default=160, help="sentences per trainer rank per epoch (default 160)")
    p.add_argument("--epochs", type=int, default=2, help="epochs (default 2; every epoch is re-mined)")
    p.add_argument("--batch", type=int, default=8, help="items a trainer takes per step (default 8)")
    p.add_argument("--step-s", type=float, default=0.05, help="simulated trainer step time (default 0.05 s)")
    p.add_argument("--sync-every", type=int, default=5, help="rank 0 publishes weights every N steps (default 5)")
    p.add_argument("--max-new-tokens", type=int, default=12, help="beam-search length cap (default 12)")
    p.add_argument("--json", action="store_true", help="print only the JSON object on stdout")
    return p.parse_args(argv)


def make_inputs(work: Path, n: int) -> tuple[list[Any], Path]:
    """``n`` built-in CWEB-like sentences as ``GecExample``s and an untrained smoke-preset model."""
    from raycl.data.gec import GecExample
    from raycl.data.gec_corpus import LOW_DENSITY, generate
    from raycl.models.presets import build_model

    sents = generate(n, error_rate=LOW_DENSITY.error_rate, edits_per_error=LOW_DENSITY.edits_per_error, seed=0)
    examples = [GecExample(f"s{i}", s.source, s.target()) for i, s in enumerate(sents)]
    model = build_model(
        "smoke", out_dir=work / "model", texts=[t for e in examples for t in (e.source, e.target)], seed=0
    )
    return examples, model


class Chaos:
    """Kills ``kills`` miners spread over the run (at even fractions of the items) and removes worker node 1
    half-way through the first epoch; each event is recorded with the number of items consumed at that moment."""

    def __init__(self, ray: Any, cluster: Any, pool: Any, node: Any, *, kills: int, total: int) -> None:
        self.ray, self.cluster, self.pool, self.node = ray, cluster, pool, node
        at = [int(total * (i + 1) / (kills + 2)) for i in range(kills)]
        self.plan = sorted([(a, "kill") for a in at] + [(total // 4, "node")])
        self.events: list[dict[str, Any]] = []

    def maybe_fire(self, consumed: int) -> None:
        while self.plan and consumed >= self.plan[0][0]:
            _, what = self.plan.pop(0)
            t0 = time.monotonic()
            if what == "kill":
                actors = self.pool.actors()
                victim = sum(e["event"] == "kill" for e in self.events) % len(actors)
                self.ray.kill(actors[victim], no_restart=False)  # Ray restarts it; its task comes back
                self.events.append({"event": "kill", "miner": victim, "consumed": consumed})
            else:
                self.cluster.remove_node(self.node, allow_graceful=False)
                self.events.append({"event": "node", "consumed": consumed})
            self.events[-1]["took_s"] = round(time.monotonic() - t0, 3)


def trainer(
    ray: Any,
    stream: Any,
    store: Any,
    state: dict[str, Any],
    rank: int,
    epoch: int,
    args: argparse.Namespace,
    lock: threading.Lock,
) -> None:
    """Take batches of this rank's epoch until it is exhausted; rank 0 publishes weights every sync_every."""
    from raycl.distributed.weights import publish_weights

    steps = 0
    while batch := ray.get(stream.take.remote(rank, args.batch, timeout=120, epoch=epoch)):
        time.sleep(args.step_s)
        steps += 1
        with lock:
            state["got"][rank] += [item.id for item in batch]
            state["versions"].update(item.model_version for item in batch)
            state["consumed"] += len(batch)
            state["chaos"].maybe_fire(state["consumed"])
        if rank == 0 and steps % args.sync_every == 0:
            state["version"] += 1
            publish_weights(store, state["version"], state["weights"])


def run_epoch(
    ray: Any,
    stream: Any,
    store: Any,
    state: dict[str, Any],
    sched: list[list[Any]],
    epoch: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    state["got"] = [[], []]
    ray.get(stream.start_epoch.remote(epoch, sched))
    lock = threading.Lock()
    threads = [
        threading.Thread(target=trainer, args=(ray, stream, store, state, r, epoch, args, lock)) for r in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    per_rank = [(set(e.id for e in sched[r]), state["got"][r]) for r in range(2)]
    return {
        "epoch": epoch,
        "delivered": sum(len(g) for _, g in per_rank),
        "lost": sum(len(want - set(got)) for want, got in per_rank),
        "duplicated": sum(len(got) - len(set(got)) for _, got in per_rank),
        "foreign": sum(len(set(got) - want) for want, got in per_rank),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.pop("RAY_ADDRESS", None)  # this bench builds its own cluster
    import ray
    import torch
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raycl.distributed.miner_pool import MinerFactory, MinerPool
    from raycl.distributed.stream import start_stream
    from raycl.distributed.weights import publish_weights, start_weight_store
    from raycl.miners.beam_search import GEC_BEAM

    work = Path(tempfile.mkdtemp(prefix="raycl-chaos-"))
    examples, model = make_inputs(work, 2 * args.per_rank)
    sched = [examples[: args.per_rank], examples[args.per_rank :]]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": FAST_HEALTH})
    doomed = cluster.add_node(num_cpus=2)
    survivor = cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    cluster.wait_for_nodes()
    head = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    t0 = time.monotonic()
    stream = start_stream(
        world_size=2, capacity=64, task_size=8, lease_s=30.0, ordered=False, scheduling_strategy=head
    )
    store = start_weight_store(scheduling_strategy=head)
    factory = MinerFactory(
        GEC_BEAM, str(model), options={"k": 2, "beam": 3, "batch_size": 8, "max_len_b": args.max_new_tokens}
    )
    pool = MinerPool(
        factory,
        num_miners=args.miners,
        cpus_per_miner=0.5,
        weight_store=store,
        node_ids=[doomed.node_id, survivor.node_id],
    )
    pool.ready(timeout=300)
    from transformers import AutoModelForSeq2SeqLM

    weights = {k: v.clone() for k, v in AutoModelForSeq2SeqLM.from_pretrained(str(model)).state_dict().items()}
    publish_weights(store, 0, weights)
    total = args.epochs * 2 * args.per_rank
    state: dict[str, Any] = {
        "version": 0,
        "consumed": 0,
        "weights": weights,
        "versions": set(),
        "chaos": Chaos(ray, cluster, pool, doomed, kills=args.kills, total=total),
    }
    pool.start(stream)
    ready_s, t1 = time.monotonic() - t0, time.monotonic()
    epochs = [run_epoch(ray, stream, store, state, sched, e, args) for e in range(args.epochs)]
    run_s = time.monotonic() - t1
    stats = ray.get(stream.stats.remote())
    ray.get(stream.close.remote())
    runs = pool.join(timeout=120)
    events = state["chaos"].events
    result = {
        "bench": "chaos",
        "miners": args.miners,
        "epochs": args.epochs,
        "items_per_epoch": 2 * args.per_rank,
        "miner_kills": sum(e["event"] == "kill" for e in events),
        "node_kills": sum(e["event"] == "node" for e in events),
        "lost": sum(e["lost"] for e in epochs),
        "duplicated": sum(e["duplicated"] for e in epochs),
        "completed": all(e["delivered"] == 2 * args.per_rank and not e["foreign"] for e in epochs)
        and len(runs) == args.miners,
        "per_epoch": epochs,
        "events": events,
        "weight_versions_published": state["version"],
        "model_versions_seen": sorted(state["versions"]),
        "stream": {k: stats[k] for k in ("mined", "consumed", "reassigned", "duplicates", "late", "max_fill")},
        "startup_s": round(ready_s, 1),
        "run_s": round(run_s, 1),
        "torch_threads": torch.get_num_threads(),
    }
    ray.shutdown()
    cluster.shutdown()
    print(json.dumps(result, indent=None if args.json else 2))
    ok = result["lost"] == 0 and result["duplicated"] == 0 and result["completed"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
