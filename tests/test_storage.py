"""Runs on an object store (issue 20 §2): ``--out s3://bucket/prefix`` for ``mine``, ``train`` and ``tune``,
against a real S3 API server on localhost (moto's server mode, started by conftest's ``s3`` fixture on a free port;
endpoint and credentials from the standard environment, as on a cluster). The ``tune`` sweep on S3 is the
uninterrupted run of ``test_resume_driver.py``, compared there with a sweep whose driver was killed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import S3_BUCKET

from raycl import storage
from raycl.data.m2 import Edit, M2Sentence, write_m2
from raycl.models.presets import build_model

BUCKET = S3_BUCKET
SENTENCES = [
    M2Sentence("He do n't like it .", (Edit(1, 2, "R:VERB:SVA", "does"),)),
    M2Sentence("This are a sentence .", (Edit(1, 2, "R:VERB:SVA", "is"),)),
    M2Sentence("Fine as it is ."),
    M2Sentence("She go home every day .", (Edit(1, 2, "R:VERB:SVA", "goes"),)),
    M2Sentence("They has two car .", (Edit(1, 2, "R:VERB:SVA", "have"), Edit(3, 4, "R:NOUN:NUM", "cars"))),
]


def _forget_local(uri: str) -> None:
    """Drop this machine's staged copy: what a run finds next comes from the store."""
    import shutil

    shutil.rmtree(storage.stage_dir(uri), ignore_errors=True)


# ---------------------------------------------------------------------------------------------- the store
def test_a_folder_is_pulled_only_once_its_manifest_is_complete(s3: dict[str, str], tmp_path: Path) -> None:
    uri = f"s3://{BUCKET}/unit"
    run = storage.stage(uri)
    assert storage.remote_of(run / "base_model" / "config.json") == f"{uri}/base_model/config.json"
    (run / "base_model").mkdir()
    (run / "base_model" / "config.json").write_text("{}")
    (run / "base_model" / "weights.bin").write_bytes(b"w" * 1000)
    storage.mirror(run / "base_model")
    manifest = json.loads(storage.read_text(f"{uri}/base_model/_manifest.json"))
    assert manifest["complete"] and manifest["files"]["weights.bin"]["size"] == 1000
    (run / "init").mkdir()
    (run / "init" / "config.json").write_text("{}")
    storage.publish(run / "init")  # what fit_job does with a training's initial model
    assert json.loads(storage.read_text(f"{uri}/init/_manifest.json"))["complete"]

    fs, where = storage.filesystem(f"{uri}/best_model")  # an upload that died after its first file
    with fs.open_output_stream(f"{where}/_manifest.json") as f:
        f.write(b'{"complete": false}')
    with fs.open_output_stream(f"{where}/config.json") as f:
        f.write(b"{}")
    _forget_local(uri)
    got = storage.stage(uri)
    assert (got / "base_model" / "weights.bin").read_bytes() == b"w" * 1000
    assert not (got / "best_model").exists()  # half a model is never taken for one
    assert storage.local(storage.stage_dir(uri) / "base_model") == got / "base_model"


def test_the_atomic_writers_upload_a_staged_file_as_soon_as_it_is_in_place(s3: dict[str, str]) -> None:
    """What a worker writes reaches the store at once, from its own node: a crash later loses nothing of it."""
    import pyarrow as pa

    from raycl.miners.shards import write_shard
    from raycl.records import append_history

    uri = f"s3://{BUCKET}/writes"
    run = storage.stage(uri)
    (run / "nbest").mkdir()
    write_shard(run / "nbest", 0, pa.table({"id": ["a"]}))
    append_history(run, {"report": 1, "loss": 0.5})
    assert set(storage.listing(uri)) == {"nbest/part-00000.parquet", "history.jsonl"}
    assert json.loads(storage.read_text(f"{uri}/history.jsonl")) == {"report": 1, "loss": 0.5}


@pytest.mark.parametrize("scheme", ["file", "memory"])
def test_a_pyarrow_or_fsspec_uri_round_trips_like_s3(
    scheme: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``file://`` (pyarrow, real folders) and ``memory://`` (fsspec only: the path ``abfs://`` takes where pyarrow
    has no Azure file system; allowed here for the test, raycl refuses it otherwise) stage, upload and pull
    back."""
    monkeypatch.setenv("RAYCL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(storage.uris, "SCHEMES", (*storage.SCHEMES, "memory"))
    uri = f"file://{tmp_path}/store/run" if scheme == "file" else f"memory://raycl-{tmp_path.name}/run"
    run = storage.stage(uri)
    (run / "model").mkdir()
    (run / "model" / "config.json").write_text("{}")
    storage.mirror(run / "model")
    (run / "report.md").write_text("# report")
    storage.push(run)
    _forget_local(uri)
    again = storage.stage(uri)
    assert sorted(p.relative_to(again).as_posix() for p in again.rglob("*")) == [
        "model",
        "model/config.json",
        "report.md",
    ]


def test_a_bucket_that_does_not_exist_is_one_line(
    s3: dict[str, str], model_dir: Path, corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from raycl.mine import main

    with pytest.raises(SystemExit) as exc:
        main(["gec", "--model", str(model_dir), "--data", str(corpus), "--out", "s3://no-such-bucket/negs"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "no-such-bucket" in err, err


# ---------------------------------------------------------------------------------------------- mine
@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "tiny.m2"
    write_m2(path, SENTENCES)
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    texts = [t for s in SENTENCES for t in (s.source, s.target())] * 4
    tiny = dict(d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_layers=1, decoder_layers=1)
    return build_model("smoke", out_dir=tmp_path_factory.mktemp("model"), texts=texts, vocab_size=300, **tiny)


def _mine(model_dir: Path, corpus: Path, uri: str, capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    from raycl.mine import main

    assert (
        main(
            [
                "gec",
                "--model",
                str(model_dir),
                "--data",
                str(corpus),
                "--out",
                uri,
                "--k",
                "2",
                "--max-len-b",
                "6",
                "--num-miners",
                "0",
                "--shard-size",
                "2",
                "--json",
                *extra,
            ]
        )
        == 0
    )
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_mine_writes_shards_and_manifest_to_the_store_and_resumes_from_it(
    s3: dict[str, str], model_dir: Path, corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pyarrow.parquet as pq

    uri = f"s3://{BUCKET}/negs"
    first = _mine(model_dir, corpus, uri, capsys)
    assert first["out"] == uri and first["shards_written"] == 3
    objects = storage.listing(uri)
    assert sorted(objects) == [
        "_manifest.json",
        "_mining.json",
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
    ]
    index = json.loads(storage.read_text(f"{uri}/_manifest.json"))
    assert {k: v["size"] for k, v in index["files"].items()} == {
        k: v for k, v in objects.items() if k != "_manifest.json"
    }
    fs, where = storage.filesystem(uri)
    rows = pq.read_table(f"{where}/part-00001.parquet", filesystem=fs).to_pylist()
    assert [r["id"] for r in rows] == ["tiny.m2:2", "tiny.m2:3"]

    fs.delete_file(f"{where}/part-00001.parquet")  # a shard the first run never finished
    _forget_local(uri)  # another machine: all it knows is in the store
    again = _mine(model_dir, corpus, uri, capsys)
    assert (again["shards_written"], again["resumed"], again["shards"]) == (1, 3, 3)
    assert pq.read_table(f"{where}/part-00001.parquet", filesystem=fs).to_pylist() == rows

    with fs.open_output_stream(f"{where}/notes.txt") as f:  # not the mining's: --overwrite leaves it
        f.write(b"mine")
    fresh = _mine(model_dir, corpus, uri, capsys, "--overwrite", "--shard-size", "5")  # one shard of 5 now
    assert fresh["shards_written"] == 1 and not fresh["resumed"]
    assert sorted(storage.listing(uri)) == ["_manifest.json", "_mining.json", "notes.txt", "part-00000.parquet"]


# ---------------------------------------------------------------------------------------------- train and tune
IDIOM_SMALLEST = [
    "--preset",
    "smoke",
    "--set",
    "data.setting=zero_shot",
    "--set",
    "optim.epochs=1",
    "--set",
    "adversarial.method=none",
    "--set",
    "ema.enabled=false",
]


def _cli(verb: str, space: str, uri: str, env: dict[str, str], *extra: str) -> dict:
    """``python -m raycl.VERB`` as a user runs it: its own embedded Ray, the store from the environment."""
    done = subprocess.run(
        [sys.executable, "-m", f"raycl.{verb}", space, *IDIOM_SMALLEST, *extra, "--out", uri, "--json"],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **env, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def objects_of_a_run(uri: str) -> dict[str, int]:
    objects = storage.listing(uri)
    index = json.loads(storage.read_text(f"{uri}/_manifest.json"))  # written last: the run's upload is whole
    assert {k: v["size"] for k, v in index["files"].items()} == {
        k: v for k, v in objects.items() if not k.endswith("_manifest.json") and not k.startswith("ray/")
    }
    assert json.loads(storage.read_text(f"{uri}/base_model/_manifest.json"))["complete"]
    return objects


def test_a_smoke_train_writes_its_run_and_ray_storage_to_the_store(s3: dict[str, str]) -> None:
    uri = f"s3://{BUCKET}/train"
    summary = _cli("train", "idiom", uri, s3)
    assert summary["store"] == uri
    objects = objects_of_a_run(uri)
    for key in (
        "config.yaml",
        "report.md",
        "results.csv",
        "best.json",
        "trials/zero_shot/history.jsonl",
        "base_model/config.json",
    ):
        assert key in objects, sorted(objects)
    ray_train = [k for k in objects if k.startswith("ray/train-zero_shot/checkpoint_")]  # Ray Train's own storage
    assert ray_train, sorted(objects)
    history = storage.read_text(f"{uri}/trials/zero_shot/history.jsonl").splitlines()
    assert json.loads(history[-1])["final"] == 1
    assert json.loads(storage.read_text(f"{uri}/trials/zero_shot/best_model/_manifest.json"))["complete"]
    print("\n".join(f"{v:>10}  {uri}/{k}" for k, v in sorted(objects.items())))  # the report's object listing


# ---------------------------------------------------------------------------------------------- other nodes
def _nbest_table(ids: list[str]) -> Any:
    import pyarrow as pa

    from raycl.distributed.nbest import NBEST_COLUMNS

    rows = {
        "id": ids,
        "negatives": [[f"neg of {i}", f"source {i}"] for i in ids],
        "scores": [[-1.0, -2.0] for _ in ids],
        "model_version": [0 for _ in ids],
    }
    return pa.table({c: rows[c] for c in NBEST_COLUMNS})


def test_a_stream_on_another_node_reads_the_runs_nbest_from_the_store(
    s3: dict[str, str], tmp_path: Path, ray_local: Any
) -> None:
    """The run's shared n-best, written on the driver's node (each shard uploaded as it lands), read by an n-best
    stream actor given only the URI, in a process whose node cache is another folder (another node's disk, the
    store's credentials from its environment): it finds every list in the bucket and keeps them in its cache."""
    from raycl.data.gec import GecExample
    from raycl.distributed.nbest import NBestStream, read_nbest_shards
    from raycl.miners.shards import write_shard

    uri = f"s3://{BUCKET}/nodes"
    nbest = storage.stage(uri) / "nbest"
    nbest.mkdir()
    write_shard(nbest, 0, _nbest_table(["a.m2:0", "a.m2:1"]))
    write_shard(nbest, 1, _nbest_table(["a.m2:2"]))
    other = tmp_path / "other-node-cache"
    examples = [GecExample(f"a.m2:{i}", f"source {i}", f"target {i}") for i in range(3)]
    actor = (
        ray_local.remote(NBestStream)
        .options(num_cpus=0, runtime_env={"env_vars": {**s3, "RAYCL_CACHE_DIR": str(other)}})
        .remote(examples=examples, out_dir=f"{uri}/nbest", task_size=2, lease_s=30.0)
    )
    progress = ray_local.get(actor.progress.remote())
    assert progress["resumed"] == 3 and progress["complete"], progress
    got = ray_local.get(actor.wait_ready.remote(["a.m2:2", "a.m2:0"], 1.0))
    assert [(it.id, it.negatives[0]) for it in got] == [("a.m2:2", "neg of a.m2:2"), ("a.m2:0", "neg of a.m2:0")]
    ray_local.kill(actor)
    assert sorted(p.name for p in other.rglob("part-*.parquet")) == ["part-00000.parquet", "part-00001.parquet"]
    print("\n".join(f"{v:>10}  {uri}/nbest/{k}" for k, v in sorted(storage.listing(f"{uri}/nbest").items())))

    os.environ["RAYCL_CACHE_DIR"], driver_cache = str(tmp_path / "third-node"), os.environ["RAYCL_CACHE_DIR"]
    try:  # in a process, given the URI alone; a node that staged the run caches it in that run's folder
        assert sorted(read_nbest_shards(f"{uri}/nbest")) == ["a.m2:0", "a.m2:1", "a.m2:2"]
        assert storage.on_node(f"{uri}/nbest") == storage.stage_dir(f"{uri}/nbest")
        assert storage.on_node(f"{uri}/nbest/x") == storage.stage_dir(f"{uri}/nbest") / "x"
    finally:
        os.environ["RAYCL_CACHE_DIR"] = driver_cache


def test_mines_last_check_finds_shards_written_on_other_nodes(s3: dict[str, str], tmp_path: Path) -> None:
    """``raycl.mine --out s3://…``: a miner on another node (its own node cache) writes its range's shard, which
    goes to the store; the driver's final check takes it from there (and caches it) instead of calling it lost."""
    from raycl.distributed.corpus import _check_done
    from raycl.miners.corpus import Range
    from raycl.miners.shards import schema, write_shard

    uri = f"s3://{BUCKET}/mined"
    out = storage.stage(uri)
    driver_cache = os.environ["RAYCL_CACHE_DIR"]
    os.environ["RAYCL_CACHE_DIR"] = str(tmp_path / "miner-node")
    try:  # what RangeMiner does on its node with the out_dir it is given (storage.portable: the URI)
        write_shard(storage.on_node(uri), 4, schema().empty_table())
        assert storage.on_node(uri) != out
    finally:
        os.environ["RAYCL_CACHE_DIR"] = driver_cache
    assert not (out / "part-00004.parquet").exists()
    assert storage.portable(out) == uri and storage.on_node(storage.portable(out)) == out
    assert storage.on_node(storage.portable(out / "sub")) == out / "sub"
    r = Range(4, "/data/a.m2", "", "m2", 0, 1, 0, 0, 0, 1)
    _check_done(out, [r], [], stopped=False)
    assert (out / "part-00004.parquet").is_file()


# ---------------------------------------------------------------------------------------------- inputs
def test_a_checkpoint_and_negatives_given_as_uris_are_fetched_to_the_nodes_cache(
    s3: dict[str, str], model_dir: Path, tmp_path: Path
) -> None:
    """``model.checkpoint=s3://…`` (a model folder as a user uploads it: plain objects, no manifest) and
    ``mining.negatives=s3://…`` (a shard folder) are fetched into the node's cache before Hugging Face or Parquet
    reads them; a node that lacks the cached copy fetches it when it reads the path it was given."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from raycl.config.tasks import load_space
    from raycl.driver import Run
    from raycl.errors import UserError
    from raycl.miners.shards import read_negatives, schema
    from raycl.models.seq2seq import Seq2SeqScorer
    from raycl.recipes import recipe_for

    fs, where = storage.filesystem(f"s3://{BUCKET}/inputs")
    for path in model_dir.iterdir():
        with open(path, "rb") as f, fs.open_output_stream(f"{where}/base/{path.name}") as out:
            out.write(f.read())
    rows = {
        "id": ["tiny.m2:0"],
        "source": ["x"],
        "target": ["y"],
        "negatives": [["a", "b"]],
        "scores": [[-1.0, -2.0]],
        "model_version": [0],
        "references": [["y"]],
    }
    pq.write_table(pa.table(rows, schema=schema()), f"{where}/negs/part-00000.parquet", filesystem=fs)

    over = [f"model.checkpoint=s3://{BUCKET}/inputs/base", f"mining.negatives=s3://{BUCKET}/inputs/negs"]
    cfg = load_space("gec_bart", preset="smoke", overrides=over).config
    run = Run(cfg, tmp_path / "run", tmp_path / "run" / "base_model", [], {})
    recipe_for("gec").base_model(run)  # the driver: the base model is the fetched checkpoint
    assert run.base_model == Path(storage.fetch(cfg.model.checkpoint)) != model_dir
    assert Seq2SeqScorer.from_pretrained(run.base_model).model.config.d_model == 32
    negatives = read_negatives(storage.fetch(cfg.mining.negatives))  # what a GEC worker reads
    assert negatives["tiny.m2:0"].negatives == ("a", "b")
    shutil.rmtree(run.base_model)  # another node, given the driver's path: fetched on first read
    assert (storage.local(run.base_model) / "config.json").is_file()
    with pytest.raises(UserError, match="no such object"):
        storage.fetch(f"s3://{BUCKET}/inputs/missing")


# ---------------------------------------------------------------------------------------------- attacks (issue 29)
# What an attacker with write access to a bucket prefix (a shared team bucket) could do to a run that reads it,
# each refused: planted objects on moto's S3 server, the CLIs called as a user calls them.
class _Shell:
    """A pickle that, once loaded, creates ``marker``: the planted code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"touch {self.marker}",)


def _plant(key: str, body: bytes) -> None:
    """An object put as an attacker puts it (boto3: the key as it is, ``..`` included)."""
    import boto3

    boto3.client("s3").put_object(Bucket=BUCKET, Key=key, Body=body)


def _unplant(prefix: str) -> None:
    import boto3

    client = boto3.client("s3")
    for obj in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=obj["Key"])


def _refused(verb: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """``python -m raycl.VERB`` in this process: exit status 2 and one line on stderr, which is returned."""
    import importlib

    module = importlib.import_module("raycl.train" if verb == "train" else f"raycl.{verb}")
    with pytest.raises(SystemExit) as exit_:
        module.main(argv)
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return out + err


def _climbing(prefix: str, local: Path, target: Path) -> tuple[str, str]:
    """The key whose copy under the cache folder ``local`` is ``target``, and the key the request for it
    resolves to (the object pyarrow fetches): both are planted."""
    import posixpath

    listed = f"{prefix}/{os.path.relpath(target, local)}"
    return listed, posixpath.normpath(listed)


def test_keys_that_climb_out_of_the_cache_are_refused_before_anything_is_written(
    s3: dict[str, str], model_dir: Path, corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``raycl.mine --out s3://…`` and an input fetched from ``model.checkpoint=s3://…``: a key holding ``..``
    names the object another path resolves to and a local copy outside the cache (here ``tmp_path/victim``)."""
    from raycl.errors import UserError

    victim, deep = tmp_path / "victim", "attack/p1/p2/p3/p4/p5"
    out, ckpt = f"s3://{BUCKET}/{deep}/mined", f"s3://{BUCKET}/{deep}/ckpt"
    inputs = storage.cache_root() / storage.INPUTS / storage.cache_name(ckpt)
    keys = [
        *_climbing(f"{deep}/mined", storage.stage_dir(out), victim / "PWNED_mined"),
        *_climbing(f"{deep}/ckpt", inputs, victim / "PWNED_ckpt"),
    ]
    for key in keys:
        _plant(key, b"planted by whoever can write the bucket\n")
    try:
        # arguments are checked before the store is read: a mistyped command stages nothing
        mine = ["gec", "--data", str(corpus), "--out", out, "--num-miners", "0"]
        err = _refused("mine", [*mine, "--model", str(tmp_path / "nonexistent")], capsys)
        assert "expected an HF model folder with config.json (--model)" in err
        assert not storage.stage_dir(out).exists()
        err = _refused("mine", [*mine, "--model", str(model_dir)], capsys)
        assert err == (
            f"raycl: error: object key '{BUCKET}/{keys[0]}': a '.', '..' or empty segment, refused "
            "(it would be read from and written outside its prefix); expected plain keys under the "
            "run's or input's prefix (delete the object)\n"
        )
        with pytest.raises(UserError, match=rf"object key '{BUCKET}/{deep}/ckpt/\.\./"):
            storage.fetch(ckpt)
        assert not victim.exists()  # nothing written outside the cache
    finally:
        _unplant("attack/")


def test_a_uri_inside_the_cache_is_checked_before_anything_is_made(s3: dict[str, str]) -> None:
    from raycl.errors import UserError

    for bad in (f"s3://{BUCKET}/a/../../etc", f"s3://{BUCKET}/a//b", f"s3://{BUCKET}/./a"):
        with pytest.raises(UserError, match=r"a '\.', '\.\.' or empty path segment, expected a plain prefix"):
            storage.stage(bad)
    run = storage.stage(f"s3://{BUCKET}/inside")
    with pytest.raises(UserError, match="outside its cache folder"):
        storage.inside(run / ".." / "elsewhere", run)


CREDENTIALED = {  # a URI as a user might give it, and the secret it carries
    "s3 key in --out": (
        "train",
        "--out",
        f"s3://AKIAEXAMPLEKEY29:S3cretKEYexample29@{BUCKET}/run",
        "S3cretKEYexample29",
    ),
    "ftp password in --out": ("tune", "--out", "ftp://alice:FtpPassw0rdEX29@host/run", "FtpPassw0rdEX29"),
    "presigned checkpoint": (
        "train",
        "--set",
        "model.checkpoint=https://b.s3.amazonaws.com/m?X-Amz-Credential="
        "AKIAEXAMPLEKEY29%2F2025&X-Amz-Signature=S1gnatureEXAMPLE29",
        "S1gnatureEXAMPLE29",
    ),
    "SAS token in mine --out": (
        "mine",
        "--out",
        f"s3://{BUCKET}/n?X-Amz-Security-Token=T0kenEXAMPLE29",
        "T0kenEXAMPLE29",
    ),
}


@pytest.mark.parametrize("case", list(CREDENTIALED))
def test_a_uri_that_carries_credentials_is_refused_and_never_shown_or_named(
    case: str,
    s3: dict[str, str],
    model_dir: Path,
    corpus: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    verb, option, value, secret = CREDENTIALED[case]
    if verb == "mine":
        argv = ["gec", "--model", str(model_dir), "--data", str(corpus), option, value]
    else:
        out = [] if option == "--out" else ["--out", str(tmp_path / "run")]
        argv = ["idiom", *IDIOM_SMALLEST, option, value, *out]
    before = {p for p in storage.cache_root().rglob("*")}
    printed = _refused(verb, argv, capsys)
    assert "credentials in a URI are refused" in printed and secret not in printed, printed
    if value.startswith("s3://") or "amazonaws" in value:
        assert "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in printed  # the store's own variables
    made = {p for p in storage.cache_root().rglob("*")} - before
    assert not made and not any(secret in str(p) for p in before), made  # no folder named after it
    assert not (tmp_path / "run").exists()


def test_a_store_endpoint_that_carries_credentials_is_refused(
    s3: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio:M1nioPassw0rd29@127.0.0.1:9000")
    printed = _refused("train", ["idiom", *IDIOM_SMALLEST, "--out", f"s3://{BUCKET}/endpoint"], capsys)
    assert (
        printed.startswith(
            "raycl: error: environment variable AWS_ENDPOINT_URL: http://***@127.0.0.1:9000: "
            "credentials in a URI are refused"
        )
        and "M1nioPassw0rd29" not in printed
    )


def test_the_input_cache_is_the_users_own_and_trusted_by_content_not_size(
    s3: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another user of a shared ``RAYCL_CACHE_DIR`` cannot plant what ``fetch`` returns: the cache's folders are
    this user's (0700, another owner refused), and a cached copy is taken only when its download's record
    vouches for it — a copy replaced at the store's size is fetched again."""
    import stat

    from raycl.errors import UserError

    shared = tmp_path / "shared-cache"
    shared.mkdir(mode=0o777)
    monkeypatch.setenv("RAYCL_CACHE_DIR", str(shared))
    real = b"the real negatives......"
    _plant("inputs29/negs.parquet", real)
    _plant("inputs29/model/config.json", b'{"real": true}')
    _plant("inputs29/model/weights.bin", b"w" * 100)
    try:
        got = Path(storage.fetch(f"s3://{BUCKET}/inputs29/negs.parquet"))
        assert got.read_bytes() == real
        assert stat.S_IMODE((shared / "inputs").stat().st_mode) == stat.S_IMODE(shared.stat().st_mode) == 0o700
        got.write_bytes(b"PLANTED by another user!")  # the object's size
        assert Path(storage.fetch(f"s3://{BUCKET}/inputs29/negs.parquet")).read_bytes() == real
        model = Path(storage.fetch(f"s3://{BUCKET}/inputs29/model"))
        (model / "config.json").write_bytes(b'{"evil": 1111}')
        again = Path(storage.fetch(f"s3://{BUCKET}/inputs29/model"))
        assert (again / "config.json").read_bytes() == b'{"real": true}'
        if os.getuid() == 0:  # a folder another user made in the shared cache (root can make one here)
            os.chown(shared / "inputs", 65534, 65534)
            with pytest.raises(UserError, match=r"inputs: a raycl cache folder owned by uid 65534, not by this "):
                storage.fetch(f"s3://{BUCKET}/inputs29/negs.parquet")
    finally:
        _unplant("inputs29/")


# ------------------------------------------------------------------------------ attacks: a sweep restored from S3
def test_a_planted_sweep_state_is_refused_in_one_line_before_ray_starts(
    s3: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``raycl.tune … --out s3://…`` over a prefix where someone planted ``ray/sweep/tuner.pkl``: Tune's restore
    would unpickle it; raycl has no record of writing it, so the run stops before Ray starts — unless the user
    trusts the store (``--trust-store``)."""
    import importlib
    import pickle

    import raycl.distributed.runtime as runtime
    from raycl.distributed import tune_state

    def no_ray(*_: Any, **__: Any) -> None:
        raise AssertionError("Ray started: the check must come first")

    monkeypatch.setattr(runtime, "init_ray", no_ray)
    monkeypatch.setattr(tune_state, "_trusted", set())  # --trust-store's, for this test only
    marker = tmp_path / "MARKER"
    _plant("planted/ray/sweep/tuner.pkl", pickle.dumps(_Shell(marker)))
    try:
        uri = f"s3://{BUCKET}/planted"
        err = _refused("tune", ["idiom", *IDIOM_SMALLEST, "--out", uri], capsys)
        assert err.startswith(
            f"raycl: error: {uri}/ray/sweep: Ray Tune's saved sweep state, which restoring "
            "the sweep unpickles, was not written by raycl as this user on this machine (no "
            f"record in {storage.cache_root() / 'tune_state'}): refused; start afresh with "
            "another --out"
        )
        assert "--trust-store" in err and not marker.exists()
        with pytest.raises(AssertionError, match="Ray started"):  # trusted: past the check, on to Ray
            importlib.import_module("raycl.tune").main(["idiom", *IDIOM_SMALLEST, "--out", uri, "--trust-store"])
    finally:
        _unplant("planted/")


def test_a_sweep_is_restored_only_from_state_raycl_wrote(
    s3: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_sweep`` itself (no Ray needed to get as far as the restore): planted state is refused before
    ``Tuner.restore``; what raycl wrote through its guarded store passes; state replaced or added after the
    check is never what Tune reads; a pickle the run did not write is not unpickled; ``--trust-store`` takes
    the store as it is."""
    import pickle

    import pyarrow.fs as pafs

    from raycl.config import TuneSection
    from raycl.distributed import tune_state
    from raycl.distributed.sweep import run_sweep
    from raycl.errors import UserError

    monkeypatch.setattr(tune_state, "_trusted", set())
    marker, uri = tmp_path / "MARKER", f"s3://{BUCKET}/restore"
    _plant("restore/ray/sweep/tuner.pkl", pickle.dumps(_Shell(marker)))
    try:
        with pytest.raises(UserError, match=r"restore/ray/sweep: Ray Tune's saved sweep state, .*\(no record"):
            run_sweep(
                lambda params: None,
                {},
                trial_kwargs={},
                tune_cfg=TuneSection(),
                name="sweep",
                storage_path=storage.stage(uri) / "ray",
                max_t=1,
            )
        assert not marker.exists()

        fs, where = storage.filesystem(f"{uri}/ray")
        exp, exp_uri = f"{where}/sweep", f"{uri}/ray/sweep"
        store = tune_state.guarded(fs, exp, exp_uri)  # what Tune writes, as it writes it
        with store.open_output_stream(f"{exp}/tuner.pkl") as f:
            f.write(pickle.dumps({"tuner": 1}))
        staging = tmp_path / "driver_artifacts"  # Tune's syncer: the driver's staging folder, copied up
        (staging / "trial_0").mkdir(parents=True)
        (staging / "experiment_state-1.json").write_text('{"trials": 1}')
        (staging / "trial_0" / "error.pkl").write_bytes(pickle.dumps(ValueError("the trial's error")))
        pafs.copy_files(str(staging), exp, destination_filesystem=store)
        pinned = tune_state.checked(fs, exp, exp_uri)
        assert sorted(pinned) == ["experiment_state-1.json", "tuner.pkl"]

        restored = tune_state.guarded(fs, exp, exp_uri, pinned)
        _plant("restore/ray/sweep/experiment_state-1.json", b'{"planted after the check": 1}')
        _plant("restore/ray/sweep/experiment_state-9.json", b'{"_type": "CLOUDPICKLE_FALLBACK"}')
        with restored.open_input_stream(f"{exp}/experiment_state-1.json") as f:
            assert f.read() == b'{"trials": 1}'  # the checked bytes, not the store's
        names = [i.base_name for i in restored.get_file_info(pafs.FileSelector(exp))]
        assert "experiment_state-9.json" not in names and "tuner.pkl" in names
        with pytest.raises(UserError, match="experiment_state-1.json: not a version raycl wrote there"):
            tune_state.checked(fs, exp, exp_uri)
        with store.open_input_stream(f"{exp}/trial_0/error.pkl") as f:  # what this run wrote: read
            assert str(pickle.loads(f.read())) == "the trial's error"
        _plant("restore/ray/sweep/trial_0/error.pkl", pickle.dumps(_Shell(marker)))
        with pytest.raises(UserError, match=r"trial_0/error.pkl: a pickle in the store that this run did not"):
            store.open_input_stream(f"{exp}/trial_0/error.pkl")
        tune_state.trust(uri)  # --trust-store: the store as it is
        trusted = tune_state.checked(fs, exp, exp_uri)
        assert trusted["experiment_state-9.json"] == b'{"_type": "CLOUDPICKLE_FALLBACK"}'
        assert not marker.exists()
    finally:
        _unplant("restore/")
