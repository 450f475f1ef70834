"""Pieces every recipe shares: messages, the run record (``history.jsonl``), picking the best report of a sweep,
and atomic writes of tables, texts, plots and model folders."""

from __future__ import annotations

import csv
import json
import math
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raycl.distributed.sweep import TrialOutcome

HISTORY = "history.jsonl"


def say(msg: str) -> None:
    print(f"[raycl] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- history
def append_history(out_dir: Path, metrics: dict[str, Any], *, key: str = "epoch") -> list[dict[str, Any]]:
    """``history.jsonl``: one line per report (rewritten atomically); a resumed run drops the reports it replays
    (those at or after ``metrics[key]``)."""
    rows = [r for r in read_history(out_dir) if r.get(key, 0) < metrics[key]] + [metrics]
    atomic_write(out_dir / HISTORY, "".join(json.dumps(r) + "\n" for r in rows).rstrip("\n"))
    return rows


def read_history(out_dir: Path) -> list[dict[str, Any]]:
    path = out_dir / HISTORY
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


# ---------------------------------------------------------------------------------------------- selection
def num(v: Any) -> float | None:
    """``v`` as a finite float, or None (missing, NaN, not a number)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def best_row(trial: TrialOutcome, metric: str, mode: str = "max") -> dict[str, Any] | None:
    """The report of ``trial`` with the best ``metric`` (the checkpoint picked on dev; earliest on ties)."""
    rows = [r for r in trial.history if num(r.get(metric)) is not None]
    if not rows:
        return None
    sign = 1.0 if mode == "max" else -1.0
    return max(rows, key=lambda r: (sign * float(r[metric]), -float(r.get("step", r.get("epoch", 0)))))


def best_trial(trials: list[TrialOutcome], *, metric: str, mode: str = "max") -> TrialOutcome | None:
    scored = [(t, best_row(t, metric, mode)) for t in trials]
    scored = [(t, r) for t, r in scored if r is not None]
    if not scored:
        return None
    sign = 1.0 if mode == "max" else -1.0
    return max(scored, key=lambda tr: sign * float((tr[1] or {})[metric]))[0]


# ---------------------------------------------------------------------------------------------- files
def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    tmp.replace(path)


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rows with possibly different keys: the header is their union, in first-seen order."""
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)


def save_png(fig: Any, path: Path) -> Path:
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=120)
    tmp.replace(path)
    return path


def save_dir_atomic(save: Callable[[Path], Any], out: Path) -> None:
    """``save(tmp)`` writes a folder (``model.save_pretrained``), which then replaces ``out`` in one rename."""
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
