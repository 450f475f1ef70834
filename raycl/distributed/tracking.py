"""Experiment tracking (``--track mlflow``): one MLflow run per raycl run, one child run per trial and baseline.

The trials' runs come from Ray's own ``MLflowLoggerCallback`` on the Tune driver (:class:`TrialRuns`): its
params are the trial's resolved dotted config, its metrics every report the trial made (dev/test scores, loss,
``timing/mine_wait``, staleness, refusals, tokens/s …) at Tune's ``training_iteration`` as the step. The parent
run (:func:`tracked`, around the whole verb) gets the run's dotted config, ``best.json``'s scores, and the run's
``report.md``, ``best.json``, ``results.csv``, ``config.yaml`` and plots as artifacts; ``python -m raycl.train``
(no Tune, so no callback) gets that parent run only (its reports stay in ``trials/*/history.jsonl``).

MLflow's own environment decides where runs go: ``MLFLOW_TRACKING_URI`` (else MLflow's default) and
``MLFLOW_EXPERIMENT_NAME`` (else ``raycl-SPACE``). Credentials are never logged (:func:`safe_params`).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from ray.air.integrations.mlflow import MLflowLoggerCallback

from raycl.errors import UserError

TRACKERS = ("mlflow",)
ARTIFACTS = ("report.md", "best.json", "results.csv", "config.yaml")
_SECRET_KEY = re.compile(r"secret|token|passw|credential|api_?key|access_?key|private_?key|auth", re.I)
_SECRET_ENV = re.compile(r"^AWS_|TOKEN|SECRET|PASSW|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY", re.I)
_URI_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/@:\s]*):[^/@\s]*@", re.I)
_MAX_PARAM = 6000  # MLflow's limit on a param value


@dataclass
class _Active:
    experiment: str
    parent_id: str
    run_dir: Path


_active: _Active | None = None


def check(backend: str | None) -> None:
    """Before anything runs: the tracker's package is there (an optional extra), or one line and exit 2."""
    if backend == "mlflow":
        try:
            import mlflow  # noqa: F401
        except ImportError:
            raise UserError("--track mlflow: the mlflow package is not installed "
                            "(pip install 'raycl[mlflow]')") from None  # fmt: skip


# ---------------------------------------------------------------------------------------------- params
def safe_params(params: dict[str, Any]) -> dict[str, str]:
    """``params`` as MLflow param strings, without credentials: keys that name one (token, secret, password,
    access key …) are left out, a URI's password becomes ``***``, and so does any value holding the value of a
    secret-looking environment variable (``AWS_*``, ``*TOKEN*``, ``*SECRET*`` …)."""
    secrets = [v for k, v in os.environ.items() if _SECRET_ENV.search(k) and len(v) >= 6]
    out: dict[str, str] = {}
    for key, value in params.items():
        if _SECRET_KEY.search(key):
            continue
        text = _URI_PASSWORD.sub(r"\g<head>:***@", str(value))
        for secret in secrets:
            text = text.replace(secret, "***")
        out[key] = text[:_MAX_PARAM]
    return out


def dotted(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{"loss.margin": 0.3, ...}`` (lists stay values)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(dotted(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_params(path: Path) -> dict[str, str]:
    """The safe dotted params of a resolved ``config.yaml`` (the run's, or a trial's); {} if there is none."""
    return safe_params(dotted(yaml.safe_load(path.read_text(encoding="utf-8")) or {})) if path.exists() else {}


def _metrics(row: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}  # fmt: skip


# ---------------------------------------------------------------------------------------------- trial runs
class TrialRuns(MLflowLoggerCallback):
    """Ray's MLflow callback, one child run of the raycl run per trial; params are the trial's point at its
    start, then its whole resolved config (``trials/ID/config.yaml``, which the trial writes) at its end —
    filtered by :func:`safe_params` (Ray's own logs ``trial.config`` as it is)."""

    def __init__(self, active: _Active, sweep: str) -> None:
        super().__init__(experiment_name=active.experiment,
                         tags={"mlflow.parentRunId": active.parent_id, "raycl.sweep": sweep})  # fmt: skip
        self.run_dir = active.run_dir
        self._logged: dict[str, dict[str, str]] = {}

    def log_trial_start(self, trial: Any) -> None:
        if trial not in self._trial_runs:
            tags = {**(self.tags or {}), "trial_name": str(trial), "raycl.trial_id": trial.trial_id}
            self._trial_runs[trial] = self.mlflow_util.start_run(tags=tags, run_name=str(trial)).info.run_id
        self._log_params(trial, safe_params(trial.config))

    def log_trial_result(self, iteration: int, trial: Any, result: dict[str, Any]) -> None:
        """As Ray's (Tune's ``training_iteration`` as the step), in one batch per report instead of one
        request per metric."""
        from mlflow.entities import Metric
        from ray.tune.utils import flatten_dict

        stamp, step = int(time.time() * 1000), int(result.get("training_iteration", iteration))
        metrics = [Metric(k, v, stamp, step) for k, v in _metrics(flatten_dict(result)).items()]
        client = self.mlflow_util._get_client()
        for i in range(0, len(metrics), 1000):  # MLflow's most metrics per batch
            client.log_batch(self._trial_runs[trial], metrics=metrics[i : i + 1000])

    def log_trial_end(self, trial: Any, failed: bool = False) -> None:
        self._log_params(trial, config_params(self.run_dir / "trials" / trial.trial_id / "config.yaml"))
        super().log_trial_end(trial, failed=failed)

    def _log_params(self, trial: Any, params: dict[str, str]) -> None:
        """Only params not logged yet (MLflow refuses a param logged again with another value)."""
        done = self._logged.setdefault(trial.trial_id, {})
        new = {k: v for k, v in params.items() if k not in done}
        if new:
            self.mlflow_util.log_params(run_id=self._trial_runs[trial], params_to_log=new)
            done.update(new)


def sweep_callbacks(sweep: str) -> list[Any]:
    """The Tune callbacks of a sweep (``raycl.distributed.sweep.run_sweep``): none unless a run is tracked."""
    return [] if _active is None else [TrialRuns(_active, sweep)]


# ---------------------------------------------------------------------------------------------- the run
@contextmanager
def tracked(backend: str | None, *, run_dir: Path, space: str) -> Iterator[None]:
    """Around a whole ``raycl.tune``/``raycl.train`` run: the parent MLflow run, FINISHED with the run's params,
    scores and files, or FAILED if the run raises."""
    global _active
    if backend is None:
        yield
        return
    from mlflow import MlflowClient

    client = MlflowClient()
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or f"raycl-{space}"
    exp = client.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp is not None else client.create_experiment(name)
    parent = client.create_run(exp_id, run_name=f"{space}/{run_dir.name}",
                               tags={"raycl.space": space, "raycl.run_dir": safe_params({"d": run_dir})["d"]})
    _active = active = _Active(name, parent.info.run_id, run_dir)
    try:
        yield
    except BaseException:
        client.set_terminated(parent.info.run_id, "FAILED")
        raise
    finally:
        _active = None
    _log_run(client, active)
    client.set_terminated(parent.info.run_id, "FINISHED")


def _log_run(client: Any, active: _Active) -> None:
    from mlflow.entities import Metric, Param

    run_id, run_dir = active.parent_id, active.run_dir
    stamp = int(time.time() * 1000)
    params = [Param(k, v) for k, v in config_params(run_dir / "config.yaml").items()]
    best = json.loads((run_dir / "best.json").read_text()) if (run_dir / "best.json").exists() else None
    best = best if isinstance(best, dict) else {}  # no trial scored: best.json holds null
    metrics = [Metric(k, v, stamp, 0) for k, v in _metrics(best).items()]
    for i in range(0, max(len(params), len(metrics)), 100):  # MLflow takes at most 100 params per batch
        client.log_batch(run_id, params=params[i : i + 100], metrics=metrics[i : i + 100])
    for path in [*(run_dir / n for n in ARTIFACTS), *sorted(run_dir.glob("*.png"))]:
        if path.exists():
            client.log_artifact(run_id, str(path))
