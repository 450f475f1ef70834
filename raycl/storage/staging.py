"""The node's cache of a run staged for an object store: ``$RAYCL_CACHE_DIR/stage/<quoted URI>`` (private to the
user), the same path on every node, so that a staged path maps back to its object (:func:`remote_of`) and a path
handed to another node is given as its URI (:func:`portable`, :func:`on_node`)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

from raycl.errors import UserError, at
from raycl.files import check_owner
from raycl.storage.layout import STAGE
from raycl.storage.uris import check_uri, filesystem, is_uri

if TYPE_CHECKING:
    import pyarrow.fs as pafs

_NAME_MAX = 255  # bytes of one folder name (Linux, macOS)


def cache_root() -> Path:
    return Path(os.environ.get("RAYCL_CACHE_DIR") or Path.home() / ".cache" / "raycl").resolve()


def private_dir(path: Path) -> Path:
    """``path`` made (mode 0700) and checked to be this user's: what raycl's cache holds is read back as the
    store's objects, so no other user may have put anything there (a shared ``RAYCL_CACHE_DIR``)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_owner(path, what="a raycl cache folder", hint="set RAYCL_CACHE_DIR to a folder of your own")
    if stat.S_IMODE(path.stat().st_mode) != 0o700:
        path.chmod(0o700)
    return path


def cache_dir(kind: str) -> Path:
    """``$RAYCL_CACHE_DIR/<kind>`` (``stage``, ``inputs`` …), it and the cache root private
    (:func:`private_dir`)."""
    private_dir(cache_root())
    return private_dir(cache_root() / kind)


def cache_name(uri: str) -> str:
    """The cache folder name of ``uri``: the URI quoted (credentials were refused, so it holds none)."""
    name = quote(check_uri(uri.rstrip("/")).rstrip("/"), safe="")
    if len(name.encode()) > _NAME_MAX:
        raise UserError(
            f"{uri}: too long to name its cache folder ({len(name.encode())} bytes quoted, at most "
            f"{_NAME_MAX}), expected a shorter prefix"
        )
    return name


def stage_dir(uri: str) -> Path:
    """The local folder that stands for ``uri`` on every node."""
    return cache_root() / STAGE / cache_name(uri)


def inside(path: Path, root: Path) -> Path:
    """``path``, checked to lie inside ``root`` once ``..`` and links are resolved — before anything is made."""
    if not path.resolve().is_relative_to(root.resolve()):
        raise UserError(f"{at(path)}: outside its cache folder {at(root)}, refused")
    return path


def remote_of(path: str | Path) -> str | None:
    """The URI of a staged path (a file or folder in a :func:`stage_dir`), or None for any other path."""
    try:
        rel = Path(path).resolve().relative_to(cache_root() / STAGE)
    except ValueError:
        return None
    if not rel.parts:
        return None
    return "/".join([unquote(rel.parts[0]), *rel.parts[1:]])


def ray_storage(path: Path) -> tuple[str, pafs.FileSystem | None]:
    """Ray Train/Tune's ``storage_path`` (+ ``storage_filesystem``) for ``path``: the store itself when staged."""
    uri = remote_of(path)
    if uri is None:
        return str(Path(path).resolve()), None
    fs, where = filesystem(uri)
    return where, fs


def portable(path: str | Path) -> str:
    """``path`` as a process on another node must be given it: a staged path's URI (that node has its own staging
    folder, :func:`on_node`), any other path as it is (shared storage)."""
    return remote_of(path) or str(path)


def on_node(text: str | Path) -> Path:
    """What :func:`portable` gave, on this node: a URI's staging folder here (made; this node's cache of it),
    any other path as it is."""
    if not is_uri(str(text)):
        return Path(text)
    uri, staged = check_uri(str(text).rstrip("/")), cache_dir(STAGE)
    runs = sorted((unquote(d.name), d) for d in staged.iterdir()) if staged.is_dir() else []
    inside_ = [(top, d) for top, d in runs if uri.startswith(top + "/")]  # a run this node has staged holds it
    if inside_:
        top, run = inside_[-1]
        folder = inside(run.joinpath(*uri[len(top) + 1 :].split("/")), run)
    else:
        folder = private_dir(stage_dir(uri))
    folder.mkdir(parents=True, exist_ok=True)
    return folder
