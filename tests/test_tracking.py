"""``--track mlflow``: a smoke sweep read back from a local MLflow store (sqlite) with MLflow's own client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_coherence_recipe import TINY

from raycl import cli
from raycl.config import load_space
from raycl.distributed.tracking import safe_params

SECRET = "wJalrXUtnFEMI-K7MDENG-raycl-test"


def test_secrets_are_never_params(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    params = safe_params({"data.train": f"s3://AKIDEXAMPLE:{SECRET}@bucket/train.m2", "loss.margin": 0.3,
                          "storage.aws_access_key_id": "AKIDEXAMPLE", "model.hub_token": "hf_abcdefgh",
                          "data.dev": f"/data/{SECRET}/dev.m2", "data.test": "https://user:hunter22@host/x.m2"})
    assert params == {"data.train": "s3://AKIDEXAMPLE:***@bucket/train.m2", "loss.margin": "0.3",
                      "data.dev": "/data/***/dev.m2", "data.test": "https://user:***@host/x.m2"}  # fmt: skip


def test_track_is_parsed_and_checked() -> None:
    parser = cli.space_parser("python -m raycl.tune", "")
    assert parser.parse_args(["coherence", "--track", "mlflow"]).track == "mlflow"
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["coherence", "--track", "tensorboard"])
    assert exit_.value.code == 2


def _tracked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """A local MLflow store (sqlite) named by MLflow's own environment, its artifacts in ``tmp_path``; a secret in
    the environment."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "raycl-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    client = MlflowClient(uri)
    # a sqlite store's artifacts would go to ./mlruns; the tracker uses the experiment as it finds it
    client.create_experiment("raycl-test", artifact_location=(tmp_path / "artifacts").as_uri())
    return client


def _read_back(client: Any) -> tuple[Any, list[Any]]:
    """The parent run (with the run's files, FINISHED) and its children; no secret in any param or tag."""
    runs = client.search_runs([client.get_experiment_by_name("raycl-test").experiment_id])
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == len(runs) - 1
    artifacts = {f.path for f in client.list_artifacts(parent.info.run_id)}
    assert {"report.md", "best.json", "results.csv", "config.yaml", "dev_curves.png"} <= artifacts
    assert (Path(client.get_experiment_by_name("raycl-test").artifact_location.removeprefix("file://"))
            / parent.info.run_id / "artifacts" / "report.md").exists()
    assert parent.info.status == "FINISHED" and "loss.margin" in parent.data.params
    assert "dev_acc" in parent.data.metrics  # best.json's scores
    for run in children:
        assert run.info.status == "FINISHED"
        assert {"loss.margin", "optim.lr", "mining.max_staleness", "scaling.num_workers"} <= set(run.data.params)
        assert {"loss", "timing/mine_wait", "stream/staleness_max", "stream/refused", "dev_acc"} <= set(
            run.data.metrics), run.data.metrics
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
        assert steps == sorted(steps) and len(set(steps)) == len(steps) >= 1
    every = [v for r in runs for v in (*r.data.params.values(), *r.data.tags.values())]
    assert not any(SECRET in v for v in every)
    return parent, children


def test_a_tracked_sweep_is_one_mlflow_run_per_trial(ray_local: Any, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """One sweep trial of coherence (mined while training), logged by Ray's MLflowLoggerCallback: a child run
    with the trial's resolved dotted config and every report's metrics. (Baselines are trials of a second
    sweep, logged the same way; left out to keep the test short.)"""
    client = _tracked(monkeypatch, tmp_path)
    over = [*TINY, "scaling.num_workers=1", "scaling.cpus_per_worker=0.5", "tune.driver_cpus=0.1"]
    space = load_space("coherence", preset="smoke", overrides=over)
    space.search, space.baselines = {"loss.margin": {"grid": [0.3]}}, {}
    summary = cli.run(space, tmp_path / "run", sweep=True, track="mlflow")
    assert not summary["failed_trials"]
    _, trials = _read_back(client)
    assert len(trials) == 1 and trials[0].data.tags["raycl.sweep"] == "sweep"
    assert trials[0].data.params["loss.margin"] == "0.3"

