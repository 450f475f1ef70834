"""The units of beam-search mining (raycl.miners.beam_search), each against a naive reference or a hand-made case:
the selection rule at its edges, n-best splitting, the miner's bookkeeping over a scripted engine (what reaches the
engine, where results land), the Parquet records' refusals, the engine and precision a miner is built with, and
published weights. Tiny models built here, no Ray, no download; the whole file runs in seconds."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from test_engine_fallback import patch_cuda13
from torch import nn

from raycl.data.gec import GecExample
from raycl.errors import UserError
from raycl.miners import parquet_input
from raycl.miners.beam_search import (
    BeamSearchMiner,
    build_beam_miner,
    length_chunks,
    load_beam_weights,
    negatives_schema,
    read_negatives_parquet,
    select_from_nbest,
    select_negatives,
    split_nbest,
    write_negatives_parquet,
)
from raycl.miners.false_negatives import FalseNegativeCounts
from raycl.miners.records import MinedNegatives
from raycl.models.ct2_engine import CT2Seq2Seq
from raycl.models.engines import _open_ct2, in_precision
from raycl.models.presets import build_model
from raycl.models.seq2seq import Seq2SeqScorer
from raycl.testing.miners import NULL_BEAM, NullEngine

CUBLAS_WHY = (
    "CTranslate2 cannot load libcublas.so.12 on cuda (CTranslate2's CUDA build needs cuBLAS 12: "
    "pip install nvidia-cublas-cu12)"
)


# ------------------------------------------------------------------------------------------ the selection rule
def _squash(text: str) -> str:
    return " ".join(text.split())


def naive_select(
    nbest: Sequence[str],
    target: str,
    source: str,
    *,
    k: int,
    cl: bool,
    refill: bool = False,
    refs: Sequence[str] = (),
    drop: bool = False,
) -> list[str]:
    """The rule as the docs state it, one step at a time: distinct non-empty outputs in n-best order; the paper
    looks at the first k and drops t there, ``refill`` walks on past t until it holds k; then s (CL) when s ≠ t
    and not chosen. ``drop``: another annotator's correction is never a negative (refill walks on past it too)."""
    t, s = _squash(target), _squash(source)
    refuted = {_squash(r) for r in refs if _squash(r) != t} if drop else set()
    outputs: list[str] = []
    for h in map(_squash, nbest):
        if h and h not in outputs:
            outputs.append(h)
    chosen: list[str] = []
    if refill:
        for h in outputs:
            if len(chosen) == k:
                break
            if h != t and h not in refuted:
                chosen.append(h)
    else:
        chosen = [h for i, h in enumerate(outputs) if i < k and h != t and h not in refuted]
    if cl and s != t and s not in chosen and s not in refuted:
        chosen.append(s)
    return chosen


def naive_counts(chosen: Sequence[str], source: str, target: str, refs: Sequence[str]) -> list[int]:
    """source selected, source refuted, beam selected, beam refuted (of the selection before any drop)."""
    s, t = _squash(source), _squash(target)
    bad = {_squash(r) for r in refs} - {t}
    src = [c for c in chosen if c == s]
    beam = [c for c in chosen if c != s]
    return [len(src), sum(c in bad for c in src), len(beam), sum(c in bad for c in beam)]


@pytest.mark.parametrize(
    ("nbest", "k", "paper", "refilled"),
    [
        (["a", "b", "c"], 3, ["a", "b", "c"], ["a", "b", "c"]),  # exactly k, none the target
        (["a"], 3, ["a"], ["a"]),  # fewer than k
        ([], 2, [], []),  # nothing decoded
        (["a", "b", "c", "d"], 2, ["a", "b"], ["a", "b"]),  # more than k: the first k, in the n-best's order
        (["a", "t", "b", "c"], 2, ["a"], ["a", "b"]),  # t inside the top k: k−1 (the paper) or refilled
        (["a", "b", "t", "c"], 2, ["a", "b"], ["a", "b"]),  # t just past the top k: nothing to drop
        (["t", "a", "b"], 1, [], ["a"]),  # the target best: none left of k = 1 (the paper)
        (["a", " a ", "a  ", "b"], 2, ["a", "b"], ["a", "b"]),  # copies of one text count once
        (["", "a", "", "b"], 2, ["a", "b"], ["a", "b"]),  # empty outputs are never candidates
        ([" t ", "t", "a"], 1, [], ["a"]),  # the target under other spacing, twice: it was the top 1
    ],
)
def test_the_rule_at_its_boundaries(nbest: list[str], k: int, paper: list[str], refilled: list[str]) -> None:
    assert select_negatives(nbest, "t", "s", k=k, source_negative=False) == paper
    assert select_negatives(nbest, "t", "s", k=k, source_negative=False, refill=True) == refilled
    assert select_negatives(nbest, "t", "s", k=k, source_negative=True) == [*paper, "s"]  # the source last
    assert select_negatives(nbest, "t", "s", k=k, source_negative=True, refill=True) == [*refilled, "s"]


def test_the_source_is_added_once_and_never_when_it_is_the_target() -> None:
    assert select_negatives(["s", "a"], "t", "s", k=2, source_negative=True) == ["s", "a"]  # already chosen
    assert select_negatives(["a", "s"], "t", " s ", k=1, source_negative=True) == ["a", "s"]  # past k: appended
    assert select_negatives(["a", "s"], "t", "s", k=1, source_negative=False) == ["a"]  # CL⁻ never adds it
    assert select_negatives(["a", "b"], "same  one", " same one", k=2, source_negative=True) == ["a", "b"]
    assert select_negatives(["s"], "s", "s", k=1, source_negative=True) == []  # s = t is the target: dropped
    assert select_negatives([], "t", "s", k=0, source_negative=True) == ["s"]  # k = 0 under CL: the source only
    assert select_negatives(["a"], "t", "s", k=0, source_negative=False, refill=True) == []


def test_false_negatives_are_counted_before_the_drop_and_refilled_past() -> None:
    refs = ("t", "b", "s")  # annotators: the target's, one who wrote b, one who left the source as it was
    counts = FalseNegativeCounts()
    got = select_negatives(
        ["a", "b", "c", "d"],
        "t",
        "s",
        k=2,
        source_negative=True,
        references=refs,
        false_negatives="drop",
        counts=counts,
    )
    assert got == ["a"] and counts.flat() == [1, 1, 2, 1]  # counted: a, b, s; b and s refuted, then dropped
    got = select_negatives(
        ["a", "b", "c", "d"],
        "t",
        "s",
        k=2,
        source_negative=True,
        refill=True,
        references=refs,
        false_negatives="drop",
    )
    assert got == ["a", "c"]  # b's place goes to c
    kept = select_negatives(["a", "b", "c"], "t", "s", k=2, source_negative=True, references=refs)
    assert kept == ["a", "b", "s"]  # keep (the paper): refuted ones stay
    assert select_negatives(
        ["a", "t"], "t", "s", k=2, source_negative=True, references=("t",), false_negatives="drop"
    ) == ["a", "s"]  # the target's own reference refutes nothing


def test_the_rule_matches_a_naive_reference_on_random_lists() -> None:
    rng = random.Random(0)
    pool = ["a", "b", "c", "d", "e", "t", " t", "s", "s ", "", "a  b", "a b"]
    for _ in range(1500):
        nbest = [rng.choice(pool) for _ in range(rng.randrange(9))]
        target, source = rng.choice(["t", "a", "s"]), rng.choice(["s", "t", "b"])
        refs = tuple(rng.sample(["t", "b", "c", "s", "a b"], rng.randrange(4)))
        k, cl, refill, drop = rng.randrange(5), rng.random() < 0.5, rng.random() < 0.5, rng.random() < 0.5
        counts = FalseNegativeCounts()
        got = select_negatives(
            nbest,
            target,
            source,
            k=k,
            source_negative=cl,
            refill=refill,
            references=refs,
            false_negatives="drop" if drop else "keep",
            counts=counts,
        )
        case = (nbest, target, source, refs, k, cl, refill, drop)
        assert got == naive_select(nbest, target, source, k=k, cl=cl, refill=refill, refs=refs, drop=drop), case
        chosen = naive_select(nbest, target, source, k=k, cl=cl, refill=refill)
        assert counts.flat() == naive_counts(chosen, source, target, refs), case


def test_select_from_nbest_carries_each_negatives_own_score() -> None:
    nbest = MinedNegatives("x:0", ("a", "t", "b", "c", "d"), (-1.0, -2.0, -3.0, -3.0, -4.0))  # b, c: a tie
    ex = GecExample("x:0", "  my   src ", "t", ("t", "c"))
    got = select_from_nbest(nbest, -9.5, ex, k=3, source_negative=True)
    assert got == MinedNegatives("x:0", ("a", "b", "my src"), (-1.0, -3.0, -9.5))  # n-best order, source last
    got = select_from_nbest(nbest, -9.5, ex, k=3, source_negative=False, refill=True)
    assert got == MinedNegatives("x:0", ("a", "b", "c"), (-1.0, -3.0, -3.0))  # the tie kept in beam order
    counts = FalseNegativeCounts()
    got = select_from_nbest(
        nbest, -9.5, ex, k=4, source_negative=True, refill=True, false_negatives="drop", counts=counts
    )
    assert got.negatives == ("a", "b", "d", "my src") and got.scores == (-1.0, -3.0, -4.0, -9.5)
    assert counts.flat() == [1, 0, 4, 1]  # c (another annotator's correction) counted, then dropped
    assert got.false_negatives == ()  # a lone selection carries no counts (the miner's select does)
    inside = MinedNegatives("y", ("a", "s"), (-1.0, -0.5))  # the source decoded too: the beam's score is its own
    assert select_from_nbest(inside, -7.0, GecExample("y", "s", "t"), k=2, source_negative=True).scores == (
        -1.0,
        -0.5,
    )


@pytest.mark.parametrize("n", [0, 1, 3])
def test_split_nbest_takes_the_appended_source_off(n: int) -> None:
    negatives, scores = tuple("abcdef"[:n]), tuple(-float(i) for i in range(n))
    record = MinedNegatives("r", (*negatives, "src"), (*scores, -7.5))
    assert split_nbest(record) == (MinedNegatives("r", negatives, scores), -7.5)


def test_length_chunks_go_shortest_first_and_cut_in_order() -> None:
    texts = ["a b c", "a", "a b", "b", "a b c d e", "c d"]
    for size in (1, 2, 4, 6, 9):
        order = sorted(range(len(texts)), key=lambda i: (len(texts[i].split()), i))  # ties: in input order
        want = [order[lo : lo + size] for lo in range(0, len(order), size)]
        assert list(length_chunks(texts, size)) == want
    assert list(length_chunks([], 3)) == []


# ------------------------------------------------------------------------------ the miner over a scripted engine
class Scripted(nn.Module):
    """A decoding engine whose n-best lists are given per source; it records every call, with the mode and grad
    state it ran in. ``score_texts``: a made-up S that depends on both texts."""

    def __init__(self, hyps: dict[str, list[tuple[str, float]]]) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.hyps = hyps
        self.calls: list[tuple[str, Any]] = []

        self.short = ""  # a broken engine: "generate" or "score" answers one source short

    def generate(self, sources: list[str], **kw: Any) -> list[list[tuple[str, float]]]:
        self.calls.append(("generate", (list(sources), kw, self.training, torch.is_grad_enabled())))
        return [list(self.hyps.get(s, [])) for s in sources][: len(sources) - (self.short == "generate")]

    def score_texts(self, sources: list[str], targets: list[str], **kw: Any) -> list[float]:
        self.calls.append(("score", (list(sources), list(targets), kw, self.training, torch.is_grad_enabled())))
        scores = [-(len(s) + 0.5 * len(t)) for s, t in zip(sources, targets, strict=True)]
        return scores[: len(sources) - (self.short == "score")]


def s_of(source: str, target: str) -> float:
    return -(len(source) + 0.5 * len(target))


EXS = [
    GecExample("e:0", "one two three", "one two tree"),
    GecExample("e:1", "a", "b", ("b", "x")),  # an annotator wrote x
    GecExample("e:2", "same  text", "same text"),  # s = t
    GecExample("e:3", "p q", "p r"),
    GecExample("e:4", "m n o p q", "m n"),
]
HYPS = {
    "one two three": [("w", -1.0), ("", -1.5), ("one two tree", -2.0), ("w", -2.5), ("v", -3.0)],
    "a": [("x", -0.5), ("y", -0.7), ("z", -0.9)],
    "same  text": [("same text", -0.1), ("st", -0.2)],
    "p q": [],
    "m n o p q": [("m", -4.0), ("n", -4.0), ("o", -5.0)],  # a tie in score
}


def test_the_miners_defaults_and_its_refusals() -> None:
    engine = NullEngine()
    m = BeamSearchMiner(engine)  # type: ignore[arg-type]
    assert (m.scorer, m.module, m.k, m.beam, m.source_negative, m.batch_size) == (engine, engine, 3, 4, True, 32)
    assert (m.max_len_a, m.max_len_b, m.precision, m.rank_by) == (0.0, 200, "fp32", "beam")
    assert (m.refill, m.nbest_mode, m.false_negatives, m.searched) == (False, False, "keep", 0)
    assert m.counts.flat() == [0, 0, 0, 0]
    assert (BeamSearchMiner(engine, k=0).beam, BeamSearchMiner(engine, k=2, beam=3).beam) == (1, 3)  # type: ignore
    for kw, msg in (
        ({"rank_by": "score"}, "rank_by must be one of ('beam', 'sum_logprob'), got 'score'"),
        ({"false_negatives": "x"}, "false_negatives must be one of ('keep', 'drop'), got 'x'"),
        ({"k": -1}, "k must be ≥ 0, got -1"),
        ({"k": 2, "beam": 2}, "beam must be ≥ k+1 = 3 (one output may equal the target), got 2"),
    ):
        with pytest.raises(ValueError) as err:
            BeamSearchMiner(engine, **kw)  # type: ignore[arg-type]
        assert str(err.value) == msg
    with pytest.raises(ValueError, match="= 4 .*, got 3$"):  # another k, checked against the beam
        BeamSearchMiner(engine, k=2, beam=3).select([], [], k=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k must be ≥ 0, got -1"):
        BeamSearchMiner(engine, k=2).select([], [], k=-1)  # type: ignore[arg-type]


def test_the_nbest_reaches_the_engine_with_the_miners_options(capfd: pytest.CaptureFixture[str]) -> None:
    engine = Scripted(HYPS).train()
    miner = BeamSearchMiner(
        engine,
        k=2,
        beam=5,
        batch_size=2,
        max_len_a=0.5,
        max_len_b=7,  # type: ignore[arg-type]
        rank_by="sum_logprob",
    )
    got = miner.nbest(EXS)
    # distinct non-empty texts at their first place, each example's at its own index (searched shortest first)
    assert got == [
        MinedNegatives("e:0", ("w", "one two tree", "v"), (-1.0, -2.0, -3.0)),
        MinedNegatives("e:1", ("x", "y", "z"), (-0.5, -0.7, -0.9)),
        MinedNegatives("e:2", ("same text", "st"), (-0.1, -0.2)),
        MinedNegatives("e:3", (), ()),
        MinedNegatives("e:4", ("m", "n", "o"), (-4.0, -4.0, -5.0)),
    ]
    options = dict(
        num_beams=5,
        num_return_sequences=5,
        max_new_tokens=7,
        max_len_a=0.5,
        drop_cut=True,
        batch_size=2,
        rank_by="sum_logprob",
    )
    assert [c[1] for c in engine.calls] == [
        (["a", "same  text"], options, False, False),
        (["p q", "one two three"], options, False, False),
        (["m n o p q"], options, False, False),
    ]
    assert miner.searched == 5 and engine.training  # eval and no grad while decoding, then train mode back
    assert "beam search" not in capfd.readouterr().err
    miner.nbest(EXS[:3], progress=True)
    bar = capfd.readouterr().err
    assert miner.searched == 8 and "3/3" in bar
    assert re.search(r"(?:^|\r)beam search: ", bar) and re.search(r"[\d?]sent/s", bar), bar  # its label and unit


def test_select_scores_the_appended_sources_with_the_same_engine() -> None:
    engine = Scripted(HYPS).train()
    miner = BeamSearchMiner(engine, k=2, beam=4, batch_size=3)  # type: ignore[arg-type]
    nbests = BeamSearchMiner(Scripted(HYPS), k=2, beam=4).nbest(EXS)  # type: ignore[arg-type]
    got = miner.select(nbests, EXS)
    assert [m.negatives for m in got] == [
        ("w", "one two three"),
        ("x", "y", "a"),
        ("st",),
        ("p q",),
        ("m", "n", "m n o p q"),
    ]
    assert got[0].scores == (-1.0, s_of("one two three", "one two three")) and got[4].scores[:2] == (-4.0, -4.0)
    assert got[1].scores == (-0.5, -0.7, s_of("a", "a")) and got[2].scores == (-0.2,)
    # one call for every example's source, in the examples' order, raw sources against normalised ones
    appended = ["one two three", "a", "p q", "m n o p q"]
    assert engine.calls == [("score", (appended, appended, {"batch_size": 3}, False, False))]
    assert engine.training
    assert [m.false_negatives for m in got] == [
        (1, 0, 1, 0),
        (1, 0, 2, 1),
        (0, 0, 1, 0),
        (1, 0, 0, 0),
        (1, 0, 2, 0),
    ]
    assert miner.counts.flat() == [4, 0, 6, 1]  # every selection's, added up ...
    miner.select(nbests[:1], EXS[:1])
    assert miner.counts.flat() == [5, 0, 7, 1]  # ... across calls


def test_select_takes_another_k_and_rule_and_refuses_foreign_records() -> None:
    engine = Scripted(HYPS)
    miner = BeamSearchMiner(engine, k=2, beam=4, refill=True, false_negatives="drop")  # type: ignore[arg-type]
    nbests = miner.nbest(EXS)
    engine.calls.clear()
    got = miner.select(nbests, EXS, k=1, source_negative=False)
    assert [m.negatives for m in got] == [("w",), ("y",), ("st",), (), ("m",)]  # x: another annotator's
    assert engine.calls == []  # no source appended: nothing to score
    got = miner.select(nbests, EXS, k=3)  # the miner's CL
    assert [m.negatives for m in got] == [
        ("w", "v", "one two three"),
        ("y", "z", "a"),
        ("st",),
        ("p q",),
        ("m", "n", "o", "m n o p q"),
    ]
    assert [m.negatives for m in miner.select(nbests, EXS, source_negative=False)][0] == ("w", "v")  # k = 2
    with pytest.raises(AssertionError, match="n-best 'e:1' does not belong to example 'e:0'"):
        miner.select(nbests[1:2], EXS[:1])
    for records, examples in ((nbests[:2], EXS[:3]), (nbests[:3], EXS[:2])):  # one record short, one too many
        with pytest.raises(ValueError):
            miner.select(records, examples)


def test_mine_selects_or_keeps_the_raw_nbest_with_the_source(capfd: pytest.CaptureFixture[str]) -> None:
    engine = Scripted(HYPS)
    got = BeamSearchMiner(engine, k=1, beam=3, batch_size=4).mine(EXS)  # type: ignore[arg-type]
    assert "beam search" not in capfd.readouterr().err  # a miner in an actor draws no progress bar
    assert [m.negatives for m in got] == [("w", "one two three"), ("x", "a"), (), ("p q",), ("m", "m n o p q")]
    engine.calls.clear()
    raw = BeamSearchMiner(engine, k=1, beam=3, batch_size=4, nbest=True).mine(EXS)  # type: ignore[arg-type]
    assert raw[0] == MinedNegatives(
        "e:0",
        ("w", "one two tree", "v", "one two three"),
        (-1.0, -2.0, -3.0, s_of("one two three", "one two three")),
    )
    assert raw[2] == MinedNegatives(
        "e:2", ("same text", "st", "same text"), (-0.1, -0.2, s_of("same  text", "same text"))
    )
    assert [split_nbest(r)[0] for r in raw] == BeamSearchMiner(Scripted(HYPS), k=1).nbest(EXS)  # type: ignore
    sources = [ex.source for ex in EXS]
    assert engine.calls[-1] == ("score", (sources, [_squash(s) for s in sources], {"batch_size": 4}, False, False))


def test_what_does_not_pair_up_is_refused_not_cut() -> None:
    """A record whose scores do not pair with its negatives, or an engine one answer short, is an error: never a
    silently shorter list."""
    bad = MinedNegatives("e:1", ("x", "y"), (-0.5,))
    with pytest.raises(ValueError):
        select_from_nbest(bad, -1.0, EXS[1], k=2, source_negative=False)
    with pytest.raises(ValueError):
        BeamSearchMiner(Scripted(HYPS), k=2).select([bad], EXS[1:2])  # type: ignore[arg-type]
    engine = Scripted(HYPS)
    miner = BeamSearchMiner(engine, k=1, batch_size=8)  # type: ignore[arg-type]
    engine.short = "generate"
    with pytest.raises(ValueError):
        miner.nbest(EXS)
    engine.short = "score"
    good = BeamSearchMiner(Scripted(HYPS), k=1).nbest(EXS)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        miner.select(good, EXS)  # the appended sources' scores
    with pytest.raises(ValueError):
        BeamSearchMiner(engine, k=1, nbest=True)._mine(EXS)  # type: ignore[arg-type]


def test_a_null_engine_decodes_nothing_and_scores_zero() -> None:
    engine = NullEngine()
    assert engine.generate(["a", "b"], num_beams=3) == [[], []] and engine.score_texts(["a", "b"], ["c", "d"]) == [
        0.0,
        0.0,
    ]
    assert not engine.training
    got = BeamSearchMiner(engine, k=2).mine(EXS)  # type: ignore[arg-type]
    assert [(m.negatives, m.scores) for m in got][:3] == [(("one two three",), (0.0,)), (("a",), (0.0,)), ((), ())]


# ------------------------------------------------------------------------------------------------ Parquet records
def test_written_rows_carry_versions_references_and_the_schema(tmp_path: Path) -> None:
    exs = [GecExample("a", "s0", "t0", ("t0", "u0")), GecExample("b", "s1", "t1")]
    mined = [MinedNegatives("a", ("n",), (-1.0,)), MinedNegatives("b", (), ())]
    path = tmp_path / "x" / "y" / "n.parquet"  # folders made on the way
    assert write_negatives_parquet(path, exs, mined, model_version=[4, 7]) == path
    table = pq.read_table(path)
    assert table.schema == negatives_schema()
    assert table.to_pylist() == [
        {
            "id": "a",
            "source": "s0",
            "target": "t0",
            "negatives": ["n"],
            "scores": [-1.0],
            "model_version": 4,
            "references": ["t0", "u0"],
        },
        {
            "id": "b",
            "source": "s1",
            "target": "t1",
            "negatives": [],
            "scores": [],
            "model_version": 7,
            "references": ["t1"],
        },  # parallel text: the target is the one reference
    ]
    again = write_negatives_parquet(str(tmp_path / "x" / "y" / "m.parquet"), exs, mined, model_version=2)
    assert pq.read_table(again).column("model_version").to_pylist() == [2, 2]
    # a shard where the model found no negative at all, and an empty one, keep the types (not lists of nulls):
    # a directory of shards reads as one table
    none = [MinedNegatives("a", (), ()), MinedNegatives("b", (), ())]
    for name, rows in (("o.parquet", (exs, none)), ("p.parquet", ([], []))):
        assert (
            pq.read_table(write_negatives_parquet(path.parent / name, *rows, model_version=1)).schema
            == negatives_schema()
        )
    assert pq.read_table(path.parent).num_rows == 6
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "m.parquet",
        "n.parquet",
        "o.parquet",
        "p.parquet",
    ]  # no temp file left
    with pytest.raises(ValueError, match="^mined record 'b' is not for example 'a'$"):
        write_negatives_parquet(tmp_path / "z.parquet", exs, mined[::-1], model_version=0)
    with pytest.raises(ValueError):  # a record short
        write_negatives_parquet(tmp_path / "z.parquet", exs, mined[:1], model_version=0)
    assert not (tmp_path / "z.parquet").exists()


def test_the_schema_names_each_column_and_its_type() -> None:
    text, texts = pa.string(), pa.list_(pa.string())
    assert negatives_schema() == pa.schema(
        [
            ("id", text),
            ("source", text),
            ("target", text),
            ("negatives", texts),
            ("scores", pa.list_(pa.float64())),
            ("model_version", pa.int64()),
            ("references", texts),
        ]
    )


def _write(path: Path, ids: list[str], negatives: list[Any], scores: list[Any]) -> Path:
    pq.write_table(
        pa.table(
            {"id": ids, "negatives": negatives, "scores": scores},
            schema=pa.schema(
                [("id", pa.string()), ("negatives", pa.list_(pa.string())), ("scores", pa.list_(pa.float64()))]
            ),
        ),
        path,
    )
    return path


def test_reading_needs_only_three_columns_and_keeps_missing_scores_as_nan(tmp_path: Path) -> None:
    got = read_negatives_parquet(
        _write(tmp_path / "n.parquet", ["a", "b", "c"], [["x", "y"], [], []], [[-1.0, None], [], None])
    )
    assert list(got) == ["a", "b", "c"] and got["b"] == MinedNegatives("b", (), ())
    assert got["a"].negatives == ("x", "y") and got["a"].scores[0] == -1.0 and math.isnan(got["a"].scores[1])
    assert got["c"] == MinedNegatives("c", (), ())  # no negatives, no scores: nothing to score


def test_reading_refuses_a_bad_row_naming_the_file_and_the_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(path: Path) -> str:
        with pytest.raises(UserError) as err:
            read_negatives_parquet(path)
        return str(err.value)

    pq.write_table(pa.table({"id": ["a"], "scores": [[1.0]]}), tmp_path / "cols.parquet")
    assert refused(tmp_path / "cols.parquet") == (
        f"{tmp_path}/cols.parquet: expected columns ['id', 'source', "
        "'target', 'negatives', 'scores', 'model_version'], missing "
        "['negatives']"
    )
    tail = "expected a unique id and one score per negative"
    cases = {
        "dup": (["a", "b", "a"], [["x"], ["y"], ["z"]], [[0.0], [0.0], [0.0]], "row 2 (id 'a')"),
        "null": (["a", "b"], [["x"], None], [[0.0], []], "row 1 (id 'b')"),
        "short": (["a"], [["x", "y"]], [[0.0]], "row 0 (id 'a')"),
        "long": (["a", "b"], [[], []], [[], [1.0]], "row 1 (id 'b')"),
    }
    for name, (ids, negs, scores, where) in cases.items():
        path = _write(tmp_path / f"{name}.parquet", ids, negs, scores)
        assert refused(path) == f"{path}: {where}: {tail}"
    monkeypatch.setattr(parquet_input, "BATCH_ROWS", 2)  # rows are counted across batches
    path = _write(tmp_path / "batches.parquet", ["a", "b", "c", "d", "e"], [["x"]] * 4 + [None], [[0.0]] * 5)
    assert refused(path) == f"{path}: row 4 (id 'e'): {tail}"


# ---------------------------------------------------------------------------- building a miner, precision, weights
@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A tiny BART folder, and a private CTranslate2 conversion cache for this module's tests."""
    out = tmp_path_factory.mktemp("tiny")
    texts = ["the cat sat on the mat .", "a dog ran in the park .", "she go to school every day ."]
    build_model(
        "smoke",
        out_dir=out,
        texts=texts * 20,
        vocab_size=120,
        d_model=16,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        encoder_layers=1,
        decoder_layers=1,
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield out


@pytest.fixture
def cuda13(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU machine where CTranslate2 lists its CUDA compute types but cannot open cuBLAS 12 to load a model."""
    from raycl.models import ct2_engine

    patch_cuda13(monkeypatch)
    monkeypatch.setattr(ct2_engine, "_dlopen", lambda name: None)  # the library probe finds it; the load fails


@pytest.fixture
def hf_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """HF's scorer asked for any device is built on this CPU; the devices asked are recorded."""
    asked: list[str] = []
    real = Seq2SeqScorer.from_pretrained.__func__  # type: ignore[attr-defined]

    def from_pretrained(cls: type, path: str, *, device: str = "cpu", **kwargs: object) -> Seq2SeqScorer:
        asked.append(device)
        return real(cls, path, device="cpu", **kwargs)

    monkeypatch.setattr(Seq2SeqScorer, "from_pretrained", classmethod(from_pretrained))
    return asked


def _said(capfd: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capfd.readouterr().err.splitlines() if "mining.engine" in line]


def test_every_option_reaches_the_miner(tiny: Path, capfd: pytest.CaptureFixture[str]) -> None:
    options = {
        "engine": "hf",
        "k": 1,
        "beam": 3,
        "source_negative": False,
        "batch_size": 5,
        "max_len_a": 0.5,
        "max_len_b": 9,
        "precision": "bf16",
        "rank_by": "sum_logprob",
        "refill": True,
        "nbest": True,
        "false_negatives": "drop",
    }
    m = build_beam_miner(str(tiny), options)
    assert isinstance(m.scorer, Seq2SeqScorer) and m.module is m.scorer
    assert (m.k, m.beam, m.source_negative, m.batch_size, m.max_len_a, m.max_len_b) == (1, 3, False, 5, 0.5, 9)
    assert (m.precision, m.rank_by, m.refill, m.nbest_mode, m.false_negatives) == (
        "bf16",
        "sum_logprob",
        True,
        True,
        "drop",
    )
    assert next(m.scorer.parameters()).dtype == torch.float32  # a CPU miner autocasts: its weights stay fp32
    assert _said(capfd) == []  # an engine asked for by name is not announced
    assert options["engine"] == "hf"  # the caller's options are left as they were


def test_the_default_engine_is_auto_on_the_cpu_and_says_so_once(
    tiny: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    m = build_beam_miner(str(tiny), {"k": 1})
    assert isinstance(m.scorer, CT2Seq2Seq) and m.scorer.device_name == "cpu" and m.scorer.compute == "float32"
    assert (m.k, m.beam, m.precision) == (1, 2, "fp32")
    assert _said(capfd) == [
        "raycl miner: mining.engine=ctranslate2 (auto: CTranslate2 decodes this model at float32 on cpu)"
    ]
    m = build_beam_miner(str(tiny), {"k": 1, "engine": "ctranslate2", "precision": "int8"})
    assert isinstance(m.scorer, CT2Seq2Seq) and m.scorer.compute == "int8" and m.precision == "int8"
    assert _said(capfd) == []


def test_a_gpu_miner_built_with_hf_holds_weights_in_its_precision(tiny: Path, hf_on_the_cpu: list[str]) -> None:
    m = build_beam_miner(str(tiny), {"engine": "hf", "device": "cuda", "precision": "bf16", "k": 1})
    assert hf_on_the_cpu == ["cuda"] and {p.dtype for p in m.scorer.parameters()} == {torch.bfloat16}
    build_beam_miner(str(tiny), {"engine": "hf", "k": 1})
    assert hf_on_the_cpu == ["cuda", "cpu"]  # the device defaults to the CPU


def test_auto_falls_back_to_hf_where_ctranslate2_cannot_load(
    tiny: Path, cuda13: None, hf_on_the_cpu: list[str], capfd: pytest.CaptureFixture[str]
) -> None:
    m = build_beam_miner(str(tiny), {"k": 1, "device": "cuda", "precision": "fp16"})
    assert isinstance(m.scorer, Seq2SeqScorer) and hf_on_the_cpu == ["cuda"]
    assert {p.dtype for p in m.scorer.parameters()} == {torch.float16}
    assert _said(capfd) == [f"raycl miner: mining.engine=hf (auto: {CUBLAS_WHY})"]
    with pytest.raises(UserError) as err:
        build_beam_miner(str(tiny), {"k": 1, "device": "cuda", "engine": "ctranslate2"})
    assert str(err.value) == f"mining.engine=ctranslate2: {CUBLAS_WHY}; or set mining.engine=hf (or auto)"


def test_bad_options_are_refused_with_their_message(tiny: Path) -> None:
    for options, msg in (
        ({"engine": "fast"}, "mining.engine: expected one of auto | hf | ctranslate2, got 'fast'"),
        (
            {"engine": "hf", "precision": "int8"},
            "mining.precision: int8 exists only with mining.engine=ctranslate2 or auto, got hf",
        ),
        (
            {"engine": "ctranslate2", "precision": "fp64"},
            "mining.precision: expected one of fp32, fp16, bf16, int8 with mining.engine=ctranslate2, got 'fp64'",
        ),
    ):
        with pytest.raises(UserError) as err:
            build_beam_miner(str(tiny), options)
        assert str(err.value) == msg
    with pytest.raises(ValueError, match="^rank_by must be one of"):
        build_beam_miner(str(tiny), {"engine": "hf", "rank_by": "x"})
    with pytest.raises(TypeError, match="beams"):
        build_beam_miner(str(tiny), {"engine": "hf", "beams": 4})


def test_null_decoding_needs_no_model() -> None:
    m = NULL_BEAM.build("no/such/model", {"device": "cuda", "engine": "ctranslate2", "k": 2, "batch_size": 7})
    assert isinstance(m.scorer, NullEngine) and (m.k, m.beam, m.batch_size) == (2, 3, 7)
    with pytest.raises(UserError, match="got 'fast'$"):  # the real miner chooses its engine first
        build_beam_miner("no/such/model", {"engine": "fast"})


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1"])
def test_in_precision_casts_a_gpu_miners_weights_only(tiny: Path, device: str) -> None:
    scorer = Seq2SeqScorer.from_pretrained(tiny)
    for precision, dtype in (
        ("fp32", torch.float32),
        ("bf16", torch.bfloat16),
        ("fp16", torch.float16),
        ("int8", torch.float32),
        ("BF16", torch.float32),
    ):
        want = dtype if device.startswith("cuda") else torch.float32
        assert in_precision(scorer, device, precision) is scorer
        assert {p.dtype for p in scorer.parameters()} == {want}, (precision, device)
        scorer.to(torch.float32)


def test_open_ct2_loads_or_says_why_it_cannot(tiny: Path, cuda13: None, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _open_ct2(str(tiny), "cpu", "int8", auto=False)
    assert isinstance(engine, CT2Seq2Seq) and (engine.device_name, engine.compute) == ("cpu", "int8")
    assert _open_ct2(str(tiny), "cuda", "bf16", auto=True) == CUBLAS_WHY  # auto: HF decodes instead
    with pytest.raises(UserError) as err:
        _open_ct2(str(tiny), "cuda", "bf16", auto=False)
    assert str(err.value) == f"mining.engine=ctranslate2: {CUBLAS_WHY}; or set mining.engine=hf (or auto)"
    assert err.value.__cause__ is None and err.value.__suppress_context__

    import ctranslate2

    def broken(*a: object, **k: object) -> object:
        raise OSError("a bug")

    monkeypatch.setattr(ctranslate2, "Translator", broken)
    for auto in (True, False):  # any other failure is not taken for a missing library
        with pytest.raises(OSError, match="^a bug$"):
            _open_ct2(str(tiny), "cuda", "bf16", auto=auto)


def test_published_weights_reach_the_scorer_or_the_engine(tiny: Path) -> None:
    other = Seq2SeqScorer.from_pretrained(tiny)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.25)
    hf = BeamSearchMiner(Seq2SeqScorer.from_pretrained(tiny), k=1)
    load_beam_weights(hf, other.state_dict())
    assert all(
        torch.equal(a, b)
        for a, b in zip(hf.scorer.state_dict().values(), other.state_dict().values(), strict=True)
    )
    ct2 = BeamSearchMiner(CT2Seq2Seq.from_pretrained(tiny), k=1)  # type: ignore[arg-type]
    base = ct2.scorer.translator
    load_beam_weights(ct2, other.state_dict())  # version 0 is the base the engine was built from: kept
    assert ct2.scorer.version == 0 and ct2.scorer.translator is base
    load_beam_weights(ct2, other.state_dict(), version=3)
    assert ct2.scorer.version == 3 and ct2.scorer.translator is not base
    src = ["the cat sat on the mat ."]
    assert ct2.scorer.score_texts(src, src) == pytest.approx(other.eval().score_texts(src, src), abs=1e-3)
