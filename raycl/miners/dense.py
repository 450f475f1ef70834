"""Dense hard negatives, the Ray-free part: options, candidate merging, the filters and the output formats of
``raycl.mine_dense_negatives`` (the pipeline is :mod:`raycl.distributed.dense`).

The meaning of every option is sentence-transformers' ``mine_hard_negatives`` (6.2). For each unique query q
with positives P(q) (every row of the pairs whose anchor is q; s(·,·) the cosine of normalised embeddings, or a
cross-encoder's score where one rescores):

1. candidates: the ``range_max + max_positives`` corpus texts nearest to q (``max_positives``: the most rows any
   anchor has), distinct texts; the corpus is ``corpus`` + every positive;
2. a candidate whose text is one of q's positives (the positive itself, or an exact duplicate of it in the
   corpus) is dropped unless ``include_positives``;
3. with p = min over P(q) of s(q, p) (the hardest positive):
   ``absolute_margin`` m drops a candidate c when s(q, c) + m > p (kept: s(q, c) ≤ p − m);
   ``relative_margin`` r drops it when s(q, c) > p − |p|·r (kept: s(q, c) ≤ p − |p|·r; the |p| keeps the
   threshold below p when p < 0, sentence-transformers #3819);
   ``max_score`` drops s(q, c) > max_score, ``min_score`` drops s(q, c) < min_score — in this order, each
   counted among the candidates still left;
4. the survivors in descending score, ranks ``range_min`` … ``range_max``−1; ``top`` takes the first
   ``num_negatives``, ``random`` draws ``num_negatives`` of them (a generator seeded by ``seed`` and q's index, so
   a rerun or another number of miners draws the same), shown in descending score.

A query left with fewer than ``num_negatives`` is *short* (counted once per unique query, whatever the format).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from raycl.errors import UserError

FORMATS = ("triplet", "n-tuple", "labeled-pair", "labeled-list")
STRATEGIES = ("top", "random")
FILTERS = ("positives", "absolute_margin", "relative_margin", "max_score", "min_score")
BINS = np.linspace(-1.0, 1.0, 81)  # score histograms (cosines; a cross-encoder's scores are clipped into them)


@dataclasses.dataclass(frozen=True)
class DenseOptions:
    """The selection's settings, checked (:func:`dense_options`)."""

    num_negatives: int
    range_min: int
    range_max: int
    max_positives: int
    sampling_strategy: str = "top"
    max_score: float | None = None
    min_score: float | None = None
    absolute_margin: float | None = None
    relative_margin: float | None = None
    include_positives: bool = False
    output_format: str = "triplet"
    output_scores: bool = False
    seed: int = 0

    @property
    def window(self) -> int:
        """Candidates fetched per query (sentence-transformers' ``range_max + max_positives``)."""
        return self.range_max + self.max_positives


# Bounds of the numbers a mining is given, far above any real use: a typo or a hostile value (1e308, inf, 10**30)
# is one line at the edge, before a model is loaded or Ray started, not an allocation or a hang deep in an actor.
INT_BOUNDS = {
    "num_negatives": (1, 10_000),
    "range_min": (0, 1_000_000),
    "range_max": (1, 1_000_000),
    "batch_size": (1, 1 << 16),
    "seed": (0, (1 << 63) - 1),
    "corpus_shard_size": (1, 10_000_000),
    "query_block_size": (1, 1_000_000),
    "num_miners": (0, 10_000),
}
FLOAT_BOUNDS = {
    "max_score": 1e6,
    "min_score": 1e6,
    "absolute_margin": 1e6,
    "relative_margin": 1e6,
    "cpus_per_miner": 1e4,
    "gpus_per_miner": 1e4,
}  # |value| at most; finite always


def check_numbers(*, flags: bool = False, **numbers: Any) -> None:
    """Each of ``numbers`` (None: unset) within :data:`INT_BOUNDS` (an integer) or :data:`FLOAT_BOUNDS` (a finite
    number); ``num_miners`` may be a (min, max) pair. Else one line naming it (``flags``: as ``--the-option``)."""
    for key, value in numbers.items():
        shown = f"--{key.replace('_', '-')}" if flags else key
        for v in value if isinstance(value, tuple) else (value,):
            if v is None:
                continue
            if key in INT_BOUNDS:
                lo, hi = INT_BOUNDS[key]
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
                    raise UserError(f"{shown}: expected an integer from {lo:,} to {hi:,}, got {_shown(v)}")
            elif (
                isinstance(v, bool)
                or not isinstance(v, (int, float, np.number))
                or not (abs(_float(v)) <= FLOAT_BOUNDS[key])
            ):
                raise UserError(
                    f"{shown}: expected a finite number of magnitude at most {FLOAT_BOUNDS[key]:g}, "
                    f"got {_shown(v)}"
                )


def _float(value: Any) -> float:
    """``value`` as a float; NaN and an integer too large for a float as infinite (then refused)."""
    try:
        f = float(value)
    except OverflowError:
        return math.inf
    return math.inf if math.isnan(f) else f


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}… ({len(text):,} characters)"


def dense_options(
    *,
    num_negatives: int = 3,
    range_min: int = 0,
    range_max: int | None = None,
    max_positives: int,
    cross_encoder: bool = False,
    **kw: Any,
) -> DenseOptions:
    """The options as sentence-transformers resolves them (``range_max`` by default: ``range_min +
    num_negatives + max_positives``, or ``range_min + 10·num_negatives + max_positives`` when a margin or
    ``max_score`` — or ``min_score`` with a cross-encoder — may drop candidates); bad values: one line."""
    fmt, strategy = kw.get("output_format", "triplet"), kw.get("sampling_strategy", "top")
    if fmt not in FORMATS:
        raise UserError(f"output_format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    if strategy not in STRATEGIES:
        raise UserError(f"sampling_strategy: expected top or random, got {strategy!r}")
    if num_negatives < 1:
        raise UserError(f"num_negatives: expected an integer ≥ 1, got {num_negatives}")
    if range_min < 0:
        raise UserError(f"range_min: expected an integer ≥ 0, got {range_min}")
    for name in ("absolute_margin", "relative_margin"):
        if kw.get(name) is not None and not math.isfinite(float(kw[name])):
            raise UserError(f"{name}: expected a finite number, got {kw[name]}")
    lo, hi = kw.get("min_score"), kw.get("max_score")
    if lo is not None and hi is not None and lo > hi:
        raise UserError(f"min_score {lo} > max_score {hi}: expected min_score ≤ max_score")
    if range_max is None:
        filtered = any(kw.get(k) is not None for k in ("absolute_margin", "relative_margin", "max_score")) or (
            cross_encoder and lo is not None
        )
        range_max = range_min + num_negatives * (10 if filtered else 1) + max_positives
    if range_min >= range_max:
        raise UserError(f"range_min {range_min} ≥ range_max {range_max}: expected range_min < range_max")
    if num_negatives > range_max - range_min:
        raise UserError(
            f"num_negatives {num_negatives} > range_max − range_min = {range_max - range_min}: "
            "expected at least num_negatives candidates in the window"
        )
    if kw.get("include_positives") and fmt != "n-tuple":
        kw["output_format"] = "n-tuple"  # as sentence-transformers: the ranking order needs one row a query
    return DenseOptions(
        num_negatives=num_negatives, range_min=range_min, range_max=range_max, max_positives=max_positives, **kw
    )


def text_key(text: str) -> int:
    """A 64-bit key of a text (blake2b): equal texts are equal keys, collisions are negligible at corpus scale."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little", signed=True)


def keys_of(texts: Sequence[str]) -> np.ndarray:
    return np.fromiter((text_key(t) for t in texts), np.int64, count=len(texts))


def group_pairs(anchors: Sequence[str], positives: Sequence[str]) -> tuple[list[str], list[list[str]], int]:
    """Unique queries in first-seen order, each with its distinct positives in row order, and ``max_positives``
    (the most rows any anchor has, duplicates included: sentence-transformers' count)."""
    by_query: dict[str, list[str]] = {}
    rows: dict[str, int] = {}
    for a, p in zip(anchors, positives, strict=True):
        got = by_query.setdefault(a, [])
        rows[a] = rows.get(a, 0) + 1
        if p not in got:
            got.append(p)
    return list(by_query), list(by_query.values()), max(rows.values(), default=0)


# ---------------------------------------------------------------------------------------------- candidates
@dataclasses.dataclass
class Candidates:
    """Each query's best candidates so far, descending: scores (Q, K) (−inf: none), keys (Q, K), texts (Q, K)."""

    scores: np.ndarray
    keys: np.ndarray
    texts: np.ndarray

    @classmethod
    def empty(cls, queries: int) -> Candidates:
        return cls(
            np.full((queries, 0), -np.inf, np.float32),
            np.zeros((queries, 0), np.int64),
            np.empty((queries, 0), object),
        )

    def merge(self, other: Candidates, k: int) -> Candidates:
        """The best ``k`` of both (``k`` counts repeated texts: :meth:`distinct` collapses them at the end)."""
        scores = np.concatenate([self.scores, other.scores], axis=1)
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        take = functools_take(order)
        return Candidates(
            take(scores),
            take(np.concatenate([self.keys, other.keys], axis=1)),
            take(np.concatenate([self.texts, other.texts], axis=1)),
        )

    def distinct(self, k: int) -> Candidates:
        """Each text once (its best copy), the first ``k``, padded with −inf to ``k`` columns."""
        q = len(self.scores)
        scores = np.full((q, k), -np.inf, np.float32)
        keys, texts = np.zeros((q, k), np.int64), np.full((q, k), "", object)
        for i in range(q):
            live = np.isfinite(self.scores[i])
            _, first = np.unique(self.keys[i][live], return_index=True)
            cols = np.flatnonzero(live)[np.sort(first)][:k]
            n = len(cols)
            scores[i, :n], keys[i, :n] = self.scores[i, cols], self.keys[i, cols]
            texts[i, :n] = self.texts[i, cols]
        return Candidates(scores, keys, texts)


def functools_take(order: np.ndarray) -> Any:
    rows = np.arange(len(order))[:, None]
    return lambda a: a[rows, order]


# ---------------------------------------------------------------------------------------------- selection
@dataclasses.dataclass
class Stats:
    """What a run's filters did, summed over blocks: candidates, drops per filter, negatives kept, short
    queries, and score histograms (:data:`BINS`) of positives, kept and dropped candidates."""

    queries: int = 0
    candidates: int = 0
    dropped: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(FILTERS, 0))
    negatives: int = 0
    short: int = 0
    hist: dict[str, list[int]] = dataclasses.field(
        default_factory=lambda: {k: [0] * (len(BINS) - 1) for k in ("positive", "kept", "dropped")}
    )

    def add_hist(self, name: str, values: np.ndarray) -> None:
        got = np.histogram(np.clip(values, BINS[0], BINS[-1]), BINS)[0]
        self.hist[name] = [int(a + b) for a, b in zip(self.hist[name], got, strict=True)]

    def merge(self, other: dict[str, Any]) -> None:
        self.queries += int(other["queries"])
        self.candidates += int(other["candidates"])
        self.negatives += int(other["negatives"])
        self.short += int(other["short"])
        for k, v in other["dropped"].items():
            self.dropped[k] = self.dropped.get(k, 0) + int(v)
        for k, v in other["hist"].items():
            self.hist[k] = [int(a + b) for a, b in zip(self.hist[k], v, strict=True)]

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Mined:
    """One unique query's result."""

    query: str
    positives: list[str]
    positive_scores: list[float]
    negatives: list[str]
    negative_scores: list[float]


def select(
    cands: Candidates,
    positive_keys: Sequence[Sequence[int] | np.ndarray],
    positive_scores: Sequence[Sequence[float]],
    opts: DenseOptions,
    first_query: int,
    stats: Stats,
) -> list[np.ndarray]:
    """The chosen candidate columns of each query (descending score), the filters of the module docstring
    applied in their order, counted in ``stats``. ``first_query``: the index of row 0 among all unique queries
    (seeds ``random``)."""
    scores = cands.scores.astype(np.float32, copy=True)
    live = np.isfinite(scores)
    stats.candidates += int(live.sum())
    if not opts.include_positives:
        own = np.zeros_like(live)
        for i, keys in enumerate(positive_keys):
            own[i] = np.isin(cands.keys[i], np.asarray(keys, np.int64))
        _drop(live, own, "positives", scores, stats, hist=False)
    hardest = np.array([min(p) if len(p) else np.inf for p in positive_scores], np.float32)[:, None]
    if opts.absolute_margin is not None:
        _drop(live, scores + np.float32(opts.absolute_margin) > hardest, "absolute_margin", scores, stats)
    if opts.relative_margin is not None:
        threshold = hardest - np.abs(hardest) * np.float32(opts.relative_margin)
        _drop(live, scores > threshold, "relative_margin", scores, stats)
    if opts.max_score is not None:
        _drop(live, scores > opts.max_score, "max_score", scores, stats)
    if opts.min_score is not None:
        _drop(live, scores < opts.min_score, "min_score", scores, stats)
    chosen = [_choose(scores[i], live[i], opts, first_query + i) for i in range(len(scores))]
    stats.queries += len(chosen)
    stats.negatives += sum(len(c) for c in chosen)
    stats.short += sum(len(c) < opts.num_negatives for c in chosen)
    for i, c in enumerate(chosen):
        stats.add_hist("kept", scores[i, c])
        stats.add_hist("positive", np.asarray(positive_scores[i], np.float32))
    return chosen


def _drop(
    live: np.ndarray, mask: np.ndarray, name: str, scores: np.ndarray, stats: Stats, *, hist: bool = True
) -> None:
    gone = live & mask
    stats.dropped[name] += int(gone.sum())
    if hist:
        stats.add_hist("dropped", scores[gone])
    live &= ~mask


def _choose(scores: np.ndarray, live: np.ndarray, opts: DenseOptions, query_index: int) -> np.ndarray:
    survivors = np.flatnonzero(live)
    survivors = survivors[np.argsort(-scores[survivors], kind="stable")]
    window = survivors[opts.range_min : opts.range_max]
    if opts.sampling_strategy == "top" or len(window) <= opts.num_negatives:
        return window[: opts.num_negatives]
    rng = np.random.default_rng([opts.seed, query_index])
    picked = np.sort(rng.choice(len(window), size=opts.num_negatives, replace=False))
    return window[picked]  # the window is descending, so sorted positions keep the scores descending


def mined(
    queries: Sequence[str],
    positives: Sequence[Sequence[str]],
    positive_scores: Sequence[Sequence[float]],
    cands: Candidates,
    chosen: Sequence[np.ndarray],
) -> list[Mined]:
    rows = zip(queries, positives, positive_scores, chosen, strict=True)
    return [
        Mined(
            q,
            list(p),
            [float(s) for s in ps],
            [str(t) for t in cands.texts[i, c]],
            [float(s) for s in cands.scores[i, c]],
        )
        for i, (q, p, ps, c) in enumerate(rows)
    ]


def within_margins(
    scores: Sequence[float],
    positive_score: float | None,
    *,
    absolute_margin: float | None,
    relative_margin: float | None,
) -> list[int]:
    """The positions of ``scores`` (one query's candidates) that pass the margins of step 3 against its hardest
    positive's score p — ``absolute_margin`` m keeps s ≤ p − m, ``relative_margin`` r keeps s ≤ p − |p|·r — in
    order; all of them without a margin or without p. The STS recipe's selection from a pool mined without
    margins, and its refreshed miners', so that both keep what mining with the margins keeps."""
    bounds = []
    if positive_score is not None and absolute_margin is not None:
        bounds.append(positive_score - absolute_margin)
    if positive_score is not None and relative_margin is not None:
        bounds.append(positive_score - abs(positive_score) * relative_margin)
    return [i for i, s in enumerate(scores) if not bounds or s <= min(bounds)]


# ---------------------------------------------------------------------------------------------- output formats
def format_rows(records: Sequence[Mined], opts: DenseOptions, anchor: str, positive: str) -> dict[str, list[Any]]:
    """sentence-transformers' columns for ``records`` (unique queries in order, each one's positives in order)."""
    fmt, with_scores, n = opts.output_format, opts.output_scores, opts.num_negatives
    cols: dict[str, list[Any]] = {name: [] for name in columns(opts, anchor, positive)}
    for r in records:
        for p, ps in zip(r.positives, r.positive_scores, strict=True):
            if fmt == "triplet":
                for neg, ns in zip(r.negatives, r.negative_scores, strict=True):
                    _add(cols, [r.query, p, neg] + ([[ps, ns]] if with_scores else []))
            elif fmt == "n-tuple" and len(r.negatives) == n:
                _add(cols, [r.query, p, *r.negatives] + ([[ps, *r.negative_scores]] if with_scores else []))
            elif fmt == "labeled-list" and r.negatives:
                _add(
                    cols,
                    [
                        r.query,
                        [p, *r.negatives],
                        [ps, *r.negative_scores] if with_scores else [1] + [0] * len(r.negatives),
                    ],
                )
            elif fmt == "labeled-pair":
                _add(cols, [r.query, p, ps if with_scores else 1])
        if fmt == "labeled-pair":
            for neg, ns in zip(r.negatives, r.negative_scores, strict=True):
                _add(cols, [r.query, neg, ns if with_scores else 0])
    return cols


def _add(cols: dict[str, list[Any]], values: list[Any]) -> None:
    for col, v in zip(cols.values(), values, strict=True):
        col.append(v)


def columns(opts: DenseOptions, anchor: str, positive: str) -> list[str]:
    fmt, with_scores = opts.output_format, opts.output_scores
    if fmt == "triplet":
        return [anchor, positive, "negative"] + ["scores"] * with_scores
    if fmt == "n-tuple":
        return [anchor, positive, *(f"negative_{i}" for i in range(1, opts.num_negatives + 1))] + [
            "scores"
        ] * with_scores
    if fmt == "labeled-pair":
        return [anchor, positive, "score" if with_scores else "label"]
    return [anchor, positive, "scores" if with_scores else "labels"]


def arrow_schema(opts: DenseOptions, anchor: str, positive: str) -> Any:
    """The Parquet/Arrow schema of :func:`format_rows`' columns (an empty block keeps the types)."""
    import pyarrow as pa

    names = columns(opts, anchor, positive)
    types: dict[str, Any] = {
        "scores": pa.list_(pa.float64()),
        "score": pa.float64(),
        "label": pa.int64(),
        "labels": pa.list_(pa.int64()),
    }
    if opts.output_format == "labeled-list":
        types[positive] = pa.list_(pa.string())
    return pa.schema([(c, types.get(c, pa.string())) for c in names])
