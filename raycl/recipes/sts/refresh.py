"""The STS recipe's dense negatives refreshed while training (``mining.refresh``; docs/dense.md#refreshed-while-
training), the driver's part: one training with its own miner pool, negative stream and weight store.

The miners (kind ``dense_refresh``: :mod:`raycl.distributed.dense_refresh`) start from the base encoder (version 0,
the pool's model) and embed the corpus — every sentence of the STS training split and every positive, written once
to ``<trial>/refresh/_corpus.parquet`` — into ``<trial>/refresh/v<version>/`` for each weight version they mine
with; those folders are removed when the training ends (``refresh.json`` keeps the stream's counts). The workers'
side is :func:`raycl.recipes.sts.negatives.attach_negatives`.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

from raycl.config import MiningSection, Space, set_dotted
from raycl.configs.sts import StsConfig
from raycl.distributed.dense_refresh import CORPUS_COLUMN, DENSE_REFRESH
from raycl.distributed.miner_pool import MinerFactory, MinerFaults
from raycl.driver import Run, fit_job, miners
from raycl.files import atomic_file, write_atomic
from raycl.miners.dense import group_pairs
from raycl.recipes.sts.negatives import ANCHOR, POSITIVE, checked_pairs
from raycl.training.task import Job


def mining_section(cfg: StsConfig) -> MiningSection:
    """The miner pool and stream of a refreshing training (placement, credits, leases)."""
    m = cfg.mining
    return MiningSection(batch_size=cfg.eval.batch_size, num_miners=m.num_miners, cpus_per_miner=m.cpus_per_miner,
                         max_staleness=m.max_staleness, task_size=m.task_size, queue_size=max(256, m.task_size))


def refreshes_in(space: Space) -> bool:
    """Whether any training of the run refreshes: the space's point, a swept ``mining.refresh`` or a baseline."""
    cfg = space.config
    return cfg.refreshes or "mining.refresh" in space.search or any(
        set_dotted(cfg, over, where="baselines").refreshes for over in space.baselines.values())


def miner_factory(cfg: StsConfig, model: Path, work: Path, faults: MinerFaults | None = None) -> MinerFactory:
    """The miners' recipe: the base encoder, the corpus (written here once), the pool's and the trial's
    selection; ``faults``: the miner pool's crash switches (tests: ``raycl.testing.faults``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, corpus = checked_pairs(cfg)
    _, positives, max_positives = group_pairs([r[ANCHOR] for r in rows], [r[POSITIVE] for r in rows])
    texts = list(dict.fromkeys([*corpus, *(p for ps in positives for p in ps)]))
    work.mkdir(parents=True, exist_ok=True)
    with atomic_file(work / "_corpus.parquet", "wb") as f:
        pq.write_table(pa.table({CORPUS_COLUMN: pa.array(texts, pa.string())}), f)
    m = cfg.mining
    return MinerFactory(DENSE_REFRESH, str(model), {
        "corpus": str(work / "_corpus.parquet"), "work_dir": str(work), "pool": m.pool,
        "max_positives": max_positives, "num_negatives": m.num_negatives, "relative_margin": m.relative_margin,
        "absolute_margin": m.absolute_margin, "batch_size": cfg.eval.batch_size}, faults=faults)  # fmt: skip


def train_refreshed(run: Run, cfg: StsConfig, job: Job, out_dir: Path, *, name: str, in_tune: bool) -> Any:
    """One training while its miners refresh the negatives; Ray's Result."""
    work = out_dir / "refresh"
    factory, section = miner_factory(cfg, run.base_model, work), mining_section(cfg)
    with miners(factory, section, world_size=cfg.scaling.num_workers, seed=cfg.pretrain.seed) as service:
        job = dataclasses.replace(job, negatives=cfg.mining.source(stream=service.stream, store=service.store))
        result = fit_job(run, cfg, job, name=name, in_tune=in_tune)
        write_atomic(out_dir / "refresh.json", json.dumps(service.stats()))
    for version in work.glob("v*"):  # the corpus' embeddings of every version mined with
        shutil.rmtree(version, ignore_errors=True)
    return result
