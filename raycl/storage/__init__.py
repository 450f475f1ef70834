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

This package's modules, one concern each (this file names what the rest of raycl uses): :mod:`~raycl.storage.uris`
(which URIs, checked, and their file systems), :mod:`~raycl.storage.staging` (the node's cache folders),
:mod:`~raycl.storage.layout` (manifests and what stays local), :mod:`~raycl.storage.upload`,
:mod:`~raycl.storage.download` and :mod:`~raycl.storage.inputs` (inputs fetched once per node).
"""

from __future__ import annotations

from raycl.storage.download import listing, pull, read_text, refresh, remove, stage
from raycl.storage.inputs import fetch, local
from raycl.storage.layout import INPUTS, LOCK, MANIFEST, RAY_DIR, STAGE
from raycl.storage.staging import (
    cache_dir,
    cache_name,
    cache_root,
    inside,
    on_node,
    portable,
    private_dir,
    ray_storage,
    remote_of,
    stage_dir,
)
from raycl.storage.upload import mirror, publish, push
from raycl.storage.uris import SCHEMES, check_uri, filesystem, forget_filesystems, hide, is_uri

__all__ = [
    "INPUTS",
    "LOCK",
    "MANIFEST",
    "RAY_DIR",
    "SCHEMES",
    "STAGE",
    "cache_dir",
    "cache_name",
    "cache_root",
    "check_uri",
    "fetch",
    "filesystem",
    "forget_filesystems",
    "hide",
    "inside",
    "is_uri",
    "listing",
    "local",
    "mirror",
    "on_node",
    "portable",
    "private_dir",
    "publish",
    "pull",
    "push",
    "ray_storage",
    "read_text",
    "refresh",
    "remote_of",
    "remove",
    "stage",
    "stage_dir",
]
