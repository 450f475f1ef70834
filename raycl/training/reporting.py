"""Reporting and evaluation: what a report holds beyond the task's own metrics, the checks every rank makes
before it, rank 0's evaluation (keeping the best model of a scope) and the closing report.

A report's metrics: the task's (:meth:`Task.metrics`, of the interval's :class:`~raycl.training.timing.Window`),
the loop's timing and learning rate (:func:`raycl.training.timing.interval_metrics`), fp16's skipped updates and
scale, the worker's start-up times in its first report, ``report`` and ``step``; rank 0 adds the evaluation
(``timing/eval``, ``kept``). Rank 0's progress line shows the task's ``shown`` metrics.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from raycl.collectives import all_gather_floats
from raycl.records import append_history, save_dir_atomic
from raycl.training.precision import inference
from raycl.training.task import Report, TrainState, Worker
from raycl.training.timing import Window, interval_metrics


def report_metrics(
    task: Any, st: TrainState, window: Window, rep: Report, w: Worker, scaler: torch.amp.GradScaler | None
) -> dict[str, Any]:
    """Every rank's metrics of a report (before rank 0's evaluation): the task's, then the loop's."""
    metrics = dict(task.metrics(st, window, rep, w))  # first: a task may step a schedule here (SWALR)
    metrics.update(interval_metrics(window, st.optimizers[0] if st.optimizers else None))
    metrics.update({"report": st.progress["report"], "step": st.progress["step"]})
    if scaler is not None:
        metrics.update({"fp16/skipped": window.skipped, "fp16/scale": scaler.get_scale()})
    return metrics


def source_metrics(own: dict[str, float], window: Window, *, since: float) -> dict[str, float]:
    """A negative source's metrics in a report, the same names for every recipe: its own counters (``stream/…``,
    ``refresh/…``) and, for a source whose reads wait on miners (it counts ``timing/mine_wait``), the waits.
    ``timing/mine_wait`` is the trainer's wait for its next batch (the loop's: the source is read ahead of the
    step), ``stream/take_wait`` the source's own wait since the last report of the epoch (``since``: its count
    then); ``…_steady`` leaves out the wait for the epoch's first batch (the pipeline filling up)."""
    if "timing/mine_wait" not in own:
        return dict(own)
    out = {k: v for k, v in own.items() if k not in ("timing/mine_wait", "timing/mine_wait_first")}
    wall, wait, first = window.wall(), window.wait_s, window.first_wait_s
    return {
        **out,
        "stream/take_wait": max(own["timing/mine_wait"] - since, 0.0),
        "timing/mine_wait": wait,
        "timing/mine_wait_first": first,
        "timing/mine_wait_fraction": wait / max(wall, 1e-9),
        "timing/mine_wait_fraction_steady": (wait - first) / max(wall - first, 1e-9),
    }


def shown(task: Any, metrics: dict[str, Any]) -> dict[str, Any]:
    """What rank 0's progress line shows of a report: the task's ``shown`` metrics."""
    names = getattr(task, "shown", ())
    return {k: v for k, v in metrics.items() if k in names}


def check_ranks_agree(st: TrainState, w: Worker) -> None:
    """Every rank must hold the same weights, step and learning rate at a report: a digest of each is compared
    (one small all-gather). Ranks that drifted apart would make every reported number wrong, silently."""
    if w.world_size <= 1:
        return
    with torch.no_grad():
        total, absolute = 0.0, 0.0
        for p in st.model.parameters():
            total += float(p.double().sum())
            absolute += float(p.double().abs().sum())
    lrs = [float(g["lr"]) for o in st.optimizers for g in o.param_groups]
    mine = [float(st.progress["step"]), total, absolute, *lrs]
    ranks = all_gather_floats(mine)
    for r, theirs in enumerate(ranks):
        if any(not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) for a, b in zip(mine, theirs, strict=True)):
            raise RuntimeError(
                f"data-parallel ranks disagree at step {st.progress['step']}: rank "
                f"{w.rank} has (step, Σw, Σ|w|, lr…) = {mine}, rank {r} {theirs}"
            )


def evaluate(task: Any, st: TrainState, rep: Report, w: Worker, metrics: dict[str, Any]) -> dict[str, Any]:
    """Rank 0: the task's evaluation in eval mode; the best model of the report's scope is kept."""
    t0 = time.perf_counter()
    st.train(False)
    with inference(w.precision):
        out = dict(task.evaluate(st, rep, w))
        keep = task.keep(rep, {**metrics, **out})
        if keep is not None:
            value, best = _num(out.get(keep.metric)), st.progress["best"]
            if keep.scope not in best or (
                value is not None and (best[keep.scope] is None or value > best[keep.scope])
            ):
                best[keep.scope] = value
                out.update(task.on_best(st, rep, w))
                save_dir_atomic(lambda tmp: task.save_model(st, tmp, kept=True), w.out_dir / keep.folder)
                out["kept"] = 1
    st.train(True)
    out["timing/eval"] = time.perf_counter() - t0
    return out


def final(task: Any, st: TrainState, w: Worker) -> None:
    """The task's closing report (no checkpoint), when it has one."""
    st.train(False)
    with inference(w.precision):
        metrics = task.final(st, w)
    if metrics is None:
        return
    st.progress["report"] += 1
    metrics = nan_for_none({**metrics, "report": st.progress["report"], "step": st.progress["step"], "final": 1})
    if w.rank == 0:
        append_history(w.out_dir, metrics, key="report")
    w.session.report(metrics)


def _num(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def nan_for_none(metrics: dict[str, Any]) -> dict[str, Any]:
    """Tune's metric must be a number in every report: an undefined score (no rows, constant predictions) is
    NaN."""
    return {k: float("nan") if v is None else v for k, v in metrics.items()}
