"""Hooks on the training loop (:class:`raycl.training.task.LoopHook`, carried by ``Job.hooks``) for tests and
benchmarks: a crash switch that kills a trainer at a step, and a probe that keeps every rank's final state.

:class:`CrashSwitch`: rank R's (default 0) process dies (``os._exit(1)``, no cleanup, like a lost machine) right
after global step N, once — the marker file remembers that it happened, so the worker group Ray Train restarts
from the last checkpoint runs through. :class:`StateProbe`: every rank writes its final training state
(``rank<r>.pt``: optimizers, schedules, extras, progress, RNG and the model's weights) into a folder.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from raycl.training.task import Worker

log = logging.getLogger(__name__)


def _poll_s() -> float:
    return float(os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "2.0"))


@dataclass(frozen=True)
class CrashSwitch:
    """Rank ``rank``'s process exits right after step ``exit_at_step``, unless ``marker`` says it did already."""

    exit_at_step: int
    marker: str
    rank: int = 0
    settle_s: float | None = None  # seconds between the step and the exit (default: 2.5 of Ray Train's polls)

    def after_step(self, step: int, w: Worker) -> None:
        marker = Path(self.marker)
        if w.rank != self.rank or step != self.exit_at_step or marker.exists():
            return
        marker.write_text(f"exited at step {step}\n")
        log.warning("chaos: trainer rank %d exits at step %d", w.rank, step)
        # Ray Train's controller collects reports when it polls the workers (every 2 s by default): a worker
        # killed sooner after a report may take that checkpoint with it, which makes the test's expected restart
        # point a race; waiting out one poll keeps the crash at step N deterministic
        time.sleep(self.settle_s if self.settle_s is not None else 2.5 * _poll_s())
        os._exit(1)

    def at_end(self, state: dict[str, Any], w: Worker) -> None:
        pass


@dataclass(frozen=True)
class StateProbe:
    """Every rank's final training state, written to ``folder/rank<r>.pt`` (read back with ``weights_only=False``:
    a test's own file)."""

    folder: str

    def after_step(self, step: int, w: Worker) -> None:
        pass

    def at_end(self, state: dict[str, Any], w: Worker) -> None:
        Path(self.folder).mkdir(parents=True, exist_ok=True)
        torch.save(state, Path(self.folder) / f"rank{w.rank}.pt")
