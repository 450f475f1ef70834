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
LEAKS = [v for k, v in SECRETS.items() if "URI" not in k and "URL" not in k] + ["Tr4ckingPassw0rd",
                                                                                 "DbPassw0rdEXAMPLE", "S3Passw0rd"]
SMOKE = ["idiom", "--preset", "smoke", "--set", "optim.epochs=1", "--set", "optim.batch_size=200", "--set",
         "data.setting=zero_shot", "--set", "adversarial.method=none",
         "--set", "scaling.num_workers=1"]  # fmt: skip


def _train(*args: str, timeout: int = 540) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **SECRETS, "RAY_ADDRESS": "", "RAYCL_VERBOSE": "1"}
    return subprocess.run([sys.executable, "-m", "raycl.train", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)  # fmt: skip


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
    bad = _train(*SMOKE, "--out", str(tmp_path / "bad"), "--set",
                 "data.train_zero_shot=s3://AKIAX:S3Passw0rd@bucket/train.csv")  # fmt: skip
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert bad.stderr.strip() == ("raycl: error: s3://AKIAX:***@bucket/train.csv: cannot read (No such file or "
                                  "directory)")
    where.append((Path("<stderr of the bad --set>"), bad.stderr.encode()))
    found = [(str(p), s) for p, data in where for s in LEAKS if s.encode() in data]
    assert not found, found
    assert len(where) > 20  # the whole folder was read: config, history, checkpoints, Ray's own files


def test_config_yaml_hides_a_uri_password(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from raycl.config import dump_yaml, load_space

    monkeypatch.setenv("HF_TOKEN", SECRETS["HF_TOKEN"])
    space = load_space("idiom", preset="smoke", overrides=[
        "data.dev=https://me:S3Passw0rd@data.example.org/dev.csv", "data.dev_gold=gold.csv",
        f"data.eval={SECRETS['HF_TOKEN']}.csv"])
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
        "containers (read with torch.load(weights_only=True): a checkpoint may not run code)"]
    assert not marker.exists()
    assert not list(run.glob("ray/**/checkpoint_*/state.pt"))[1:]  # nothing trained: no new checkpoint


def test_checkpoints_of_earlier_versions_still_load(tmp_path: Path) -> None:
    """Before, state.pt held np.random.get_state() pickled: its ndarray alone is allowed (NumPy 1 and 2 paths)."""
    from raycl.train.checkpoint import load_state

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
        importlib.import_module("raycl.train.__main__" if verb == "train" else f"raycl.{verb}").main(argv)
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
    import time

    laughs = ["task: idiom", "search:", "  optim.lr:", "    grid:", "      - &l0 [x, x, x, x, x, x, x, x, x, x]"]
    laughs += [f"      - &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 6)]  # 10^6 strings
    (tmp_path / "laughs.yaml").write_text("\n".join(laughs) + "\n")
    t0 = time.perf_counter()
    err = _main("tune", [str(tmp_path / "laughs.yaml")], capsys)
    assert time.perf_counter() - t0 < 5 and len(err) < 500
    assert f"{tmp_path / 'laughs.yaml'}:8: invalid YAML (aliases expand to more than 10000 nodes)" in err
    (tmp_path / "deep.yaml").write_text("task: idiom\noptim: " + "[" * 5000 + "]" * 5000 + "\n")
    err = _main("tune", [str(tmp_path / "deep.yaml")], capsys)
    assert f"{tmp_path / 'deep.yaml'}:2: invalid YAML (nested deeper than 64 levels)" in err


def test_a_long_value_in_a_message_is_cut() -> None:
    from raycl.config import load_space

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
