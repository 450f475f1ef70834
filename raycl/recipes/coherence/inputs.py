"""The coherence run's inputs: empty splits filled with the built-in corpus, every evaluation file read once by the
driver before Ray starts, and the permuted training set built from documents as the paper does (or read from a
pairs file as given)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from raycl.config.tasks.coherence import BuiltinCoherenceSection, CoherenceConfig
from raycl.data.builtin import with_builtin
from raycl.data.coherence import CoherenceItem, read_annotations, read_pairs, read_training_set
from raycl.data.coherence_corpus import write_builtin_corpus
from raycl.errors import UserError, at


def with_data(cfg: CoherenceConfig, data_dir: Path) -> tuple[CoherenceConfig, list[str]]:
    """Fill every empty ``data`` split with the built-in corpus (written once into ``data_dir``); the built-in test
    sets come with their annotations where none are given."""
    keys = ("train", "dev", "test", *(() if cfg.data.test else ("annotations",)))
    cfg, filled = with_builtin(cfg, keys, lambda: _builtin(cfg.data.builtin, data_dir))
    return cfg, [k for k in filled if k != "annotations"]


def _builtin(b: BuiltinCoherenceSection, data_dir: Path) -> dict[str, Any]:
    """The built-in corpus's files by ``data`` key."""
    sizes = {"train": b.train, "dev": b.dev, "test": b.test, "intrusion": b.intrusion, "lmvlm": b.lmvlm}
    files = {k: str(f) for k, f in write_builtin_corpus(data_dir, seed=b.seed, sizes=sizes).items()}
    tests = {"permuted": [files["test"]], "intrusion": [files["intrusion"]], "lmvlm": [files["lmvlm"]]}
    annotations = {"lmvlm": files["lmvlm_annotations"]}
    return {"train": [files["train"]], "dev": [files["dev"]], "test": tests, "annotations": annotations}


def training_items(cfg: CoherenceConfig, *, shuffle: bool | None = None) -> list[CoherenceItem]:
    """The training set (:func:`read_training_set`): each item of a document gets ``max(num_rank, num_negs)``
    distinct candidate negatives, never repeated across the copies of a positive. Shuffled once with
    ``optim.seed`` when ``shuffle`` (default ``optim.shuffle``: the momentum model's ``random.seed(100)``) —
    :func:`in_training_order`, which each trial applies to the file order."""
    m = cfg.mining
    items = read_training_set(cfg.data.train, num_negs=max(m.num_rank, m.num_negs), **vars(cfg.data.permute))
    return in_training_order(cfg, items) if (cfg.optim.shuffle if shuffle is None else shuffle) else items


def in_training_order(cfg: CoherenceConfig, items: list[CoherenceItem]) -> list[CoherenceItem]:
    """The items in the order a run trains on them: shuffled once with ``optim.seed`` when ``optim.shuffle``
    (the released momentum script), else as read (the pairwise and contrastive scripts)."""
    if cfg.optim.shuffle:
        items = list(items)
        random.Random(cfg.optim.seed).shuffle(items)
    return items


def check_data(cfg: CoherenceConfig) -> dict[str, int]:
    """Read every file in the driver: a malformed one fails here (one line, exit 2), not in a worker; the counts
    include the training items."""
    counts = {"dev": sum(len(read_pairs(s)) for s in cfg.data.dev)}
    for name, specs in cfg.data.test.items():
        counts[f"test/{name}"] = sum(len(read_pairs(s)) for s in specs)
    for name, path in cfg.data.annotations.items():
        if name not in cfg.data.test:
            raise UserError(
                f"data.annotations.{name}: no test set named {name!r} (data.test has "
                f"{', '.join(cfg.data.test) or 'none'})"
            )
        coders = read_annotations(path)
        if len(coders[0]) != counts[f"test/{name}"]:
            raise UserError(
                f"{at(path)}: {len(coders[0])} labels per coder for {counts[f'test/{name}']} pairs "
                f"in data.test.{name}, expected one label per pair"
            )
    counts["train"] = len(training_items(cfg))
    return counts
