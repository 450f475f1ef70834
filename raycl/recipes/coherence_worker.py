"""The coherence training loop on one Ray Train worker (SPEC §2.2), fed by the miner pool.

Per epoch (the paper: one pass) this rank's items are consumed in ``optim.batch_size`` steps. Negatives come from
the item itself (its first ``mining.num_negs``; pairwise uses one) — or, with ``mining.hard_negatives``, after
the first chunk of ``mining.rank_every`` items, from the negative stream: at each chunk's start the weights are
published as a new version and the miners rank every item's first ``mining.num_rank`` candidates with weights at
most ``mining.max_staleness`` versions old, keeping the ``num_negs`` highest scored. ``max_staleness = 0`` is
the paper's schedule (each chunk ranked by the model as it is when the chunk starts); 1 lets the miners rank the
next chunk while this one trains. Every ``optim.eval_every`` steps: a scheduler step (SWALR), dev accuracy, test
sets when dev improved, a report and a checkpoint (model, optimizer, scheduler, momentum encoder, queue, ledger
position, weight version), from which a restarted worker group resumes mid-epoch.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.optim.swa_utils import SWALR

from raycl.config import from_dict
from raycl.configs.coherence import CoherenceConfig
from raycl.data.coherence import CoherenceItem, read_annotations, read_pairs
from raycl.distributed import session
from raycl.distributed.consumer import StreamConsumer
from raycl.evaluation.coherence_eval import score_items
from raycl.evaluation.coherence_metrics import krippendorff_alpha_nominal, model_labels, pairwise_accuracy
from raycl.memory.momentum import momentum_update
from raycl.memory.negative_queue import NegativeQueue
from raycl.miners.permutation import decode_doc
from raycl.models.coherence import CoherenceScorer, MomentumEncoder
from raycl.recipes.common import append_history, read_history, save_dir_atomic
from raycl.train.chaos import crash_switch
from raycl.train.checkpoint import MODEL_DIR, load_training_state, save_training_state, seed_everything
from raycl.train.coherence_step import coherence_loss
from raycl.train.progress import ProgressWriter

EXTRA_STATE = "coherence_state.pt"
Negs = list[tuple[str, ...]]


def shards_of(items: list[CoherenceItem], world_size: int) -> list[list[CoherenceItem]]:
    return [items[r::world_size] for r in range(world_size)]


class CoherenceFeed:
    """This rank's (item, negatives) pairs of an epoch, resumable at ``done`` items; mined ones from the stream."""

    def __init__(self, cfg: CoherenceConfig, shards: list[list[CoherenceItem]], rank: int,
                 consumer: StreamConsumer | None) -> None:  # fmt: skip
        self.cfg, self.shards, self.rank, self.consumer = cfg, shards, rank, consumer
        self.need = 1 if cfg.loss.kind == "pairwise" else cfg.mining.num_negs

    def static(self, epoch: int) -> int:
        """How many of a rank's first items train on their own negatives: the first chunk, in epoch 0 only."""
        return min(self.cfg.mining.rank_every, len(self.shards[self.rank])) if epoch == 0 else 0

    def items(self, epoch: int, done: int, model: torch.nn.Module) -> Iterator[tuple[CoherenceItem, Negs]]:
        shard, first = self.shards[self.rank], self.static(epoch) if self.consumer else len(self.shards[self.rank])
        for item in shard[done:first]:
            yield item, list(item.negs[: self.need])
        if self.consumer is None:
            return
        every, pos = self.cfg.mining.rank_every, max(done, first)
        while pos < len(shard):
            if pos % every == 0:  # a chunk starts: the miners rank it with these weights (or newer)
                self.consumer.publish(model)
            got = self.consumer.take(min(self.cfg.optim.batch_size, every - pos % every), epoch=epoch)
            if not got:
                return
            for it in got:
                pos += 1
                yield self.by_id[it.id], [decode_doc(d) for d in it.negatives][: self.need]

    def start_epoch(self, epoch: int, state: dict[str, Any] | None) -> None:
        """Schedule the stream's part of ``epoch`` (rank 0), or restore it from a checkpoint's ledger state."""
        if self.consumer is None:
            return
        self.by_id = {it.id: it for it in self.shards[self.rank]}
        every, v0 = self.cfg.mining.rank_every, self.consumer.version
        firsts = [min(every, len(s)) if epoch == 0 else 0 for s in self.shards]
        # the version published at the start of an item's chunk, known now: miners wait for it (less the allowed
        # staleness) rather than rank with older weights what the trainer would refuse
        floors = {it.id: v0 + pos // every + (epoch > 0) - self.cfg.mining.max_staleness
                  for s, f in zip(self.shards, firsts, strict=True) for pos, it in enumerate(s) if pos >= f}
        self.consumer.start_epoch(epoch, [s[f:] for s, f in zip(self.shards, firsts, strict=True)], shuffle=False,
                                  min_versions=floors)  # fmt: skip
        if state is not None and self.rank == 0:
            self.consumer.restore(state)

    def ledger_state(self, epoch: int, done: list[int]) -> dict[str, Any] | None:
        if self.consumer is None:
            return None
        firsts = [min(self.cfg.mining.rank_every, len(s)) if epoch == 0 else 0 for s in self.shards]
        return self.consumer.ledger_state([max(d - f, 0) for d, f in zip(done, firsts, strict=True)])


def _all_ranks(value: int) -> list[int]:
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return [int(v) for v in out]


def train_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point. ``loop_config``: ``config``, ``init_model``, ``train_items`` (a JSONL of items),
    ``out_dir`` (rank 0 keeps ``history.jsonl`` and ``best_model/``), and ``stream``/``store`` when mining."""
    cfg: CoherenceConfig = from_dict(CoherenceConfig, loop_config["config"])
    rank, world_size = session.world()
    seed_everything(cfg.optim.seed)
    shards = shards_of(read_pairs(loop_config["train_items"]), world_size)
    consumer = None
    if loop_config.get("stream") is not None:
        consumer = StreamConsumer(loop_config["stream"], loop_config["store"], rank=rank, world_size=world_size,
                                  max_staleness=cfg.mining.max_staleness)  # fmt: skip
    feed = CoherenceFeed(cfg, shards, rank, consumer)
    state = _restore(cfg, loop_config)
    model = session.prepare_model(state.scorer)
    if consumer is not None:
        consumer.version = int(state.progress.get("version", 0))
        newest = consumer.store_version()
        if newest > consumer.version:  # the dead run published past the checkpoint: republish the truth
            consumer.publish(state.scorer, after=newest)
    _loop(cfg, loop_config, model, state, feed, rank)


class _State:
    """Everything a checkpoint holds; built fresh or from the checkpoint a restarted worker resumes from."""

    def __init__(self, cfg: CoherenceConfig, scorer: CoherenceScorer) -> None:
        o = cfg.optim
        self.scorer = scorer.to(session.device())
        self.momentum = MomentumEncoder(scorer) if cfg.loss.kind == "momentum" else None
        hidden = int(scorer.encoder.config.hidden_size)
        self.queue = NegativeQueue(hidden, size=cfg.momentum.queue_size, num_negs=cfg.mining.num_negs)
        self.queue.to(session.device())
        self.optimizer = torch.optim.AdamW(scorer.parameters(), lr=o.lr, eps=o.eps, weight_decay=o.weight_decay)
        self.scheduler = SWALR(self.optimizer, swa_lr=o.swa_lr, anneal_epochs=o.anneal_epochs,
                               anneal_strategy="linear")  # fmt: skip
        self.progress: dict[str, Any] = {"epoch": 0, "step": 0, "done": 0, "version": 0, "ledger": None}

    def save(self, folder: Path) -> None:
        save_training_state(folder, model=self.scorer, optimizer=self.optimizer, scheduler=self.scheduler,
                            progress=self.progress)  # fmt: skip
        extra = {"queue": self.queue.state_dict(),
                 "momentum": self.momentum.state_dict() if self.momentum is not None else None}  # fmt: skip
        torch.save(extra, folder / f".{EXTRA_STATE}.tmp")
        (folder / f".{EXTRA_STATE}.tmp").replace(folder / EXTRA_STATE)


def _restore(cfg: CoherenceConfig, loop_config: dict[str, Any]) -> _State:
    with session.resume_dir() as ckpt:
        if ckpt is None:
            return _State(cfg, CoherenceScorer.from_pretrained(loop_config["init_model"]))
        state = _State(cfg, CoherenceScorer.from_pretrained(ckpt / MODEL_DIR))
        state.progress = load_training_state(ckpt, optimizer=state.optimizer, scheduler=state.scheduler)
        extra = torch.load(ckpt / EXTRA_STATE, map_location=session.device(), weights_only=False)
        state.queue.load_state_dict(extra["queue"])
        if state.momentum is not None and extra["momentum"] is not None:
            state.momentum.load_state_dict(extra["momentum"])
        return state


def _batches(cfg: CoherenceConfig, pairs: Iterator[tuple[CoherenceItem, Negs]], need: int
             ) -> Iterator[tuple[list[CoherenceItem], list[Negs], int]]:  # fmt: skip
    """Steps of ``optim.batch_size`` usable items (those with ``need`` negatives); the items each step consumed."""
    batch: list[tuple[CoherenceItem, Negs]] = []
    consumed = 0
    for item, negs in pairs:
        consumed += 1
        if len(negs) >= need:  # the code skips items with fewer negatives than it trains on
            batch.append((item, negs[:need]))
        if len(batch) == cfg.optim.batch_size:
            yield [b[0] for b in batch], [b[1] for b in batch], consumed
            batch, consumed = [], 0
    if batch:
        yield [b[0] for b in batch], [b[1] for b in batch], consumed


def _loop(cfg: CoherenceConfig, loop_config: dict[str, Any], model: torch.nn.Module, state: _State,
          feed: CoherenceFeed, rank: int) -> None:  # fmt: skip
    out_dir = Path(loop_config["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    evals = _Evaluator(cfg) if rank == 0 else None
    total = len(feed.shards[rank]) * cfg.optim.epochs // cfg.optim.batch_size
    bar = ProgressWriter(out_dir, total=max(total, 1)) if rank == 0 else None
    on_step = crash_switch(loop_config.get("chaos"), rank=rank)
    rng = random.Random(cfg.optim.seed + 1000 * rank + state.progress["step"])
    window = _Window(feed)
    p = state.progress
    for epoch in range(p["epoch"], cfg.optim.epochs):
        feed.start_epoch(epoch, p.get("ledger") if epoch == p["epoch"] else None)
        done = p["done"] if epoch == p["epoch"] else 0
        pairs = feed.items(epoch, done, state.scorer)
        for items, negs, consumed in _batches(cfg, pairs, feed.need):
            t0 = time.perf_counter()
            state.scorer.train()
            out = coherence_loss(model, state.scorer, [it.pos for it in items], negs, kind=cfg.loss.kind,
                                 margin=cfg.loss.margin, lam=cfg.loss.lam, momentum=state.momentum,
                                 queue=state.queue, rng=rng)  # fmt: skip
            state.optimizer.zero_grad(set_to_none=True)
            out.loss.backward()
            if cfg.optim.clip_norm > 0:
                torch.nn.utils.clip_grad_norm_(state.scorer.parameters(), cfg.optim.clip_norm)
            if state.momentum is not None:  # after backward, before the step: the EMA uses the pre-step weights
                momentum_update(state.momentum.encoder, state.scorer.encoder, m=cfg.momentum.m)
            state.optimizer.step()
            done += consumed
            p.update(step=p["step"] + 1, done=done, epoch=epoch)
            window.add(out, time.perf_counter() - t0, len(items))
            if bar is not None:
                bar.update(p["step"], epoch=epoch + 1, loss=float(out.loss.detach()))
            on_step(p["step"])
            if p["step"] % cfg.optim.eval_every == 0:
                _evaluate_and_report(cfg, state, evals, window, feed, out_dir, epoch)
        p.update(epoch=epoch + 1, done=0, ledger=None)
    if p["step"] % cfg.optim.eval_every or p["step"] == 0:  # the end of training is always evaluated
        _evaluate_and_report(cfg, state, evals, window, feed, out_dir, p["epoch"], final=True)


class _Window:
    """Sums of one report interval: losses, step time, items, and the stream's waiting time."""

    def __init__(self, feed: CoherenceFeed) -> None:
        self.feed = feed
        self.reset()

    def reset(self) -> None:
        self.t0, self.steps, self.items, self.step_s = time.perf_counter(), 0, 0, 0.0
        self.loss = self.l_c = self.l_m = 0.0
        c = self.feed.consumer
        self.wait0 = c.stats.mine_wait if c is not None else 0.0

    def add(self, out: Any, step_s: float, items: int) -> None:
        self.steps, self.items, self.step_s = self.steps + 1, self.items + items, self.step_s + step_s
        self.loss += float(out.loss.detach())
        self.l_c, self.l_m = self.l_c + out.l_c, self.l_m + out.l_m

    def metrics(self) -> dict[str, float]:
        n, wall = max(self.steps, 1), time.perf_counter() - self.t0
        c = self.feed.consumer
        wait = max(c.stats.mine_wait - self.wait0, 0.0) if c is not None else 0.0  # stats restart each epoch
        out = {"loss": self.loss / n, "l_c": self.l_c / n, "l_m": self.l_m / n, "timing/step": self.step_s / n,
               "timing/interval": wall, "timing/mine_wait": wait, "items": float(self.items),
               "timing/mine_wait_fraction": wait / max(wall, 1e-9)}  # fmt: skip
        if c is not None:
            out.update({**c.stats.metrics(), "stream/version": float(c.version)})
            out.pop("timing/mine_wait_first", None)
            out["timing/mine_wait"] = wait
        return out


def _evaluate_and_report(
    cfg: CoherenceConfig, state: _State, evals: _Evaluator | None, window: _Window, feed: CoherenceFeed,
    out_dir: Path, epoch: int, *, final: bool = False,
) -> None:  # fmt: skip
    """Scheduler step, then rank 0 scores dev (and test when dev improved) and keeps the run's record; every rank
    reports with rank 0's checkpoint (Ray Train waits for all of them)."""
    p = state.progress
    state.scheduler.step()  # one SWALR call per dev evaluation, as the code
    metrics: dict[str, Any] = {**window.metrics(), "step": p["step"], "epoch": epoch,
                               "lr": state.scheduler.get_last_lr()[0]}  # fmt: skip
    done = _all_ranks(p["done"])
    p["version"] = feed.consumer.version if feed.consumer is not None else 0
    p["ledger"] = feed.ledger_state(epoch, done) if not final and p["done"] else None
    if evals is None:
        session.report(metrics)
        window.reset()
        return
    metrics.update(evals.dev(state.scorer))
    history = read_history(out_dir)
    if metrics["dev_acc"] > max((h.get("dev_acc", -1.0) for h in history), default=-1.0):
        metrics.update(evals.test(state.scorer))
        save_dir_atomic(state.scorer.save_pretrained, out_dir / "best_model")
    append_history(out_dir, metrics, key="step")
    with session.scratch_dir() as tmp:
        state.save(tmp)
        session.report(metrics, checkpoint_dir=tmp)
    window.reset()


class _Evaluator:
    """Rank 0's dev and test sets, read once: pairwise accuracy (ties wrong) and, with annotations, α."""

    def __init__(self, cfg: CoherenceConfig) -> None:
        self.cfg = cfg
        self.dev_items = [it for spec in cfg.data.dev for it in read_pairs(spec)]
        self.tests = {name: [it for spec in specs for it in read_pairs(spec)]
                      for name, specs in cfg.data.test.items()}  # fmt: skip
        self.coders = {name: read_annotations(path) for name, path in cfg.data.annotations.items()}

    def _scores(self, scorer: CoherenceScorer, items: list[CoherenceItem]) -> tuple[list[float], list[Any]]:
        return score_items(scorer, items, num_negs=self.cfg.eval.num_negs, batch_size=self.cfg.eval.batch_size)

    def dev(self, scorer: CoherenceScorer) -> dict[str, float]:
        return {"dev_acc": pairwise_accuracy(*self._scores(scorer, self.dev_items))}

    def test(self, scorer: CoherenceScorer) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, items in self.tests.items():
            pos, negs = self._scores(scorer, items)
            out[f"test/{name}/acc"] = pairwise_accuracy(pos, negs)
            if name in self.coders:
                coders = self.coders[name]
                labels = model_labels(pos, [n[0] for n in negs])  # the model as one more coder, ties missing
                out[f"test/{name}/alpha"] = krippendorff_alpha_nominal([*coders, labels])
                out[f"test/{name}/human_alpha"] = krippendorff_alpha_nominal(coders)
        return out
