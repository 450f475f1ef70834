"""raycl as a package, not a checkout: the wheel built from this tree, its files alone on the path and the working
folder elsewhere, has every tune space (read from inside the package) and the ``raycl`` command; the command's
verbs are those of ``python -m raycl.<verb>``. ``make dist`` goes further (a fresh environment installs the wheel
and trains); these are the seconds-long checks of ``make test``."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib.metadata import distributions
from pathlib import Path

import pytest

from raycl.config import space_names
from raycl.config.tasks import load_space
from raycl.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
SPACES = sorted(p.stem for p in (ROOT / "tune_spaces").glob("*.yaml"))
VERBS = ("tune", "train", "mine", "eval", "convert")
# what building the wheel reads (MANIFEST.in's sdist, less what the wheel does not need)
BUILD_INPUTS = ("raycl", "tune_spaces", "pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE")

PROBE = """
import sys
from pathlib import Path
import raycl
from raycl.config import space_names, spaces_dir
from raycl.config.tasks import load_space
package = Path(raycl.__file__).resolve().parent
assert package == Path(sys.argv[1]).resolve() / "raycl", package
assert Path(str(spaces_dir())).resolve().is_relative_to(package), spaces_dir()
for name in space_names():
    space = load_space(name, preset="smoke")
    assert Path(space.source).resolve().is_relative_to(package), space.source
print(",".join(space_names()))
"""


def python(args: list[str], *, path: Path | None, cwd: Path) -> subprocess.CompletedProcess[str]:
    """This Python with only ``path`` (or nothing) of raycl's on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"COLUMNS": "200"}
    if path is not None:
        env["PYTHONPATH"] = str(path)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this tree, built without build isolation (the environment's setuptools) from a copy of what
    building reads, so that nothing is written into the checkout."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, src / name)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-w",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = out.glob("raycl-*.whl")
    return built


def test_the_wheel_carries_every_tune_space_and_the_raycl_command(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        entry_points = configparser.ConfigParser()
        entry_points.read_string(
            whl.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
        )
    assert (
        sorted(
            n.removeprefix("raycl/tune_spaces/").removesuffix(".yaml")
            for n in names
            if n.startswith("raycl/tune_spaces/")
        )
        == SPACES
    )
    assert not [n for n in names if n.split("/")[0] not in ("raycl",) and ".dist-info/" not in n]
    assert entry_points["console_scripts"]["raycl"] == "raycl.__main__:main"


def test_from_the_wheels_files_alone_every_space_loads_and_the_command_lists_them(
    wheel: Path, tmp_path: Path
) -> None:
    """The issue's reproduction: ``pip wheel .``, the wheel's files alone on the path, the working folder
    elsewhere — every space was missing (``known: ;``)."""
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    with zipfile.ZipFile(wheel) as whl:
        whl.extractall(site)
    loaded = python(["-c", PROBE, str(site)], path=site, cwd=elsewhere)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert loaded.stdout.strip() == ",".join(SPACES)
    helped = python(["-m", "raycl", "tune", "--help"], path=site, cwd=elsewhere)
    assert helped.returncode == 0, helped.stderr[-3000:]
    assert helped.stdout.startswith("usage: raycl tune ") and all(s in helped.stdout for s in SPACES)


def test_an_unknown_space_is_one_line_naming_the_spaces_there_are() -> None:
    assert space_names() == SPACES
    known = ", ".join(SPACES)
    with pytest.raises(UserError, match=rf"^unknown tune space 'gec' \(known: {known}; or give a path to a"):
        load_space("gec")
    with pytest.raises(UserError, match="unknown tune space '../tune_spaces/idiom'"):
        load_space("../tune_spaces/idiom")  # a name, not a way out of the folder


def test_raycl_lists_its_verbs_and_runs_each_as_python_m_raycl_verb(tmp_path: Path) -> None:
    top = python(["-m", "raycl", "--help"], path=ROOT, cwd=tmp_path)
    assert top.returncode == 0 and top.stdout.startswith("usage: raycl ")
    assert [v for v in VERBS if f"\n  {v} " not in top.stdout] == []
    for verb in VERBS:  # the verb's own parser, under the command's name
        helped = python(["-m", "raycl", verb, "--help"], path=ROOT, cwd=tmp_path)
        assert helped.returncode == 0 and helped.stdout.startswith(f"usage: raycl {verb} "), helped.stderr
    wrong = python(["-m", "raycl", "fit"], path=ROOT, cwd=tmp_path)
    assert wrong.returncode == 2 and "invalid choice: 'fit'" in wrong.stderr
    bad = python(["-m", "raycl", "train", "gec"], path=ROOT, cwd=tmp_path)  # the verb's one-line refusal
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        f"raycl: error: unknown tune space 'gec' (known: {', '.join(SPACES)}; or give a path to a .yaml file)"
    ]


def test_the_installed_raycl_script_is_the_command() -> None:
    """``raycl`` as an install puts it in this Python's scripts folder (``make install``: the editable install)."""
    installed = [d for d in distributions(path=[sysconfig.get_path("purelib")]) if d.metadata["Name"] == "raycl"]
    if not [e for d in installed for e in d.entry_points if (e.group, e.name) == ("console_scripts", "raycl")]:
        pytest.skip("raycl is not installed in this environment, or was installed before it had the command")
    script = Path(sysconfig.get_path("scripts")) / "raycl"
    assert script.is_file(), f"the installed raycl declares the command, but {script} is missing"
    done = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"}
    )
    assert done.returncode == 0 and done.stdout.startswith("usage: raycl ")
    assert [v for v in VERBS if f"\n  {v} " not in done.stdout] == []
