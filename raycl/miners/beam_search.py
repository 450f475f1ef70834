"""GEC hard negatives by beam search: the model's own best wrong corrections (docs/mining.md).

For each (s, t): decode an n-best list with beam ≥ k+1; drop outputs equal to t after whitespace
normalisation (and empty ones), dedupe, keep the top-k by S(t~|s); append s itself iff s ≠ t and s is not
already among them (CL). CL⁻ (``source_negative=False``) never adds the source. Every score is the summed
log-prob S(t~|s) of the mining model, the quantity the margin loss compares (Cao et al. 2021, Eq. 4).
The released code ships only the mined data (its beam size and dedupe are unknown); this is raycl's rule.

Records are written to and read from Parquet (``id, source, target, negatives, scores, model_version,
references``; ``references``: every annotator's correction, so that a file can be filtered again later):
both the raw n-best lists (``BeamSearchMiner.nbest``, mined once with the largest beam) and selected
negatives (``BeamSearchMiner.mine`` / ``select``) use that one format.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from raycl.errors import UserError, at
from raycl.files import atomic_file
from raycl.miners.base_miner import BaseMiner, inference
from raycl.miners.false_negatives import MODES, FalseNegativeCounts, normalize, refuted_set
from raycl.miners.records import MinedNegatives
from raycl.miners.registry import load_module, register_miner
from raycl.models.decoding import MAX_LEN_A, MAX_LEN_B

if TYPE_CHECKING:
    from raycl.data.gec import GecExample
    from raycl.models.seq2seq import Seq2SeqScorer

COLUMNS = ("id", "source", "target", "negatives", "scores", "model_version", "references")
RANK_BY = ("beam", "sum_logprob")  # the n-best's order: the beam's length-normalised score (the paper), or S(t~|s)


def select_negatives(
    nbest: Sequence[str],
    target: str,
    source: str,
    *,
    k: int,
    source_negative: bool,
    refill: bool = False,
    references: Sequence[str] = (),
    false_negatives: str = "keep",
    counts: FalseNegativeCounts | None = None,
) -> list[str]:
    """From an n-best list (best first, distinct, empty outputs dropped): the top k with the target dropped — the
    paper's rule (§2.2.3), k−1 negatives when the target is among them — or, with ``refill``, the first k outputs
    ≠ t (raycl's option: always k when the beam has them). Then s iff CL, s ≠ t and s not already chosen. Texts
    are whitespace-normalised.

    ``counts`` (when given) counts this selection's negatives and those that another annotator's correction
    (``references``) equals — before any filtering. ``false_negatives="drop"`` then removes those; with
    ``refill`` the n-best's next outputs take their places."""
    tgt, src = normalize(target), normalize(source)
    distinct = list(dict.fromkeys(t for t in map(normalize, nbest) if t))
    chosen = _rule(distinct, tgt, src, k=k, source_negative=source_negative, refill=refill)
    refuted = refuted_set(references, target) if references else frozenset()
    if counts is not None:
        counts.add(chosen, source=src, refuted=refuted)
    if false_negatives == "keep" or not refuted:
        return chosen
    if refill:
        distinct = [t for t in distinct if t not in refuted]
        return [
            t
            for t in _rule(distinct, tgt, src, k=k, source_negative=source_negative, refill=True)
            if t not in refuted
        ]
    return [t for t in chosen if t not in refuted]


def _rule(distinct: list[str], tgt: str, src: str, *, k: int, source_negative: bool, refill: bool) -> list[str]:
    chosen = [t for t in distinct if t != tgt][:k] if refill else [t for t in distinct[:k] if t != tgt]
    if source_negative and src != tgt and src not in chosen:
        chosen.append(src)
    return chosen


def select_from_nbest(
    nbest: MinedNegatives,
    source_score: float,
    example: GecExample,
    *,
    k: int,
    source_negative: bool,
    refill: bool = False,
    false_negatives: str = "keep",
    counts: FalseNegativeCounts | None = None,
) -> MinedNegatives:
    """One example's negatives from its raw n-best (and S(s|s)): what ``BeamSearchMiner.select`` gives for it."""
    chosen = select_negatives(
        nbest.negatives,
        example.target,
        example.source,
        k=k,
        source_negative=source_negative,
        refill=refill,
        references=example.references,
        false_negatives=false_negatives,
        counts=counts,
    )
    scores = {normalize(example.source): source_score, **dict(zip(nbest.negatives, nbest.scores, strict=True))}
    return MinedNegatives(example.id, tuple(chosen), tuple(scores[n] for n in chosen))


def split_nbest(record: MinedNegatives) -> tuple[MinedNegatives, float]:
    """A shared n-best record (``nbest=True``: the source appended last) -> (the n-best, S(s|s))."""
    return MinedNegatives(record.id, record.negatives[:-1], record.scores[:-1]), record.scores[-1]


def length_chunks(texts: Sequence[str], size: int) -> Iterator[list[int]]:
    """Indices of ``texts`` in chunks of ``size``, shortest first, so each batch pads little."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i].split()))
    for lo in range(0, len(order), size):
        yield order[lo : lo + size]


class BeamSearchMiner(BaseMiner["GecExample", MinedNegatives]):
    """Mines k beam-search negatives per example (+ the source for CL) with a ``Seq2SeqScorer``.

    Args:
        scorer: the mining model (the fixed base weights, in the paper).
        k: beam negatives kept per example (paper: 3).
        beam: beam size = n-best size; defaults to k+1 and must be ≥ k+1, so k survive dropping t.
        source_negative: CL (True) adds the source as a negative; CL⁻ (False) never does.
        batch_size: sources per beam-search call, bucketed by length.
        max_len_a, max_len_b: fairseq's length bound, ``max_len_a · source tokens + max_len_b`` tokens a
            hypothesis; one cut there is never a negative (:mod:`raycl.models.decoding`).
        nbest: ``mine`` returns no selection but each example's raw n-best with the (normalised) source appended
            last, scored S(s|s) — what a run-level n-best keeps, so that every trial selects its own k and CL/CL⁻.
        false_negatives: ``keep`` (the paper) or ``drop`` negatives that another annotator's correction equals
            (:mod:`raycl.miners.false_negatives`); either way ``counts`` adds up all its selections' before a drop.

    Returns (``mine``): one ``MinedNegatives`` per example, ≤ k beam outputs (distinct, ≠ t, score-descending)
    then the source; its score is S(s|s) under the same model.
    Degenerate case: k = 0 with CL gives the source as the only negative (none when s = t).
    """

    def __init__(
        self,
        scorer: Seq2SeqScorer,
        *,
        k: int = 3,
        beam: int | None = None,
        source_negative: bool = True,
        batch_size: int = 32,
        max_len_a: float = MAX_LEN_A,
        max_len_b: int = MAX_LEN_B,
        precision: str = "fp32",
        rank_by: str = "beam",
        refill: bool = False,
        nbest: bool = False,
        false_negatives: str = "keep",
    ) -> None:
        super().__init__(scorer, precision=precision)
        self.nbest_mode = nbest  # mine() returns the raw n-best + the source (a run's shared n-best)
        self.searched = 0  # sentences beam-searched by this miner
        if rank_by not in RANK_BY:
            raise ValueError(f"rank_by must be one of {RANK_BY}, got {rank_by!r}")
        if false_negatives not in MODES:
            raise ValueError(f"false_negatives must be one of {MODES}, got {false_negatives!r}")
        self.rank_by, self.refill, self.false_negatives = rank_by, refill, false_negatives
        self.counts = FalseNegativeCounts()  # of every selection this miner made
        self.scorer = scorer
        self.beam = k + 1 if beam is None else beam
        self.k, self.source_negative = self._check_k(k), source_negative
        self.batch_size, self.max_len_a, self.max_len_b = batch_size, max_len_a, max_len_b

    def _check_k(self, k: int) -> int:
        if k < 0:
            raise ValueError(f"k must be ≥ 0, got {k}")
        if self.beam < k + 1:
            raise ValueError(f"beam must be ≥ k+1 = {k + 1} (one output may equal the target), got {self.beam}")
        return k

    def nbest(self, examples: Sequence[GecExample], *, progress: bool = False) -> list[MinedNegatives]:
        """The raw n-best of each example: distinct beam outputs, best first, with S(t~|s); no selection."""
        with inference(self.scorer):
            return self._nbest(examples, progress=progress)

    def select(
        self,
        nbests: Sequence[MinedNegatives],
        examples: Sequence[GecExample],
        *,
        k: int | None = None,
        source_negative: bool | None = None,
    ) -> list[MinedNegatives]:
        """Negatives from already-mined n-best lists, for this miner's k or another k ≤ beam−1."""
        k = self.k if k is None else self._check_k(k)
        use_source = self.source_negative if source_negative is None else source_negative
        chosen, scores, counted = [], [], []
        for nb, ex in zip(nbests, examples, strict=True):
            assert nb.id == ex.id, f"n-best {nb.id!r} does not belong to example {ex.id!r}"
            counts = FalseNegativeCounts()  # this example's, carried with its negatives (a miner pool's trials)
            chosen.append(
                select_negatives(
                    nb.negatives,
                    ex.target,
                    ex.source,
                    k=k,
                    source_negative=use_source,
                    refill=self.refill,
                    references=ex.references,
                    false_negatives=self.false_negatives,
                    counts=counts,
                )
            )
            self.counts.merge(counts)
            counted.append(tuple(counts.flat()))
            scores.append(dict(zip(nb.negatives, nb.scores, strict=True)))
        missing = [(i, neg) for i, negs in enumerate(chosen) for neg in negs if neg not in scores[i]]
        if missing:  # the appended sources: score them with the same model
            with inference(self.scorer):
                got = self.scorer.score_texts(
                    [examples[i].source for i, _ in missing], [n for _, n in missing], batch_size=self.batch_size
                )
            for (i, neg), s in zip(missing, got, strict=True):
                scores[i][neg] = s
        return [
            MinedNegatives(ex.id, tuple(negs), tuple(sc[n] for n in negs), fn)
            for ex, negs, sc, fn in zip(examples, chosen, scores, counted, strict=True)
        ]

    def _mine(self, examples: Sequence[GecExample]) -> list[MinedNegatives]:
        nbests = self._nbest(examples, progress=False)
        if not self.nbest_mode:
            return self.select(nbests, examples)
        sources = [normalize(ex.source) for ex in examples]
        got = self.scorer.score_texts([ex.source for ex in examples], sources, batch_size=self.batch_size)
        return [
            MinedNegatives(nb.id, (*nb.negatives, src), (*nb.scores, s))
            for nb, src, s in zip(nbests, sources, got, strict=True)
        ]

    def _nbest(self, examples: Sequence[GecExample], *, progress: bool) -> list[MinedNegatives]:
        from tqdm.auto import tqdm

        sources = [ex.source for ex in examples]
        out: list[MinedNegatives | None] = [None] * len(examples)
        with tqdm(total=len(examples), unit="sent", desc="beam search", disable=not progress) as bar:
            for idx in length_chunks(sources, self.batch_size):
                hyps = self.scorer.generate(
                    [sources[i] for i in idx],
                    num_beams=self.beam,
                    num_return_sequences=self.beam,
                    max_new_tokens=self.max_len_b,
                    max_len_a=self.max_len_a,
                    drop_cut=True,
                    batch_size=self.batch_size,
                    rank_by=self.rank_by,
                )
                for i, h in zip(idx, hyps, strict=True):
                    out[i] = _distinct(examples[i].id, h)
                self.searched += len(idx)
                bar.update(len(idx))
        return [r for r in out if r is not None]


def _distinct(id_: str, hyps: Sequence[tuple[str, float]]) -> MinedNegatives:
    """Distinct non-empty texts in the order given (the beam's, or by score), each at its first, best-ranked place
    (an empty output is never a negative)."""
    first: dict[str, float] = {}
    for text, score in hyps:
        if text:
            first.setdefault(text, score)
    return MinedNegatives(id_, tuple(first), tuple(first.values()))


def write_negatives_parquet(
    path: str | Path,
    examples: Sequence[GecExample],
    mined: Sequence[MinedNegatives],
    *,
    model_version: int | Sequence[int],
) -> Path:
    """Write one row per example (``COLUMNS``) to ``path``, atomically (temp file + rename).

    ``model_version``: the weights' version for every row, or one version per row (negatives mined while
    training may come from several versions)."""
    versions = [model_version] * len(mined) if isinstance(model_version, int) else list(model_version)
    import pyarrow as pa
    import pyarrow.parquet as pq

    for ex, m in zip(examples, mined, strict=True):
        if ex.id != m.id:
            raise ValueError(f"mined record {m.id!r} is not for example {ex.id!r}")
    table = pa.table(
        {
            "id": [ex.id for ex in examples],
            "source": [ex.source for ex in examples],
            "target": [ex.target for ex in examples],
            "negatives": [list(m.negatives) for m in mined],
            "scores": [list(m.scores) for m in mined],
            "model_version": versions,
            "references": [list(ex.references or (ex.target,)) for ex in examples],
        },
        schema=negatives_schema(),
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "wb") as f:
        pq.write_table(table, f)
    return path


def negatives_schema() -> Any:
    """The negatives files' columns (:data:`COLUMNS`): one file and every shard of a directory."""
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.string()),
            ("source", pa.string()),
            ("target", pa.string()),
            ("negatives", pa.list_(pa.string())),
            ("scores", pa.list_(pa.float64())),
            ("model_version", pa.int64()),
            ("references", pa.list_(pa.string())),
        ]
    )


def read_negatives_parquet(path: str | Path) -> dict[str, MinedNegatives]:
    """The records of a negatives Parquet file by example id (``mining.negatives=PATH``): its footer checked
    against the input limits before anything is decompressed, then read in batches
    (:mod:`raycl.miners.parquet_input`)."""
    from raycl.miners.parquet_input import batches, column_names

    lacking = [c for c in ("id", "negatives", "scores") if c not in column_names(path)]
    if lacking:
        raise UserError(f"{at(path)}: expected columns {list(COLUMNS[:6])}, missing {lacking}")
    out: dict[str, MinedNegatives] = {}
    row = 0
    for batch in batches(path, ("id", "negatives", "scores")):
        for id_, negs, scores in zip(
            *(batch.column(c).to_pylist() for c in ("id", "negatives", "scores")), strict=True
        ):
            if id_ in out or negs is None or len(negs) != len(scores or []):
                raise UserError(
                    f"{at(path)}: row {row} (id {id_!r}): expected a unique id and one score per negative"
                )
            # scores: null with no negatives is none at all; a null score is one never computed (NaN)
            out[id_] = MinedNegatives(id_, tuple(negs), tuple(math.nan if s is None else s for s in scores or ()))
            row += 1
    return out


def build_beam_miner(model_path: str, options: dict[str, Any]) -> BeamSearchMiner:
    """A ``gec_beam`` miner in an actor: the decoding engine over ``model_path`` on ``options["device"]``.

    ``options["engine"]``: ``auto`` (default: CTranslate2 where it converts the model and runs the precision on
    this device, else HF), ``hf`` (``Seq2SeqScorer``, ``precision`` = autocast) or ``ctranslate2`` (the folder
    converted once per weight version, cached next to it; ``precision`` → the engine's compute type): chosen and
    opened by :func:`raycl.models.engines.open_decoder`, which says an ``auto`` choice once on stderr."""
    from raycl.models.engines import open_decoder

    opts = dict(options)
    device, wanted = opts.pop("device", "cpu"), opts.pop("engine", "auto")
    decoder = open_decoder(model_path, wanted=wanted, device=device, precision=opts.get("precision", "fp32"))
    return BeamSearchMiner(decoder, **opts)


def load_beam_weights(miner: BeamSearchMiner, state_dict: Any, *, version: int = 0) -> None:
    """Published weights into a ``gec_beam`` miner: the torch module's, or a CTranslate2 model converted for
    ``version`` (once per version; miners on one node share the converted folder)."""
    if isinstance(miner.module, torch.nn.Module):  # BaseMiner.module: the scorer
        load_module(miner, state_dict, version=version)
    else:
        miner.module.load_state_dict(state_dict, version=version)


GEC_BEAM = register_miner("gec_beam", build=build_beam_miner, load=load_beam_weights)
