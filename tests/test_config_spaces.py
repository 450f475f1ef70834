"""Tune space files (raycl/config/spaces.py): a name found in this raycl's spaces folder or a path taken as given,
read as UTF-8 whatever the locale, a preset merged in, and every mistake one line naming the file."""

from __future__ import annotations

import importlib.resources
import locale
from pathlib import Path

import pytest

import raycl
from raycl.config import expand_values, read_space, resolve_space_path, search, search_count, spaces
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


# ------------------------------------------------------------------------------------- search: and baselines:
def _written(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _loaded(tmp_path: Path, text: str) -> str:
    """What loading the space ``text`` says: its one-line refusal, the space file's path written as ``{path}``."""
    path = _written(tmp_path, text)
    with pytest.raises(UserError) as err:
        load_space(str(path))
    assert "\n" not in str(err.value)
    return str(err.value).replace(str(path), "{path}")


KINDS = "expected one of {grid, choice, uniform, loguniform, qrange: [...]}"
QRANGE = "'qrange' expects [start, stop, step>0] of finite numbers"


@pytest.mark.parametrize(
    ("search", "message"),
    [
        ("search: [1]", "{path}: 'search' must map dotted config keys to {kind: values}"),
        ("search: {loss.margin: 0.3}", f"{{path}}: search key 'loss.margin': {KINDS}, got 0.3"),
        (
            "search: {loss.margin: {grid: [0.1], choice: [0.2]}}",
            f"{{path}}: search key 'loss.margin': {KINDS}, got {{'choice': [0.2], 'grid': [0.1]}}",
        ),
        (
            "search: {loss.margin: {sample: [0.1]}}",
            f"{{path}}: search key 'loss.margin': {KINDS}, got {{'sample': [0.1]}}",
        ),
        (
            "search: {loss.margin: {grid: []}}",
            "{path}: search key 'loss.margin': 'grid' expects a non-empty list, got []",
        ),
        (
            "search: {loss.margin: {choice: 0.3}}",
            "{path}: search key 'loss.margin': 'choice' expects a non-empty list, got 0.3",
        ),
        (
            "search: {loss.margin: {uniform: [0.1]}}",
            "{path}: search key 'loss.margin': 'uniform' expects [low, high], got [0.1]",
        ),
        (
            "search: {loss.margin: {uniform: [0.1, 0.2, 0.3]}}",
            "{path}: search key 'loss.margin': 'uniform' expects [low, high], got [0.1, 0.2, 0.3]",
        ),
        (
            "search: {loss.margin: {uniform: [0.1, abc]}}",
            "{path}: search key 'loss.margin': 'uniform' expects [low, high], got [0.1, 'abc']",
        ),
        (  # a YAML boolean is no bound
            "search: {loss.margin: {loguniform: [true, 1.0]}}",
            "{path}: search key 'loss.margin': 'loguniform' expects [low, high], got [True, 1.0]",
        ),
        (
            "search: {loss.margin: {loguniform: [0, 1.0]}}",
            "{path}: search key 'loss.margin': 'loguniform' bounds must be > 0, got [0, 1.0]",
        ),
        (  # the lower of the two, wherever it is written
            "search: {loss.margin: {loguniform: [1.0, 0]}}",
            "{path}: search key 'loss.margin': 'loguniform' bounds must be > 0, got [1.0, 0]",
        ),
        (
            "search: {loss.margin: {qrange: [0.1, 0.5]}}",
            f"{{path}}: search key 'loss.margin': {QRANGE}, got [0.1, 0.5]",
        ),
        (
            "search: {loss.margin: {qrange: [0.1, 0.5, 0]}}",
            f"{{path}}: search key 'loss.margin': {QRANGE}, got [0.1, 0.5, 0]",
        ),
        (
            "search: {loss.margin: {qrange: [0.1, 0.5, -0.1]}}",
            f"{{path}}: search key 'loss.margin': {QRANGE}, got [0.1, 0.5, -0.1]",
        ),
        (
            "search: {loss.margin: {qrange: [0.5, 0.1, 0.1]}}",
            f"{{path}}: search key 'loss.margin': {QRANGE}, got [0.5, 0.1, 0.1]",
        ),
        (
            "search: {loss.margin: {qrange: [0.1, .nan, 0.1]}}",
            f"{{path}}: search key 'loss.margin': {QRANGE}, got [0.1, nan, 0.1]",
        ),
        (
            "search: {loss.margin: {qrange: [0.1, 0.5, true]}}",
            f"{{path}}: search key 'loss.margin': {QRANGE}, got [0.1, 0.5, True]",
        ),
        # each value checked as its key's type, then as a config (the sections' checks), naming the search
        (
            "search: {loss.margin: {grid: [0.1, abc]}}",
            "{path}: search: config key 'loss.margin': expected a number, got 'abc'",
        ),
        (
            "search: {loss.margni: {grid: [0.1]}}",
            "{path}: search: unknown config key 'loss.margni' (known here: label_smoothing, margin, passes, "
            "trade_off)",
        ),
        (
            "search: {mining.k: {grid: [4, 5]}}",
            "{path}: search value for 'mining.k': config key 'mining.beam': expected ≥ mining.k + 1 = 6, got 5",
        ),
        (  # a uniform's bounds too
            "search: {loss.trade_off: {uniform: [0.1, 2.0]}}",
            "{path}: search value for 'loss.trade_off': config key 'loss.trade_off': expected a number in [0, 1], "
            "got 2.0",
        ),
        (  # and every value of a qrange, to its stop
            "search: {loss.trade_off: {qrange: [0.5, 1.5, 0.5]}}",
            "{path}: search value for 'loss.trade_off': config key 'loss.trade_off': expected a number in [0, 1], "
            "got 1.5",
        ),
        ("baselines: [nll]", "{path}: 'baselines' must map a name to dotted overrides"),
        ("baselines: {nll: 3}", "{path}: baseline 'nll': expected a mapping of dotted keys to values"),
        (
            "baselines: {nll: {loss.trade_off: 2}}",
            "{path}: baseline 'nll': config key 'loss.trade_off': expected a number in [0, 1], got 2.0",
        ),
    ],
)
def test_a_bad_search_or_baseline_is_one_line_naming_the_file_and_key(
    tmp_path: Path, search: str, message: str
) -> None:
    assert _loaded(tmp_path, f"task: gec\n{search}\n") == message


def test_a_space_keeps_its_search_and_baselines_as_written(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    text = (
        "task: gec\nsearch:\n  loss.margin: {qrange: [0.1, 0.2, 0.1]}\n  loss.trade_off: {uniform: [0.0, 1.0]}\n"
        "  mining.k: {choice: [1, 2]}\n  optim.lr: {loguniform: [1.0e-5, 1.0e-3]}\n"
        "baselines:\n  nll: {loss.trade_off: 0.0}\n"
    )
    path.write_text(text, encoding="utf-8")
    space = load_space(str(path))
    assert space.search == {
        "loss.margin": {"qrange": [0.1, 0.2, 0.1]},
        "loss.trade_off": {"uniform": [0.0, 1.0]},
        "mining.k": {"choice": [1, 2]},
        "optim.lr": {"loguniform": [1e-5, 1e-3]},
    }
    assert space.baselines == {"nll": {"loss.trade_off": 0.0}}


def test_a_key_of_as_many_values_as_the_cap_passes_and_one_more_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cap lowered to 3 (each value is checked as a whole config, so 1,000 of them take seconds): a grid, a
    choice and a qrange of 3 values pass, of 4 are refused with their count; a uniform is one value a trial."""
    monkeypatch.setattr(search, "MAX_SEARCH_VALUES", 3)
    for spec in ("grid: [0.1, 0.2, 0.3]", "choice: [0.1, 0.2, 0.3]", "qrange: [0.1, 0.3, 0.1]", "uniform: [0, 1]"):
        assert load_space(str(_written(tmp_path, f"task: gec\nsearch:\n  loss.margin: {{{spec}}}\n"))).search
    for kind, values in (
        ("grid", "[0.1, 0.2, 0.3, 0.4]"),
        ("choice", "[0.1, 0.2, 0.3, 0.4]"),
        ("qrange", "[0.1, 0.4, 0.1]"),
    ):
        text = f"task: gec\nsearch:\n  loss.margin: {{{kind}: {values}}}\n"
        assert _loaded(tmp_path, text) == (
            f"{{path}}: search key 'loss.margin': '{kind}' {values} expands to 4 values, expected at most 3"
        )


@pytest.mark.parametrize(("samples", "refused"), [(2, False), (3, True)])
def test_grid_points_times_samples_are_the_trials_counted_against_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, samples: int, refused: bool
) -> None:
    """The cap lowered to 12 trials: a grid of 3 × a qrange of 2 is 6 points, × 2 samples = 12 trials pass, × 3
    are refused; a choice, a uniform and a loguniform key are sampled once a trial (no grid points)."""
    monkeypatch.setattr(search, "MAX_TRIALS", 12)
    text = (
        f"task: gec\ntune: {{num_samples: {samples}}}\nsearch:\n  loss.margin: {{grid: [0.1, 0.2, 0.3]}}\n"
        "  loss.trade_off: {qrange: [0.5, 1.0, 0.5]}\n  mining.k: {choice: [1, 2, 3, 4]}\n"
        "  loss.label_smoothing: {uniform: [0.0, 0.1]}\n  optim.lr: {loguniform: [1.0e-5, 1.0e-3]}\n"
    )
    if refused:
        assert _loaded(tmp_path, text) == (
            "{path}: 'search' expands to 18 trials (6 grid points × tune.num_samples = 3), expected at most 12"
        )
    else:
        assert len(load_space(str(_written(tmp_path, text))).search) == 5


@pytest.mark.parametrize(
    ("values", "expanded"),
    [
        ([0.1, 1.0, 0.05], [round(0.1 + 0.05 * i, 2) for i in range(19)]),  # the paper's γ grid
        ([0.25, 1.0, 0.5], [0.25, 0.75]),  # a stop off the step is not passed: 1.25 > 1.0
        ([0.15, 0.45, 0.1], [0.15, 0.25, 0.35, 0.45]),  # the start's places kept (not 0.1, 0.2, 0.3, 0.5)
        ([0.25, 10.25, 5], [0.25, 5.25, 10.25]),
        ([0.3, 0.3, 0.1], [0.3]),  # start = stop: one value
        ([2, 10, 3], [2, 5, 8]),  # integers stay integers
        ([0, 1, 0.5], [0.0, 0.5, 1.0]),  # a number among them: numbers
    ],
)
def test_a_qrange_counts_and_expands_from_start_by_step_up_to_stop(values: list, expanded: list) -> None:
    got = expand_values("qrange", values)
    assert repr(got) == repr(expanded)  # 2 is not 2.0
    assert search_count("qrange", values) == len(expanded)


@pytest.mark.parametrize(
    ("kind", "values", "count"),
    [
        ("grid", [1, 2, 3], 3),
        ("choice", [0.5, 1.5], 2),
        ("uniform", [0.0, 5.0], 1),
        ("loguniform", [1e-5, 1.0], 1),
    ],
)
def test_a_spec_counts_the_values_a_trial_draws_from(kind: str, values: list, count: int) -> None:
    assert search_count(kind, values) == count
    if kind in ("grid", "choice"):
        assert expand_values(kind, values) == values


@pytest.mark.parametrize(
    ("qrange", "values"),
    [
        ("[0.5, 1.2, 0.5]", [0.5, 1.0]),  # its stop, 1.2, is no value: never checked against trade_off ≤ 1
        ("[0.3, 0.3, 0.1]", [0.3]),  # start = stop: one value
    ],
)
def test_a_qrange_is_checked_value_by_value(tmp_path: Path, qrange: str, values: list[float]) -> None:
    path = _written(tmp_path, f"task: gec\nsearch:\n  loss.trade_off: {{qrange: {qrange}}}\n")
    spec = load_space(str(path)).search["loss.trade_off"]
    assert expand_values("qrange", spec["qrange"]) == values
