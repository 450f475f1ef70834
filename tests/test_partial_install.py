"""What must work where packages arrive in pieces (a GPU machine carrying torch and transformers, without spaCy or
ERRANT): the GPU tests are collected and the training benchmark runs, in a Python whose import of ``errant`` and
``spacy`` raises ImportError (a meta-path hook installed by ``sitecustomize``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BLOCKER = '''
import os, sys

class _Absent:
    """Packages named in RAYCL_TEST_ABSENT are not installed, as far as this process can tell."""

    names = set(filter(None, os.environ.get("RAYCL_TEST_ABSENT", "").split(",")))

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r} (absent for this test)", name=name)
        return None

sys.meta_path.insert(0, _Absent())
'''


def without(tmp_path: Path, *absent: str) -> dict[str, str]:
    """The environment of a Python in which ``absent`` packages cannot be imported."""
    hook = tmp_path / "absent"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(BLOCKER)
    return {
        **os.environ,
        "PYTHONPATH": f"{hook}{os.pathsep}{ROOT}",
        "RAYCL_TEST_ABSENT": ",".join(absent),
        "HF_HUB_OFFLINE": "1",
    }


def run(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


# one Python for all three checks (torch, transformers and Ray are imported once: ~10 s on 2 cores)
PROBE = """
import runpy, sys
import pytest
for name in ("errant", "spacy"):
    try:
        __import__(name)
    except ModuleNotFoundError:
        pass
    else:
        raise SystemExit(f"{name} imported: the hook does not work")
if pytest.main(["-m", "gpu", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"]) != 0:
    raise SystemExit("pytest -m gpu --collect-only failed")
sys.argv = ["bench/train.py", "--json", "--shape", "small", "--steps", "1", "--warmup", "0", "--batch", "2",
            "--precisions", "fp32"]
runpy.run_path("bench/train.py", run_name="__main__")
"""


def test_gpu_tests_and_the_training_benchmark_run_without_errant_and_spacy(tmp_path: Path) -> None:
    """``pytest -m gpu --collect-only`` and ``bench/train.py --json`` (one fp32 step of the small shape) where
    ``import errant`` and ``import spacy`` fail (about 12 s on 2 cores)."""
    got = run(["-c", PROBE], without(tmp_path, "errant", "spacy"))
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-2000:]
    assert "test_gpu_low_precision_run" in got.stdout  # collected
    assert '"tokens_per_s"' in got.stdout  # the benchmark's JSON
