"""Inputs given as URIs (``model.checkpoint``, ``mining.negatives``): fetched once per node into the user's
cache, a cached copy taken only when its record vouches for it (the store's version, the copy's sha256)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from raycl.errors import UserError
from raycl.files import write_atomic
from raycl.storage.download import get_object, pull
from raycl.storage.layout import INPUTS, sha256
from raycl.storage.staging import cache_dir, cache_name, cache_root, private_dir, remote_of
from raycl.storage.uris import check_uri, filesystem, is_uri

if TYPE_CHECKING:
    import pyarrow.fs as pafs


def local(path: str | Path) -> Path:
    """A staged folder on this node: pulled from the store when this node has not got it (a worker on another
    node reading the run's base model) and kept there, the node's cache; likewise an input :func:`fetch` cached
    on another node. Any other path as it is."""
    path = Path(path)
    if path.exists():
        return path
    uri = remote_of(path)
    if uri is not None:
        pull(uri, path)
    elif (source := input_of(path)) is not None:
        fetch(source)
    return path


def fetch(text: str | Path) -> str:
    """An input given as a URI (``model.checkpoint``, ``mining.negatives``: an object or a folder of them) as a
    local path: downloaded into this node's cache (``$RAYCL_CACHE_DIR/inputs/<quoted URI>``) unless it holds it
    already, so each node fetches it once. A cached copy is taken only when its record (``inputs/.<quoted
    URI>.json``, written when it was downloaded) vouches for it: the store's object is the one fetched (its ETag,
    else its size and time) and the copy's sha256 is the one written — never by its size alone. Anything else (a
    path, a hub name) as it is. Inputs are never written back: they are not staged (:func:`remote_of` knows
    nothing of them)."""
    if not is_uri(str(text)):
        return str(text)
    import pyarrow.fs as pafs

    uri = check_uri(str(text).rstrip("/"))  # before anything is made or requested
    local = cache_dir(INPUTS) / cache_name(uri)
    record = InputRecord(local.with_name(f".{local.name}.json"))
    try:
        fs, where = filesystem(uri)
        info = fs.get_file_info(where)
        if info.type == pafs.FileType.File:
            record.get(fs, info, local, "")
        elif info.type == pafs.FileType.Directory:
            pull(uri, private_dir(local), record)
        else:
            raise UserError(f"{uri}: no such object or folder in the store")
    except OSError as err:
        raise UserError(f"{uri}: cannot read the object store ({err})") from None
    return str(local)


class InputRecord:
    """What :func:`fetch` downloaded into the input cache, by key under the input (``""``: the input is one
    object): the store's version of the object (its ETag, else its size and modification time) and the sha256 of
    the local copy as it was written. Kept in the user's private cache, beside the copy."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.objects: dict[str, dict[str, str]] = json.loads(path.read_text()).get("objects", {})
        except (OSError, ValueError, AttributeError):
            self.objects = {}

    def get(self, fs: pafs.FileSystem, info: Any, dst: Path, rel: str) -> int:
        """``dst`` as the store's object ``info``: kept when the record vouches for it, else downloaded (1)."""
        version, had = _version(fs, info), self.objects.get(rel, {})
        if had.get("version") == version and dst.is_file() and sha256(dst) == had.get("sha256"):
            return 0
        dst.parent.mkdir(parents=True, exist_ok=True)
        self.objects[rel] = {"version": version, "sha256": get_object(fs, info.path, dst)}
        write_atomic(self.path, json.dumps({"objects": self.objects}, indent=1, sort_keys=True))
        return 1


def _version(fs: pafs.FileSystem, info: Any) -> str:
    """Which version of an object the store holds: its ETag where the store says it (S3: one HEAD request), else
    its size and modification time."""
    try:
        with fs.open_input_file(info.path) as f:
            meta = f.metadata() or {}
    except (OSError, NotImplementedError):
        meta = {}
    etag = meta.get(b"ETag") or meta.get("ETag")
    if etag:
        return f"etag {etag.decode() if isinstance(etag, bytes) else etag}"
    return f"size {info.size} mtime_ns {info.mtime_ns}"


def input_of(path: Path) -> str | None:
    """The URI of a path inside a :func:`fetch`ed input, or None."""
    try:
        rel = path.resolve().relative_to(cache_root() / INPUTS)
    except ValueError:
        return None
    return unquote(rel.parts[0]) if rel.parts else None
