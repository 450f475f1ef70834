"""A run's records on disk: ``history.jsonl`` (one line per report) and atomic writes of texts, tables, plots and
model folders — a run killed mid-write never leaves half a file behind."""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raycl.errors import UserError, at

HISTORY = "history.jsonl"


def append_history(out_dir: Path, metrics: dict[str, Any], *, key: str = "report") -> list[dict[str, Any]]:
    """``history.jsonl``: one line per report (rewritten atomically); a resumed run drops the reports it replays
    (those at or after ``metrics[key]``)."""
    rows = [r for r in read_history(out_dir) if r.get(key, 0) < metrics[key]] + [metrics]
    atomic_write(out_dir / HISTORY, "".join(json.dumps(r) + "\n" for r in rows).rstrip("\n"))
    return rows


def read_history(out_dir: Path) -> list[dict[str, Any]]:
    path = out_dir / HISTORY
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


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


def refuse_foreign_dir(out: Path, *, marker: str, what: str, hint: str) -> None:
    """An existing ``out`` that is not empty and does not hold ``marker`` (so raycl did not write it) is refused in
    one line: raycl writes into, and replaces, only what it wrote itself."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not (out / marker).is_file():
        raise UserError(f"{at(out)}: exists and is not {what} (no {marker}); {hint}")


def copy_atomic(src: Path, dst: Path) -> None:
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.copyfile(src, tmp)
    tmp.replace(dst)
