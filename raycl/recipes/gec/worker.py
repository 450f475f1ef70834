"""The GEC recipe's side of the one training loop (``raycl.training.loop``): its state, batches and step.

One task serves both training phases of Algorithm 1: ``pretrain`` (step 1: label-smoothed NLL on D_T) and
``finetune`` (step 3: Eq. 5 on D_F with the mined negatives). A step's backward is of its *summed* loss (weight =
its target tokens); the loop sums gradients over ``optim.update_freq`` batches and every worker and divides by the
global token count, as the fairseq trainer does ("sum both terms, then divide by ntokens"), so N workers, or N
accumulated batches, take the same step as one batch N times as large. After every epoch rank 0 decodes dev
(ERRANT F0.5) and, when dev improved, test, keeping ``best_model/``; pretraining keeps its last model in
``model/``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, ClassVar

from raycl.config.tasks.gec import GecConfig
from raycl.data.gec import GecExample, load_examples
from raycl.losses.gec_margin import GecContrastiveLoss
from raycl.models.seq2seq import Seq2SeqScorer
from raycl.recipes.gec import evaluation
from raycl.recipes.gec.evaluation import HYPS_DIR
from raycl.recipes.gec.step import GecBatch, collate, gec_loss
from raycl.records import save_dir_atomic
from raycl.training.batching import BatchPlan, shard, sourced
from raycl.training.negatives import NegativeSource, Place, StaticNegatives
from raycl.training.optim import build_scheduler, from_section
from raycl.training.task import Epoch, Keep, LoopSettings, Report, StepContext, TaskBase, TrainState, Worker


@dataclass(frozen=True)
class Phase:
    """What differs between step 1 and step 3 of Algorithm 1."""

    name: str  # pretrain | finetune
    specs: list[str]
    lr: float
    epochs: int
    batch_size: int
    warmup: int
    label_smoothing: float
    trade_off: float
    max_tokens: int  # the token budget of a batch (0: batches of batch_size sentences)


@dataclass
class GecState(TrainState):
    loss_fn: Any = None  # GecContrastiveLoss
    refs: dict[str, Any] = field(default_factory=dict)  # rank 0 of fine-tuning: dev and test references

    def num_tokens(self, example: GecExample, negatives: list[str]) -> int:
        return num_tokens(self.model.tokenizer, [example], [negatives])[0]


def num_tokens(tokenizer: Any, examples: list[GecExample], negatives: list[list[str]]) -> list[int]:
    """fairseq's ``num_tokens`` of GEC-CL examples: max(source, the target line ``t </s> n1 </s> …``)."""
    texts = [t for ex, negs in zip(examples, negatives, strict=True) for t in (ex.source, ex.target, *negs)]
    lengths = iter([len(ids) for ids in tokenizer(texts)["input_ids"]])
    return [max(next(lengths), sum(islice(lengths, 1 + len(negs)))) for negs in negatives]


@dataclass(frozen=True)
class GecTask(TaskBase):
    """One phase of Algorithm 1 on one worker."""

    shown: ClassVar[tuple[str, ...]] = ("dev_f05", "timing/mine_wait_fraction")  # on rank 0's progress line
    model_class = Seq2SeqScorer
    ratios = {
        "loss": ("loss_sum", "ntokens"),
        "ce_per_token": ("ce", "ntokens"),
        "mml_per_token": ("mml", "ntokens"),
    }

    cfg: GecConfig
    phase: str  # pretrain | finetune

    @property
    def settings(self) -> LoopSettings:
        # the backward is of the loss summed over target tokens: fairseq's first fp16 loss scale, 2⁷
        # compiled: lengths in multiples of 8
        return LoopSettings.from_options(self.cfg.optim, fp16_init_scale=2.0**7, shape_bucket=8)

    @property
    def ph(self) -> Phase:
        c = self.cfg
        if self.phase == "pretrain":
            p = c.pretrain
            args = (p.lr, p.epochs, p.batch_size, p.warmup_updates, p.label_smoothing, 0.0, p.max_tokens)
            return Phase(self.phase, c.data.train, *args)
        o, loss = c.optim, c.loss
        args = (o.lr, o.epochs, o.batch_size, o.warmup_updates, loss.label_smoothing, loss.trade_off, o.max_tokens)
        return Phase(self.phase, c.data.finetune, *args)

    def build(self, model: Any, w: Worker, progress: dict[str, Any] | None) -> GecState:
        cfg, ph = self.cfg, self.ph
        examples = load_examples(ph.specs, annotator=cfg.data.annotator)
        source = self._source(examples, w)
        updates = self._updates(model, examples, source, w)
        optimizer = from_section(model, cfg.optim, lr=ph.lr)
        scheduler = build_scheduler(
            optimizer,
            cfg.optim.scheduler if ph.name == "finetune" else "fixed",
            warmup=ph.warmup,
            total=cfg.optim.total_updates or updates,
        )
        loss_fn = GecContrastiveLoss(
            trade_off=ph.trade_off, margin=cfg.loss.margin, label_smoothing=ph.label_smoothing
        )
        st = GecState(model, [optimizer], [scheduler], dict(progress or {}), total_updates=updates, source=source)
        st.epochs, st.loss_fn = ph.epochs, loss_fn  # 0 epochs (DI): the loop's one report evaluates the base model
        return st

    def _updates(
        self, model: Any, examples: list[GecExample], source: NegativeSource[GecExample], w: Worker
    ) -> int:
        """The phase's optimizer updates, for its schedule: per epoch ⌈the most batches a rank has ÷
        update_freq⌉ (a rank with fewer joins the others' updates; an epoch's end flushes an accumulation). With a
        token budget the batches are counted as the stream cuts them: fairseq's ``num_tokens`` of every example
        with its negatives where they are known before training (step 1, pre-mined ones); mined ones are counted
        as 1 + k + 1 (CL's source) copies of the target line."""
        cfg, ph, n = self.cfg, self.ph, len(examples)
        uf, epochs, budget = cfg.optim.update_freq, ph.epochs, ph.max_tokens
        plan = self._batch_plan(n, w)  # the static source's; the stream's shards have as many
        sizes: list[int] = []
        if budget:
            if isinstance(source, StaticNegatives):
                negs = source.negatives([ex.id for ex in examples], source.version)
            else:
                negs = [[ex.target] * (cfg.mining.k + 1) for ex in examples]
            sizes = num_tokens(model.tokenizer, examples, negs)
        return plan.updates(epochs, uf, sizes=sizes, max_tokens=budget)

    def _source(self, examples: list[GecExample], w: Worker) -> NegativeSource[GecExample]:
        """The job's negative source (the driver's: a stream, the run's n-best, pre-mined ones); a job built
        without one reads the config's (pre-mined or none). Step 1 (NLL) has none."""
        cfg, ph = self.cfg, self.ph
        spec = None
        if ph.name == "finetune" and ph.trade_off > 0 and ph.epochs > 0:
            spec = w.job.negatives if w.job.negatives is not None else cfg.mining.source()
            if spec is None:
                raise RuntimeError("contrastive fine-tuning without a negative stream or mining.negatives")
        plan = self._batch_plan(len(examples), w)  # rows(epoch): this rank's batches, negatives known ahead
        shards = [shard(examples, r, w.world_size) for r in range(w.world_size)]
        return w.session.open_source(spec, Place(w.rank, w.world_size, examples, shards, ph.batch_size, plan.rows))

    def _batch_plan(self, n: int, w: Worker) -> BatchPlan:
        """GEC's global batches: a shuffle an epoch, ranks' empty shares left out (they join the last update)."""
        b, seed = self.ph.batch_size, self.cfg.optim.seed
        return BatchPlan(
            [n], batch_size=b, seed=seed, rank=w.rank, world_size=w.world_size, draw="shuffle", keep_empty=False
        )

    def start(self, st: GecState, w: Worker, *, resumed: bool) -> None:
        if self.phase == "finetune" and w.rank == 0:
            st.refs = evaluation.references(self.cfg)

    def epoch(self, st: GecState, w: Worker, epoch: int, start: int) -> Epoch:
        """The source's pools of ``epoch`` with their negatives (a report at its end, as fairseq validates every
        epoch), each pool cut by the token budget. Negatives mined while training with ``sync_every`` > 0 are read
        in the training thread (the loop asks the source): the staleness rule checks them against the version
        that updates move on."""
        assert start == 0, "GEC reports (and checkpoints) only at an epoch's end"
        rng, budget = random.Random(self.cfg.optim.seed * 1000 + epoch), self.ph.max_tokens
        batches = sourced(st.source, epoch, 0, st.model, max_tokens=budget, size=st.num_tokens, rng=rng)
        return Epoch(batches)

    def collate(self, st: GecState, data: Any) -> GecBatch:
        examples, negatives = data
        return collate(
            examples,
            negatives,
            st.model.tokenizer,
            max_length=self.cfg.model.max_length,
            pad_to_multiple_of=self.settings.pad_to_multiple_of or 1,
        )

    def step(self, st: GecState, batch: GecBatch, ctx: StepContext) -> dict[str, Any]:
        out = gec_loss(st.model, batch, st.loss_fn, passes=self.cfg.loss.passes)
        ntokens = float(out.ntokens)
        ctx.backward(out.loss, weight=ntokens)
        return {"loss": out.loss, "loss_sum": out.loss * ntokens, "ce": out.ce, "mml": out.mml, "ntokens": ntokens}

    def compiled_modules(self, st: GecState) -> list[Any]:
        return [st.model.model]  # the HF model inside the scorer: every pass of the step runs its forward

    def evaluate(self, st: GecState, rep: Report, w: Worker) -> dict[str, Any]:
        return evaluation.evaluate_split(self.cfg, st.model, st.refs["dev"], prefix="dev") if st.refs else {}

    def keep(self, rep: Report, metrics: dict[str, Any]) -> Keep | None:
        return Keep("dev_f05", "best_model") if self.phase == "finetune" else None

    def on_best(self, st: GecState, rep: Report, w: Worker) -> dict[str, Any]:
        # test is decoded only when dev improves: the epoch selected on dev is always one of those
        # the hypotheses kept: the report's sign test compares two rows' test outputs
        return evaluation.evaluate_split(
            self.cfg, st.model, st.refs["test"], prefix="test", hyps_dir=w.out_dir / HYPS_DIR
        )

    def final(self, st: GecState, w: Worker) -> dict[str, Any] | None:
        if self.phase == "pretrain" and w.rank == 0:  # step 1's model, the base of fine-tuning
            save_dir_atomic(st.model.save_pretrained, w.out_dir / "model")
        return None
