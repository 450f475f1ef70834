"""A GPU that a node's torch cannot use (issue 38): Ray counts logical GPUs on any machine, so a Ray of its own
with one logical GPU and this CPU-only torch is such a node. A Ray Train worker given the GPU ends the run in one
line naming the node, the setting and the fix (not NCCL's ``Distributed package doesn't have NCCL built in``); a
miner given a share of it mines on the CPU, with a warning naming the same. About 30 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

NO_CUDA_NODE = """
import json, sys, tempfile
import ray
from raycl.config.tasks import load_space
from raycl.distributed.miner_pool import MinerFactory
from raycl.distributed.training import fit
from raycl.errors import UserError

ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False,
         runtime_env={"env_vars": {"PYTHONPATH": sys.argv[1]}})
out = {}


@ray.remote(num_cpus=0, num_gpus=0.5)
def miner_device():
    from raycl.testing.miners import ECHO

    return MinerFactory(ECHO).build() is not None and "built"


out["miner"] = ray.get(miner_device.remote(), timeout=120)
scaling = load_space("idiom", preset="smoke", overrides=["scaling.use_gpu=true"]).config.scaling
try:
    fit(lambda: None, scaling=scaling, name="gpu", storage_path=tempfile.mkdtemp())
    out["train"] = "ran"
except UserError as err:
    out["train"] = str(err)
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")
def test_a_gpu_on_a_node_without_cuda_ends_a_training_in_one_line_and_a_miner_warns() -> None:
    env = {**os.environ, "RAY_ADDRESS": "", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", NO_CUDA_NODE, str(ROOT)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    line = got["train"]
    assert line.startswith("a Ray Train worker was given a GPU (scaling.use_gpu=true) on node "), got
    assert "\n" not in line and "has no CUDA" in line and "run without the GPU" in line
    assert "NCCL built in" not in line
    assert got["miner"] == "built"
    warned = [x for x in done.stderr.splitlines() if "raycl: warning: a miner was given a GPU" in x]
    assert warned and "(mining.gpus_per_miner)" in warned[0] and "it mines on the CPU" in warned[0], done.stderr[
        -3000:
    ]
