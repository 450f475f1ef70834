"""Experiment tracking (``--track mlflow``, ``--track wandb``, or both: ``--track mlflow,wandb``): per raycl run,
one tracked run per trial, per baseline and per ``raycl.train`` training, and one for the run itself.

Trials (Tune's, in ``raycl.tune``) are logged by Ray's own callbacks on the Tune driver: ``MLflowLoggerCallback``
(:class:`TrialRuns`, child runs of the raycl run's parent run) and ``WandbLoggerCallback``
(:class:`WandbTrialRuns`, W&B runs grouped under the raycl run's name, ``job_type`` ``trial``). Params are the
trial's point at its start, then its whole resolved dotted config (``trials/ID/config.yaml``) at its end; metrics
every report the trial made (dev/test scores, loss, ``timing/mine_wait``, staleness, refusals, tokens/s …) at
Tune's ``training_iteration`` as the step. ``python -m raycl.train`` has no Tune, so each of its trainings is
logged from its own records when it ends (:func:`log_training`: the same params, every line of its
``history.jsonl`` at its ``report`` number as the step, its config and history as artifacts) — an MLflow child
run, or a W&B run through Ray's ``setup_wandb``. The run itself (:func:`tracked`, around the whole verb) gets
the run's dotted config, ``best.json``'s scores, and the run's ``report.md``, ``best.json``, ``results.csv``,
``config.yaml`` and plots as artifacts (the MLflow parent run; a W&B run of ``job_type`` ``run`` with one
artifact ``raycl-run``).

Each tracker's own environment decides where runs go: ``MLFLOW_TRACKING_URI`` and ``MLFLOW_EXPERIMENT_NAME``
(else ``raycl-SPACE``); ``WANDB_MODE`` (``offline``: files under ``WANDB_DIR``, ``wandb sync`` them later),
``WANDB_PROJECT`` (else ``raycl-SPACE``), ``WANDB_ENTITY``, ``WANDB_API_KEY`` … — every ``WANDB_*`` variable of the
driver also reaches Ray's logging actors. Credentials are never logged (:func:`safe_params`).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from raycl.errors import UserError, environ_items, redact_uri, uri_credentials
from raycl.records import HISTORY, read_history

ARTIFACTS = ("report.md", "best.json", "results.csv", "config.yaml")
TRAINING_ARTIFACTS = ("config.yaml", HISTORY)
_SECRET_KEY = re.compile(r"secret|token|passw|credential|api_?key|access_?key|private_?key|auth", re.I)
_SECRET_ENV = re.compile(r"^AWS_|TOKEN|SECRET|PASSW|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY", re.I)
_MAX_PARAM = 6000  # MLflow's limit on a param value


@dataclass
class _Active:
    backends: tuple[str, ...]
    space: str
    run_dir: Path
    experiment: str = ""  # MLflow's
    experiment_id: str = ""
    parent_id: str = ""  # MLflow's parent run
    project: str = ""  # W&B's
    client: Any = None  # MLflow's client

    @property
    def name(self) -> str:
        """The MLflow parent run's name and the W&B group: ``SPACE/<the run folder's name>`` (a staged run's:
        the last segment of its URI), credentials hidden."""
        from raycl.storage import remote_of

        where = remote_of(self.run_dir) or str(self.run_dir)
        return safe_text(f"{self.space}/{where.rstrip('/').rsplit('/', 1)[-1]}")


_active: _Active | None = None


def _backends(track: Sequence[str] | None) -> tuple[str, ...]:
    """The trackers asked (``--track``'s value, parsed by ``raycl.cli.parse_track``)."""
    return tuple(track or ())


def check(track: Sequence[str] | None) -> None:
    """Before anything runs: each tracker's package is there (an optional extra), or one line and exit 2; a
    tracking URI that carries a password is said once (MLflow's own variables keep it out of the URI)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if "mlflow" in _backends(track) and uri_credentials(uri):
        print(
            f"raycl: warning: MLFLOW_TRACKING_URI carries credentials ({safe_text(uri)}); raycl never logs it, "
            "but MLflow's MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) keep "
            "them out of the URI",
            file=sys.stderr,
        )
    for backend in _backends(track):
        try:
            __import__(backend)
        except ImportError:
            raise UserError(
                f"--track {backend}: the {backend} package is not installed (pip install 'raycl[{backend}]')"
            ) from None
    if "wandb" in _backends(track):
        from ray.air.integrations.wandb import _set_api_key

        try:  # what Ray's callback would find only once the sweep runs
            _set_api_key()
        except ValueError:
            raise UserError(
                "--track wandb: no W&B API key (set WANDB_API_KEY, run `wandb login`, or WANDB_MODE=offline)"
            ) from None


# ---------------------------------------------------------------------------------------------- params
def safe_text(text: str) -> str:
    """``text`` without credentials: a URI's password and every credential query parameter (``?X-Amz-Signature=``,
    ``&sig=``, ``?token=`` …) become ``***`` (``raycl.errors.redact_uri``), and so does the value of any
    secret-looking environment variable (``AWS_*``, ``*TOKEN*``, ``*SECRET*`` …) the text holds."""
    text = redact_uri(text)
    for k, v in environ_items():
        if _SECRET_ENV.search(k) and len(v) >= 6:
            text = text.replace(v, "***")
    return text


def safe_params(params: dict[str, Any]) -> dict[str, str]:
    """``params`` as MLflow param strings, without credentials: keys that name one (token, secret, password,
    access key …) are left out, and every value is :func:`safe_text`."""
    return {k: safe_text(str(v))[:_MAX_PARAM] for k, v in params.items() if not _SECRET_KEY.search(k)}


def safe_config(params: dict[str, Any]) -> dict[str, Any]:
    """:func:`safe_params` for W&B's config, which keeps types: a number or flag left unchanged stays one."""
    return {
        k: params[k] if isinstance(params[k], (int, float, bool)) and str(params[k]) == v else v
        for k, v in safe_params(params).items()
    }


def dotted(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{"loss.margin": 0.3, ...}`` (lists stay values)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(dotted(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _config(path: Path) -> dict[str, Any]:
    return dotted(yaml.safe_load(path.read_text(encoding="utf-8")) or {}) if path.exists() else {}


def config_params(path: Path) -> dict[str, str]:
    """The safe dotted params of a resolved ``config.yaml`` (the run's, or a trial's); {} if there is none."""
    return safe_params(_config(path))


def _metrics(row: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in row.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def _steps(out_dir: Path) -> list[tuple[int, dict[str, float]]]:
    """A training's reports (``history.jsonl``) as (step, metrics): its ``report`` number, as Tune counts them."""
    return [(int(row.get("report", i + 1)), _metrics(row)) for i, row in enumerate(read_history(out_dir))]


def _files(folder: Path, names: Sequence[str], plots: bool) -> list[Path]:
    return [
        p for p in [*(folder / n for n in names), *(sorted(folder.glob("*.png")) if plots else [])] if p.exists()
    ]


# ---------------------------------------------------------------------------------------------- trial runs
def _mlflow_callback() -> type:
    """:class:`TrialRuns`, made when MLflow is asked for: importing Ray's MLflow integration imports mlflow
    (about a CPU second), which every process that imports the driver — each Tune trial's, each command's —
    would pay for an untracked run."""
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    class TrialRuns(MLflowLoggerCallback):  # type: ignore[misc]
        """Ray's MLflow callback, one child run of the raycl run per trial; params are the trial's point at its
        start, then its whole resolved config (``trials/ID/config.yaml``, which the trial writes) at its end —
        filtered by :func:`safe_params` (Ray's own logs ``trial.config`` as it is)."""

        def __init__(self, active: _Active, sweep: str) -> None:
            super().__init__(
                experiment_name=active.experiment,
                tags={"mlflow.parentRunId": active.parent_id, "raycl.sweep": sweep},
            )
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
            from ray.tune.utils import flatten_dict

            step = int(result.get("training_iteration", iteration))
            metrics = [(step, _metrics(flatten_dict(result)))]
            _mlflow_metrics(self.mlflow_util._get_client(), self._trial_runs[trial], metrics)

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

    return TrialRuns


def _wandb_callback() -> type:
    """:class:`WandbTrialRuns`, made when W&B is asked for (the wandb package is an optional extra)."""
    from ray.air.integrations.wandb import WandbLoggerCallback, _QueueItem, _WandbLoggingActor
    from ray.air.util.node import _force_on_current_node

    class LoggingActor(_WandbLoggingActor):  # type: ignore[misc]
        """Ray's logging actor, whose ``run`` returns only once W&B's service process has written every record:
        ``wandb.finish`` can return before the service's writer has flushed the run's last records (the trial's
        config update, the exit record), and Ray kills the actor, with its service, as soon as ``run`` returns —
        seen once in CI: the sweep's last trial's file ended before them. ``wandb.teardown`` waits for the
        service to shut down."""

        def run(self) -> None:
            try:
                super().run()
            finally:
                self._wandb.teardown()

    class WandbTrialRuns(WandbLoggerCallback):  # type: ignore[misc]
        """Ray's W&B callback, one W&B run per trial in the raycl run's group: its config the trial's point at its
        start and its whole resolved dotted config at its end, each filtered by :func:`safe_config` (Ray's own
        logs ``trial.config`` and every result's ``config`` as they are); every ``WANDB_*`` variable of the driver
        reaches Ray's logging actors (``WANDB_MODE``, ``WANDB_DIR`` …; Ray passes only ``WANDB_API_KEY``)."""

        def __init__(self, active: _Active, sweep: str) -> None:
            super().__init__(
                project=active.project, group=active.name, job_type="trial", tags=[f"raycl.sweep={sweep}"]
            )
            self.run_dir = active.run_dir
            self._last_step: dict[str, int] = {}
            self._logger_actor_cls = LoggingActor

        def setup(self, *args: Any, **kwargs: Any) -> None:
            import ray

            super().setup(*args, **kwargs)
            env = {k: v for k, v in environ_items() if k.startswith("WANDB_")}
            here: Any = _force_on_current_node()
            options = {
                "num_cpus": 0,
                **here,
                "runtime_env": {"env_vars": env},
                "max_restarts": -1,
                "max_task_retries": -1,
            }  # Ray's own options, with the environment
            self._remote_logger_class: Any = ray.remote(**options)(self._logger_actor_cls)

        def log_trial_start(self, trial: Any) -> None:
            """As Ray's, the trial's point filtered, and no result's ``config`` logged (Ray's would be raw)."""
            exclude = [*self._exclude_results, *self.excludes, "config"]
            self._start_logging_actor(
                trial,
                exclude,
                id=trial.trial_id,
                name=str(trial),
                resume=False,
                reinit=True,
                allow_val_change=True,
                group=self.group,
                project=self.project,
                config=safe_config(dotted(trial.config)),
                **self.kwargs,
            )

        def log_trial_result(self, iteration: int, trial: Any, result: dict[str, Any]) -> None:
            self._last_step[trial.trial_id] = int(result.get("training_iteration", iteration))
            super().log_trial_result(iteration, trial, {**result, "config": {}})  # config: at start and end

        def log_trial_end(self, trial: Any, failed: bool = False) -> None:
            """The trial's whole resolved config, as a config update at its last step, before Ray's end."""
            params = safe_config(_config(self.run_dir / "trials" / trial.trial_id / "config.yaml"))
            if params and trial in self._trial_queues:
                step = self._last_step.get(trial.trial_id, 0)
                self._trial_queues[trial].put((_QueueItem.RESULT, {"config": params, "training_iteration": step}))
            super().log_trial_end(trial, failed=failed)

    return WandbTrialRuns


def sweep_callbacks(sweep: str) -> list[Any]:
    """The Tune callbacks of a sweep (``raycl.distributed.sweep.run_sweep``): none unless a run is tracked."""
    if _active is None:
        return []
    out: list[Any] = []
    if "mlflow" in _active.backends:
        out.append(_mlflow_callback()(_active, sweep))
    if "wandb" in _active.backends:
        out.append(_wandb_callback()(_active, sweep))
    return out


# ---------------------------------------------------------------------------------------------- raycl.train
def log_training(trial_id: str, out_dir: Path, *, failed: bool = False) -> None:
    """One ``raycl.train`` training (no Tune, so no callback), logged from its records when it ends, as a trial
    is: its resolved dotted config (``out_dir/config.yaml``), every report of its ``history.jsonl`` at its
    ``report`` number as the step, its config and history as artifacts. Nothing unless the run is tracked."""
    if _active is None:
        return
    if "mlflow" in _active.backends:
        client = _active.client
        run = client.create_run(
            _active.experiment_id,
            run_name=f"train-{trial_id}",
            tags={"mlflow.parentRunId": _active.parent_id, "raycl.sweep": "train", "raycl.trial_id": trial_id},
        )
        _mlflow_run(
            client,
            run.info.run_id,
            config_params(out_dir / "config.yaml"),
            _steps(out_dir),
            _files(out_dir, TRAINING_ARTIFACTS, plots=True),
        )
        client.set_terminated(run.info.run_id, "FAILED" if failed else "FINISHED")
    if "wandb" in _active.backends:
        _wandb_run(
            _active,
            name=f"train-{trial_id}",
            job_type="training",
            config=_config(out_dir / "config.yaml"),
            steps=_steps(out_dir),
            files=_files(out_dir, TRAINING_ARTIFACTS, plots=True),
            artifact=f"raycl-train-{trial_id}",
            failed=failed,
        )


# ---------------------------------------------------------------------------------------------- the run
@contextmanager
def tracked(track: Sequence[str] | None, *, run_dir: Path, space: str) -> Iterator[None]:
    """Around a whole ``raycl.tune``/``raycl.train`` run: the run's own tracked runs (MLflow's parent run,
    FINISHED or FAILED; W&B's run of ``job_type`` ``run``) with the run's params, scores and files."""
    global _active
    backends = _backends(track)
    if not backends:
        yield
        return
    active = _Active(backends, space, run_dir)
    if "mlflow" in backends:
        from mlflow import MlflowClient

        active.client = client = MlflowClient()
        active.experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or f"raycl-{space}"
        exp = client.get_experiment_by_name(active.experiment)
        active.experiment_id = exp.experiment_id if exp else client.create_experiment(active.experiment)
        from raycl.storage import remote_of

        tags = {"raycl.space": space, "raycl.run_dir": safe_text(remote_of(run_dir) or str(run_dir))}
        active.parent_id = client.create_run(active.experiment_id, run_name=active.name, tags=tags).info.run_id
    if "wandb" in backends:
        project = os.environ.get("WANDB_PROJECT") or os.environ.get("WANDB_PROJECT_NAME")  # W&B's, Ray's
        active.project = project or f"raycl-{space}"
    _active = active
    try:
        yield
    except BaseException:
        _active = None
        with suppress(Exception):  # what the failed run wrote, if it can be logged; its own error comes first
            _log_run(active, failed=True)
        raise
    _active = None
    _log_run(active, failed=False)


def _log_run(active: _Active, *, failed: bool) -> None:
    run_dir = active.run_dir
    best = json.loads((run_dir / "best.json").read_text()) if (run_dir / "best.json").exists() else None
    best = best if isinstance(best, dict) else {}  # no trial scored: best.json holds null
    files = _files(run_dir, ARTIFACTS, plots=True)
    if "mlflow" in active.backends:
        _mlflow_run(
            active.client, active.parent_id, config_params(run_dir / "config.yaml"), [(0, _metrics(best))], files
        )
        active.client.set_terminated(active.parent_id, "FAILED" if failed else "FINISHED")
    if "wandb" in active.backends:
        _wandb_run(
            active,
            name=active.name,
            job_type="run",
            config=_config(run_dir / "config.yaml"),
            steps=[],
            files=files,
            artifact="raycl-run",
            summary=_metrics(best),
            failed=failed,
        )


def _mlflow_metrics(client: Any, run_id: str, steps: list[tuple[int, dict[str, float]]]) -> None:
    from mlflow.entities import Metric

    stamp = int(time.time() * 1000)
    metrics = [Metric(k, v, stamp, step) for step, row in steps for k, v in row.items()]
    for i in range(0, len(metrics), 1000):  # MLflow's most metrics per batch
        client.log_batch(run_id, metrics=metrics[i : i + 1000])


def _mlflow_run(
    client: Any, run_id: str, params: dict[str, str], steps: list[tuple[int, dict[str, float]]], files: list[Path]
) -> None:
    from mlflow.entities import Param

    every = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(every), 100):  # MLflow takes at most 100 params per batch
        client.log_batch(run_id, params=every[i : i + 100])
    _mlflow_metrics(client, run_id, steps)
    for path in files:
        client.log_artifact(run_id, str(path))


def _wandb_run(
    active: _Active,
    *,
    name: str,
    job_type: str,
    config: dict[str, Any],
    steps: list[tuple[int, dict[str, float]]],
    files: list[Path],
    artifact: str,
    summary: dict[str, float] | None = None,
    failed: bool = False,
) -> None:
    """One W&B run made by raycl itself (Ray's ``setup_wandb``, outside any trainable): config, metrics by
    step, summary, files as one artifact."""
    import wandb
    from ray.air.integrations.wandb import setup_wandb

    run_id = f"raycl-{uuid.uuid4().hex[:12]}"
    start_method = os.environ.get("WANDB_START_METHOD")  # setup_wandb sets it in this (the driver's) process
    run = setup_wandb(
        config=safe_config(config),
        trial_id=run_id,
        trial_name=name,
        group=active.name,
        project=active.project,
        job_type=job_type,
        resume="allow",
        dir=os.environ.get("WANDB_DIR"),
        settings=wandb.Settings(silent=True),
    )
    try:
        for step, row in steps:
            run.log(row, step=step)
        if summary:
            run.summary.update(summary)
        if files:
            art = wandb.Artifact(artifact, type="raycl-files")
            for path in files:
                art.add_file(str(path))
            run.log_artifact(art)
    finally:
        run.finish(exit_code=1 if failed else 0)
        if start_method is None:
            os.environ.pop("WANDB_START_METHOD", None)
        else:
            os.environ["WANDB_START_METHOD"] = start_method
