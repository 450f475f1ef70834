"""A Ray Tune sweep whose trials each run a Ray Train ``TorchTrainer`` (the Train-in-Tune pattern of Ray 2.60).

``Tuner(trial_fn)`` with a function trial, never ``Tuner(trainer)`` (deprecated); each trial reserves only its
driver bundle; the trial's ``TorchTrainer`` places its own workers. YAML search specs are turned into Tune
domains through a whitelist, never ``eval``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray.tune as tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

from raycl.config import TuneSection, expand_values
from raycl.distributed import tracking
from raycl.storage import ray_storage


@dataclass
class TrialOutcome:
    """What the recipe needs from a finished trial: its point, every report it made, and any error."""

    trial_id: str
    params: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


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
            from tqdm.auto import tqdm

            self._bar = tqdm(total=self.total, desc=self.desc, unit="trial", file=sys.stderr, dynamic_ncols=True)
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


def trial_run_name() -> str:
    """The stable Train run name of the current trial (RAY_NOTES 2.2: no timestamps, one per trial)."""
    return f"train-trial_id={tune.get_context().get_trial_id()}"


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
) -> list[TrialOutcome]:
    """Run ``trial_fn(params, **trial_kwargs)`` for every point of ``param_space``; outcomes in trial order.

    ``trial_kwargs`` travel through the object store once (``tune.with_parameters``), not once per trial.
    ``resources``: each trial's reservation (a ``PlacementGroupFactory`` with the trial's miners); default:
    the driver's CPUs only.
    """
    scheduler = (
        ASHAScheduler(time_attr="training_iteration", max_t=max(max_t, 1), grace_period=tune_cfg.grace_period)
        if tune_cfg.scheduler == "asha"
        else FIFOScheduler()
    )
    where, filesystem = ray_storage(storage_path)  # a staged run's Ray storage is the object store itself
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(trial_fn, **trial_kwargs),
                            resources or {"cpu": tune_cfg.driver_cpus}),
        param_space=param_space,
        tune_config=tune.TuneConfig(
            metric=tune_cfg.metric,
            mode=tune_cfg.mode,
            scheduler=scheduler,
            num_samples=tune_cfg.num_samples,
            max_concurrent_trials=tune_cfg.max_concurrent_trials,
        ),
        run_config=tune.RunConfig(
            name=name, storage_path=where, storage_filesystem=filesystem, verbose=0,
            callbacks=[_TrialProgress(_count(param_space, tune_cfg.num_samples), tune_cfg.metric, tune_cfg.mode,
                                      name), *tracking.sweep_callbacks(name)],
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
        outcomes.append(TrialOutcome(trial_id, params, history, repr(result.error) if result.error else None))
    return outcomes
