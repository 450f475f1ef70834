"""A Ray Tune sweep whose trials each run a Ray Train ``TorchTrainer`` (the Train-in-Tune pattern of Ray 2.60).

``Tuner(trial_fn)`` with a function trial, never ``Tuner(trainer)`` (deprecated); each trial reserves only its
driver bundle; the trial's ``TorchTrainer`` places its own workers. YAML search specs are turned into Tune
domains through a whitelist, never ``eval``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray.tune as tune
from ray.tune.execution.placement_groups import PlacementGroupFactory
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

from raycl.config import TuneSection, expand_values
from raycl.distributed import tracking, tune_state
from raycl.distributed.resources import driver_bundle
from raycl.distributed.training import has_checkpoint
from raycl.progress import bar, say
from raycl.records import TrialOutcome, is_done, read_history
from raycl.storage import ray_storage, remote_of


class _TrialProgress(tune.Callback):
    """One progress bar over the sweep's trials, with the best value of the metric so far."""

    def __init__(self, total: int, metric: str, mode: str, desc: str) -> None:
        self.total, self.desc = total, desc
        self.metric, self.sign = metric, (1.0 if mode == "max" else -1.0)
        self.best: float | None = None
        self._bar: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_bar": None}  # Tune pickles its run config; a terminal stream does not pickle

    @property
    def bar(self) -> Any:
        if self._bar is None:
            self._bar = bar(self.total, desc=self.desc, unit="trial")
        return self._bar

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        value = result.get(self.metric)
        if isinstance(value, (int, float)) and (self.best is None or self.sign * value > self.sign * self.best):
            self.best = float(value)
            self.bar.set_postfix({f"best {self.metric}": f"{self.best:.4f}"})

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.bar.update(1)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.bar.update(1)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self.bar.close()


def _count(param_space: dict[str, Any], num_samples: int) -> int:
    n = num_samples
    for v in param_space.values():
        if isinstance(v, dict) and "grid_search" in v:
            n *= len(v["grid_search"])
    return n


def resumed_line(path: Path, total: int, trials_dir: Path | None) -> str:
    """``resumed sweep: …``: what a restored experiment holds — trials that ended (in Tune's last snapshot, or
    marked done in ``trials_dir`` after it), interrupted ones (they continue from their last checkpoint), the
    rest."""
    from ray.tune import ExperimentAnalysis

    trials = ExperimentAnalysis(str(path)).trials
    ended = [t for t in trials if t.status == "TERMINATED" or (trials_dir and is_done(trials_dir / t.trial_id))]
    # a trial with a checkpoint is interrupted whatever its status: Tune's snapshot may predate its start (a Ray
    # Train trial's checkpoint is in Train's own snapshot; one trained in its trial's process, in Tune's)
    started = [
        t
        for t in trials
        if t not in ended
        and (
            t.status in ("RUNNING", "PAUSED", "ERROR")
            or t.checkpoint is not None
            or has_checkpoint(path.parent, trial_run_name(t.trial_id))
        )
    ]
    todo = max(total - len(ended) - len(started), 0)
    return (
        f"resumed sweep: {len(ended)} finished trials kept, {len(started)} interrupted trials continued from "
        f"their last checkpoint, {todo} trials still to run ({path})"
    )


def to_param_space(search: dict[str, dict[str, list[Any]]]) -> dict[str, Any]:
    """``{"loss.margin": {"qrange": [0.1, 1.0, 0.05]}}`` → Tune domains over the same dotted keys."""
    space: dict[str, Any] = {}
    for key, spec in search.items():
        kind, values = next(iter(spec.items()))
        if kind in ("grid", "qrange"):
            space[key] = tune.grid_search(expand_values(kind, values))
        elif kind == "choice":
            space[key] = tune.choice(values)
        elif kind == "uniform":
            space[key] = tune.uniform(*values)
        elif kind == "loguniform":
            space[key] = tune.loguniform(*values)
    return space


def grid(values: list[Any]) -> Any:
    """A grid dimension over ``values`` (every trial takes one)."""
    return tune.grid_search(list(values))


def trial_run_name(trial_id: str | None = None) -> str:
    """The stable Train run name of a trial, by default the current one (Ray's Train-in-Tune pattern: no
    timestamps, one per trial, so re-running a trial resumes its run)."""
    return f"train-trial_id={trial_id or tune.get_context().get_trial_id()}"


def report_again(history: list[dict[str, Any]]) -> None:
    """A trial that had ended when its driver died, after Tune's last snapshot of the sweep: its reports go to Tune
    again instead of training it again."""
    for row in history:
        tune.report(row)


def run_sweep(
    trial_fn: Callable[..., None],
    param_space: dict[str, Any],
    *,
    trial_kwargs: dict[str, Any],
    tune_cfg: TuneSection,
    name: str,
    storage_path: Path,
    max_t: int,
    resources: Any = None,
    trials_dir: Path | None = None,
) -> list[TrialOutcome]:
    """Run ``trial_fn(params, **trial_kwargs)`` for every point of ``param_space``; outcomes in trial order.

    ``trial_kwargs`` travel through the object store once (``tune.with_parameters``), not once per trial.
    ``resources``: each trial's reservation (a ``PlacementGroupFactory`` with the trial's miners); default:
    the driver's CPUs only. ``trials_dir``: where each trial writes ``<trial_id>/history.jsonl`` and, once it
    ended, ``done.json``.

    An experiment of the same ``name`` already in ``storage_path`` (its driver died) is restored with Tune's own
    restore: trials that ended are kept, interrupted and errored ones run again — their ``TorchTrainer``, under the
    same run name, continues from its last checkpoint —, and those not started yet run. On an object store, Tune
    goes through :func:`raycl.distributed.tune_state.guarded`: what it writes is recorded, and a restore reads only
    state that raycl recorded writing (or the user trusted), checked first.
    """
    scheduler = (
        ASHAScheduler(time_attr="training_iteration", max_t=max(max_t, 1), grace_period=tune_cfg.grace_period)
        if tune_cfg.scheduler == "asha"
        else FIFOScheduler()
    )
    trainable = tune.with_resources(
        tune.with_parameters(trial_fn, **trial_kwargs),
        resources or PlacementGroupFactory([driver_bundle(tune_cfg.driver_cpus)]),
    )
    where, filesystem = ray_storage(storage_path)  # a staged run's Ray storage is the object store itself
    path = f"{where.rstrip('/')}/{name}"
    total = _count(param_space, tune_cfg.num_samples)
    store = filesystem
    if filesystem is not None:  # what Tune writes is recorded; a restore reads only what was checked
        uri = f"{remote_of(storage_path)}/{name}"
        pinned = (
            tune_state.checked(filesystem, path, uri)
            if tune.Tuner.can_restore(path, storage_filesystem=filesystem)
            else None
        )
        store = tune_state.guarded(filesystem, path, uri, pinned)
    if tune.Tuner.can_restore(path, storage_filesystem=store):  # a driver died mid-sweep: Tune's restore
        say(
            resumed_line(Path(path), total, trials_dir)
            if filesystem is None
            else f"resumed sweep: continuing the experiment stored at {uri}"
        )
        tuner = tune.Tuner.restore(
            path,
            trainable,
            resume_unfinished=True,
            resume_errored=True,
            param_space=param_space,
            storage_filesystem=store,
        )
    else:
        tuner = tune.Tuner(
            trainable,
            param_space=param_space,
            tune_config=tune.TuneConfig(
                metric=tune_cfg.metric,
                mode=tune_cfg.mode,
                scheduler=scheduler,
                num_samples=tune_cfg.num_samples,
                max_concurrent_trials=tune_cfg.max_concurrent_trials,
            ),
            run_config=tune.RunConfig(
                name=name,
                storage_path=where,
                storage_filesystem=store,
                verbose=0,
                # a trial training in its own process (scaling.num_workers=0) checkpoints to Tune: its newest only,
                # as a Ray Train run keeps, and each one saves Tune's experiment snapshot at once, so that a sweep
                # whose driver died continues such a trial from it (Train's trials: from Train's own snapshot)
                checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                callbacks=[
                    _TrialProgress(total, tune_cfg.metric, tune_cfg.mode, name),
                    *tracking.sweep_callbacks(name),
                ],
            ),
        )
    grid = tuner.fit()
    outcomes = []
    for i in range(len(grid)):
        result = grid[i]
        frame = result.metrics_dataframe
        history = frame.to_dict("records") if frame is not None else []
        params = {k: v for k, v in (result.config or {}).items()}
        trial_id = str((result.metrics or {}).get("trial_id", Path(result.path).name))
        if trials_dir is not None and read_history(trials_dir / trial_id):
            history = read_history(trials_dir / trial_id)  # one row per report, also across a resumed driver
        outcomes.append(TrialOutcome(trial_id, params, history, repr(result.error) if result.error else None))
    # in the order of the sweep's points (a trial id ends in its index: <experiment>_00001), not Tune's order of
    # results, which a restored experiment changes: ties on the metric then pick the same best point in a run
    # resumed after its driver died as in an uninterrupted one
    return sorted(outcomes, key=lambda t: t.trial_id.rpartition("_")[2])
