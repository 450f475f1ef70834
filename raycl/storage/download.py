"""Reading from a store: a run's objects pulled into its staging folder (:func:`stage`, :func:`refresh`), folders
taken only when their manifest is complete, every key checked to stay under its prefix, each object written
through a temp name."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from raycl.errors import UserError
from raycl.files import atomic_file
from raycl.storage.layout import CHUNK, MANIFEST, RAY_DIR, STAGE
from raycl.storage.staging import cache_dir, inside, private_dir, remote_of, stage_dir
from raycl.storage.uris import BUCKETS, filesystem

if TYPE_CHECKING:
    import pyarrow.fs as pafs


class Vouches(Protocol):
    """What vouches for local copies of an input's objects (:class:`raycl.storage.inputs.InputRecord`)."""

    def get(self, fs: pafs.FileSystem, info: Any, dst: Path, rel: str) -> int: ...


def stage(uri: str) -> Path:
    """``--out URI``: its staging folder, with the run's objects pulled (a resumed run finds what it wrote)."""
    local = stage_dir(uri)
    cache_dir(STAGE)
    private_dir(local)
    try:
        _check_bucket(uri)
        pull(uri, local)
    except OSError as err:  # no credentials, no endpoint: the user's to fix
        raise UserError(f"{uri}: cannot read the object store ({err})") from None
    return local


def _check_bucket(uri: str) -> None:
    """A bucket that does not exist lists as empty: say so before a run writes into nothing."""
    import pyarrow.fs as pafs

    fs, where = filesystem(uri)
    bucket = where.split("/", 1)[0]
    if type(fs).__name__ in BUCKETS and fs.get_file_info(bucket).type == pafs.FileType.NotFound:
        raise UserError(f"{uri}: no bucket {bucket!r} in this object store (create it first)")


def _key(path: str, where: str) -> str:
    """An object's path under ``where``, relative; one with a ``.``, ``..`` or empty segment refused: pyarrow
    resolves ``..`` in the request (another prefix's object, another bucket's) and the local copy would land
    outside the cache."""
    rel = path[len(where) :].lstrip("/")
    if any(s in ("", ".", "..") for s in rel.split("/")):  # the whole key: an S3 key is at most 1,024 bytes
        raise UserError(
            f"object key {path[:1100]!r}: a '.', '..' or empty segment, refused (it would be read "
            "from and written outside its prefix); expected plain keys under the run's or input's "
            "prefix (delete the object)"
        )
    return rel


def _objects(fs: pafs.FileSystem, where: str) -> dict[str, Any]:
    """Every object under ``where`` by its checked relative path (:func:`_key`)."""
    import pyarrow.fs as pafs

    infos = fs.get_file_info(pafs.FileSelector(where, allow_not_found=True, recursive=True))
    return {_key(i.path, where): i for i in infos if i.type == pafs.FileType.File}


def run_objects(fs: pafs.FileSystem, where: str) -> dict[str, Any]:
    """The objects under ``where`` by relative path (Ray's storage left out)."""
    return {rel: info for rel, info in _objects(fs, where).items() if rel.split("/")[0] != RAY_DIR}


def listing(uri: str) -> dict[str, int]:
    """Every object under ``uri`` (Ray's storage too) with its size: what a run left in the store."""
    fs, where = filesystem(uri)
    return {rel: info.size for rel, info in _objects(fs, where).items()}


def read_text(uri: str) -> str:
    fs, where = filesystem(uri)
    with fs.open_input_stream(where) as f:
        return bytes(f.read()).decode("utf-8")


def pull(uri: str, local: Path, record: Vouches | None = None) -> int:
    """Download the objects under ``uri`` that ``local`` lacks or holds at another size (an input: that
    ``record`` does not vouch for); a folder only when its manifest is complete (an interrupted upload is left
    out). Returns the number of files downloaded."""
    fs, where = filesystem(uri)
    objects = run_objects(fs, where)
    left_out = _incomplete_folders(fs, where, objects)
    if "" in left_out:
        return 0
    n = 0
    for rel, info in objects.items():
        if rel.rsplit("/", 1)[-1] == MANIFEST or any(rel.startswith(f + "/") for f in left_out):
            continue
        dst = inside(local / rel, local)
        if record is not None:
            n += record.get(fs, info, dst, rel)
            continue
        if dst.is_file() and dst.stat().st_size == info.size:
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        get_object(fs, info.path, dst)
        n += 1
    return n


def _incomplete_folders(fs: pafs.FileSystem, where: str, objects: dict[str, Any]) -> list[str]:
    """Folders whose manifest is pending or does not match their objects' sizes."""
    bad = []
    for rel, info in objects.items():
        folder, _, name = rel.rpartition("/")
        if name != MANIFEST:
            continue
        with fs.open_input_stream(info.path) as f:
            manifest = json.loads(bytes(f.read()))
        if manifest.get("index"):  # a run's index, not a folder upload
            continue
        files, prefix = manifest.get("files", {}), f"{folder}/" if folder else ""
        if not manifest.get("complete") or any(
            getattr(objects.get(prefix + k), "size", None) != v["size"] for k, v in files.items()
        ):
            bad.append(folder)
    return bad


def refresh(path: Path) -> Path:
    """A staged folder with what the store holds and this node lacks pulled in (shards other nodes wrote), kept
    here as the node's cache; any other path as it is."""
    uri = remote_of(path)
    if uri is not None:
        pull(uri, path)
    return path


def remove(path: Path, only: Callable[[str], bool] | None = None) -> None:
    """A staged folder's objects deleted from the store (the local folder is the caller's): a re-mined n-best
    must not find the old one's shards there. ``only``: just the objects whose relative path it accepts (what
    ``raycl.mine --overwrite`` wrote, not other files of the prefix)."""
    uri = remote_of(path)
    if uri is None:
        return
    fs, where = filesystem(uri)
    for rel in run_objects(fs, where):
        if only is None or only(rel):
            fs.delete_file(f"{where}/{rel}")


def get_object(fs: pafs.FileSystem, src: str, dst: Path) -> str:
    """One object to ``dst``, through a temp name: complete or absent. Returns the sha256 of what was written."""
    h = hashlib.sha256()
    with fs.open_input_stream(src) as f, atomic_file(dst, "wb") as out:
        while chunk := f.read(CHUNK):
            out.write(chunk)
            h.update(chunk)
    return h.hexdigest()
