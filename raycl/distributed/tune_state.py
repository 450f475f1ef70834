"""Ray Tune's saved sweep state on an object store: restored only when raycl can tell that it wrote it.

Tune saves a sweep as pickles (``tuner.pkl``, the search algorithm's state) and as JSON that embeds pickles
(``experiment_state-*.json``); restoring the sweep unpickles them, so whoever can write a run's prefix could run
code as the user who restores it. A local run folder is refused when users other than its owner can write it
(:mod:`raycl.run_folder`); an object store has no such modes, so raycl keeps its own record: the sha256 of every
state file (``.json``, ``.pkl``: what Tune's restore reads) Tune writes at the top of a sweep's experiment folder,
taken from the bytes as they are uploaded, in the user's private cache (``$RAYCL_CACHE_DIR/tune_state/<digest of
the experiment's URI>.json``, mode 0700).

Before a restore every top-level state file the store holds must be one of the recorded versions, and Tune then
reads the very bytes that were checked: its file system is :class:`GuardedStore`, which serves the checked copies
of those files and hides any other, so an object replaced or added after the check is never read. A pickle read
back during the run (a trial's ``error.pkl``) must be one this process wrote. Otherwise the restore is refused in
one line, exit status 2, saying how to start afresh, or to trust the store (``raycl.tune --trust-store``: the
state is then restored as it is, which is what a user who alone can write the prefix may choose).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from raycl.errors import UserError
from raycl.files import write_atomic
from raycl.storage import RAY_DIR, cache_dir, filesystem, remote_of

RECORDS = "tune_state"  # the cache folder of the records
KEEP = 64  # versions kept per file name: Tune rewrites its experiment state at every snapshot
TUNER = "tuner.pkl"
STATE_FILES = (".json", ".pkl")  # the top-level files Tune's restore reads (the others it only looks for)
_trusted: set[str] = set()


def trust(uri: str) -> None:
    """``--trust-store``: the sweeps under ``uri`` (a run's URI) are restored from the store as they are."""
    _trusted.add(uri.rstrip("/"))


def _is_trusted(uri: str) -> bool:
    return any(uri == t or uri.startswith(t + "/") for t in _trusted)


def _record(uri: str) -> Path:
    return cache_dir(RECORDS) / f"{hashlib.sha256(uri.encode()).hexdigest()[:32]}.json"


def recorded(uri: str) -> dict[str, list[str]] | None:
    """The versions (sha256) raycl wrote of each top-level file of the experiment at ``uri``; None: no record."""
    try:
        got = json.loads(_record(uri).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return got.get("files") if isinstance(got, dict) and got.get("uri") == uri else None


def _remember(uri: str, name: str, digest: str) -> None:
    files = recorded(uri) or {}
    versions = [d for d in files.get(name, []) if d != digest] + [digest]
    files[name] = versions[-KEEP:]
    path = _record(uri)
    write_atomic(path, json.dumps({"uri": uri, "files": files}, indent=1, sort_keys=True))


# ---------------------------------------------------------------------------------------------- the check
def check_run(run_dir: Path) -> None:
    """Before Ray starts: every sweep a staged run holds in the store (``OUT/ray/NAME/tuner.pkl``) checked as its
    restore will check it (:func:`checked`), so that a refusal is one line before anything ran."""
    uri = remote_of(run_dir)
    if uri is None:
        return
    fs, where = filesystem(f"{uri}/{RAY_DIR}")
    for info in fs.get_file_info(pafs.FileSelector(where, allow_not_found=True)):
        if info.type == pafs.FileType.Directory and fs.get_file_info(f"{info.path}/{TUNER}").is_file:
            checked(fs, info.path, f"{uri}/{RAY_DIR}/{info.base_name}")


def checked(fs: pafs.FileSystem, path: str, uri: str) -> dict[str, bytes]:
    """The top-level files of the experiment folder ``path`` (``uri``) as the store holds them, each checked to be
    a version raycl recorded writing there — unless the run was trusted (``--trust-store``); else one line."""
    files = {}
    for info in fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)):
        if info.type == pafs.FileType.File and info.base_name.endswith(STATE_FILES):
            with fs.open_input_stream(info.path) as f:
                files[info.base_name] = bytes(f.read())
    if _is_trusted(uri):
        return files
    how = (
        f"start afresh with another --out (or delete {uri} from the store), or, if only you can write this "
        "prefix, restore it anyway with --trust-store (anyone who can write it could then run code as you)"
    )
    versions = recorded(uri)
    if versions is None:
        raise UserError(
            f"{uri}: Ray Tune's saved sweep state, which restoring the sweep unpickles, was not "
            f"written by raycl as this user on this machine (no record in {_record(uri).parent}): "
            f"refused; {how}"
        )
    for name, data in sorted(files.items()):
        digest = hashlib.sha256(data).hexdigest()
        if digest not in versions.get(name, []):
            raise UserError(
                f"{uri}/{name}: not a version raycl wrote there (sha256 {digest[:16]}…), and "
                f"restoring the sweep would unpickle it: refused; {how}"
            )
    return files


def guarded(fs: pafs.FileSystem, path: str, uri: str, pinned: dict[str, bytes] | None = None) -> pafs.FileSystem:
    """Tune's file system for the experiment folder ``path`` (``uri``) of the store ``fs``: :class:`GuardedStore`
    (records what Tune writes there; with ``pinned``, the checked files a restore reads)."""
    return pafs.PyFileSystem(GuardedStore(_sync_writes(fs), path, uri, pinned))


@dataclass
class _Seen:
    """What one :func:`guarded` file system has checked and written, shared by its copies in a process (Tune
    pickles a trial's storage, file system included, into each trial it restores or creates)."""

    served: dict[str, bytes] = field(default_factory=dict)  # a top-level state file's name → its bytes
    wrote: dict[str, str] = field(default_factory=dict)  # a pickle's path → the sha256 of what was written
    lock: threading.Lock = field(default_factory=threading.Lock)


_SEEN: dict[str, _Seen] = {}


def _sync_writes(fs: pafs.FileSystem) -> pafs.FileSystem:
    """An S3 file system like ``fs`` that uploads in the writing thread: Ray turns pyarrow's threaded copies off
    for an ``S3FileSystem`` destination (their background uploads wait on the same thread pool), and cannot see
    that a :class:`GuardedStore` wraps one."""
    if isinstance(fs, pafs.S3FileSystem):
        rebuild, (options,) = fs.__reduce__()  # type: ignore[misc]  # S3FileSystem's own pickling: its options
        return rebuild({**options, "background_writes": False})  # type: ignore[no-any-return]
    return fs


# ---------------------------------------------------------------------------------------------- the file system
class GuardedStore(pafs.FileSystemHandler):
    """``inner`` as Ray Tune sees it (a ``pyarrow.fs.PyFileSystem`` handler): every call passes through, except
    that the top-level state files of the experiment folder ``experiment`` are read only from what was checked
    (``pinned``) or written by this process (others are not there), what this driver writes there is recorded
    (:func:`_remember`), and a pickle elsewhere is read only if this process wrote those very bytes."""

    def __init__(
        self, inner: pafs.FileSystem, experiment: str, uri: str, pinned: dict[str, bytes] | None = None
    ) -> None:
        self.inner, self.experiment, self.uri = inner, experiment.rstrip("/"), uri
        self.pid = os.getpid()  # the driver: only it records (the handler travels to Tune's trial actors)
        self.key = uuid.uuid4().hex
        self.seen = _SEEN.setdefault(self.key, _Seen(served=dict(pinned or {})))

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "seen"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.seen = _SEEN.setdefault(self.key, _Seen())  # the driver's own copies share what it saw

    def _top(self, path: str) -> str | None:
        """The name of a state file (``.json``, ``.pkl``) at the top of the experiment folder, else None."""
        parent, _, name = path.rstrip("/").rpartition("/")
        return name if parent == self.experiment and name.endswith(STATE_FILES) else None

    def _hidden(self, info: pafs.FileInfo) -> bool:
        name = self._top(info.path)
        return info.type == pafs.FileType.File and name is not None and name not in self.seen.served

    def get_type_name(self) -> str:
        return f"raycl-guarded+{self.inner.type_name}"

    def normalize_path(self, path: str) -> str:
        return self.inner.normalize_path(path)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return [
            pafs.FileInfo(i.path, pafs.FileType.NotFound) if self._hidden(i) else i
            for i in self.inner.get_file_info(paths)
        ]

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return [i for i in self.inner.get_file_info(selector) if not self._hidden(i)]

    def create_dir(self, path: str, recursive: bool) -> None:
        self.inner.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.inner.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        self.inner.delete_dir_contents("/", accept_root_dir=True)

    def delete_file(self, path: str) -> None:
        self.inner.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.inner.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self.inner.copy_file(src, dest)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self._open(path, self.inner.open_input_stream)

    def open_input_file(self, path: str) -> pa.NativeFile:
        return self._open(path, self.inner.open_input_file)

    def _open(self, path: str, opener: Any) -> pa.NativeFile:
        name = self._top(path)
        if name is not None:
            with self.seen.lock:
                data = self.seen.served.get(name)
            if data is None:
                raise FileNotFoundError(f"{path}: not a file Tune's restore may read (raycl's check)")
            return pa.BufferReader(data)
        if path.endswith(".pkl"):
            with opener(path) as f:
                data = bytes(f.read())
            if self.seen.wrote.get(path) != hashlib.sha256(data).hexdigest():
                raise UserError(
                    f"{self.uri}/{path[len(self.experiment) + 1 :]}: a pickle in the store that this "
                    "run did not write (or that changed since), refused: reading it would run its "
                    "code"
                )
            return pa.BufferReader(data)
        return opener(path)

    def open_output_stream(self, path: str, metadata: dict[str, str] | None = None) -> pa.NativeFile:
        out = self.inner.open_output_stream(path, metadata=metadata)
        name = self._top(path)
        if name is None and not path.endswith(".pkl"):
            return out
        return pa.PythonFile(_Recording(out, lambda data: self._wrote(path, name, data)), mode="w")

    def open_append_stream(self, path: str, metadata: dict[str, str] | None = None) -> pa.NativeFile:
        return self.inner.open_append_stream(path, metadata=metadata)

    def _wrote(self, path: str, name: str | None, data: bytes) -> None:
        digest = hashlib.sha256(data).hexdigest()
        with self.seen.lock:
            self.seen.wrote[path] = digest
            if name is not None:
                self.seen.served[name] = data
                if os.getpid() == self.pid:
                    _remember(self.uri, name, digest)


class _Recording:
    """A write-only file over ``out`` that keeps what was written and hands it to ``done`` once ``out`` closed
    (the object is then in the store, whole)."""

    def __init__(self, out: pa.NativeFile, done: Any) -> None:
        self.out, self.done, self.parts = out, done, bytearray()
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.parts += view
        self.out.write(view)
        return len(view)

    def flush(self) -> None:
        self.out.flush()

    def tell(self) -> int:
        return len(self.parts)

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.out.close()
            self.done(bytes(self.parts))
