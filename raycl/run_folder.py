"""A run folder (``--out`` of ``raycl.train`` / ``raycl.tune``), checked on the driver before anything runs.

* raycl writes into, and replaces parts of, only a folder it made: a new or empty one, or an earlier run's (its
  ``raycl_run.json``; folders of raycl versions before that marker are known by ``config.yaml`` next to ``trials/``
  or ``ray/``). Any other existing folder is refused in one line, exit status 2.
* An earlier run's checkpoints are read as a resumed worker would read them (``weights_only``), so one that holds
  anything but data is refused here, in one line, rather than as a worker's retried traceback.
* Ray Tune's experiment state, which a sweep's restore reads, is a pickle (Ray's own format), and checkpoints and
  n-best shards are read back too: a folder that another user owns or can write, or that a link leads out of, is
  refused before anything in it is read — and a fresh ``--out`` that others could replace before anything is
  written — unless the user trusts it (``--trust-out``).
"""

from __future__ import annotations

import json
from pathlib import Path

from raycl.files import TRUST_HINT, check_ours
from raycl.records import atomic_write, refuse_foreign_dir
from raycl.training.checkpoint import check_checkpoints

MARKER = "raycl_run.json"


def open_run_folder(run_dir: Path, *, space: str, trusted: bool = False) -> None:
    """``run_dir`` claimed for a run of ``space``: made (with its marker), or an earlier run's, checked — first
    that it is the user's (:func:`check_private`), unless ``trusted`` (``--trust-out``)."""
    if not trusted:
        check_private(run_dir)
    legacy = (run_dir / "config.yaml").is_file() and ((run_dir / "trials").is_dir() or (run_dir / "ray").is_dir())
    if not legacy:
        refuse_foreign_dir(
            run_dir,
            marker=MARKER,
            what="a raycl run folder",
            hint="expected a new or empty folder, or an earlier run's: choose another --out",
        )
    if (run_dir / "ray").is_dir():
        check_checkpoints(run_dir / "ray")
    run_dir.mkdir(mode=0o755, parents=True, exist_ok=True)  # never writable by others, whatever the umask
    if not (run_dir / MARKER).is_file():
        atomic_write(run_dir / MARKER, json.dumps({"space": space}))


def check_private(run_dir: Path) -> None:
    """``run_dir``, the folders above it and everything under it owned by this user (or root), writable by no one
    else, with no link out of it (:func:`raycl.files.check_ours`): what a run folder holds is read back — resumed
    checkpoints, n-best shards, and Ray Tune's experiment state, which a sweep's restore unpickles. Before anything
    is read or written; a fresh ``--out`` is checked too (whoever can write the folder above it could replace
    it)."""
    check_ours(run_dir, what="a run folder", hint=TRUST_HINT)
