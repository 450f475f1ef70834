"""Subtask A's inputs: empty data keys filled with the built-in set (the official layout, written into the run's
``data/``) and every file read once by the driver before Ray starts, so that a malformed CSV ends in one line
(file:line), not inside a Ray worker."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from raycl.config.tasks.idiom import IdiomConfig
from raycl.data.builtin import with_builtin
from raycl.data.semeval import (
    A_SUBMISSION_HEADER,
    IdiomExample,
    read_idiom_gold,
    read_idiom_inputs,
    read_idiom_train,
    read_rows,
    with_gold,
)
from raycl.data.semeval_corpus import OFFICIAL_KEYS, semeval_files
from raycl.errors import UserError, at
from raycl.scoring.semeval_splits import official_splits

A_KEYS = ("train_zero_shot", "train_one_shot", *OFFICIAL_KEYS)  # Subtask A's, in the order a run names them


def idiom_with_data(cfg: IdiomConfig, data_dir: Path) -> tuple[IdiomConfig, list[str]]:
    """Fill the empty ``data`` keys with the built-in set (written once into ``data_dir``); a split's optional
    files (gold of eval, format files) are filled only when the split itself is built-in."""
    d = cfg.data
    keys = [k for k in A_KEYS if k.startswith("train") or not getattr(d, k.split("_")[0])]
    return with_builtin(cfg, keys, lambda: semeval_files(data_dir, "a", seed=d.builtin.seed))


def idiom_check_data(cfg: IdiomConfig) -> dict[str, int]:
    """Read every file in the driver: a malformed one fails here (one line, exit 2), not in a worker."""
    d = cfg.data
    counts = {"train_zero_shot": len(read_idiom_train(d.train_zero_shot))}
    if "one_shot" in cfg.settings:
        counts["train_one_shot"] = len(read_idiom_train(d.train_one_shot))
    if counts["train_zero_shot"] + counts.get("train_one_shot", 0) == 0:
        raise UserError(f"data.train_zero_shot: {d.train_zero_shot} has no rows, expected labelled examples")
    for split in official_splits(d, read_idiom_inputs):  # dev and, where given, eval
        if split.gold:  # the same IDs in the same order, as upstream
            with_gold(split.examples, read_idiom_gold(split.gold), name=f"data.{split.name}_gold: {split.gold}")
        counts[split.name] = len(split.examples)
        if split.submission_format:
            _check_format(split.submission_format, split.examples, cfg.settings, split.name)
    return counts


def _check_format(path: str, examples: Sequence[IdiomExample], settings: tuple[str, ...], split: str) -> None:
    """Every input ID has a row per trained setting in the submission format file."""
    rows = {(r[0], r[2]) for _, r in read_rows(path, A_SUBMISSION_HEADER)}
    for e in examples:
        for s in settings:
            if (e.id, s) not in rows:
                raise UserError(f"{at(path)}: no row for ID {e.id} setting {s}; expected the IDs of data.{split}")
