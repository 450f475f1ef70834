"""The Ray-free part of dense mining (raycl.miners.dense): the filters' formulas, the candidate window, the counts
and the four output formats, each against a result worked out by hand. The three tests named after
sentence-transformers issues fail with raycl's fix undone (the docstring of each says how)."""

from __future__ import annotations

import numpy as np
import pytest

from raycl.errors import UserError
from raycl.miners.dense import Candidates, Mined, Stats, dense_options, format_rows, group_pairs, keys_of, select


def _cands(rows: list[list[tuple[str, float]]]) -> Candidates:
    """Candidates of each query from (text, score) lists (padded with −inf)."""
    width = max(len(r) for r in rows)
    scores = np.full((len(rows), width), -np.inf, np.float32)
    texts = np.full((len(rows), width), "", object)
    for i, r in enumerate(rows):
        for j, (t, s) in enumerate(r):
            scores[i, j], texts[i, j] = s, t
    keys = np.stack([keys_of(list(t)) for t in texts])
    return Candidates(scores, keys, texts)


def _pick(
    cands: Candidates, pos: list[list[str]], pos_scores: list[list[float]], **kw: object
) -> tuple[list[list[str]], Stats]:
    opts = dense_options(max_positives=max(len(p) for p in pos), **kw)  # type: ignore[arg-type]
    stats = Stats()
    chosen = select(cands, [keys_of(p) for p in pos], pos_scores, opts, 0, stats)
    return [list(cands.texts[i, c]) for i, c in enumerate(chosen)], stats


def test_relative_margin_with_a_negative_positive_score_sentence_transformers_3819() -> None:
    """p = −0.5, r = 0.1: keep s ≤ p − |p|·r = −0.55. The old p·(1 − r) = −0.45 would keep −0.5 and −0.52,
    candidates scored above the positive itself (undo: ``threshold = hardest * (1 - margin)`` keeps them)."""
    cands = _cands([[("P", -0.5), ("a", -0.5), ("b", -0.52), ("c", -0.6), ("d", -0.7)]])
    got, stats = _pick(cands, [["P"]], [[-0.5]], relative_margin=0.1, num_negatives=2)
    assert got == [["c", "d"]]
    assert stats.dropped["relative_margin"] == 2 and stats.dropped["positives"] == 1
    # a positive score > 0: the same formula, 0.8 − 0.08 = 0.72
    cands = _cands([[("P", 0.8), ("a", 0.75), ("b", 0.72), ("c", 0.7)]])
    assert _pick(cands, [["P"]], [[0.8]], relative_margin=0.1, num_negatives=2)[0] == [["b", "c"]]


def test_absolute_margin_and_score_bounds() -> None:
    """keep s ≤ p − m (hardest positive p: the lowest of a query's), then s ≤ max_score, then s ≥ min_score."""
    cands = _cands([[("P1", 0.9), ("a", 0.65), ("b", 0.58), ("c", 0.5), ("d", 0.3), ("e", 0.1)]])
    got, stats = _pick(
        cands, [["P1", "P2"]], [[0.9, 0.7]], absolute_margin=0.1, max_score=0.55, min_score=0.2, num_negatives=3
    )
    assert got == [["c", "d"]]
    assert stats.dropped == {
        "positives": 1,
        "absolute_margin": 1,
        "relative_margin": 0,
        "max_score": 1,
        "min_score": 1,
    }
    assert stats.short == 1 and stats.negatives == 2 and stats.candidates == 6


def test_several_positives_never_negatives_and_enough_candidates_sentence_transformers_3872() -> None:
    """A query whose 3 positives are its 3 nearest texts: the window is range_max + max_positives, so after they
    are dropped it still has num_negatives (undo: a window of range_max leaves 0; a per-query check by the first
    positive only would keep P2, P3)."""
    opts = dense_options(num_negatives=2, max_positives=3)
    assert opts.range_max == 2 + 3 and opts.window == 5 + 3
    texts = [("P1", 0.9), ("P2", 0.85), ("P3", 0.8), ("a", 0.7), ("b", 0.6), ("c", 0.5), ("d", 0.4), ("e", 0.3)]
    cands = _cands([texts[: opts.window]])
    got, _ = _pick(cands, [["P1", "P2", "P3"]], [[0.9, 0.85, 0.8]], num_negatives=2)
    assert got == [["a", "b"]]
    # an exact duplicate of a positive in the corpus is the same text: excluded as well
    cands = _cands([[("P1", 0.9), ("x", 0.8), ("P1", 0.9), ("y", 0.7)]]).distinct(4)
    assert list(cands.texts[0][:3]) == ["P1", "x", "y"]


def test_short_queries_counted_once_per_query_sentence_transformers_3504() -> None:
    """Query 1 (2 positives) finds 1 of 3 negatives, query 2 finds 3: one query is short, whatever the format
    (sentence-transformers' old count subtracted rows of different kinds: 6 triplets possible − 5 written)."""
    cands = _cands([[("A1", 0.9), ("A2", 0.8), ("n1", 0.5)], [("B", 0.9), ("m1", 0.5), ("m2", 0.4), ("m3", 0.3)]])
    got, stats = _pick(cands, [["A1", "A2"], ["B"]], [[0.9, 0.8], [0.9]], num_negatives=3)
    assert got == [["n1"], ["m1", "m2", "m3"]] and stats.short == 1 and stats.queries == 2


def test_range_min_counts_survivors_and_random_is_seeded() -> None:
    """range_min skips ranks among the candidates left after the filters (sentence-transformers' order);
    random draws from ranks range_min … range_max−1 with a generator of (seed, query index)."""
    cands = _cands([[("P", 0.95)] + [(f"t{i}", 0.9 - i / 100) for i in range(10)]])
    got, _ = _pick(cands, [["P"]], [[0.95]], num_negatives=2, range_min=3, range_max=8)
    assert got == [["t3", "t4"]]
    draws = {
        tuple(
            _pick(cands, [["P"]], [[0.95]], num_negatives=3, range_max=10, sampling_strategy="random", seed=seed)[
                0
            ][0]
        )
        for seed in range(6)
    }
    assert len(draws) > 1
    for d in draws:
        ranks = [int(t[1:]) for t in d]
        assert ranks == sorted(ranks) and all(r < 10 for r in ranks)  # descending score, inside the window
    again = _pick(cands, [["P"]], [[0.95]], num_negatives=3, range_max=10, sampling_strategy="random", seed=1)
    assert (
        again[0]
        == _pick(cands, [["P"]], [[0.95]], num_negatives=3, range_max=10, sampling_strategy="random", seed=1)[0]
    )


def test_include_positives_keeps_them_in_an_n_tuple() -> None:
    opts = dense_options(max_positives=1, include_positives=True, output_format="triplet")
    assert opts.output_format == "n-tuple"
    got, stats = _pick(
        _cands([[("P", 0.9), ("a", 0.5)]]), [["P"]], [[0.9]], include_positives=True, num_negatives=2
    )
    assert got == [["P", "a"]] and stats.dropped["positives"] == 0


def test_default_range_max_widens_with_a_filter() -> None:
    assert dense_options(num_negatives=3, max_positives=2).range_max == 5
    assert dense_options(num_negatives=3, max_positives=2, relative_margin=0.05).range_max == 32
    assert dense_options(num_negatives=3, max_positives=1, min_score=0.1).range_max == 4
    assert dense_options(num_negatives=3, max_positives=1, min_score=0.1, cross_encoder=True).range_max == 31


@pytest.mark.parametrize(
    ("kw", "text"),
    [
        ({"range_min": 5, "range_max": 5}, "range_min 5 ≥ range_max 5"),
        ({"num_negatives": 4, "range_max": 3}, "num_negatives 4 > range_max"),
        ({"num_negatives": 0}, "num_negatives"),
        ({"output_format": "pairs"}, "output_format"),
        ({"sampling_strategy": "best"}, "sampling_strategy"),
        ({"min_score": 0.5, "max_score": 0.2}, "min_score 0.5 > max_score 0.2"),
    ],
)
def test_bad_options_are_one_line(kw: dict[str, object], text: str) -> None:
    with pytest.raises(UserError, match=text):
        dense_options(max_positives=1, **kw)  # type: ignore[arg-type]


def test_group_pairs_counts_rows_like_sentence_transformers() -> None:
    queries, positives, most = group_pairs(["q", "r", "q", "q"], ["a", "b", "c", "a"])
    assert queries == ["q", "r"] and positives == [["a", "c"], ["b"]] and most == 3


def test_the_four_formats() -> None:
    recs = [
        Mined("q", ["p1", "p2"], [0.9, 0.8], ["n1", "n2"], [0.5, 0.4]),
        Mined("r", ["p3"], [0.7], ["m"], [0.3]),
    ]

    def rows(fmt: str, scores: bool) -> list[dict[str, object]]:
        opts = dense_options(num_negatives=2, max_positives=2, output_format=fmt, output_scores=scores)
        cols = format_rows(recs, opts, "query", "answer")
        return [dict(zip(cols, r, strict=True)) for r in zip(*cols.values(), strict=True)]

    triplets = rows("triplet", True)
    assert [(r["answer"], r["negative"]) for r in triplets] == [
        ("p1", "n1"),
        ("p1", "n2"),
        ("p2", "n1"),
        ("p2", "n2"),
        ("p3", "m"),
    ]
    assert triplets[0]["scores"] == [0.9, 0.5]
    tuples = rows("n-tuple", True)  # r has one negative of two: no row
    both = {"query": "q", "negative_1": "n1", "negative_2": "n2"}
    assert tuples == [
        {**both, "answer": "p1", "scores": [0.9, 0.5, 0.4]},
        {**both, "answer": "p2", "scores": [0.8, 0.5, 0.4]},
    ]
    assert [(r["answer"], r["label"]) for r in rows("labeled-pair", False)] == [
        ("p1", 1),
        ("p2", 1),
        ("n1", 0),
        ("n2", 0),
        ("p3", 1),
        ("m", 0),
    ]
    assert rows("labeled-pair", True)[2] == {"query": "q", "answer": "n1", "score": 0.5}
    lists = rows("labeled-list", False)
    assert lists[0] == {"query": "q", "answer": ["p1", "n1", "n2"], "labels": [1, 0, 0]}
    assert rows("labeled-list", True)[2] == {"query": "r", "answer": ["p3", "m"], "scores": [0.7, 0.3]}
