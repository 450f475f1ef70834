"""Built-in synthetic GEC corpus: grammatical English sentences with injected, ERRANT-typed errors.

The demo and the tests run on it offline. A small grammar (subjects with relative clauses, nine tense/aspect
forms, transitive/intransitive/prepositional/control verbs, copulas, fronted and trailing subordinate
clauses, coordination) over a vocabulary of a few hundred words makes sentences of 6-25 spaCy-style tokens
(punctuation split off, ``does n't``, ``ca n't``). The error injector then corrupts a sentence the way the
M2 data are written: the ``S`` line holds the *erroneous* sentence and the edits correct it, so annotator 0's
:meth:`~raycl.data.m2.M2Sentence.target` is the clean sentence. Error types: M:/R:/U:DET, R:PREP,
R:VERB:SVA, R:NOUN:NUM, R:VERB:FORM, R:SPELL, M:/U:PUNCT, R:WO. Density (share of erroneous sentences,
edits per erroneous sentence) is set per split; presets mimic BEA-train (:data:`HIGH_DENSITY`) and CWEB
(:data:`LOW_DENSITY`, :data:`LOW_DENSITY_G`). Deterministic by seed (one ``random.Random``, no global state).
"""

from __future__ import annotations

import random
from bisect import bisect
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import TypedDict

from raycl.data import gec_grammar as g
from raycl.data.m2 import NOOP, Edit, M2Sentence, write_m2


@dataclass(frozen=True)
class Density:
    """Error density of a split: share of erroneous sentences, mean edits per erroneous sentence."""

    error_rate: float
    edits_per_error: float


# BEA-2019 train (Lang-8 + FCE + W&I): about half the sentences need an edit, 2-3 edits each.
HIGH_DENSITY = Density(error_rate=0.50, edits_per_error=2.6)
# CWEB (Flachs et al., 2020): web text is mostly correct; CWEB-G (general) a little denser than CWEB-S.
LOW_DENSITY = Density(error_rate=0.22, edits_per_error=1.6)
LOW_DENSITY_G = Density(error_rate=0.25, edits_per_error=1.85)

# Relative frequency of each injected type (DET, PREP and PUNCT are among the commonest ERRANT types in BEA).
_TYPE_WEIGHTS = {
    "M:DET": 12,
    "R:DET": 7,
    "U:DET": 6,
    "R:PREP": 13,
    "R:VERB:SVA": 12,
    "R:NOUN:NUM": 11,
    "R:VERB:FORM": 9,
    "R:SPELL": 13,
    "M:PUNCT": 9,
    "U:PUNCT": 4,
    "R:WO": 4,
}
_KIND_TYPE = {
    "prep": "R:PREP",
    "sva": "R:VERB:SVA",
    "noun": "R:NOUN:NUM",
    "form": "R:VERB:FORM",
    "comma": "M:PUNCT",
    "end": "M:PUNCT",
}
_SPELLABLE = {"noun", "adj", "adv", "adv_manner", "verb", "sva", "form"}
# Other valid corrections a second annotator may prefer (articles and prepositions often have several).
_PREP_VARIANTS = {"in": "at", "at": "in", "on": "in", "about": "of", "near": "by", "during": "in"}
P_MISS, P_VARIANT = 0.12, 0.10
# D_F's second annotator leaves this share of annotator 0's edited sentences unchanged: CWEB's dev data measure
# 46% (CWEB-G) and 57% (CWEB-S) (issue 24); the built-in rate is set to about their mean, not found in any data.
P_UNCHANGED = 0.5


@dataclass(frozen=True)
class _Error:
    """Clean tokens ``[start, end)`` written as ``wrong`` by the learner; ``variant``: another valid fix."""

    start: int
    end: int
    wrong: tuple[str, ...]
    type: str
    variant: str | None = None


def _typo(word: str, rng: random.Random) -> str:
    """A realistic typo: two letters swapped, a letter dropped, or a letter doubled (never the first)."""
    for _ in range(8):
        i = rng.randrange(1, len(word) - 1)
        op = rng.randrange(3)
        if op == 0 and word[i] != word[i + 1]:
            return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
        if op == 1 and word[i] != word[i - 1]:
            return word[:i] + word[i + 1 :]
        if op == 2:
            return word[: i + 1] + word[i:]
    return word[:-1] + word[-1] * 2


def _sites(toks: Sequence[g.Tok]) -> dict[str, list[int]]:
    """Clean token positions where each error type can be injected (never position 0: it is capitalised)."""
    sites: dict[str, list[int]] = {t: [] for t in _TYPE_WEIGHTS}
    kind_type = _KIND_TYPE
    for i in range(1, len(toks)):
        tok, nxt = toks[i], toks[i + 1] if i + 1 < len(toks) else None
        if tok.kind in kind_type and (tok.alts or tok.kind in ("comma", "end")):
            sites[kind_type[tok.kind]].append(i)
        if tok.kind == "det":
            sites["R:DET"].append(i)
            if tok.droppable:
                sites["M:DET"].append(i)
        if tok.bare:
            sites["U:DET"].append(i)
        if tok.kind in _SPELLABLE and len(tok.text) >= 4 and tok.text.isalpha():
            sites["R:SPELL"].append(i)
        if nxt is not None and (
            (tok.kind, nxt.kind) == ("adj", "noun") or (tok.kind == "adv" and nxt.kind in ("sva", "verb"))
        ):
            sites["R:WO"].append(i)
        if i >= 2 and nxt is not None and tok.kind not in ("comma", "end") and toks[i - 1].kind != "comma":
            sites["U:PUNCT"].append(i)
    return {t: s for t, s in sites.items() if s}


def _make_error(kind: str, i: int, toks: Sequence[g.Tok], rng: random.Random) -> _Error:
    tok = toks[i]
    if kind in ("M:DET", "R:DET"):
        variant = None
        if tok.droppable:  # "a" and "the" are both fine for a second annotator
            variant = "the" if tok.text != "the" else g.an(toks[i + 1].text)
        wrong = () if kind == "M:DET" else (g.pick(rng, tok.alts),)
        return _Error(i, i + 1, wrong, kind, variant)
    if kind == "M:PUNCT":
        return _Error(i, i + 1, (), kind)
    if kind == "U:DET":
        return _Error(i, i, (g.pick(rng, ("the", g.an(tok.text.lower()))),), kind)
    if kind == "U:PUNCT":
        return _Error(i, i, (",",), kind)
    if kind == "R:WO":
        return _Error(i, i + 2, (toks[i + 1].text, tok.text), kind)
    if kind == "R:SPELL":
        return _Error(i, i + 1, (_typo(tok.text, rng),), kind)
    variant = _PREP_VARIANTS.get(tok.text) if kind == "R:PREP" else None
    return _Error(i, i + 1, (g.pick(rng, tok.alts),), kind, variant)


def _poisson(lam: float, rng: random.Random) -> int:
    # Knuth's method; lam is small (< 3), so a handful of draws.
    limit, k, p = pow(2.718281828459045, -lam), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def _inject(toks: Sequence[g.Tok], n_errors: int, rng: random.Random) -> list[_Error]:
    """Up to ``n_errors`` non-overlapping errors, each at least one untouched token away from the others
    (adjacent edits would be merged by ERRANT and then read as a different type)."""
    sites = _sites(toks)
    kinds = list(sites)
    cum = list(accumulate(_TYPE_WEIGHTS[k] for k in kinds))
    used: set[int] = set()
    errors: list[_Error] = []
    for _ in range(n_errors * 4):
        if len(errors) == n_errors or not kinds:
            break
        kind = kinds[bisect(cum, rng.random() * cum[-1])]
        i = g.pick(rng, sites[kind])
        stop = i + 2 if kind == "R:WO" else i + 1  # tokens the error touches (an insertion: the next one)
        if used.isdisjoint(range(i - 1, stop + 1)):
            used.update(range(i, stop))
            errors.append(_make_error(kind, i, toks, rng))
    return sorted(errors, key=lambda e: e.start)


def _edits(
    clean: Sequence[str], errors: Sequence[_Error], *, annotators: int, rng: random.Random
) -> tuple[list[str], tuple[Edit, ...]]:
    """The erroneous tokens and the M2 edits (over them) that correct them back to ``clean``."""
    wrong: list[str] = []
    edits: list[Edit] = []
    variants: list[Edit | None] = []
    pos = 0
    for err in errors:
        wrong += clean[pos : err.start]
        start = len(wrong)
        wrong += err.wrong
        edits.append(Edit(start, len(wrong), err.type, " ".join(clean[err.start : err.end]), 0))
        variants.append(None if err.variant is None else Edit(start, len(wrong), err.type, err.variant, 1))
        pos = err.end
    wrong += clean[pos:]
    out = edits or [Edit(-1, -1, NOOP, "-NONE-", 0)]
    if annotators == 2:
        out += _second_annotator(edits, variants, rng)
    return wrong, tuple(out)


def _second_annotator(edits: Sequence[Edit], variants: Sequence[Edit | None], rng: random.Random) -> list[Edit]:
    """Annotator 1 agrees on most edits, sometimes misses one or prefers another valid correction."""
    second: list[Edit] = []
    for edit, variant in zip(edits, variants, strict=True):
        r = rng.random()
        if r < P_MISS:
            continue
        if r < P_MISS + P_VARIANT and variant is not None:
            second.append(variant)
        else:
            second.append(Edit(edit.start, edit.end, edit.type, edit.correction, 1))
    return second or [Edit(-1, -1, NOOP, "-NONE-", 1)]


def with_second_annotator(sentences: Sequence[M2Sentence], *, p_unchanged: float, seed: int) -> list[M2Sentence]:
    """``sentences`` (annotator 0's) with an annotator 1 who leaves an edited sentence unchanged (a noop) with
    probability ``p_unchanged`` and otherwise agrees with annotator 0, but for an edit missed with ``P_MISS``.
    Its own random stream: annotator 0's sentences stay those of the one-annotator corpus."""
    rng = random.Random(seed)
    out = []
    for sent in sentences:
        edits = sent.edits_of(0)
        ones = (
            []
            if rng.random() < p_unchanged
            else [Edit(e.start, e.end, e.type, e.correction, 1) for e in edits if rng.random() >= P_MISS]
        )
        out.append(M2Sentence(sent.source, (*sent.edits, *(ones or [Edit(-1, -1, NOOP, "-NONE-", 1)]))))
    return out


def generate_pairs(
    n: int, *, error_rate: float, edits_per_error: float, annotators: int = 1, seed: int
) -> list[tuple[str, M2Sentence]]:
    """Like :func:`generate`, each M2 sentence with the clean sentence it was made from."""
    if annotators not in (1, 2):
        raise ValueError(f"annotators must be 1 or 2, got {annotators}")
    if not 0.0 <= error_rate <= 1.0 or edits_per_error < 1.0:
        raise ValueError(
            f"need 0 <= error_rate <= 1 and edits_per_error >= 1, got {error_rate} and {edits_per_error}"
        )
    rng = random.Random(seed)
    out: list[tuple[str, M2Sentence]] = []
    for _ in range(n):
        n_errors = 1 + _poisson(edits_per_error - 1.0, rng) if rng.random() < error_rate else 0
        # Room for the errors (each needs a free token around it); sentences with many errors are long ones.
        toks = g.sentence(rng, min_len=max(6, min(3 * n_errors, 20)))
        errors = _inject(toks, n_errors, rng) if n_errors else []
        clean = [t.text for t in toks]
        wrong, edits = _edits(clean, errors, annotators=annotators, rng=rng)
        out.append((" ".join(clean), M2Sentence(" ".join(wrong), edits)))
    return out


def generate(
    n: int, *, error_rate: float, edits_per_error: float, annotators: int = 1, seed: int
) -> list[M2Sentence]:
    """``n`` sentences as M2: the S line is the (possibly) erroneous sentence, annotator 0's edits restore
    the clean one. A sentence is erroneous with probability ``error_rate`` and then gets
    1 + Poisson(``edits_per_error`` - 1) edits (fewer in the rare sentence without enough free sites), so
    :func:`stats` lands within a few percent of the requested density. With ``annotators=2`` annotator 1
    misses an edit with probability ``P_MISS`` and picks another valid correction with ``P_VARIANT``."""
    pairs = generate_pairs(
        n, error_rate=error_rate, edits_per_error=edits_per_error, annotators=annotators, seed=seed
    )
    return [m2 for _, m2 in pairs]


class CorpusStats(TypedDict):
    """Error density of a corpus as one annotator sees it (a dict, so reports can format it directly)."""

    sentences: int
    erroneous: int  # sentences with at least one edit
    edits: int
    err_rate: float  # erroneous / sentences
    err_pct: float  # 100 * err_rate
    edits_per_error: float  # edits / erroneous: the density within erroneous sentences
    by_type: dict[str, int]


def stats(sentences: Sequence[M2Sentence], *, annotator: int = 0) -> CorpusStats:
    """Share of sentences with at least one edit by ``annotator``, and edits per such sentence."""
    by_type: Counter[str] = Counter()
    erroneous = 0
    for sent in sentences:
        edits = sent.edits_of(annotator)
        erroneous += bool(edits)
        by_type.update(e.type for e in edits)
    n, n_edits = len(sentences), sum(by_type.values())
    err_rate = erroneous / max(n, 1)
    return CorpusStats(
        sentences=n,
        erroneous=erroneous,
        edits=n_edits,
        err_rate=err_rate,
        err_pct=100 * err_rate,
        edits_per_error=n_edits / max(erroneous, 1),
        by_type=dict(by_type),
    )


def write_builtin_corpus(
    out_dir: str | Path, *, n_train: int, n_finetune: int, n_dev: int, n_test: int, seed: int
) -> dict[str, Path]:
    """Write the demo's GEC data (each file atomically) and return ``{split: path}``.

    ``train`` is BEA-like (high density, 1 annotator); ``finetune`` CWEB-like, with a second annotator who leaves
    :data:`P_UNCHANGED` of the first one's edited sentences unchanged (as CWEB's do: the false negatives of
    contrastive mining, :mod:`raycl.miners.false_negatives`); ``dev``, ``test-s`` and ``test-g`` CWEB-like with 2
    annotators, ``test-g`` a little denser (like CWEB-G).
    """
    plan = {
        "train": (n_train, HIGH_DENSITY, 1),
        "finetune": (n_finetune, LOW_DENSITY, 1),
        "dev": (n_dev, LOW_DENSITY, 2),
        "test-s": (n_test, LOW_DENSITY, 2),
        "test-g": (n_test, LOW_DENSITY_G, 2),
    }
    out_dir = Path(out_dir)
    paths: dict[str, Path] = {}
    for k, (split, (n, density, annotators)) in enumerate(plan.items()):
        sentences = generate(
            n,
            error_rate=density.error_rate,
            edits_per_error=density.edits_per_error,
            annotators=annotators,
            seed=seed * 1009 + k,
        )  # distinct stream per split
        if split == "finetune":
            sentences = with_second_annotator(sentences, p_unchanged=P_UNCHANGED, seed=seed * 1009 + 100 + k)
        paths[split] = out_dir / f"{split}.m2"
        write_m2(paths[split], sentences)
    return paths
