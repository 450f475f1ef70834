"""The one training loop every recipe runs on a Ray Train worker (or in-process, ``scaling.num_workers=0``).

The loop owns what is the same for every recipe — the epochs, the position in them, when to evaluate, the update —
in this order::

    model ← task.load_model(checkpoint/model or the initial model); model.to(device)   # before any optimizer
    state ← task.build(model)            # optimizers, schedules (their total counted once), queue, EMA …
    restore optimizers, schedules, scaler, extras, RNG from the checkpoint; task.start(resumed)
    for epoch from the checkpoint's (epoch, batch):
        task.epoch(state, epoch, batch)  → this rank's batches, the epoch's evaluation rule
        batches collated ahead (task.collate, a background thread), pinned, copied with non_blocking
        each batch → forward/backward under autocast, gradients accumulated over ``update_freq`` batches, then
                     one update: sum over workers, ÷ global weight, unscale (fp16), clip, step, schedule
        every ``eval_every`` updates of the epoch, at its end (``report_at_end``) and at the end of training:
                     the task's metrics; rank 0 evaluates, keeps the best model, appends ``history.jsonl``
                     and attaches a resumable checkpoint; every rank reports
    task.final(state)                    # the recipe's closing report (official submissions), if any

A recipe (a :class:`Task`) supplies only what differs: how to load its model, its state, its feed, its step and
its evaluation. What crosses into the Ray Train worker is one frozen :class:`Job` holding the task, whose config
is the recipe's typed config dataclass.

Gradients: a step's backward is of its *summed* loss (``ctx.backward(mean_loss, weight=n)``); an update divides
by the weight summed over its micro-batches and every worker, so ``update_freq`` N with batch B is the update of
one batch N·B, and W workers are one worker on the union of their shards (fairseq's ``ntokens`` normalisation for
GEC; the mean of per-batch means with the default weight 1). Tasks whose forward runs through ``forward`` use
DDP (``LoopSettings.ddp``: its bucketed all-reduce overlaps the backward; ``no_sync`` while accumulating);
the others sum gradients after the backward (:mod:`raycl.collectives`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from raycl import storage
from raycl.collectives import all_gather_floats, average_gradients
from raycl.distributed import session
from raycl.miners.sources import SourceSpec
from raycl.progress import ProgressWriter
from raycl.records import append_history, append_start, save_dir_atomic
from raycl.training.chaos import crash_switch
from raycl.training.checkpoint import MODEL_DIR, STATE_FILE, load_state, save_state, seed_everything
from raycl.training.precision import Precision, enable_tf32, inference
from raycl.training.prefetch import Call, Prefetcher


# ---------------------------------------------------------------------------------------------- what a task gives
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

    @classmethod
    def from_options(cls, o: Any, **overrides: Any) -> LoopSettings:
        """The settings of an ``optim`` section (:class:`raycl.config.LoopOptions` and whatever else of the loop's
        it has: ``clip_norm``, ``seed``), with a recipe's own ``overrides``."""
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{**{n: getattr(o, n) for n in names if hasattr(o, n)}, **overrides})


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
    # False: batches are read in the training thread, one at a time — for feeds whose reads must see every update
    # before them (a stream's staleness rule checked against a version that updates move on)
    read_ahead: bool = True


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


class Task(Protocol):
    """A recipe's side of the loop (``raycl/recipes/<task>/worker.py``). The loop owns the epochs and the position
    in them; the task hands over each epoch's batches (``epoch``), turns a batch into tensors on the CPU
    (``collate``, run ahead in a background thread) and runs a step on them (``step``, on the device)."""

    settings: LoopSettings

    def load_model(self, path: Path) -> nn.Module: ...
    def build(self, model: nn.Module, w: Worker, progress: dict[str, Any] | None) -> TrainState: ...
    def start(self, st: TrainState, w: Worker, *, resumed: bool) -> None: ...
    def num_epochs(self, st: TrainState) -> int: ...
    def epoch(self, st: TrainState, w: Worker, epoch: int, start: int) -> Epoch: ...
    def collate(self, st: TrainState, data: Any) -> Any: ...
    def step(self, st: TrainState, data: Any, ctx: StepContext) -> dict[str, Any]: ...
    def before_update(self, st: TrainState) -> None: ...
    def after_update(self, st: TrainState) -> None: ...
    def end_epoch(self, st: TrainState, w: Worker, epoch: int) -> None: ...
    def metrics(self, st: TrainState, window: Window, rep: Report, w: Worker) -> dict[str, Any]: ...
    def evaluate(self, st: TrainState, rep: Report, w: Worker) -> dict[str, Any]: ...
    def keep(self, rep: Report, metrics: dict[str, Any]) -> Keep | None: ...
    def on_best(self, st: TrainState, rep: Report, w: Worker) -> dict[str, Any]: ...
    def save_model(self, st: TrainState, folder: Path, *, kept: bool) -> None: ...
    def final(self, st: TrainState, w: Worker) -> dict[str, Any] | None: ...
    def compiled_modules(self, st: TrainState) -> list[nn.Module]: ...


class TaskBase:
    """Defaults for the optional parts of :class:`Task` (a task gives ``settings`` as an attribute or property)."""

    def start(self, st: Any, w: Worker, *, resumed: bool) -> None:
        pass

    def collate(self, st: Any, data: Any) -> Any:
        return data

    def before_update(self, st: Any) -> None:
        pass

    def after_update(self, st: Any) -> None:
        pass

    def end_epoch(self, st: Any, w: Worker, epoch: int) -> None:
        pass

    def keep(self, rep: Report, metrics: dict[str, Any]) -> Keep | None:
        return None

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


@dataclass(frozen=True)
class Job:
    """What crosses into a Ray Train worker: the task (with its typed config) and where things are."""

    task: Any  # a Task; typed loosely so that recipes' task classes need not subclass the Protocol
    init_model: str
    out_dir: str
    negatives: SourceSpec | None = None  # where negatives come from (raycl.training.negatives); None: the config's
    chaos: dict[str, Any] | None = None  # a trainer crash switch for tests and benchmarks (raycl.training.chaos)
    use_gpu: bool = True  # False: the CPU even where Ray's local mode (0 workers) would hand out a GPU
    probe: str | None = None  # a folder where every rank writes its final training state (rank<r>.pt; tests)


# ---------------------------------------------------------------------------------------------- a step's view
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


class Window:
    """Sums of one report interval: the step outputs (per micro-batch), updates, step time, the time the step's
    thread waited for its next batch, wall time. Step outputs may be device tensors: they are summed where they are
    and read once, at the report (no host-device sync a step)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._sums: dict[str, Any] = {}
        self.t0, self.batches, self.updates, self.step_s = time.perf_counter(), 0, 0, 0.0
        self.wait_s = 0.0  # waiting for batches (negatives being mined, collation behind)
        self.first_wait_s = 0.0  # of which for an epoch's first batch (the pipeline filling up)
        self._skipped: Any = 0  # fp16 updates the scaler skipped (their gradients overflowed): a device count

    def add(self, out: dict[str, Any], seconds: float) -> None:
        self.batches += 1
        self.step_s += seconds
        for k, v in out.items():
            v = v.detach() if isinstance(v, torch.Tensor) else float(v)
            if k in self._sums:
                self._sums[k] = self._sums[k] + v  # a new tensor
            else:  # a step's output may live in memory the next step writes (a CUDA graph replays into the
                self._sums[k] = v.clone() if isinstance(v, torch.Tensor) else v  # same buffers): copied

    def add_skipped(self, skipped: Any) -> None:
        self._skipped = self._skipped + skipped

    @property
    def sums(self) -> dict[str, float]:
        """The interval's sums as numbers: device sums are read here, all in one copy (a report's one sync)."""
        tensors = {k: v for k, v in self._sums.items() if isinstance(v, torch.Tensor)}
        if tensors:
            values = torch.stack([v.detach().reshape(()).double() for v in tensors.values()]).tolist()
            self._sums.update(zip(tensors, values, strict=True))
        return self._sums

    @property
    def skipped(self) -> int:
        if isinstance(self._skipped, torch.Tensor):
            self._skipped = int(self._skipped)
        return int(self._skipped)

    def means(self) -> dict[str, float]:
        return {k: v / max(self.batches, 1) for k, v in self.sums.items()}

    def wall(self) -> float:
        return time.perf_counter() - self.t0

    def step_time(self) -> float:
        """Seconds per optimizer update (forward, backward and update of its micro-batches; the host's time: on a
        GPU the kernels may still be running — the wall time per update is ``wall() / updates``)."""
        return self.step_s / max(self.updates, 1)


# ---------------------------------------------------------------------------------------------- the loop
def run(job: Job) -> None:
    """Ray Train entry point (``functools.partial(run, job)``): one worker's whole training run."""
    entered, boot = time.perf_counter(), _process_age()
    task = job.task
    s: LoopSettings = task.settings
    rank, world_size = session.world()
    device = session.device() if job.use_gpu else torch.device("cpu")
    enable_tf32(device, on=s.tf32)
    seed_everything(s.seed)
    w = Worker(rank, world_size, device, Precision(s.precision, device), Path(job.out_dir), job)
    w.out_dir.mkdir(parents=True, exist_ok=True)
    with session.resume_dir() as ckpt:  # a restarted worker group continues from the last checkpoint
        saved = load_state(ckpt / STATE_FILE) if ckpt else None
        if ckpt is not None and saved is not None and (ckpt / rank_file(rank)).exists():  # this rank's own part
            own = load_state(ckpt / rank_file(rank))
            saved["rng"], saved["extras"] = own["rng"], {**saved["extras"], **own["extras"]}
        model = task.load_model(ckpt / MODEL_DIR if ckpt else storage.local(job.init_model))
        model.to(device)  # before any optimizer is built on its parameters or loads state onto them
        st = task.build(model, w, saved["progress"] if saved else None)
    loop = _Loop(task, st, w)
    loop.startup = StartUp(entered, boot)
    if saved is not None:
        loop.restore(saved)
    task.start(st, w, resumed=saved is not None)
    if rank == 0:  # where this training started: a resumed run shows what it did not do again
        append_start(w.out_dir, step=st.progress["step"], report=st.progress["report"], resumed=saved is not None,
                     time=time.time())  # fmt: skip
    loop.train()
    loop.final()
    if job.probe:
        Path(job.probe).mkdir(parents=True, exist_ok=True)
        torch.save(loop.state(), Path(job.probe) / f"rank{rank}.pt")


def _process_age() -> float | None:
    """Seconds since this process started (a Ray Train worker: Ray's worker, imports, the process group), or None
    where psutil (which comes with Ray) is missing."""
    try:
        import psutil

        return max(time.time() - psutil.Process().create_time(), 0.0)
    except (ImportError, OSError):
        return None


class StartUp:
    """What a worker process paid before its steps (on a GPU, CUDA's start), for its first report:
    ``timing/worker_boot`` the process's age when ``run`` was entered, ``timing/start`` from there to the first
    step (the model loaded and moved, the state built, restored, compiled), ``timing/first_step`` the first
    micro-batch and its update (kernels loaded on first use)."""

    def __init__(self, entered: float, boot: float | None) -> None:
        self.entered: float | None = entered  # until the first step begins
        self.first_t0: float | None = None  # while the first micro-batch runs
        self.times = {} if boot is None else {"timing/worker_boot": boot}

    def step_begins(self, t0: float) -> None:
        if self.entered is not None:
            self.times["timing/start"], self.entered, self.first_t0 = t0 - self.entered, None, t0

    def step_ends(self) -> None:
        if self.first_t0 is not None:
            self.times["timing/first_step"] = time.perf_counter() - self.first_t0
            self.first_t0 = None

    def taken(self) -> dict[str, float] | None:
        """The times, once a step has begun (a report in the first update: that step so far); None before."""
        self.step_ends()
        return None if self.entered is not None else self.times


def rng_state(device: torch.device) -> dict[str, Any]:
    """This worker's RNG states: Python's, NumPy's, the CPU generator and the CUDA one of its *own* device only
    (not every device the process sees: a restarted worker may see fewer, and could not restore that list)."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}  # fmt: skip


def restore_rng(rng: dict[str, Any], device: torch.device) -> None:
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if device.type == "cuda" and isinstance(rng.get("cuda"), torch.Tensor):
        torch.cuda.set_rng_state(rng["cuda"], device)  # this worker's own device


class _Loop:
    def __init__(self, task: Any, st: TrainState, w: Worker) -> None:
        self.task, self.st, self.w, self.s = task, st, w, task.settings
        self.scaler = w.precision.scaler(self.s.fp16_init_scale)
        self.window = Window()
        self.pending: list[int] = []  # optimizer index of each micro-batch since the last update
        self.ctx: StepContext | None = None
        self.synced = False  # whether the last backward ran DDP's all-reduce
        self.module_of: tuple[nn.Module, nn.Module] | None = None
        self.on_step = crash_switch(w.job.chaos, rank=w.rank)
        self.bar: ProgressWriter | None = None
        self.current = Epoch(())  # the epoch being trained (its evaluation rule, its reports' info)
        self.startup: StartUp | None = None  # set by ``run``; gone once this process's first report holds it
        for key, value in {"epoch": 0, "batch": 0, "epoch_step": 0, "step": 0, "report": 0, "best": {},
                           "reported_step": -1}.items():  # fmt: skip
            st.progress.setdefault(key, value)

    # ------------------------------------------------------------------------------------------ checkpoints
    def restore(self, saved: dict[str, Any]) -> None:
        """Optimizers (their moments land on their parameters' device), schedules, scaler, extras, RNG."""
        st = self.st
        for opt, state in zip(st.optimizers, saved["optimizers"], strict=True):
            opt.load_state_dict(state)
        for sched, state in zip(st.schedulers, saved["schedulers"], strict=True):
            if sched is not None and state is not None:
                sched.load_state_dict(state)
        if self.scaler is not None and saved.get("scaler"):
            self.scaler.load_state_dict(saved["scaler"])
        for name, obj in st.extras.items():
            if saved["extras"].get(name) is not None:
                obj.load_state_dict(saved["extras"][name])
        st.progress = dict(saved["progress"])
        restore_rng(saved["rng"], self.w.device)

    def rng(self) -> dict[str, Any]:
        return rng_state(self.w.device)

    def state(self) -> dict[str, Any]:
        """What ``state.pt`` holds: optimizers, schedules, scaler, extras, progress and the RNG states (the CUDA
        one of this worker's own device: another worker may see fewer devices)."""
        st = self.st
        return {"optimizers": [o.state_dict() for o in st.optimizers],
                "schedulers": [s.state_dict() if s is not None else None for s in st.schedulers],
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "extras": {k: v.state_dict() for k, v in st.extras.items()}, "progress": st.progress,
                "rng": self.rng(),
                **({"model": {k: v.detach().cpu() for k, v in st.model.state_dict().items()}}
                   if self.w.job.probe else {}),
                }  # fmt: skip

    def save(self, folder: Path) -> None:
        """``model/`` (``save_pretrained``) and ``state.pt``, each written to a temporary name and renamed."""
        st = self.st
        save_dir_atomic(lambda tmp: self.task.save_model(st, tmp, kept=False), folder / MODEL_DIR)
        state = self.state()
        state.pop("model", None)
        save_state(state, folder / STATE_FILE)

    # ------------------------------------------------------------------------------------------ training
    def module(self) -> nn.Module:
        """The module forward passes run through: DDP over the model with several workers (re-wrapped if the
        task replaced its model), else the model."""
        model = self.st.model
        if not (self.s.ddp and self.w.world_size > 1):
            return model
        if self.module_of is None or self.module_of[0] is not model:
            ddp = session.wrap_ddp(model, find_unused_parameters=self.s.find_unused_parameters)
            self.module_of = (model, ddp)
        return self.module_of[1]

    def train(self) -> None:
        """Every epoch from the checkpoint's position: the task's batches, prefetched; an update every
        ``update_freq`` of them; reports where the epoch's rule says, at its end, and at the end of training."""
        st, w, p = self.st, self.w, self.st.progress
        if w.rank == 0:
            self.bar = ProgressWriter(w.out_dir, total=max(st.total_updates, 1))
        epochs = self.task.num_epochs(st)
        while p["epoch"] < epochs:
            epoch = p["epoch"]
            self.current = self.task.epoch(st, w, epoch, p["batch"])
            self.compile()  # (again where an epoch replaced the model: a fit starting from a kept one)
            collate = functools.partial(self.task.collate, st)
            depth = self.s.prefetch if self.current.read_ahead else 0
            with Prefetcher(self.current.batches, collate, device=w.device, depth=depth) as feed:
                waited = (0.0, 0.0)
                for batch in feed:
                    self.window.wait_s += feed.wait_s - waited[0]
                    self.window.first_wait_s += feed.first_wait_s - waited[1]
                    waited = (feed.wait_s, feed.first_wait_s)
                    self.micro_batch(batch)
                self.window.wait_s += feed.wait_s - waited[0]
            self.flush()
            self.join()
            self.task.end_epoch(st, w, epoch)
            p.update(epoch=epoch + 1, batch=0, epoch_step=0)
            if self.current.report_at_end or p["epoch"] == epochs:
                self.report(Report({**self.current.info, "epoch_end": True, "last": p["epoch"] == epochs}))
        if p["report"] == 0 or p["reported_step"] != p["step"]:  # the end of training is always evaluated
            self.report(Report({**self.current.info, "epoch_end": True, "last": True}))

    def compile(self) -> None:
        """``optim.compile``: the task's modules' forward through ``torch.compile`` (dynamic shapes after a first
        recompilation; collate buckets lengths so that few shapes occur). A module compiled already is left."""
        if not self.s.compile:
            return
        inductor = self.s.compile_backend == "inductor"
        for module in self.task.compiled_modules(self.st):
            if getattr(module, "_compiled_call_impl", None) is None:
                module.compile(backend=self.s.compile_backend, mode=self.s.compile_mode if inductor else None)

    def micro_batch(self, batch: Batch) -> None:
        if self.pending and self.pending[-1] != batch.optimizer:
            self.flush(ends_step=False)  # another optimizer's turn (alternating objectives): its update first
        if batch.progress:
            self.st.progress.update(batch.progress)  # the task's position: a report after this batch holds it
        self.st.progress["batch"] += 1
        if self.ctx is None:
            self.ctx = StepContext(self.module(), self.w.device, self.scaler)
        last = len(self.pending) + 1 >= self.s.update_freq
        ddp = isinstance(self.ctx.module, nn.parallel.DistributedDataParallel)
        quiet = ddp and not last  # accumulate locally; the group's last backward all-reduces the sum
        t0 = time.perf_counter()
        if self.s.compile and self.s.compile_mode == "reduce-overhead" and self.w.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()  # a new micro-batch: the last one's graph outputs are free
        if self.startup is not None:
            self.startup.step_begins(t0)
        self.st.train(True)
        with self.ctx.module.no_sync() if quiet else contextlib.nullcontext():  # type: ignore[operator]
            with self.w.precision.autocast():
                out = self.task.step(self.st, batch.data, self.ctx)
        self.synced = ddp and not quiet
        self.pending.append(batch.optimizer)
        self.window.add(out, time.perf_counter() - t0)  # before the update: it may end a report interval
        if last:
            t1 = time.perf_counter()
            self.update(ends_step=batch.ends_step)
            self.window.step_s += time.perf_counter() - t1
            if self.bar is not None:  # the loss is read only when the bar writes (at most once a second)
                self.bar.update(self.st.progress["step"], loss=out.get("loss", float("nan")), phase="train")
        if self.startup is not None:
            self.startup.step_ends()

    def join(self) -> None:
        """Uneven inputs (token-budget batches, shards one item longer): a rank whose part of the epoch is over
        takes part in every update the others still make — with zero gradients and no weight, but the same
        update (optimizer, schedule, scaler, step counter, the task's hooks, reports at evaluation points) — until
        every rank is here (DDP's ``Join``, for the gradient sums made after the backward). DDP tasks give every
        rank the same number of batches instead."""
        if self.s.ddp or self.w.world_size <= 1:
            return
        while self.update(joined=True):
            pass

    def flush(self, *, ends_step: bool = True) -> None:
        """An update of what has been accumulated (an epoch's end or another optimizer's turn comes mid-group)."""
        if self.pending:
            self.update(ends_step=ends_step)

    def update(self, *, joined: bool = False, ends_step: bool = True) -> bool:
        """Sum over workers, divide by the global weight, unscale, clip, step, schedule; then the task's hooks,
        and a report where the epoch's ``eval_every`` falls. ``joined``: this rank has no batch left and takes the
        others' update; returns False (and changes nothing) when no rank had one. ``ends_step``: the last update
        of a step (alternating objectives make several)."""
        st = self.st
        k = self.pending[0] if self.pending else 0
        opt = st.optimizers[k]
        params = [p for g in opt.param_groups for p in g["params"]]
        if joined:
            for p in params:
                p.grad = None
        weight = 0.0 if joined or self.ctx is None else self.ctx.weight
        if not average_gradients(params, weight, averaged_by_ddp=self.synced, active=not joined):
            return False
        if self.scaler is not None:  # after the all-reduce: every rank sees the same inf/NaN and skips alike
            self.scaler.unscale_(opt)
        self.task.before_update(st)
        if self.s.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, self.s.clip_norm)
        self.optimizer_step(opt)
        if st.schedulers[k] is not None:
            st.schedulers[k].step()
        opt.zero_grad(set_to_none=True)
        self.pending, self.ctx, self.synced = [], None, False
        self.window.updates += 1
        p = st.progress
        if k == 0:  # a step counts the first optimizer's updates (alternating objectives: one of each)
            p["step"] += 1
        self.task.after_update(st)
        if k == 0:
            self.on_step(p["step"])
        if ends_step:
            p["epoch_step"] += 1
            every = self.current.eval_every  # every rank, active or joined, is here
            if every > 0 and p["epoch_step"] % every == 0:
                self.report(Report(dict(self.current.info)), join=False)
        return True

    def optimizer_step(self, opt: torch.optim.Optimizer) -> None:
        """The optimizer's step; under fp16 the scaler's, counting the steps it skips on the device (no sync)."""
        if self.scaler is None:
            opt.step()
            return
        scale = self.scaler._scale  # (1,) on the device, or None before the first scaled backward
        before = scale.clone() if isinstance(scale, torch.Tensor) else None
        self.scaler.step(opt)
        self.scaler.update()
        if before is not None and isinstance(self.scaler._scale, torch.Tensor):
            self.window.add_skipped((self.scaler._scale < before).sum())  # an overflow: the step was skipped

    # ------------------------------------------------------------------------------------------ reports
    def report(self, rep: Report, *, join: bool = True) -> None:
        """``join``: a report of the feed (an epoch's end: wait for every rank); the loop's own reports come
        right after an update that every rank made."""
        self.flush()
        if join:
            self.join()
        st, w = self.st, self.w
        if st.progress["report"] > 0 and st.progress["reported_step"] == st.progress["step"]:
            return  # a report at this step came first (every N updates, then the epoch's end): the same weights
        st.progress["reported_step"] = st.progress["step"]
        self.check_ranks_agree()
        st.progress["report"] += 1
        metrics = {**self.task.metrics(st, self.window, rep, w), "report": st.progress["report"],
                   "step": st.progress["step"]}  # fmt: skip
        if self.scaler is not None:
            metrics.update({"fp16/skipped": self.window.skipped, "fp16/scale": self.scaler.get_scale()})
        metrics.update({"timing/data_wait": self.window.wait_s,
                        "timing/data_wait_fraction": self.window.wait_s / max(self.window.wall(), 1e-9)})
        if self.startup is not None and (times := self.startup.taken()) is not None:  # this process's first
            metrics.update(times)
            self.startup = None
        if w.rank == 0:
            self.show(phase="eval")
            metrics.update(self.evaluate(rep, metrics))
            metrics = nan_for_none(metrics)
            append_history(w.out_dir, metrics, key="report")
            self.show(phase="train", **{k: v for k, v in metrics.items() if k in _SHOWN})
        if rep.checkpoint:  # rank 0 writes the state; every rank adds its own RNG (its dropout masks) and queues
            with session.scratch_dir() as tmp:
                if w.rank == 0:
                    self.save(tmp)
                mine = {k: st.extras[k].state_dict() for k in st.per_rank if k in st.extras}
                save_state({"rng": self.rng(), "extras": mine}, tmp / rank_file(w.rank))
                session.report(metrics, checkpoint_dir=tmp)
        else:
            session.report(metrics)
        self.window.reset()

    def show(self, **info: Any) -> None:
        """Rank 0's ``progress.json`` (what the bar or the log lines show), written now."""
        if self.bar is not None:
            self.bar.update(self.st.progress["step"], force=True, **info)

    def check_ranks_agree(self) -> None:
        """Every rank must hold the same weights, step and learning rate at a report: a digest of each is compared
        (one small all-gather). Ranks that drifted apart would make every reported number wrong, silently."""
        if self.w.world_size <= 1:
            return
        st = self.st
        with torch.no_grad():
            total, absolute = 0.0, 0.0
            for p in st.model.parameters():
                total += float(p.double().sum())
                absolute += float(p.double().abs().sum())
        lrs = [float(g["lr"]) for o in st.optimizers for g in o.param_groups]
        mine = [float(st.progress["step"]), total, absolute, *lrs]
        ranks = all_gather_floats(mine)
        for r, theirs in enumerate(ranks):
            if any(not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
                   for a, b in zip(mine, theirs, strict=True)):  # fmt: skip
                raise RuntimeError(f"data-parallel ranks disagree at step {st.progress['step']}: rank "
                                   f"{self.w.rank} has (step, Σw, Σ|w|, lr…) = {mine}, rank {r} {theirs}")

    def evaluate(self, rep: Report, metrics: dict[str, Any]) -> dict[str, Any]:
        """Rank 0: the task's evaluation in eval mode; the best model of the report's scope is kept."""
        st, w, task = self.st, self.w, self.task
        t0 = time.perf_counter()
        st.train(False)
        with inference(w.precision):
            out = dict(task.evaluate(st, rep, w))
            keep = task.keep(rep, {**metrics, **out})
            if keep is not None:
                value, best = _num(out.get(keep.metric)), st.progress["best"]
                if keep.scope not in best or (value is not None and (best[keep.scope] is None
                                                                     or value > best[keep.scope])):
                    best[keep.scope] = value
                    out.update(task.on_best(st, rep, w))
                    save_dir_atomic(lambda tmp: task.save_model(st, tmp, kept=True), w.out_dir / keep.folder)
                    out["kept"] = 1
        st.train(True)
        out["timing/eval"] = time.perf_counter() - t0
        return out

    def final(self) -> None:
        """The task's closing report (no checkpoint), when it has one."""
        st, w = self.st, self.w
        st.train(False)
        with inference(w.precision):
            metrics = self.task.final(st, w)
        if metrics is None:
            return
        st.progress["report"] += 1
        metrics = nan_for_none({**metrics, "report": st.progress["report"], "step": st.progress["step"],
                                "final": 1})  # fmt: skip
        if w.rank == 0:
            append_history(w.out_dir, metrics, key="report")
        session.report(metrics)


# what a progress line shows of a report: each recipe's dev metric, and how long the trainers waited for negatives
_SHOWN = ("dev_f05", "dev_acc", "dev_f1", "dev_spearman", "timing/mine_wait_fraction")


def rank_file(rank: int) -> str:
    """The file of a checkpoint that holds rank ``rank``'s own part: its RNG states and per-rank extras."""
    return f"rank{rank}.pt"


def _num(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def nan_for_none(metrics: dict[str, Any]) -> dict[str, Any]:
    """Tune's metric must be a number in every report: an undefined score (no rows, constant predictions) is
    NaN."""
    return {k: float("nan") if v is None else v for k, v in metrics.items()}
