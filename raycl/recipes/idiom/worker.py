"""Subtask A's side of the one training loop (``raycl.training.loop``): one setting, EMA, adversarial training.

A trial trains one setting (``data.setting`` is ``zero_shot`` or ``one_shot`` here): the zero-shot model reads
"Previous Target Next" of train_zero_shot, the one-shot model the (Target, MWE) pairs of train_one_shot followed
by train_zero_shot. AdamW (lr 2e-5, wd 0) with a linear warm-up/decay schedule; the batch (per worker) and seed
are the setting's unless set. Each step, as the released loop::

    loss, logits = forward(); loss.backward()                      # the clean pass (mean cross-entropy)
    adversary.attack_and_backward(forward, clean_logits=logits)    # FGM / PGD / FreeLB / SMART add to .grad
    optimizer.step(); scheduler.step(); ema.update()

With several workers the forward runs through DDP (every backward, the adversarial ones too, averages the
gradients, so every rank perturbs the embeddings alike), while the adversary and the EMA hold the unwrapped
model. After every epoch rank 0 scores dev (official macro-F1, EN+PT) with the EMA weights swapped in and keeps
the best epoch in ``best_model/`` — the EMA weights, as the released code saves them. The closing report
(``final: 1``) holds the official scores of the kept model's dev and eval submissions.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from raycl.adversarial import build_adversarial
from raycl.config.tasks.idiom import IdiomConfig
from raycl.data.semeval import IdiomExample, read_idiom_train
from raycl.memory.ema import EMA
from raycl.models.classifier import encode_batch, load_classifier
from raycl.models.masks import prepared
from raycl.models.tokenizer import load_tokenizer
from raycl.recipes.idiom.evaluation import Evaluator, model_input
from raycl.training.batching import BatchPlan
from raycl.training.optim import build_scheduler, from_section
from raycl.training.task import Batch, Epoch, LoopSettings, Report, StepContext, TaskBase, TrainState, Worker
from raycl.training.timing import Window


def train_examples(cfg: IdiomConfig, setting: str) -> list[IdiomExample]:
    """The setting's training rows: one-shot trains on train_one_shot + train_zero_shot, as upstream."""
    zero = read_idiom_train(cfg.data.train_zero_shot)
    return read_idiom_train(cfg.data.train_one_shot) + zero if setting == "one_shot" else zero


@dataclass(frozen=True)
class IdiomBatch:
    """A collated batch (CPU, then the device): the model's inputs, the labels, the rows it stands for."""

    inputs: dict[str, torch.Tensor]  # input_ids (B, T)[, attention_mask (B, 1, 1, T) where there is padding, …]
    labels: torch.Tensor  # (B,)
    weight: float  # rows of this rank's share (0: an empty share runs one row, so that DDP sees a backward)


@dataclass
class IdiomState(TrainState):
    tokenizer: Any = None
    examples: list[IdiomExample] | None = None
    adversary: Any = None
    evals: Evaluator | None = None  # rank 0

    @property
    def ema(self) -> EMA | None:
        return self.extras.get("ema")


@dataclass(frozen=True)
class IdiomTask(TaskBase):
    shown: ClassVar[tuple[str, ...]] = ("dev_f1",)  # on rank 0's progress line
    evaluator = Evaluator  # rank 0's: the setting's dev macro-F1 (evaluate), its closing submissions (final)
    kept = "dev_f1"  # the released `if f1 > best`: the earliest of equal epochs
    cfg: IdiomConfig

    @property
    def setting(self) -> str:
        return self.cfg.data.setting

    @property
    def settings(self) -> LoopSettings:
        # a BERT-style classifier uses every parameter in every step: no unused-parameter search
        return LoopSettings.from_options(self.cfg.optim, seed=self.cfg.seed(self.setting), ddp=True)

    def load_model(self, path: Path) -> Any:
        return load_classifier(path)[0]

    def build(self, model: Any, w: Worker, progress: dict[str, Any] | None) -> IdiomState:
        cfg, o, a = self.cfg, self.cfg.optim, self.cfg.adversarial
        examples = train_examples(cfg, self.setting)
        total = max(self._plan(len(examples), w).updates(o.epochs, o.update_freq), 1)
        optimizer = from_section(model, o)
        scheduler = build_scheduler(optimizer, "polynomial", warmup=math.ceil(o.warmup_ratio * total), total=total)
        extras = {"ema": EMA(model, decay=cfg.ema.decay)} if cfg.ema.enabled else {}
        adversary = build_adversarial(
            a.method, model, epsilon=a.epsilon, alpha=a.alpha, steps=a.steps, smart_mu=a.smart_mu
        )
        return IdiomState(
            model,
            [optimizer],
            [scheduler],
            dict(progress or {"best_epoch": 0}),
            extras,
            total_updates=total,
            epochs=o.epochs,
            tokenizer=load_tokenizer(w.job.init_model),
            examples=examples,
            adversary=adversary,
        )

    def _plan(self, n: int, w: Worker) -> BatchPlan:
        """The setting's global batches (:class:`BatchPlan`): every rank takes the same number of steps, as DDP
        needs — a share of the last, short global batch may be empty, and the step then runs with weight 0."""
        b, seed = self.cfg.batch_size(self.setting), self.cfg.seed(self.setting)
        return BatchPlan([n], batch_size=b, seed=seed, rank=w.rank, world_size=w.world_size)

    def epoch(self, st: IdiomState, w: Worker, epoch: int, start: int) -> Epoch:
        """This rank's batches of ``epoch`` (from the ``start``-th); dev is scored at the epoch's end."""
        examples = st.examples or []
        plan = self._plan(len(examples), w)
        plan.set_epoch(epoch, start)
        return Epoch(Batch([examples[i] for i in rows]) for (rows,) in plan)

    def collate(self, st: IdiomState, batch: list[IdiomExample]) -> IdiomBatch:
        """Tokenised rows and labels, on the CPU (ahead of the step). An empty share runs one row, weighted 0."""
        weight = float(len(batch))
        batch = batch or (st.examples or [])[:1]
        texts: Any = [model_input(e, self.setting) for e in batch]  # all texts or all pairs: one setting
        enc = encode_batch(
            st.tokenizer,
            texts,
            max_len=self.cfg.model.max_len,
            pad_to_multiple_of=self.settings.pad_to_multiple_of,
        )
        return IdiomBatch(prepared(enc, st.model), torch.tensor([e.label for e in batch]), weight)

    def step(self, st: IdiomState, b: IdiomBatch, ctx: StepContext) -> dict[str, Any]:
        """The clean backward, then the adversarial terms (the loop steps the optimizer, then the EMA). The
        backward is of the batch's summed loss (weight = its rows): ranks' unequal shares average to the global
        batch's mean."""

        def forward() -> tuple[torch.Tensor, torch.Tensor]:
            out = ctx.module(**b.inputs, labels=b.labels)
            return out.loss, out.logits  # (), (B, 2)

        loss, logits = forward()
        ctx.backward(loss, weight=b.weight)
        extra = st.adversary.attack_and_backward(
            forward, clean_logits=logits.detach(), loss_scale=ctx.loss_scale(b.weight)
        )
        return {"loss": loss.detach(), **extra}  # extra: adv/loss (and SMART's adv/kl)

    def after_update(self, st: IdiomState) -> None:
        if st.ema is not None:
            st.ema.update()

    def metrics(self, st: IdiomState, window: Window, rep: Report, w: Worker) -> dict[str, Any]:
        return {
            **window.means(),
            "steps": float(window.updates),
            "epoch": st.progress["epoch"],
            "setting": self.setting,
        }

    def evaluate(self, st: IdiomState, rep: Report, w: Worker) -> dict[str, Any]:
        assert st.evals is not None
        with st.ema.applied() if st.ema is not None else nullcontext():  # EMA off: the live weights
            return dict(st.evals.dev_scores(st.model, st.tokenizer))

    def on_best(self, st: IdiomState, rep: Report, w: Worker) -> dict[str, Any]:
        st.progress["best_epoch"] = st.progress["epoch"]
        return {}

    def save_model(self, st: IdiomState, folder: Path, *, kept: bool) -> None:
        """The EMA weights where EMA is on (the kept model is the average, as the released code saves it); a
        checkpoint saves the live weights (its ``extras`` hold the shadow)."""
        with st.ema.applied() if st.ema is not None and kept else nullcontext():
            st.model.save_pretrained(folder)
        st.tokenizer.save_pretrained(folder)

    def final(self, st: IdiomState, w: Worker) -> dict[str, Any] | None:
        """The closing report: the kept model's dev and eval submissions of this setting, officially scored."""
        metrics: dict[str, Any] = {
            "epoch": st.progress["epoch"],
            "setting": self.setting,
            "best_epoch": st.progress["best_epoch"],
        }
        if st.evals is None:
            return metrics
        kept = self.kept_or_initial(w, "best_model", trained=self.cfg.optim.epochs > 0)  # TaskBase.keep's
        model: Any  # HF's typing of PreTrainedModel.to rejects a device
        model, tokenizer = load_classifier(kept)
        model.to(w.device).eval()
        return {**metrics, **st.evals.final(model, tokenizer, w.out_dir)}
