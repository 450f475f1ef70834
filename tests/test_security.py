"""Secure by default (issue 22): a run folder cannot run code, nothing of the user's is replaced, bad input costs
bounded time and memory, and credentials stay out of what raycl writes.

One real smoke run (idiom, one step, one Ray Train worker: a checkpoint) with credentials in its environment is
shared by the tests that need a run folder; the others are in-process and take well under a second each."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from raycl.errors import UserError

SECRETS = {
    "AWS_ACCESS_KEY_ID": "AKIAI44QH8DHBEXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY",
    "AWS_SESSION_TOKEN": "FwoGZXIvYXdzEXAMPLEsessionTOKEN",
    "HF_TOKEN": "hf_EXAMPLEtokenVALUE123",
    "WANDB_API_KEY": "0123456789abcdefEXAMPLEwandbKEY",
    "MLFLOW_TRACKING_URI": "https://raycl:Tr4ckingPassw0rd@mlflow.example.org",
    "DATABASE_URL": "postgresql://raycl:DbPassw0rdEXAMPLE@db.example.org/runs",
}
LEAKS = [v for k, v in SECRETS.items() if "URI" not in k and "URL" not in k] + [
    "Tr4ckingPassw0rd",
    "DbPassw0rdEXAMPLE",
    "S3Passw0rd",
]
SMOKE = [
    "idiom",
    "--preset",
    "smoke",
    "--set",
    "optim.epochs=1",
    "--set",
    "optim.batch_size=200",
    "--set",
    "data.setting=zero_shot",
    "--set",
    "adversarial.method=none",
    "--set",
    "scaling.num_workers=1",
]


def _train(*args: str, timeout: int = 540) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **SECRETS, "RAY_ADDRESS": "", "RAYCL_VERBOSE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "raycl.train", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("security") / "run"
    done = _train(*SMOKE, "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done


def _checkpoint(run: Path) -> Path:
    (state,) = sorted(run.glob("ray/**/checkpoint_*/state.pt"))[-1:]
    return state.parent


# ---------------------------------------------------------------------------------------------- 6. secrets
def test_credentials_stay_out_of_the_run_folder_and_its_output(smoke: Any, tmp_path: Path) -> None:
    run, done = smoke
    where = [(p, p.read_bytes()) for p in run.rglob("*") if p.is_file()]
    where += [(Path("<stdout>"), done.stdout.encode()), (Path("<stderr>"), done.stderr.encode())]
    # a URI with a password in a --set value: the one-line error names the key and the file, not the password
    bad = _train(
        *SMOKE,
        "--out",
        str(tmp_path / "bad"),
        "--set",
        "data.train_zero_shot=s3://AKIAX:S3Passw0rd@bucket/train.csv",
    )
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert bad.stderr.strip().startswith("raycl: error: ") and bad.stderr.strip().endswith(
        "config key 'data.train_zero_shot': s3://***@bucket/train.csv: credentials in a URI are refused (they "
        "would show in process lists, logs, Ray's job information and cache folder names); give the URI without "
        "them and the credentials through AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, an "
        "instance profile; AWS_ENDPOINT_URL for the endpoint)"
    )
    where.append((Path("<stderr of the bad --set>"), bad.stderr.encode()))
    found = [(str(p), s) for p, data in where for s in LEAKS if s.encode() in data]
    assert not found, found
    assert len(where) > 20  # the whole folder was read: config, history, checkpoints, Ray's own files


def test_config_yaml_hides_a_uri_password(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from raycl.config import dump_yaml
    from raycl.config.tasks import load_space

    monkeypatch.setenv("HF_TOKEN", SECRETS["HF_TOKEN"])
    space = load_space(
        "idiom",
        preset="smoke",
        overrides=[
            "data.dev=https://me:S3Passw0rd@data.example.org/dev.csv",
            "data.dev_gold=gold.csv",
            f"data.eval={SECRETS['HF_TOKEN']}.csv",
        ],
    )
    dump_yaml(space.config, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert "https://me:***@data.example.org/dev.csv" in text and "eval: ***.csv" in text
    assert "S3Passw0rd" not in text and SECRETS["HF_TOKEN"] not in text


# ---------------------------------------------------------------------------------------------- 2. checkpoints
def test_a_checkpoint_is_plain_data(smoke: Any) -> None:
    """state.pt and every rank's part load with weights_only=True and no allowed globals (NumPy's RNG state as a
    tensor and numbers, not a pickled ndarray)."""
    ckpt = _checkpoint(smoke[0])
    for name in ("state.pt", "rank0.pt"):
        saved = torch.load(ckpt / name, map_location="cpu", weights_only=True)
        assert isinstance(saved["rng"]["numpy"]["key"], torch.Tensor)


def test_a_planted_state_pt_is_refused_before_any_worker_starts(smoke: Any, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(smoke[0], run)
    marker = tmp_path / "MARKER"

    class Shell:
        def __reduce__(self) -> tuple[Any, ...]:
            return os.system, (f"touch {marker}",)

    state = _checkpoint(run) / "state.pt"
    saved = torch.load(state, weights_only=True)
    torch.save({**saved, "progress": Shell()}, state)
    done = _train(*SMOKE, "--out", str(run), timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [
        f"raycl: error: {state}: refused: holds posix.system; expected only tensors, numbers, strings and "
        "containers (read with torch.load(weights_only=True): a checkpoint may not run code)"
    ]
    assert not marker.exists()
    assert not list(run.glob("ray/**/checkpoint_*/state.pt"))[1:]  # nothing trained: no new checkpoint


def test_checkpoints_of_earlier_versions_still_load(tmp_path: Path) -> None:
    """Before, state.pt held np.random.get_state() pickled: its ndarray alone is allowed (NumPy 1 and 2 paths)."""
    from raycl.training.checkpoint import load_state

    np.random.seed(5)
    old = {"rng": {"numpy": np.random.get_state(), "python": ("x", 1)}, "progress": {"step": 3}}
    torch.save(old, tmp_path / "state.pt")
    saved = load_state(tmp_path / "state.pt")
    np.random.set_state(saved["rng"]["numpy"])
    a = np.random.rand()
    np.random.seed(5)
    assert a == np.random.rand() and saved["progress"] == {"step": 3}
    torch.save({"x": np.array(["a", None], dtype=object)}, tmp_path / "objects.pt")  # other arrays stay refused
    with pytest.raises(UserError, match=r"objects.pt: refused: .*ObjectDType"):
        load_state(tmp_path / "objects.pt")


def _main(verb: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    import importlib

    with pytest.raises(SystemExit) as exit_:
        importlib.import_module("raycl.train" if verb == "train" else f"raycl.{verb}").main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return err


def test_a_run_folder_others_can_write_is_not_restored(smoke: Any, tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    shutil.copytree(smoke[0], run)
    (run / "ray").chmod(0o777)
    err = _main("tune", [*SMOKE, "--out", str(run)], capsys)
    assert f"{run / 'ray'}: writable by users other than its owner (mode drwxrwxrwx)" in err


# ---------------------------------------------------------------------------------------------- 3. user's folders
@pytest.mark.parametrize("verb", ["train", "tune"])
def test_out_on_a_folder_of_the_users_is_refused(tmp_path: Path, capsys, verb: str) -> None:
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "chapter1.tex").write_text("years of work")
    err = _main(verb, [*SMOKE, "--out", str(mine)], capsys)
    assert f"{mine}: exists and is not a raycl run folder (no raycl_run.json)" in err
    assert [p.name for p in mine.iterdir()] == ["chapter1.tex"]


# ---------------------------------------------------------------------------------------------- 5. bounded input
def test_yaml_aliases_and_deep_nesting_are_refused_in_one_line(tmp_path: Path, capsys) -> None:
    laughs = ["task: idiom", "search:", "  optim.lr:", "    grid:", "      - &l0 [x, x, x, x, x, x, x, x, x, x]"]
    laughs += [f"      - &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 6)]  # 10^6 strings
    (tmp_path / "laughs.yaml").write_text("\n".join(laughs) + "\n")
    err = _main("tune", [str(tmp_path / "laughs.yaml")], capsys)  # refused at the 10,001st node, not expanded
    assert len(err) < 500
    assert f"{tmp_path / 'laughs.yaml'}:8: invalid YAML (aliases expand to more than 10000 nodes)" in err
    (tmp_path / "deep.yaml").write_text("task: idiom\noptim: " + "[" * 5000 + "]" * 5000 + "\n")
    err = _main("tune", [str(tmp_path / "deep.yaml")], capsys)
    assert f"{tmp_path / 'deep.yaml'}:2: invalid YAML (nested deeper than 64 levels)" in err


def test_a_long_value_in_a_message_is_cut() -> None:
    from raycl.config.tasks import load_space

    with pytest.raises(UserError) as err:
        load_space("idiom", overrides=[f"optim.lr=[{', '.join(['x' * 1000] * 1000)}]"])
    assert "config key 'optim.lr': expected a number, got ['xxx" in str(err.value) and len(str(err.value)) < 500


def test_a_pickle_sharing_one_list_through_its_memo_is_refused(tmp_path: Path) -> None:
    from raycl.data.coherence import read_pairs

    shared = [f"sentence {i} ." for i in range(2000)]
    path = tmp_path / "pairs.pkl"
    path.write_bytes(pickle.dumps([{"pos": shared, "neg": shared} for _ in range(5000)], protocol=3))
    assert path.stat().st_size < 200_000  # 20 million sentences in 140 kB
    with pytest.raises(UserError, match=r"pairs.pkl: its containers are shared through the pickle memo"):
        read_pairs(path)


def test_a_line_longer_than_its_formats_limit_names_file_and_line(tmp_path: Path) -> None:
    from raycl.data.m2 import iter_lines, read_m2

    path = tmp_path / "long.m2"
    path.write_bytes(b"S a b .\n\nS " + b"x " * 600_000 + b"\n")
    with pytest.raises(UserError, match=r"long.m2:3: line longer than 1048576 characters"):
        read_m2(path)
    pieces = [len(line) for _, line in iter_lines(path, chunk_bytes=1000, max_line=2_000_000)]
    assert pieces == [7, 0, 1_200_002]  # a line across 1,200 chunks, read whole


# ---------------------------------------------------------------------------------------------- issue 29
def test_every_error_the_cli_prints_is_redacted(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cli_entry`` is the one place that prints errors: a ``UserError``'s line and, as Python exits on an
    internal error, its traceback (``sys.excepthook``) — both with a URI's password, credential query values and
    credential variables' values hidden, whoever built the message."""
    from raycl.errors import cli_entry

    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # the CLI's hook, undone after the test
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRETS["AWS_SECRET_ACCESS_KEY"])
    message = (
        f"ftp://alice:FtpPassw0rdEX29@host/run?X-Amz-Signature=S1gnatureEXAMPLE29&token=T0kenEXAMPLE29: "
        f"cannot read ({SECRETS['AWS_SECRET_ACCESS_KEY']})"
    )

    @cli_entry
    def main(argv: list[str] | None = None) -> None:
        raise UserError(message)

    with pytest.raises(SystemExit):
        main([])
    err = capsys.readouterr().err
    assert err == "raycl: error: ftp://alice:***@host/run?X-Amz-Signature=***&token=***: cannot read (***)\n"
    try:
        raise RuntimeError(message)  # a library's exception quoting what it was given
    except RuntimeError as internal:
        sys.excepthook(RuntimeError, internal, internal.__traceback__)
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "RuntimeError: ftp://alice:***@host" in err
    assert not [s for s in ("FtpPassw0rdEX29", "S1gnatureEXAMPLE29", "T0kenEXAMPLE29", *LEAKS) if s in err]


BOMB = (
    r"part-00000.parquet: row group 0, column 'negatives.list.element': [\d,]+ compressed bytes decode to "
    r"67,\d{3},\d{3} \([\d,]+x\), expected at most 100x \(a decompression bomb\): refused before"
)


def test_a_parquet_decompression_bomb_is_refused_before_it_is_decompressed(tmp_path: Path) -> None:
    """A negatives file (``mining.negatives``) or a shard a mine run resumes from, a few kilobytes of zstd that
    decode to 64 MiB: refused in one line from its footer, before pyarrow allocates the pages (its memory pool's
    peak stays near zero)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from raycl.miners.beam_search import negatives_schema
    from raycl.miners.shards import done_ids, read_negatives

    n, big = 64, "a" * (1 << 20)
    table = pa.table(
        {
            "id": [f"x:{i}" for i in range(n)],
            "source": ["s"] * n,
            "target": ["t"] * n,
            "negatives": [[big]] * n,
            "scores": [[0.0]] * n,
            "model_version": [0] * n,
            "references": [["t"]] * n,
        },
        schema=negatives_schema(),
    )
    (tmp_path / "shards").mkdir()
    bomb = tmp_path / "shards" / "part-00000.parquet"
    pq.write_table(table, bomb, compression="zstd", use_dictionary=False)
    del table
    assert bomb.stat().st_size < 16 * 1024
    pool, default = pa.proxy_memory_pool(pa.default_memory_pool()), pa.default_memory_pool()
    pa.set_memory_pool(pool)  # what pyarrow allocates while raycl reads the file
    try:
        for read in (
            lambda: read_negatives(bomb),
            lambda: read_negatives(bomb, ids=["x:1"]),
            lambda: done_ids(tmp_path / "shards"),
        ):
            with pytest.raises(UserError, match=BOMB):
                read()
        assert pool.max_memory() < 1 << 20, pool.max_memory()
    finally:
        pa.set_memory_pool(default)


def test_the_image_build_context_leaves_out_runs_tracking_stores_and_credentials() -> None:
    """``docker build -f k8s/Dockerfile .`` sends what ``.dockerignore`` lets through; matched here as Docker
    matches it (moby's patternmatcher: ``**`` any number of folders, ``*`` and ``?`` within one, a pattern
    matching a path or any folder above it, the last matching pattern deciding, ``!`` keeping)."""
    root = Path(__file__).resolve().parents[1]
    kept = [
        p.relative_to(root).as_posix()
        for d in ("raycl", "tune_spaces")
        for p in (root / d).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]
    kept += ["pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE"]  # what `pip install` reads
    out = [
        "mlflow.db",
        "mlruns/0/meta.yaml",
        "wandb/offline-run-1/run-1.wandb",
        "runs/idiom/20250101/report.md",
        "my-run/raycl_run.json",
        "negs/part-00000.parquet",
        "neg.parquet",
        ".env",
        ".env.local",
        "prod.env",
        "raycl/.env",
        "tune_spaces/mlflow.db",
        "raycl/wandb/debug.log",
        ".aws/credentials",
        "credentials.json",
        "gcp-credentials.json",
        "id_rsa.pem",
        ".netrc",
        ".git/config",
        ".venv/bin/python",
        "tests/test_x.py",
        "raycl/__pycache__/cli.cpython-311.pyc",
    ]
    patterns = [
        line.strip()
        for line in (root / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert [p for p in kept if _docker_ignores(patterns, p)] == []
    assert [p for p in out if not _docker_ignores(patterns, p)] == []


def _docker_ignores(patterns: list[str], path: str) -> bool:
    import posixpath
    import re

    def regex(pattern: str) -> re.Pattern[str]:
        out, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**", i):
                i += 2 + pattern.startswith("/", i + 2)
                out += ".*" if i >= len(pattern) else "(.*/)?"
                continue
            out += {"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i]))
            i += 1
        return re.compile(f"^{out}$")

    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]  # the path and every folder above it
    ignored = False
    for raw in patterns:
        keep = raw.startswith("!")
        pattern = posixpath.normpath(raw.lstrip("!")).lstrip("/")
        if keep != ignored:  # as moby: only a pattern that could change the answer is tried
            continue
        if any(regex(pattern).match(c) for c in candidates):
            ignored = not keep
    return ignored
