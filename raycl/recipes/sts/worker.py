"""Subtask B's side of the one training loop (``raycl.training.loop``): pre-train on STS pairs, then fine-tune.

A trial is a list of *fits*, as the released code calls sentence-transformers' ``fit``: one pre-training fit of
``pretrain.epochs`` epochs, then ``finetune.epochs`` fits of one epoch each (warm-up recomputed each time). Each
fit has fresh AdamW optimisers (no decay on biases and LayerNorm, as ``fit``) and a linear warm-up/decay
schedule. A step is a batch of pairs (MSE of the cross-attended cosine against score/5) and, when λ > 0, a
batch of sentences for InfoNCE (SimCSE views through dropout, mean-pooled encoder outputs, cross-attention
bypassed, MoCo keys as extra negatives); an epoch ends with the shorter of the two loaders. ``loss.joint=sum``
backpropagates L_mse + λ·L_con once (the paper); ``alternate`` steps each objective with its own optimiser (the
released code): the feed yields the pair batch for optimiser 0, then the sentence batch for optimiser 1.
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from raycl.configs.sts import StsConfig
from raycl.data.semeval import StsPair, read_sts_pretrain, read_sts_train
from raycl.losses.infonce_queue import InfoNCEQueueLoss, joint_loss
from raycl.losses.mse_cosine import MSECosineLoss
from raycl.memory.moco import MoCoKeyEncoder
from raycl.models.sentence_encoder import SentenceEncoder
from raycl.recipes.sts import evaluation
from raycl.recipes.sts.negatives import attach_negatives
from raycl.training import optim as optimizers
from raycl.training.batching import BatchPlan, Loader
from raycl.training.checkpoint import seed_everything
from raycl.training.optim import build_scheduler
from raycl.training.task import (
    Batch,
    Epoch,
    Keep,
    LoopSettings,
    Report,
    StepContext,
    TaskBase,
    TrainState,
    Worker,
)
from raycl.training.timing import Window

Pair = tuple[str, str, float]  # (sentence 1, sentence 2, label in [0, 1])


@dataclass(frozen=True)
class Fit:
    """One ``fit`` call of the released code."""

    setting: str  # pre_train | fine_tune
    epochs: int
    eval_every: int
    seed: int
    index: int = 1  # k of the k-th fine-tuning fit (the released warm-up grows with it)


def fits(cfg: StsConfig) -> list[Fit]:
    p, f = cfg.pretrain, cfg.finetune
    out = [Fit("pre_train", p.epochs, p.eval_every, p.seed)] if p.epochs else []
    return out + [Fit("fine_tune", 1, f.eval_every, f.seed + e, e + 1) for e in range(f.epochs)]


def pair_sentences(pairs: list[Pair]) -> list[str]:
    """The contrastive objective's data: both sentences of every pair, repeats kept, as the released scripts
    build ``train_samples_unsup`` (SimCSE pairs each with itself)."""
    return [s for a, b, _ in pairs for s in (a, b)]


def warmup_steps(cfg: StsConfig, fit: Fit, *, steps: int, pair_batches: int, sentence_batches: int) -> int:
    """``optim.warmup=released``: the released scripts' ``warmup_steps`` — ratio × the contrastive loader × epochs
    in pre-training (that loader is twice the pair loader that ends the epoch: 20% of the steps), ratio × the pair
    loader × k in the k-th one-epoch fine-tuning fit; ``steps``: ratio × the fit's steps."""
    o = cfg.optim
    if o.warmup == "steps":
        return math.ceil(o.warmup_ratio * steps)
    if fit.setting == "pre_train":
        return math.ceil(o.warmup_ratio * (sentence_batches or pair_batches) * fit.epochs)
    return math.ceil(o.warmup_ratio * pair_batches * fit.index)


def pretrain_pairs(cfg: StsConfig, split: str) -> list[Pair]:
    return [(p.sentence1, p.sentence2, p.score / 5.0) for spec in cfg.data.sts_pretrain
            for p in read_sts_pretrain(spec) if p.split == split]  # fmt: skip


def finetune_pairs(cfg: StsConfig, encoder: SentenceEncoder) -> list[Pair]:
    """train_data.csv as (tokenised s1, tokenised s2, label): sim, or the pre-trained model's cosine of the two
    alternatives when sim is 'None', as upstream."""
    rows = read_sts_train(cfg.data.train_data)
    todo = [r for r in rows if r.sim is None]
    alt = [StsPair(r.id, r.language, None, None, r.alternative_1, r.alternative_2) for r in todo]
    labels = evaluation.predict(encoder, alt, cross=cfg.model.cross_attention, batch_size=cfg.eval.batch_size)
    out = []
    for r in rows:
        a, b = r.tokenised(upstream_quirk=cfg.data.upstream_quirk)
        out.append((a, b, float(r.sim if r.sim is not None else labels[r.id])))
    return out


def adamw(model: torch.nn.Module, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """sentence-transformers' optimiser: AdamW (eps 1e-6), no weight decay on biases and LayerNorm weights."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    no_decay = [p for n, p in named if "bias" in n or "LayerNorm" in n]
    decay = [p for n, p in named if not ("bias" in n or "LayerNorm" in n)]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return optimizers.adamw(groups, lr=lr, eps=1e-6)


@dataclass(frozen=True)
class Sentences:
    """Tokenised sentences (CPU, then the device): ids and mask (B, T), and whether any position is padding."""

    ids: torch.Tensor  # (B, T)
    mask: torch.Tensor  # (B, T)
    padded: bool

    @classmethod
    def of(cls, enc: SentenceEncoder, sentences: list[str], *, pad_to_multiple_of: int | None) -> Sentences:
        ids, mask = enc.inputs(sentences, pad_to_multiple_of=pad_to_multiple_of)
        return cls(ids, mask, not bool(mask.all()))


@dataclass(frozen=True)
class StsBatch:
    """One step's objective (``mse``, ``con`` or ``joint``) and its tensors, collated ahead of the step."""

    kind: str
    a: Sentences | None  # the pairs' first sentences (MSE)
    b: Sentences | None  # their second sentences
    labels: torch.Tensor | None  # (P,) score / 5
    sentences: Sentences | None  # the contrastive objective's sentences (SimCSE views of each)
    n_pairs: int
    n_sentences: int
    negatives: MinedNegatives | None = None  # the sentences' own dense hard negatives (``mining``)


@dataclass(frozen=True)
class MinedNegatives:
    """The contrastive batch's mined negatives: each distinct text once, and each sentence's columns in them."""

    texts: Sentences  # (N, T)
    index: torch.Tensor  # (B, K) long: sentence i's k-th negative is row index[i, k] of ``texts``; −1: none

    @classmethod
    def of(cls, enc: SentenceEncoder, sentences: list[str], mined: Mapping[str, list[str]], *,
           pad_to_multiple_of: int | None) -> MinedNegatives | None:  # fmt: skip
        """None when no sentence of the batch has negatives (the step is then the plain InfoNCE)."""
        per = [mined.get(s, []) for s in sentences]
        k = max(map(len, per), default=0)
        if k == 0:
            return None
        texts = list(dict.fromkeys(t for negs in per for t in negs))
        row = {t: i for i, t in enumerate(texts)}
        index = torch.tensor([[row[t] for t in negs] + [-1] * (k - len(negs)) for negs in per])  # (B, K)
        return cls(Sentences.of(enc, texts, pad_to_multiple_of=pad_to_multiple_of), index)


@dataclass
class StsState(TrainState):
    pairs: list[Pair] = field(default_factory=list)  # the current fit's data
    sentences: list[str] = field(default_factory=list)
    evals: evaluation.Evaluator | None = None  # rank 0
    mined: Mapping[str, list[str]] = field(default_factory=dict)  # {sentence: its dense hard negatives}

    @property
    def moco(self) -> MoCoKeyEncoder | None:
        return self.extras.get("moco")


@dataclass(frozen=True)
class StsTask(TaskBase):
    shown: ClassVar[tuple[str, ...]] = ("dev_spearman",)  # on rank 0's progress line
    cfg: StsConfig

    @property
    def settings(self) -> LoopSettings:
        return LoopSettings.from_options(self.cfg.optim, seed=self.cfg.pretrain.seed)

    def load_model(self, path: Path) -> SentenceEncoder:
        return SentenceEncoder.from_pretrained(path)

    def build(self, model: SentenceEncoder, w: Worker, progress: dict[str, Any] | None) -> StsState:
        """A fresh run's state, or the checkpoint's fit: its data, optimisers and key encoder (the loop then
        restores their states)."""
        st = StsState(model, [], [], dict(progress or {"fit": 0, "started": False}),
                      per_rank=("moco",))  # its ring holds this rank's keys
        self._key_encoder(st, w)
        attach_negatives(self.cfg, st, w)  # every rank reads the run's pool (a folder all workers share)
        if progress is not None and progress["started"]:
            self._start_fit(st, fits(self.cfg)[progress["fit"]], w)
        st.total_updates = sum(self._fit_updates(f, n, w) for f, n in zip(fits(self.cfg), self._fit_sizes(),
                                                                             strict=True))  # fmt: skip
        return st

    def _fit_sizes(self) -> list[int]:
        """Every fit's pairs (pre-training's STS pairs, fine-tuning's train_data rows)."""
        pre = len(pretrain_pairs(self.cfg, "train")) if self.cfg.pretrain.epochs else 0
        fine = len(read_sts_train(self.cfg.data.train_data)) if self.cfg.finetune.epochs else 0
        return [pre if f.setting == "pre_train" else fine for f in fits(self.cfg)]

    def _fit_plan(self, fit: Fit, pairs: int, w: Worker) -> BatchPlan:
        """A fit's batch plan: one shuffle of its pairs and, when λ > 0, one of their sentences (the contrastive
        loader), both cut into global batches of ``world_size × batch_size``, of which each rank takes a strided
        share: N workers' i-th step is one worker's i-th batch of N·B (every pair used, the same number of steps
        on every rank; a share of the last, short batch may be empty and then counts with weight 0). Sentence
        batches need two rows a rank (in-batch negatives); the shorter loader ends the epoch, as
        sentence-transformers' ``fit``."""
        loaders = [Loader(pairs)]
        if self.cfg.loss.lam > 0:
            loaders.append(Loader(2 * pairs, min_rows=2 * w.world_size))  # both sentences of every pair
        return BatchPlan(loaders, batch_size=self.cfg.optim.batch_size, seed=fit.seed, rank=w.rank,
                         world_size=w.world_size)  # fmt: skip

    def _fit_updates(self, fit: Fit, pairs: int, w: Worker) -> int:
        return self._fit_plan(fit, pairs, w).updates(fit.epochs, self.cfg.optim.update_freq)

    def _key_encoder(self, st: StsState, w: Worker) -> None:
        c = self.cfg
        st.extras.pop("moco", None)
        if c.loss.lam > 0 and c.moco.queue_size > 0:
            st.extras["moco"] = MoCoKeyEncoder(st.model, dim=st.model.hidden_size, queue_size=c.moco.queue_size,
                                               m=c.moco.m, update_every_forward=c.moco.update_every_forward
                                               ).to(w.device)  # fmt: skip

    def _start_fit(self, st: StsState, fit: Fit, w: Worker) -> None:
        """The fit's data and fresh optimisers and schedules, as every ``fit`` call: one per objective with
        ``alternate``."""
        cfg, o = self.cfg, self.cfg.optim
        if fit.setting == "pre_train":
            st.pairs = pretrain_pairs(cfg, "train")
        else:
            labeller = SentenceEncoder.from_pretrained(self._kept(w, "pre_train")).to(w.device)
            st.pairs = finetune_pairs(cfg, labeller.eval())
        st.sentences = pair_sentences(st.pairs) if cfg.loss.lam > 0 else []
        batches = len(self._fit_plan(fit, len(st.pairs), w))
        # the released warm-up is in sentence-transformers' steps (batches of the global batch): ÷ update_freq
        steps = self._fit_updates(fit, len(st.pairs), w)
        pb, sb = (math.ceil(len(x) / (w.world_size * o.batch_size)) for x in (st.pairs, st.sentences))  # loaders
        warmup = warmup_steps(cfg, fit, steps=max(batches * fit.epochs, 1), pair_batches=pb, sentence_batches=sb)
        warmup = math.ceil(warmup / o.update_freq)
        n = 2 if self._alternate() else 1
        st.optimizers = [adamw(st.model, lr=o.lr, weight_decay=o.weight_decay) for _ in range(n)]
        st.schedulers = [build_scheduler(opt, "polynomial", warmup=warmup, total=max(steps, 1))
                         for opt in st.optimizers]  # fmt: skip

    def _alternate(self) -> bool:
        return self.cfg.loss.joint == "alternate" and self.cfg.loss.lam > 0

    def after_update(self, st: StsState) -> None:
        if "refresh" in st.extras:  # ``mining.refresh``: publish weights, take refreshed negatives
            st.extras["refresh"].after_update(st.model, st.progress["step"])

    def start(self, st: StsState, w: Worker, *, resumed: bool) -> None:
        st.evals = evaluation.Evaluator(self.cfg) if w.rank == 0 else None

    def _plan(self) -> list[tuple[int, int]]:
        """(fit, epoch of the fit) of every epoch the loop runs: the fits' epochs one after the other."""
        return [(k, e) for k, fit in enumerate(fits(self.cfg)) for e in range(fit.epochs)]

    def num_epochs(self, st: StsState) -> int:
        return len(self._plan())

    def epoch(self, st: StsState, w: Worker, epoch: int, start: int) -> Epoch:
        """The epoch's steps from the ``start``-th batch; a fit's first epoch starts the fit (its seed, data, fresh
        optimisers — and fine-tuning's first, the kept pre-trained model). Reports: sentence-transformers' rule,
        every ``eval_every`` steps of the epoch and at its end."""
        plan, (k, e), p = fits(self.cfg), self._plan()[epoch], st.progress
        fit = plan[k]
        if p["fit"] != k or not p["started"]:
            seed_everything(fit.seed)
            if fit.setting == "fine_tune" and (k == 0 or plan[k - 1].setting == "pre_train"):
                st.model = SentenceEncoder.from_pretrained(self._kept(w, "pre_train")).to(w.device)
                self._key_encoder(st, w)  # fine-tuning starts from the kept pre-trained model
            self._start_fit(st, fit, w)
            p.update(fit=k, started=True)
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
        return Epoch(batches[start:], eval_every=fit.eval_every, info={"setting": fit.setting},
                     read_ahead="refresh" not in st.extras)  # refreshed: read under the update's version

    def collate(self, st: StsState, data: Any) -> StsBatch:
        kind, pairs, sentences = data
        pad = self.settings.pad_to_multiple_of
        a = b = labels = con = None
        if pairs:
            first, second, y = zip(*pairs, strict=True)
            a = Sentences.of(st.model, list(first), pad_to_multiple_of=pad)
            b = Sentences.of(st.model, list(second), pad_to_multiple_of=pad)
            labels = torch.tensor(y)  # (P,)
        mined = None
        if sentences:
            con = Sentences.of(st.model, sentences, pad_to_multiple_of=pad)
            mined = MinedNegatives.of(st.model, sentences, st.mined, pad_to_multiple_of=pad) if st.mined else None
        return StsBatch(kind, a, b, labels, con, len(pairs), len(sentences), mined)

    def step(self, st: StsState, data: StsBatch, ctx: StepContext) -> dict[str, Any]:
        """The MSE objective, the contrastive one, or their joint sum (backward of the summed loss: the weight is
        the batch's pairs, or sentences, so workers' shards average to the global batch)."""
        lam, kind = self.cfg.loss.lam, data.kind
        out: dict[str, Any] = {"n_mse": float(kind != "con"), "n_con": float(kind != "mse")}
        zero = torch.zeros((), device=ctx.device)
        l_mse = self._mse(st, data) if data.a is not None else zero
        l_con, keys = self._contrastive(st, data) if data.sentences is not None else (zero, None)
        if kind == "con":
            ctx.backward(lam * l_con, weight=float(data.n_sentences))  # the released MoCo loss carries the ×λ
        else:
            loss = joint_loss(l_mse, l_con, lam=lam) if kind == "joint" else l_mse
            ctx.backward(loss, weight=float(data.n_pairs))
        if keys is not None and st.moco is not None:
            st.moco.enqueue(keys)  # after the loss: a key never meets its own anchor
        return {**out, "l_mse": l_mse.detach(), "l_con": l_con.detach()}

    def _mse(self, st: StsState, data: StsBatch) -> torch.Tensor:
        a, b, enc = data.a, data.b, st.model
        assert a is not None and b is not None and data.labels is not None
        if self.cfg.model.cross_attention:
            u, v = enc.cross_embeddings(a.ids, a.mask, b.ids, b.mask, padded=(a.padded, b.padded))  # (B, H) ×2
        else:
            u, v = enc.embed(a.ids, a.mask, padded=a.padded), enc.embed(b.ids, b.mask, padded=b.padded)
        return MSECosineLoss()(u, v, data.labels).loss

    def _contrastive(self, st: StsState, data: StsBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """L_con of SimCSE views of the sentences against in-batch positives, the queue and each sentence's own
        mined negatives (embedded by the trained encoder, with gradient, as SimCSE's); this step's keys."""
        enc, moco, s = st.model, st.moco, data.sentences
        assert s is not None
        h = enc.embed(s.ids, s.mask, padded=s.padded)  # (B, H)
        h_pos = enc.embed(s.ids, s.mask, padded=s.padded)  # (B, H): dropout is the augmentation
        keys, queue = None, None
        if moco is not None:
            if not self.cfg.moco.update_every_forward:
                moco.momentum_update(enc)
            keys, queue = moco.keys(s.ids, s.mask), moco.queued()  # (B, H), (Q, H)
        negatives = mask = None
        if (mined := data.negatives) is not None:
            t = mined.texts
            rows = enc.embed(t.ids, t.mask, padded=t.padded)  # (N, H)
            negatives, mask = rows[mined.index.clamp(min=0)], mined.index >= 0  # (B, K, H), (B, K)
        loss = InfoNCEQueueLoss(temperature=self.cfg.loss.temperature)(h, h_pos, queue, negatives, mask).loss
        return loss, keys

    def metrics(self, st: StsState, window: Window, rep: Report, w: Worker) -> dict[str, Any]:
        s, lam = window.sums, self.cfg.loss.lam
        l_mse = s.get("l_mse", 0.0) / max(s.get("n_mse", 0.0), 1.0)
        l_con = s.get("l_con", 0.0) / max(s.get("n_con", 0.0), 1.0)
        return {"loss": l_mse + lam * l_con, "l_mse": l_mse, "l_con": l_con, "setting": rep.info["setting"],
                **(st.extras["refresh"].metrics() if "refresh" in st.extras else {})}  # fmt: skip

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
        """The model kept for ``setting`` (the initial model when that phase did not run). Rank 0 keeps it in the
        run folder: a rank that cannot see it there must not go on from the initial model."""
        path = w.out_dir / f"{setting}_model"
        if (path / "config.json").exists():
            return path
        ran = (self.cfg.pretrain.epochs if setting == "pre_train" else self.cfg.finetune.epochs) > 0
        if ran:
            raise RuntimeError(f"{path}: the model that {setting} kept is not there on rank {w.rank} (the run "
                               "folder must be on a file system every worker shares; see docs/cluster.md: a "
                               "cluster without a shared file system)")
        return Path(w.job.init_model)
