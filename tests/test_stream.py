"""The negative stream and the miner pool on a real local Ray: back-pressure, per-rank exactly-once delivery, the
negatives cache across epochs, re-mining of refused items, miners that crash, are killed or stall, placement,
and the pooled pipeline mining exactly what the in-process ``BeamSearchMiner`` mines with the same weights."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import ending

from raycl.data.gec import GecExample
from raycl.distributed.ledger import Ledger
from raycl.distributed.messages import MineTask
from raycl.distributed.miner_pool import MinerFactory, MinerPool, miner_options
from raycl.distributed.stream import start_stream
from raycl.distributed.weights import publish_weights, start_weight_store
from raycl.miners.beam_search import GEC_BEAM, build_beam_miner
from raycl.miners.records import MinedNegatives
from raycl.models.presets import build_model
from raycl.models.seq2seq import Seq2SeqScorer
from raycl.testing.faults import Chaos
from raycl.testing.miners import ECHO


def shard(rank: int, n: int) -> list[GecExample]:
    """Items that workers can unpickle (a class defined in this test module would not import there)."""
    return [GecExample(f"r{rank}:{i}", "s", "t") for i in range(n)]


def take_all(
    ray: Any,
    stream: Any,
    rank: int,
    *,
    n: int = 5,
    pause_s: float = 0.0,
    epoch: int | None = None,
    on_batch: Any = None,
) -> list[MinedNegatives]:
    """A trainer: take batches of ``n`` until its epoch is exhausted."""
    got: list[MinedNegatives] = []
    while batch := ray.get(stream.take.remote(rank, n, timeout=60, epoch=epoch)):
        got += batch
        if on_batch is not None:
            on_batch(got)
        time.sleep(pause_s)
    return got


def ids(items: list[MinedNegatives]) -> list[str]:
    return [i.id for i in items]


def echo_pool(n: int, faults: Chaos | None = None, **options: Any) -> MinerPool:
    factory = MinerFactory(ECHO, options={"k": 1, **options}, faults=faults)
    return MinerPool(factory, num_miners=n, cpus_per_miner=0)


def test_back_pressure_keeps_the_buffer_within_capacity(ray_local) -> None:
    ray = ray_local
    stream = start_stream(world_size=1, capacity=8, task_size=2, lease_s=30.0, seed=3)
    pool = echo_pool(2)  # miners far faster than the trainer below
    pool.start(stream)
    pool.ready(timeout=60)
    ray.get(stream.start_epoch.remote(0, [shard(0, 40)]))
    fills: list[int] = []
    got = take_all(
        ray, stream, 0, n=3, pause_s=0.03, on_batch=lambda _: fills.append(ray.get(stream.stats.remote())["fill"])
    )
    stats = ray.get(stream.stats.remote())
    print(f"\nback-pressure: max fill {stats['max_fill']} of {stats['capacity']}, sampled {max(fills)}")
    assert stats["max_fill"] <= 8 and max(fills) <= 8
    assert stats["max_fill"] >= 6  # the miners were really held back at the cap, not merely slow
    expected = Ledger(world_size=1, task_size=2, seed=3)
    expected.start_epoch(0, [shard(0, 40)])
    assert ids(got) == expected.undelivered(0)  # the seeded order, whatever the miners' timing
    assert stats["mined"] == stats["consumed"] == 40 and stats["duplicates"] == 0
    ray.get(stream.close.remote())
    assert sum(pool.join(timeout=30)) == 20  # every run loop ended; 20 tasks of 2
    pool.shutdown()


def test_ranks_get_their_own_items_and_later_epochs_reuse_the_cache(ray_local) -> None:
    ray = ray_local
    stream = start_stream(world_size=2, capacity=16, task_size=4)
    pool = echo_pool(2)
    pool.start(stream)
    sizes = (30, 25)
    for epoch, reuse, mined in ((0, None, 55), (1, 0, 55), (2, None, 110), (3, 1, 165)):
        ray.get(stream.start_epoch.remote(epoch, [shard(r, n) for r, n in enumerate(sizes)], reuse_version=reuse))
        out: dict[int, list[MinedNegatives]] = {}

        def trainer(rank: int, epoch: int = epoch, out: dict[int, list[MinedNegatives]] = out) -> None:
            out[rank] = take_all(ray, stream, rank, epoch=epoch)

        threads = [threading.Thread(target=trainer, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r, n in enumerate(sizes):
            assert sorted(ids(out[r])) == sorted(e.id for e in shard(r, n)), (epoch, r)
            assert all(i.negatives == (f"{i.id}~0",) for i in out[r])
        # epoch 1 reuses epoch 0's negatives (no mining); 2 re-mines all; 3 wants version ≥ 1, which none has
        assert ray.get(stream.stats.remote())["mined"] == mined, epoch
        cached = {i.id: i for i in ray.get(stream.cached.remote())}
        assert all(cached[i.id] == i for r in range(2) for i in out[r])
    assert ray.get(stream.take.remote(0, 5, timeout=1, epoch=1)) == []  # that epoch is over
    ray.get(stream.close.remote())
    pool.join(timeout=30)
    pool.shutdown()


def test_a_trainer_restarted_from_an_older_checkpoint_replays_that_epoch(ray_local) -> None:
    """Ray Train restarts from the last checkpoint it registered, which can be older than the stream's position (a
    worker that dies right after reporting loses that report): the earlier epoch is scheduled again, in full."""
    ray = ray_local
    stream = start_stream(world_size=1, capacity=16, task_size=4)
    pool = echo_pool(1)
    pool.start(stream)
    items = [shard(0, 10)]
    assert ray.get(stream.start_epoch.remote(0, items))
    assert len(take_all(ray, stream, 0, epoch=0)) == 10
    assert ray.get(stream.start_epoch.remote(1, items))
    assert len(ray.get(stream.take.remote(0, 4, timeout=60, epoch=1))) == 4  # the trainer dies here
    assert not ray.get(stream.start_epoch.remote(1, items))  # the running epoch: a no-op
    assert ray.get(stream.start_epoch.remote(0, items, reuse_version=0))  # restarted at epoch 0: replayed
    assert sorted(ids(take_all(ray, stream, 0, epoch=0))) == sorted(e.id for e in items[0])
    ray.get(stream.close.remote())
    pool.join(timeout=30)
    pool.shutdown()


def test_refused_items_are_remined_with_the_newer_weights(ray_local) -> None:
    ray = ray_local
    store = start_weight_store()
    stream = start_stream(world_size=1, capacity=8, task_size=2)
    pool = MinerPool(MinerFactory(ECHO, options={"k": 1}), num_miners=1, cpus_per_miner=0, weight_store=store)
    pool.start(stream)
    ray.get(stream.start_epoch.remote(0, [shard(0, 12)]))
    first = ray.get(stream.take.remote(0, 4, timeout=30))
    assert [i.model_version for i in first] == [0] * 4
    publish_weights(store, 1, {"w": torch.tensor([5.0])})
    stale = ids(first[:2])
    ray.get(stream.refuse.remote(0, stale, min_version=1))  # the trainer's staleness check failed
    rest = take_all(ray, stream, 0)
    assert sorted(ids(first[2:] + rest)) == sorted(e.id for e in shard(0, 12))
    again = [i for i in rest if i.id in stale]
    assert ids(rest[-2:]) == stale and all(i.model_version == 1 and i.scores == (5.0,) for i in again)
    assert ray.get(stream.stats.remote())["refused"] == 2
    ray.get(stream.close.remote())
    pool.join(timeout=30)
    pool.shutdown()
    ray.kill(store)


def test_crashed_and_killed_miners_restart_and_nothing_is_lost_or_duplicated(ray_local) -> None:
    ray = ray_local
    stream = start_stream(world_size=2, capacity=16, task_size=4, lease_s=30.0)
    pool = echo_pool(2, Chaos(fail_after_tasks=2, miners=(0,)), delay_s=0.004)  # miner 0 dies holding its 2nd task
    pool.start(stream)
    pool.ready(timeout=60)
    sched = [shard(0, 60), shard(1, 60)]
    ray.get(stream.start_epoch.remote(0, sched))
    killed = threading.Event()

    def kill_midway(got: list[MinedNegatives]) -> None:
        if len(got) >= 20 and not killed.is_set():
            killed.set()
            ray.kill(pool.actors()[1], no_restart=False)  # and miner 1 is killed mid-stream

    out = {0: take_all(ray, stream, 0, on_batch=kill_midway), 1: take_all(ray, stream, 1)}
    for r in range(2):
        assert sorted(ids(out[r])) == sorted(e.id for e in sched[r]), r
    stats = ray.get(stream.stats.remote())
    print(f"\ncrash/kill: {stats}")
    assert killed.is_set() and stats["reassigned"] >= 4  # the crashed miner's task was reclaimed
    assert ray.get([a.version.remote() for a in pool.actors()], timeout=30) == [0, 0]  # both restarted
    ray.get(stream.close.remote())
    pool.join(timeout=30)
    pool.shutdown()


def test_a_stalled_miners_task_is_mined_again_and_its_late_result_dropped(ray_local) -> None:
    ray = ray_local
    stream = start_stream(world_size=1, capacity=8, task_size=4, lease_s=1.0)
    pool = echo_pool(2, Chaos(stall_s=2.5, miners=(0,)), delay_s=0.01)
    pool.start(stream)
    pool.ready(timeout=60)  # both miners wait for work: miner 0 surely gets (and sits on) a task
    ray.get(stream.start_epoch.remote(0, [shard(0, 16)]))
    got = take_all(ray, stream, 0)
    assert sorted(ids(got)) == sorted(e.id for e in shard(0, 16))
    time.sleep(2.0)  # let the stalled miner hand its result back
    stats = ray.get(stream.stats.remote())
    assert stats["reassigned"] >= 1 and stats["duplicates"] >= 1, stats
    ray.get(stream.close.remote())
    pool.join(timeout=30)
    pool.shutdown()


def test_a_broken_miner_is_reported_not_restarted_forever(ray_local) -> None:
    ray = ray_local
    stream = start_stream(world_size=1, capacity=4, task_size=2)
    pool = MinerPool(MinerFactory(ECHO, options={"no_such_option": 1}), num_miners=1, cpus_per_miner=0)
    pool.start(stream)
    end = time.monotonic() + 30
    while not pool.errors() and time.monotonic() < end:
        time.sleep(0.1)
    assert any("no_such_option" in e for e in pool.errors()), pool.errors()
    with pytest.raises(ValueError, match="unknown miner kind"):
        MinerFactory("nope").build()
    ray.get(stream.close.remote())
    pool.shutdown()


def test_miners_take_their_resources_and_placement_group_bundles(ray_local) -> None:
    ray = ray_local
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.state import list_actors

    opts = miner_options(2, cpus=0.5, gpus=0.25, resources={"miner": 1.0})
    assert (opts["num_cpus"], opts["num_gpus"], opts["resources"]) == (0.5, 0.25, {"miner": 1.0})
    assert opts["max_restarts"] == -1 and opts["max_task_retries"] == -1
    pg = placement_group([{"CPU": 0.1}, {"CPU": 0.25}, {"CPU": 0.25}])
    ray.get(pg.ready(), timeout=30)
    pool = MinerPool(MinerFactory(ECHO), num_miners=2, cpus_per_miner=0.25, placement_group=pg, first_bundle=1)
    assert [
        miner_options(i, cpus=0.25, gpus=0, placement_group=pg)["scheduling_strategy"].placement_group_bundle_index
        for i in range(2)
    ] == [1, 2]
    assert pool.ready(timeout=30) == [0, 0]
    mine = {a._actor_id.hex() for a in pool.actors()}
    alive = list_actors(
        address=ray.get_runtime_context().gcs_address, filters=[("state", "=", "ALIVE")], detail=True
    )
    placed = [a for a in alive if a.actor_id in mine]
    assert len(placed) == 2 and {a.placement_group_id for a in placed} == {pg.id.hex()}
    pool.shutdown()
    remove_placement_group(pg)


# ---------------------------------------------------------------------------------------------- real miner
EXAMPLES = [
    GecExample(f"x:{i}", src, tgt)
    for i, (src, tgt) in enumerate(
        [
            ("He do n't like it .", "He does n't like it ."),
            ("This are a sentence .", "This is a sentence ."),
            ("Fine as it is .", "Fine as it is ."),
            ("I has went to the school yesterday .", "I went to school yesterday ."),
            ("She go to school .", "She goes to school ."),
            ("They was happy .", "They were happy ."),
            ("A apple a day .", "An apple a day ."),
            ("We is here now .", "We are here now ."),
        ]
        * 2
    )
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    texts = [t for e in EXAMPLES for t in (e.source, e.target)] * 4
    tiny = dict(d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_layers=1, decoder_layers=1)
    out = tmp_path_factory.mktemp("model")
    return ending(build_model("smoke", out_dir=out, texts=texts, vocab_size=300, **tiny))


def test_the_pool_mines_what_the_in_process_miner_mines_with_the_same_weights(ray_local, model_dir: Path) -> None:
    ray = ray_local
    opts = {"k": 2, "beam": 4, "max_len_b": 10, "batch_size": 4}
    scorer = Seq2SeqScorer.from_pretrained(model_dir)
    torch.manual_seed(0)
    with torch.no_grad():  # version 1: weights the miners only get from the store
        for p in scorer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    reference = build_beam_miner(str(model_dir), opts)  # the pool's engine (auto), in process, at version 1
    GEC_BEAM.load(reference, scorer.state_dict(), version=1)
    want = {m.id: m for m in reference.mine(EXAMPLES)}
    store = start_weight_store()
    assert publish_weights(store, 1, scorer.state_dict())
    stream = start_stream(world_size=2, capacity=8, task_size=4)
    pool = MinerPool(
        MinerFactory(GEC_BEAM, str(model_dir), opts), num_miners=2, cpus_per_miner=0.5, weight_store=store
    )
    pool.start(stream)
    ray.get(stream.start_epoch.remote(0, [EXAMPLES[0::2], EXAMPLES[1::2]]))
    got = {i.id: i for r in range(2) for i in take_all(ray, stream, r)}
    assert sorted(got) == sorted(want)
    for id_, m in want.items():
        assert got[id_].negatives == m.negatives and got[id_].model_version == 1, id_
        assert got[id_].scores == pytest.approx(m.scores, rel=1e-4, abs=1e-4), id_
    ray.get(stream.close.remote())
    pool.join(timeout=60)
    _print_rates(ray, pool)
    pool.shutdown()
    ray.kill(store)


def _print_rates(ray: Any, pool: MinerPool) -> None:
    """Negatives/s of one miner vs the whole pool on the same tasks (printed, not asserted: 2 shared cores)."""
    tasks = [MineTask(0, t, 0, tuple(EXAMPLES * 2)[4 * t : 4 * t + 4]) for t in range(8)]
    start = time.perf_counter()
    one = ray.get([pool.actors()[0].mine.remote(t) for t in tasks])
    t_one = time.perf_counter() - start
    start = time.perf_counter()
    both = list(pool.map(tasks))
    t_both = time.perf_counter() - start
    n = sum(len(r.negatives) for b in one for r in b.records)
    negatives = {b.task_id: [r.negatives for r in b.records] for b in one}
    assert {b.task_id: [r.negatives for r in b.records] for b in both} == negatives
    print(f"\npool negatives/s: 1 miner {n / t_one:.1f}, 2 miners {n / t_both:.1f}")
