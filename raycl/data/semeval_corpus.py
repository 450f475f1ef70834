"""A small built-in SemEval-2022 Task 2 set, written for raycl, in the official CSV layouts.

25 English and 6 Portuguese multiword expressions (:mod:`raycl.data.semeval_lexicon` holds the words), each
with two idiomatic and two literal target sentences and its idiomatic and literal meanings. As in the real
data, the MWEs of train_zero_shot, dev and eval are disjoint, and train_one_shot holds one idiomatic and one
literal example of every dev and eval MWE. Context (Previous/Next) comes from small generic pools.

Subtask B replaces the MWE by its correct meaning (sim 1) or its wrong one (an empty gold sim pointing, by
otherID, at the MWE-free pair (correct, wrong)), plus STS rows. STS pairs come from a compositional
generator (subject, action, time; each slot kept, kept as a synonym, or changed) whose 0–5 score is
5·(0.3·subject + 0.5·action + 0.2·time) − 0.3 per synonym swap; they also fill ``sts_pretrain.csv``.
Unlike the real data, eval has a gold file here (``eval_gold.csv`` / ``eval.gold.csv``) so runs can report
test scores. Everything is deterministic in ``seed``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from raycl.data.semeval import (
    IDIOMATIC,
    NON_IDIOMATIC,
    IdiomExample,
    IdiomGold,
    ScoredPair,
    StsGold,
    StsPair,
    write_idiom_gold,
    write_idiom_inputs,
    write_idiom_train,
    write_sts_gold,
    write_sts_inputs,
    write_sts_pretrain,
    write_sts_train,
    write_submission_a,
    write_submission_b,
)
from raycl.data.semeval_lexicon import CONTEXTS, EN_MWES, NAMES, PT_MWES, STS_SLOTS

_STS_WEIGHTS = (0.3, 0.5, 0.2)
_SPLIT_SIZES = {"EN": (15, 5, 5), "PT": (2, 2, 2)}  # MWEs for train_zero_shot, dev, eval


@dataclass(frozen=True)
class _Mwe:
    k: int  # the MWE's number in DataIDs
    mwe: str
    language: str
    idiom: str  # its idiomatic meaning
    literal: str  # its literal meaning
    uses: tuple[tuple[str, int], ...]  # (template, label)

    def usage(self, template: str, label: int, rng: random.Random) -> tuple[str, str, str]:
        """(sentence with the MWE, with the correct meaning, with the wrong meaning) for one use."""
        t = template.replace("{p}", rng.choice(NAMES[self.language]))
        right, wrong = (self.idiom, self.literal) if label == IDIOMATIC else (self.literal, self.idiom)
        return t.replace("{m}", self.mwe), t.replace("{m}", right), t.replace("{m}", wrong)


def _mwes() -> list[_Mwe]:
    table = [(lang, row) for lang, rows in (("EN", EN_MWES), ("PT", PT_MWES)) for row in rows]
    return [
        _Mwe(
            k,
            mwe,
            lang,
            idiom,
            literal,
            tuple([(u, IDIOMATIC) for u in i_uses] + [(u, NON_IDIOMATIC) for u in l_uses]),
        )
        for k, (lang, (mwe, idiom, literal, i_uses, l_uses)) in enumerate(table, start=1)
    ]


def _split(rng: random.Random) -> dict[str, list[_Mwe]]:
    """Disjoint MWE sets for train (zero-shot), dev and eval, each with EN and PT MWEs."""
    out: dict[str, list[_Mwe]] = {"train": [], "dev": [], "eval": []}
    for lang, sizes in _SPLIT_SIZES.items():
        pool = [m for m in _mwes() if m.language == lang]
        rng.shuffle(pool)
        for split, start, n in zip(out, (0, sizes[0], sizes[0] + sizes[1]), sizes, strict=True):
            out[split] += sorted(pool[start : start + n], key=lambda m: m.k)
    return out


def _picks(m: _Mwe, rng: random.Random, per_label: int) -> list[tuple[str, int]]:
    by_label = [[u for u in m.uses if u[1] == label] for label in (IDIOMATIC, NON_IDIOMATIC)]
    return [u for uses in by_label for u in rng.sample(uses, min(per_label, len(uses)))]


def _idiom_examples(
    mwes: Sequence[_Mwe], rng: random.Random, *, prefix: str, variants: int, per_label: int = 2
) -> list[tuple[str, IdiomExample]]:
    """``(DataID, example)`` for Subtask A, grouped by MWE (shuffled within), DataID ``prefix.LANG.k.n``."""
    out = []
    for m in mwes:
        rows = []
        for _ in range(variants):
            for template, label in _picks(m, rng, per_label):
                prev, nxt = (rng.choice(c) for c in CONTEXTS[m.language])
                target = m.usage(template, label, rng)[0]
                rows.append(IdiomExample("", m.language, m.mwe, prev, target, nxt, label))
        rng.shuffle(rows)
        out += [(f"{prefix}.{m.language}.{m.k}.{n}", e) for n, e in enumerate(rows, start=1)]
    return out


def _write_a(out: Path, split: dict[str, list[_Mwe]], rng: random.Random, ids: list[str]) -> dict[str, Path]:
    """The Subtask A files: train (zero-/one-shot), and inputs, gold and submission format of dev and eval."""
    zero = [
        replace(e, id=d, setting="zero_shot")
        for d, e in _idiom_examples(split["train"], rng, prefix="train_zero_shot", variants=2)
    ]
    one = [
        replace(e, id=d, setting="one_shot")
        for d, e in _idiom_examples(
            split["dev"] + split["eval"], rng, prefix="train_one_shot", variants=1, per_label=1
        )
    ]
    paths = {
        "a.train_zero_shot": write_idiom_train(out / "train_zero_shot.csv", zero),
        "a.train_one_shot": write_idiom_train(out / "train_one_shot.csv", one),
    }
    for name in ("dev", "eval"):
        examples = _idiom_examples(split[name], rng, prefix=name, variants=1)
        rows = [(d, replace(e, id=ids.pop())) for d, e in examples]
        paths[f"a.{name}"] = write_idiom_inputs(out / f"{name}.csv", [e for _, e in rows])
        paths[f"a.{name}_gold"] = write_idiom_gold(  # every generated example is labelled: `or 0` only types it
            out / f"{name}_gold.csv", [IdiomGold(e.id, d, e.language, e.label or 0) for d, e in rows]
        )
        paths[f"a.{name}_submission_format"] = write_submission_a(
            out / f"{name}_submission_format.csv", [(e.id, e.language, None, None) for _, e in rows]
        )
    return paths


def sts_pairs(n: int, *, language: str, rng: random.Random) -> list[tuple[str, str, float]]:
    """``n`` generated STS pairs ``(sentence1, sentence2, score in [0, 5])`` (see the module docstring)."""
    template, *slots = STS_SLOTS[language]
    out = []
    for _ in range(n):
        words: tuple[list[str], list[str]] = ([], [])
        score = 5.0
        for slot, weight in zip(slots, _STS_WEIGHTS, strict=True):
            i = j = rng.randrange(len(slot))
            fa, fb = rng.randrange(2), rng.randrange(2)  # plain form or synonym, per side
            if rng.random() < 0.6:  # the slot is kept, maybe as a synonym
                score -= 0.3 * (fa != fb)
            else:
                j = rng.choice([x for x in range(len(slot)) if x != i])
                score -= 5 * weight
            words[0].append(slot[i][fa])
            words[1].append(slot[j][fb])
        out.append((_sts_sentence(template, words[0]), _sts_sentence(template, words[1]), round(max(score, 0), 1)))
    return out


def _sts_sentence(template: str, words: Sequence[str]) -> str:
    text = template.replace("{s}", words[0]).replace("{a}", words[1]).replace("{t}", words[2])
    return text[0].upper() + text[1:]


def _sts_train(mwes: Sequence[_Mwe], rng: random.Random) -> list[StsPair]:
    """train_data.csv rows: (S, correct meaning, sim 1) and (S, wrong meaning, sim None + alternatives)."""
    out = []
    for m in mwes:
        for n, (template, label) in enumerate(m.uses):
            s, right, wrong = m.usage(template, label, rng)
            base = f"train.{m.language.lower()}.{m.k}"
            out += [
                StsPair(f"{base}.{2 * n + 1}", m.language, m.mwe, None, s, right, 1.0),
                StsPair(f"{base}.{2 * n + 2}", m.language, m.mwe, None, s, wrong, None, right, wrong),
            ]
    return out


def _sts_eval(
    name: str, mwes: Sequence[_Mwe], rng: random.Random, ids: list[str], *, n_sts: dict[str, int]
) -> tuple[list[StsPair], list[StsGold]]:
    """dev/eval inputs and gold: per MWE use three rows (S|right: sim 1; S|wrong: otherID; right|wrong: not
    gold), then the language's STS rows (gold sim = score / 5)."""
    pairs, gold = [], []
    for lang in ("EN", "PT"):
        for m in (m for m in mwes if m.language == lang):
            for n, (template, label) in enumerate(m.uses):
                s, right, wrong = m.usage(template, label, rng)
                i1, i2, i3 = ids.pop(), ids.pop(), ids.pop()
                pairs += [
                    StsPair(i1, lang, m.mwe, None, s, right),
                    StsPair(i2, lang, m.mwe, None, s, wrong),
                    StsPair(i3, lang, None, None, right, wrong),
                ]
                gold += [
                    StsGold(i1, f"{name}.{lang}.{m.k}.{2 * n + 1}", lang, 1.0, None),
                    StsGold(i2, f"{name}.{lang}.{m.k}.{2 * n + 2}", lang, None, i3),
                ]
        for n, (s1, s2, score) in enumerate(sts_pairs(n_sts[lang], language=lang, rng=rng), start=1):
            i = ids.pop()
            pairs.append(StsPair(i, lang, None, None, s1, s2))
            gold.append(StsGold(i, f"{name}.{lang}.sts.{n}", lang, round(score / 5, 2), None))
    return pairs, gold


def _write_b(out: Path, split: dict[str, list[_Mwe]], rng: random.Random, ids: list[str]) -> dict[str, Path]:
    paths = {"b.train_data": write_sts_train(out / "train_data.csv", _sts_train(split["train"], rng))}
    for name in ("dev", "eval"):
        pairs, gold = _sts_eval(name, split[name], rng, ids, n_sts={"EN": 16, "PT": 8})
        paths[f"b.{name}"] = write_sts_inputs(out / f"{name}.csv", pairs)
        paths[f"b.{name}_gold"] = write_sts_gold(out / f"{name}.gold.csv", gold)
        paths[f"b.{name}_submission_format"] = write_submission_b(
            out / f"{name}.submission_format.csv", [(p.id, p.language, None, None) for p in pairs]
        )
    sizes = {"train": {"EN": 160, "PT": 80}, "dev": {"EN": 30, "PT": 15}, "test": {"EN": 30, "PT": 15}}
    pretrain = [
        ScoredPair(split_name, lang, s1, s2, score)
        for split_name, per_lang in sizes.items()
        for lang, n in per_lang.items()
        for s1, s2, score in sts_pairs(n, language=lang, rng=rng)
    ]
    paths["b.sts_pretrain"] = write_sts_pretrain(out / "sts_pretrain.csv", pretrain)
    return paths


def write_builtin_semeval(out_dir: str | Path, *, seed: int) -> dict[str, Path]:
    """Write the built-in SemEval-2022 Task 2 set under ``out_dir`` (each file atomically).

    Returns ``{key: path}`` with keys ``a.train_zero_shot``, ``a.train_one_shot``, ``a.dev``, ``a.dev_gold``,
    ``a.dev_submission_format``, ``a.eval``, ``a.eval_gold``, ``a.eval_submission_format`` (in
    ``out_dir/SubTaskA``) and ``b.train_data``, ``b.dev``, ``b.dev_gold``, ``b.dev_submission_format``, the
    same for ``b.eval``, and ``b.sts_pretrain`` (in ``out_dir/SubTaskB``).
    """
    rng = random.Random(seed)
    split = _split(rng)
    ids = [str(i) for i in rng.sample(range(100, 100_000), 2_000)]  # unique 5-digit-ish IDs, as the real data
    out = Path(out_dir)
    return _write_a(out / "SubTaskA", split, rng, ids) | _write_b(out / "SubTaskB", split, rng, ids)


# the data keys of the official splits (dev, eval), in the order a run names those it fills
OFFICIAL_KEYS = tuple(
    f"{split}{file}" for split in ("dev", "eval") for file in ("", "_gold", "_submission_format")
)


def semeval_files(out_dir: str | Path, subtask: str, *, seed: int) -> dict[str, str]:
    """The built-in set's files of one subtask (``a`` or ``b``) by their ``data`` key (``dev_gold``, …), written
    by :func:`write_builtin_semeval`."""
    files = write_builtin_semeval(out_dir, seed=seed).items()
    return {k.removeprefix(f"{subtask}."): str(p) for k, p in files if k.startswith(f"{subtask}.")}
