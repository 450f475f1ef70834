"""A run's records on disk: ``history.jsonl`` (one line per report) and atomic writes of texts, tables, plots and
model folders (:mod:`raycl.files`: a fresh temp file nobody can plant, ``fsync``ed, renamed, the folder synced) — a
run killed mid-write never leaves half a file behind, and a power cut no renamed but empty file either. In a run
staged for an object store (``--out s3://…``, :mod:`raycl.storage`) each write is uploaded as soon as it is
renamed into place."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raycl.errors import UserError, at
from raycl.files import atomic_dir, atomic_file, write_atomic
from raycl.files import copy_atomic as copy_file
from raycl.storage import mirror


@dataclass
class TrialOutcome:
    """What a recipe needs from a finished trial of a sweep: its point, every report it made, and any error."""

    trial_id: str
    params: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


HISTORY = "history.jsonl"
DONE = "done.json"  # a training that ended: a resumed run keeps it as it is
STARTS = "starts.jsonl"  # one line each time a training started: from scratch, or from a checkpoint at a step


def append_history(out_dir: Path, metrics: dict[str, Any], *, key: str = "report") -> list[dict[str, Any]]:
    """``history.jsonl``: one line per report (rewritten atomically); a resumed run drops the reports it replays
    (those at or after ``metrics[key]``)."""
    rows = [r for r in read_history(out_dir) if r.get(key, 0) < metrics[key]] + [metrics]
    atomic_write(out_dir / HISTORY, "".join(json.dumps(r) + "\n" for r in rows).rstrip("\n"))
    return rows


def read_history(out_dir: Path) -> list[dict[str, Any]]:
    path = out_dir / HISTORY
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def mark_done(out_dir: Path, **info: Any) -> None:
    """Record that the training in ``out_dir`` ended (its history and kept model are final)."""
    atomic_write(out_dir / DONE, json.dumps(info))


def is_done(out_dir: Path) -> bool:
    return (out_dir / DONE).is_file()


def append_start(out_dir: Path, **info: Any) -> None:
    """``starts.jsonl``: one line each time the training in ``out_dir`` starts (rewritten atomically)."""
    path = out_dir / STARTS
    old = path.read_text(encoding="utf-8").rstrip("\n") + "\n" if path.exists() else ""
    atomic_write(path, old + json.dumps(info))


def atomic_write(path: Path, text: str) -> None:
    """``text`` and a newline to ``path``, atomically (:func:`raycl.files.atomic_file`), then mirrored."""
    write_atomic(path, text + "\n")
    mirror(path)


def hash_folder(h: Any, root: Path) -> Any:
    """``h`` (a hashlib object) updated with the names and bytes of the files under ``root``, in name order; hidden
    paths are caches, not the content (``<model>/.ct2/`` conversions appear after the first mining)."""
    files = (p for p in root.rglob("*") if p.is_file())
    for path in sorted(p for p in files if not any(part.startswith(".") for part in p.relative_to(root).parts)):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        with path.open("rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return h


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rows with possibly different keys: the header is their union, in first-seen order."""
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with atomic_file(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    mirror(path)


def save_png(fig: Any, path: Path) -> Path:
    with atomic_file(path, "wb") as f:
        fig.savefig(f, format="png", dpi=120)
    mirror(path)
    return path


def save_dir_atomic(save: Callable[[Path], Any], out: Path) -> None:
    """``save(tmp)`` writes a folder (``model.save_pretrained``), which then replaces ``out`` in one rename."""
    with atomic_dir(out) as tmp:
        save(tmp)
    mirror(out)


def refuse_foreign_dir(out: Path, *, marker: str, what: str, hint: str) -> None:
    """An existing ``out`` that is not empty and does not hold ``marker`` (so raycl did not write it) is refused in
    one line: raycl writes into, and replaces, only what it wrote itself."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not (out / marker).is_file():
        raise UserError(f"{at(out)}: exists and is not {what} (no {marker}); {hint}")


def copy_atomic(src: Path, dst: Path) -> None:
    copy_file(src, dst)
    mirror(dst)
