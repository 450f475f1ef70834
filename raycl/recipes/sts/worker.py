"""Subtask B's side of the one training loop (``raycl.training.loop``): pre-train on STS pairs, then fine-tune.

A trial is a list of *fits* (:mod:`raycl.recipes.sts.fits`), each with fresh AdamW optimisers (no decay on
biases and LayerNorm, as ``fit``) and a linear warm-up/decay schedule; its step (:mod:`raycl.recipes.sts.step`)
a batch of pairs and, when λ > 0, one of sentences; an epoch ends with the shorter of the two loaders.
``loss.joint=sum`` backpropagates L_mse + λ·L_con once (the paper); ``alternate`` steps each objective with its
own optimiser (the released code): the pair batch for optimiser 0, then the sentence batch for optimiser 1.
Gradients are summed over workers and divided by the global batch (no DDP: the model runs several forwards per
step through its own methods).

Every ``eval_every`` steps and at each epoch's end rank 0 predicts the official dev set: pre-training keeps the
model with the best Spearman on the STS dev split (``pre_train_model/``), fine-tuning the one with the best
official dev Spearman (``fine_tune_model/``). Fine-tuning starts from the kept pre-trained model; rows of
train_data.csv with sim 'None' get its cross-attended cosine of (alternative_1, alternative_2). The closing
report (``final: 1``) holds the official scores of both settings' submissions, and alignment/uniformity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from raycl.config.tasks.sts import StsConfig
from raycl.data.semeval import read_sts_train
from raycl.memory.moco import MoCoKeyEncoder
from raycl.models.sentence_encoder import SentenceEncoder
from raycl.recipes.sts import evaluation
from raycl.recipes.sts.fits import Fit, Pair, finetune_pairs, fits, pair_sentences, pretrain_pairs, warmup_steps
from raycl.recipes.sts.negatives import checked_pairs
from raycl.recipes.sts.step import StsBatch, collate, sts_loss
from raycl.training import optim as optimizers
from raycl.training.batching import BatchPlan, Loader
from raycl.training.negatives.dense import open_dense
from raycl.training.optim import build_scheduler
from raycl.training.task import (
    Batch,
    Epoch,
    Keep,
    LoopSettings,
    Report,
    Stage,
    StepContext,
    TaskBase,
    TrainState,
    Worker,
)
from raycl.training.timing import Window


@dataclass
class StsState(TrainState):
    pairs: list[Pair] = field(default_factory=list)  # the current fit's data
    sentences: list[str] = field(default_factory=list)

    @property
    def moco(self) -> MoCoKeyEncoder | None:
        return self.extras.get("moco")


@dataclass(frozen=True)
class StsTask(TaskBase):
    shown: ClassVar[tuple[str, ...]] = ("dev_spearman",)  # on rank 0's progress line
    model_class: ClassVar[Any] = SentenceEncoder
    evaluator: ClassVar[Any] = evaluation.Evaluator  # rank 0's: dev Spearman, the closing submissions
    cfg: StsConfig

    @property
    def settings(self) -> LoopSettings:
        return LoopSettings.from_options(self.cfg.optim, seed=self.cfg.pretrain.seed)

    def build(self, model: SentenceEncoder, w: Worker, progress: dict[str, Any] | None) -> StsState:
        """A fresh run's state, or the checkpoint's fit: its data, optimisers and key encoder (the loop then
        restores their states)."""
        st = StsState(model, [], [], dict(progress or {}), per_rank=("moco",))  # its ring holds this rank's keys
        self._key_encoder(st, w)
        if (c := self.cfg).mines_dense:  # every rank reads the run's pool (a folder all workers share)
            rows = checked_pairs(c)[0] if c.refreshes else None  # mining.refresh: the rows the miners re-mine
            st.source = open_dense(c.mining, w.job.negatives, rows, w)
            if rows is not None:
                st.extras["refresh"] = st.source  # checkpoints keep its version and cadence
        self.build_stages(st, w)
        st.total_updates = sum(
            self._fit_plan(f, n, w).updates(f.epochs, self.cfg.optim.update_freq)
            for f, n in zip(self.stages(), self._fit_sizes(), strict=True)
        )
        return st

    def _fit_sizes(self) -> list[int]:
        """Every fit's pairs (pre-training's STS pairs, fine-tuning's train_data rows)."""
        pre = len(pretrain_pairs(self.cfg, "train")) if self.cfg.pretrain.epochs else 0
        fine = len(read_sts_train(self.cfg.data.train_data)) if self.cfg.finetune.epochs else 0
        return [pre if f.name == "pre_train" else fine for f in self.stages()]

    def _fit_plan(self, fit: Stage, pairs: int, w: Worker) -> BatchPlan:
        """A fit's batch plan: one shuffle of its pairs and, when λ > 0, one of their sentences (the contrastive
        loader), both cut into global batches of ``world_size × batch_size``, of which each rank takes a strided
        share: N workers' i-th step is one worker's i-th batch of N·B (every pair used, the same number of steps
        on every rank; a share of the last, short batch may be empty and then counts with weight 0). Sentence
        batches need two rows a rank (in-batch negatives); the shorter loader ends the epoch, as
        sentence-transformers' ``fit``."""
        loaders = [Loader(pairs)]
        if self.cfg.loss.lam > 0:
            loaders.append(Loader(2 * pairs, min_rows=2 * w.world_size))  # both sentences of every pair
        return BatchPlan(
            loaders, batch_size=self.cfg.optim.batch_size, seed=fit.seed, rank=w.rank, world_size=w.world_size
        )

    def _key_encoder(self, st: StsState, w: Worker) -> None:
        c = self.cfg
        st.extras.pop("moco", None)
        if c.loss.lam > 0 and c.moco.queue_size > 0:
            st.extras["moco"] = MoCoKeyEncoder(
                st.model,
                dim=st.model.hidden_size,
                queue_size=c.moco.queue_size,
                m=c.moco.m,
                update_every_forward=c.moco.update_every_forward,
            ).to(w.device)

    def stages(self) -> list[Fit]:
        """The released code's ``fit`` calls (:func:`raycl.recipes.sts.fits.fits`)."""
        return fits(self.cfg)

    def start_stage(self, st: StsState, w: Worker, k: int, *, resumed: bool) -> None:
        """The fit's data and fresh optimisers and schedules, as every ``fit`` call: one per objective with
        ``alternate``. Fine-tuning's first fit starts from the kept pre-trained model."""
        cfg, o, stages = self.cfg, self.cfg.optim, self.stages()
        fit = stages[k]
        if fit.name == "fine_tune" and not resumed and (k == 0 or stages[k - 1].name == "pre_train"):
            st.model = SentenceEncoder.from_pretrained(self._kept(w, "pre_train")).to(w.device)
            self._key_encoder(st, w)
        if fit.name == "pre_train":
            st.pairs = pretrain_pairs(cfg, "train")
        else:
            labeller = SentenceEncoder.from_pretrained(self._kept(w, "pre_train")).to(w.device)
            st.pairs = finetune_pairs(cfg, labeller.eval())
        st.sentences = pair_sentences(st.pairs) if cfg.loss.lam > 0 else []
        plan = self._fit_plan(fit, len(st.pairs), w)
        # the released warm-up is in sentence-transformers' steps (batches of the global batch): ÷ update_freq
        batches, steps = len(plan), plan.updates(fit.epochs, o.update_freq)
        pb, sb = (math.ceil(len(x) / (w.world_size * o.batch_size)) for x in (st.pairs, st.sentences))  # loaders
        warmup = warmup_steps(cfg, fit, steps=max(batches * fit.epochs, 1), pair_batches=pb, sentence_batches=sb)
        warmup = math.ceil(warmup / o.update_freq)
        n = 2 if self._alternate() else 1
        st.optimizers = [
            optimizers.adamw_no_decay(st.model, lr=o.lr, weight_decay=o.weight_decay) for _ in range(n)
        ]
        st.schedulers = [
            build_scheduler(opt, "polynomial", warmup=warmup, total=max(steps, 1)) for opt in st.optimizers
        ]

    def _alternate(self) -> bool:
        return self.cfg.loss.joint == "alternate" and self.cfg.loss.lam > 0

    def epoch(self, st: StsState, w: Worker, epoch: int, start: int) -> Epoch:
        """The epoch's steps from the ``start``-th batch; a fit's first epoch starts the fit (its seed, data, fresh
        optimisers — and fine-tuning's first, the kept pre-trained model). Reports: sentence-transformers' rule,
        every ``eval_every`` steps of the epoch and at its end."""
        fit, e = self.enter_stage(st, w, epoch)
        cut = self._fit_plan(fit, len(st.pairs), w)
        cut.set_epoch(e)
        batches: list[Batch] = []
        for rows in cut.batches():
            pairs = [st.pairs[i] for i in rows[0]]
            sentences = [st.sentences[i] for i in rows[1]] if len(rows) > 1 else []
            if self._alternate() and sentences:  # one step, two updates: the MSE objective's, then InfoNCE's
                batches += [Batch(("mse", pairs, []), ends_step=False), Batch(("con", [], sentences), optimizer=1)]
            else:
                batches.append(Batch(("joint", pairs, sentences)))
        return Epoch(batches[start:], eval_every=fit.eval_every, info={"setting": fit.name})

    def collate(self, st: StsState, data: Any) -> StsBatch:
        return collate(st.model, data, st.source or {}, pad_to_multiple_of=self.settings.pad_to_multiple_of)

    def step(self, st: StsState, data: StsBatch, ctx: StepContext) -> dict[str, Any]:
        return sts_loss(self.cfg, st.model, st.moco, data, ctx)

    def metrics(self, st: StsState, window: Window, rep: Report, w: Worker) -> dict[str, Any]:
        s, lam = window.sums, self.cfg.loss.lam
        l_mse = s.get("l_mse", 0.0) / max(s.get("n_mse", 0.0), 1.0)
        l_con = s.get("l_con", 0.0) / max(s.get("n_con", 0.0), 1.0)
        return {"loss": l_mse + lam * l_con, "l_mse": l_mse, "l_con": l_con, "setting": rep.info["setting"]}

    def evaluate(self, st: StsState, rep: Report, w: Worker) -> dict[str, Any]:
        assert st.evals is not None
        return dict(st.evals.dev(st.model, setting=rep.info["setting"]))

    def keep(self, rep: Report, metrics: dict[str, Any]) -> Keep | None:
        setting = rep.info["setting"]
        key = "sts_dev_spearman" if setting == "pre_train" and "sts_dev_spearman" in metrics else "dev_spearman"
        return Keep(key, f"{setting}_model", scope=setting)

    def final(self, st: StsState, w: Worker) -> dict[str, Any] | None:
        """Both settings' submissions for dev and eval from the kept models, officially scored."""
        metrics: dict[str, Any] = {"setting": self.cfg.final_setting}
        if st.evals is None:
            return metrics
        models = {s: self._kept(w, s) for s in ("pre_train", "fine_tune")}
        if not self.cfg.finetune.epochs:
            models.pop("fine_tune")
        return {**metrics, **st.evals.final(models, w.out_dir, device=w.device)}

    def _kept(self, w: Worker, setting: str) -> Path:
        """The model kept for ``setting`` (:meth:`keep`), or the initial model where that setting did not train."""
        epochs = self.cfg.pretrain.epochs if setting == "pre_train" else self.cfg.finetune.epochs
        return self.kept_or_initial(w, f"{setting}_model", trained=epochs > 0, scope=setting)
