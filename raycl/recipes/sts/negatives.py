"""Dense hard negatives for the STS recipe's contrastive objective (``mining`` section; docs/recipes/sts.md).

The pool: ``raycl.mine_dense_negatives`` with the base (pre-trained) encoder on the STS training pairs whose
score is ≥ ``mining.positive_min_score`` (anchor sentence 1, positive sentence 2; the corpus is every sentence of
the STS training split), the ``mining.pool`` nearest candidates of each anchor with no margin, in
sentence-transformers' ``labeled-list`` format with scores — mined once per run, in-process, by the first
training that needs it, into ``<run>/mining/dense-pool<P>-score<S>/`` — or a Parquet file/folder given as
``mining.negatives`` (any of ``raycl.mine dense``'s formats but ``labeled-pair``). Each trial then keeps, per
anchor, the first ``mining.num_negatives`` candidates that pass its own margins, with the miner's formulas
(:mod:`raycl.miners.dense`; p the anchor's hardest positive score): ``absolute_margin`` m keeps s ≤ p − m,
``relative_margin`` r keeps s ≤ p − |p|·r. On a pool mined without margins that is what mining with the trial's
margins and ``range_max = mining.pool`` gives, so a sweep over margins and counts mines once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raycl.data.semeval import read_sts_pretrain
from raycl.errors import UserError
from raycl.miners.dense_io import read_anchor_negatives

if TYPE_CHECKING:
    from raycl.config.tasks.sts import StsConfig

ANCHOR, POSITIVE = "anchor", "positive"


def mining_pairs(cfg: StsConfig) -> tuple[list[dict[str, str]], list[str]]:
    """The (anchor, positive) rows to mine — STS training pairs with score ≥ ``positive_min_score`` — and the
    corpus: every sentence of the STS training split, each once."""
    train = [p for spec in cfg.data.sts_pretrain for p in read_sts_pretrain(spec) if p.split == "train"]
    rows = [
        {ANCHOR: p.sentence1, POSITIVE: p.sentence2} for p in train if p.score >= cfg.mining.positive_min_score
    ]
    corpus = list(dict.fromkeys(s for p in train for s in (p.sentence1, p.sentence2)))
    return rows, corpus


def checked_pairs(cfg: StsConfig) -> tuple[list[dict[str, str]], list[str]]:
    """:func:`mining_pairs`, at least one (the driver checks it before anything runs)."""
    rows, corpus = mining_pairs(cfg)
    if not rows:
        raise UserError(
            f"mining.positive_min_score: no STS training pair of {', '.join(cfg.data.sts_pretrain)} "
            f"has a score ≥ {cfg.mining.positive_min_score}, expected at least one to mine for"
        )
    return rows, corpus


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


def check_negatives(cfg: StsConfig) -> int:
    """The driver's check of ``mining.negatives`` (before Ray starts): readable, and scored where a margin is
    set. Returns the anchors it holds."""
    m = cfg.mining
    found = read_anchor_negatives(m.negatives)
    margin = m.relative_margin is not None or m.absolute_margin is not None
    if margin and any(v.scores is None for v in found.values()):
        raise UserError(
            f"mining.negatives: {m.negatives}: no scores, expected them with mining.relative_margin "
            "or mining.absolute_margin (mine with --output-scores)"
        )
    return len(found)


def negatives_for(cfg: StsConfig) -> dict[str, list[str]]:
    """A trial's negatives: ``{anchor: its selected negatives}`` (anchors left with none are left out)."""
    if not cfg.mines_dense:
        return {}
    pool = read_anchor_negatives(cfg.mining.negatives)
    chosen = {a: v.select(cfg.mining, anchor=a) for a, v in pool.items()}
    return {a: n for a, n in chosen.items() if n}


def refresh_anchors(cfg: StsConfig, world_size: int) -> list[list[Any]]:
    """``mining.refresh``: every anchor (with its positives) for every trainer rank, ids unique across ranks
    (each rank's batches hold any sentence, so each rank receives every anchor's refreshed negatives)."""
    from raycl.miners.dense import group_pairs
    from raycl.miners.sources import RefreshAnchor

    rows, _ = checked_pairs(cfg)
    queries, positives, _ = group_pairs([r[ANCHOR] for r in rows], [r[POSITIVE] for r in rows])
    return [
        [
            RefreshAnchor(f"{rank}/{i}", q, tuple(p))
            for i, (q, p) in enumerate(zip(queries, positives, strict=True))
        ]
        for rank in range(world_size)
    ]


def attach_negatives(cfg: StsConfig, st: Any, w: Any) -> None:
    """A worker's negatives into its state (``st.mined``): the trial's selection, or with ``mining.refresh`` a
    mapping that the miners refresh while training (also ``st.extras["refresh"]``: checkpoints keep its version,
    and the worker calls its ``after_update``), handed the stream and the weight store the driver started."""
    st.mined = negatives_for(cfg)
    if not cfg.refreshes:
        return
    from raycl.miners.sources import DenseRefresh
    from raycl.training.negatives import open_refreshed

    if not isinstance(w.job.negatives, DenseRefresh):
        raise RuntimeError(
            "mining.refresh: the training was started without a negative stream (train it through "
            "the recipe's driver, python -m raycl.train / raycl.tune)"
        )
    st.mined = st.source = st.extras["refresh"] = open_refreshed(
        w.job.negatives, st.mined, refresh_anchors(cfg, w.world_size), rank=w.rank, world_size=w.world_size
    )
