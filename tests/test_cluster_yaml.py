"""`cluster.yaml` (issue 3 item 6): Ray's own validator accepts it, and the job docs/cluster.md documents fits on
its nodes; every `ray start` requires Ray's auth token and keeps the dashboard on localhost, the shared folder is
the cluster user's (issue 22 item 1)."""

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
from raycl.config import validate
from raycl.config.tasks import load_space

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "rayproject/ray:2.60.0-py311-gpu"
NATIVE = {"CPU", "GPU", "memory", "object_store_memory"}


def _raw(name: str = "cluster.yaml") -> dict[str, Any]:
    return yaml.safe_load((ROOT / name).read_text())


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    cfg = prepare_config(_raw())  # merges the AWS provider defaults, fills per-type min/max workers
    validate_config(cfg)  # jsonschema + Ray's semantic checks; raises on any problem
    return cfg


def _documented_job(cluster_file: str = "cluster.yaml") -> list[str]:
    """The argv of ``python -m raycl.tune ...`` in docs/cluster.md's ``ray job submit`` example on ``cluster_file``
    (the page's "Cluster" section and its subsections)."""
    text = (ROOT / "docs" / "cluster.md").read_text()
    section = text.split("\n## Cluster\n", 1)[1].split("\n## ", 1)[0]
    block = next(
        b
        for b in re.findall(r"```bash\n(.*?)```", section, re.S)
        if "ray job submit" in b and f"ray up {cluster_file}" in b
    )
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
    assert miners and all(
        t["node_config"].get("InstanceMarketOptions", {}).get("MarketType") == "spot"
        and t["min_workers"] == 0
        and t["resources"]["GPU"] >= 1
        for t in miners
    )
    trainers = [t for t in types.values() if t["resources"].get("trainer")]
    assert trainers and all("InstanceMarketOptions" not in t["node_config"] for t in trainers)  # on-demand
    broken = copy.deepcopy(_raw())
    broken["available_node_types"]["miner_g5"]["min_worker"] = 1  # a misspelt key the offline check must catch
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
    assert cluster["file_mounts"]["~/raycl"] == "."
    assert any("pip install" in c and "-e ~/raycl" in c for c in cluster["setup_commands"])
    assert any("/mnt/raycl" in opt for opt in cluster["docker"]["run_options"])  # the shared run folder


def check_job_fits(args: Any, cluster: dict[str, Any]) -> None:
    """Every resource the job (parsed ``raycl.tune`` arguments) asks for exists on some node type of ``cluster``
    (an autoscaler config: ``ray up``'s, or the one Ray derives from a KubeRay spec), and its concurrent trials
    fit on the cluster scaled out."""
    assert args.address == "auto"
    cfg = load_space(args.space, preset=args.preset, overrides=args.overrides).config
    validate(cfg, where="docs/cluster.md")
    types = cluster["available_node_types"]
    shapes = _shapes(cfg)
    for name, shape in shapes.items():
        custom = set(shape) - NATIVE
        assert all(any(k in t["resources"] for t in types.values()) for k in custom), (name, custom)
        assert any(_fits(shape, t["resources"]) for t in types.values()), (name, shape)
    assert _fits(shapes["driver"], types[cluster["head_node_type"]]["resources"])  # drivers on the head
    assert not _fits(shapes["miner"], types[cluster["head_node_type"]]["resources"])  # miners never there
    per_trial = {
        k: shapes["driver"].get(k, 0)
        + cfg.mining.num_miners * shapes["miner"].get(k, 0)
        + cfg.scaling.num_workers * shapes["trainer"].get(k, 0)
        for k in ("CPU", "GPU")
    }
    trials = cfg.tune.max_concurrent_trials
    assert _fits({k: trials * v for k, v in per_trial.items()}, _capacity(cluster)), (trials, per_trial)


def test_every_resource_the_documented_job_asks_for_exists_on_some_node_type(cluster: dict[str, Any]) -> None:
    args = cli.space_parser("python -m raycl.tune", "").parse_args(_documented_job())
    assert str(args.out).startswith("/mnt/raycl/")  # on the shared file system
    check_job_fits(args, cluster)


def test_the_fit_check_can_fail(cluster: dict[str, Any]) -> None:
    types = cluster["available_node_types"].values()
    assert not any(_fits({"GPU": 2.0, "miner": 1.0}, t["resources"]) for t in types)
    assert not any(_fits({"CPU": 1.0, "raycl_driver": 1.0}, t["resources"]) for t in types)


TOKEN_PATH = "~/.ray/auth_token"  # Ray's default token file; `ray get-auth-token --generate` writes it
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _simple_commands(command: str) -> list[tuple[dict[str, str], list[str]]]:
    """The simple commands of one shell command line (split at ``;``, ``&&``, ``||``), each with the environment
    it runs with: what ``export`` set earlier on the line and its own ``VAR=value`` prefixes; ``sudo`` dropped."""
    env: dict[str, str] = {}
    found = []
    for part in re.split(r"\s*(?:;|&&|\|\|)\s*", command):
        words = shlex.split(part.strip().lstrip("(").rstrip(")"))
        if words[:1] == ["export"]:
            env.update(w.split("=", 1) for w in words[1:] if "=" in w)  # type: ignore[misc]
            continue
        prefix = {}
        while words and re.match(r"[A-Za-z_]\w*=", words[0]):
            key, value = words.pop(0).split("=", 1)
            prefix[key] = value
        found.append(({**env, **prefix}, words[1:] if words[:1] == ["sudo"] else words))
    return found


def _flag(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _auth_problems(cluster: dict[str, Any]) -> list[str]:
    """Every ``ray start`` must run with ``RAY_AUTH_MODE=token`` and a token that ``file_mounts`` brings to the
    node (never one written into the file), and must not bind the dashboard beyond localhost."""
    problems = []
    commands = cluster["head_start_ray_commands"] + cluster["worker_start_ray_commands"]
    starts = [(env, w[2:]) for c in commands for env, w in _simple_commands(c) if w[:2] == ["ray", "start"]]
    if len(starts) < 2:
        problems.append("a head and a worker `ray start` expected")
    for env, args in starts:
        where = "ray start " + " ".join(args)
        if env.get("RAY_AUTH_MODE") != "token":
            problems.append(f"{where}: runs without RAY_AUTH_MODE=token")
        if "RAY_AUTH_TOKEN" in env:
            problems.append(f"{where}: a token written into cluster.yaml")
        token = env.get("RAY_AUTH_TOKEN_PATH", TOKEN_PATH)
        if token not in cluster["file_mounts"]:
            problems.append(f"{where}: its token {token} is not in file_mounts")
        host = _flag(args, "--dashboard-host")
        if host is not None and host not in LOOPBACK:
            problems.append(f"{where}: binds the dashboard to {host}")
    return problems


def _world_writable(mode: str) -> bool:
    if re.fullmatch(r"[0-7]{3,4}", mode):
        return bool(int(mode, 8) & 0o002)
    clauses = [re.fullmatch(r"([ugoa]*)[+=]([rwxXst]*)", c) for c in mode.split(",")]
    return any(m is not None and "w" in m[2] and (not m[1] or set(m[1]) & {"o", "a"}) for m in clauses)


def _shared_folder_problems(cluster: dict[str, Any]) -> list[str]:
    """The shared run folder must belong to the cluster's user, and nobody else may write it."""
    commands = [words for command in cluster["initialization_commands"] for _, words in _simple_commands(command)]
    problems = [" ".join(w) for w in commands if w[:1] == ["chmod"] and any(_world_writable(a) for a in w[1:])]
    if not any(w[:1] == ["chown"] and "/mnt/raycl" in w for w in commands):
        problems.append("/mnt/raycl is not given to the cluster's user")
    return problems


def test_every_ray_start_requires_the_token_and_keeps_the_dashboard_local(cluster: dict[str, Any]) -> None:
    assert _auth_problems(cluster) == []
    assert any("RAY_AUTH_MODE=token" in c and ".bashrc" in c for c in cluster["setup_commands"])  # head shell
    assert _shared_folder_problems(cluster) == []


def _edit_starts(cluster: dict[str, Any], key: str, edit: Any) -> None:
    cluster[key] = [edit(c) if "ray start" in c else c for c in cluster[key]]


NO_MODE = "export RAY_AUTH_MODE=token;"
HEAD, WORKER = "head_start_ray_commands", "worker_start_ray_commands"
OPEN = {  # a planted hole, and the problem it must raise
    "a worker without RAY_AUTH_MODE": (
        WORKER,
        lambda s: s.replace(NO_MODE, ""),
        "runs without RAY_AUTH_MODE=token",
    ),
    "auth mode set after ray start": (
        HEAD,
        lambda s: s.replace(NO_MODE, "") + "; " + NO_MODE,
        "runs without RAY_AUTH_MODE=token",
    ),
    "dashboard on every interface": (
        HEAD,
        lambda s: s + " --dashboard-host=0.0.0.0",
        "binds the dashboard to 0.0.0.0",
    ),
    "dashboard on every interface, as two words": (
        HEAD,
        lambda s: s + " --dashboard-host ::",
        "binds the dashboard to ::",
    ),
    "a token in the file": (
        HEAD,
        lambda s: s.replace("ray start", "RAY_AUTH_TOKEN=x ray start"),
        "a token written into cluster.yaml",
    ),
    "no token on the nodes": ("file_mounts", None, "is not in file_mounts"),
}


@pytest.mark.parametrize("hole", list(OPEN))
def test_a_ray_start_without_the_token_or_with_a_public_dashboard_fails(hole: str) -> None:
    key, edit, expected = OPEN[hole]
    broken = copy.deepcopy(_raw())
    if edit is None:
        broken[key].pop(TOKEN_PATH)
    else:
        _edit_starts(broken, key, edit)
    assert any(expected in p for p in _auth_problems(broken)), _auth_problems(broken)


@pytest.mark.parametrize("mode", ["1777", "777", "a+w", "o+rwx", "+w", "u+w,o+w"])
def test_a_world_writable_shared_folder_fails(mode: str) -> None:
    broken = copy.deepcopy(_raw())
    broken["initialization_commands"][0] += f" && sudo chmod {mode} /mnt/raycl"
    assert _shared_folder_problems(broken) == [f"chmod {mode} /mnt/raycl"]
    assert not _world_writable("0750") and not _world_writable("g+w")


def test_the_s3_cluster_has_the_same_shapes_and_its_runs_in_the_bucket() -> None:
    """``cluster-s3.yaml``: Ray's validator accepts it; cluster.yaml's node types, token and image; no EFS; every
    node reaches the bucket through an instance profile; the documented S3 job fits and writes to ``s3://``."""
    raw = _raw("cluster-s3.yaml")
    cfg = prepare_config(copy.deepcopy(raw))
    validate_config(cfg)
    efs = prepare_config(_raw())
    assert {k: t["resources"] for k, t in cfg["available_node_types"].items()} == {
        k: t["resources"] for k, t in efs["available_node_types"].items()
    }
    assert cfg["docker"]["image"] == IMAGE and _auth_problems(cfg) == []
    assert "/mnt/raycl" not in yaml.safe_dump(raw)  # nothing mounted: runs live in the bucket
    assert all("IamInstanceProfile" in t["node_config"] for t in raw["available_node_types"].values())
    args = cli.space_parser("python -m raycl.tune", "").parse_args(_documented_job("cluster-s3.yaml"))
    assert args.out.startswith("s3://YOUR_BUCKET/")
    check_job_fits(args, cfg)
    copied = re.search(r"copy_files\('(s3://[^']+)', '([^']+)'\)", " ".join(raw["setup_commands"]))
    assert copied is not None and copied[1].startswith("s3://YOUR_BUCKET/")
    inputs = [o.split("=", 1)[1] for o in args.overrides if "/" in o]
    # the job reads what setup copied, or (model.checkpoint, mining.negatives: fetched by raycl itself) the bucket
    assert inputs and all(copied[2] in v or v.startswith(copied[1] + "/") for v in inputs), inputs
    assert any(copied[2] in v for v in inputs)  # data.* files are local paths
