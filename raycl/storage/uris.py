"""Storage URIs: which raycl reads and writes (:data:`SCHEMES`), checked before any request — no credentials in
them, no ``.``/``..`` segments — shown with credentials hidden, and opened as pyarrow file systems (fsspec's where
pyarrow has none)."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING

from raycl.errors import UserError, azure_container, redact_uri, uri_credentials

if TYPE_CHECKING:
    import pyarrow.fs as pafs

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@")
# where each store takes its credentials from instead (pyarrow's and fsspec's own variables)
_CREDENTIAL_VARS = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, an instance profile; AWS_ENDPOINT_URL for "
    "the endpoint)",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS (or the node's service account)",
    "abfs": "AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN",
}
_CREDENTIAL_VARS.update(
    s3a=_CREDENTIAL_VARS["s3"],
    gcs=_CREDENTIAL_VARS["gs"],
    abfss=_CREDENTIAL_VARS["abfs"],
    az=_CREDENTIAL_VARS["abfs"],
)
# the only schemes raycl hands to pyarrow or fsspec (docs/storage.md): a local file, the object stores and HDFS. An
# http(s) URL would make the driver fetch whatever it points at (a cloud's metadata endpoint, a host of the
# cluster's network), and fsspec has dozens of other schemes (ftp, ssh, github, zip, chained ``a::b`` …)
SCHEMES = ("file", "s3", "s3a", "gs", "gcs", "hdfs", "abfs", "abfss", "az")
BUCKETS = ("S3FileSystem", "GcsFileSystem")  # pyarrow's object stores: a path is bucket/key


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
        how = _CREDENTIAL_VARS.get(
            store, "the file system's own configuration (its environment variables or config file)"
        )
        raise UserError(
            f"{where}{hide(uri)}: credentials in a URI are refused (they would show in process lists, "
            f"logs, Ray's job information and cache folder names); give the URI without them and the "
            f"credentials through {how}"
        )
    if not endpoint and (scheme.lower() not in SCHEMES or "::" in uri):
        raise UserError(
            f"{where}{hide(uri)}: not a storage raycl reads or writes, refused before any request; "
            f"expected a local path or a URI of {', '.join(s + '://' for s in SCHEMES)} (fsspec's "
            "chained '::' URIs, http(s) and other schemes are not storage)"
        )
    segments = rest.split("?", 1)[0].rstrip("/").split("/")[1:]  # after the bucket or host
    if any(s in ("", ".", "..") for s in segments):
        raise UserError(
            f"{where}{uri}: a '.', '..' or empty path segment, expected a plain prefix (scheme://bucket/a/b)"
        )
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
            raise UserError(
                f"{root}: no pyarrow or fsspec file system for this URI ({arrow_err}; {err})"
            ) from None
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs))


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """``uri`` → (a pyarrow file system, the path on it); one file system per scheme and bucket."""
    import pyarrow.fs as pafs

    scheme, rest = check_uri(uri.rstrip("/")).split("://", 1)
    if scheme == "file":
        return pafs.LocalFileSystem(), "/" + rest.strip("/")
    fs = _filesystem(f"{scheme}://{rest.split('/', 1)[0]}")
    kind = type(fs).__name__
    if kind in BUCKETS:  # paths are bucket/key
        path = rest
    elif kind == "PyFileSystem":  # fsspec: its own reading of the URI
        path = fs.handler.fs._strip_protocol(uri)
    else:  # HDFS and the like: the path after the host
        path = pafs.FileSystem.from_uri(uri)[1]
    return fs, path.rstrip("/")


def forget_filesystems() -> None:
    """The file systems opened so far forgotten: the next request opens its own (a store's endpoint or credentials
    changed, e.g. a test's server stopped)."""
    _filesystem.cache_clear()
