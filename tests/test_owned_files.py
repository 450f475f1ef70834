"""What raycl reads back is the user's own, what it writes cannot be redirected, and only storage is a URI
(issue 39): a run folder that another user owns or can write, or that links out of itself, is refused before
anything in it is read (Ray Tune's restore would unpickle its state); every atomic write goes through a temp file
nobody can plant; http(s) and fsspec's other schemes are refused before any request.

The two attacks on a resumed sweep run ``python -m raycl.tune`` as a user would; the rest is in-process."""

from __future__ import annotations

import http.server
import json
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from raycl.errors import UserError
from raycl.files import TRUST_HINT

FOREIGN = 65534  # nobody
REFUSED = "refused, expected a run folder that only you (or root) can have written; " + TRUST_HINT


class Payload:
    """What a planted ``tuner.pkl`` holds: unpickling it runs a shell command (touches ``marker``)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"touch {self.marker}",)


def _plant_sweep(folder: Path, marker: Path) -> None:
    """A Tune experiment folder as ``Tuner.can_restore`` finds one: ``tuner.pkl`` and an experiment state."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tuner.pkl").write_bytes(pickle.dumps(Payload(marker)))
    (folder / "experiment_state-2026-01-01_00-00-00.json").write_text(
        json.dumps({"trial_data": [], "runner_data": {}})
    )


def _run_folder(root: Path) -> Path:
    run = root / "run"
    (run / "ray").mkdir(parents=True)
    (run / "raycl_run.json").write_text(json.dumps({"space": "idiom"}))
    return run


def _tune(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAY_ADDRESS": ""}
    return subprocess.run(
        [sys.executable, "-m", "raycl.tune", "idiom", "--preset", "smoke", "--out", str(out), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _snapshot(root: Path) -> dict[str, tuple[int, int, bytes | str]]:
    """Every path under ``root``: mode, owner and bytes (a link: its target)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        body = os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else b""
        out[str(p.relative_to(root))] = (st.st_mode, st.st_uid, body)
    return out


# ---------------------------------------------------------------------------------------------- 1. run folders
def test_a_sweep_linked_out_of_the_run_folder_is_not_restored(tmp_path: Path) -> None:
    """``OUT/ray/sweep`` a link to a folder anyone can write, holding a pickled Tune state: refused in one line
    naming the link, before Ray starts; the payload never runs and nothing changes on either side."""
    run, shared, marker = _run_folder(tmp_path), tmp_path / "shared", tmp_path / "MARKER"
    _plant_sweep(shared / "sweep", marker)
    for p in (shared, shared / "sweep", *(shared / "sweep").iterdir()):
        p.chmod(0o777 if p.is_dir() else 0o666)
    (run / "ray" / "sweep").symlink_to(shared / "sweep")
    before = _snapshot(tmp_path)
    done = _tune(run)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.splitlines() == [
        f"raycl: error: {run / 'ray' / 'sweep'}: a symbolic link to "
        f"{(shared / 'sweep').resolve()}, outside {run}: {REFUSED}"
    ]
    assert not marker.exists() and _snapshot(tmp_path) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user owns takes root")
def test_a_run_folder_another_user_owns_is_not_restored(tmp_path: Path) -> None:
    """A run folder (mode 755) owned by another user, its sweep state planted: refused in one line."""
    run, marker = _run_folder(tmp_path), tmp_path / "MARKER"
    _plant_sweep(run / "ray" / "sweep", marker)
    for p in (run, *run.rglob("*")):
        os.chown(p, FOREIGN, FOREIGN)
    before = _snapshot(tmp_path)
    done = _tune(run)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.splitlines() == [
        f"raycl: error: {run}: owned by uid {FOREIGN}, not by this user (uid 0) or root: {REFUSED}"
    ]
    assert not marker.exists() and _snapshot(tmp_path) == before


def _refused(verb: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    import importlib

    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(f"raycl.{verb}").main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_a_fresh_out_others_can_write_or_replace_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    open_ = tmp_path / "open"
    open_.mkdir(mode=0o777)
    open_.chmod(0o777)  # an empty folder anyone can write
    err = _refused("train", ["idiom", "--preset", "smoke", "--out", str(open_)], capsys)
    assert err == f"raycl: error: {open_}: writable by users other than its owner (mode drwxrwxrwx): {REFUSED}"
    assert not any(open_.iterdir())
    fresh = open_ / "run"  # not there yet: whoever can write its parent could put their own in its place
    err = _refused("tune", ["idiom", "--preset", "smoke", "--out", str(fresh)], capsys)
    assert err.startswith(f"raycl: error: {open_}: writable by users other than its owner") and not fresh.exists()


def test_a_folder_of_the_users_own_passes_and_trust_out_takes_another(tmp_path: Path) -> None:
    """Sticky ``/tmp``-like parents, links that stay inside, a folder the user owns: nothing changes. A folder
    another user owns is taken with ``--trust-out``."""
    from raycl.run_folder import check_private, open_run_folder

    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    run = _run_folder(sticky)
    (run / "ray" / "latest").symlink_to(run / "ray")  # a link within the folder
    check_private(run)
    open_run_folder(run, space="idiom")
    if os.geteuid() == 0:
        os.chown(run, FOREIGN, FOREIGN)
        with pytest.raises(UserError, match=f"owned by uid {FOREIGN}"):
            open_run_folder(run, space="idiom")
        open_run_folder(run, space="idiom", trusted=True)


def test_mine_refuses_a_shard_directory_others_can_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = tmp_path / "negs"
    shards.mkdir()
    (shards / "part-00000.parquet").write_bytes(b"PAR1")
    (shards / "part-00000.parquet").chmod(0o666)
    err = _refused("mine", ["gec", "--model", str(tmp_path), "--data", "x.m2", "--out", str(shards)], capsys)
    assert err.startswith(f"raycl: error: {shards / 'part-00000.parquet'}: writable by users other than its owner")


# ---------------------------------------------------------------------------------------------- 3. temp files
def _negatives(path: Path) -> None:
    from raycl.data.gec import GecExample
    from raycl.miners.beam_search import write_negatives_parquet
    from raycl.miners.records import MinedNegatives

    write_negatives_parquet(
        path, [GecExample("a:0", "s", "t")], [MinedNegatives("a:0", ("n",), (-1.0,))], model_version=0
    )


def _shard(path: Path) -> None:
    import pyarrow as pa

    from raycl.miners.shards import write_shard

    write_shard(path.parent, 0, pa.table({"id": ["a"]}))


def _plot(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from raycl.records import save_png

    save_png(plt.figure(), path)


def _model(path: Path) -> None:
    from raycl.records import save_dir_atomic

    save_dir_atomic(lambda d: (d / "config.json").write_text("{}"), path)


def _config(path: Path) -> None:
    from raycl.config import dump_yaml
    from raycl.config.tasks import load_space

    dump_yaml(load_space("idiom", preset="smoke").config, path)


def _fetch(path: Path) -> None:
    """An input fetched into the cache (``file://``): the copy and its record."""
    from raycl import storage

    src = path.parents[2] / "input.bin"  # beside the cache
    src.write_bytes(b"the input")
    assert Path(storage.fetch(f"file://{src}")).read_bytes() == b"the input"


def _writers() -> dict[str, tuple[str, Callable[[Path], None]]]:
    """Each atomic writer: the target's name, the predictable temp name the writer used before, and a call."""
    from raycl import records
    from raycl.data.coherence import Document, write_documents
    from raycl.data.gec import write_parallel
    from raycl.data.m2 import M2Sentence, write_m2
    from raycl.data.semeval import write_csv
    from raycl.distributed.tune_state import _remember
    from raycl.progress import ProgressWriter
    from raycl.scoring.embedding_geometry import plot_alignment_uniformity
    from raycl.training.checkpoint import save_state

    pid, thread = os.getpid(), threading.get_ident()
    return {  # target → (old temp name, writer)
        "history.jsonl": (".history.jsonl.tmp", lambda p: records.atomic_write(p, "{}")),
        "results.csv": (".results.csv.tmp", lambda p: records.write_csv(p, [{"a": 1}])),
        "best.json": (".best.json.tmp", lambda p: records.copy_atomic(Path(__file__), p)),
        "plot.png": (".plot.tmp.png", _plot),
        "model": (".model.tmp", _model),
        "negs.parquet": (".negs.parquet.tmp", _negatives),
        "part-00000.parquet": (f".part-00000.parquet.{pid}.tmp", _shard),
        "config.yaml": (".config.yaml.tmp", _config),
        "state.pt": (".state.pt.tmp", lambda p: save_state({"step": 1}, p)),
        "progress.json": (".progress.json.tmp", lambda p: ProgressWriter(p.parent, total=1).update(1, force=True)),
        "train.m2": (".train.m2.tmp", lambda p: write_m2(p, [M2Sentence("a b")])),
        "hyp.txt": (".hyp.txt.tmp", lambda p: write_parallel(p, ["a b"])),
        "train.csv": (".train.csv.tmp", lambda p: write_csv(p, ["a"], [["1"]])),
        "docs.jsonl": (".docs.jsonl.tmp", lambda p: write_documents([Document("d", ("s .",))], p)),
        "geometry.png": (".geometry.png.tmp", lambda p: plot_alignment_uniformity({"m": (-1.0, 0.5)}, p)),
        "tune_state": (f".{{record}}.{pid}.{thread}.tmp", lambda p: _remember("s3://b/r", "x", "d")),
        "input": (f".{{input}}.{pid}.pull", _fetch),
        "input record": (f".{{input}}.json.{pid}.tmp", _fetch),
    }


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("RAYCL_CACHE_DIR", str(tmp_path / "cache"))
    yield tmp_path / "cache"


@pytest.mark.parametrize("target", list(_writers()))
def test_a_link_planted_at_a_temp_name_writes_nothing_through_it(target: str, tmp_path: Path, cache: Path) -> None:
    """A link at the name each writer used for its temp file, pointing at a file (or folder) outside: the writer
    still writes its target, and the link's target is unchanged."""
    from urllib.parse import quote

    from raycl.distributed.tune_state import _record

    old, write = _writers()[target]
    folder = tmp_path / "run"
    folder.mkdir()
    path = folder / target
    if target == "tune_state":
        path = _record("s3://b/r")
    elif target.startswith("input"):
        path = cache / "inputs" / quote(f"file://{tmp_path / 'input.bin'}", safe="")
    path.parent.mkdir(parents=True, exist_ok=True)
    victim = tmp_path / ("victim_dir" if target == "model" else "victim")
    if target == "model":
        victim.mkdir()
        (victim / "keep.txt").write_text("precious")
    else:
        victim.write_text("precious")
    before = _snapshot(tmp_path / "victim_dir") if target == "model" else victim.read_bytes()
    link = path.parent / old.format(record=path.name, input=path.name)
    link.symlink_to(victim)
    write(path)
    assert (_snapshot(victim) if target == "model" else victim.read_bytes()) == before
    assert path.exists() and not path.is_symlink()
    assert link.is_symlink()  # left alone: never followed, never removed
    assert not [p for p in path.parent.iterdir() if p.name.endswith((".tmp", ".pull")) and not p.is_symlink()]


def test_an_atomic_write_that_fails_leaves_the_target_and_no_temp(tmp_path: Path) -> None:
    from raycl.files import atomic_file

    target = tmp_path / "x.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_file(target, "w", encoding="utf-8") as f:
        f.write("new")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["x.json"]


# ---------------------------------------------------------------------------------------------- 4. schemes
class _Counting(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.hits.append(self.path)
        body = b'{"AccessKeyId": "ASIAEXAMPLE", "SecretAccessKey": "instance-secret"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET  # noqa: N815

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def metadata_server() -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server on 127.0.0.1 standing for a cloud's metadata endpoint; the requests it got."""
    _Counting.hits = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _Counting.hits
    finally:
        server.shutdown()
        server.server_close()


def test_http_and_other_schemes_are_refused_before_any_request(
    metadata_server: tuple[str, list[str]], tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from raycl import storage

    base, hits = metadata_server
    model = tmp_path / "model"  # as much of a model folder as mine checks before its --out
    model.mkdir()
    (model / "config.json").write_text("{}")
    url = f"{base}/latest/meta-data/iam/security-credentials/role"
    err = _refused(
        "train",
        ["idiom", "--preset", "smoke", "--set", f"model.checkpoint={url}", "--out", str(tmp_path / "run")],
        capsys,
    )
    assert err.endswith(
        f"idiom.yaml: config key 'model.checkpoint': {url}: not a storage raycl reads or writes, "
        "refused before any request; expected a local path or a URI of file://, s3://, s3a://, "
        "gs://, gcs://, hdfs://, abfs://, abfss://, az:// (fsspec's chained '::' URIs, http(s) "
        "and other schemes are not storage)"
    )
    for verb, argv in (
        ("tune", ["idiom", "--preset", "smoke", "--out", url]),
        ("train", ["gec_pd", "--set", f"mining.negatives=https{base[4:]}/negs.parquet"]),
        ("mine", ["gec", "--model", str(model), "--data", "x.m2", "--out", f"{base}/negs"]),
    ):
        assert "not a storage raycl reads or writes" in _refused(verb, argv, capsys)
    for uri in (
        url,
        f"https://127.0.0.1:{base.rsplit(':', 1)[1]}/x",
        "ftp://127.0.0.1/x",
        "memory://x/y",
        "ssh://127.0.0.1/x",
        "github://org/repo/x",
        f"s3://b/x::{url}",
        "zip://a.bin::file:///etc/passwd",
    ):
        with pytest.raises(UserError, match="not a storage raycl reads or writes"):
            storage.fetch(uri)
    assert hits == [] and not (tmp_path / "run").exists() and not list(cache.rglob("*"))
    assert storage.check_uri(f"file://{tmp_path}/x") and storage.check_uri("gs://bucket/x")  # storage: as before


def test_an_azure_container_is_not_a_credential_but_a_key_still_is() -> None:
    from raycl.storage import check_uri, hide

    azure = "abfs://container@account.dfs.core.windows.net/runs/x"
    assert check_uri(azure) == azure and hide(azure) == azure
    assert check_uri("az://my-data@acct01.blob.core.windows.net/x")
    for uri in (
        "abfs://container:S3cretKEY@account.dfs.core.windows.net/x",
        "s3://AKIAKEY@bucket/x",
        "abfs://KEY@not-azure.example.org/x",
        "https://u:p@host/x",
        "gs://KEY@bucket/x",
    ):
        with pytest.raises(UserError, match="credentials in a URI are refused"):
            check_uri(uri)


def test_a_lock_file_is_held_once_and_never_taken_through_a_planted_link(tmp_path: Path) -> None:
    """``raycl.files.flocked``: a second holder is refused while the first holds the lock (non-blocking: False at
    once), it is free again after; a link planted at the lock's name is not followed (its target stays as is)."""
    import multiprocessing

    from raycl.files import flocked

    lock = tmp_path / "pool.lock"
    with flocked(lock) as held:
        assert held
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(1) as pool:  # flock is per open file description: ask from another process
            assert pool.apply(_try_lock, (str(lock),)) is False
    with flocked(lock, blocking=False) as again:
        assert again
    target = tmp_path / "victim.txt"
    target.write_text("kept")
    (tmp_path / "planted.lock").symlink_to(target)
    with pytest.raises(OSError), flocked(tmp_path / "planted.lock"):
        pass
    assert target.read_text() == "kept" and oct(lock.stat().st_mode & 0o777) == "0o600"


def _try_lock(path: str) -> bool:
    from raycl.files import flocked

    with flocked(Path(path), blocking=False) as held:
        return held
