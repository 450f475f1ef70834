"""Files raycl writes and reads back, kept out of other users' reach.

* **Atomic writes through temp names nobody can plant.** Every file raycl writes whole (a text, a table, a
  checkpoint, a shard) goes to a fresh temp file in the target's folder, created with ``O_CREAT | O_EXCL |
  O_NOFOLLOW`` under a random name (``.NAME.<random>.tmp``: a link or file already there makes the create fail,
  it is never followed or reused), ``fsync``ed, renamed over the target with ``os.replace`` and the rename synced
  with the folder — complete or absent, and a link planted at a predictable name writes nothing through it. A
  folder (a model) is written into a fresh temp folder and renamed likewise. The temp file's mode is the umask's,
  as a plain ``open`` would make it.
* **Folders that are the user's.** What raycl reads back from a folder it wrote (a run folder it resumes: Ray
  Tune's restore unpickles its state; a cache) is trusted only if nobody else could have put it there: each path
  owned by the user running raycl (its effective uid) or root, writable by no one else (a group counts only when
  another user is in it), and no symbolic link leading out of the folder (:func:`check_ours`). The rule of OpenSSH
  for a key file and of Git for a repository (``safe.directory``).
"""

from __future__ import annotations

import functools
import grp
import os
import pwd
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from raycl.errors import UserError, at

TRUST_HINT = (
    "make it yours (chown -R, chmod -R go-w, or copy it: cp -r), or choose another --out; or, if you "
    "trust everyone who can write it, rerun with --trust-out"
)
_TRIES = 16  # random names tried before giving up (a clash is 1 in 2^48 per try)


def _temp_name(path: Path) -> Path:
    """A temp sibling of ``path`` (hidden: never uploaded, never taken for content) that nobody can guess."""
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")


def _create(path: Path) -> tuple[int, Path]:
    """A new temp file beside ``path``, opened for writing: created, never an existing file or link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_TRIES):
        tmp = _temp_name(path)
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"{path}: no free temp name after {_TRIES} tries")


def sync_dir(folder: Path) -> None:
    """A rename in ``folder`` on the disk (the folder's entry, not only the file's bytes)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(
    path: str | Path, mode: str = "wb", *, durable: bool = True, **open_args: Any
) -> Iterator[IO[Any]]:
    """An open file (``mode``: ``"wb"`` or ``"w"`` with ``encoding`` / ``newline``) whose bytes replace ``path``
    when the block ends without an error — synced, renamed, the rename synced (``durable``; a status file that is
    rewritten every second skips the syncs); on an error ``path`` is as it was and the temp file gone."""
    path = Path(path)
    fd, tmp = _create(path)
    try:
        with os.fdopen(fd, mode, **open_args) as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        sync_dir(path.parent)


def write_atomic(path: str | Path, data: bytes | str, *, durable: bool = True) -> None:
    """``data`` (bytes, or text written as UTF-8) to ``path`` through :func:`atomic_file`."""
    with atomic_file(path, "wb", durable=durable) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """A fresh temp folder beside ``path`` to fill; when the block ends without an error it replaces ``path`` (an
    older folder removed first; a link at ``path`` is replaced, never followed). Temp folders an interrupted
    write left for ``path`` are removed first."""
    path = Path(path)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
    for _ in range(_TRIES):
        tmp = _temp_name(path)
        try:
            tmp.mkdir(mode=0o777)  # the umask's mode, like any folder; fails on anything already there
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"{path}: no free temp name after {_TRIES} tries")
    try:
        yield tmp
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    sync_dir(path.parent)


def copy_atomic(src: str | Path, dst: str | Path) -> None:
    """``src``'s bytes to ``dst`` through :func:`atomic_file`."""
    with open(src, "rb") as f, atomic_file(dst, "wb") as out:
        shutil.copyfileobj(f, out, 1 << 22)


# ---------------------------------------------------------------------------------------------- ownership
def foreign(path: Path, st: os.stat_result | None = None) -> str | None:
    """Why another user could have put ``path`` there (its ``lstat``, or ``st``): owned by someone else than this
    user (effective uid) or root, or writable by others — or None. A folder with the sticky bit (``/tmp``) may be
    writable by all: there nobody renames or replaces what another user owns."""
    st = st or os.lstat(path)
    if st.st_uid not in (os.geteuid(), 0):
        return f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}) or root"
    shared = st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and _group_shared(st.st_gid, st.st_uid))
    if shared and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        return f"writable by users other than its owner (mode {stat.filemode(st.st_mode)})"
    return None


def check_owner(path: Path, *, what: str, hint: str) -> None:
    """A cache folder (``what``) used only if this user owns it — root's is not this user's cache either; the
    caller makes it mode 0700, so nobody else can write it from then on."""
    owner = path.stat().st_uid
    if owner != os.geteuid():
        raise UserError(
            f"{at(path)}: {what} owned by uid {owner}, not by this user (uid {os.geteuid()}): "
            f"refused, expected this user's own cache ({hint})"
        )


@functools.lru_cache(maxsize=256)
def _group_shared(gid: int, uid: int) -> bool:
    """Whether group ``gid`` has a member other than user ``uid`` (a user-private group has none)."""
    try:
        group, owner = grp.getgrgid(gid), pwd.getpwuid(uid).pw_name
    except KeyError:
        return True
    return bool(set(group.gr_mem) - {owner}) or any(u.pw_gid == gid and u.pw_uid != uid for u in pwd.getpwall())


def check_ours(root: Path, *, what: str, hint: str) -> None:
    """``root``, every folder above it and, if it exists, everything under it, as :func:`foreign` wants them; a
    symbolic link under ``root`` that leads out of it is refused too. ``root`` need not exist yet (a fresh
    ``--out``): then whoever can write the folders above it could replace it, so those are checked. One line
    naming the path, ``what`` ``root`` is and ``hint`` (how to proceed), exit status 2."""
    real = Path(os.path.realpath(root))  # the folders it really is in, links above it resolved
    for path in (*reversed(real.parents), real):
        try:
            st = os.lstat(path)
        except FileNotFoundError:  # a fresh --out: what is above it was checked
            break
        _refuse(path, foreign(path, st), what, hint)
    if real.is_dir():
        for path in _walk(real):
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                target = path.resolve()
                if not target.is_relative_to(real):
                    _refuse(path, f"a symbolic link to {target}, outside {real}", what, hint)
                continue
            _refuse(path, foreign(path, st), what, hint)


def _walk(root: Path) -> Iterator[Path]:
    """Every path under ``root`` (links listed, never followed)."""
    for dirpath, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            yield Path(dirpath) / name


def _refuse(path: Path, why: str | None, what: str, hint: str) -> None:
    if why is not None:
        raise UserError(
            f"{at(path)}: {why}: refused, expected {what} that only you (or root) can have written; {hint}"
        )


@contextmanager
def flocked(path: Path, *, blocking: bool = True) -> Iterator[bool]:
    """An exclusive ``flock`` on the lock file ``path`` (created, owner-only, if missing; never through a link
    planted at its name, never truncated) while the block runs: True when held; with ``blocking=False``, False at
    once where another process holds it. The kernel lets go when the descriptor closes or the process dies."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
