"""Progress that crosses process boundaries through a small file: the worker writes, the driver shows a bar.

Rank 0 of a training run rewrites ``progress.json`` (atomically, at most every ``interval`` seconds); the
driver, which is blocked in ``TorchTrainer.fit()``, follows it from a thread with a tqdm bar. Nothing here
depends on Ray, so the same bar works in local mode and on a cluster with shared storage.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PROGRESS = "progress.json"


class ProgressWriter:
    """Rate-limited atomic writes of ``{"step", "total", ...}`` to ``out_dir/progress.json``."""

    def __init__(self, out_dir: Path, *, total: int, interval: float = 1.0) -> None:
        self.path, self.total, self.interval, self._last = out_dir / PROGRESS, total, interval, 0.0

    def update(self, step: int, *, force: bool = False, **info: Any) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        tmp = self.path.with_name(f".{PROGRESS}.tmp")
        tmp.write_text(json.dumps({"step": step, "total": self.total, **info}))
        tmp.replace(self.path)


@contextmanager
def follow(out_dir: Path, *, desc: str, unit: str = "step", poll: float = 0.5) -> Iterator[None]:
    """Show a progress bar fed by ``out_dir/progress.json`` while the body runs (a no-op when not a TTY)."""
    if not sys.stderr.isatty():
        yield
        return
    from tqdm.auto import tqdm

    stop = threading.Event()

    def run() -> None:
        with tqdm(desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True) as bar:
            while not stop.wait(poll):
                try:
                    state = json.loads((out_dir / PROGRESS).read_text())
                except (OSError, ValueError):
                    continue
                bar.total = state.get("total") or bar.total
                bar.n = state.get("step", bar.n)
                bar.set_postfix({k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in state.items()
                                 if k not in ("step", "total")}, refresh=False)  # fmt: skip
                bar.refresh()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=2)
