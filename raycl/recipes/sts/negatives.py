"""Dense hard negatives for the STS recipe's contrastive objective (``mining`` section; docs/recipes/sts.md).

The pool: ``raycl.mine_dense_negatives`` with the base (pre-trained) encoder on the STS training pairs whose
score is ≥ ``mining.positive_min_score`` (anchor sentence 1, positive sentence 2; the corpus is every sentence of
the STS training split), the ``mining.pool`` nearest candidates of each anchor with no margin, in
sentence-transformers' ``labeled-list`` format with scores — mined once per run, in-process, by the first
training that needs it, into ``<run>/mining/dense-pool<P>-score<S>/`` — or a Parquet file/folder given as
``mining.negatives``. Each trial's selection of it by its own margins is its negative source
(:mod:`raycl.training.negatives.dense`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from raycl.data.semeval import read_sts_pretrain
from raycl.errors import UserError
from raycl.training.negatives.dense import ANCHOR, POSITIVE

if TYPE_CHECKING:
    from raycl.config.tasks.sts import StsConfig


def checked_pairs(cfg: StsConfig) -> tuple[list[dict[str, str]], list[str]]:
    """The (anchor, positive) rows to mine — STS training pairs with score ≥ ``positive_min_score``, at least one
    (the driver checks it before anything runs) — and the corpus: every sentence of the STS training split, each
    once."""
    train = [p for spec in cfg.data.sts_pretrain for p in read_sts_pretrain(spec) if p.split == "train"]
    m = cfg.mining
    rows = [{ANCHOR: p.sentence1, POSITIVE: p.sentence2} for p in train if p.score >= m.positive_min_score]
    if not rows:
        raise UserError(
            f"mining.positive_min_score: no STS training pair of {', '.join(cfg.data.sts_pretrain)} "
            f"has a score ≥ {m.positive_min_score}, expected at least one to mine for"
        )
    return rows, list(dict.fromkeys(s for p in train for s in (p.sentence1, p.sentence2)))


def run_pool(cfg: StsConfig, model: Path, mining_dir: Path) -> Path:
    """The run's pool for ``cfg``'s pool settings, ``<run>/mining/dense-pool<P>-score<S>/``
    (:func:`raycl.distributed.dense_api.mine_pool_once`)."""
    from raycl.distributed.dense_api import mine_pool_once

    m = cfg.mining
    out = mining_dir / f"dense-pool{m.pool}-score{m.positive_min_score:g}"
    return mine_pool_once(*checked_pairs(cfg), model, out, pool=m.pool, batch_size=cfg.eval.batch_size)
