"""The GEC run's inputs: every empty split filled with the built-in corpus (written as M2 into the run's
``data/``), every file read once by the driver before Ray starts, so a malformed one ends in one line (file:line)
and not inside a Ray worker after minutes of training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raycl.config.tasks.gec import BuiltinGecSection, GecConfig
from raycl.data.builtin import with_builtin
from raycl.data.gec import load_examples, load_references
from raycl.data.gec_corpus import write_builtin_corpus
from raycl.errors import UserError
from raycl.miners.shards import check_negatives, check_references


def with_data(cfg: GecConfig, data_dir: Path) -> tuple[GecConfig, list[str]]:
    """Fill every empty split with the built-in corpus (written as M2 under ``data_dir``), check the rest."""
    # with a checkpoint step 1 is skipped: D_T (train) is not needed
    splits = ("finetune", "dev", "test") if cfg.model.checkpoint else ("train", "finetune", "dev", "test")
    return with_builtin(cfg, splits, lambda: _builtin(cfg.data.builtin, data_dir))


def _builtin(b: BuiltinGecSection, data_dir: Path) -> dict[str, Any]:
    """The built-in corpus's files (M2) by split."""
    sizes = {"n_train": b.n_train, "n_finetune": b.n_finetune, "n_dev": b.n_dev, "n_test": b.n_test}
    files = {k: [str(f)] for k, f in write_builtin_corpus(data_dir, **sizes, seed=b.seed).items()}
    return {**files, "dev": {"builtin": files["dev"]}, "test": {"S": files["test-s"], "G": files["test-g"]}}


def check_data(cfg: GecConfig) -> dict[str, int]:
    """Sentence counts per split; every file is read (a malformed one fails here, not in a worker)."""
    counts = {"train": len(load_examples(cfg.data.train)), "finetune": len(load_examples(cfg.data.finetune))}
    for split, sets in (("dev", cfg.data.dev), ("test", cfg.data.test)):
        for name, specs in sets.items():
            refs = load_references(specs)
            if not refs:
                raise UserError(f"data.{split}.{name}: {', '.join(specs)} holds no sentences, expected some")
            counts[f"{split}/{name}"] = len(refs)
    if counts["finetune"] == 0:
        raise UserError(f"data.finetune: {', '.join(cfg.data.finetune)} holds no sentences, expected D_F")
    if cfg.mining.negatives:
        check_negatives(cfg.mining.negatives)  # bounded as it decodes, before Ray starts
    if cfg.mining.negatives and cfg.mining.false_negatives == "drop":
        check_references(cfg.mining.negatives)  # drop re-filters a mined file by its references column
    return counts
