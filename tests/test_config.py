"""Config: YAML spaces, presets, typed --set overrides, and one-line errors naming the file or key."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from raycl.config import dump_yaml, expand_values, from_dict, get_dotted, parse_set, set_dotted, to_dict
from raycl.config.tasks import load_space
from raycl.config.tasks.gec import GecConfig
from raycl.distributed.sweep import to_param_space
from raycl.errors import UserError


def test_paper_spaces_carry_the_papers_settings() -> None:
    pd, bart = load_space("gec_pd"), load_space("gec_bart")
    assert (pd.config.loss.margin, bart.config.loss.margin) == (0.25, 0.85)
    assert pd.config.loss.trade_off == bart.config.loss.trade_off == 0.5
    assert pd.config.mining.k == bart.config.mining.k == 3
    assert (pd.config.eval.beam, bart.config.eval.beam) == (5, 1)  # GEC-BART decodes greedily (released scripts)
    assert pd.config.optim.betas == [0.9, 0.98] and bart.config.optim.betas == [0.9, 0.999]
    assert pd.search["mining.k"] == {"grid": [2, 3, 4]}


def test_paper_grid_is_gamma_010_to_100_step_005() -> None:
    values = expand_values("qrange", [0.10, 1.00, 0.05])
    assert len(values) == 19 and values[0] == 0.1 and values[-1] == 1.0 and 0.25 in values and 0.85 in values
    space = to_param_space(load_space("gec_pd").search)
    assert space["loss.margin"]["grid_search"] == values


def test_preset_search_replaces_the_grid_and_sections_merge() -> None:
    s = load_space("gec_pd", preset="smoke")
    assert s.config.model.preset == "smoke" and s.config.optim.betas == [0.9, 0.98]
    assert set(s.search) == {"loss.margin", "mining.k"} and s.search["mining.k"] == {"grid": [3]}


def test_typed_overrides_and_file_specs_with_brackets() -> None:
    s = load_space(
        "gec_pd",
        overrides=[
            "loss.margin=0.3",
            "mining.k=2",
            "scaling.use_gpu=false",
            "model.name=null",
            "data.finetune=[CWEB-S.dev.m2[1000:], CWEB-G.dev.m2[1000:]]",
            "data.dev.cweb=CWEB-S.dev.m2[:1000]",
        ],
    )
    c = s.config
    assert c.loss.margin == 0.3 and isinstance(c.loss.margin, float) and c.mining.k == 2
    assert c.scaling.use_gpu is False and c.model.name is None
    assert c.data.finetune == ["CWEB-S.dev.m2[1000:]", "CWEB-G.dev.m2[1000:]"]
    assert c.data.dev == {"cweb": ["CWEB-S.dev.m2[:1000]"]}


def test_round_trip_through_dict() -> None:
    c = load_space("gec_bart", preset="smoke").config
    assert from_dict(GecConfig, to_dict(c)) == c


def test_a_dict_with_an_unknown_key_is_refused_naming_it_from_the_top() -> None:
    data = to_dict(GecConfig())
    data["margn"] = 1
    with pytest.raises(UserError) as top:
        from_dict(GecConfig, data)
    assert str(top.value).startswith("config: unknown config key 'margn' (known here: data, eval, loss,")
    data = to_dict(GecConfig())
    data["loss"]["margn"] = 1
    with pytest.raises(UserError) as inner:
        from_dict(GecConfig, data)
    assert str(inner.value) == (
        "config: unknown config key 'loss.margn' (known here: label_smoothing, margin, passes, trade_off)"
    )


def test_a_dotted_key_reads_through_sections_and_mappings() -> None:
    c = load_space("gec_pd", preset="smoke").config
    assert get_dotted(c, "loss.margin") == c.loss.margin
    assert get_dotted(c, "mining") is c.mining
    c = dataclasses.replace(c, data=dataclasses.replace(c.data, dev={"cweb": ["CWEB-S.dev.m2"]}))
    assert get_dotted(c, "data.dev.cweb") == ["CWEB-S.dev.m2"]  # a mapping's key


def test_the_written_config_reads_back_as_the_config_with_its_password_hidden(tmp_path: Path) -> None:
    c = load_space("gec_pd", preset="smoke").config
    c = set_dotted(c, {"mining.negatives": "s3://key:hunter22@bucket/negatives.parquet"}, where="test")
    path = tmp_path / "config.yaml"
    dump_yaml(c, path)
    read = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert read["mining"]["negatives"] == "s3://key:***@bucket/negatives.parquet" and "hunter22" not in str(read)
    read["mining"]["negatives"] = c.mining.negatives
    assert from_dict(GecConfig, read) == c and list(read) == list(to_dict(c))  # every key, in the config's order


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("loss.margn=1", "unknown config key 'loss.margn'"),
        ("loss.margin=abc", "'loss.margin': expected a number"),
        ("loss.trade_off=1.5", "'loss.trade_off': expected a number in [0, 1]"),
        ("mining.beam=3", "'mining.beam': expected ≥ mining.k + 1 = 4"),
        ("optim.epochs=two", "'optim.epochs': expected an integer"),
        ("nonsense", "expected KEY=VALUE"),
    ],
)
def test_bad_overrides_name_the_key(override: str, needle: str) -> None:
    with pytest.raises(UserError, match=None) as err:
        load_space("gec_pd", overrides=[override])
    assert needle in str(err.value) and "\n" not in str(err.value)


def _space(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("task: gec\nloss: {margin: -1}\n", "'loss.margin': expected a number ≥ 0"),
        ("task: gec\nlos: {margin: 1}\n", "unknown config key 'los'"),
        ("task: gec\nsearch:\n  loss.margin: {qrange: [1.0, 0.1, 0.05]}\n", "'qrange' expects [start, stop"),
        ("task: gec\nsearch:\n  loss.margin: {grid: [0.1, abc]}\n", "'loss.margin': expected a number"),
        ("task: gec\nsearch:\n  loss.margni: {grid: [0.1]}\n", "unknown config key 'loss.margni'"),
        ("task: gec\nsearch:\n  mining.k: {sample: [1, 2]}\n", "expected one of {grid"),
        ("task: gec\nsearch:\n  mining.k: {grid: [4, 5]}\n", "'mining.beam': expected ≥ mining.k + 1"),
        ("task: gec\nbaselines:\n  nll: {loss.trade_of: 0}\n", "unknown config key 'loss.trade_of'"),
        ("task: gec\nloss: [1, 2\n", "space.yaml:3: invalid YAML"),
        ("task: nope\n", "'task': expected one of gec"),
    ],
)
def test_bad_space_files_name_file_and_key(tmp_path: Path, text: str, needle: str) -> None:
    path = _space(tmp_path, text)
    with pytest.raises(UserError) as err:
        load_space(str(path))
    assert str(path) in str(err.value) and needle in str(err.value)


def test_set_dotted_validates_tune_points() -> None:
    c = load_space("gec_pd").config
    assert set_dotted(c, {"loss.margin": 0.5}, where="trial").loss.margin == 0.5
    with pytest.raises(UserError, match="mining.beam"):
        set_dotted(c, {"mining.k": 7}, where="trial")


def test_parse_set_keeps_raw_strings() -> None:
    assert parse_set(["a.b=[x.m2[1:2]]", "c= 3 "]) == {"a.b": "[x.m2[1:2]]", "c": "3"}


def test_cli_bad_space_value_exits_2_with_one_line(tmp_path: Path) -> None:
    path = _space(tmp_path, "task: gec\nsearch:\n  loss.margin: {grid: [0.1, high]}\n")
    proc = subprocess.run([sys.executable, "-m", "raycl.tune", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert str(path) in proc.stderr and "loss.margin" in proc.stderr


def test_a_space_without_a_task_is_a_gec_space_and_keeps_its_preset(tmp_path: Path) -> None:
    space = load_space(str(_space(tmp_path, "loss: {margin: 0.3}\n")))
    assert type(space.config).__name__ == "GecConfig" and space.config.loss.margin == 0.3
    assert load_space("gec_pd", preset="smoke").preset == "smoke"


def test_a_task_that_is_not_a_name_is_one_line_listing_every_task(tmp_path: Path) -> None:
    path = _space(tmp_path, "task: [gec]\n")  # a list: not a name, and not hashable either
    with pytest.raises(UserError) as err:
        load_space(str(path))
    assert str(err.value) == f"{path}: config key 'task': expected one of gec, coherence, idiom, sts, got ['gec']"


def test_space_names_are_the_yaml_files_of_the_spaces_folder(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    from raycl.config import spaces

    monkeypatch.setattr(spaces, "spaces_dir", lambda: tmp_path / "missing")
    assert spaces.space_names() == []  # an install without its spaces lists none
    for name in ("zeta.yaml", "alpha.yaml", "notes.txt", "beta.yml.bak"):
        (tmp_path / name).write_text("task: gec\n", encoding="utf-8")
    (tmp_path / "folder.yaml").mkdir()
    monkeypatch.setattr(spaces, "spaces_dir", lambda: tmp_path)
    assert spaces.space_names() == ["alpha", "zeta"]


def test_command_line_values_are_read_as_their_keys_annotation() -> None:
    from raycl.config import keys

    assert parse_set(["data.train=a=b.m2", " loss.margin = 0.3 "]) == {
        "data.train": "a=b.m2",
        "loss.margin": "0.3",
    }
    assert keys._split_top("[a.m2[1000:], b.m2[:5], 'c.m2']") == ["a.m2[1000:]", "b.m2[:5]", "c.m2"]
    assert keys._split_top("a.m2[1:2],b.m2") == ["a.m2[1:2]", "b.m2"]
    assert keys._split_top("x[1,2],y") == ["x[1,2]", "y"]  # a comma inside brackets does not split
    for null in ("null", "None", "~"):
        assert keys._parse_raw(null, float | None) is None  # an optional key's null
    assert keys._parse_raw("none", str) == "none"  # a string key keeps the word
    assert keys._parse_raw("1e-5", float) == 1e-05 and isinstance(keys._parse_raw("1e3", float), float)
    assert keys._parse_raw("1e3", int) == 1000 and type(keys._parse_raw("1e3", int)) is int
    assert keys._parse_raw("1.5e0", int) == 1.5  # not integral: the bound refuses it as a number
    assert keys._number("9" * (keys.MAX_YAML_INT + 1), float) == "9" * (keys.MAX_YAML_INT + 1)  # too long to read
    assert keys._number("abc", float) == "abc"
