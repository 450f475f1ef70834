"""SemEval-2022 Task 2 CSV readers/writers, MWE tokens and the built-in set."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from raycl.data import semeval as S
from raycl.data.semeval_corpus import sts_pairs, write_builtin_semeval
from raycl.errors import UserError


@pytest.fixture(scope="module")
def builtin(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_builtin_semeval(tmp_path_factory.mktemp("semeval"), seed=3)


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------ readers
def test_header_must_match_exactly(tmp_path: Path) -> None:
    p = _write(tmp_path / "gold.csv", "ID,DataID,Language,label\n1,dev.EN.1.1,EN,0\n")
    with pytest.raises(UserError, match=rf"^{p}:1: header \['ID', 'DataID', 'Language', 'label'\], expected"):
        S.read_idiom_gold(p)
    with pytest.raises(UserError, match=rf"^{p}:1: header missing"):
        S.read_idiom_gold(_write(p, ""))


def test_field_count_error_names_the_row_start_line(tmp_path: Path) -> None:
    # Row 1 spans two physical lines (a quoted newline), so the bad row starts on line 4.
    text = 'ID,Language,MWE,Previous,Target,Next\n1,EN,big fish,"a\nb",t,n\n2,EN,big fish,p,t\n'
    p = _write(tmp_path / "dev.csv", text)
    with pytest.raises(UserError, match=rf"^{p}:4: 5 fields, expected 6"):
        S.read_idiom_inputs(p)


@pytest.mark.parametrize("label", ["2", "", "idiomatic", "0.0"])
def test_bad_label_names_file_and_line(tmp_path: Path, label: str) -> None:
    p = _write(tmp_path / "gold.csv", f"ID,DataID,Language,Label\n1,d.EN.1.1,EN,1\n2,d.EN.1.2,EN,{label}\n")
    with pytest.raises(UserError, match=rf"^{p}:3: Label '{label}', expected 0"):
        S.read_idiom_gold(p)


def test_train_setting_and_sts_values_are_checked(tmp_path: Path) -> None:
    row = "x,EN,big fish,few_shot,p,t,n,0\n"
    p = _write(tmp_path / "train.csv", ",".join(S.A_TRAIN_HEADER) + "\n" + row)
    with pytest.raises(UserError, match=rf"^{p}:2: Setting 'few_shot'"):
        S.read_idiom_train(p)
    g = _write(tmp_path / "g.csv", ",".join(S.B_GOLD_HEADER) + "\n1,dev.EN.sts.1,EN,1.5,\n")
    with pytest.raises(UserError, match=rf"^{g}:2: sim '1.5', expected a number in \[0, 1\]"):
        S.read_sts_gold(g)
    t = _write(tmp_path / "t.csv", ",".join(S.B_TRAIN_HEADER) + "\nid,m,None,EN,a m,b,None,,\n")
    with pytest.raises(UserError, match=rf"^{t}:2: sim is None, expected alternative_1"):
        S.read_sts_train(t)


def test_model_inputs_and_gold_join() -> None:
    e = S.IdiomExample("7", "EN", "big fish", "Before.", "He is a big fish.", "After.")
    assert e.zero_shot_text() == "Before. He is a big fish. After."
    assert e.one_shot_pair() == ("He is a big fish.", "big fish")
    gold = [S.IdiomGold("7", "dev.EN.1.1", "EN", 0)]
    assert S.with_gold([e], gold)[0].label == 0
    with pytest.raises(UserError, match="IDs differ from the inputs' at row 1"):
        S.with_gold([e], [S.IdiomGold("8", "dev.EN.1.1", "EN", 0)])


# ---------------------------------------------------------------------------------------- MWE token
def test_mwe_token() -> None:
    assert S.mwe_token("Low-hanging fruit") == "IDlowhangingfruitID"
    assert S.mwe_token("big  fish") == "IDbigfishID"
    assert S.mwe_token("pé frio") == "IDpéfrioID"


def test_tokenise_pair_upstream_quirk_and_fixed() -> None:
    s1, s2 = "A Big Fish swam.", "A large fish swam."
    assert S.tokenise_pair(s1, s2, "big fish", None) == ("A IDbigfishID swam.", s2)
    # Upstream: sentence 2 searched with MWE1's pattern, rewritten with MWE2's token.
    up = S.tokenise_pair("a big fish", "a big fish and a large fish", "big fish", "large fish")
    assert up == ("a IDbigfishID", "a IDlargefishID and a large fish")
    fixed = S.tokenise_pair(
        "a big fish", "a big fish and a large fish", "big fish", "large fish", upstream_quirk=False
    )
    assert fixed == ("a IDbigfishID", "a big fish and a IDlargefishID")
    # Upstream uses the MWE as a raw regex; the fixed mode escapes it.
    assert S.tokenise_pair("axb", "", "a.b", None)[0] == "IDa.bID"
    with pytest.raises(ValueError, match="does not occur"):
        S.tokenise_pair("axb", "", "a.b", None, upstream_quirk=False)


def test_missing_mwe_is_a_user_error_naming_the_id() -> None:
    pair = S.StsPair("42", "EN", "big fish", None, "no idiom here", "x")
    with pytest.raises(UserError, match=r"^ID 42: MWE 'big fish' does not occur"):
        pair.tokenised()


# ------------------------------------------------------------------------------------------ writers
def _rows(path: Path) -> list[list[str]]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.reader(f))


def test_submission_writers_layout(tmp_path: Path) -> None:
    rows: list[S.SubmissionRow] = [("5", "EN", 1, 0), ("3", "PT", 0, None)]
    p = S.write_submission_a(tmp_path / "sub.csv", rows)
    assert _rows(p) == [
        list(S.A_SUBMISSION_HEADER),
        ["5", "EN", "zero_shot", "1"],
        ["3", "PT", "zero_shot", "0"],
        ["5", "EN", "one_shot", "0"],
        ["3", "PT", "one_shot", ""],
    ]
    q = S.write_submission_b(tmp_path / "b.csv", [("9", "EN", 0.25, 0.1 + 0.2)])
    assert _rows(q)[1:] == [["9", "EN", "pre_train", "0.25"], ["9", "EN", "fine_tune", repr(0.1 + 0.2)]]
    assert not list(tmp_path.glob(".*.tmp"))


def test_fill_submission_keeps_format_order(tmp_path: Path, builtin: dict[str, Path]) -> None:
    fmt = builtin["a.dev_submission_format"]
    original = _rows(fmt)
    ids = [r[0] for r in original[1:] if r[2] == "one_shot"]
    preds: dict[tuple[str, str], S.Value] = {(i, "one_shot"): k % 2 for k, i in enumerate(ids)}
    out = S.fill_submission(fmt, preds, tmp_path / "filled.csv")
    filled = _rows(out)
    assert [r[:3] for r in filled] == [r[:3] for r in original]
    for r in filled[1:]:
        assert r[3] == ("" if r[2] == "zero_shot" else str(ids.index(r[0]) % 2))
    with pytest.raises(UserError, match=r"1 predictions have no row here, e\.g\. ID 123456 setting one_shot"):
        S.fill_submission(fmt, {("123456", "one_shot"): 1}, tmp_path / "x.csv")
    fmt_b = builtin["b.dev_submission_format"]
    first = _rows(fmt_b)[1]
    out_b = S.fill_submission(fmt_b, {(first[0], first[2]): 0.5}, tmp_path / "b.csv")
    assert _rows(out_b)[0] == list(S.B_SUBMISSION_HEADER) and _rows(out_b)[1][3] == "0.5"


# ------------------------------------------------------------------------------------- built-in set
def test_builtin_subtask_a_like_the_real_data(builtin: dict[str, Path]) -> None:
    zero = S.read_idiom_train(builtin["a.train_zero_shot"])
    one = S.read_idiom_train(builtin["a.train_one_shot"])
    dev = S.with_gold(S.read_idiom_inputs(builtin["a.dev"]), S.read_idiom_gold(builtin["a.dev_gold"]))
    ev = S.with_gold(S.read_idiom_inputs(builtin["a.eval"]), S.read_idiom_gold(builtin["a.eval_gold"]))
    mwes = {name: {e.mwe for e in rows} for name, rows in (("zero", zero), ("one", one), ("dev", dev), ("ev", ev))}
    assert len(mwes["zero"] | mwes["dev"] | mwes["ev"]) >= 20
    assert not mwes["zero"] & mwes["dev"] and not mwes["zero"] & mwes["ev"] and not mwes["dev"] & mwes["ev"]
    assert mwes["one"] == mwes["dev"] | mwes["ev"]
    for rows in (zero, one, dev, ev):
        assert {e.language for e in rows} == {"EN", "PT"} and {e.label for e in rows} == {0, 1}
        assert all(e.mwe.lower() in e.target.lower() for e in rows)
    assert {e.setting for e in zero} == {"zero_shot"} and {e.setting for e in one} == {"one_shot"}
    fmt = _rows(builtin["a.dev_submission_format"])[1:]
    assert [r[0] for r in fmt] == [e.id for e in dev] * 2
    assert [r[2] for r in fmt] == ["zero_shot"] * len(dev) + ["one_shot"] * len(dev)


def test_builtin_subtask_b_like_the_real_data(builtin: dict[str, Path]) -> None:
    train = S.read_sts_train(builtin["b.train_data"])
    assert {p.sim for p in train} == {1.0, None} and all(p.mwe2 is None for p in train)
    dev = S.read_sts_inputs(builtin["b.dev"])
    gold = S.read_sts_gold(builtin["b.dev_gold"])
    by_id = {p.id: p for p in dev}
    gold_ids = {g.id for g in gold}
    assert gold_ids < set(by_id) and len(by_id) == len(dev)
    borrowed = [g for g in gold if g.sim is None]
    assert borrowed and all(g.other_id in by_id and g.other_id not in gold_ids for g in borrowed)
    assert all(by_id[g.other_id or ""].mwe1 is None for g in borrowed)
    sts = [g for g in gold if g.is_sts]
    assert sts and all(g.sim is not None and 0 <= g.sim <= 1 for g in sts)
    assert {g.language for g in sts} == {"EN", "PT"}
    for p in train + dev:
        assert p.tokenised()[0] != p.sentence1 or p.mwe1 is None
        assert p.tokenised(upstream_quirk=False) == p.tokenised()  # no regex characters, MWE2 always None
    pretrain = S.read_sts_pretrain(builtin["b.sts_pretrain"])
    assert {p.split for p in pretrain} == {"train", "dev", "test"}
    assert {p.language for p in pretrain} == {"EN", "PT"}


def test_builtin_is_deterministic(tmp_path: Path, builtin: dict[str, Path]) -> None:
    again = write_builtin_semeval(tmp_path / "a", seed=3)
    other = write_builtin_semeval(tmp_path / "b", seed=4)
    assert again.keys() == builtin.keys()
    assert all(again[k].read_bytes() == builtin[k].read_bytes() for k in builtin)
    assert any(other[k].read_bytes() != builtin[k].read_bytes() for k in builtin)


def test_sts_pair_scores() -> None:
    import random

    pairs = sts_pairs(300, language="EN", rng=random.Random(0))
    assert all(0.0 <= score <= 5.0 for _, _, score in pairs)
    assert all(score == 5.0 for a, b, score in pairs if a == b)
    assert len({score for _, _, score in pairs}) > 5  # graded, not binary
