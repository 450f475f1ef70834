"""Progress a person can follow: a bar on a terminal, plain lines in a log (``ray job logs``, nohup, CI).

Rank 0 of a training run rewrites ``progress.json`` (atomically, at most every ``interval`` seconds): step, total,
loss, the phase (``train`` or ``eval``), the last dev metric and ``mine_wait``. Whoever waits for the run follows
that file from a thread (:func:`follow`) — the driver of ``python -m raycl.train``, a Tune trial — and shows it as
:func:`bar` does everything else (mining, a sweep's trials): a tqdm bar when stderr is a terminal, else one line
``[raycl] WHAT: step N/TOTAL (P%), loss …, R step/s, ETA …`` when the count moves, at most every
``RAYCL_PROGRESS_MIN_S`` seconds (10), and at least every ``RAYCL_PROGRESS_MAX_S`` seconds (30) while it runs,
moving or not (a long evaluation). ``RAYCL_PROGRESS`` (``bar``, ``lines``, ``off``) overrides the choice; the
command-line entry points set it from their own stderr, and Ray's workers inherit it. Nothing here imports Ray.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from raycl.files import write_atomic

PROGRESS = "progress.json"
_last_line = [time.monotonic()]  # when this process last printed a ``[raycl]`` line (a bar's, or say's)


def say(msg: str) -> None:
    """One ``[raycl]`` line on stderr: what a run tells a person between its progress lines."""
    print(f"[raycl] {msg}", file=sys.stderr, flush=True)
    said()  # a progress bar's heartbeat counts from this line


def said() -> None:
    """A ``[raycl]`` line went out: the next bar's heartbeat counts from here, so that a bar started after a
    training, or after a step that said something, keeps the gap between two lines within ``max_s``."""
    _last_line[0] = time.monotonic()


def mode() -> str:
    """``bar`` | ``lines`` | ``off``: ``RAYCL_PROGRESS``, else a bar on a terminal and lines elsewhere."""
    chosen = os.environ.get("RAYCL_PROGRESS", "")
    return chosen if chosen in ("bar", "lines", "off") else ("bar" if sys.stderr.isatty() else "lines")


def intervals() -> tuple[float, float]:
    """The fewest and the most seconds between two progress lines (``RAYCL_PROGRESS_MIN_S``, ``…_MAX_S``)."""
    low = float(os.environ.get("RAYCL_PROGRESS_MIN_S", "10"))
    return low, max(float(os.environ.get("RAYCL_PROGRESS_MAX_S", "30")), low)


class ProgressWriter:
    """Rate-limited atomic writes of ``{"step", "total", ...}`` to ``out_dir/progress.json``; what ``update`` is
    given stays until it is given again (the phase, the last dev metric)."""

    def __init__(self, out_dir: Path, *, total: int, interval: float = 1.0) -> None:
        self.path, self.total, self.interval, self._last = out_dir / PROGRESS, total, interval, 0.0
        self.info: dict[str, Any] = {}

    def update(self, step: int, *, force: bool = False, **info: Any) -> None:
        self.info.update(info)
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        info = {k: float(v) if hasattr(v, "item") else v for k, v in self.info.items()}  # a device loss: read now
        write_atomic(self.path, json.dumps({"step": step, "total": self.total, **info}), durable=False)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _duration(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class LineBar:
    """The part of tqdm's interface raycl uses (``update``, ``n``, ``total``, ``set_postfix``, ``refresh``,
    ``close``), written as lines on stderr: on a change at most every ``min_s``, and from a thread at least every
    ``max_s`` while open."""

    def __init__(self, total: int | None = None, desc: str = "", unit: str = "it", **_: Any) -> None:
        self.total, self.desc, self.unit, self.n = total, desc, unit, 0
        self.postfix: dict[str, Any] = {}
        self.min_s, self.max_s = intervals()
        self.last = self.t0 = time.monotonic()
        self.beat_from = _last_line[0]  # the heartbeat counts from the process's last line, not this bar's start
        self.n0: int | None = None  # the count when first seen (a resumed run starts past 0), and when
        self.t_n0 = self.t0
        self.shown: tuple[int, dict[str, Any]] | None = None  # what the last line showed
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(min(0.5, self.max_s / 4)):
            if time.monotonic() - self.beat_from >= self.max_s:
                self.emit()

    def update(self, n: int = 1) -> None:
        self.n += n
        self.refresh()

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, refresh: bool = True, **kwargs: Any) -> None:
        self.postfix = {**(ordered_dict or {}), **kwargs}
        if refresh:
            self.refresh()

    def refresh(self) -> None:
        if self.n0 is None and self.n:
            self.n0, self.t_n0 = self.n, time.monotonic()
        if self.shown != (self.n, self.postfix) and time.monotonic() - self.last >= self.min_s:
            self.emit()  # news: at most every min_s (the heartbeat says the rest)

    def line(self) -> str:
        now = time.monotonic()
        count = f"/{self.total} ({100 * self.n / self.total:.0f}%)" if self.total else ""
        parts = [f"{self.unit} {self.n}{count}"]
        parts += [f"{k} {_fmt(v)}" for k, v in self.postfix.items()]
        done = self.n - (self.n0 or 0)
        rate = done / max(now - self.t_n0, 1e-9) if self.n0 is not None and done > 0 else None
        if rate is not None:
            parts.append(f"{rate:.3g} {self.unit}/s")
            if self.total:
                parts.append(f"ETA {_duration(max(self.total - self.n, 0) / rate)}")
        parts.append(f"elapsed {_duration(now - self.t0)}")
        return f"[raycl] {self.desc}: " + ", ".join(parts)

    def emit(self) -> None:
        with self._lock:
            self.last = self.beat_from = time.monotonic()
            self.shown = (self.n, dict(self.postfix))
            print(self.line(), file=sys.stderr, flush=True)
            said()

    def close(self) -> None:
        self._stop.set()
        self.refresh()  # the last state, unless a line went out less than min_s ago

    def __enter__(self) -> LineBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def bar(total: int | None = None, *, desc: str, unit: str = "it", enabled: bool = True) -> Any:
    """A progress bar on a terminal, a :class:`LineBar` in a log, nothing with ``RAYCL_PROGRESS=off`` or not
    ``enabled``."""
    chosen = mode() if enabled else "off"
    if chosen == "lines":
        return LineBar(total=total, desc=desc, unit=unit)
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, disable=chosen == "off")


@contextmanager
def follow(
    out_dir: Path,
    *,
    desc: str,
    unit: str = "step",
    poll: float = 0.5,
    lines_only: bool = False,
    waiting: str | None = None,
) -> Iterator[None]:
    """Show ``out_dir/progress.json`` while the body runs, as :func:`bar` (``lines_only``: nothing on a terminal —
    a Tune trial's process has none). ``waiting``: what the training waits for until its first progress (its
    worker group: on a busy or autoscaling cluster that can take minutes), shown as ``waiting for …``."""
    if mode() == "off" or (lines_only and mode() != "lines"):
        yield
        return
    stop, since = threading.Event(), time.time()

    def run() -> None:
        with bar(desc=desc, unit=unit) as shown:
            if waiting:
                shown.set_postfix({"waiting for": waiting}, refresh=False)
            while not stop.wait(poll):
                try:
                    if (out_dir / PROGRESS).stat().st_mtime < since:
                        continue  # an earlier driver's (a resumed run): not this training's yet
                    state = json.loads((out_dir / PROGRESS).read_text())
                except (OSError, ValueError):
                    continue
                shown.total = state.get("total") or shown.total
                shown.n = state.get("step", shown.n)
                shown.set_postfix(
                    {
                        k: (f"{v:.4g}" if isinstance(v, float) else v)
                        for k, v in state.items()
                        if k not in ("step", "total")
                    },
                    refresh=False,
                )
                shown.refresh()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=2)
