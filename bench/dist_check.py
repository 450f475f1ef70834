"""``make dist``'s check of the built wheel, as a user who installs raycl rather than cloning it would meet it.

A fresh virtual environment outside the checkout installs torch (``--torch``, default ``torch==2.13.0``: the CPU
build; an unpinned torch pulls a CUDA build of several GB) and then the wheel, not editable. From a working folder
outside the checkout, with nothing of it on the path (no ``PYTHONPATH``), it checks that:

- ``raycl`` is the installed package, and it has exactly the tune spaces of the checkout's ``tune_spaces/``,
  read from inside the package; each loads at its ``smoke`` preset, and ``raycl tune --help`` lists them;
- the ``raycl`` command lists its verbs;
- one short training runs to its summary: ``raycl train idiom --preset smoke`` without Ray
  (``scaling.num_workers=0``), one epoch;
- the wheel declares each extra (``pretrained``, ``ann``, ``mlflow``, ``wandb``, ``tracking``, ``dev``) with its
  requirements, and each but ``dev`` resolves on its own (``pip install --dry-run WHEEL[extra]``), unless
  ``--no-extras``; ``dev`` is what ``make install`` installs, and a dry run of it takes pip many minutes.

Prints one JSON summary (each step's seconds) and exits 0, or exits 1 naming the step that failed, with its
output's tail; the environment is removed either way unless ``--keep``. About 5 minutes on 2 cores, most of it pip.

    python bench/dist_check.py dist/raycl-0.1.0-py3-none-any.whl
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("pretrained", "ann", "mlflow", "wandb", "tracking", "dev")
RESOLVED = ("pretrained", "ann", "mlflow", "wandb", "tracking")  # dev: make install's own set
VERBS = ("tune", "train", "mine", "eval", "convert")

# run by the installed Python, in the working folder outside the checkout: where raycl and its spaces come from
PROBE = """
import json, sys
from pathlib import Path
import raycl
from raycl.config import space_names, spaces_dir
from raycl.config.tasks import load_space
package = Path(raycl.__file__).resolve().parent
spaces = {}
for name in space_names():
    space = load_space(name, preset="smoke")
    spaces[name] = {"task": space.config.task, "source": space.source}
from importlib.metadata import metadata, requires
extras = {e: [r for r in requires("raycl") or [] if f'extra == "{e}"' in r]
          for e in metadata("raycl").get_all("Provides-Extra") or []}
print(json.dumps({"raycl": str(package), "spaces_dir": str(spaces_dir()), "spaces": spaces,
                  "sys_path": sys.path, "extras": extras}))
"""


class Failed(Exception):
    """A step that did not do what it should: its name and what was seen."""


def run(step: str, cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> str:
    """``cmd``'s stdout; a non-zero exit or a timeout is :class:`Failed` with the output's tail."""
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Failed(f"{step}: timed out after {timeout:.0f} s: {' '.join(cmd)}") from None
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise Failed(f"{step}: exit status {done.returncode}: {' '.join(cmd)}\n{tail}")
    return done.stdout


def clean_env() -> dict[str, str]:
    """This environment without anything that would put the checkout (or another Python's packages) on the
    path, or a virtual environment's PATH first."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONNOUSERSITE": "1"}


def install(venv: Path, wheel: Path, torch: str, env: dict[str, str], work: Path) -> None:
    run("venv", [sys.executable, "-m", "venv", str(venv)], cwd=work, env=env, timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    run("install torch", [*pip, torch], cwd=work, env=env, timeout=900)
    run("install the wheel", [*pip, str(wheel)], cwd=work, env=env, timeout=1200)


def check_spaces(venv: Path, env: dict[str, str], work: Path) -> dict[str, Any]:
    """The installed raycl and its spaces: the checkout's names, each read from inside the installed package;
    the extras its metadata declares."""
    got = json.loads(run("spaces", [str(venv / "bin" / "python"), "-c", PROBE], cwd=work, env=env, timeout=300))
    if empty := [e for e in EXTRAS if not got["extras"].get(e)]:
        raise Failed(f"metadata: no extra or no requirement of extra {empty} (the wheel has {got['extras']})")
    package = Path(got["raycl"])
    if not package.is_relative_to(venv.resolve()):
        raise Failed(f"spaces: raycl imported from {package}, not from the environment {venv}")
    if any(Path(p).resolve() == ROOT for p in got["sys_path"] if p):
        raise Failed(f"spaces: the checkout {ROOT} is on the installed Python's sys.path")
    want = sorted(p.stem for p in (ROOT / "tune_spaces").glob("*.yaml"))
    if sorted(got["spaces"]) != want:
        raise Failed(f"spaces: the wheel has {sorted(got['spaces'])}, the checkout's tune_spaces/ {want}")
    outside = [n for n, s in got["spaces"].items() if not Path(s["source"]).resolve().is_relative_to(package)]
    if outside:
        raise Failed(f"spaces: {outside} read from outside the installed package {package}")
    return {name: s["task"] for name, s in got["spaces"].items()}


def check_command(venv: Path, env: dict[str, str], work: Path, spaces: list[str]) -> None:
    """``raycl --help`` names every verb; ``raycl tune --help`` every space."""
    raycl = str(venv / "bin" / "raycl")
    top = run("raycl --help", [raycl, "--help"], cwd=work, env=env, timeout=120)
    if missing := [v for v in VERBS if f"  {v} " not in top]:
        raise Failed(f"raycl --help: no verb {missing} in:\n{top}")
    tune = run("raycl tune --help", [raycl, "tune", "--help"], cwd=work, env=env, timeout=300)
    if missing := [s for s in spaces if s not in tune]:
        raise Failed(f"raycl tune --help: no space {missing} in:\n{tune}")


def short_training(venv: Path, env: dict[str, str], work: Path) -> dict[str, Any]:
    """``raycl train idiom --preset smoke``: one epoch, no Ray, to its JSON summary and report."""
    cmd = [
        str(venv / "bin" / "raycl"),
        "train",
        "idiom",
        "--preset",
        "smoke",
        "--set",
        "scaling.num_workers=0",
        "--set",
        "optim.epochs=1",
        "--out",
        str(work / "run"),
        "--json",
    ]
    summary = json.loads(run("raycl train idiom --preset smoke", cmd, cwd=work, env=env, timeout=900))
    if not (work / "run" / "report.md").is_file() or not summary.get("best"):
        raise Failed(f"raycl train: no report.md or no best result in {work / 'run'}: {summary}")
    return {name: best.get("test_f1") for name, best in summary["best"].items()}


def check_extras(venv: Path, wheel: Path, env: dict[str, str], work: Path) -> None:
    """Each extra but dev resolves on its own beside the installed wheel (pip's resolver, nothing installed)."""
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--dry-run"]
    for extra in RESOLVED:
        run(f"extra {extra}", [*pip, f"{wheel}[{extra}]"], cwd=work, env=env, timeout=600)


def check(wheel: Path, torch: str, *, extras: bool, keep: bool) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="raycl-dist-")).resolve()
    if tmp.is_relative_to(ROOT):
        raise Failed(f"setup: the temporary folder {tmp} lies inside the checkout")
    venv, work, env, seconds = tmp / "venv", tmp / "work", clean_env(), {}
    work.mkdir()

    def timed(step: str, fn: Any, *args: Any) -> Any:
        t = time.perf_counter()
        out = fn(*args)
        seconds[step] = round(time.perf_counter() - t, 1)
        return out

    try:
        timed("install", install, venv, wheel, torch, env, work)
        spaces = timed("spaces", check_spaces, venv, env, work)
        timed("command", check_command, venv, env, work, sorted(spaces))
        scores = timed("training", short_training, venv, env, work)
        if extras:
            timed("extras", check_extras, venv, wheel, env, work)
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return {
        "wheel": wheel.name,
        "spaces": spaces,
        "training_test_f1": scores,
        "extras_resolved": list(RESOLVED) if extras else [],
        "seconds": seconds,
        "kept": str(tmp) if keep else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("wheel", type=Path, help="the built wheel (dist/raycl-*.whl)")
    p.add_argument("--torch", default="torch==2.13.0", help="what to install first (default torch==2.13.0)")
    p.add_argument("--no-extras", dest="extras", action="store_false", help="skip resolving each extra")
    p.add_argument("--keep", action="store_true", help="keep the environment and the run (its path is printed)")
    args = p.parse_args(argv)
    try:
        summary = check(args.wheel.resolve(), args.torch, extras=args.extras, keep=args.keep)
    except Failed as err:
        print(f"dist check failed: {err}", file=sys.stderr)
        return 1
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
