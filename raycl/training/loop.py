"""The one training loop every recipe runs on a Ray Train worker (or in-process, ``scaling.num_workers=0``).

The loop owns what is the same for every recipe — the epochs, the position in them, when to evaluate, the update —
in this order::

    model ← task.load_model(checkpoint/model or the initial model); model.to(device)   # before any optimizer
    state ← task.build(model)            # optimizers, schedules (their total counted once), queue, EMA, source …
    restore optimizers, schedules, scaler, extras, RNG from the checkpoint; the negative source resumed from
    its state there (state.source); task.start(resumed)
    for epoch from the checkpoint's (epoch, batch) to state.epochs:
        task.epoch(state, epoch, batch)  → this rank's batches (with the source's negatives), the evaluation rule
        batches collated ahead (task.collate, a background thread), pinned, copied with non_blocking
        each batch → forward/backward under autocast, gradients accumulated over ``update_freq`` batches, then
                     one update: sum over workers, ÷ global weight, unscale (fp16), clip, step, schedule;
                     the task's and the source's after_update (a live source publishes newer weights)
        every ``eval_every`` updates of the epoch, at its end (``report_at_end``) and at the end of training:
                     the task's and the source's metrics; rank 0 evaluates, keeps the best model, appends
                     ``history.jsonl`` and attaches a resumable checkpoint; every rank reports
    task.final(state)                    # the recipe's closing report (official submissions), if any

A recipe (a :class:`~raycl.training.task.Task`) supplies only what differs: how to load its model, its state, its
feed, its step and its evaluation. What crosses into the Ray Train worker is one frozen
:class:`~raycl.training.task.Job` holding the task, whose config is the recipe's typed config dataclass.

This module is the update engine (:class:`Loop`) and its entry point (:func:`run`); beside it: the task API
(:mod:`raycl.training.task`), step instrumentation (:mod:`raycl.training.timing`), the state, RNG and checkpoints
(:mod:`raycl.training.state`), reporting and evaluation (:mod:`raycl.training.reporting`).

Gradients: a step's backward is of its *summed* loss (``ctx.backward(mean_loss, weight=n)``); an update divides
by the weight summed over its micro-batches and every worker, so ``update_freq`` N with batch B is the update of
one batch N·B, and W workers are one worker on the union of their shards (fairseq's ``ntokens`` normalisation for
GEC; the mean of per-batch means with the default weight 1). Tasks whose forward runs through ``forward`` use
DDP (``LoopSettings.ddp``: its bucketed all-reduce overlaps the backward; ``no_sync`` while accumulating);
the others sum gradients after the backward (:mod:`raycl.collectives`).
"""

from __future__ import annotations

import contextlib
import functools
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from raycl import storage
from raycl.collectives import average_gradients
from raycl.progress import ProgressWriter
from raycl.records import append_history, append_start
from raycl.training import reporting, state
from raycl.training.checkpoint import MODEL_DIR, seed_everything
from raycl.training.precision import Precision, enable_tf32
from raycl.training.prefetch import Prefetcher
from raycl.training.task import Batch, Epoch, Job, LoopSettings, Report, StepContext, TrainState, Worker
from raycl.training.timing import StartUp, Window, process_age


def run(job: Job) -> None:
    """Ray Train entry point (``functools.partial(run, job)``): one worker's whole training run."""
    entered, boot = time.perf_counter(), process_age()
    task = job.task
    s: LoopSettings = task.settings
    session = job.train_session()
    rank, world_size = session.world()
    device = session.device() if job.use_gpu else torch.device("cpu")
    enable_tf32(device, on=s.tf32)
    seed_everything(s.seed)
    w = Worker(rank, world_size, device, Precision(s.precision, device), Path(job.out_dir), job)
    w.out_dir.mkdir(parents=True, exist_ok=True)
    with session.resume_dir() as ckpt:  # a restarted worker group continues from the last checkpoint
        saved = state.read_saved(ckpt, rank)
        model = task.load_model(ckpt / MODEL_DIR if ckpt else storage.local(job.init_model))
        model.to(device)  # before any optimizer is built on its parameters or loads state onto them
        st = task.build(model, w, saved["progress"] if saved else None)
    loop = Loop(task, st, w)
    loop.startup = StartUp(entered, boot)
    if saved is not None:
        state.restore(st, saved, loop.scaler, device)
    if st.source is not None:  # the checkpoint's weight version (republished if the dead run went past it)
        st.source.resume(st.progress.get("feed", {}), st.model)
    task.start(st, w, resumed=saved is not None)
    if rank == 0:  # where this training started: a resumed run shows what it did not do again
        append_start(
            w.out_dir,
            step=st.progress["step"],
            report=st.progress["report"],
            resumed=saved is not None,
            time=time.time(),
        )
    loop.train()
    reporting.final(task, st, w)
    for hook in job.hooks:  # tests' and benchmarks' probes
        hook.at_end(loop.state(), w)


class Loop:
    """One worker's update engine: epochs of the task's batches, prefetched; micro-batches accumulated into
    updates; reports where the epoch's rule says."""

    def __init__(self, task: Any, st: TrainState, w: Worker) -> None:
        self.task, self.st, self.w, self.s = task, st, w, task.settings
        self.scaler = w.precision.scaler(self.s.fp16_init_scale)
        self.window = Window()
        self.take_wait = 0.0  # the source's own wait at the last report of this epoch
        self.pending: list[int] = []  # optimizer index of each micro-batch since the last update
        self.ctx: StepContext | None = None
        self.synced = False  # whether the last backward ran DDP's all-reduce
        self.module_of: tuple[nn.Module, nn.Module] | None = None
        self.bar: ProgressWriter | None = None
        self.current = Epoch(())  # the epoch being trained (its evaluation rule, its reports' info)
        self.startup: StartUp | None = None  # set by ``run``; gone once this process's first report holds it
        for key, value in {
            "epoch": 0,
            "batch": 0,
            "epoch_step": 0,
            "step": 0,
            "report": 0,
            "best": {},
            "reported_step": -1,
        }.items():
            st.progress.setdefault(key, value)

    def state(self) -> dict[str, Any]:
        """The loop's whole state: ``state.pt``'s keys and the model's weights (on the CPU)."""
        st = self.st
        return {
            **state.loop_state(st, self.scaler, self.w.device),
            "model": {k: v.detach().cpu() for k, v in st.model.state_dict().items()},
        }

    def module(self) -> nn.Module:
        """The module forward passes run through: DDP over the model with several workers (re-wrapped if the
        task replaced its model), else the model."""
        model = self.st.model
        if not (self.s.ddp and self.w.world_size > 1):
            return model
        if self.module_of is None or self.module_of[0] is not model:
            ddp = self.w.session.wrap_ddp(model, find_unused_parameters=self.s.find_unused_parameters)
            self.module_of = (model, ddp)
        return self.module_of[1]

    def train(self) -> None:
        """Every epoch from the checkpoint's position: the task's batches, prefetched; an update every
        ``update_freq`` of them; reports where the epoch's rule says, at its end, and at the end of training."""
        st, w, p = self.st, self.w, self.st.progress
        if w.rank == 0:
            self.bar = ProgressWriter(w.out_dir, total=max(st.total_updates, 1))
        epochs = st.epochs
        while p["epoch"] < epochs:
            epoch = p["epoch"]
            self.take_wait = 0.0  # a source's counters start again with its epoch
            self.current = self.task.epoch(st, w, epoch, p["batch"])
            self.compile()  # (again where an epoch replaced the model: a fit starting from a kept one)
            collate = functools.partial(self.task.collate, st)
            # a source whose reads must see every update before them (a stream's staleness rule checked against a
            # version that updates move on) is read in the training thread, one batch at a time
            depth = self.s.prefetch if st.source is None or st.source.read_ahead else 0
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
                loss = out.get("loss", float("nan"))  # detached: a step's outputs may hold their graph
                loss = loss.detach() if isinstance(loss, torch.Tensor) else loss
                self.bar.update(self.st.progress["step"], loss=loss, phase="train")
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
            self.window.steps += 1
        self.task.after_update(st)
        if st.source is not None:  # a live source publishes newer weights to its miners (``sync_every``)
            st.source.after_update(p["step"], st.model)
        if k == 0:
            for hook in self.w.job.hooks:  # tests' and benchmarks' switches (a crash at a step)
                hook.after_step(p["step"], self.w)
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
        reporting.check_ranks_agree(st, w)
        st.progress["report"] += 1
        metrics = reporting.report_metrics(self.task, st, self.window, rep, w, self.scaler)
        if st.source is not None:
            own = st.source.metrics()
            metrics.update(reporting.source_metrics(own, self.window, since=self.take_wait))
            self.take_wait = own.get("timing/mine_wait", 0.0)
            st.progress["feed"] = st.source.state()  # what a checkpoint resumes the source from
        if self.startup is not None and (times := self.startup.taken()) is not None:  # this process's first
            metrics.update(times)
            self.startup = None
        if w.rank == 0:
            self.show(phase="eval")
            metrics.update(reporting.evaluate(self.task, st, rep, w, metrics))
            metrics = reporting.nan_for_none(metrics)
            append_history(w.out_dir, metrics, key="report")
            self.show(phase="train", **reporting.shown(self.task, metrics))
        if rep.checkpoint:  # rank 0 writes the state; every rank adds its own RNG (its dropout masks) and queues
            with self.w.session.scratch_dir() as tmp:
                if w.rank == 0:
                    save_model = functools.partial(self.task.save_model, st, kept=False)
                    state.save(st, save_model, self.scaler, w.device, tmp)
                state.save_rank(st, w.device, tmp, w.rank)
                self.w.session.report(metrics, checkpoint_dir=tmp)
        else:
            self.w.session.report(metrics)
        self.window.reset()

    def show(self, **info: Any) -> None:
        """Rank 0's ``progress.json`` (what the bar or the log lines show), written now."""
        if self.bar is not None:
            self.bar.update(self.st.progress["step"], force=True, **info)
