"""The driver every recipe runs, read top to bottom: prepare → sweep → baselines → export → report.

``python -m raycl.tune SPACE`` is :func:`run_tune`, ``python -m raycl.train SPACE`` is :func:`run_train`; the
space's ``task:`` picks the :class:`Recipe` (``raycl.recipes.recipe_for``). A recipe supplies what differs — its
data, its base model, how one point trains (a ``TorchTrainer`` over :func:`raycl.training.loop.run`), which trial
is best, what it exports and its report — and the driver owns the order and the bookkeeping of a run: the run
folder, ``config.yaml``, timings, the sweep, the baselines at the best point, the run's record (:class:`Run`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from raycl.config import MiningSection, Space, dump_yaml, set_dotted
from raycl.distributed.miner_pool import MinerFactory
from raycl.distributed.mining_service import MiningService
from raycl.distributed.nbest import SharedNBest
from raycl.distributed.resources import MiningPlan, waiting_line
from raycl.distributed.sweep import grid, report_again, run_sweep, to_param_space, trial_run_name
from raycl.distributed.tracking import log_training
from raycl.distributed.trainer import fit, has_checkpoint
from raycl.progress import follow, say
from raycl.records import TrialOutcome, is_done, mark_done, read_history
from raycl.report import best_trial
from raycl.storage import publish, push
from raycl.training import loop
from raycl.training.task import Job, LoopHook


@dataclass
class Run:
    """What every trial of a run shares: the resolved config, the run folder, the base model, the data."""

    cfg: Any
    run_dir: Path
    base_model: Path
    builtin: list[str]  # the data keys filled with the built-in corpus
    counts: dict[str, int]  # examples per split, as read by the driver
    timings: dict[str, float] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)  # the recipe's other shared artefacts
    nbest: SharedNBest | None = None  # the run's shared n-best while its trials train (GEC, mining.share)
    trials_mine: bool = False  # some training of the run starts its own miners (its trials reserve them)
    # a test's or benchmark's hooks on the trainers' loop (raycl.testing.loop_hooks: a crash switch); none in a run
    trainer_hooks: tuple[LoopHook, ...] = ()


@dataclass(frozen=True)
class TrainPoint:
    """One training of ``python -m raycl.train``: a trial folder name, its overrides, its progress bar's label."""

    trial_id: str
    overrides: dict[str, Any]
    desc: str


class Recipe(Protocol):
    """What a task gives the driver (``raycl/recipes/<task>/recipe.py``)."""

    task: str
    group_key: str | None  # a config key whose values are compared apart (idiom: data.setting), or None

    def with_data(self, cfg: Any, data_dir: Path) -> tuple[Any, list[str]]: ...
    def check_data(self, cfg: Any) -> dict[str, int]: ...
    def base_model(self, run: Run) -> None: ...
    def search_space(self, space: Space, cfg: Any) -> dict[str, Any]: ...
    def ladder(self, space: Space, cfg: Any) -> list[str]: ...
    def train_points(self, run: Run) -> list[TrainPoint]: ...
    def shared(self, run: Run, space: Space) -> AbstractContextManager[Any]: ...
    def train_one(self, run: Run, cfg: Any, out_dir: Path, *, name: str, in_tune: bool) -> Any: ...
    def max_t(self, run: Run) -> int: ...
    def trial_resources(self, run: Run) -> Any: ...
    def mining_plan(self, cfg: Any, space: Space) -> MiningPlan: ...
    def best(self, trials: list[TrialOutcome], cfg: Any) -> dict[Any, TrialOutcome]: ...
    def export(self, run: Run, best: dict[Any, TrialOutcome]) -> None: ...
    def write_report(self, run: Run, space: Space, trials: list[TrialOutcome], extra: list[TrialOutcome]
                     ) -> dict[str, Any]: ...  # fmt: skip


class RecipeBase:
    """Defaults of the optional parts of :class:`Recipe`."""

    group_key: str | None = None

    def search_space(self, space: Space, cfg: Any) -> dict[str, Any]:
        return to_param_space(space.search)

    def ladder(self, space: Space, cfg: Any) -> list[str]:
        return list(space.baselines)

    def train_points(self, run: Run) -> list[TrainPoint]:
        return [TrainPoint("train", {}, "train")]

    def shared(self, run: Run, space: Space) -> AbstractContextManager[Any]:
        """What every training of the run shares while the sweep and baselines run (GEC: the mined n-best)."""
        return nullcontext()

    def trial_resources(self, run: Run) -> Any:
        return None

    def mining_plan(self, cfg: Any, space: Space) -> MiningPlan:
        """The miners that run while ``cfg`` trains, if any, and whether one pool serves the whole run rather than
        each training its own (``raycl.distributed.resources``): none by default."""
        return MiningPlan()

    def best(self, trials: list[TrialOutcome], cfg: Any) -> dict[Any, TrialOutcome]:
        best = best_trial(trials, metric=cfg.tune.metric, mode=cfg.tune.mode)
        return {} if best is None else {None: best}

    def export(self, run: Run, best: dict[Any, TrialOutcome]) -> None:
        pass


# ---------------------------------------------------------------------------------------------- one training
def fit_job(run: Run, cfg: Any, job: Job, *, name: str, in_tune: bool) -> Any:
    """One training (a ``TorchTrainer`` over the one loop; ``scaling.num_workers=0``: in-process); Ray's Result."""
    job = dataclasses.replace(job, use_gpu=cfg.scaling.use_gpu,  # local mode would take a GPU it sees otherwise
                              hooks=run.trainer_hooks or job.hooks)  # fmt: skip
    publish(Path(job.init_model))  # a staged run: in the store before a worker on another node reads it
    return fit(functools.partial(loop.run, job), scaling=cfg.scaling, name=name, storage_path=run.run_dir / "ray",
               in_tune=in_tune)  # fmt: skip


@contextmanager
def miners(factory: MinerFactory, mining: MiningSection, *, world_size: int, seed: int) -> Iterator[MiningService]:
    """The miner pool, negative stream and weight store of one training; closed when it ends."""
    service = MiningService.start(factory, mining, world_size=max(world_size, 1), seed=seed)
    try:
        yield service
    finally:
        service.close()


# ---------------------------------------------------------------------------------------------- steps
def check_inputs(recipe: Recipe, space: Space, run_dir: Path) -> None:
    """Before Ray starts (``raycl.cli``): every data file of the run is read once; a bad one ends in one line."""
    cfg, _ = recipe.with_data(space.config, run_dir / "data")
    recipe.check_data(cfg)


def prepare(recipe: Recipe, space: Space, run_dir: Path) -> Run:
    """The run folder: resolved data (built-in where empty), every file read, ``config.yaml``, the base model."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg, builtin = recipe.with_data(space.config, run_dir / "data")
    counts = recipe.check_data(cfg)  # every file is read before anything is said or run: a bad one ends here
    if builtin:
        say(f"built-in data for {', '.join(builtin)} (written to {run_dir / 'data'})")
    say("data: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    dump_yaml(cfg, run_dir / "config.yaml")
    run = Run(cfg, run_dir, run_dir / "base_model", builtin, counts)
    t0 = time.perf_counter()
    recipe.base_model(run)
    push(run_dir)  # a staged run: the data, config and base model in the store before any worker reads them
    run.timings["prepare_s"] = time.perf_counter() - t0
    return run


def trial(params: dict[str, Any], *, recipe: Recipe, run: Run, baselines: dict[str, dict[str, Any]],
          points: dict[Any, dict[str, Any]]) -> None:  # fmt: skip
    """One Tune trial: the space's point, or a named baseline's overrides at its group's best point."""
    over = dict(params)
    name = over.pop("baseline", None)
    if name is not None:
        group = over.get(recipe.group_key) if recipe.group_key else None
        over = {**points.get(group, {}), **over, **baselines[name]}
    cfg = set_dotted(run.cfg, over, where="trial")
    run_name = trial_run_name()
    out_dir = run.run_dir / "trials" / run_name.split("=", 1)[-1]
    if is_done(out_dir):  # it ended after the sweep's last snapshot, before its driver died: not trained again
        report_again(read_history(out_dir))
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    dump_yaml(cfg, out_dir / "config.yaml")  # the trial's resolved config (its params in --track)
    with follow(out_dir, desc=f"trial {out_dir.name}", lines_only=True,  # a log's lines (a trial has no terminal)
                waiting=waiting_line(cfg.scaling)):
        result = recipe.train_one(run, cfg, out_dir, name=run_name, in_tune=True)
    if result.error is None:
        mark_done(out_dir)


def sweep(recipe: Recipe, run: Run, space: Space, param_space: dict[str, Any], *, name: str,
          points: dict[Any, dict[str, Any]] | None = None, fifo: bool = False) -> list[TrialOutcome]:  # fmt: skip
    tune_cfg = dataclasses.replace(run.cfg.tune, scheduler="fifo") if fifo else run.cfg.tune
    return run_sweep(trial, param_space, trial_kwargs={"recipe": recipe, "run": run, "baselines": space.baselines,
                                                      "points": points or {}},
                     tune_cfg=tune_cfg, name=name, storage_path=run.run_dir / "ray", max_t=recipe.max_t(run),
                     resources=recipe.trial_resources(run), trials_dir=run.run_dir / "trials")  # fmt: skip


def baselines(recipe: Recipe, run: Run, space: Space, best: dict[Any, TrialOutcome], names: list[str]
              ) -> list[TrialOutcome]:  # fmt: skip
    """The space's baselines (the paper's other table rows) at the best point of each group."""
    if not names or not best:
        return []
    if recipe.group_key is None:
        param_space, points = {**best[None].params, "baseline": grid(names)}, {}
    else:
        groups = list(best)
        param_space = {"baseline": grid(names), recipe.group_key: grid(groups)}
        points = {g: t.params for g, t in best.items()}
    say(f"baselines at the best point{'s of ' + ', '.join(map(str, best)) if recipe.group_key else ''}: "
        f"{', '.join(names)}")
    return sweep(recipe, run, space, param_space, name="baselines", points=points, fifo=True)


# ---------------------------------------------------------------------------------------------- the verbs
def run_tune(recipe: Recipe, space: Space, run_dir: Path) -> dict[str, Any]:
    """``python -m raycl.tune``: prepare, sweep, baselines at the best point, export, report."""
    param_space = recipe.search_space(space, space.config)  # a bad search or ladder fails before any work
    names = recipe.ladder(space, space.config)
    run = prepare(recipe, space, run_dir)
    say(f"sweep over {', '.join(param_space) or 'the default point'}")
    with recipe.shared(run, space):
        t0 = time.perf_counter()
        trials = sweep(recipe, run, space, param_space, name="sweep")
        run.timings["sweep_s"] = time.perf_counter() - t0
        best = recipe.best(trials, run.cfg)
        t0 = time.perf_counter()
        extra = baselines(recipe, run, space, ladder_groups(recipe, run, best), names)
        if extra:
            run.timings["baselines_s"] = time.perf_counter() - t0
    recipe.export(run, best)
    return recipe.write_report(run, space, trials, extra)


def ladder_groups(recipe: Recipe, run: Run, best: dict[Any, TrialOutcome]) -> dict[Any, TrialOutcome]:
    """The groups whose best points get the baselines: all, or those a recipe's ``ladder.settings`` names."""
    wanted = getattr(getattr(run.cfg, "ladder", None), "settings", None)
    return {g: t for g, t in best.items() if not wanted or g in wanted}


def run_train(recipe: Recipe, space: Space, run_dir: Path) -> dict[str, Any]:
    """``python -m raycl.train``: prepare, then each of the recipe's trainings at the default point, report. An
    existing run folder is resumed: trainings that ended are kept, an interrupted one continues from its last
    checkpoint."""
    existed = (run_dir / "config.yaml").exists()
    run = prepare(recipe, space, run_dir)
    t0 = time.perf_counter()
    points = recipe.train_points(run)
    if existed:
        say(_resumed_line(run, points))
    with recipe.shared(run, space):
        trials = _train_points(recipe, run, points)
    run.timings["train_s"] = time.perf_counter() - t0
    recipe.export(run, recipe.best(trials, run.cfg) if recipe.group_key else {None: trials[0]})
    return recipe.write_report(run, space, trials, [])


def _run_name(point: TrainPoint) -> str:
    return f"train-{point.trial_id}".removesuffix("-train")


def _resumed_line(run: Run, points: list[TrainPoint]) -> str:
    """``resumed trainings: …`` (after the CLI's ``resumed run: DIR``): the trainings of an existing run folder
    that ended, those a checkpoint continues, the rest (local mode, ``scaling.num_workers=0``, keeps no
    checkpoint: its interrupted training starts over)."""
    ended = [p for p in points if is_done(run.run_dir / "trials" / p.trial_id)]
    started = [p for p in points if p not in ended and has_checkpoint(run.run_dir / "ray", _run_name(p))]
    return (f"resumed trainings: {len(ended)} finished trainings kept, {len(started)} interrupted "
            f"trainings continued from their last checkpoint, {len(points) - len(ended) - len(started)} trainings "
            "still to run")


def _train_points(recipe: Recipe, run: Run, points: list[TrainPoint]) -> list[TrialOutcome]:
    trials: list[TrialOutcome] = []
    for point in points:
        out_dir = run.run_dir / "trials" / point.trial_id
        if not is_done(out_dir):
            cfg = set_dotted(run.cfg, point.overrides, where="train") if point.overrides else run.cfg
            out_dir.mkdir(parents=True, exist_ok=True)
            dump_yaml(cfg, out_dir / "config.yaml")  # the training's resolved config (its params in --track)
            with follow(out_dir, desc=point.desc, waiting=waiting_line(cfg.scaling)):
                result = recipe.train_one(run, cfg, out_dir, name=_run_name(point), in_tune=False)
            if result.error is not None:
                log_training(point.trial_id, out_dir, failed=True)
                raise result.error
            mark_done(out_dir)
        log_training(point.trial_id, out_dir)  # a tracked run: the training's params, reports and records
        trials.append(TrialOutcome(point.trial_id, dict(point.overrides), read_history(out_dir)))
    return trials
