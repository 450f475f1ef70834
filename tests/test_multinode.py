"""Several logical Ray nodes on one machine (``ray.cluster_utils.Cluster``, fast health checks):
miners pinned to a worker node keep an epoch exactly-once while one of them is killed and then the whole node
is removed; on the two nodes left, ``raycl.mine_negatives`` refuses data specs without ``out`` (its temp folder
is the driver's, which miners on the other node cannot write). The cluster runs in a child process (this file
run as a script), since the test session already has its own local Ray."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

FAST_HEALTH = {"health_check_period_ms": 500, "health_check_failure_threshold": 3, "health_check_timeout_ms": 500}
PER_RANK = 80


def test_an_epoch_survives_a_miner_kill_and_a_node_removal(tmp_path: Path) -> None:
    import subprocess

    out = tmp_path / "result.json"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        [sys.executable, __file__, str(out)], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    print(f"\nmultinode: {result}")
    assert result["lost"] == 0 and result["duplicated"] == 0 and result["delivered"] == 2 * PER_RANK
    assert result["miners_on_removed_node_before"] == 3 and result["miners_on_removed_node_after"] == 0
    assert result["consumed_at_removal"] <= PER_RANK  # most of the epoch was mined after the node was gone
    assert result["stats"]["reassigned"] >= 1  # the tasks held by the killed miner and the lost node came back
    assert result["runs_ended"]
    refused = result["mine_without_out"]  # one line, before any miner starts
    assert "a Ray cluster of 2 nodes" in refused and "out=DIR" in refused and "\n" not in refused, refused


def _trainer(ray: Any, stream: Any, rank: int, got: list[str], go: threading.Event) -> None:
    while go.wait() and (batch := ray.get(stream.take.remote(rank, 4, timeout=90))):
        got += [i.id for i in batch]
        time.sleep(0.05)  # a trainer step


def _wait_until(cond: Any, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.05)


def main(out: Path) -> None:
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raycl.data.gec import GecExample
    from raycl.distributed.miner_pool import MinerFactory, MinerPool
    from raycl.distributed.stream import start_stream
    from raycl.testing.faults import Chaos
    from raycl.testing.miners import ECHO

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": FAST_HEALTH})
    worker = cluster.add_node(num_cpus=1)
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    head = ray.get_runtime_context().get_node_id()
    stream = start_stream(
        world_size=2,
        capacity=16,
        task_size=4,
        lease_s=20.0,
        ordered=False,
        scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False),
    )
    pool = MinerPool(
        # miner 0 stalls holding its first task until it is killed (the lease would end at 20 s): the kill then
        # takes a task with it whatever the timing, and its next life gives that task back
        MinerFactory(ECHO, options={"k": 1, "delay_s": 0.01}, faults=Chaos(stall_s=60.0, miners=(0,))),
        num_miners=3,
        cpus_per_miner=0.25,
        node_ids=[worker.node_id],
    )
    on_worker = lambda: sum(n == worker.node_id for n in ray.get([a.node_id.remote() for a in pool.actors()]))  # noqa: E731
    before = on_worker()
    pool.start(stream)
    sched = [[GecExample(f"r{r}:{i}", "s", "t") for i in range(PER_RANK)] for r in range(2)]
    ray.get(stream.start_epoch.remote(0, sched))
    got: list[list[str]] = [[], []]
    go = threading.Event()
    go.set()
    trainers = [threading.Thread(target=_trainer, args=(ray, stream, r, got[r], go)) for r in range(2)]
    for t in trainers:
        t.start()
    _wait_until(lambda: len(got[0]) >= 12, 60)
    ray.kill(pool.actors()[0], no_restart=False)
    _wait_until(lambda: len(got[0]) >= 24, 60)
    go.clear()  # trainers pause, so the full buffer holds the miners back while the node goes
    at_removal, start = len(got[0]) + len(got[1]), time.monotonic()
    cluster.remove_node(worker, allow_graceful=False)
    _wait_until(lambda: on_worker() == 0, 60)  # the removed node's processes may serve calls a little longer
    moved_s = time.monotonic() - start
    go.set()
    for t in trainers:
        t.join()
    stats = ray.get(stream.stats.remote())
    after = on_worker()
    ray.get(stream.close.remote())
    runs = pool.join(timeout=60)
    delivered = got[0] + got[1]
    expected = {e.id for s in sched for e in s}
    result = dict(
        delivered=len(delivered),
        lost=len(expected - set(delivered)),
        duplicated=len(delivered) - len(set(delivered)),
        stats=stats,
        runs_ended=len(runs) == 3,
        miners_on_removed_node_before=before,
        miners_on_removed_node_after=after,
        consumed_at_removal=at_removal,
        miners_moved_after_s=round(moved_s, 1),
        mine_without_out=_mine_without_out(out.parent),
    )
    out.write_text(json.dumps(result))
    ray.shutdown()
    cluster.shutdown()


def _mine_without_out(tmp: Path) -> str:
    import raycl
    from raycl.data.m2 import M2Sentence, write_m2
    from raycl.errors import UserError
    from raycl.models.presets import build_model

    write_m2(tmp / "c.m2", [M2Sentence("the cat sat ."), M2Sentence("a dog ran .")])
    tiny = dict(d_model=16, encoder_ffn_dim=32, decoder_ffn_dim=32, encoder_layers=1, decoder_layers=1)
    model = build_model(
        "smoke", out_dir=tmp / "model", texts=["the cat sat .", "a dog ran ."] * 20, vocab_size=120, **tiny
    )
    try:
        raycl.mine_negatives(
            model, str(tmp / "c.m2"), k=1, max_len_b=4, num_miners=1, cpus_per_miner=0.25, progress=False
        )
    except UserError as err:
        return str(err)
    return ""


if __name__ == "__main__":
    main(Path(sys.argv[1]))
