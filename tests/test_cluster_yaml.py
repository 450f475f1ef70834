"""`cluster.yaml` (issue 3 item 6): Ray's own validator accepts it, and the README's job fits on its nodes."""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from raycl import cli
from raycl.config import load_space, validate

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "rayproject/ray:2.60.0-py311-gpu"
NATIVE = {"CPU", "GPU", "memory", "object_store_memory"}


def _raw() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    cfg = prepare_config(_raw())  # merges the AWS provider defaults, fills per-type min/max workers
    validate_config(cfg)  # jsonschema + Ray's semantic checks; raises on any problem
    return cfg


def _readme_job() -> list[str]:
    """The argv of ``python -m raycl.tune ...`` in the README's ``ray job submit`` example."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Cluster\n", 1)[1].split("\n## ", 1)[0]
    block = next(b for b in re.findall(r"```bash\n(.*?)```", section, re.S) if "ray job submit" in b)
    lines = [line.split("  #")[0] for line in block.replace("\\\n", " ").splitlines()]
    argv = shlex.split(next(line for line in lines if "ray job submit" in line))
    assert argv[argv.index("--") + 1 : argv.index("--") + 4] == ["python", "-m", "raycl.tune"]
    assert "--working-dir" in argv and "--address" in argv
    return argv[argv.index("--") + 4 :]


def _shapes(cfg: Any) -> dict[str, dict[str, float]]:
    """The resource bundles one trial asks for, from its config (zero amounts left out, as Ray does)."""
    m, s = cfg.mining, cfg.scaling
    shapes = {
        "driver": {"CPU": cfg.tune.driver_cpus},
        "miner": {"CPU": m.cpus_per_miner, "GPU": m.gpus_per_miner},
        "trainer": {"CPU": s.cpus_per_worker, "GPU": 1.0 if s.use_gpu else 0.0},
    }
    return {name: {k: v for k, v in shape.items() if v > 0} for name, shape in shapes.items()}


def _fits(shape: dict[str, float], resources: dict[str, float]) -> bool:
    return all(resources.get(k, 0) >= v for k, v in shape.items())


def _capacity(cluster: dict[str, Any]) -> dict[str, float]:
    """All resources of the cluster scaled out: the head plus every worker type at max_workers."""
    total: dict[str, float] = {}
    for name, node in cluster["available_node_types"].items():
        count = 1 if name == cluster["head_node_type"] else node["max_workers"]
        for k, v in node["resources"].items():
            total[k] = total.get(k, 0) + count * v
    return total


def test_ray_validates_the_cluster_and_rejects_a_broken_copy(cluster: dict[str, Any]) -> None:
    assert cluster["provider"]["type"] == "aws"
    types = cluster["available_node_types"]
    head = types[cluster["head_node_type"]]
    assert head["node_config"]["InstanceType"] == "m6i.2xlarge" and head["resources"].get("GPU", 0) == 0
    miners = [t for t in types.values() if t["resources"].get("miner")]
    assert miners and all(t["node_config"].get("InstanceMarketOptions", {}).get("MarketType") == "spot"
                          and t["min_workers"] == 0 and t["resources"]["GPU"] >= 1 for t in miners)  # fmt: skip
    trainers = [t for t in types.values() if t["resources"].get("trainer")]
    assert trainers and all("InstanceMarketOptions" not in t["node_config"] for t in trainers)  # on-demand
    broken = copy.deepcopy(_raw())
    broken["available_node_types"]["miner_g5"]["min_worker"] = 1  # the typo RAY_NOTES §3 saw it catch
    with pytest.raises(Exception, match="min_worker"):
        validate_config(prepare_config(broken))
    too_many = copy.deepcopy(_raw())
    too_many["available_node_types"]["miner_g5"]["min_workers"] = too_many["max_workers"] + 1
    with pytest.raises(ValueError):
        validate_config(prepare_config(too_many))


def test_image_matches_the_ray_pin_and_raycl_is_installed_from_the_repo(cluster: dict[str, Any]) -> None:
    assert cluster["docker"]["image"] == IMAGE
    for key in ("head_image", "worker_image"):
        assert cluster["docker"].get(key, IMAGE) == IMAGE
    ray_pin = re.search(r'"ray\[[^\]]*\]==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert ray_pin is not None and ray_pin[1] == ray.__version__ and f":{ray.__version__}-py311-" in IMAGE
    assert cluster["file_mounts"] == {"~/raycl": "."}
    assert any("pip install" in c and "-e ~/raycl" in c for c in cluster["setup_commands"])
    assert any("/mnt/raycl" in opt for opt in cluster["docker"]["run_options"])  # the shared run folder


def test_every_resource_the_readme_job_asks_for_exists_on_some_node_type(cluster: dict[str, Any]) -> None:
    args = cli.space_parser("python -m raycl.tune", "").parse_args(_readme_job())
    assert args.address == "auto" and str(args.out).startswith("/mnt/raycl/")  # on the shared file system
    cfg = load_space(args.space, preset=args.preset, overrides=args.overrides).config
    validate(cfg, where="README")
    types = cluster["available_node_types"]
    shapes = _shapes(cfg)
    for name, shape in shapes.items():
        custom = set(shape) - NATIVE
        assert all(any(k in t["resources"] for t in types.values()) for k in custom), (name, custom)
        assert any(_fits(shape, t["resources"]) for t in types.values()), (name, shape)
    assert _fits(shapes["driver"], types[cluster["head_node_type"]]["resources"])  # drivers on the head
    assert not _fits(shapes["miner"], types[cluster["head_node_type"]]["resources"])  # miners never there
    per_trial = {k: shapes["driver"].get(k, 0) + cfg.mining.num_miners * shapes["miner"].get(k, 0)
                 + cfg.scaling.num_workers * shapes["trainer"].get(k, 0) for k in ("CPU", "GPU")}  # fmt: skip
    trials = cfg.tune.max_concurrent_trials
    assert _fits({k: trials * v for k, v in per_trial.items()}, _capacity(cluster)), (trials, per_trial)


def test_the_fit_check_can_fail(cluster: dict[str, Any]) -> None:
    types = cluster["available_node_types"].values()
    assert not any(_fits({"GPU": 2.0, "miner": 1.0}, t["resources"]) for t in types)
    assert not any(_fits({"CPU": 1.0, "raycl_driver": 1.0}, t["resources"]) for t in types)
