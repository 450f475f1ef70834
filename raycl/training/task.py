"""The task API of the one training loop (:mod:`raycl.training.loop`): what a recipe gives it and what it hands
back.

A recipe's side of the loop is a :class:`Task` (``raycl/recipes/<task>/worker.py``; :class:`TaskBase` holds the
defaults of its optional parts). It builds a :class:`TrainState` (what a checkpoint holds), hands over each
epoch's :class:`Batch` es in an :class:`Epoch`, runs a step through a :class:`StepContext`, and evaluates at a
:class:`Report`, naming the model to :class:`Keep`. What crosses into a Ray Train worker is one frozen
:class:`Job`; the loop tells the task where it runs with a :class:`Worker`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import nn

from raycl.miners.sources import SourceSpec
from raycl.training.checkpoint import seed_everything
from raycl.training.precision import Precision
from raycl.training.prefetch import Call
from raycl.training.timing import Window

if TYPE_CHECKING:
    from raycl.training.session import TrainSession


@dataclass(frozen=True)
class LoopSettings:
    """The loop's knobs, taken from a recipe's ``optim`` section (:meth:`from_options`)."""

    precision: str = "fp32"  # fp32 | bf16 | fp16
    update_freq: int = 1  # batches whose gradients are summed into one optimizer update
    clip_norm: float = 0.0  # 0 = no clipping
    tf32: bool = True  # TF32 matmuls on GPUs that have them
    seed: int = 1
    ddp: bool = False  # forward through DDP (several workers) instead of summing gradients after the backward
    find_unused_parameters: bool = False  # DDP: only for models with parameters a step may not use
    fp16_init_scale: float = 2.0**16  # fp16's first loss scale (lower for losses summed over tokens)
    prefetch: int = 2  # batches collated ahead in a background thread (0: in the step's thread, one at a time)
    compile: bool = False  # torch.compile the forward of the task's modules (``Task.compiled_modules``)
    compile_mode: str = "default"  # torch.compile's mode (inductor): default | reduce-overhead | max-autotune
    compile_backend: str = "inductor"  # torch.compile's backend (aot_eager: no code generation, for tests)
    shape_bucket: int = 16  # compiled: batch lengths padded up to multiples of this (a few shapes recur)

    @classmethod
    def from_options(cls, o: Any, **overrides: Any) -> LoopSettings:
        """The settings of an ``optim`` section (:class:`raycl.config.LoopOptions` and whatever else of the loop's
        it has: ``clip_norm``, ``seed``), with a recipe's own ``overrides``."""
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{**{n: getattr(o, n) for n in names if hasattr(o, n)}, **overrides})

    @property
    def pad_to_multiple_of(self) -> int | None:
        """What a collate pads a batch's lengths up to a multiple of: ``shape_bucket`` when the forward is compiled
        (each new shape compiles once), else None (the batch's own longest)."""
        return self.shape_bucket if self.compile else None


@dataclass(frozen=True)
class Batch:
    """One micro-batch of an epoch; its gradients update ``state.optimizers[optimizer]``. ``data`` is what the
    task's ``collate`` turns into tensors (off the step's thread); ``progress``: the task's position after this
    batch, written into ``state.progress`` when the loop takes the batch (a checkpoint then holds it)."""

    data: Any
    optimizer: int = 0
    ends_step: bool = True  # False: a micro-batch of another optimizer follows in the same step (alternation)
    progress: dict[str, Any] | None = None


@dataclass
class Epoch:
    """What a task hands the loop for one epoch: this rank's batches (from the position the loop gave), when to
    report within it, and what its reports carry."""

    batches: Iterable[Batch | Call]
    eval_every: int = 0  # updates (steps) of this epoch between reports; 0: none within the epoch
    report_at_end: bool = True  # a report at the epoch's end (the end of training always has one)
    info: dict[str, Any] = field(default_factory=dict)  # Report.info of this epoch's reports (a phase, a setting)


@dataclass(frozen=True)
class Report:
    """A point where the loop reports (evaluate, keep the best, checkpoint)."""

    info: dict[str, Any] = field(default_factory=dict)  # the epoch's info, and ``epoch_end`` / ``last``
    checkpoint: bool = True


@dataclass(frozen=True)
class Keep:
    """Which model a report may keep: the best ``metric`` (higher is better) within ``scope``, in ``folder``.
    The first report of a scope always keeps its model (earliest on ties, as the released loops' ``>``)."""

    metric: str
    folder: str
    scope: str = ""


@dataclass(frozen=True)
class Stage:
    """A stretch of one training's epochs that starts afresh — its own seed, data, optimizers and schedule — as
    sentence-transformers' ``fit`` calls made one after the other (STS: pre-training, then each fine-tuning fit).
    A task declares its stages (:meth:`TaskBase.stages`); :class:`TaskBase` runs them in order."""

    name: str  # what the task's reports name it by (STS: the setting, the scope of the model it keeps)
    epochs: int
    eval_every: int = 0  # updates of an epoch between reports (the epoch's end reports too)
    seed: int = 1  # seeded as the stage starts


def updates_in(batches: Sequence[int], update_freq: int) -> int:
    """The optimizer updates of epochs of ``batches[e]`` batches each (the most any rank has: the others join its
    updates): an epoch's end flushes a partial accumulation, so ⌈batches / update_freq⌉ an epoch. The one count of
    a schedule's total, given to the schedule and the progress bar."""
    return sum(math.ceil(b / update_freq) for b in batches)


@dataclass
class TrainState:
    """What a checkpoint holds. ``extras``: objects with ``state_dict``/``load_state_dict`` (queue, EMA, momentum
    encoder); those that are modules follow the model's train/eval mode. ``progress``: the loop's position (epoch,
    batch, step, report, best) and the task's own keys. ``total_updates``: the schedule's total
    (:func:`updates_in`), computed once by the task's ``build``; the progress bar counts to it."""

    model: Any  # an nn.Module with save_pretrained (the recipe's own type)
    optimizers: list[torch.optim.Optimizer]
    schedulers: list[Any]  # one per optimizer (None: not stepped per update)
    progress: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)
    per_rank: tuple[str, ...] = ()  # extras that differ between ranks (a queue of its own keys), saved per rank
    total_updates: int = 0
    epochs: int = 1  # the epochs the loop runs (0: none; its one report evaluates the initial model)
    # where the negatives come from (raycl.training.negatives.NegativeSource; None: none). The loop owns its
    # lifecycle: resumed from ``progress["feed"]``, told of every update, its metrics and state in every report
    source: Any = None
    evals: Any = None  # rank 0's evaluator (:meth:`TaskBase.start`); None on the other ranks

    def modules(self) -> list[nn.Module]:
        return [self.model, *(m for m in self.extras.values() if isinstance(m, nn.Module))]

    def train(self, mode: bool = True) -> None:
        for m in self.modules():
            m.train(mode)


@dataclass
class Worker:
    """This worker's place: rank, device, precision, the run's folder, and the job it runs."""

    rank: int
    world_size: int
    device: torch.device
    precision: Precision
    out_dir: Path
    job: Job

    @property
    def session(self) -> TrainSession:
        """What this worker asks of the system it runs on (Ray Train's, in a run)."""
        return self.job.train_session()


class Task(Protocol):
    """A recipe's side of the loop (``raycl/recipes/<task>/worker.py``). The loop owns the epochs and the position
    in them; the task hands over each epoch's batches (``epoch``), turns a batch into tensors on the CPU
    (``collate``, run ahead in a background thread) and runs a step on them (``step``, on the device).
    ``shown``: the metrics of a report that rank 0's progress line shows (the recipe's dev score).

    16 hooks (``settings`` and 15 methods), 18 before issue 43, of which a task deriving from :class:`TaskBase`
    must write 3 (``build``, ``epoch``, ``step``; 7 before its defaults took ``settings``, ``load_model``,
    ``metrics`` and ``evaluate``). The epochs to run are the state's (``epochs``,
    set by ``build``) instead of ``num_epochs``; ``end_epoch`` went (a task resets its own position when an
    epoch starts at its first batch); the negative source's lifecycle (resume, updates, state, metrics) is the
    loop's (``TrainState.source``), no longer each task's ``start``/``after_update``/``metrics``."""

    settings: LoopSettings
    shown: ClassVar[tuple[str, ...]]

    def load_model(self, path: Path) -> nn.Module: ...
    def build(self, model: nn.Module, w: Worker, progress: dict[str, Any] | None) -> TrainState: ...
    def start(self, st: TrainState, w: Worker, *, resumed: bool) -> None: ...
    def epoch(self, st: TrainState, w: Worker, epoch: int, start: int) -> Epoch: ...
    def collate(self, st: TrainState, data: Any) -> Any: ...
    def step(self, st: TrainState, data: Any, ctx: StepContext) -> dict[str, Any]: ...
    def before_update(self, st: TrainState) -> None: ...
    def after_update(self, st: TrainState) -> None: ...
    def metrics(self, st: TrainState, window: Window, rep: Report, w: Worker) -> dict[str, Any]: ...
    def evaluate(self, st: TrainState, rep: Report, w: Worker) -> dict[str, Any]: ...
    def keep(self, rep: Report, metrics: dict[str, Any]) -> Keep | None: ...
    def on_best(self, st: TrainState, rep: Report, w: Worker) -> dict[str, Any]: ...
    def save_model(self, st: TrainState, folder: Path, *, kept: bool) -> None: ...
    def final(self, st: TrainState, w: Worker) -> dict[str, Any] | None: ...
    def compiled_modules(self, st: TrainState) -> list[nn.Module]: ...


class TaskBase:
    """Defaults for the parts of :class:`Task` where recipes agree, driven by a few class attributes, so that a
    worker writes only the hooks it differs in (``build``, ``epoch``, ``step`` at least):

    - ``settings``: the loop's knobs from the config's ``optim`` section (a task with its own overrides of them —
      a seed, DDP, a first fp16 loss scale — gives the property itself);
    - ``load_model``: ``model_class.from_pretrained(path)``;
    - ``start``: rank 0's ``evaluator(cfg)`` in ``state.evals`` (no ``evaluator``: none);
    - ``metrics``: the interval's mean step outputs (or its ``ratios``) and the epoch;
    - ``evaluate``: ``state.evals.dev(model)``, the dev scores;
    - ``keep``: the best model by the dev metric ``kept`` (higher is better) in ``best_model/`` (``kept`` empty:
      none is kept).

    A task of several :class:`Stage` s names them (``stages``) and starts each (``start_stage``); its ``build``
    calls :meth:`build_stages` and its ``epoch`` :meth:`enter_stage`.
    """

    cfg: Any  # the recipe's typed config (a field of the task's dataclass)
    shown: ClassVar[tuple[str, ...]] = ()
    model_class: ClassVar[Any] = None  # a class with ``from_pretrained(path)``
    evaluator: ClassVar[Any] = None  # a class built from the config on rank 0, with ``dev(model)``
    kept: ClassVar[str] = ""  # the metric the kept model is the best by
    # metric → (step output, step output): reported as the interval's sum of the one ÷ the other's (a loss per
    # token: the summed losses ÷ the tokens) instead of every output's mean per batch (Window.means)
    ratios: ClassVar[dict[str, tuple[str, str]]] = {}

    @property
    def settings(self) -> LoopSettings:
        return LoopSettings.from_options(self.cfg.optim)

    def load_model(self, path: Path) -> nn.Module:
        return self.model_class.from_pretrained(path)  # type: ignore[no-any-return]

    def start(self, st: Any, w: Worker, *, resumed: bool) -> None:
        st.evals = self.evaluator(self.cfg) if self.evaluator is not None and w.rank == 0 else None

    def collate(self, st: Any, data: Any) -> Any:
        return data

    def before_update(self, st: Any) -> None:
        pass

    def after_update(self, st: Any) -> None:
        pass

    def metrics(self, st: Any, window: Window, rep: Report, w: Worker) -> dict[str, Any]:
        return {**window.means(self.ratios), "epoch": st.progress["epoch"]}

    def evaluate(self, st: Any, rep: Report, w: Worker) -> dict[str, Any]:
        assert st.evals is not None, "rank 0 evaluates with the evaluator its start built"
        return dict(st.evals.dev(st.model))

    def keep(self, rep: Report, metrics: dict[str, Any]) -> Keep | None:
        return Keep(self.kept, "best_model") if self.kept else None

    def on_best(self, st: Any, rep: Report, w: Worker) -> dict[str, Any]:
        return {}

    def save_model(self, st: Any, folder: Path, *, kept: bool) -> None:
        """``kept``: the best model of a scope (else a checkpoint's ``model/``)."""
        st.model.save_pretrained(folder)

    def final(self, st: Any, w: Worker) -> dict[str, Any] | None:
        return None

    def compiled_modules(self, st: Any) -> list[nn.Module]:
        """``optim.compile``: the modules whose forward is compiled (in place: their state dicts keep their
        names)."""
        return [st.model]

    def kept_or_initial(self, w: Worker, folder: str, *, trained: bool, scope: str = "") -> Path:
        """The model a report kept in the run's ``folder`` (:class:`Keep`), or the initial model where none was
        ``trained`` to keep (0 epochs). Rank 0 keeps it in the run folder: a rank that cannot see it there must
        not go on from the initial model."""
        path = w.out_dir / folder
        if (path / "config.json").exists():
            return path
        if trained:
            raise RuntimeError(
                f"{path}: the model that {scope or 'training'} kept is not there on rank {w.rank} (the run "
                "folder must be on a file system every worker shares; see docs/cluster.md: a "
                "cluster without a shared file system)"
            )
        return Path(w.job.init_model)

    # ------------------------------------------------------------------------------------------ stages
    def stages(self) -> Sequence[Stage]:
        """The training's stages in order (:class:`Stage`); none: one stretch of ``state.epochs`` epochs."""
        return ()

    def start_stage(self, st: Any, w: Worker, k: int, *, resumed: bool) -> None:
        """Stage ``k`` starts: its data, fresh optimizers and schedules. ``resumed``: a checkpoint's stage goes on
        (the loop then restores the model's, the optimizers' and the schedules' states)."""

    def build_stages(self, st: Any, w: Worker) -> None:
        """A staged ``build``: the epochs to run (every stage's, one after the other) and a checkpoint's stage
        started again. Its position is the state's ``progress["stage"]`` and ``["started"]``."""
        st.epochs = sum(s.epochs for s in self.stages())
        p = st.progress
        p.setdefault("stage", p.pop("fit", 0))  # a checkpoint written before stages named STS's fit "fit"
        p.setdefault("started", False)
        if p["started"]:
            self.start_stage(st, w, p["stage"], resumed=True)

    def enter_stage(self, st: Any, w: Worker, epoch: int) -> tuple[Stage, int]:
        """The stage of the loop's ``epoch`` and the epoch's number within it; a stage's first epoch starts it:
        its seed, then :meth:`start_stage`."""
        stages = self.stages()
        k, e = [(k, e) for k, s in enumerate(stages) for e in range(s.epochs)][epoch]
        p = st.progress
        if p["stage"] != k or not p["started"]:
            seed_everything(stages[k].seed)
            self.start_stage(st, w, k, resumed=False)
            p.update(stage=k, started=True)
        return stages[k], e


class LoopHook(Protocol):
    """Something a :class:`Job` carries into every worker that watches the loop from outside the product: the
    test suite's and benchmarks' crash switches and state probes (``raycl.testing``). Picklable (it crosses into
    the Ray Train worker with the job)."""

    def after_step(self, step: int, w: Worker) -> None:
        """After the ``step``-th optimizer update (the first optimizer's)."""

    def at_end(self, state: dict[str, Any], w: Worker) -> None:
        """Once training and the closing report are done: the loop's whole state (``state.pt``'s keys and the
        model's weights, on the CPU)."""


@dataclass(frozen=True)
class Job:
    """What crosses into a Ray Train worker: the task (with its typed config) and where things are."""

    task: Any  # a Task; typed loosely so that recipes' task classes need not subclass the Protocol
    init_model: str
    out_dir: str
    negatives: SourceSpec | None = None  # where negatives come from (raycl.training.negatives); None: the config's
    use_gpu: bool = True  # False: the CPU even where Ray's local mode (0 workers) would hand out a GPU
    hooks: tuple[LoopHook, ...] = ()  # watchers from outside the product (tests, benchmarks); none in a run
    session: TrainSession | None = (
        None  # rank, device, reports, checkpoints, negative sources: Ray Train's in a run
    )

    def train_session(self) -> TrainSession:
        if self.session is None:
            raise ValueError(
                "Job.session: the job has no training session (the driver puts Ray Train's in every job: "
                "raycl.distributed.session.RaySession)"
            )
        return self.session


class StepContext:
    """What a task's step uses: the module to run forward passes through, the device, and ``backward``."""

    def __init__(self, module: nn.Module, device: torch.device, scaler: torch.amp.GradScaler | None) -> None:
        self.module, self.device, self.scaler = module, device, scaler
        self.weight = 0.0

    def backward(self, loss: torch.Tensor, *, weight: float = 1.0) -> None:
        """Backward of ``loss × weight`` (the micro-batch's summed loss); the update divides by the global
        weight. A rank's empty share of a global batch passes a constant loss and weight 0: nothing to
        backpropagate, but it takes part in the update."""
        self.weight += weight
        if not loss.requires_grad:
            return
        scaled = loss * weight
        (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()

    def loss_scale(self, weight: float = 1.0) -> float:
        """The factor a task's own extra backward passes (adversarial terms) multiply their loss by."""
        return weight * (float(self.scaler.get_scale()) if self.scaler is not None else 1.0)
