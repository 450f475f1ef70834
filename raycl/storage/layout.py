"""What a run folder holds in an object store: its index and folder manifests (``_manifest.json``: every file with
its size and sha256), the names that stay local (temp files, the mining lock) and Ray's own storage."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

MANIFEST = "_manifest.json"
RAY_DIR = "ray"  # Ray Train/Tune's own storage under a run: written to the store by Ray, never staged
INPUTS = "inputs"  # the node's cache of inputs given as URIs (fetch), beside stage/ (the staged runs)
STAGE = "stage"
LOCK = "_mining.lock"  # a run's own lock on its folder (raycl.miners.shards): of this machine, never uploaded


def local_only(rel: str) -> bool:
    """Temp and bookkeeping files (``.name``: temp files, a range's attempt count), the lock: never uploaded."""
    parts = rel.split("/")
    return any(s.startswith(".") for s in parts) or parts[-1] == LOCK


CHUNK = 8 << 20  # bytes read or written at a time


def staged_files(folder: Path) -> dict[str, Path]:
    """A staged folder's files by relative path: not Ray's storage, temp files (``.name``) or manifests."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() and rel.split("/")[0] != RAY_DIR and not local_only(rel) and p.name != MANIFEST:
            out[rel] = p
    return out


def describe_files(files: dict[str, Path]) -> dict[str, dict[str, Any]]:
    return {rel: {"size": p.stat().st_size, "sha256": sha256(p)} for rel, p in files.items()}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()
