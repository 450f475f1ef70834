"""Config keys (raycl/config/keys.py): each annotation's value checked with the one-line message that names the
file, the key and what was expected; command-line values read as their key's annotation; dotted keys found through
sections and mappings; sections merged key by key."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from raycl.config import get_dotted, parse_set, set_dotted
from raycl.config.bounded_yaml import MAX_YAML_INT
from raycl.config.keys import _parse_raw, coerce, merge
from raycl.config.tasks.gec import GecConfig, GecLossSection
from raycl.config.tasks.sts import StsConfig
from raycl.errors import UserError

WHERE = "space.yaml"


@pytest.mark.parametrize(
    ("tp", "key", "value", "message"),
    [
        (bool, "scaling.use_gpu", "yes", "expected true/false, got 'yes'"),
        (int, "mining.k", 2.5, "expected an integer, got 2.5"),
        (int, "mining.k", True, "expected an integer, got True"),
        (float, "loss.margin", "abc", "expected a number, got 'abc'"),
        (float, "loss.margin", False, "expected a number, got False"),
        (str, "model.preset", ["smoke"], "expected a string, got ['smoke']"),
        (str, "model.preset", True, "expected a string, got True"),
        (float | None, "mining.relative_margin", "abc", "expected a number, got 'abc'"),  # as a number
        (str | None, "model.name", {"a": 1}, "expected a string, got {'a': 1}"),
        (list[float | None], "k", "x", "expected a list of a number (or null), got 'x'"),
        (list[int | str | None], "k", 3, "expected a list of an integer or a string (or null), got 3"),
        (list[float], "optim.betas", "0.9", "expected a list of a number, got '0.9'"),
        (list[str], "data.train", {"a": 1}, "expected a list of a string, got {'a': 1}"),
        (dict[str, float], "scaling.resources", [1.0], "expected a mapping of name -> a number, got [1.0]"),
        (dict[str, list[str]], "data.dev", "a.m2", "expected a mapping of name -> a list of a string, got 'a.m2'"),
        (GecLossSection, "loss", 3, "expected GecLossSection, got 3"),  # a section given a value
        (list["Section"], "data.sections", 3, "expected a list of Section, got 3"),  # noqa: F821 (left a string)
    ],
)
def test_a_value_of_the_wrong_type_names_file_key_and_what_was_expected(
    tp: Any, key: str, value: Any, message: str
) -> None:
    with pytest.raises(UserError) as err:
        coerce(value, tp, key, WHERE)
    assert str(err.value) == f"{WHERE}: config key '{key}': {message}"


@pytest.mark.parametrize(
    ("tp", "key", "value", "message"),
    [
        (list[float], "optim.betas", [0.9, "x"], "config key 'optim.betas': expected a number, got 'x'"),
        (
            dict[str, float],
            "scaling.resources",
            {"GPU": "x"},
            "config key 'scaling.resources.GPU': expected a number",
        ),
        (float | None, "mining.relative_margin", [0.1], "config key 'mining.relative_margin': expected a number"),
    ],
)
def test_an_item_of_a_list_or_mapping_is_checked_under_its_key(
    tp: Any, key: str, value: Any, message: str
) -> None:
    with pytest.raises(UserError) as err:
        coerce(value, tp, key, WHERE)
    assert str(err.value).startswith(f"{WHERE}: {message}")


@pytest.mark.parametrize(
    ("tp", "value", "expected"),
    [
        (float, 1, 1.0),  # an integer for a number key
        (str, 3, "3"),  # a YAML number for a string key (a preset named 3)
        (str, 0.5, "0.5"),
        (float | None, None, None),
        (float | None, 2, 2.0),
        (list[str], "a.m2", ["a.m2"]),  # a lone string for a list of strings
        (list[float], [1, 0.5], [1.0, 0.5]),
        (dict[str, float], {1: 2}, {"1": 2.0}),  # a mapping's names are strings
        (dict[str, list[str]], {"cweb": "a.m2"}, {"cweb": ["a.m2"]}),
    ],
)
def test_a_value_is_converted_to_its_annotation(tp: Any, value: Any, expected: Any) -> None:
    assert repr(coerce(value, tp, "k", WHERE)) == repr(expected)  # 1.0 is not 1, "3" is not 3


@pytest.mark.parametrize(
    ("raw", "tp", "expected"),
    [
        ("~", str | None, None),  # an optional string key's null word
        ("null", str | None, None),
        ("true", str | None, "true"),  # a string key keeps a YAML word
        ("1e-2", float | None, 0.01),  # an optional number read as a number (YAML 1.1 reads 1e-2 as a string)
        ("a.m2, b.m2", list[str] | None, ["a.m2", "b.m2"]),
        ("[a.m2[1000:], 'b.m2']", list[str], ["a.m2[1000:]", "b.m2"]),
        ("[X-dev.m2, 'b.m2X']", list[str], ["X-dev.m2", "b.m2X"]),  # only quotes are stripped from the ends
        ("1" + "0" * (MAX_YAML_INT - 4) + "e-5", float, float(f"1e{MAX_YAML_INT - 9}")),  # as long as may be read
    ],
)
def test_a_command_line_value_is_read_as_its_key_annotation(raw: str, tp: Any, expected: Any) -> None:
    assert repr(_parse_raw(raw, tp)) == repr(expected)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.dev.cweb.extra=x"], "--set: unknown config key 'data.dev.cweb.extra'"),  # past a mapping's value
        (
            ["loss.margn.deep=1"],
            "--set: unknown config key 'loss.margn' (known here: label_smoothing, margin, passes, trade_off)",
        ),
        (["nonsense"], "--set 'nonsense': expected KEY=VALUE with a dotted key, e.g. loss.margin=0.3"),
        ([" =3"], "--set ' =3': expected KEY=VALUE with a dotted key, e.g. loss.margin=0.3"),
    ],
)
def test_a_bad_set_names_the_key_up_to_where_it_went_wrong(overrides: list[str], message: str) -> None:
    with pytest.raises(UserError) as err:
        set_dotted(GecConfig(), parse_set(overrides), where="--set", raw=True)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("cls", "key", "raw", "expected"),
    [
        (GecConfig, "data.dev.cweb", "a.m2, b.m2", ["a.m2", "b.m2"]),  # a mapping's value: a list of files
        (GecConfig, "model.overrides.d_model", "8", 8),  # a mapping of anything: YAML's reading
        (StsConfig, "mining.relative_margin", "1e-2", 0.01),
    ],
)
def test_a_set_reads_the_value_as_the_annotation_found_through_the_dotted_key(
    cls: type, key: str, raw: str, expected: Any
) -> None:
    assert repr(get_dotted(set_dotted(cls(), {key: raw}, where="--set", raw=True), key)) == repr(expected)


@pytest.mark.parametrize(
    ("base", "over", "merged"),
    [
        (
            {"loss": {"margin": 0.1, "trade_off": 0.5}},
            {"loss": {"margin": 0.3}},
            {"loss": {"margin": 0.3, "trade_off": 0.5}},
        ),
        ({"a": {"b": {"c": 1, "d": 2}}}, {"a": {"b": {"d": 3}}}, {"a": {"b": {"c": 1, "d": 3}}}),
        ({"a": {"b": 1}}, {"a": 3}, {"a": 3}),  # a value replaces a section
        ({"a": 3}, {"a": {"b": 1}}, {"a": {"b": 1}}),  # a section replaces a value
        ({"a": [1, 2]}, {"a": [3]}, {"a": [3]}),  # lists are replaced, not extended
        ({"a": 1}, {"b": 2}, {"a": 1, "b": 2}),
    ],
)
def test_merge_overrides_key_by_key_through_sections(base: dict, over: dict, merged: dict) -> None:
    before = copy.deepcopy(base)
    assert merge(base, over) == merged and base == before


def test_a_merge_shares_nothing_with_its_base() -> None:
    base = {"model": {"preset": "smoke"}, "optim": {"betas": [0.9, 0.98]}}
    out = merge(base, {"loss": {"margin": 0.3}})
    out["model"]["preset"] = "small"
    out["optim"]["betas"].append(0.5)
    assert base == {"model": {"preset": "smoke"}, "optim": {"betas": [0.9, 0.98]}}
