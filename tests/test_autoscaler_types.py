"""An autoscaling cluster's node types (issue 38): read from cluster.yaml, cluster-s3.yaml and the KubeRay manifest
as the autoscaler has them; a shape some node type holds is accepted (the autoscaler starts it), one no node type
holds is refused at once in one line; where the node types are unknown, the run waits and says so. No Ray."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from raycl.distributed import autoscaler
from raycl.distributed.resources import Ask, Cluster, Plan, check, unknown_line
from raycl.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
HEAD = {"CPU": 8.0}  # what a `ray up` cluster has alive before any worker node starts


def _as_started(types: autoscaler.NodeTypes) -> Cluster:
    """What ``resources.cluster()`` builds on a fresh ``ray up`` cluster (only the head alive) from its types."""
    most = types.most()
    return Cluster(
        {k: max(HEAD.get(k, 0.0), v) for k, v in {**HEAD, **most}.items()},
        [HEAD, *(t.resources for t in types.types if t.max_count > 0)],
        autoscaling=True,
        types=types,
    )


def _train(bundle: dict[str, float], count: int = 1) -> Plan:
    return Plan(per_trial=[], workers=Ask("Ray Train worker", count, bundle, "scaling.use_gpu=true"), shared=[])


@pytest.mark.parametrize("name", ["cluster.yaml", "cluster-s3.yaml", "k8s/rayjob.yaml"])
def test_node_types_and_their_maxima_are_read_from_the_cluster_files(name: str) -> None:
    types = autoscaler.read(ROOT / name)
    by_kind = {
        ("miner" if "miner" in t.resources else "trainer" if "trainer" in t.resources else "head"): t
        for t in types.types
    }
    assert by_kind["miner"].resources["GPU"] == 1 and by_kind["miner"].max_count == 4
    assert by_kind["trainer"].resources["GPU"] == 4 and by_kind["trainer"].max_count == 2
    assert by_kind["head"].resources.get("raycl_head") == 1 and by_kind["head"].max_count == 1
    assert types.most()["GPU"] == 4 * 1 + 2 * 4


def test_a_gpu_shape_some_node_type_holds_is_accepted_one_none_holds_is_refused_at_once() -> None:
    have = _as_started(autoscaler.read(ROOT / "cluster.yaml"))
    assert check(_train({"CPU": 1, "GPU": 1}), have) == 1  # the autoscaler starts a GPU node for it
    assert check(_train({"CPU": 1, "trainer": 1}), have) == 1
    assert set(have.types.holding({"CPU": 1, "GPU": 1})) == {"miner_g5", "trainer_g5"}
    with pytest.raises(
        UserError, match=r"one Ray Train worker asks \{CPU 1, GPU 8\} .* more than any node has"
    ) as err:
        check(_train({"CPU": 1, "GPU": 8}), have)
    assert "\n" not in str(err.value) and "cluster.yaml" in str(err.value)
    with pytest.raises(UserError, match="the run asks"):  # each fits a node, not all at once: 9 × 4 GPUs > 12
        check(_train({"CPU": 1, "GPU": 4}, count=9), have)
    alive_only = Cluster(dict(HEAD), [HEAD])  # what the check saw before: a fresh cluster's head
    with pytest.raises(UserError, match="more than any node has"):
        check(_train({"CPU": 1, "GPU": 1}), alive_only)


def test_unknown_node_types_wait_for_the_autoscaler_with_a_stated_bound() -> None:
    have = Cluster(dict(HEAD), [HEAD], unknown=True)
    cfg = SimpleNamespace(scaling=SimpleNamespace(start_timeout_s=600.0))
    plan = _train({"CPU": 1, "GPU": 1})
    assert check(plan, have) == 1  # not refused
    line = unknown_line(plan, have, cfg)
    assert line is not None and "\n" not in line
    assert "node types are not known here" in line and "--cluster-config" in line
    assert "waits for the autoscaler" in line and "scaling.start_timeout_s=600 s" in line
    assert unknown_line(_train({"CPU": 1}), have, cfg) is None  # the alive nodes hold it: nothing to say


def test_the_autoscaler_config_is_found_from_its_process_on_this_machine(tmp_path: Path) -> None:
    def monitor(pid: int, *args: str, script: str = "/x/monitor.py") -> None:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes("\0".join(["python", "-u", script, *args]).encode())

    # every Ray node's log monitor names the GCS too, and no autoscaling config: it is not the autoscaler (when its
    # pid was listed first, a `ray up` head read as a fixed cluster and a GPU run on GPU types at 0 was refused)
    for pid in range(2, 10):
        monitor(pid, "--gcs-address=10.0.0.1:6379", script="/x/ray/_private/log_monitor.py")
    monitor(10, "--gcs-address=10.0.0.1:6379", "--autoscaling-config=/home/ray/ray_bootstrap_config.yaml")
    monitor(12, "--gcs-address=10.0.0.1:7002", script="/x/ray/_private/log_monitor.py")
    assert autoscaler.monitor_config("10.0.0.1:7002", tmp_path) is None  # a log monitor alone: no autoscaler here
    monitor(11, "--gcs-address=10.0.0.1:7000")  # another cluster's, without a config
    assert autoscaler.monitor_config("127.0.0.1:6379", tmp_path) == "/home/ray/ray_bootstrap_config.yaml"
    assert autoscaler.monitor_config("10.0.0.1:7000", tmp_path) == ""  # a fixed cluster
    assert autoscaler.monitor_config("10.0.0.1:7001", tmp_path) is None  # not on this machine


def test_a_malformed_cluster_config_is_one_line_naming_the_file_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("available_node_types:\n  gpu: {resources: {GPU: many}, max_workers: 1}\n")
    with pytest.raises(UserError, match=r"c\.yaml: available_node_types\.gpu: resources and max_workers"):
        autoscaler.read(bad)
    bad.write_text("cluster_name: x\n")
    with pytest.raises(UserError, match="available_node_types: expected a mapping"):
        autoscaler.read(bad)
    with pytest.raises(UserError, match="cannot read the cluster config"):
        autoscaler.read(tmp_path / "missing.yaml")
