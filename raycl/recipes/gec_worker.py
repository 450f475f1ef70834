"""The per-worker training loop of the GEC recipe (runs inside Ray Train workers, or in-process).

One function, :func:`train_worker`, serves both training phases of Algorithm 1 (Cao et al., 2021):
``pretrain`` (step 1: label-smoothed NLL on D_T) and ``finetune`` (step 3: Eq. 5 on D_F with the mined
negatives). Gradients are summed over workers and divided by the *global* number of target tokens, as the
fairseq trainer does (SPEC §1.2: "sum both terms, then divide by ntokens"), so N workers take the same step as
one worker on the whole batch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from raycl.config import from_dict
from raycl.configs.gec import GecConfig
from raycl.data.gec import GecExample, load_examples, load_references
from raycl.distributed import session
from raycl.distributed.consumer import StreamConsumer
from raycl.evaluation.gec_metrics import evaluate_gec
from raycl.losses.gec_margin import GecContrastiveLoss
from raycl.miners.shards import read_negatives
from raycl.models.seq2seq import Seq2SeqScorer
from raycl.recipes.common import append_history, read_history, save_dir_atomic
from raycl.train.chaos import crash_switch
from raycl.train.checkpoint import MODEL_DIR, load_training_state, save_training_state, seed_everything
from raycl.train.data_parallel import backward_global
from raycl.train.feeds import Feed, StaticFeed, StreamFeed, shard
from raycl.train.gec_step import collate, gec_loss
from raycl.train.optim import build_optimizer, build_scheduler
from raycl.train.progress import ProgressWriter


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


def phase_of(cfg: GecConfig, name: str) -> Phase:
    if name == "pretrain":
        p = cfg.pretrain
        return Phase(name, cfg.data.train, p.lr, p.epochs, p.batch_size, p.warmup_updates, p.label_smoothing, 0.0)
    o = cfg.optim
    return Phase(name, cfg.data.finetune, o.lr, o.epochs, o.batch_size, o.warmup_updates,
                 cfg.loss.label_smoothing, cfg.loss.trade_off)  # fmt: skip


def train_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point.

    ``loop_config``: ``config`` (dict), ``phase``, ``init_model``, ``out_dir`` (rank 0 keeps ``history.jsonl``
    and the model there: ``model/`` after pretraining, ``best_model/`` by dev) and, when negatives are mined
    while training, the ``stream`` and weight ``store`` actors.
    """
    cfg: GecConfig = from_dict(GecConfig, loop_config["config"])
    phase = phase_of(cfg, loop_config["phase"])
    rank, world_size = session.world()
    seed_everything(cfg.optim.seed)
    examples = load_examples(phase.specs, annotator=cfg.data.annotator)
    feed = _feed(cfg, phase, loop_config, examples, rank, world_size)
    steps_per_epoch = math.ceil(math.ceil(len(examples) / world_size) / phase.batch_size)  # same on every rank
    total = cfg.optim.total_updates or steps_per_epoch * max(phase.epochs, 1)
    with session.resume_dir() as ckpt:  # a restarted worker continues from the last checkpoint
        scorer = Seq2SeqScorer.from_pretrained(ckpt / MODEL_DIR if ckpt else loop_config["init_model"])
        optimizer = build_optimizer(scorer, phase.lr, betas=cfg.optim.betas, eps=cfg.optim.eps,
                                    weight_decay=cfg.optim.weight_decay)  # fmt: skip
        scheduler = build_scheduler(optimizer, cfg.optim.scheduler if phase.name == "finetune" else "fixed",
                                    warmup=phase.warmup, total=total)  # fmt: skip
        progress: dict[str, Any] = (load_training_state(ckpt, optimizer=optimizer, scheduler=scheduler) if ckpt
                                    else {"epoch": 0, "step": 0})  # fmt: skip
    scorer.to(session.device())
    if ckpt is not None:
        feed.resume(progress.get("feed", {}), scorer)
    loss_fn = GecContrastiveLoss(trade_off=phase.trade_off, margin=cfg.loss.margin,
                                 label_smoothing=phase.label_smoothing)  # fmt: skip
    refs = _references(cfg) if phase.name == "finetune" and rank == 0 else {}
    out_dir = Path(loop_config["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    if phase.name == "finetune" and phase.epochs == 0:  # DI: evaluate the base model, train nothing
        _report(cfg, scorer, optimizer, scheduler, progress, refs, {}, rank, out_dir, last=True)
        return
    bar = ProgressWriter(out_dir, total=steps_per_epoch * phase.epochs) if rank == 0 else None
    on_step = crash_switch(loop_config.get("chaos"), rank=rank)
    for epoch in range(progress["epoch"], phase.epochs):
        stats = _train_epoch(cfg, scorer, optimizer, scheduler, loss_fn, feed, epoch, bar=bar,
                             step0=progress["step"], on_step=on_step)  # fmt: skip
        progress = {"epoch": epoch + 1, "step": progress["step"] + stats.pop("steps"), "feed": feed.state()}
        _report(cfg, scorer, optimizer, scheduler, progress, refs, stats, rank, out_dir,
                last=epoch + 1 == phase.epochs)  # fmt: skip


def _feed(
    cfg: GecConfig, phase: Phase, loop_config: dict[str, Any], examples: list[GecExample], rank: int,
    world_size: int,
) -> Feed:
    """Negatives mined while training (the stream), pre-mined ones (``mining.negatives``), or none."""
    shards = [shard(examples, r, world_size) for r in range(world_size)]
    needs_negatives = phase.name == "finetune" and phase.trade_off > 0 and phase.epochs > 0
    if needs_negatives and loop_config.get("stream") is not None:
        consumer = StreamConsumer(loop_config["stream"], loop_config["store"], rank=rank, world_size=world_size,
                                  max_staleness=cfg.mining.max_staleness)  # fmt: skip
        return StreamFeed(consumer, shards, batch_size=phase.batch_size, sync_every=cfg.mining.sync_every,
                          refresh_every=cfg.mining.refresh_every)  # fmt: skip
    negatives: dict[str, list[str]] = {}
    if needs_negatives:
        if not cfg.mining.negatives:
            raise RuntimeError("contrastive fine-tuning without a negative stream or mining.negatives")
        mined = read_negatives(cfg.mining.negatives)
        negatives = {ex.id: list(mined[ex.id].negatives) for ex in examples if ex.id in mined}
    return StaticFeed(shards[rank], negatives, batch_size=phase.batch_size, seed=cfg.optim.seed)


def _references(cfg: GecConfig) -> dict[str, dict[str, Any]]:
    return {
        split: {name: load_references(specs) for name, specs in sets.items()}
        for split, sets in (("dev", cfg.data.dev), ("test", cfg.data.test))
    }


def _train_epoch(
    cfg: GecConfig, scorer: Seq2SeqScorer, optimizer: torch.optim.Optimizer, scheduler: Any,
    loss_fn: GecContrastiveLoss, feed: Feed, epoch: int, *, bar: ProgressWriter | None, step0: int,
    on_step: Callable[[int], None] = lambda step: None,
) -> dict[str, float]:
    """One pass over this rank's batches; time spent waiting for negatives is the feed's, not the step's."""
    scorer.train()
    sums = {"loss": 0.0, "ce": 0.0, "mml": 0.0, "ntokens": 0.0}
    step_time, steps, t_epoch = 0.0, 0, time.perf_counter()
    for batch_ex, batch_negs in feed.batches(epoch, scorer):
        t0 = time.perf_counter()
        batch = collate(batch_ex, batch_negs, scorer.tokenizer, max_length=cfg.model.max_length)
        out = gec_loss(scorer, batch.to(session.device()), loss_fn, stack_negatives=cfg.loss.stack_negatives)
        local_tokens = float(out.ntokens)
        optimizer.zero_grad(set_to_none=True)
        backward_global(out.loss, local_tokens, scorer)
        if cfg.optim.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(scorer.parameters(), cfg.optim.clip_norm)
        optimizer.step()
        scheduler.step()
        step_time += time.perf_counter() - t0
        steps += 1
        feed.after_step(step0 + steps, scorer)
        on_step(step0 + steps)
        if bar is not None:
            bar.update(step0 + steps, epoch=epoch + 1, loss=out.loss.item())
        for key, value in (("loss", out.loss.item() * local_tokens), ("ce", out.ce.item()),
                           ("mml", out.mml.item()), ("ntokens", local_tokens)):  # fmt: skip
            sums[key] += value
    n, wall = max(sums["ntokens"], 1.0), time.perf_counter() - t_epoch
    fm = feed.metrics()
    return {"loss": sums["loss"] / n, "ce_per_token": sums["ce"] / n, "mml_per_token": sums["mml"] / n,
            "timing/step": step_time / max(steps, 1), "timing/epoch": wall, **fm, "steps": steps,
            "timing/mine_wait_fraction": fm["timing/mine_wait"] / max(wall, 1e-9),
            # steady state: without the wait for the epoch's first batch (the pipeline filling up)
            "timing/mine_wait_fraction_steady": (fm["timing/mine_wait"] - fm["timing/mine_wait_first"])
            / max(wall - fm["timing/mine_wait_first"], 1e-9),
            "lr": scheduler.get_last_lr()[0]}  # fmt: skip


def _report(
    cfg: GecConfig, scorer: Seq2SeqScorer, optimizer: torch.optim.Optimizer, scheduler: Any,
    progress: dict[str, Any], refs: dict[str, dict[str, Any]], stats: dict[str, float], rank: int,
    out_dir: Path, *, last: bool,
) -> None:
    """Rank 0 evaluates dev and test, keeps the run's record in ``out_dir`` and a resumable checkpoint in
    Ray's storage; every rank reports (Ray Train waits for all of them)."""
    metrics: dict[str, Any] = {**stats, "epoch": progress["epoch"], "step": progress["step"]}
    if rank != 0:
        session.report(metrics)
        return
    t0 = time.perf_counter()
    improved = False
    if refs:  # test is decoded only when dev improves: the epoch selected on dev is always one of those
        metrics.update(evaluate_split(cfg, scorer, refs["dev"], prefix="dev"))
        improved = metrics["dev_f05"] > max((h.get("dev_f05", -1.0) for h in read_history(out_dir)), default=-1.0)
        if improved:
            metrics.update(evaluate_split(cfg, scorer, refs["test"], prefix="test"))
    metrics["timing/eval"] = time.perf_counter() - t0
    append_history(out_dir, metrics)
    if improved or (last and not refs):
        save_dir_atomic(scorer.save_pretrained, out_dir / ("best_model" if refs else "model"))
    with session.scratch_dir() as tmp:
        save_training_state(tmp, model=scorer, optimizer=optimizer, scheduler=scheduler, progress=progress)
        session.report(metrics, checkpoint_dir=tmp)


def evaluate_split(
    cfg: GecConfig, scorer: Seq2SeqScorer, sets: dict[str, Any], *, prefix: str
) -> dict[str, float]:
    """Decode every set of a split and score it with ERRANT: ``{prefix}_f05`` (mean over sets of the
    annotator-averaged F0.5, the paper's figure) and ``{prefix}/{set}/{p,r,f05,oe,ie,...}``."""
    out: dict[str, float] = {}
    f_values = []
    for name, refs in sets.items():
        hyps = decode(cfg, scorer, [r.source for r in refs])
        result = evaluate_gec(hyps, {name: refs})["refs"][name]
        avg = result["average"]
        for key in ("p", "r", "f0.5", "oe", "ie"):
            out[f"{prefix}/{name}/{key.replace('0.5', '05')}"] = float(avg[key])
        for ann, row in result["annotators"].items():
            for key in ("p", "r", "f0.5"):
                out[f"{prefix}/{name}/ann{ann}/{key.replace('0.5', '05')}"] = float(row[key])
        out[f"{prefix}/{name}/combined_f05"] = float(result["combined"]["f0.5"])
        f_values.append(float(avg["f0.5"]))
    out[f"{prefix}_f05"] = sum(f_values) / max(len(f_values), 1)
    return out


def decode(cfg: GecConfig, scorer: Seq2SeqScorer, sources: list[str]) -> list[str]:
    """The model's correction of each source (beam ``eval.beam``; 1 = greedy, GEC-BART's test setting)."""
    scorer.eval()
    with torch.no_grad():
        outs = scorer.generate(sources, num_beams=cfg.eval.beam, num_return_sequences=1,
                               max_new_tokens=cfg.eval.max_new_tokens, batch_size=cfg.eval.batch_size)  # fmt: skip
    return [o[0][0] if o else "" for o in outs]

