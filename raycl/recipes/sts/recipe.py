"""SemEval-2022 Task 2 Subtask B: idiom-aware sentence embeddings (ZhichunRoad: Cui, Xiong, Wang 2022), as the
released code runs it (docs/recipes/sts.md): per trial one training, pre_train on the STS pairs then fine_tune on
train_data.csv, each keeping its best; Table 5's ladder at the best point; submissions in the official layout.
Dense negatives (docs/dense.md): the run's pool, and with ``mining.refresh`` the trial's miners re-mine it.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from raycl import storage
from raycl.config import MiningSection, Space, set_dotted
from raycl.config.tasks.sts import StsConfig
from raycl.data.semeval import read_sts_inputs, read_sts_pretrain, read_sts_train
from raycl.driver import Miners, MiningPlan, Phase, RecipeBase, Run
from raycl.models.sentence_encoder import CONFIG_FILE, build_sentence_encoder
from raycl.recipes.sts import inputs, negatives
from raycl.recipes.sts.fits import fits
from raycl.recipes.sts.negatives import checked_pairs
from raycl.recipes.sts.report import REPORT
from raycl.recipes.sts.worker import StsTask
from raycl.training.negatives.dense import refresh_options


class StsRecipe(RecipeBase):
    task = "sts"
    exports: tuple[str, ...] = ("dev.submission.csv", "eval.submission.csv")  # the official format's

    with_data = staticmethod(inputs.sts_with_data)
    check_data = staticmethod(inputs.sts_check_data)
    report = REPORT

    def base_model(self, run: Run) -> None:
        """The preset with the MWE tokens (a tiny BERT's BPE is trained on every sentence of the run), or
        ``model.checkpoint``: an HF encoder for the preset, or a SentenceEncoder folder used as it is."""
        m, cfg = run.cfg.model, run.cfg
        checkpoint = storage.fetch(m.checkpoint) if m.checkpoint else None  # a URI: fetched to this node's cache
        if checkpoint and (Path(checkpoint) / CONFIG_FILE).exists():
            run.base_model = Path(checkpoint)
            return
        if (run.base_model / CONFIG_FILE).exists():
            return
        texts = None
        if m.preset == "smoke" and not m.checkpoint:
            d = cfg.data
            pretrain = [p for spec in d.sts_pretrain for p in read_sts_pretrain(spec)]
            rows = read_sts_train(d.train_data) + read_sts_inputs(d.dev) + read_sts_inputs(d.eval)
            texts = [s for p in pretrain for s in (p.sentence1, p.sentence2)]
            texts += [s for p in rows for s in (p.sentence1, p.sentence2, p.alternative_1, p.alternative_2) if s]
        kw: dict[str, Any] = {"seed": m.seed, "checkpoint": checkpoint, "max_seq_length": m.max_seq_length}
        build_sentence_encoder(m.preset, run.base_model, texts=texts, extra_tokens=inputs.mwe_tokens(cfg), **kw)

    def phase(self, run: Run, cfg: StsConfig, out_dir: Path) -> Phase:
        """Both settings of one point in one training (``scaling.num_workers=0``: in-process); with
        ``mining.dense`` and no ``mining.negatives``, the run's pool (mined by the first training that needs it,
        in its process) — refreshed by this training's own miners with ``mining.refresh``."""
        if cfg.mines_dense and not cfg.mining.negatives:
            pool = str(negatives.run_pool(cfg, run.base_model, run.run_dir / "mining"))
            cfg = dataclasses.replace(cfg, mining=dataclasses.replace(cfg.mining, negatives=pool))
        mined = refresh_miners(cfg, out_dir) if cfg.refreshes else None  # the pool is version 0
        return Phase("train", "pre-train → fine-tune", StsTask(cfg), run.base_model, mined)

    def mining_plan(self, cfg: StsConfig, space: Space) -> MiningPlan:
        return MiningPlan(mining_section(cfg) if refreshes_in(space) else None)

    def max_t(self, run: Run) -> int:
        """How many reports a trial makes (ASHA's ``max_t``): one per ``eval_every`` steps and epoch end, + 1."""
        cfg, world, total = run.cfg, max(run.cfg.scaling.num_workers, 1), 1
        for f in fits(cfg):
            n = run.counts["sts_train"] if f.name == "pre_train" else run.counts["train_data"]
            steps = math.ceil(n // world / cfg.optim.batch_size)  # the pair loader; the sentence loader is longer
            total += f.epochs * (steps // f.eval_every + 1)
        return total


# ---------------------------------------------------------------------------------------------- refreshed
KIND = "dense_refresh"  # the miner kind (raycl.distributed.dense_refresh)


def mining_section(cfg: StsConfig) -> MiningSection:
    """The miner pool and stream of a refreshing training (placement, credits, leases)."""
    m = cfg.mining
    shared = {k: getattr(m, k) for k in ("num_miners", "cpus_per_miner", "max_staleness", "task_size")}
    return MiningSection(batch_size=cfg.eval.batch_size, queue_size=max(256, m.task_size), **shared)


def refreshes_in(space: Space) -> bool:
    """Whether any training of the run refreshes: the space's point, a swept ``mining.refresh`` or a baseline."""
    points = [space.config, *(set_dotted(space.config, o, where="baselines") for o in space.baselines.values())]
    return "mining.refresh" in space.search or any(cfg.refreshes for cfg in points)


def miner_options(cfg: StsConfig, work: Path) -> dict[str, Any]:
    """The miners' options: the corpus (written here once), the pool's and the trial's selection."""
    own = {k: getattr(cfg.mining, k) for k in ("pool", "num_negatives", "relative_margin", "absolute_margin")}
    return refresh_options(*checked_pairs(cfg), work, **own, batch_size=cfg.eval.batch_size)


def refresh_miners(cfg: StsConfig, out_dir: Path) -> Miners:
    """A refreshing training's miners: from the base encoder (version 0, the pool's model) they embed the corpus
    into ``<trial>/refresh/v<version>/`` for each weight version (removed when it ends; ``refresh.json`` keeps
    the stream's counts)."""
    work = out_dir / "refresh"
    options, section = miner_options(cfg, work), mining_section(cfg)
    return Miners(KIND, options, section, cfg.pretrain.seed, cfg.mining.source, stats="refresh.json", scratch=work)
