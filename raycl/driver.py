"""The driver every recipe runs, read top to bottom: prepare → sweep → baselines → export → report.

``python -m raycl.tune SPACE`` is :func:`run_tune`, ``python -m raycl.train SPACE`` is :func:`run_train`; the
space's ``task:`` picks the :class:`Recipe` (``raycl.recipes.recipe_for``). A recipe supplies what differs — its
data, its base model, the :class:`Phase` of one training (its loop task, the model it starts from, where its
negatives come from), which trial is best and its report — and the driver owns the order and the bookkeeping of
a run: the run folder, ``config.yaml``, timings, the sweep, the baselines at the best point, the miners a phase
trains beside (:func:`run_phase`), the run's record (:class:`Run`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from raycl.config import MiningSection, Space, dump_yaml, set_dotted
from raycl.distributed.miner_pool import MinerFactory
from raycl.distributed.mining_service import MiningService, trial_resources
from raycl.distributed.nbest import SharedNBest, nbest_records, shared_nbest
from raycl.distributed.resources import MiningPlan as MiningPlan  # the recipes' plan, named here
from raycl.distributed.resources import waiting_line
from raycl.distributed.session import RaySession, TuneTrialSession
from raycl.distributed.sweep import grid, report_again, run_sweep, to_param_space, trial_run_name
from raycl.distributed.tracking import log_training
from raycl.distributed.training import fit, fit_in_trial, has_checkpoint
from raycl.errors import UserError
from raycl.miners.records import MinedNegatives
from raycl.miners.registry import MinerKind
from raycl.miners.sources import SourceSpec
from raycl.progress import follow, say
from raycl.records import TrialOutcome, atomic_write, is_done, mark_done, read_history
from raycl.report import RecipeReport, copy_atomic
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
    nbest: SharedNBest | None = None  # the run's shared pool while its trials train (GEC's n-best, mining.share)
    # a test's or benchmark's hooks on the trainers' loop (raycl.testing.loop_hooks: a crash switch); none in a run
    trainer_hooks: tuple[LoopHook, ...] = ()


@dataclass(frozen=True)
class TrainPoint:
    """One training of ``python -m raycl.train``: a trial folder name and its overrides."""

    trial_id: str
    overrides: dict[str, Any]


NBestRecords = dict[str, tuple[MinedNegatives, float]]  # the run pool's lists by example id: (n-best, S(s|s))


@dataclass(frozen=True)
class Miners:
    """Miners that run while a phase trains: a pool of ``kind`` on the phase's initial model, with the phase's own
    negative stream and weight store — or the run's pool (:class:`RunPool`) where it was mined with ``shared``."""

    kind: str | MinerKind
    options: dict[str, Any]  # the miner's own options, from the recipe's mining section
    mining: MiningSection  # the pool's placement, the stream's credits and leases
    seed: int
    # the job's negatives: ``source(stream=, store=)`` of its own miners, or ``source(nbest=)`` of the run's pool
    source: Callable[..., SourceSpec | None]
    keep: Callable[[list[MinedNegatives]], None] | None = None  # given what it trained on (newest per example)
    stats: str = ""  # the training folder's file that gets the stream's counts (none: "")
    shared: Shared | None = None  # the run's pool serves instead where it was mined with these options
    scratch: Path | None = None  # the miners' work folder: their per-version folders (``v*``) go when it ends


@dataclass(frozen=True)
class Shared:
    """When the run's pool (:class:`RunPool`) serves a phase instead of its own miners, and what it keeps of it."""

    decoding: dict[str, Any]  # the options its lists must have been mined with (GEC: beam, lengths)
    keep: Callable[[NBestRecords], None] | None = None  # given the pool's lists, once the phase trained


@dataclass(frozen=True)
class RunPool:
    """One miner pool for the whole run, mining ``examples`` with the base model while the first trials train
    (GEC's version-0 n-best, ``mining.share``); phases whose :attr:`Miners.shared` equals ``decoding`` read it."""

    kind: str | MinerKind
    options: dict[str, Any]
    mining: MiningSection  # the recipe's mining section (placement, credits, leases; GEC's decoding options)
    examples: Sequence[Any]
    decoding: dict[str, Any]


@dataclass(frozen=True)
class Phase:
    """One training as a recipe declares it and :func:`run_phase` runs it: the loop's task, the model it starts
    from (the base model, or what an earlier phase made), where its negatives come from. A recipe's phases: the
    base model's (``Recipe.base_model``, once a run: GEC's pretraining), then each training's (``phase``)."""

    name: str  # a base-model phase's folder under the run (``pretrain``)
    desc: str  # its progress bar's label
    task: Any  # the loop's Task (raycl.training.task)
    init: Path
    negatives: SourceSpec | Miners | None = None  # known before it starts, mined meanwhile, or none
    raises: bool = False  # a failed training fails its Tune trial (else the trial ends unfinished)


class Recipe(Protocol):
    """What a task gives the driver (``raycl/recipes/<task>/recipe.py``): 12 members, 16 before issue 43 (the
    sweep's space, ladder, train points, trial resources, export and the back-and-forth of ``shared`` and
    ``train_one`` became the driver's, from the recipe's declared groups, exports, phases and mining plan; the
    best trial and the report are its declared :class:`~raycl.report.RecipeReport`'s)."""

    task: str
    group_key: str | None  # a config key whose values are compared apart (idiom: data.setting), or None
    exports: tuple[str, ...]  # files of the best trial copied to the run folder

    @property
    def report(self) -> RecipeReport: ...  # which trial of a group is best; the run's tables, plots and files
    def with_data(self, cfg: Any, data_dir: Path) -> tuple[Any, list[str]]: ...
    def check_data(self, cfg: Any) -> dict[str, int]: ...
    def base_model(self, run: Run) -> Phase | None: ...
    def groups(self, space: Space) -> list[Any]: ...
    def phase(self, run: Run, cfg: Any, out_dir: Path) -> Phase: ...
    def max_t(self, run: Run) -> int: ...
    def mining_plan(self, cfg: Any, space: Space) -> MiningPlan: ...
    def run_pool(self, run: Run, space: Space) -> RunPool | None: ...


class RecipeBase:
    """Defaults of the optional parts of :class:`Recipe`: no groups, no exports, no miners."""

    group_key: str | None = None
    exports: tuple[str, ...] = ()

    def groups(self, space: Space) -> list[Any]:
        return []

    def mining_plan(self, cfg: Any, space: Space) -> MiningPlan:
        """The miners that run while ``cfg`` trains, if any, and whether one pool serves the whole run rather than
        each training its own (``raycl.distributed.resources``): none by default."""
        return MiningPlan()

    def run_pool(self, run: Run, space: Space) -> RunPool | None:
        return None


# ---------------------------------------------------------------------------------------------- one training
def fit_job(run: Run, cfg: Any, job: Job, *, name: str, in_tune: bool) -> Any:
    """One training (a ``TorchTrainer`` over the one loop; ``scaling.num_workers=0``: in-process, in a sweep in
    the trial's own process); Ray's Result."""
    # local mode would take a GPU it sees otherwise
    job = dataclasses.replace(job, use_gpu=cfg.scaling.use_gpu, hooks=run.trainer_hooks or job.hooks)
    publish(Path(job.init_model))  # a staged run: in the store before a worker on another node reads it
    if in_tune and cfg.scaling.num_workers == 0:  # the trial's own process is the one worker
        return fit_in_trial(functools.partial(loop.run, dataclasses.replace(job, session=TuneTrialSession())))
    return fit(
        functools.partial(loop.run, job),
        scaling=cfg.scaling,
        name=name,
        storage_path=run.run_dir / "ray",
        in_tune=in_tune,
    )


def run_phase(run: Run, cfg: Any, phase: Phase, out_dir: Path, *, name: str, in_tune: bool) -> Any:
    """A phase: its job, its miners started where it mines (or the run's pool read), the training, and what it
    keeps of its negatives; Ray's Result."""
    neg = phase.negatives
    job = functools.partial(Job, phase.task, str(phase.init), str(out_dir), session=RaySession())
    if not isinstance(neg, Miners):
        return fit_job(run, cfg, job(negatives=neg), name=name, in_tune=in_tune)
    if (pool := run.nbest) is not None and neg.shared is not None and pool.decoding == neg.shared.decoding:
        result = fit_job(run, cfg, job(negatives=neg.source(nbest=pool.stream)), name=name, in_tune=in_tune)
        if neg.shared.keep is not None:
            neg.shared.keep(nbest_records(pool.stream))
        return result
    factory = MinerFactory(neg.kind, str(phase.init), neg.options)
    with miners(factory, neg.mining, world_size=cfg.scaling.num_workers, seed=neg.seed) as service:
        negatives = neg.source(stream=service.stream, store=service.store)
        result = fit_job(run, cfg, job(negatives=negatives), name=name, in_tune=in_tune)
        if neg.keep is not None:
            neg.keep(service.negatives())
        if neg.stats:
            atomic_write(out_dir / neg.stats, json.dumps(service.stats()))
    for version in neg.scratch.glob("v*") if neg.scratch is not None else ():  # each weight version's work
        shutil.rmtree(version, ignore_errors=True)
    return result


def train(
    recipe: Recipe, run: Run, cfg: Any, out_dir: Path, *, name: str, in_tune: bool, desc: str | None = None
) -> Any:
    """One training of a point (a trial, or one of ``raycl.train``'s): the recipe's phase, run; Ray's Result.
    ``desc``: its progress line's label (else the phase's)."""
    phase = recipe.phase(run, cfg, out_dir)
    with follow(out_dir, desc=desc or phase.desc, lines_only=in_tune, waiting=waiting_line(cfg.scaling)):
        result = run_phase(run, cfg, phase, out_dir, name=name, in_tune=in_tune)
    if result.error is not None and phase.raises:
        raise result.error
    return result


@contextmanager
def miners(factory: MinerFactory, mining: MiningSection, *, world_size: int, seed: int) -> Iterator[MiningService]:
    """The miner pool, negative stream and weight store of one training; closed when it ends."""
    service = MiningService.start(factory, mining, world_size=max(world_size, 1), seed=seed)
    try:
        yield service
    finally:
        service.close()


@contextmanager
def run_pool(run: Run, pool: RunPool | None) -> Iterator[None]:
    """The run's one pool (:class:`RunPool`) while the sweep and the baselines train, ``run.nbest`` meanwhile."""
    if pool is None:
        yield
        return
    factory = MinerFactory(pool.kind, str(run.base_model), pool.options)
    with shared_nbest(
        factory,
        pool.mining,
        pool.examples,
        run.run_dir / "nbest",
        options=pool.decoding,
        model_dir=run.base_model,
        say=say,
    ) as stream:
        run.nbest = SharedNBest(stream, pool.decoding)
        try:
            yield
        finally:
            run.nbest = None  # the miners' own time is in nbest/meta.json and the report


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
    if (phase := recipe.base_model(run)) is not None:
        train_base(run, phase)
    push(run_dir)  # a staged run: the data, config and base model in the store before any worker reads them
    run.timings["prepare_s"] = time.perf_counter() - t0
    return run


def trial(
    params: dict[str, Any],
    *,
    recipe: Recipe,
    run: Run,
    baselines: dict[str, dict[str, Any]],
    points: dict[Any, dict[str, Any]],
) -> None:
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
    result = train(recipe, run, cfg, out_dir, name=run_name, in_tune=True, desc=f"trial {out_dir.name}")
    if result.error is None:
        mark_done(out_dir)


def sweep(
    recipe: Recipe,
    run: Run,
    space: Space,
    param_space: dict[str, Any],
    *,
    name: str,
    points: dict[Any, dict[str, Any]] | None = None,
    fifo: bool = False,
) -> list[TrialOutcome]:
    tune_cfg = dataclasses.replace(run.cfg.tune, scheduler="fifo") if fifo else run.cfg.tune
    plan = recipe.mining_plan(run.cfg, space)  # a trial reserves its own miners, unless the run's pool serves
    resources = trial_resources(run.cfg.tune.driver_cpus, None if plan.shared else plan.mining)
    return run_sweep(
        trial,
        param_space,
        trial_kwargs={"recipe": recipe, "run": run, "baselines": space.baselines, "points": points or {}},
        tune_cfg=tune_cfg,
        name=name,
        storage_path=run.run_dir / "ray",
        max_t=recipe.max_t(run),
        resources=resources,
        trials_dir=run.run_dir / "trials",
    )


def baselines(
    recipe: Recipe, run: Run, space: Space, best: dict[Any, TrialOutcome], names: list[str]
) -> list[TrialOutcome]:
    """The space's baselines (the paper's other table rows) at the best point of each group."""
    if not names or not best:
        return []
    if recipe.group_key is None:
        param_space, points = {**best[None].params, "baseline": grid(names)}, {}
    else:
        groups = list(best)
        param_space = {"baseline": grid(names), recipe.group_key: grid(groups)}
        points = {g: t.params for g, t in best.items()}
    say(
        f"baselines at the best point{'s of ' + ', '.join(map(str, best)) if recipe.group_key else ''}: "
        f"{', '.join(names)}"
    )
    return sweep(recipe, run, space, param_space, name="baselines", points=points, fifo=True)


# ---------------------------------------------------------------------------------------------- the verbs
def run_tune(recipe: Recipe, space: Space, run_dir: Path) -> dict[str, Any]:
    """``python -m raycl.tune``: prepare, sweep, baselines at the best point, export, report."""
    param_space = search_space(recipe, space)  # a bad search or ladder fails before any work
    names = ladder(space)
    run = prepare(recipe, space, run_dir)
    say(f"sweep over {', '.join(param_space) or 'the default point'}")
    with run_pool(run, recipe.run_pool(run, space)):
        t0 = time.perf_counter()
        trials = sweep(recipe, run, space, param_space, name="sweep")
        run.timings["sweep_s"] = time.perf_counter() - t0
        best = recipe.report.best(trials, run.cfg.tune.metric, run.cfg.tune.mode)
        t0 = time.perf_counter()
        extra = baselines(recipe, run, space, ladder_groups(recipe, run, best), names)
        if extra:
            run.timings["baselines_s"] = time.perf_counter() - t0
    export(recipe, run, best)
    return recipe.report.write_all(run, space, trials, extra)


def search_space(recipe: Recipe, space: Space) -> dict[str, Any]:
    """The search as Tune domains, with a grid over the recipe's groups unless the search names its key."""
    param_space = to_param_space(space.search)
    if recipe.group_key is not None and (groups := recipe.groups(space)) and recipe.group_key not in param_space:
        param_space[recipe.group_key] = grid(groups)
    return param_space


def ladder(space: Space) -> list[str]:
    """The baselines run after the sweep: a config's ``ladder.baselines`` (idiom), or all of the space's."""
    wanted = getattr(getattr(space.config, "ladder", None), "baselines", None) or []
    if unknown := [n for n in wanted if n not in space.baselines]:
        raise UserError(
            f"{space.source}: config key 'ladder.baselines': expected names among the space's "
            f"baselines ({', '.join(space.baselines) or 'none'}), got {unknown!r}"
        )
    return [n for n in space.baselines if not wanted or n in wanted]


def export(recipe: Recipe, run: Run, best: dict[Any, TrialOutcome]) -> None:
    """The recipe's ``exports`` of the chosen trial (GEC: negatives; STS: submissions), to the run's folder."""
    for name in recipe.exports if None in best else ():
        if (src := run.run_dir / "trials" / best[None].trial_id / name).exists():
            copy_atomic(src, run.run_dir / name)


def train_base(run: Run, phase: Phase) -> None:
    """A base-model phase (GEC's pretraining) in ``<run>/<name>``, its model moved to the run's base model."""
    work = run.run_dir / phase.name
    with follow(work, desc=phase.desc, waiting=waiting_line(run.cfg.scaling)):
        result = run_phase(run, run.cfg, phase, work, name=phase.name, in_tune=False)
    if result.error is not None or not (work / "model" / "config.json").exists():
        raise RuntimeError(f"{phase.name} did not produce a model: {result.error}")
    (work / "model").replace(run.base_model)


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
    key, groups = recipe.group_key, recipe.groups(space)
    points = [TrainPoint(str(g), {key: g}) for g in groups] if key and groups else [TrainPoint("train", {})]
    if existed:
        say(_resumed_line(run, points))
    with run_pool(run, recipe.run_pool(run, space)):
        trials = _train_points(recipe, run, points)
    run.timings["train_s"] = time.perf_counter() - t0
    tune = run.cfg.tune
    export(
        recipe, run, recipe.report.best(trials, tune.metric, tune.mode) if recipe.group_key else {None: trials[0]}
    )
    return recipe.report.write_all(run, space, trials, [])


def _run_name(point: TrainPoint) -> str:
    return f"train-{point.trial_id}".removesuffix("-train")


def _resumed_line(run: Run, points: list[TrainPoint]) -> str:
    """``resumed trainings: …`` (after the CLI's ``resumed run: DIR``): the trainings of an existing run folder
    that ended, those a checkpoint continues, the rest (local mode, ``scaling.num_workers=0``, keeps no
    checkpoint: its interrupted training starts over)."""
    ended = [p for p in points if is_done(run.run_dir / "trials" / p.trial_id)]
    started = [p for p in points if p not in ended and has_checkpoint(run.run_dir / "ray", _run_name(p))]
    return (
        f"resumed trainings: {len(ended)} finished trainings kept, {len(started)} interrupted "
        f"trainings continued from their last checkpoint, {len(points) - len(ended) - len(started)} trainings "
        "still to run"
    )


def _train_points(recipe: Recipe, run: Run, points: list[TrainPoint]) -> list[TrialOutcome]:
    trials: list[TrialOutcome] = []
    for point in points:
        out_dir = run.run_dir / "trials" / point.trial_id
        if not is_done(out_dir):
            cfg = set_dotted(run.cfg, point.overrides, where="train") if point.overrides else run.cfg
            out_dir.mkdir(parents=True, exist_ok=True)
            dump_yaml(cfg, out_dir / "config.yaml")  # the training's resolved config (its params in --track)
            result = train(
                recipe,
                run,
                cfg,
                out_dir,
                name=_run_name(point),
                in_tune=False,
                desc=point.trial_id if point.overrides else None,
            )
            if result.error is not None:
                log_training(point.trial_id, out_dir, failed=True)
                raise result.error
            mark_done(out_dir)
        log_training(point.trial_id, out_dir)  # a tracked run: the training's params, reports and records
        trials.append(TrialOutcome(point.trial_id, dict(point.overrides), read_history(out_dir)))
    return trials
