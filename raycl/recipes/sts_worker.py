"""The Subtask B training loop on one Ray Train worker (SPEC §3.2): pre-train on STS pairs, then fine-tune.

A trial is a list of *fits*, as the released code calls sentence-transformers' ``fit``: one pre-training fit of
``pretrain.epochs`` epochs, then ``finetune.epochs`` fits of one epoch each (warm-up recomputed each time). Each
fit has fresh AdamW optimisers (no decay on biases and LayerNorm, as ``fit``) and a linear warm-up/decay
schedule. A step is a batch of pairs (MSE of the cross-attended cosine against score/5) and, when λ > 0, a
batch of sentences for InfoNCE (SimCSE views through dropout, mean-pooled encoder outputs, cross-attention
bypassed, MoCo keys as extra negatives); an epoch ends with the shorter of the two loaders. ``loss.joint=sum``
backpropagates L_mse + λ·L_con once (the paper); ``alternate`` steps each objective with its own optimiser (the
code). Gradients are summed over workers and divided by the global batch (no DDP: the model runs several
forwards per step).

Every ``eval_every`` steps and at each epoch's end rank 0 predicts the official dev set: pre-training keeps the
model with the best Spearman on the STS dev split (``pre_train_model/``), fine-tuning the one with the best
official dev Spearman (``fine_tune_model/``). Fine-tuning starts from the kept pre-trained model; rows of
train_data.csv with sim 'None' get its cross-attended cosine of (alternative_1, alternative_2). The last report
(``final: 1``) holds the official scores of both settings' submissions, and alignment/uniformity.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from raycl.config import from_dict
from raycl.configs.sts import StsConfig
from raycl.data.semeval import StsPair, read_sts_pretrain, read_sts_train
from raycl.distributed import session
from raycl.losses.infonce_queue import InfoNCEQueueLoss, joint_loss
from raycl.losses.mse_cosine import MSECosineLoss
from raycl.memory.moco import MoCoKeyEncoder
from raycl.models.sentence_encoder import SentenceEncoder
from raycl.recipes import sts_report
from raycl.recipes.common import append_history, save_dir_atomic
from raycl.train.checkpoint import (
    MODEL_DIR,
    STATE_FILE,
    load_training_state,
    save_training_state,
    seed_everything,
)
from raycl.train.data_parallel import backward_global
from raycl.train.optim import build_scheduler
from raycl.train.progress import ProgressWriter

EXTRA_STATE = "sts_state.pt"
Pair = tuple[str, str, float]  # (sentence 1, sentence 2, label in [0, 1])


@dataclass(frozen=True)
class Fit:
    """One ``fit`` call of the released code."""

    setting: str  # pre_train | fine_tune
    epochs: int
    eval_every: int
    seed: int


def fits(cfg: StsConfig) -> list[Fit]:
    p, f = cfg.pretrain, cfg.finetune
    out = [Fit("pre_train", p.epochs, p.eval_every, p.seed)] if p.epochs else []
    return out + [Fit("fine_tune", 1, f.eval_every, f.seed + e) for e in range(f.epochs)]


def epoch_batches(pairs: list[Pair], sentences: list[str], *, batch_size: int, seed: int, rank: int,
                  world_size: int) -> list[tuple[list[Pair], list[str]]]:  # fmt: skip
    """This rank's steps of an epoch: equal shards on every rank; no sentences: MSE only (λ = 0)."""
    rng = random.Random(seed)
    pairs, sentences = rng.sample(pairs, len(pairs)), rng.sample(sentences, len(sentences))
    p = pairs[rank : len(pairs) // world_size * world_size : world_size]
    s = sentences[rank : len(sentences) // world_size * world_size : world_size]
    pb = [p[i : i + batch_size] for i in range(0, len(p), batch_size)]
    if not sentences:
        return [(b, []) for b in pb]
    sb = [c for c in (s[i : i + batch_size] for i in range(0, len(s), batch_size)) if len(c) >= 2]
    return list(zip(pb, sb, strict=False))  # the shorter loader ends the epoch, as sentence-transformers' fit


def unique_sentences(pairs: list[Pair]) -> list[str]:
    """The contrastive objective's data: every sentence of the pairs, once (SimCSE pairs it with itself)."""
    return sorted({s for a, b, _ in pairs for s in (a, b)})


def pretrain_pairs(cfg: StsConfig, split: str) -> list[Pair]:
    return [(p.sentence1, p.sentence2, p.score / 5.0) for spec in cfg.data.sts_pretrain
            for p in read_sts_pretrain(spec) if p.split == split]  # fmt: skip


def finetune_pairs(cfg: StsConfig, encoder: SentenceEncoder) -> list[Pair]:
    """train_data.csv as (tokenised s1, tokenised s2, label): sim, or the pre-trained model's cosine of the two
    alternatives when sim is 'None' (SPEC §3.2)."""
    rows = read_sts_train(cfg.data.train_data)
    todo = [r for r in rows if r.sim is None]
    alt = [StsPair(r.id, r.language, None, None, r.alternative_1, r.alternative_2) for r in todo]
    labels = sts_report.predict(encoder, alt, cross=cfg.model.cross_attention, batch_size=cfg.eval.batch_size)
    out = []
    for r in rows:
        a, b = r.tokenised(upstream_quirk=cfg.data.upstream_quirk)
        out.append((a, b, float(r.sim if r.sim is not None else labels[r.id])))
    return out


# ---------------------------------------------------------------------------------------------- state
class _State:
    """The model, its MoCo key encoder and the current fit's optimisers; what a checkpoint holds."""

    def __init__(self, cfg: StsConfig, encoder: SentenceEncoder) -> None:
        self.cfg, self.encoder = cfg, encoder.to(session.device())
        self.moco = self._moco()
        self.opts: list[torch.optim.Optimizer] = []
        self.scheds: list[Any] = []
        self.progress: dict[str, Any] = {"fit": 0, "epoch": 0, "batch": 0, "step": 0, "report": 0,
                                         "best": {}, "started": False}  # fmt: skip

    def _moco(self) -> MoCoKeyEncoder | None:
        c = self.cfg
        if c.loss.lam == 0 or c.moco.queue_size == 0:
            return None
        return MoCoKeyEncoder(self.encoder, dim=self.encoder.hidden_size, queue_size=c.moco.queue_size,
                              m=c.moco.m, update_every_forward=c.moco.update_every_forward).to(session.device())

    def replace_encoder(self, encoder: SentenceEncoder) -> None:
        """Fine-tuning starts from the kept pre-trained model, with a key encoder and queue built from it."""
        self.encoder = encoder.to(session.device())
        self.moco = self._moco()

    def start_fit(self, steps: int) -> None:
        """Fresh optimisers and schedules, as every ``fit`` call: one per objective with ``alternate``."""
        o = self.cfg.optim
        n = 2 if self.cfg.loss.joint == "alternate" and self.cfg.loss.lam > 0 else 1
        self.opts = [adamw(self.encoder, lr=o.lr, weight_decay=o.weight_decay) for _ in range(n)]
        self.scheds = [build_scheduler(opt, "polynomial", warmup=math.ceil(o.warmup_ratio * steps),
                                       total=steps) for opt in self.opts]  # fmt: skip

    def train(self, mode: bool = True) -> None:
        self.encoder.train(mode)
        if self.moco is not None:
            self.moco.train(mode)

    def save(self, folder: Path) -> None:
        save_training_state(folder, model=self.encoder, optimizer=self.opts[0], scheduler=self.scheds[0],
                            progress=self.progress)  # fmt: skip
        extra = {"opts": [o.state_dict() for o in self.opts[1:]],
                 "scheds": [s.state_dict() for s in self.scheds[1:]],
                 "moco": self.moco.state_dict() if self.moco is not None else None}  # fmt: skip
        torch.save(extra, folder / f".{EXTRA_STATE}.tmp")
        (folder / f".{EXTRA_STATE}.tmp").replace(folder / EXTRA_STATE)

    def load(self, folder: Path) -> None:
        self.progress = load_training_state(folder, optimizer=self.opts[0], scheduler=self.scheds[0])
        extra = torch.load(folder / EXTRA_STATE, map_location=session.device(), weights_only=False)
        for obj, state in zip(self.opts[1:] + self.scheds[1:], extra["opts"] + extra["scheds"], strict=True):
            obj.load_state_dict(state)
        if self.moco is not None and extra["moco"] is not None:
            self.moco.load_state_dict(extra["moco"])


def adamw(model: torch.nn.Module, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """sentence-transformers' optimiser: AdamW (eps 1e-6), no weight decay on biases and LayerNorm weights."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    no_decay = [p for n, p in named if "bias" in n or "LayerNorm" in n]
    decay = [p for n, p in named if not ("bias" in n or "LayerNorm" in n)]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, eps=1e-6)


# ---------------------------------------------------------------------------------------------- one step
def _mse(st: _State, pairs: list[Pair]) -> torch.Tensor:
    a, b, y = zip(*pairs, strict=True)
    u, v = sts_report.pair_embeddings(st.encoder, list(a), list(b), cross=st.cfg.model.cross_attention)  # (B, H)
    labels = torch.tensor(y, device=u.device)  # (B,)
    return MSECosineLoss()(u, v, labels).loss


def _contrastive(st: _State, sentences: list[str]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """L_con of SimCSE views of ``sentences`` against in-batch positives and the queue; also this step's keys."""
    enc, moco = st.encoder, st.moco
    ids, mask = enc.tokenize(sentences)  # (B, T), (B, T)
    h, h_pos = enc.embed(ids, mask), enc.embed(ids, mask)  # (B, H) twice: dropout is the augmentation
    keys, queue = None, None
    if moco is not None:
        if not st.cfg.moco.update_every_forward:
            moco.momentum_update(enc)
        keys, queue = moco.keys(ids, mask), moco.queued()  # (B, H), (Q, H)
    return InfoNCEQueueLoss(temperature=st.cfg.loss.temperature)(h, h_pos, queue).loss, keys


def _update(st: _State, k: int, loss: torch.Tensor, n: int) -> None:
    st.opts[k].zero_grad(set_to_none=True)
    backward_global(loss, float(n), st.encoder)
    if st.cfg.optim.clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(st.encoder.parameters(), st.cfg.optim.clip_norm)
    st.opts[k].step()
    st.scheds[k].step()


def train_step(st: _State, pairs: list[Pair], sentences: list[str]) -> dict[str, float]:
    """One step: the joint sum, or (``alternate``) the MSE objective's step then the contrastive one's."""
    lam = st.cfg.loss.lam
    if st.cfg.loss.joint == "alternate" and sentences:
        l_mse = _mse(st, pairs)
        _update(st, 0, l_mse, len(pairs))
        l_con, keys = _contrastive(st, sentences)
        _update(st, 1, lam * l_con, len(sentences))  # the code's MoCo loss carries the ×λ itself
        loss = joint_loss(l_mse.detach(), l_con.detach(), lam=lam)
    else:
        l_mse = _mse(st, pairs)
        l_con, keys = _contrastive(st, sentences) if sentences else (torch.zeros(()), None)
        loss = joint_loss(l_mse, l_con, lam=lam)
        _update(st, 0, loss, len(pairs))
    if keys is not None and st.moco is not None:
        st.moco.enqueue(keys)  # after the loss: a key never meets its own anchor
    return {"loss": float(loss.detach()), "l_mse": float(l_mse.detach()), "l_con": float(l_con.detach())}


# ---------------------------------------------------------------------------------------------- the loop
def train_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point. ``loop_config``: ``config`` (dict), ``init_model`` (a SentenceEncoder folder),
    ``out_dir`` (rank 0 keeps ``history.jsonl``, ``pre_train_model/``, ``fine_tune_model/``, submissions)."""
    cfg: StsConfig = from_dict(StsConfig, loop_config["config"])
    out_dir = Path(loop_config["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    rank, world_size = session.world()
    plan = fits(cfg)
    st = _State(cfg, SentenceEncoder.from_pretrained(loop_config["init_model"]))
    data: _FitData | None = None
    with session.resume_dir() as ckpt:  # a restarted worker group continues from the last report
        if ckpt is not None:
            data = _resume(st, plan, ckpt, out_dir, loop_config)
    evals = sts_report.Evaluator(cfg) if rank == 0 else None
    bar = ProgressWriter(out_dir, total=1) if rank == 0 else None
    for k in range(st.progress["fit"], len(plan)):
        fit = plan[k]
        if not st.progress["started"]:
            seed_everything(fit.seed)
            if fit.setting == "fine_tune" and (k == 0 or plan[k - 1].setting == "pre_train"):
                st.replace_encoder(SentenceEncoder.from_pretrained(_kept(out_dir, loop_config, "pre_train")))
            data = _fit_data(cfg, fit, out_dir, loop_config)
            st.start_fit(data.steps)
            st.progress.update(fit=k, epoch=0, batch=0, started=True)
        assert data is not None
        for epoch in range(st.progress["epoch"], fit.epochs):
            _epoch(st, fit, data, epoch, evals, out_dir, rank, world_size, bar)
            st.progress.update(epoch=epoch + 1, batch=0)
        st.progress.update(fit=k + 1, epoch=0, batch=0, started=False)
    _final(st, evals, out_dir, loop_config)


def _resume(st: _State, plan: list[Fit], ckpt: Path, out_dir: Path, loop_config: dict[str, Any]) -> _FitData:
    """The model, optimisers, schedules, key encoder and position of the checkpoint's fit."""
    progress = torch.load(ckpt / STATE_FILE, map_location="cpu", weights_only=False)["progress"]
    st.replace_encoder(SentenceEncoder.from_pretrained(ckpt / MODEL_DIR))
    data = _fit_data(st.cfg, plan[progress["fit"]], out_dir, loop_config)
    st.start_fit(data.steps)
    st.load(ckpt)
    return data


@dataclass
class _FitData:
    pairs: list[Pair]
    sentences: list[str]
    steps: int  # optimiser steps of the whole fit on this rank


def _fit_data(cfg: StsConfig, fit: Fit, out_dir: Path, loop_config: dict[str, Any]) -> _FitData:
    if fit.setting == "pre_train":
        pairs = pretrain_pairs(cfg, "train")
    else:
        labeller = SentenceEncoder.from_pretrained(_kept(out_dir, loop_config, "pre_train")).to(session.device())
        pairs = finetune_pairs(cfg, labeller.eval())
    sentences = unique_sentences(pairs) if cfg.loss.lam > 0 else []
    _, world_size = session.world()
    n = len(epoch_batches(pairs, sentences, batch_size=cfg.optim.batch_size, seed=0, rank=0,
                          world_size=world_size))  # fmt: skip
    return _FitData(pairs, sentences, max(n * fit.epochs, 1))


def _kept(out_dir: Path, loop_config: dict[str, Any], setting: str) -> Path:
    """The model kept for ``setting`` (the initial model when that phase did not run)."""
    path = out_dir / f"{setting}_model"
    return path if (path / "config.json").exists() else Path(loop_config["init_model"])


def _epoch(st: _State, fit: Fit, data: _FitData, epoch: int, evals: sts_report.Evaluator | None, out_dir: Path,
           rank: int, world_size: int, bar: ProgressWriter | None) -> None:  # fmt: skip
    batches = epoch_batches(data.pairs, data.sentences, batch_size=st.cfg.optim.batch_size,
                            seed=fit.seed * 1000 + epoch, rank=rank, world_size=world_size)  # fmt: skip
    window: dict[str, float] = {}
    p = st.progress
    for i in range(p["batch"], len(batches)):
        st.train()
        t0 = time.perf_counter()
        losses = train_step(st, *batches[i])
        for key, v in {**losses, "timing/step": time.perf_counter() - t0, "n": 1.0}.items():
            window[key] = window.get(key, 0.0) + v
        p.update(step=p["step"] + 1, batch=i + 1)
        if bar is not None:
            bar.update(p["step"], setting=fit.setting, loss=losses["loss"])
        if p["step"] % fit.eval_every == 0 or i + 1 == len(batches):
            _report(st, fit, window, evals, out_dir, rank)
            window = {}


def _report(st: _State, fit: Fit, window: dict[str, float], evals: sts_report.Evaluator | None, out_dir: Path,
            rank: int) -> None:  # fmt: skip
    """Rank 0 scores dev, keeps the phase's best model and the run's record; every rank reports."""
    p = st.progress
    p["report"] += 1
    n = max(window.pop("n", 0.0), 1.0)
    metrics: dict[str, Any] = {**{k: v / n for k, v in window.items()}, "report": p["report"], "step": p["step"],
                               "setting": fit.setting, "lr": st.scheds[0].get_last_lr()[0]}  # fmt: skip
    if evals is None:
        session.report(metrics)
        return
    st.train(False)
    metrics.update(evals.dev(st.encoder, setting=fit.setting))
    st.train(True)
    key = "sts_dev_spearman" if fit.setting == "pre_train" and evals.has_sts_dev else "dev_spearman"
    value = metrics.get(key)
    best = p["best"].get(fit.setting)
    if fit.setting not in p["best"] or (value is not None and (best is None or value > best)):
        p["best"][fit.setting] = value
        save_dir_atomic(st.encoder.save_pretrained, out_dir / f"{fit.setting}_model")
        metrics["kept"] = 1
    metrics = _nan_for_none(metrics)
    append_history(out_dir, metrics, key="report")
    with session.scratch_dir() as tmp:
        st.save(tmp)
        session.report(metrics, checkpoint_dir=tmp)


def _final(st: _State, evals: sts_report.Evaluator | None, out_dir: Path, loop_config: dict[str, Any]) -> None:
    """The last report: both settings' submissions for dev and eval from the kept models, officially scored."""
    st.progress["report"] += 1
    metrics: dict[str, Any] = {"report": st.progress["report"], "step": st.progress["step"], "final": 1,
                               "setting": st.cfg.final_setting}  # fmt: skip
    if evals is None:
        session.report(metrics)
        return
    models = {s: _kept(out_dir, loop_config, s) for s in ("pre_train", "fine_tune")}
    if not st.cfg.finetune.epochs:
        models.pop("fine_tune")
    metrics = _nan_for_none({**metrics, **evals.final(models, out_dir, device=session.device())})
    append_history(out_dir, metrics, key="report")
    session.report(metrics)


def _nan_for_none(metrics: dict[str, Any]) -> dict[str, Any]:
    """Tune's metric must be a number in every report: an undefined Spearman (constant predictions) is NaN."""
    return {k: float("nan") if v is None else v for k, v in metrics.items()}
