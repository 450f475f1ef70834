"""A crash switch for trainer workers (tests and benchmarks), like the miners' ``Chaos`` switches.

``loop_config["chaos"] = {"exit_at_step": N, "marker": PATH, "rank": R}``: rank R's (default 0) process dies
(``os._exit(1)``, no cleanup, like a lost machine) right after global step N, once — the marker file remembers
that it happened, so the worker group Ray Train restarts from the last checkpoint runs through.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _poll_s() -> float:
    return float(os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "2.0"))


def crash_switch(chaos: Mapping[str, Any] | None, *, rank: int) -> Callable[[int], None]:
    """A per-step callback: a no-op unless ``chaos`` asks rank ``rank`` to exit at a step it has not exited at."""
    if not chaos or rank != int(chaos.get("rank", 0)) or "exit_at_step" not in chaos:
        return lambda step: None
    at, marker = int(chaos["exit_at_step"]), Path(chaos["marker"])

    def on_step(step: int) -> None:
        if step == at and not marker.exists():
            marker.write_text(f"exited at step {step}\n")
            log.warning("chaos: trainer rank %d exits at step %d", rank, step)
            # Ray Train's controller collects reports when it polls the workers (every 2 s by default): a worker
            # killed sooner after a report may take that checkpoint with it, which makes the test's expected
            # restart point a race; waiting out one poll keeps the crash at step N deterministic
            time.sleep(float(chaos.get("settle_s", 2.5 * _poll_s())))
            os._exit(1)

    return on_step
