"""A run folder (``--out`` of ``raycl.train`` / ``raycl.tune``), checked on the driver before anything runs.

* raycl writes into, and replaces parts of, only a folder it made: a new or empty one, or an earlier run's (its
  ``raycl_run.json``; folders of raycl versions before that marker are known by ``config.yaml`` next to ``trials/``
  or ``ray/``). Any other existing folder is refused in one line, exit status 2.
* An earlier run's checkpoints are read as a resumed worker would read them (``weights_only``), so one that holds
  anything but data is refused here, in one line, rather than as a worker's retried traceback.
* Ray Tune's experiment state, which a sweep's restore reads, is a pickle (Ray's own format): a folder that users
  other than its owner can write is not restored.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import stat
from pathlib import Path

from raycl.errors import UserError, at
from raycl.records import atomic_write, refuse_foreign_dir
from raycl.training.checkpoint import check_checkpoints

MARKER = "raycl_run.json"


def open_run_folder(run_dir: Path, *, space: str) -> None:
    """``run_dir`` claimed for a run of ``space``: made (with its marker), or an earlier run's, checked."""
    legacy = (run_dir / "config.yaml").is_file() and ((run_dir / "trials").is_dir() or (run_dir / "ray").is_dir())
    if not legacy:
        refuse_foreign_dir(run_dir, marker=MARKER, what="a raycl run folder",
                           hint="expected a new or empty folder, or an earlier run's: choose another --out")
    if (run_dir / "ray").is_dir():
        check_private(run_dir)
        check_checkpoints(run_dir / "ray")
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / MARKER).is_file():
        atomic_write(run_dir / MARKER, json.dumps({"space": space}))


def check_private(run_dir: Path) -> None:
    """``run_dir`` and everything under ``run_dir/ray`` writable by their owner alone (or a group of no one else):
    Tune unpickles its experiment state when a sweep is restored."""
    for path in (run_dir, *_walk(run_dir / "ray")):
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            continue
        if st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and _group_shared(st.st_gid, st.st_uid)):
            mode = stat.filemode(st.st_mode)
            raise UserError(f"{at(path)}: writable by users other than its owner (mode {mode}), expected a run "
                            "folder only its owner can write: Ray Tune's restore unpickles what is in it (chmod -R"
                            " go-w the folder if you trust its contents)")  # fmt: skip


def _walk(root: Path) -> list[Path]:
    out: list[Path] = []
    for dirpath, dirs, files in os.walk(root):
        out += [Path(dirpath) / n for n in (*dirs, *files)]
    return [root, *out] if root.exists() else []


def _group_shared(gid: int, uid: int) -> bool:
    """Whether group ``gid`` has a member other than user ``uid`` (a user-private group has none)."""
    try:
        group, owner = grp.getgrgid(gid), pwd.getpwuid(uid).pw_name
    except KeyError:
        return True
    return bool(set(group.gr_mem) - {owner}) or any(u.pw_gid == gid and u.pw_uid != uid for u in pwd.getpwall())
