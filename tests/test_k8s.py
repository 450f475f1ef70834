"""`k8s/rayjob.yaml` (issue 20 §6, issue 22 §1): a KubeRay RayJob whose every field KubeRay v1 and Kubernetes know,
whose groups have `cluster.yaml`'s shapes and hold docs/cluster.md's job, with token authentication and no public
dashboard."""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import ray
import yaml
from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr
from test_cluster_yaml import IMAGE, _documented_job, _raw, check_job_fits

from raycl import cli

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "k8s" / "rayjob.yaml"

# KubeRay's v1 API, the part raycl uses: RayJobSpec, RayClusterSpec, HeadGroupSpec, WorkerGroupSpec and
# AuthOptions as ray-operator/apis/ray/v1/{rayjob,raycluster}_types.go and the CRD
# (config/crd/bases/ray.io_rayjobs.yaml) define them at v1.7.0 (authOptions.secretName since v1.6.0). An object
# is a dict of its fields (a trailing "!" marks the CRD's required ones), a frozenset an enum, STR_MAP a
# map[string]string, POD a corev1.PodTemplateSpec (checked against the kubernetes package's models). A field of
# KubeRay's that raycl does not use is not here, so it fails too: add it from the Go types when it is needed.
STR_MAP = "map[string]string"
POD = "V1PodTemplateSpec"
_POD_GROUP = {"rayStartParams": STR_MAP, "resources": STR_MAP, "labels": STR_MAP, "template!": POD}
SCHEMA: dict[str, Any] = {
    "apiVersion!": frozenset({"ray.io/v1"}),
    "kind!": frozenset({"RayJob"}),
    "metadata!": {"name!": str, "namespace": str, "labels": STR_MAP, "annotations": STR_MAP},
    "spec!": {
        "entrypoint!": str,
        "runtimeEnvYAML": str,
        "submissionMode": frozenset({"K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"}),
        "shutdownAfterJobFinishes": bool,
        "ttlSecondsAfterFinished": int,
        "activeDeadlineSeconds": int,
        "backoffLimit": int,
        "entrypointNumCpus": float,
        "entrypointNumGpus": float,
        "submitterPodTemplate": POD,
        "rayClusterSpec!": {
            "rayVersion!": str,  # required by KubeRay's validation once authOptions.mode is token
            "authOptions": {"mode": frozenset({"disabled", "token"}), "secretName": str},
            "enableInTreeAutoscaling": bool,
            "autoscalerOptions": {
                "idleTimeoutSeconds": int,
                "upscalingMode": frozenset({"Default", "Aggressive", "Conservative"}),
            },
            "headGroupSpec!": {
                **_POD_GROUP,
                "serviceType": frozenset({"ClusterIP", "NodePort", "LoadBalancer"}),
                "enableIngress": bool,
            },
            "workerGroupSpecs": [
                {
                    **_POD_GROUP,
                    "groupName!": str,
                    "replicas": int,
                    "minReplicas!": int,
                    "maxReplicas!": int,
                    "idleTimeoutSeconds": int,
                    "numOfHosts": int,
                }
            ],
        },
    },
}
_PRIMITIVES: dict[str, Any] = {
    "str": str,
    "int": int,
    "bool": bool,
    "float": (int, float),
    "object": object,
    "datetime": str,
    "bytes": str,
}


def _manifest() -> dict[str, Any]:
    return yaml.safe_load(MANIFEST.read_text())


def _type_problem(value: Any, expected: Any, where: str) -> list[str]:
    ok = isinstance(value, expected) and not (isinstance(value, bool) and expected is not bool)
    return [] if ok else [f"{where}: expected {getattr(expected, '__name__', expected)}, got {value!r}"]


def _check_k8s(value: Any, type_name: str, where: str) -> list[str]:
    """``value`` against a model of the kubernetes package, by its JSON names (``attribute_map``) and types
    (``openapi_types``), recursively: a key that is not a field of the model at that place is a problem."""
    if m := re.fullmatch(r"List\[(.+)\]", type_name):
        if not isinstance(value, list):
            return [f"{where}: expected a list"]
        return [p for i, item in enumerate(value) for p in _check_k8s(item, m[1], f"{where}[{i}]")]
    if m := re.fullmatch(r"Dict\[str, (.+)\]", type_name):
        if not isinstance(value, dict):
            return [f"{where}: expected a map"]
        return [p for k, item in value.items() for p in _check_k8s(item, m[1], f"{where}.{k}")]
    if type_name in _PRIMITIVES:
        return _type_problem(value, _PRIMITIVES[type_name], where)
    model = getattr(kubernetes.client, type_name)
    if not isinstance(value, dict):
        return [f"{where}: expected an object ({type_name})"]
    by_json = {json_key: attr for attr, json_key in model.attribute_map.items()}
    problems = []
    for key, item in value.items():
        if key not in by_json:
            problems.append(f"{where}.{key}: not a field of {type_name}")
        else:
            problems += _check_k8s(item, model.openapi_types[by_json[key]], f"{where}.{key}")
    return problems


def _check(value: Any, spec: Any, where: str) -> list[str]:
    """``value`` against :data:`SCHEMA` (or a part of it); the problems found, each naming its place."""
    if spec == POD:
        problems = _check_k8s(value, POD, where)
        if not problems:  # the package's own validation adds required fields (a container's name, …)
            try:
                kubernetes.client.V1PodTemplateSpec.model_validate(value)
            except ValueError as e:
                problems.append(f"{where}: {e}")
        return problems
    if spec == STR_MAP:
        if not isinstance(value, dict):
            return [f"{where}: expected a map of strings"]
        return [p for k, v in value.items() for p in _type_problem(v, str, f"{where}.{k}")]
    if isinstance(spec, frozenset):
        return [] if value in spec else [f"{where}: {value!r} is not one of {sorted(spec)}"]
    if isinstance(spec, list):
        if not isinstance(value, list):
            return [f"{where}: expected a list"]
        return [p for i, item in enumerate(value) for p in _check(item, spec[0], f"{where}[{i}]")]
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return [f"{where}: expected an object"]
        fields = {k.rstrip("!"): s for k, s in spec.items()}
        problems = [f"{where}.{k[:-1]}: required" for k in spec if k.endswith("!") and k[:-1] not in value]
        for key, item in value.items():
            if key not in fields:
                problems.append(f"{where}.{key}: not a field here (KubeRay v1 has {', '.join(fields)})")
            else:
                problems += _check(item, fields[key], f"{where}.{key}")
        return problems
    return _type_problem(value, spec, where)


def _pod_templates(job: dict[str, Any]) -> list[dict[str, Any]]:
    rc = job["spec"]["rayClusterSpec"]
    return [rc["headGroupSpec"]["template"]] + [g["template"] for g in rc.get("workerGroupSpecs", [])]


def _autoscaling_config(job: dict[str, Any]) -> dict[str, Any]:
    """The node types that Ray's own KubeRay autoscaler derives from the cluster spec (and validates)."""
    cr = {
        "metadata": {"name": job["metadata"]["name"], "namespace": "default"},
        "spec": job["spec"]["rayClusterSpec"],
    }
    return _derive_autoscaling_config_from_ray_cr(copy.deepcopy(cr))


def _auth_problems(job: dict[str, Any]) -> list[str]:
    """What leaves the cluster's control plane open: no KubeRay token authentication (or a container that
    overrides it), a token that is not the user's Secret, a dashboard Service reachable from outside."""
    rc = job["spec"]["rayClusterSpec"]
    auth = rc.get("authOptions") or {}
    problems = []
    if auth.get("mode", "token") != "token" or not auth:
        problems.append("rayClusterSpec.authOptions: token authentication is off")
    if not auth.get("secretName"):
        problems.append("rayClusterSpec.authOptions.secretName: the token must be the user's Secret")
    for template in _pod_templates(job):
        for c in template["spec"]["containers"]:
            names = {e["name"] for e in c.get("env", [])} & {
                "RAY_AUTH_MODE",
                "RAY_AUTH_TOKEN",
                "RAY_AUTH_TOKEN_PATH",
            }
            if names:  # KubeRay leaves a variable that the container sets alone
                problems.append(f"container {c['name']}: sets {sorted(names)} over KubeRay's token settings")
    head = rc["headGroupSpec"]
    exposed = {head.get("serviceType"), (head.get("headService") or {}).get("spec", {}).get("type")}
    if exposed & {"LoadBalancer", "NodePort"} or head.get("enableIngress"):
        problems.append("headGroupSpec: the dashboard is exposed outside the Kubernetes cluster")
    return problems


def test_every_field_is_one_of_kuberay_v1_or_of_the_kubernetes_pod_models() -> None:
    job = _manifest()
    assert _check(job, SCHEMA, "RayJob") == []
    assert len(_pod_templates(job)) == 3  # a head, the miner group, the trainer group
    rc = job["spec"]["rayClusterSpec"]
    for group in [rc["headGroupSpec"], *rc["workerGroupSpecs"]]:  # KubeRay's validateRayGroupResources
        in_params = set(group["rayStartParams"]) & {"num-cpus", "num-gpus", "memory", "resources"}
        assert not (in_params and group.get("resources")), "Ray resources in rayStartParams and resources both"


def _rename(d: dict[str, Any], old: str, new: str) -> None:
    d[new] = d.pop(old)


MISTAKES = {
    "misspelt RayJob field": (
        lambda j: _rename(j["spec"], "shutdownAfterJobFinishes", "shutdownAfterJobFinish"),
        "RayJob.spec.shutdownAfterJobFinish: not a field",
    ),
    "RayJob field in the cluster spec": (
        lambda j: j["spec"]["rayClusterSpec"].update(entrypoint="python"),
        "rayClusterSpec.entrypoint: not a field",
    ),
    "misspelt worker group field": (
        lambda j: _rename(j["spec"]["rayClusterSpec"]["workerGroupSpecs"][0], "minReplicas", "minReplica"),
        "minReplica: not a field",
    ),
    "unknown auth mode": (
        lambda j: j["spec"]["rayClusterSpec"]["authOptions"].update(mode="tokens"),
        "authOptions.mode: 'tokens' is not one of",
    ),
    "misspelt container field": (
        lambda j: _rename(_pod_templates(j)[1]["spec"]["containers"][0], "volumeMounts", "volumeMount"),
        "volumeMount: not a field of V1Container",
    ),
    "snake_case container field": (
        lambda j: _rename(_pod_templates(j)[2]["spec"]["containers"][0], "envFrom", "env_from"),
        "env_from: not a field of V1Container",
    ),
    "pod field in the container": (
        lambda j: _pod_templates(j)[1]["spec"]["containers"][0].update(nodeSelector={"a": "b"}),
        "containers[0].nodeSelector: not a field of V1Container",
    ),
    "misspelt volume source": (
        lambda j: _rename(_pod_templates(j)[0]["spec"]["volumes"][1], "emptyDir", "emptydir"),
        "emptydir: not a field of V1Volume",
    ),
    "env value not a string": (
        lambda j: _pod_templates(j)[0]["spec"]["containers"][0]["env"].append({"name": "X", "value": 1}),
        "env[2].value: expected str",
    ),
    "container without a name": (
        lambda j: _pod_templates(j)[2]["spec"]["containers"][0].pop("name"),
        "spec.containers.0.name\n  Field required",
    ),
    "missing entrypoint": (lambda j: j["spec"].pop("entrypoint"), "RayJob.spec.entrypoint: required"),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_misspelt_or_misplaced_field_fails(mistake: str) -> None:
    plant, expected = MISTAKES[mistake]
    job = _manifest()
    plant(job)
    problems = _check(job, SCHEMA, "RayJob")
    assert any(expected in p for p in problems), problems


def test_the_groups_have_the_shapes_of_cluster_yaml_and_hold_the_documented_job() -> None:
    job = _manifest()
    k8s = _autoscaling_config(job)  # Ray's validate_config ran on it
    aws = _raw()
    pairs = {"head": aws["head_node_type"], "miner": "miner_g5", "trainer": "trainer_g5"}
    k8s_types = k8s["available_node_types"]
    assert set(k8s_types) == {"headgroup" if g == "head" else g for g in pairs}
    for group, node_type in pairs.items():
        ours = k8s_types["headgroup" if group == "head" else group]
        theirs = aws["available_node_types"][node_type]
        assert {k: v for k, v in ours["resources"].items() if k != "memory" and v} == {
            k: v for k, v in theirs["resources"].items() if v
        }, group
        if group != "head":
            assert (ours["min_workers"], ours["max_workers"]) == (theirs["min_workers"], theirs["max_workers"])
    rc = job["spec"]["rayClusterSpec"]
    selectors = {g["groupName"]: g["template"]["spec"]["nodeSelector"] for g in rc["workerGroupSpecs"]}
    assert selectors["miner"]["eks.amazonaws.com/capacityType"] == "SPOT"  # as cluster.yaml's miner_g5
    assert selectors["trainer"]["eks.amazonaws.com/capacityType"] == "ON_DEMAND"
    for template in _pod_templates(job):
        for c in template["spec"]["containers"]:
            limits, requests = c["resources"]["limits"], c["resources"]["requests"]
            assert limits.get("nvidia.com/gpu") == requests.get("nvidia.com/gpu")  # Kubernetes requires it
            assert float(requests["cpu"]) <= float(limits["cpu"])
    # The entrypoint is docs/cluster.md's `ray job submit` job, its run on S3 instead of the shared file system.
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:3] == ["python", "-m", "raycl.tune"]
    documented = _documented_job()
    out = argv.index("--out") + 1
    assert (
        argv[out].startswith("s3://")
        and argv[3:out] + argv[out + 1 :]
        == documented[: documented.index("--out") + 1] + documented[documented.index("--out") + 2 :]
    )
    args = cli.space_parser("python -m raycl.tune", "").parse_args(argv[3:])
    check_job_fits(args, k8s)
    assert job["spec"]["shutdownAfterJobFinishes"] is True


def test_the_image_is_ray_s_own_with_raycl_installed() -> None:
    job = _manifest()
    assert job["spec"]["rayClusterSpec"]["rayVersion"] == ray.__version__
    images = {c["image"] for t in _pod_templates(job) for c in t["spec"]["containers"]}
    assert len(images) == 1 and images.pop().endswith(f"/raycl:{ray.__version__}")
    dockerfile = (ROOT / "k8s" / "Dockerfile").read_text()
    assert re.search(rf"^FROM {re.escape(IMAGE)}$", dockerfile, re.M)
    assert re.search(r"^RUN pip install .*-e /home/ray/raycl", dockerfile, re.M)  # as `ray up` installs it


def test_token_authentication_is_on_and_the_dashboard_stays_inside() -> None:
    assert _auth_problems(_manifest()) == []


AUTH_HOLES = {
    "no authOptions": lambda rc: rc.pop("authOptions"),
    "mode disabled": lambda rc: rc["authOptions"].update(mode="disabled"),
    "a generated token nobody has": lambda rc: rc["authOptions"].pop("secretName"),
    "a container turns it off": lambda rc: rc["workerGroupSpecs"][1]["template"]["spec"]["containers"][0][
        "env"
    ].append({"name": "RAY_AUTH_MODE", "value": "disabled"}),
    "a LoadBalancer dashboard": lambda rc: rc["headGroupSpec"].update(serviceType="LoadBalancer"),
    "a LoadBalancer head Service": lambda rc: rc["headGroupSpec"].update(
        headService={"spec": {"type": "LoadBalancer"}}
    ),
    "an Ingress": lambda rc: rc["headGroupSpec"].update(enableIngress=True),
}


@pytest.mark.parametrize("hole", list(AUTH_HOLES))
def test_an_open_control_plane_fails(hole: str) -> None:
    job = _manifest()
    AUTH_HOLES[hole](job["spec"]["rayClusterSpec"])
    assert _auth_problems(job)
