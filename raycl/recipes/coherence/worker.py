"""The coherence recipe's side of the one training loop (``raycl.training.loop``), fed by the miner pool.

Per epoch (the paper: one pass) this rank's items are consumed in ``optim.batch_size`` steps. Negatives come from
the item itself (its first ``mining.num_negs``; pairwise uses one) — or, with ``mining.hard_negatives``, after
the first chunk of ``mining.rank_every`` items, from the negative stream: at each chunk's start the weights are
published as a new version and the miners rank every item's first ``mining.num_rank`` candidates with weights at
most ``mining.max_staleness`` versions old, keeping the ``num_negs`` highest scored. ``max_staleness = 0`` is
the paper's schedule (each chunk ranked by the model as it is when the chunk starts); 1 lets the miners rank the
next chunk while this one trains. Every ``optim.eval_every`` steps: a scheduler step (SWALR), dev accuracy, test
sets when dev improved, a report and a checkpoint (model, optimizer, momentum encoder, queue, ledger position,
weight version), from which a restarted worker group resumes mid-epoch. The momentum encoder and the queue are the
state's ``extras``: the encoder follows the scorer's train/eval mode (dropout in training, as the released
``model.train()`` on the module holding both encoders).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from torch.optim.swa_utils import SWALR

from raycl.collectives import all_gather_floats
from raycl.config.tasks.coherence import CoherenceConfig
from raycl.data.coherence import read_pairs
from raycl.memory.momentum import momentum_update
from raycl.memory.negative_queue import NegativeQueue
from raycl.models.coherence import CoherenceScorer, MomentumEncoder
from raycl.recipes.coherence.evaluation import Evaluator
from raycl.recipes.coherence.inputs import in_training_order
from raycl.recipes.coherence.step import CoherenceBatch, coherence_loss, collate
from raycl.training.batching import BatchPlan, row_batches, sourced
from raycl.training.negatives import Place
from raycl.training.optim import from_section
from raycl.training.state import CheckpointedRandom
from raycl.training.task import Batch, Epoch, Report, StepContext, TaskBase, TrainState, Worker
from raycl.training.timing import Window


@dataclass
class CoherenceState(TrainState):
    @property
    def momentum(self) -> MomentumEncoder | None:
        return self.extras.get("momentum")

    @property
    def rng(self) -> CheckpointedRandom:
        return self.extras["prefix_rng"]  # type: ignore[no-any-return]


@dataclass(frozen=True)
class CoherenceTask(TaskBase):
    """The loop's settings are ``optim``'s: gradients summed after the backward, not DDP — an odd number of
    documents, or items skipped for want of negatives, give the ranks different numbers of batches, which only the
    loop's join can even out (DDP would wait forever for the rank that ran out)."""

    shown: ClassVar[tuple[str, ...]] = ("dev_acc", "timing/mine_wait_fraction")  # on rank 0's progress line
    model_class = CoherenceScorer
    evaluator = Evaluator  # rank 0's: dev accuracy; the test sets when dev improved (on_best)
    kept = "dev_acc"
    cfg: CoherenceConfig
    train_items: str  # the permuted training set (JSONL), in file order

    @property
    def need(self) -> int:
        """Negatives an item trains on (pairwise: one); an item with fewer is skipped."""
        return 1 if self.cfg.loss.kind == "pairwise" else self.cfg.mining.num_negs

    def build(self, model: CoherenceScorer, w: Worker, progress: dict[str, Any] | None) -> CoherenceState:
        c, o = self.cfg, self.cfg.optim
        optimizer = from_section(model, o)
        extras: dict[str, Any] = {
            "queue": NegativeQueue(
                int(model.encoder.config.hidden_size), size=c.momentum.queue_size, num_negs=c.mining.num_negs
            ).to(w.device)
        }
        if c.loss.kind == "momentum":
            extras["momentum"] = MomentumEncoder(model)
        p = dict(progress or {"done": 0})
        extras["prefix_rng"] = CheckpointedRandom(o.seed + 1000 * w.rank)
        st = CoherenceState(model, [optimizer], [None], p, extras, per_rank=("queue", "prefix_rng"))
        st.extras["swalr"] = SWALR(
            optimizer, swa_lr=o.swa_lr, anneal_epochs=o.anneal_epochs, anneal_strategy="linear"
        )  # one step per report, as the released code
        items = in_training_order(c, read_pairs(self.train_items))
        shards = [items[r :: w.world_size] for r in range(w.world_size)]
        spec = w.job.negatives if w.job.negatives is not None else c.mining.source()
        st.source = w.session.open_source(spec, Place(w.rank, w.world_size, items, shards, o.batch_size))
        # rank r's shares of global batches of W·B items are its shard cut into batches of B: the same count
        plan = BatchPlan([len(items)], batch_size=o.batch_size, seed=o.seed, world_size=w.world_size)
        st.total_updates = plan.updates(o.epochs, o.update_freq)  # the other ranks join its updates
        st.epochs = o.epochs
        return st

    def epoch(self, st: CoherenceState, w: Worker, epoch: int, start: int) -> Epoch:
        """This rank's batches of ``epoch`` from its checkpoint's position (``done`` items, the stream's ledger);
        a report every ``optim.eval_every`` updates, none at an epoch's end (the end of training has one)."""
        p = st.progress
        if start == 0:  # a new epoch (a resumed one starts where its checkpoint's batch and items were)
            p["done"] = 0
        done = p.get("done", 0)
        pools = sourced(st.source, epoch, done, st.model)  # the stream's part scheduled now
        rng = None
        if self.cfg.loss.kind == "momentum":  # the slices are drawn as batches are collated, ahead of their step
            rng = CheckpointedRandom()
            rng.setstate(st.rng.getstate())
        cut = row_batches(pools, self.cfg.optim.batch_size, done=done, take=self._negatives)
        batches = (dataclasses.replace(b, data=(*b.data, rng)) if isinstance(b, Batch) else b for b in cut)
        return Epoch(batches, eval_every=self.cfg.optim.eval_every, report_at_end=False)

    def _negatives(self, item: Any, negs: list[tuple[str, ...]]) -> list[tuple[str, ...]] | None:
        """The negatives an item trains on (its first ``need``), or None: the code skips an item with fewer."""
        return negs[: self.need] if len(negs) >= self.need else None

    def compiled_modules(self, st: CoherenceState) -> list[Any]:
        """The scorer and, under the momentum loss, the momentum encoder: a step runs both forwards."""
        return [st.model, *([st.momentum] if st.momentum is not None else [])]

    def collate(self, st: CoherenceState, data: Any) -> CoherenceBatch:
        items, negs, rng = data
        return collate(
            st.model,
            [it.pos for it in items],
            negs,
            momentum=rng is not None,
            rng=rng,
            pad_to_multiple_of=self.settings.pad_to_multiple_of,
        )

    def step(self, st: CoherenceState, batch: CoherenceBatch, ctx: StepContext) -> dict[str, Any]:
        c = self.cfg
        if batch.rng_state is not None:  # the generator's state after this batch: what a checkpoint holds
            st.rng.setstate(batch.rng_state)
        out = coherence_loss(
            ctx.module,
            batch,
            kind=c.loss.kind,
            margin=c.loss.margin,
            lam=c.loss.lam,
            momentum=st.momentum,
            queue=st.extras["queue"],
        )
        ctx.backward(out.loss, weight=float(batch.b))  # the items' summed loss: workers average over all items
        return {"loss": out.loss.detach(), "l_c": out.l_c, "l_m": out.l_m, "items": float(batch.b)}

    def before_update(self, st: CoherenceState) -> None:
        if st.momentum is not None:  # after backward, before the step: the EMA uses the pre-step weights
            momentum_update(st.momentum.encoder, st.model.encoder, m=self.cfg.momentum.m)

    def metrics(self, st: CoherenceState, window: Window, rep: Report, w: Worker) -> dict[str, Any]:
        """Every rank: one SWALR step per report; the interval's losses; rank 0's checkpoint position in the
        stream's ledger (the source's state, which the loop checkpoints)."""
        st.extras["swalr"].step()  # the loop's ``lr`` is the rate SWALR has just set
        p = st.progress
        done = [int(v[0]) for v in all_gather_floats([float(p["done"])])]  # every rank's position
        mid_epoch = not rep.info.get("epoch_end") and p["done"]
        st.source.saved_ledger = st.source.ledger_state(p["epoch"], done) if mid_epoch else None
        return {**super().metrics(st, window, rep, w), "items": window.sums.get("items", 0.0)}  # items: summed

    def on_best(self, st: CoherenceState, rep: Report, w: Worker) -> dict[str, Any]:
        assert st.evals is not None
        return st.evals.test(st.model)
