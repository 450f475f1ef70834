"""``--track mlflow,wandb``: a smoke sweep and a smoke training read back from a local MLflow store (sqlite) with
MLflow's own client, and from W&B's offline run folders (``WANDB_MODE=offline``) with W&B's own record format."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_coherence_recipe import TINY, check_a_mined_run, check_the_sweep, sweep_space

from raycl import cli
from raycl.config.tasks import load_space
from raycl.distributed.tracking import safe_params

SECRET = "wJalrXUtnFEMI-K7MDENG-raycl-test"


def test_secrets_are_never_params(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    params = safe_params(
        {
            "data.train": f"s3://AKIDEXAMPLE:{SECRET}@bucket/train.m2",
            "loss.margin": 0.3,
            "storage.aws_access_key_id": "AKIDEXAMPLE",
            "model.hub_token": "hf_abcdefgh",
            "data.dev": f"/data/{SECRET}/dev.m2",
            "data.test": "https://user:hunter22@host/x.m2",
        }
    )
    assert params == {
        "data.train": "s3://AKIDEXAMPLE:***@bucket/train.m2",
        "loss.margin": "0.3",
        "data.dev": "/data/***/dev.m2",
        "data.test": "https://user:***@host/x.m2",
    }


PRESIGNED = {  # credentials in query strings: a presigned S3 URL, an Azure SAS, a token, pyarrow's S3 options
    "mining.negatives": (
        "https://b.s3.amazonaws.com/n.parquet?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential="
        "AKIAEXAMPLE29%2F20250101%2Fus-east-1&X-Amz-Expires=3600&X-Amz-Signature=S1gnatureEXAMPLE29",
        "https://b.s3.amazonaws.com/n.parquet?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=***"
        "&X-Amz-Expires=3600&X-Amz-Signature=***",
    ),
    "model.checkpoint": (
        "https://acct.blob.core.windows.net/c/m?sv=2022-11-02&sp=r&sig=AzureSASsigEXAMPLE29",
        "https://acct.blob.core.windows.net/c/m?sv=2022-11-02&sp=r&sig=***",
    ),
    "data.dev": ("https://host/dev.csv?token=T0kenEXAMPLE29", "https://host/dev.csv?token=***"),
    "data.test": (
        "s3://bucket/t.csv?region=us-east-1&secret_key=S3cretEXAMPLE29",
        "s3://bucket/t.csv?region=us-east-1&secret_key=***",
    ),
}


def test_query_string_credentials_are_never_params_or_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What MLflow gets (params, the parent run's name and ``raycl.run_dir`` tag, read back from a sqlite store
    with MLflow's client) and what W&B gets (``safe_config``: the config of every raycl-made W&B run, the run's
    name as its group) hold no credential of a query string; a staged run is named by its URI's last segment."""
    from raycl import storage
    from raycl.distributed.tracking import _Active, dotted, safe_config, tracked

    assert safe_params({k: v for k, (v, _) in PRESIGNED.items()}) == {k: v for k, (_, v) in PRESIGNED.items()}
    config = {
        "model": {"checkpoint": PRESIGNED["model.checkpoint"][0], "name": "smoke"},
        "loss": {"margin": 0.3},
        "mining": {"negatives": PRESIGNED["mining.negatives"][0]},
    }
    assert safe_config(dotted(config)) == {
        "model.checkpoint": PRESIGNED["model.checkpoint"][1],
        "model.name": "smoke",
        "loss.margin": 0.3,
        "mining.negatives": PRESIGNED["mining.negatives"][1],
    }
    client = _tracked(monkeypatch, tmp_path)
    monkeypatch.setenv("RAYCL_CACHE_DIR", str(tmp_path / "cache"))
    run_dir = storage.stage_dir("s3://raycl-test/runs/idiom")
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    assert _Active(("wandb",), "idiom", run_dir).name == "idiom/idiom"  # the W&B group
    with tracked(("mlflow",), run_dir=run_dir, space="idiom"):
        pass
    (run,) = client.search_runs([client.get_experiment_by_name("raycl-test").experiment_id])
    assert run.info.run_name == "idiom/idiom" and run.data.tags["raycl.run_dir"] == "s3://raycl-test/runs/idiom"
    assert run.data.params["mining.negatives"] == PRESIGNED["mining.negatives"][1]
    logged = [run.info.run_name, *run.data.params.values(), *run.data.tags.values()]
    assert not [v for v in logged if "EXAMPLE29" in v]


def test_a_tracking_uri_with_a_password_is_said_once_without_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from raycl.distributed.tracking import check

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://raycl:Tr4ckingPassw0rd29@mlflow.example.org")
    check(("mlflow",))
    err = capsys.readouterr().err
    assert err.startswith("raycl: warning: MLFLOW_TRACKING_URI carries credentials (https://raycl:***@mlflow.")
    assert len(err.splitlines()) == 1 and "Tr4ckingPassw0rd29" not in err and "MLFLOW_TRACKING_PASSWORD" in err


def test_track_is_parsed_and_checked() -> None:
    parser = cli.space_parser("python -m raycl.tune", "")
    assert parser.parse_args(["coherence", "--track", "mlflow"]).track == ("mlflow",)
    assert parser.parse_args(["coherence", "--track", "mlflow,wandb"]).track == ("mlflow", "wandb")
    for bad in ("tensorboard", "mlflow,tensorboard", ","):
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(["coherence", "--track", bad])
        assert exit_.value.code == 2


def test_wandb_without_a_key_is_one_line_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from raycl.distributed.tracking import check
    from raycl.errors import UserError

    for var in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no W&B settings: not logged in
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path))
    import wandb

    try:
        with pytest.raises(UserError, match="no W&B API key"):
            check(("wandb",))
        monkeypatch.setenv("WANDB_MODE", "offline")
        check(("mlflow", "wandb"))
    finally:
        wandb.teardown()  # W&B's process-wide settings were read from this test's environment


def _tracked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """A local MLflow store (sqlite) named by MLflow's own environment, its artifacts in ``tmp_path``; a secret in
    the environment."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "raycl-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B's own: runs written as files under WANDB_DIR/wandb
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_PROJECT", "raycl-test")
    monkeypatch.setenv("WANDB_SILENT", "true")
    client = MlflowClient(uri)
    # a sqlite store's artifacts would go to ./mlruns; the tracker uses the experiment as it finds it
    client.create_experiment("raycl-test", artifact_location=(tmp_path / "artifacts").as_uri())
    return client


def _wandb_records(path: Path) -> list[Any]:
    """The records of an offline run's ``run-ID.wandb``: W&B's log format (a ``:W&B`` header, then 32 KiB blocks
    of records with a 7-byte header — crc32, length, type full/first/middle/last), each a ``Record`` protobuf."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, part, out = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B", path
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _, size, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (size == 0 and kind == 0):  # a block's padding
            pos += left
            continue
        if pos + 7 + size > len(data):  # a record still being written
            break
        part, pos = part + data[pos + 7 : pos + 7 + size], pos + 7 + size
        if kind in (1, 4):  # full, last
            out.append(pb.Record.FromString(part))
            part = b""
    return out


def _ended_records(path: Path, timeout: float = 240.0) -> list[Any]:
    """The records of a run once its ``exit`` record is written: W&B's service process of a logging actor that Ray
    has killed may still be writing the file when the sweep returns (on a loaded 2-core machine, for over a minute:
    a run read before its exit record lacked the trial's config update, which comes last)."""
    deadline = time.monotonic() + timeout
    while True:
        records = _wandb_records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def _wandb_runs(tmp_path: Path) -> list[dict[str, Any]]:
    """Every offline W&B run under ``tmp_path``: name, job type, group, config, history (step → metrics),
    artifacts (name → files); no secret anywhere in its records."""
    runs = []
    for path in sorted(tmp_path.glob("wandb/offline-run-*/run-*.wandb")):
        records = _ended_records(path)
        assert SECRET.encode() not in path.read_bytes(), path
        run: dict[str, Any] = {"history": {}, "config": {}, "artifacts": {}}
        for rec in records:
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                run.update(
                    name=rec.run.display_name,
                    job_type=rec.run.job_type,
                    group=rec.run.run_group,
                    project=rec.run.project,
                )
                run["config"].update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
            elif kind == "config":
                run["config"].update({i.key: json.loads(i.value_json) for i in rec.config.update})
            elif kind == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
                run["history"].setdefault(rec.history.step.num, {}).update(row)
            elif kind == "artifact":
                run["artifacts"][rec.artifact.name] = {m.path for m in rec.artifact.manifest.contents}
        runs.append(run)
    return runs


def _check_wandb(tmp_path: Path, *, job_type: str, count: int, metrics: set[str]) -> list[dict[str, Any]]:
    """``count`` W&B runs of ``job_type`` (each with the dotted config and ``metrics`` at increasing steps) and the
    run's own run (``job_type`` run, its files as the artifact ``raycl-run``), all in one group."""
    runs = _wandb_runs(tmp_path)
    mine = [r for r in runs if r["job_type"] == job_type]
    (whole,) = [r for r in runs if r["job_type"] == "run"]
    assert len(mine) == count and len(runs) == count + 1, [(r["name"], r["job_type"]) for r in runs]
    assert {r["group"] for r in runs} == {whole["name"]} and {r["project"] for r in runs} == {"raycl-test"}
    files = whole["artifacts"]["raycl-run"]
    assert {"report.md", "best.json", "results.csv", "config.yaml", "dev_curves.png"} <= files
    assert "loss.margin" in whole["config"]
    for run in mine:
        assert {"loss.margin", "optim.lr", "mining.max_staleness", "scaling.num_workers"} <= set(run["config"])
        logged = {k for row in run["history"].values() for k in row}
        assert metrics <= logged, logged
        steps = [s for s, row in sorted(run["history"].items()) if "loss" in row]
        assert len(steps) >= 1 and steps[0] >= 1, run["history"]
    for run in runs:  # what the note shows (pytest -s)
        keys = sorted({k for row in run["history"].values() for k in row if not k.startswith("_")})
        print(
            f"\nW&B {run['job_type']} run {run['name']!r} (group {run['group']}): {len(run['config'])} config "
            f"keys, steps {sorted(run['history'])}, metrics {keys}, artifacts {run['artifacts']}"
        )
    return mine


def _read_back(client: Any) -> tuple[Any, list[Any]]:
    """The parent run (with the run's files, FINISHED) and its children; no secret in any param or tag."""
    runs = client.search_runs([client.get_experiment_by_name("raycl-test").experiment_id])
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == len(runs) - 1
    artifacts = {f.path for f in client.list_artifacts(parent.info.run_id)}
    assert {"report.md", "best.json", "results.csv", "config.yaml", "dev_curves.png"} <= artifacts
    assert (
        Path(client.get_experiment_by_name("raycl-test").artifact_location.removeprefix("file://"))
        / parent.info.run_id
        / "artifacts"
        / "report.md"
    ).exists()
    assert parent.info.status == "FINISHED" and "loss.margin" in parent.data.params
    assert "dev_acc" in parent.data.metrics  # best.json's scores
    for run in children:
        assert run.info.status == "FINISHED"
        assert {"loss.margin", "optim.lr", "mining.max_staleness", "scaling.num_workers"} <= set(run.data.params)
        assert {"loss", "dev_acc"} <= set(run.data.metrics), run.data.metrics
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
        assert steps == sorted(steps) and len(set(steps)) == len(steps) >= 1
    every = [v for r in runs for v in (*r.data.params.values(), *r.data.tags.values())]
    assert not any(SECRET in v for v in every)
    return parent, children


METRICS = {"loss", "timing/mine_wait", "stream/staleness_max", "stream/refused", "dev_acc"}


def test_a_tracked_sweep_is_one_run_per_trial(
    ray_local: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The coherence recipe's smoke sweep (two points mined while training, side by side, then the pairwise
    baseline: ``test_coherence_recipe.check_the_sweep``), logged by Ray's MLflowLoggerCallback and
    WandbLoggerCallback at once: an MLflow child run and a W&B run per trial and per baseline, with the trial's
    resolved dotted config and every report's metrics."""
    client = _tracked(monkeypatch, tmp_path)
    summary = cli.run(sweep_space(), tmp_path / "run", sweep=True, track=("mlflow", "wandb"))
    check_the_sweep(ray_local, tmp_path / "run", summary)
    _, trials = _read_back(client)
    sweep = sorted(
        (t for t in trials if t.data.tags["raycl.sweep"] == "sweep"), key=lambda t: t.data.params["loss.margin"]
    )
    assert [t.data.params["loss.margin"] for t in sweep] == ["0.1", "0.3"] and len(trials) == 3
    assert all(METRICS <= set(t.data.metrics) for t in sweep)  # mined while training: the stream's figures
    (baseline,) = [t for t in trials if t not in sweep]
    assert baseline.data.tags["raycl.sweep"] == "baselines" and {"loss", "dev_acc"} <= set(baseline.data.metrics)
    runs = _check_wandb(tmp_path, job_type="trial", count=3, metrics={"loss", "dev_acc", "training_iteration"})
    assert sorted(r["config"]["loss.margin"] for r in runs if METRICS <= _logged(r)) == [0.1, 0.3]


def _logged(run: dict[str, Any]) -> set[str]:
    return {k for row in run["history"].values() for k in row}


def test_a_tracked_training_is_a_run_with_its_reports(
    ray_local: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m raycl.train`` (no Tune): the coherence recipe's run mined while it trains with staleness 1
    (``test_coherence_recipe.check_a_mined_run``, with the eval CLI on its model), its training logged from its
    records as a trial is, in MLflow (a child run: dotted config, every report at its step, its config and
    history as artifacts) and W&B."""
    client = _tracked(monkeypatch, tmp_path)
    space = load_space("coherence", preset="smoke", overrides=[*TINY, "mining.max_staleness=1"])
    check_a_mined_run(
        tmp_path / "run", cli.run(space, tmp_path / "run", sweep=False, track=("mlflow", "wandb")), staleness=1
    )
    parent, (training,) = _read_back(client)
    history = [json.loads(line) for line in (tmp_path / "run/trials/train/history.jsonl").read_text().splitlines()]
    assert training.data.tags["raycl.sweep"] == "train" and training.info.run_name == "train-train"
    assert METRICS <= set(training.data.metrics)
    steps = [m.step for m in client.get_metric_history(training.info.run_id, "loss")]
    assert steps == [row["report"] for row in history if "loss" in row]
    artifacts = {f.path for f in client.list_artifacts(training.info.run_id)}
    assert artifacts >= {"config.yaml", "history.jsonl"}
    print(
        f"\nMLflow run {training.info.run_name!r} (child of {parent.info.run_name!r}): "
        f"{len(training.data.params)} params, loss at steps {steps}, metrics {sorted(training.data.metrics)}, "
        f"artifacts {sorted(artifacts)}"
    )
    (run,) = _check_wandb(tmp_path, job_type="training", count=1, metrics=METRICS)
    assert sorted(s for s, row in run["history"].items() if "loss" in row) == steps
