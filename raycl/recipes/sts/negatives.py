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

import os
from pathlib import Path
from typing import TYPE_CHECKING

from raycl.data.semeval import read_sts_pretrain
from raycl.errors import UserError

if TYPE_CHECKING:
    from raycl.config.tasks.sts import StsConfig

ANCHOR, POSITIVE = "anchor", "positive"


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
    """The run's pool for ``cfg``'s pool settings, ``<run>/mining/dense-pool<P>-score<S>/``: mined by the first
    training that needs it; one that comes while it is being mined waits on the lock, then finds it done (the
    miner resumes a finished output without redoing anything)."""
    import fcntl

    m = cfg.mining
    out = mining_dir / f"dense-pool{m.pool}-score{m.positive_min_score:g}"
    mining_dir.mkdir(parents=True, exist_ok=True)
    # never through a link planted at the lock's name (O_NOFOLLOW), never truncating what is there
    fd = os.open(mining_dir / f"{out.name}.lock", os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes (or the process dies)
        return mine_pool(cfg, model, out)


def mine_pool(cfg: StsConfig, model: Path, out: Path) -> Path:
    """A pool (a rerun with the same settings resumes it; the miner's manifest refuses other ones)."""
    from raycl.distributed.dense_api import mine_dense_negatives

    rows, corpus = checked_pairs(cfg)
    m = cfg.mining
    mine_dense_negatives(
        rows,
        str(model),
        ANCHOR,
        POSITIVE,
        corpus=corpus,
        num_negatives=m.pool,
        output_format="labeled-list",
        output_scores=True,
        batch_size=cfg.eval.batch_size,
        verbose=False,
        num_miners=0,
        out=out,
        device="cpu",
    )
    return out


def refreshed_pairs(cfg: StsConfig) -> tuple[list[str], list[str]] | None:
    """``mining.refresh``: the (anchor, positive) rows the miners re-mine; None without it."""
    if not cfg.refreshes:
        return None
    rows, _ = checked_pairs(cfg)
    return [r[ANCHOR] for r in rows], [r[POSITIVE] for r in rows]
