"""Subtask B's inputs: empty data keys filled with the built-in set (the official layout, written into the run's
``data/``) and every file read once by the driver before Ray starts, so that a malformed CSV ends in one line
(file:line), not inside a Ray worker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raycl.config.tasks.sts import StsConfig
from raycl.data.builtin import with_builtin
from raycl.data.semeval import (
    B_GOLD_HEADER,
    B_SUBMISSION_HEADER,
    mwe_token,
    read_rows,
    read_sts_inputs,
    read_sts_pretrain,
    read_sts_train,
)
from raycl.data.semeval_corpus import OFFICIAL_KEYS, semeval_files
from raycl.errors import UserError
from raycl.recipes.sts.negatives import checked_pairs
from raycl.training.negatives.dense import check_pool

B_KEYS = ("train_data", *OFFICIAL_KEYS, "sts_pretrain")  # Subtask B's data keys, in the order a run names them


def sts_with_data(cfg: StsConfig, data_dir: Path) -> tuple[StsConfig, list[str]]:
    """Fill every empty ``data`` key with the built-in set (written once into ``data_dir``); an eval set given
    without its gold stays without one."""
    keys = [k for k in B_KEYS if k != "eval_gold" or not cfg.data.eval]
    return with_builtin(cfg, keys, lambda: _builtin(data_dir, cfg.data.builtin.seed))


def _builtin(data_dir: Path, seed: int) -> dict[str, Any]:
    files: dict[str, Any] = semeval_files(data_dir, "b", seed=seed)
    return {**files, "sts_pretrain": [files["sts_pretrain"]]}


def sts_check_data(cfg: StsConfig) -> dict[str, int]:
    """Read every file in the driver: a malformed one fails here (one line, exit 2), not in a worker."""
    d = cfg.data
    pretrain = [p for spec in d.sts_pretrain for p in read_sts_pretrain(spec)]
    counts = {f"sts_{s}": sum(p.split == s for p in pretrain) for s in ("train", "dev", "test")}
    if counts["sts_train"] < 2 and cfg.pretrain.epochs:
        raise UserError(
            f"data.sts_pretrain: {', '.join(d.sts_pretrain)} has {counts['sts_train']} train "
            "pairs, expected at least 2 (or pretrain.epochs: 0)"
        )
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
    if cfg.mining.negatives:
        counts["dense_anchors"] = check_pool(cfg.mining)
    elif cfg.mines_dense:
        counts["dense_anchors"] = len(checked_pairs(cfg)[0])
    return counts


def mwe_tokens(cfg: StsConfig) -> list[str]:
    """The organisers' single tokens of every MWE in train, dev and eval (the "tokenised" mBERT's new words)."""
    d = cfg.data
    pairs = read_sts_train(d.train_data) + read_sts_inputs(d.dev) + read_sts_inputs(d.eval)
    return sorted({mwe_token(m) for p in pairs for m in (p.mwe1, p.mwe2) if m is not None})
