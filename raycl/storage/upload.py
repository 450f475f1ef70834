"""Writing a staged run to its store: a file in one PUT (complete or absent), a folder between a pending and a
complete manifest, the run's index last (:func:`push`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raycl.storage.download import run_objects
from raycl.storage.layout import CHUNK, MANIFEST, describe_files, local_only, staged_files
from raycl.storage.staging import remote_of
from raycl.storage.uris import filesystem

if TYPE_CHECKING:
    import pyarrow.fs as pafs


def mirror(path: Path) -> None:
    """Upload a staged file (one PUT) or folder (pending manifest, files, complete manifest); others: nothing."""
    uri = remote_of(path)
    if uri is None or local_only(path.name):
        return
    fs, where = filesystem(uri)
    if path.is_dir():
        _put_folder(fs, path, where)
    else:
        _put(fs, path, where)


def publish(folder: Path) -> None:
    """A staged folder that workers on other nodes will read (a training's initial model): uploaded unless the
    store already holds it whole, as :func:`local` wants it."""
    uri = remote_of(folder)
    if uri is None or not folder.is_dir():
        return
    fs, where = filesystem(uri)
    try:
        with fs.open_input_stream(f"{where}/{MANIFEST}") as f:
            manifest = json.loads(bytes(f.read()))
    except (OSError, ValueError):
        manifest = {}
    sizes = {rel: p.stat().st_size for rel, p in staged_files(folder).items()}
    if not manifest.get("complete") or {k: v["size"] for k, v in manifest["files"].items()} != sizes:
        _put_folder(fs, folder, where)


def push(run_dir: Path) -> None:
    """Everything of a staged run not in the store yet (or of another size), then its index ``_manifest.json``
    (every file with size and sha256): written last, it says the run's upload is whole."""
    uri = remote_of(run_dir)
    if uri is None:
        return
    files = staged_files(run_dir)
    if not files:  # nothing written (a run refused before it began): nothing to say in the store
        return
    fs, where = filesystem(uri)
    have = {rel: info.size for rel, info in run_objects(fs, where).items()}
    for rel, p in files.items():
        if have.get(rel) != p.stat().st_size:
            _put(fs, p, f"{where}/{rel}")
    _write_json(fs, f"{where}/{MANIFEST}", {"index": True, "files": describe_files(files)})


def _put(fs: pafs.FileSystem, src: Path, dst: str) -> None:
    with open(src, "rb") as f, _output(fs, dst) as out:  # one object: complete when closed, or absent
        while chunk := f.read(CHUNK):
            out.write(chunk)


def _output(fs: pafs.FileSystem, dst: str) -> Any:
    """A stream to ``dst``; file systems with real folders (``file://``, HDFS) get the parent folder made."""
    try:
        return fs.open_output_stream(dst)
    except FileNotFoundError:
        fs.create_dir(dst.rsplit("/", 1)[0], recursive=True)
        return fs.open_output_stream(dst)


def _put_folder(fs: pafs.FileSystem, folder: Path, where: str) -> None:
    files = staged_files(folder)
    _write_json(fs, f"{where}/{MANIFEST}", {"complete": False})
    for rel, p in files.items():
        _put(fs, p, f"{where}/{rel}")
    _write_json(fs, f"{where}/{MANIFEST}", {"complete": True, "files": describe_files(files)})


def _write_json(fs: pafs.FileSystem, dst: str, obj: dict[str, Any]) -> None:
    with _output(fs, dst) as out:
        out.write(json.dumps(obj, indent=1, sort_keys=True).encode("utf-8"))
