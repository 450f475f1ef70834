"""What an autoscaling cluster may start: its node types and their maximum counts, read where a cluster has them.

A ``ray up`` cluster's autoscaler runs on the head (``monitor.py --autoscaling-config=…``, the file
``~/ray_bootstrap_config.yaml``) and publishes nothing of its node types in Ray 2.60 (``get_cluster_config()`` is
None), so a check against the alive nodes alone refuses every GPU request on a cluster whose GPU node types
start at 0 nodes. Here, in order:
an explicit ``--cluster-config FILE`` (a ``ray up`` YAML, or a KubeRay RayCluster/RayJob manifest), the GCS's copy
(what Ray's autoscaler v2 publishes), the config file that this cluster's autoscaler process on this machine was
started with, then ``~/ray_bootstrap_config.yaml``. An autoscaler process found here without a config is a fixed
cluster: the alive nodes are all it has. Found nowhere: unknown (:data:`UNKNOWN`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raycl.errors import UserError, at

Bundle = dict[str, float]
BOOTSTRAP = "~/ray_bootstrap_config.yaml"  # where `ray up` puts the autoscaler's config on the head


@dataclass(frozen=True)
class NodeType:
    name: str
    resources: Bundle
    max_count: int  # the most nodes of this type (the head: 1)


@dataclass(frozen=True)
class NodeTypes:
    """An autoscaler's node types, and where they were read."""

    types: list[NodeType]
    source: str
    max_workers: int | None = None  # the cluster's upper bound on worker nodes, over all types

    def most(self) -> Bundle:
        """Every resource at its most: each type at its maximum count (workers capped by ``max_workers``)."""
        out: Bundle = {}
        for t in self.types:
            count = t.max_count if self.max_workers is None else min(t.max_count, max(self.max_workers, 1))
            for k, v in t.resources.items():
                out[k] = out.get(k, 0.0) + v * count
        return out

    def holding(self, bundle: Bundle) -> list[str]:
        """The names of the node types one node of which holds ``bundle``."""
        return [
            t.name
            for t in self.types
            if t.max_count > 0 and all(v <= t.resources.get(k, 0.0) + 1e-9 for k, v in bundle.items() if v > 0)
        ]


FIXED = "fixed"  # an autoscaler without a config: the alive nodes are the cluster
UNKNOWN = "unknown"  # no config found: an autoscaler may start nodes raycl cannot see


def from_yaml(config: dict[str, Any], source: str) -> NodeTypes:
    """Node types of a ``ray up`` config (``available_node_types``, ``head_node_type``, ``max_workers``) or of a
    KubeRay RayCluster/RayJob manifest (through Ray's own translation of it); a malformed one is a UserError."""
    if config.get("kind") in ("RayCluster", "RayJob", "RayService"):
        config = _from_kuberay(config, source)
    types = config.get("available_node_types") if isinstance(config, dict) else None
    if not isinstance(types, dict) or not types:
        raise UserError(
            f"{at(source)}: available_node_types: expected a mapping of node types (a `ray up` "
            "cluster config or a KubeRay RayCluster/RayJob manifest)"
        )
    head = config.get("head_node_type")
    found = []
    for name, node in types.items():
        res = node.get("resources") if isinstance(node, dict) else None
        if not isinstance(res, dict):
            raise UserError(f"{at(source)}: available_node_types.{name}.resources: expected a mapping")
        try:
            bundle = {str(k): float(v) for k, v in res.items()}
            count = 1 if name == head else int(node.get("max_workers", config.get("max_workers", 0)))
        except (TypeError, ValueError):
            raise UserError(
                f"{at(source)}: available_node_types.{name}: resources and max_workers must be numbers"
            ) from None
        found.append(NodeType(str(name), bundle, count))
    top = config.get("max_workers")
    return NodeTypes(found, source, int(top) if isinstance(top, int) else None)


def _from_kuberay(manifest: dict[str, Any], source: str) -> dict[str, Any]:
    from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr

    spec = manifest.get("spec") or {}
    cluster = spec.get("rayClusterSpec", spec) if manifest.get("kind") == "RayJob" else spec
    if manifest.get("kind") == "RayService":
        cluster = spec.get("rayClusterConfig", {})
    try:
        cr = {"spec": cluster, "metadata": {"namespace": "default", **(manifest.get("metadata") or {})}}
        return dict(_derive_autoscaling_config_from_ray_cr(cr))
    except Exception as err:  # Ray's translation names what it missed
        raise UserError(f"{at(source)}: not a RayCluster spec Ray can read: {err}") from None


def read(path: str | Path) -> NodeTypes:
    import yaml

    p = Path(path).expanduser()
    try:
        config = yaml.safe_load(p.read_text())
    except OSError as err:
        raise UserError(f"{at(path)}: cannot read the cluster config: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        raise UserError(f"{at(path)}: not YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(config, dict):
        raise UserError(f"{at(path)}: expected a cluster config (a mapping)")
    return from_yaml(config, str(path))


def monitor_config(gcs_address: str, proc: Path = Path("/proc")) -> str | None:
    """The ``--autoscaling-config`` of this cluster's autoscaler process (``monitor.py --gcs-address=…``) when it
    runs on this machine: its path, ``""`` when it runs without one, None when it is not found here."""
    port = gcs_address.rsplit(":", 1)[-1]
    for cmdline in proc.glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not any(a.rsplit("/", 1)[-1] == "monitor.py" for a in args):  # not log_monitor.py: same --gcs-address
            continue
        gcs = next((a.split("=", 1)[1] for a in args if a.startswith("--gcs-address=")), "")
        if gcs.rsplit(":", 1)[-1] != port:
            continue
        return next((a.split("=", 1)[1] for a in args if a.startswith("--autoscaling-config=")), "")
    return None


def _from_gcs() -> NodeTypes | None:
    from ray._private.state import state as ray_state

    config = ray_state.get_cluster_config()
    if config is None or not config.node_group_configs:
        return None
    return NodeTypes(
        [
            NodeType(
                g.name,
                {k: float(v) for k, v in g.resources.items()},
                int(g.max_count) if g.max_count >= 0 else 10**6,
            )
            for g in config.node_group_configs
        ],
        "the GCS's cluster config",
    )


def before_connecting(address: str, explicit: str | None = None) -> NodeTypes | None:
    """The node types of the cluster at ``address`` that can be read before joining it (``--cluster-config``, or
    the config its autoscaler process on this machine was started with), so that a shape no node type holds is
    refused before Ray connects; None where they cannot (they are looked for again once connected)."""
    if explicit:
        return read(explicit)
    from ray._private.services import canonicalize_bootstrap_address_or_die

    try:
        gcs = canonicalize_bootstrap_address_or_die(address)
    except (ConnectionError, ValueError):
        return None  # said by the connection itself
    found = monitor_config(gcs)
    return read(found) if found else None


def node_types(explicit: str | None = None) -> NodeTypes | str:
    """The connected cluster's node types (:class:`NodeTypes`), :data:`FIXED` or :data:`UNKNOWN` (module doc)."""
    import ray

    if explicit:
        return read(explicit)
    gcs = _from_gcs()
    if gcs is not None:
        return gcs
    found = monitor_config(ray.get_runtime_context().gcs_address)
    if found:
        return read(found)
    if found == "":
        return FIXED
    if Path(BOOTSTRAP).expanduser().is_file():
        return read(BOOTSTRAP)
    return UNKNOWN
