"""What a run asks of Ray, checked before anything starts: a request that can never fit ends in one line (exit 2)
naming the settings and what the cluster has; a share of a GPU per worker (``scaling.gpus_per_worker``) lets a
trainer and its miners share one GPU; a sweep runs no more trials at once than fit with their workers; a worker
group that cannot start ends its run after ``scaling.start_timeout_s``, its progress line saying what it waits for.

Ray counts logical GPUs on any machine: the 1-GPU cluster here is a local Ray of its own started with
``num_gpus=1`` (in a subprocess, beside the session's shared Ray)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raycl.config.tasks import load_space
from raycl.distributed import resources
from raycl.distributed.resources import Cluster, check, plan
from raycl.errors import UserError
from raycl.recipes import recipe_for

ROOT = Path(__file__).resolve().parents[1]
ONE_GPU = Cluster({"CPU": 16.0, "GPU": 1.0}, [{"CPU": 16.0, "GPU": 1.0}])  # the common machine: 16 cores, 1 GPU


def _plan(space_name: str, preset: str | None = None, *sets: str, sweep: bool = False) -> resources.Plan:
    space = load_space(space_name, preset=preset, overrides=list(sets))
    miners = recipe_for(space.config.task).mining_plan(space.config, space)
    return plan(space.config, sweep=sweep, mining=miners.mining, shared=miners.shared)


# ---------------------------------------------------------------------------------------------- the arithmetic
def test_a_whole_gpu_worker_and_half_a_gpu_miner_are_refused_on_one_gpu_in_one_line() -> None:
    with pytest.raises(UserError) as err:
        check(_plan("coherence", "paper"), ONE_GPU)  # use_gpu: a whole GPU per worker, the miner 0.5
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("the run asks {GPU 1.5} at once")
    for named in (
        "scaling.use_gpu=true",
        "scaling.gpus_per_worker=1",
        "mining.gpus_per_miner=0.5",
        "the cluster has {CPU 16, GPU 1} in all",
    ):
        assert named in msg, msg


def test_each_mining_papers_one_gpu_preset_fits_one_gpu_and_idiom_and_sts_fit_as_they_are() -> None:
    """The one-GPU settings of docs/cluster.md: trainer and miners share the GPU (0.5 + 0.5); the paper presets
    themselves do not fit (gec_bart: 4 GPU workers; coherence: 1 + 0.5); idiom and sts ask one GPU."""
    for name in ("coherence", "gec_pd", "gec_bart"):
        p = _plan(name, "one_gpu", sweep=True)
        assert check(p, ONE_GPU) == 1 and p.need(1)["GPU"] == 1.0, name
    for name in ("coherence", "gec_bart"):
        with pytest.raises(UserError):
            check(_plan(name, "paper", sweep=True), ONE_GPU)
    for name in ("idiom", "sts"):
        assert check(_plan(name, "paper", sweep=True), ONE_GPU) == 1  # 2 concurrent trials would need 2 GPUs


def test_a_sweep_runs_no_more_trials_at_once_than_fit_with_their_workers() -> None:
    two_cpus = Cluster({"CPU": 2.0}, [{"CPU": 2.0}])
    # each trial: its driver (0.1) + one 0.5-CPU worker; 3 fit in 2 CPUs, 4 do not
    p = _plan(
        "idiom",
        "smoke",
        "tune.max_concurrent_trials=4",
        "tune.driver_cpus=0.1",
        "scaling.cpus_per_worker=0.5",
        sweep=True,
    )
    assert check(p, two_cpus) == 3
    # GEC's shared n-best: its miner counts once for the run, not once a trial
    p = _plan(
        "gec_pd",
        "smoke",
        "tune.max_concurrent_trials=4",
        "tune.driver_cpus=0.1",
        "scaling.num_workers=1",
        "scaling.cpus_per_worker=0.5",
        "mining.cpus_per_miner=0.25",
        sweep=True,
    )
    assert p.shared and check(p, two_cpus) == 2  # 0.25 + 2 × 0.6 ≤ 2 < 0.25 + 3 × 0.6
    p = _plan("gec_pd", "smoke", "mining.share=false", sweep=True)
    assert not p.shared and any(a.what == "miner" for a in p.per_trial)


def test_a_bundle_larger_than_every_node_is_refused_though_the_total_would_fit() -> None:
    two_halves = Cluster({"CPU": 8.0, "GPU": 1.0}, [{"CPU": 4.0, "GPU": 0.5}, {"CPU": 4.0, "GPU": 0.5}])
    with pytest.raises(UserError, match=r"one Ray Train worker asks \{CPU 1, GPU 1\}.*more than any node has"):
        check(_plan("idiom", "paper"), two_halves)
    custom = _plan("idiom", "smoke", "scaling.resources={trainer: 1}")
    with pytest.raises(UserError, match=r"asks \{CPU 1, trainer 1\}"):
        check(custom, ONE_GPU)  # a custom resource no node has


def test_an_autoscaling_clusters_maximum_counts_and_its_node_types_are_nodes() -> None:
    grows = Cluster({"CPU": 40.0, "GPU": 4.0}, [{"CPU": 4.0}, {"CPU": 8.0, "GPU": 1.0}], autoscaling=True)
    assert check(_plan("gec_bart", "paper"), grows) == 1  # 4 workers of one GPU each, on 4 nodes to come
    assert "at most (its autoscaler's maximum)" in str(grows)


def test_two_gpu_workers_of_one_run_never_share_a_gpu() -> None:
    """NCCL refuses two ranks of one group on one GPU, and Ray may place two 0.5-GPU workers on one."""
    with pytest.raises(UserError) as err:
        load_space("gec_bart", preset="paper", overrides=["scaling.gpus_per_worker=0.5"])
    assert "\n" not in str(err.value) and "scaling.gpus_per_worker" in str(err.value) and "NCCL" in str(err.value)
    load_space("gec_bart", preset="paper", overrides=["scaling.gpus_per_worker=0.75"])  # two can never share one
    load_space("gec_bart", preset="paper", overrides=["scaling.num_workers=1", "scaling.gpus_per_worker=0.5"])
    for bad in ("scaling.gpus_per_worker=1.5", "scaling.gpus_per_worker=0", "mining.gpus_per_miner=1.5"):
        with pytest.raises(UserError, match=bad.split("=")[0]):
            load_space("coherence", preset="paper", overrides=[bad])


def test_the_start_bound_becomes_ray_trains_controller_failure_limit() -> None:
    assert resources.start_attempts_limit(600, 60) == 9  # 10 attempts of 60 s
    assert resources.start_attempts_limit(61, 60) == 1 and resources.start_attempts_limit(30, 60) == 0
    assert resources.start_attempts_limit(0, 60) == -1  # for ever


# ---------------------------------------------------------------------------------------------- the command
def test_a_gpu_asked_where_there_is_none_ends_in_one_line_before_ray_starts(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """``raycl.train idiom --preset smoke --set scaling.use_gpu=true`` on a machine without a GPU (this one; the
    session's Ray, if up, has none either)."""
    from raycl.train import main

    with pytest.raises(SystemExit) as ended:
        main(["idiom", "--preset", "smoke", "--set", "scaling.use_gpu=true", "--out", str(tmp_path / "run")])
    assert ended.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("raycl: error: one Ray Train worker asks {CPU 1, GPU 1}"), err
    assert "and no GPU" in err[0] and "scaling.use_gpu=true" in err[0]


def test_the_progress_line_says_what_a_training_waits_for_until_it_moves(
    tmp_path: Path, monkeypatch, capsys
) -> None:  # noqa: ANN001
    from raycl.progress import follow

    monkeypatch.setenv("RAYCL_PROGRESS", "lines")
    monkeypatch.setenv("RAYCL_PROGRESS_MIN_S", "0.2")
    monkeypatch.setenv("RAYCL_PROGRESS_MAX_S", "0.5")
    scaling = load_space("idiom", preset="paper").config.scaling
    with follow(tmp_path, desc="train", waiting=resources.waiting_line(scaling), poll=0.05):
        time.sleep(1.3)
        (tmp_path / "progress.json").write_text(json.dumps({"step": 3, "total": 10}))
        time.sleep(1.0)
    lines = capsys.readouterr().err.splitlines()
    said = "waiting for 1 Ray Train worker × {CPU 1, GPU 1} to start (the run ends after 600 s)"
    waiting = [line for line in lines if said in line]
    assert waiting and all("step 0" in line for line in waiting), lines
    assert "step 3/10" in lines[-1] and "waiting" not in lines[-1], lines


# ---------------------------------------------------------------------------------------------- on Ray
def test_a_worker_group_that_cannot_start_ends_the_run_after_its_bound(
    ray_local, tmp_path: Path, monkeypatch
) -> None:  # noqa: ANN001
    """A worker asking a resource the cluster lacks (taken, or an autoscaler that does not deliver): Ray Train
    retries its start for ever by default; here 2 attempts of 1 s, then one line (about 10 s)."""
    from raycl.distributed.training import fit

    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "1")
    sets = ["scaling.resources={absent: 1}", "scaling.start_timeout_s=2"]
    scaling = load_space("idiom", preset="smoke", overrides=sets).config.scaling
    t0 = time.monotonic()
    with pytest.raises(UserError) as err:
        fit(lambda: None, scaling=scaling, name="never", storage_path=tmp_path)
    assert time.monotonic() - t0 < 60
    msg = str(err.value)
    assert (
        msg.startswith(
            "the Ray Train worker group did not start within scaling.start_timeout_s=2 s: 1 Ray "
            "Train worker × {CPU 1, absent 1}"
        )
        and "\n" not in msg
    )


ONE_GPU_CLUSTER = """
import json, sys
import ray
from ray.util.placement_group import placement_group, remove_placement_group
from raycl.config.tasks import load_space
from raycl.distributed import resources
from raycl.distributed.miner_pool import MinerFactory, MinerPool
from raycl.distributed.runtime import init_ray
from raycl.testing.miners import ECHO
from raycl.errors import UserError
from raycl.recipes import recipe_for

ray.init(address="local", num_cpus=4, num_gpus=1, include_dashboard=False,
         runtime_env={"env_vars": {"PYTHONPATH": sys.argv[1]}})
out = {"cluster": str(resources.cluster())}


def space(*sets):
    return load_space("coherence", preset="smoke", overrides=["scaling.use_gpu=true", *sets])


def checked(s):
    try:
        resources.check_run(s, sweep=False, recipe=recipe_for("coherence"))
        return "fits"
    except UserError as err:
        return str(err)


def start(s, timeout):
    # the run's own bundles on Ray: its miner (raycl's pool, echo miners) and its Train worker group's bundle
    cfg = s.config
    pool = MinerPool.from_config(MinerFactory(ECHO), cfg.mining)
    pool.ready(timeout=60)
    pg = placement_group([resources.worker_bundle(cfg.scaling)])
    ready = pg.wait(timeout_seconds=timeout)
    share = ray.get(ray.remote(num_cpus=0)(lambda: resources.gpu_share()).options(
        scheduling_strategy=ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(pg, 0),
        num_gpus=cfg.scaling.gpus_per_worker, num_cpus=0).remote(), timeout=60) if ready else None
    remove_placement_group(pg)
    pool.shutdown()
    gpus = cfg.mining.gpus_per_miner  # a process (a miner's) given that share of the GPU outside a placement group
    share_of = ray.remote(num_cpus=0, num_gpus=gpus)(lambda: resources.gpu_share())
    miner_share = ray.get(share_of.remote(), timeout=60)
    return {"scheduled": ready, "worker_share": share, "miner_share": miner_share}


whole = space("mining.gpus_per_miner=0.5")
out["whole_checked"] = checked(whole)
halves = space("scaling.gpus_per_worker=0.5", "mining.gpus_per_miner=0.5")
out["halves_checked"] = checked(halves)
out["halves"] = start(halves, timeout=30)
out["whole_forced"] = start(whole, timeout=3)["scheduled"]  # what Ray itself does with the refused request

# an autoscaler's configuration, as it stores it in the GCS: up to 3 nodes of {CPU 8, GPU 1} may come
from ray.core.generated import autoscaler_pb2
from ray.experimental.internal_kv import _internal_kv_put

config = autoscaler_pb2.ClusterConfig()
group = config.node_group_configs.add(name="gpu", max_count=3)
group.resources.update({"CPU": 8, "GPU": 1})
_internal_kv_put(ray._raylet.GCS_AUTOSCALER_CLUSTER_CONFIG_KEY.encode(), config.SerializeToString(),
                 namespace=ray._raylet.GCS_AUTOSCALER_STATE_NAMESPACE.encode())
out["autoscaling"] = str(resources.cluster())
out["whole_checked_autoscaling"] = checked(whole)
print(json.dumps(out))
"""


def test_on_a_one_gpu_cluster_1_plus_half_is_refused_and_half_plus_half_scheduled(tmp_path: Path) -> None:
    """A Ray of its own with one (logical) GPU: the coherence run asking a whole GPU for its trainer and half a
    GPU for its miner is refused in one line, and Ray indeed never places it; with 0.5 + 0.5 both are placed and
    each process knows its share (the memory cap's fraction). About 15 s."""
    env = {**os.environ, "RAY_ADDRESS": "", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", ONE_GPU_CLUSTER, str(ROOT)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["cluster"] == "the cluster has {CPU 4, GPU 1} in all, on 1 node ({CPU 4, GPU 1})"
    assert got["whole_checked"].startswith("the run asks {GPU 1.5} at once"), got
    assert all(k in got["whole_checked"] for k in ("scaling.gpus_per_worker=1", "mining.gpus_per_miner=0.5"))
    assert got["whole_forced"] is False
    assert got["halves_checked"] == "fits"
    assert got["halves"] == {"scheduled": True, "worker_share": 0.5, "miner_share": 0.5}
    # where an autoscaler may add GPU nodes, its maximum counts: 1 + 0.5 GPUs can come
    assert got["autoscaling"] == (
        "the cluster has {CPU 24, GPU 3} at most (its autoscaler's maximum, the GCS's "
        "cluster config), its node types and nodes: {CPU 4, GPU 1}; {CPU 8, GPU 1}"
    )
    assert got["whole_checked_autoscaling"] == "fits"


HALF_A_GPU = """
import json, os, sys
import ray, torch
from raycl.distributed.resources import cap_gpu_memory

path = os.pathsep.join(filter(None, [sys.argv[1], os.environ.get("PYTHONPATH")]))  # Ray itself may be on it
ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False,
         runtime_env={"env_vars": {"PYTHONPATH": path}})


@ray.remote(num_cpus=0, num_gpus=0.5)
def half():
    device = torch.device("cuda", 0)
    share = cap_gpu_memory(device)
    total = torch.cuda.get_device_properties(device).total_memory
    small = torch.empty(int(0.3 * total), dtype=torch.uint8, device=device)  # within its half
    del small
    try:
        torch.empty(int(0.6 * total), dtype=torch.uint8, device=device)  # more than its half
        over = "allocated"
    except torch.cuda.OutOfMemoryError:
        over = "refused"
    return {"share": share, "over_half": over}


print(json.dumps(ray.get(half.remote())))
"""


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_gpu_a_process_on_half_a_gpu_cannot_take_more_than_half_its_memory() -> None:
    pytest.importorskip("ray")
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # Ray may live on it
    env = {**os.environ, "RAY_ADDRESS": "", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", HALF_A_GPU, str(ROOT)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"share": 0.5, "over_half": "refused"}


def test_a_share_is_capped_on_the_device_index_even_where_the_device_names_none(monkeypatch) -> None:
    """A miner's options name its device "cuda" (no index); torch's memory fraction takes only an indexed device
    or an integer (seen on an H100: ``ValueError: Expected a torch.device with a specified index``). Torch's CUDA
    calls stand in here (no GPU in CI); the index must be the current device's."""
    import torch

    from raycl.distributed import resources

    calls: list[tuple[float, object]] = []
    monkeypatch.setattr(resources, "gpu_share", lambda: 0.5)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: calls.append((f, d)))
    assert resources.cap_gpu_memory(torch.device("cuda")) == 0.5
    assert resources.cap_gpu_memory(torch.device("cuda", 1)) == 0.5
    assert resources.cap_gpu_memory(torch.device("cpu")) is None
    assert calls == [(0.5, 3), (0.5, 1)]
