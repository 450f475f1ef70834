"""The SemEval-2022 Task 2 runs' inputs: empty data keys filled with the built-in set (official layouts, written
into the run's ``data/``) and every file read once by the driver before Ray starts — Subtask A (``idiom_*``) and
Subtask B (``sts_*``) — so a malformed CSV ends in one line (file:line), not inside a Ray worker."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from raycl.configs.idiom import IdiomConfig
from raycl.configs.sts import StsConfig
from raycl.data.semeval import (
    A_SUBMISSION_HEADER,
    B_GOLD_HEADER,
    B_SUBMISSION_HEADER,
    IdiomExample,
    mwe_token,
    read_idiom_gold,
    read_idiom_inputs,
    read_idiom_train,
    read_rows,
    read_sts_inputs,
    read_sts_pretrain,
    read_sts_train,
    with_gold,
)
from raycl.data.semeval_corpus import write_builtin_semeval
from raycl.errors import UserError, at

# ---------------------------------------------------------------------------------------------- Subtask A
A_KEYS = {"train_zero_shot": "a.train_zero_shot", "train_one_shot": "a.train_one_shot", "dev": "a.dev",
             "dev_gold": "a.dev_gold", "dev_submission_format": "a.dev_submission_format", "eval": "a.eval",
             "eval_gold": "a.eval_gold", "eval_submission_format": "a.eval_submission_format"}  # fmt: skip
SPLIT_OF = {"dev_gold": "dev", "dev_submission_format": "dev", "eval_gold": "eval",
            "eval_submission_format": "eval"}  # fmt: skip


def idiom_with_data(cfg: IdiomConfig, data_dir: Path) -> tuple[IdiomConfig, list[str]]:
    """Fill the empty ``data`` keys with the built-in set (written once into ``data_dir``); a split's optional
    files (gold of eval, format files) are filled only when the split itself is built-in."""
    d = cfg.data
    empty = [k for k in A_KEYS if not getattr(d, k) and not getattr(d, SPLIT_OF.get(k, k))]
    if not empty:
        return cfg, []
    files = write_builtin_semeval(data_dir, seed=d.builtin.seed)
    fill: dict[str, Any] = {k: str(files[A_KEYS[k]]) for k in empty}
    return dataclasses.replace(cfg, data=dataclasses.replace(d, **fill)), empty

def idiom_check_data(cfg: IdiomConfig) -> dict[str, int]:
    """Read every file in the driver: a malformed one fails here (one line, exit 2), not in a worker."""
    d = cfg.data
    counts = {"train_zero_shot": len(read_idiom_train(d.train_zero_shot))}
    if "one_shot" in cfg.settings:
        counts["train_one_shot"] = len(read_idiom_train(d.train_one_shot))
    if counts["train_zero_shot"] + counts.get("train_one_shot", 0) == 0:
        raise UserError(f"data.train_zero_shot: {d.train_zero_shot} has no rows, expected labelled examples")
    for split in ("dev", "eval"):
        if not getattr(d, split):
            continue
        examples = _inputs(getattr(d, split), getattr(d, f"{split}_gold"), f"{split}_gold")
        counts[split] = len(examples)
        if getattr(d, f"{split}_submission_format"):
            _check_format(getattr(d, f"{split}_submission_format"), examples, cfg.settings,
                          f"{split}_submission_format")  # fmt: skip
    return counts

def _inputs(path: str, gold: str, key: str) -> list[IdiomExample]:
    """A dev/eval input file, checked against its gold file (the same IDs in the same order, as upstream)."""
    examples = read_idiom_inputs(path)
    if gold:
        with_gold(examples, read_idiom_gold(gold), name=f"data.{key}: {gold}")
    return examples


def _check_format(path: str, examples: list[IdiomExample], settings: tuple[str, ...], key: str) -> None:
    """Every input ID has a row per trained setting in the submission format file."""
    rows = {(r[0], r[2]) for _, r in read_rows(path, A_SUBMISSION_HEADER)}
    for e in examples:
        for s in settings:
            if (e.id, s) not in rows:
                raise UserError(f"{at(path)}: no row for ID {e.id} setting {s}; expected the IDs of "
                                f"data.{key.removesuffix('_submission_format')}")  # fmt: skip


# ---------------------------------------------------------------------------------------------- Subtask B
B_KEYS = {"train_data": "b.train_data", "dev": "b.dev", "dev_gold": "b.dev_gold",
             "dev_submission_format": "b.dev_submission_format", "eval": "b.eval", "eval_gold": "b.eval_gold",
             "eval_submission_format": "b.eval_submission_format"}  # fmt: skip


def sts_with_data(cfg: StsConfig, data_dir: Path) -> tuple[StsConfig, list[str]]:
    """Fill every empty ``data`` key with the built-in set (written once into ``data_dir``)."""
    d = cfg.data
    empty = [k for k in B_KEYS if not getattr(d, k) and not (k == "eval_gold" and d.eval)]
    if not d.sts_pretrain:
        empty.append("sts_pretrain")
    if not empty:
        return cfg, []
    files = write_builtin_semeval(data_dir, seed=d.builtin.seed)
    fill: dict[str, Any] = {k: str(files[B_KEYS[k]]) for k in empty if k in B_KEYS}
    if "sts_pretrain" in empty:
        fill["sts_pretrain"] = [str(files["b.sts_pretrain"])]
    return dataclasses.replace(cfg, data=dataclasses.replace(d, **fill)), empty

def sts_check_data(cfg: StsConfig) -> dict[str, int]:
    """Read every file in the driver: a malformed one fails here (one line, exit 2), not in a worker."""
    d = cfg.data
    pretrain = [p for spec in d.sts_pretrain for p in read_sts_pretrain(spec)]
    counts = {f"sts_{s}": sum(p.split == s for p in pretrain) for s in ("train", "dev", "test")}
    if counts["sts_train"] < 2 and cfg.pretrain.epochs:
        raise UserError(f"data.sts_pretrain: {', '.join(d.sts_pretrain)} has {counts['sts_train']} train "
                        "pairs, expected at least 2 (or pretrain.epochs: 0)")  # fmt: skip
    train = read_sts_train(d.train_data)
    for pair in train:
        pair.tokenised(upstream_quirk=d.upstream_quirk)  # an MWE missing from its sentence ends here
    counts["train_data"] = len(train)
    for split in ("dev", "eval"):
        pairs = read_sts_inputs(getattr(d, split))
        for pair in pairs:
            pair.tokenised(upstream_quirk=d.upstream_quirk)
        counts[split] = len(pairs)
        list(read_rows(getattr(d, f"{split}_submission_format"), B_SUBMISSION_HEADER))
    counts["dev_gold"] = len(list(read_rows(d.dev_gold, B_GOLD_HEADER)))
    if d.eval_gold:
        counts["eval_gold"] = len(list(read_rows(d.eval_gold, B_GOLD_HEADER)))
    return counts

def mwe_tokens(cfg: StsConfig) -> list[str]:
    """The organisers' single tokens of every MWE in train, dev and eval (the "tokenised" mBERT's new words)."""
    d = cfg.data
    pairs = read_sts_train(d.train_data) + read_sts_inputs(d.dev) + read_sts_inputs(d.eval)
    return sorted({mwe_token(m) for p in pairs for m in (p.mwe1, p.mwe2) if m is not None})
