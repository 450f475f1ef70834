"""Run folders on an object store: ``--out s3://bucket/prefix`` (``gs://…``, ``hdfs://…``, ``abfs://…``:
:data:`SCHEMES`, read through pyarrow or fsspec; any other scheme refused before a request).

A remote run is *staged*: it lives in a local folder whose name is its URI, quoted
(``$RAYCL_CACHE_DIR/stage/<quoted URI>``, default ``~/.cache/raycl``), so that any process on any node maps a
staged path back to its object (:func:`remote_of`) and caches what it reads at the same path. The cache is the
user's own: every folder of it is made mode 0700 and refused when another user owns it. The project's
atomic writers (``raycl.records``, ``raycl.miners.shards``) call :func:`mirror` after their rename, so a file is
uploaded at once by whichever node wrote it; :func:`push` uploads what else the run holds and writes the run's
index last; :func:`stage` pulls a run's objects back before it resumes. Ray Train and Tune write their own
storage (``<out>/ray``) straight to the store (:func:`ray_storage`).

An object store has no rename, but one PUT is complete or absent, so a single file is written in one. A folder
(a model) is several objects: its ``_manifest.json`` is written first as pending and last with every file's size
and sha256, and readers take a folder only when its manifest is complete and matches. Shards keep write-once
names (``part-<range>.parquet``). Endpoint and credentials come from the standard environment
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``GOOGLE_APPLICATION_CREDENTIALS``, …),
read by pyarrow or fsspec; raycl never writes them anywhere. A URI that carries them (``s3://KEY:SECRET@bucket``,
``?X-Amz-Signature=…``) is refused in one line (:func:`check_uri`): it would show in process lists, Ray's job
information and folder names.

What the store holds is not trusted to stay inside the prefix: an object key with a ``.``, ``..`` or empty
segment is refused before anything is written (pyarrow resolves ``..`` in a request, and the local copy would land
outside the cache), and every local destination is checked to lie inside its cache folder.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from raycl.errors import UserError, at, azure_container, redact_uri, uri_credentials
from raycl.files import atomic_file, check_owner, write_atomic

if TYPE_CHECKING:
    import pyarrow.fs as pafs

MANIFEST = "_manifest.json"
RAY_DIR = "ray"  # Ray Train/Tune's own storage under a run: written to the store by Ray, never staged
INPUTS = "inputs"  # the node's cache of inputs given as URIs (fetch), beside stage/ (the staged runs)
STAGE = "stage"
LOCK = "_mining.lock"  # a run's own lock on its folder (raycl.miners.shards): of this machine, never uploaded


def _local_only(rel: str) -> bool:
    """Temp and bookkeeping files (``.name``: temp files, a range's attempt count), the lock: never uploaded."""
    parts = rel.split("/")
    return any(s.startswith(".") for s in parts) or parts[-1] == LOCK
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@")
_NAME_MAX = 255  # bytes of one folder name (Linux, macOS)
# where each store takes its credentials from instead (pyarrow's and fsspec's own variables)
_CREDENTIAL_VARS = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, an instance profile; AWS_ENDPOINT_URL for "
          "the endpoint)",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS (or the node's service account)",
    "abfs": "AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN",
}  # fmt: skip
_CREDENTIAL_VARS.update(s3a=_CREDENTIAL_VARS["s3"], gcs=_CREDENTIAL_VARS["gs"], abfss=_CREDENTIAL_VARS["abfs"],
                        az=_CREDENTIAL_VARS["abfs"])  # fmt: skip
_CHUNK = 8 << 20
# the only schemes raycl hands to pyarrow or fsspec (docs/storage.md): a local file, the object stores and HDFS. An
# http(s) URL would make the driver fetch whatever it points at (a cloud's metadata endpoint, a host of the
# cluster's network), and fsspec has dozens of other schemes (ftp, ssh, github, zip, chained ``a::b`` …)
SCHEMES = ("file", "s3", "s3a", "gs", "gcs", "hdfs", "abfs", "abfss", "az")
_BUCKETS = ("S3FileSystem", "GcsFileSystem")  # pyarrow's object stores: a path is bucket/key


def is_uri(text: str | Path) -> bool:
    """``s3://…``, ``gs://…``, ``file://…``: anything with a scheme (a local path has none)."""
    return isinstance(text, str) and bool(_URI.match(text))


def hide(uri: str) -> str:
    """``uri`` as a message shows it: its user part (an object store's access key; not an Azure container) and
    credentials hidden."""
    return redact_uri(uri) if azure_container(uri) else _USERINFO.sub(r"\1***@", redact_uri(uri))


def check_uri(uri: str, *, key: str = "", endpoint: bool = False) -> str:
    """``uri`` as raycl may read, write and name a cache folder after it, or one line (exit 2): a URI that carries
    credentials (``user:password@``, an object store's ``KEY@``, ``?X-Amz-Signature=…``, ``&sig=…``) points to
    the store's own credential variables; a scheme that is not storage raycl knows (:data:`SCHEMES`: http(s),
    fsspec's other schemes) is refused before any request — unless it is a store's ``endpoint`` (an http(s) URL
    by nature); a path with a ``.``, ``..`` or empty segment is not a plain key."""
    where = f"{key}: " if key else ""
    scheme, _, rest = uri.partition("://")
    if uri_credentials(uri):
        store = scheme.lower()
        if store in ("http", "https"):  # a presigned URL: the object is in a store that has its own variables
            signed = {"x-amz-": "s3", "x-goog-": "gs", "sig=": "abfs"}
            store = next((v for k, v in signed.items() if k in rest.lower()), store)
        how = _CREDENTIAL_VARS.get(store, "the file system's own configuration (its environment variables or "
                                          "config file)")  # fmt: skip
        raise UserError(f"{where}{hide(uri)}: credentials in a URI are refused (they would show in process lists, "
                        f"logs, Ray's job information and cache folder names); give the URI without them and the "
                        f"credentials through {how}")  # fmt: skip
    if not endpoint and (scheme.lower() not in SCHEMES or "::" in uri):
        raise UserError(f"{where}{hide(uri)}: not a storage raycl reads or writes, refused before any request; "
                        f"expected a local path or a URI of {', '.join(s + '://' for s in SCHEMES)} (fsspec's "
                        "chained '::' URIs, http(s) and other schemes are not storage)")  # fmt: skip
    segments = rest.split("?", 1)[0].rstrip("/").split("/")[1:]  # after the bucket or host
    if any(s in ("", ".", "..") for s in segments):
        raise UserError(f"{where}{uri}: a '.', '..' or empty path segment, expected a plain prefix "
                        "(scheme://bucket/a/b)")  # fmt: skip
    return uri


@functools.lru_cache(maxsize=8)
def _filesystem(root: str) -> pafs.FileSystem:
    import pyarrow.fs as pafs

    try:
        return pafs.FileSystem.from_uri(root)[0]
    except (ValueError, OSError) as arrow_err:  # pyarrow knows s3, gs, hdfs, file; fsspec knows the rest
        try:
            import fsspec

            fs = fsspec.core.url_to_fs(root)[0]
        except (ImportError, ValueError, OSError) as err:
            raise UserError(f"{root}: no pyarrow or fsspec file system for this URI ({arrow_err}; {err})"
                            ) from None  # fmt: skip
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs))


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """``uri`` → (a pyarrow file system, the path on it); one file system per scheme and bucket."""
    import pyarrow.fs as pafs

    scheme, rest = check_uri(uri.rstrip("/")).split("://", 1)
    if scheme == "file":
        return pafs.LocalFileSystem(), "/" + rest.strip("/")
    fs = _filesystem(f"{scheme}://{rest.split('/', 1)[0]}")
    kind = type(fs).__name__
    if kind in _BUCKETS:  # paths are bucket/key
        path = rest
    elif kind == "PyFileSystem":  # fsspec: its own reading of the URI
        path = fs.handler.fs._strip_protocol(uri)
    else:  # HDFS and the like: the path after the host
        path = pafs.FileSystem.from_uri(uri)[1]
    return fs, path.rstrip("/")


# ---------------------------------------------------------------------------------------------- staging
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


def _named(uri: str) -> str:
    """The cache folder name of ``uri``: the URI quoted (credentials were refused, so it holds none)."""
    name = quote(check_uri(uri.rstrip("/")).rstrip("/"), safe="")
    if len(name.encode()) > _NAME_MAX:
        raise UserError(f"{uri}: too long to name its cache folder ({len(name.encode())} bytes quoted, at most "
                        f"{_NAME_MAX}), expected a shorter prefix")  # fmt: skip
    return name


def stage_dir(uri: str) -> Path:
    """The local folder that stands for ``uri`` on every node."""
    return cache_root() / STAGE / _named(uri)


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
    if type(fs).__name__ in _BUCKETS and fs.get_file_info(bucket).type == pafs.FileType.NotFound:
        raise UserError(f"{uri}: no bucket {bucket!r} in this object store (create it first)")


def ray_storage(path: Path) -> tuple[str, pafs.FileSystem | None]:
    """Ray Train/Tune's ``storage_path`` (+ ``storage_filesystem``) for ``path``: the store itself when staged."""
    uri = remote_of(path)
    if uri is None:
        return str(Path(path).resolve()), None
    fs, where = filesystem(uri)
    return where, fs


# ---------------------------------------------------------------------------------------------- writing
def mirror(path: Path) -> None:
    """Upload a staged file (one PUT) or folder (pending manifest, files, complete manifest); others: nothing."""
    uri = remote_of(path)
    if uri is None or _local_only(path.name):
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
    sizes = {rel: p.stat().st_size for rel, p in _files(folder).items()}
    if not manifest.get("complete") or {k: v["size"] for k, v in manifest["files"].items()} != sizes:
        _put_folder(fs, folder, where)


def push(run_dir: Path) -> None:
    """Everything of a staged run not in the store yet (or of another size), then its index ``_manifest.json``
    (every file with size and sha256): written last, it says the run's upload is whole."""
    uri = remote_of(run_dir)
    if uri is None:
        return
    files = _files(run_dir)
    if not files:  # nothing written (a run refused before it began): nothing to say in the store
        return
    fs, where = filesystem(uri)
    have = {rel: info.size for rel, info in _listing(fs, where).items()}
    for rel, p in files.items():
        if have.get(rel) != p.stat().st_size:
            _put(fs, p, f"{where}/{rel}")
    _write_json(fs, f"{where}/{MANIFEST}", {"index": True, "files": _describe(files)})


def _put(fs: pafs.FileSystem, src: Path, dst: str) -> None:
    with open(src, "rb") as f, _output(fs, dst) as out:  # one object: complete when closed, or absent
        while chunk := f.read(_CHUNK):
            out.write(chunk)


def _output(fs: pafs.FileSystem, dst: str) -> Any:
    """A stream to ``dst``; file systems with real folders (``file://``, HDFS) get the parent folder made."""
    try:
        return fs.open_output_stream(dst)
    except FileNotFoundError:
        fs.create_dir(dst.rsplit("/", 1)[0], recursive=True)
        return fs.open_output_stream(dst)


def _put_folder(fs: pafs.FileSystem, folder: Path, where: str) -> None:
    files = _files(folder)
    _write_json(fs, f"{where}/{MANIFEST}", {"complete": False})
    for rel, p in files.items():
        _put(fs, p, f"{where}/{rel}")
    _write_json(fs, f"{where}/{MANIFEST}", {"complete": True, "files": _describe(files)})


def _write_json(fs: pafs.FileSystem, dst: str, obj: dict[str, Any]) -> None:
    with _output(fs, dst) as out:
        out.write(json.dumps(obj, indent=1, sort_keys=True).encode("utf-8"))


def _files(folder: Path) -> dict[str, Path]:
    """A staged folder's files by relative path: not Ray's storage, temp files (``.name``) or manifests."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() and rel.split("/")[0] != RAY_DIR and not _local_only(rel) and p.name != MANIFEST:
            out[rel] = p
    return out


def _describe(files: dict[str, Path]) -> dict[str, dict[str, Any]]:
    return {rel: {"size": p.stat().st_size, "sha256": _sha256(p)} for rel, p in files.items()}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------- reading
def _key(path: str, where: str) -> str:
    """An object's path under ``where``, relative; one with a ``.``, ``..`` or empty segment refused: pyarrow
    resolves ``..`` in the request (another prefix's object, another bucket's) and the local copy would land
    outside the cache."""
    rel = path[len(where):].lstrip("/")
    if any(s in ("", ".", "..") for s in rel.split("/")):  # the whole key: an S3 key is at most 1,024 bytes
        raise UserError(f"object key {path[:1100]!r}: a '.', '..' or empty segment, refused (it would be read "
                        "from and written outside its prefix); expected plain keys under the run's or input's "
                        "prefix (delete the object)")  # fmt: skip
    return rel


def _objects(fs: pafs.FileSystem, where: str) -> dict[str, Any]:
    """Every object under ``where`` by its checked relative path (:func:`_key`)."""
    import pyarrow.fs as pafs

    infos = fs.get_file_info(pafs.FileSelector(where, allow_not_found=True, recursive=True))
    return {_key(i.path, where): i for i in infos if i.type == pafs.FileType.File}


def _listing(fs: pafs.FileSystem, where: str) -> dict[str, Any]:
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


def pull(uri: str, local: Path, record: _Record | None = None) -> int:
    """Download the objects under ``uri`` that ``local`` lacks or holds at another size (an input: that
    ``record`` does not vouch for); a folder only when its manifest is complete (an interrupted upload is left
    out). Returns the number of files downloaded."""
    fs, where = filesystem(uri)
    objects = _listing(fs, where)
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
        _get(fs, info.path, dst)
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
                getattr(objects.get(prefix + k), "size", None) != v["size"] for k, v in files.items()):
            bad.append(folder)
    return bad


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
    for rel in _listing(fs, where):
        if only is None or only(rel):
            fs.delete_file(f"{where}/{rel}")


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
    elif (source := _input_of(path)) is not None:
        fetch(source)
    return path


# ---------------------------------------------------------------------------------------------- inputs
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
    local = cache_dir(INPUTS) / _named(uri)
    record = _Record(local.with_name(f".{local.name}.json"))
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


class _Record:
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
        if had.get("version") == version and dst.is_file() and _sha256(dst) == had.get("sha256"):
            return 0
        dst.parent.mkdir(parents=True, exist_ok=True)
        self.objects[rel] = {"version": version, "sha256": _get(fs, info.path, dst)}
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


def _input_of(path: Path) -> str | None:
    """The URI of a path inside a :func:`fetch`ed input, or None."""
    try:
        rel = path.resolve().relative_to(cache_root() / INPUTS)
    except ValueError:
        return None
    return unquote(rel.parts[0]) if rel.parts else None


def _get(fs: pafs.FileSystem, src: str, dst: Path) -> str:
    """One object to ``dst``, through a temp name: complete or absent. Returns the sha256 of what was written."""
    h = hashlib.sha256()
    with fs.open_input_stream(src) as f, atomic_file(dst, "wb") as out:
        while chunk := f.read(_CHUNK):
            out.write(chunk)
            h.update(chunk)
    return h.hexdigest()
