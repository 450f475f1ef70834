"""SemEval-2022 Task 2 Subtask B: idiom-aware sentence embeddings (ZhichunRoad: Cui, Xiong, Wang 2022), as the
released code runs it.

The run, as the driver (``raycl.driver``) runs it with this recipe::

    1. data      official CSVs (or the built-in set), raycl's STS pre-training pairs          check_data()
    2. model     the preset's encoder with every MWE as one token, + cross-attention          base_model()
    3. train     per trial, on the one loop (worker.py):                                       train_one()
                   pre_train: STS pairs, MSE of the cross-attended cosine + λ·InfoNCE (MoCo queue), keep best
                   fine_tune: train_data.csv, 'None' rows labelled by the pre-trained model, keep best on dev
    4. select    dev Spearman (ALL, EN+PT) of the trial's final setting over the sweep (λ, τ, Q, m)
    5. report    Table 5's ladder (baselines at the best point), Fig. 5, submissions            report.py

Each trial writes ``dev.submission.csv`` and ``eval.submission.csv`` in the official layout (pre_train rows from
the pre-trained model, fine_tune rows from the fine-tuned one) under ``trials/<id>/``; the best trial's are
copied to the run folder.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from raycl import storage
from raycl.config import Space
from raycl.configs.sts import StsConfig
from raycl.data.semeval import (
    read_sts_inputs,
    read_sts_pretrain,
    read_sts_train,
)  # fmt: skip
from raycl.distributed.mining_service import trial_resources
from raycl.distributed.resources import MiningPlan
from raycl.driver import RecipeBase, Run, TrainPoint, fit_job
from raycl.models.sentence_encoder import CONFIG_FILE, build_sentence_encoder
from raycl.recipes.sts import inputs, negatives, refresh, report
from raycl.recipes.sts.worker import StsTask, fits
from raycl.records import TrialOutcome
from raycl.report import copy_atomic
from raycl.training.task import Job


class StsRecipe(RecipeBase):
    task = "sts"

    with_data = staticmethod(inputs.sts_with_data)
    check_data = staticmethod(inputs.sts_check_data)

    # ------------------------------------------------------------------------------------------ 2. model
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
        build_sentence_encoder(m.preset, run.base_model, texts=texts, extra_tokens=inputs.mwe_tokens(cfg),
                               seed=m.seed, checkpoint=checkpoint, max_seq_length=m.max_seq_length)  # fmt: skip

    # ------------------------------------------------------------------------------------------ 3–5.
    def train_points(self, run: Run) -> list[TrainPoint]:
        return [TrainPoint("train", {}, "pre-train → fine-tune")]

    def train_one(self, run: Run, cfg: StsConfig, out_dir: Path, *, name: str, in_tune: bool) -> Any:
        """Both phases of one point (``scaling.num_workers=0``: in-process); with ``mining.dense`` and no
        ``mining.negatives``, the run's pool (mined by the first training that needs it, in its process)."""
        if cfg.mines_dense and not cfg.mining.negatives:
            pool = str(negatives.run_pool(cfg, run.base_model, run.run_dir / "mining"))
            cfg = dataclasses.replace(cfg, mining=dataclasses.replace(cfg.mining, negatives=pool))
        job = Job(StsTask(cfg), str(run.base_model), str(out_dir))
        if cfg.refreshes:  # the pool is version 0; miners refresh it while this trains
            return refresh.train_refreshed(run, cfg, job, out_dir, name=name, in_tune=in_tune)
        return fit_job(run, cfg, job, name=name, in_tune=in_tune)

    @contextmanager
    def shared(self, run: Run, space: Space) -> Iterator[None]:
        """Whether any training of the run refreshes its negatives (its trials then reserve the miners)."""
        run.trials_mine = refresh.refreshes_in(space)
        yield

    def trial_resources(self, run: Run) -> Any:
        refreshing = run.cfg.refreshes or run.trials_mine
        return trial_resources(run.cfg.tune.driver_cpus, refresh.mining_section(run.cfg) if refreshing else None)

    def mining_plan(self, cfg: StsConfig, space: Space) -> MiningPlan:
        return MiningPlan(refresh.mining_section(cfg) if refresh.refreshes_in(space) else None)

    def max_t(self, run: Run) -> int:
        """How many reports a trial makes (ASHA's ``max_t``): one per ``eval_every`` steps and epoch end, + 1."""
        cfg, world, total = run.cfg, max(run.cfg.scaling.num_workers, 1), 1
        for f in fits(cfg):
            n = run.counts["sts_train"] if f.setting == "pre_train" else run.counts["train_data"]
            steps = math.ceil(n // world / cfg.optim.batch_size)  # the pair loader; the sentence loader is longer
            total += f.epochs * (steps // f.eval_every + 1)
        return total

    def best(self, trials: list[TrialOutcome], cfg: StsConfig) -> dict[Any, TrialOutcome]:
        best = report.best_trial(trials, metric=cfg.tune.metric, mode=cfg.tune.mode)
        return {} if best is None else {None: best}

    def export(self, run: Run, best: dict[Any, TrialOutcome]) -> None:
        """The chosen trial's official-format submissions, copied to the run folder."""
        for name in ("dev.submission.csv", "eval.submission.csv"):
            if None in best and (src := run.run_dir / "trials" / best[None].trial_id / name).exists():
                copy_atomic(src, run.run_dir / name)

    def write_report(self, run: Run, space: Space, trials: list[TrialOutcome], extra: list[TrialOutcome]
                     ) -> dict[str, Any]:  # fmt: skip
        return report.write_all(run, space, trials, extra)
