"""The Subtask A training loop on one Ray Train worker (SPEC §3.1): one setting, EMA, adversarial training.

A trial trains one setting (``data.setting`` is ``zero_shot`` or ``one_shot`` here): the zero-shot model reads
"Previous Target Next" of train_zero_shot, the one-shot model the (Target, MWE) pairs of train_one_shot followed
by train_zero_shot. AdamW (lr 2e-5, wd 0) with a linear warm-up/decay schedule; the batch (per worker) and seed
are the setting's unless set. Each step, as the released loop::

    loss, logits = forward(); loss.backward()                      # the clean pass (mean cross-entropy)
    adversary.attack_and_backward(forward, clean_logits=logits)    # FGM / PGD / FreeLB / SMART add to .grad
    optimizer.step(); scheduler.step(); ema.update()

With several workers the forward runs through DDP (every backward, the adversarial ones too, averages the
gradients, so every rank perturbs the embeddings alike), while the adversary and the EMA hold the unwrapped
model: its ``get_input_embeddings()`` and parameter names. After every epoch rank 0 scores dev (official
macro-F1, EN+PT) with the EMA weights swapped in and keeps the best epoch in ``best_model/`` — the EMA weights,
as the code saves them. The last report (``final: 1``) holds the official scores of the kept model's dev and
eval submissions (``dev.submission.csv``, ``eval.submission.csv``, this setting's rows filled).
"""

from __future__ import annotations

import math
import random
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from raycl.adversarial.base import build_adversarial
from raycl.config import from_dict
from raycl.configs.idiom import SETTINGS, IdiomConfig
from raycl.data.semeval import IdiomExample, read_idiom_train
from raycl.distributed import session
from raycl.memory.ema import EMA
from raycl.models.classifier import encode_batch, load_classifier
from raycl.recipes.common import append_history, save_dir_atomic
from raycl.recipes.idiom_report import Evaluator, model_input
from raycl.train.checkpoint import MODEL_DIR, load_training_state, save_training_state, seed_everything
from raycl.train.optim import build_scheduler
from raycl.train.progress import ProgressWriter

BEST_MODEL = "best_model"
EMA_STATE = "ema.pt"


def train_examples(cfg: IdiomConfig, setting: str) -> list[IdiomExample]:
    """The setting's training rows: one-shot trains on train_one_shot + train_zero_shot (SPEC §3.1)."""
    zero = read_idiom_train(cfg.data.train_zero_shot)
    return read_idiom_train(cfg.data.train_one_shot) + zero if setting == "one_shot" else zero


def epoch_batches(n: int, *, batch_size: int, seed: int, rank: int, world_size: int) -> list[list[int]]:
    """This rank's batches (row indices) of an epoch: one shuffle shared by all ranks, equal strided shards (the
    last ``n mod world_size`` rows of the shuffle sit the epoch out, so every rank takes the same steps)."""
    order = random.Random(seed).sample(range(n), n)
    mine = order[rank : n // world_size * world_size : world_size]
    return [mine[i : i + batch_size] for i in range(0, len(mine), batch_size)]


class _State:
    """The model (unwrapped, and the module the forward runs through), optimiser, schedule, EMA, adversary."""

    def __init__(self, cfg: IdiomConfig, model: Any, tokenizer: Any, *, total_steps: int) -> None:
        self.cfg, self.setting, self.tokenizer = cfg, cfg.data.setting, tokenizer
        self.forward_module = session.prepare_model(model)  # DDP with several workers; `model` stays unwrapped
        self.model = model
        o, a = cfg.optim, cfg.adversarial
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay)
        warmup = math.ceil(o.warmup_ratio * total_steps)
        self.scheduler = build_scheduler(self.optimizer, "polynomial", warmup=warmup, total=total_steps)
        self.ema = EMA(model, decay=cfg.ema.decay) if cfg.ema.enabled else None  # after prepare, as the code
        self.adversary = build_adversarial(a.method, model, epsilon=a.epsilon, alpha=a.alpha, steps=a.steps,
                                           smart_mu=a.smart_mu)  # fmt: skip
        self.progress: dict[str, Any] = {"epoch": 0, "step": 0, "report": 0, "best": None, "best_epoch": 0}

    def save(self, folder: Path) -> None:
        save_training_state(folder, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                            progress=self.progress)  # fmt: skip
        if self.ema is not None:
            torch.save(self.ema.state_dict(), folder / f".{EMA_STATE}.tmp")
            (folder / f".{EMA_STATE}.tmp").replace(folder / EMA_STATE)

    def load(self, folder: Path) -> None:
        self.progress = load_training_state(folder, optimizer=self.optimizer, scheduler=self.scheduler)
        if self.ema is not None:
            self.ema.load_state_dict(torch.load(folder / EMA_STATE, map_location="cpu", weights_only=False))

    def save_model(self, folder: Path) -> None:
        self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)


def train_step(st: _State, batch: list[IdiomExample]) -> dict[str, float]:
    """The clean backward, the adversarial terms, the optimiser step, then the EMA update."""
    device = session.device()
    texts: Any = [model_input(e, st.setting) for e in batch]  # all texts or all pairs: one setting
    enc = encode_batch(st.tokenizer, texts, max_len=st.cfg.model.max_len)
    inputs = {k: v.to(device) for k, v in enc.items()}  # (B, T) each
    labels = torch.tensor([e.label for e in batch], device=device)  # (B,)

    def forward() -> tuple[torch.Tensor, torch.Tensor]:
        out = st.forward_module(**inputs, labels=labels)
        return out.loss, out.logits  # (), (B, 2)

    st.optimizer.zero_grad(set_to_none=True)
    loss, logits = forward()
    loss.backward()
    extra = st.adversary.attack_and_backward(forward, clean_logits=logits.detach())
    st.optimizer.step()
    st.scheduler.step()
    if st.ema is not None:
        st.ema.update()
    return {"loss": float(loss.detach()), **extra}  # extra: adv/loss (and SMART's adv/kl)


# ---------------------------------------------------------------------------------------------- the loop
def train_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point. ``loop_config``: ``config`` (dict, ``data.setting`` one setting), ``init_model``
    (a classifier folder), ``out_dir`` (rank 0 keeps ``history.jsonl``, ``best_model/`` and the submissions)."""
    cfg: IdiomConfig = from_dict(IdiomConfig, loop_config["config"])
    setting = cfg.data.setting
    assert setting in SETTINGS, setting
    out_dir = Path(loop_config["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    rank, world_size = session.world()
    seed_everything(cfg.seed(setting))
    examples = train_examples(cfg, setting)
    bs = cfg.batch_size(setting)
    steps_per_epoch = len(epoch_batches(len(examples), batch_size=bs, seed=0, rank=0, world_size=world_size))
    with session.resume_dir() as ckpt:  # a restarted worker group continues from the last epoch's checkpoint
        model, tokenizer = load_classifier(ckpt / MODEL_DIR if ckpt else loop_config["init_model"])
        st = _State(cfg, model, tokenizer, total_steps=max(steps_per_epoch * cfg.optim.epochs, 1))
        if ckpt is not None:
            st.load(ckpt)
    evals = Evaluator(cfg, setting) if rank == 0 else None
    bar = ProgressWriter(out_dir, total=steps_per_epoch * cfg.optim.epochs) if rank == 0 else None
    for epoch in range(st.progress["epoch"], cfg.optim.epochs):
        batches = epoch_batches(len(examples), batch_size=bs, seed=cfg.seed(setting) * 1000 + epoch, rank=rank,
                                world_size=world_size)  # fmt: skip
        stats = _epoch(st, [[examples[i] for i in b] for b in batches], bar)
        st.progress.update(epoch=epoch + 1)
        _report(st, stats, evals, out_dir)
    _final(st, evals, out_dir, loop_config)


def _epoch(st: _State, batches: list[list[IdiomExample]], bar: ProgressWriter | None) -> dict[str, float]:
    st.forward_module.train()
    sums: dict[str, float] = {}
    t0 = time.perf_counter()
    for batch in batches:
        t_step = time.perf_counter()
        out = {**train_step(st, batch), "timing/step": time.perf_counter() - t_step}
        for k, v in out.items():
            sums[k] = sums.get(k, 0.0) + v
        st.progress["step"] += 1
        if bar is not None:
            bar.update(st.progress["step"], setting=st.setting, loss=out["loss"])
    n = max(len(batches), 1)
    return {**{k: v / n for k, v in sums.items()}, "timing/epoch": time.perf_counter() - t0, "steps": float(n)}


def _report(st: _State, stats: dict[str, float], evals: Evaluator | None, out_dir: Path) -> None:
    """Rank 0 scores dev with the EMA weights, keeps the best epoch (EMA weights) and the run's record, and
    attaches a resumable checkpoint (live weights, EMA shadow); every rank reports."""
    p = st.progress
    p["report"] += 1
    metrics: dict[str, Any] = {**stats, "epoch": p["epoch"], "step": p["step"], "report": p["report"],
                               "setting": st.setting, "lr": st.scheduler.get_last_lr()[0]}  # fmt: skip
    if evals is None:
        session.report(metrics)
        return
    t0 = time.perf_counter()
    st.model.eval()
    with st.ema.applied() if st.ema is not None else nullcontext():  # EMA off: the live weights
        metrics.update(evals.dev_scores(st.model, st.tokenizer))
        value = metrics["dev_f1"]
        improved = value is not None and (p["best"] is None or value > p["best"])
        if improved or p["best_epoch"] == 0:
            save_dir_atomic(st.save_model, out_dir / BEST_MODEL)  # the code's `if f1 > best`: earliest on ties
            p.update(best=value, best_epoch=p["epoch"])
            metrics["kept"] = 1
    st.forward_module.train()
    metrics["timing/eval"] = time.perf_counter() - t0
    metrics = _nan_for_none(metrics)
    append_history(out_dir, metrics, key="report")
    with session.scratch_dir() as tmp:
        st.save(tmp)
        session.report(metrics, checkpoint_dir=tmp)


def _final(st: _State, evals: Evaluator | None, out_dir: Path, loop_config: dict[str, Any]) -> None:
    """The last report: the kept model's dev and eval submissions of this setting, officially scored."""
    p = st.progress
    p["report"] += 1
    metrics: dict[str, Any] = {"report": p["report"], "epoch": p["epoch"], "step": p["step"], "final": 1,
                               "setting": st.setting, "best_epoch": p["best_epoch"]}  # fmt: skip
    if evals is None:
        session.report(metrics)
        return
    kept = out_dir / BEST_MODEL
    model: Any  # HF's typing of PreTrainedModel.to rejects a device
    model, tokenizer = load_classifier(kept if (kept / "config.json").exists() else loop_config["init_model"])
    model.to(session.device())  # in place, as every nn.Module
    model.eval()
    metrics.update(evals.final(model, tokenizer, out_dir))
    metrics = _nan_for_none(metrics)
    append_history(out_dir, metrics, key="report")
    session.report(metrics)


def _nan_for_none(metrics: dict[str, Any]) -> dict[str, Any]:
    """Tune's metric must be a number in every report: an undefined F1 (no rows of a language) is NaN."""
    return {k: float("nan") if v is None else v for k, v in metrics.items()}
