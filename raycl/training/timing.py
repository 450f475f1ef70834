"""Step instrumentation: what one report interval measured (:class:`Window`), what a worker process paid before
its first step (:class:`StartUp`), and the one set of timing and learning-rate metrics every recipe's reports
carry (:func:`interval_metrics`).

Every report of every recipe holds, from the loop (not the recipe):

- ``timing/step``: seconds per step (forward, backward and update of its micro-batches; a step of alternating
  objectives holds one update of each), the host's time;
- ``timing/interval``: wall seconds of the report interval (an epoch where reports fall at epochs' ends);
- ``timing/data_wait``: seconds the step's thread waited for its next batch (negatives, collation behind), and
  ``timing/data_wait_fraction``, that wait ÷ ``timing/interval``;
- ``lr``: the first optimizer's learning rate after the interval's last update.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

STEP, INTERVAL, DATA_WAIT, DATA_WAIT_FRACTION, LR = (
    "timing/step",
    "timing/interval",
    "timing/data_wait",
    "timing/data_wait_fraction",
    "lr",
)


class Window:
    """Sums of one report interval: the step outputs (per micro-batch), updates, steps, step time, the time the
    step's thread waited for its next batch, wall time. Step outputs may be device tensors (a step need not detach
    them: they are detached here): they are summed where they are and read once, at the report (no host-device
    sync a step)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._sums: dict[str, Any] = {}
        self.t0, self.batches, self.updates, self.step_s = time.perf_counter(), 0, 0, 0.0
        self.steps = 0  # updates of the first optimizer (alternating objectives: one step, several updates)
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

    def means(self, ratios: Mapping[str, tuple[str, str]] | None = None) -> dict[str, float]:
        """Every step output's mean per batch; with ``ratios`` (name → (output, output)), the interval's sum of
        the one ÷ the other's (at least 1), for those the interval has (none before its first batch)."""
        s = self.sums
        if ratios:
            return {k: s[a] / max(s.get(b, 0.0), 1.0) for k, (a, b) in ratios.items() if a in s}
        return {k: v / max(self.batches, 1) for k, v in s.items()}

    def wall(self) -> float:
        return time.perf_counter() - self.t0

    def step_time(self) -> float:
        """Seconds per step (forward, backward and update of its micro-batches; the host's time: on a GPU the
        kernels may still be running — the wall time per step is ``wall() / steps``)."""
        return self.step_s / max(self.steps, 1)


def interval_metrics(window: Window, optimizer: torch.optim.Optimizer | None) -> dict[str, float]:
    """The loop's timing and learning-rate metrics of a report interval (the table above)."""
    wall = window.wall()
    out = {
        STEP: window.step_time(),
        INTERVAL: wall,
        DATA_WAIT: window.wait_s,
        DATA_WAIT_FRACTION: window.wait_s / max(wall, 1e-9),
    }
    if optimizer is not None and optimizer.param_groups:
        out[LR] = float(optimizer.param_groups[0]["lr"])
    return out


def process_age() -> float | None:
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
