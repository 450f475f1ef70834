"""Tune space files (raycl/config/spaces.py): a name found in this raycl's spaces folder or a path taken as given,
read as UTF-8 whatever the locale, a preset merged in, and every mistake one line naming the file."""

from __future__ import annotations

import importlib.resources
import locale
from pathlib import Path

import pytest

import raycl
from raycl.config import read_space, resolve_space_path, spaces
from raycl.config.tasks import load_space
from raycl.errors import UserError

PRESETS = """task: gec
loss: {margin: 0.25, trade_off: 0.5}
search:
  loss.margin: {grid: [0.1, 0.2]}
baselines:
  nll: {loss.trade_off: 0.0}
presets:
  wide:
    loss: {margin: 0.3}
    search:
      mining.k: {grid: [2]}
  plain: {}
"""


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A spaces folder of two spaces (``alpha``, ``zeta``) in place of this raycl's."""
    root = tmp_path / "spaces"
    root.mkdir()
    for name in ("zeta", "alpha"):
        (root / f"{name}.yaml").write_text("task: gec\n", encoding="utf-8")
    (tmp_path / "outside.yaml").write_text("task: gec\n", encoding="utf-8")
    monkeypatch.setattr(spaces, "spaces_dir", lambda: root)
    return root


def test_a_name_is_the_space_of_that_name_in_the_spaces_folder(folder: Path) -> None:
    assert resolve_space_path("alpha") == folder / "alpha.yaml"


@pytest.mark.parametrize("name", ["alpha.yml", "alpha.yaml"])
def test_a_path_to_a_yaml_file_is_taken_as_given(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text("task: gec\nloss: {margin: 0.4}\n", encoding="utf-8")
    space = load_space(str(path))
    assert resolve_space_path(str(path)) == path and space.config.loss.margin == 0.4
    assert (space.name, space.source) == ("alpha", str(path))


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ("nope", "unknown tune space 'nope' (known: alpha, zeta; or give a path to a .yaml file)"),
        ("../outside", "unknown tune space '../outside' (known: alpha, zeta; or give a path to a .yaml file)"),
        ("missing.yaml", "missing.yaml: no such tune space file"),
    ],
)
def test_an_unknown_space_lists_the_known_ones(folder: Path, space: str, message: str) -> None:
    with pytest.raises(UserError) as err:
        resolve_space_path(space)
    assert str(err.value) == message


def test_an_empty_spaces_folder_knows_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spaces, "spaces_dir", lambda: tmp_path)
    with pytest.raises(UserError) as err:
        resolve_space_path("gec_pd")
    assert str(err.value) == "unknown tune space 'gec_pd' (known: none; or give a path to a .yaml file)"


@pytest.mark.parametrize("wheel", [True, False])
def test_the_spaces_folder_is_the_packaged_one_else_the_checkouts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wheel: bool
) -> None:
    """A wheel puts the spaces in ``raycl/tune_spaces/``; a checkout has them beside the package."""
    site = tmp_path / "site"  # the installed package's folder, as importlib.resources finds it
    if wheel:
        (site / "raycl" / "tune_spaces").mkdir(parents=True)
    monkeypatch.setattr(importlib.resources, "files", lambda package: site / package)
    checkout = Path(raycl.__file__).resolve().parent.parent / "tune_spaces"
    found = spaces.spaces_dir()
    assert found == (site / "raycl" / "tune_spaces" if wheel else checkout) and found.is_dir()
    if not wheel:
        assert (Path(str(found)) / "gec_pd.yaml").is_file()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"- 1\n- 2\n", ": expected a mapping of config sections at the top level"),
        (b"task: gec\nname: \xff\n", ": cannot read tune space (UnicodeDecodeError)"),
        (b"task: gec\nloss: [1, 2\n", ":3: invalid YAML (expected ',' or ']', but got '<stream end>')"),
        (  # a reader error has no line: its position, on one line
            b'task: gec\nx: "a\x07"\n',
            ': invalid YAML (unacceptable character #x0007: special characters are not allowed in "<unicode '
            'string>", position 15)',
        ),
    ],
)
def test_a_bad_space_file_is_one_line_naming_it(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "space.yaml"
    path.write_bytes(content)
    with pytest.raises(UserError) as err:
        read_space(str(path))
    assert str(err.value) == f"{path}{message}"


def test_a_folder_named_like_a_space_file_cannot_be_read(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.mkdir()
    with pytest.raises(UserError) as err:
        read_space(str(path))
    assert str(err.value) == f"{path}: cannot read tune space (IsADirectoryError)"


def test_a_space_file_is_read_as_utf8_under_an_ascii_locale(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text("task: gec\nmodel: {name: 'γ-model'}  # γ ∈ [0.1, 1]\n", encoding="utf-8")
    old = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")  # a server without a UTF-8 locale: the default encoding is ASCII
    try:
        _, raw, _, _ = read_space(str(path))
    finally:
        locale.setlocale(locale.LC_CTYPE, old)
    assert raw == {"task": "gec", "model": {"name": "γ-model"}}


@pytest.mark.parametrize(
    ("preset", "loss", "search"),
    [
        (None, {"margin": 0.25, "trade_off": 0.5}, {"loss.margin": {"grid": [0.1, 0.2]}}),
        ("plain", {"margin": 0.25, "trade_off": 0.5}, {"loss.margin": {"grid": [0.1, 0.2]}}),
        ("wide", {"margin": 0.3, "trade_off": 0.5}, {"mining.k": {"grid": [2]}}),  # its search replaces the grid
    ],
)
def test_a_preset_merges_into_the_sections_and_replaces_the_search(
    tmp_path: Path, preset: str | None, loss: dict, search: dict
) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(PRESETS, encoding="utf-8")
    found, raw, got_search, baselines = read_space(str(path), preset=preset)
    assert found == path and raw == {"task": "gec", "loss": loss}
    assert got_search == search and baselines == {"nll": {"loss.trade_off": 0.0}}


@pytest.mark.parametrize(
    ("text", "has"),
    [(PRESETS, "wide, plain"), ("task: gec\n", "none"), ("task: gec\npresets:\n", "none")],
)
def test_an_unknown_preset_lists_the_spaces_presets(tmp_path: Path, text: str, has: str) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError) as err:
        read_space(str(path), preset="nope")
    assert str(err.value) == f"{path}: unknown preset 'nope' (this space has: {has})"
