"""The coherence recipe's config (Jwalapuram, Joty & Lin, ACL 2022): ``tune_spaces/coherence.yaml``.

See docs/recipes/coherence.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raycl.config import LoopOptions, MiningSection, ScalingSection, TuneSection, require
from raycl.miners.sources import Permutations

LOSS_KINDS = ("pairwise", "contrastive", "momentum")


@dataclass
class CoherenceModelSection:
    preset: str = "smoke"  # smoke | small (offline MiniLM) | paper (xlnet-base-cased)
    name: str | None = None  # an HF encoder name or folder (from_pretrained) instead of the preset's weights
    checkpoint: str | None = None  # a trained coherence scorer folder to start from
    max_len: int = 0  # text tokens before <sep><cls>; 0 = the preset's (paper: 600)
    mask_padding: bool = True  # a real attention mask; false attends to padding like the paper's code
    seed: int = 0  # random init of config presets and of a fresh scoring head


@dataclass
class PermuteSection:
    """How documents become training items (the paper's WSJ permuted set, paper §2.1)."""

    copies: int = 20  # times each positive appears; negatives are never repeated across its copies
    min_sentences: int = 4  # shorter documents are dropped
    block_size: int = 10  # documents with `split_over`+ sentences are cut into blocks of this many
    split_over: int = 20
    seed: int = 100


@dataclass
class BuiltinCoherenceSection:
    train: int = 400  # documents per split of the built-in corpus
    dev: int = 40
    test: int = 60
    intrusion: int = 60
    lmvlm: int = 60
    seed: int = 0


@dataclass
class CoherenceDataSection:
    train: list[str] = field(default_factory=list)  # documents (.txt / .jsonl) or training pairs (pickle "negs")
    dev: list[str] = field(default_factory=list)  # pairs files (pickle / JSONL); empty = built-in
    test: dict[str, list[str]] = field(default_factory=dict)  # name -> pairs files (the held-out permuted test
    #                                                            and each independent set)
    annotations: dict[str, str] = field(default_factory=dict)  # test name -> annotators' labels (LMvLM)
    permute: PermuteSection = field(default_factory=PermuteSection)
    builtin: BuiltinCoherenceSection = field(default_factory=BuiltinCoherenceSection)


@dataclass
class CoherenceLossSection:
    kind: str = "momentum"  # pairwise | contrastive | momentum (λ·L_c + (1−λ)·L_m, the full model)
    margin: float = 0.1  # τ; subtracted from the negatives' scores, as the code
    lam: float = 0.85  # λ


@dataclass
class MomentumSection:
    m: float = 0.9999999  # θ_m ← mθ_m + (1−m)θ, after backward and before the optimizer step
    queue_size: int = 1000  # momentum reps of negative documents in the global queue


@dataclass
class CoherenceMiningSection(MiningSection):
    hard_negatives: bool = True  # rank num_rank candidates with fresh weights, keep num_negs (the full model)
    num_rank: int = 50  # candidates ranked per item
    num_negs: int = 5  # negatives trained on per item (pairwise uses the first)
    rank_every: int = 200  # items per mining chunk; weights are published at each chunk's start

    def miner_options(self) -> dict[str, Any]:
        """The ranking miner's keyword arguments (``raycl.miners.permutation``); a task waits (up to its lease) for
        the weights of its chunk instead of being ranked with older ones."""
        return {
            **super().miner_options(),
            "num_rank": self.num_rank,
            "num_negs": self.num_negs,
            "version_wait_s": self.lease_s,
        }

    def source(self, *, stream: Any = None, store: Any = None) -> Permutations:
        """Where a training's negatives come from: each item's own permutations and, given this training's stream
        and weight store (``mining.hard_negatives``), those its miners rank highest."""
        return Permutations(self.rank_every, self.max_staleness, stream, store)


@dataclass
class CoherenceOptimSection(LoopOptions):
    lr: float = 5e-6
    eps: float = 1e-6
    weight_decay: float = 0.0
    swa_lr: float = 1e-6  # SWALR anneals linearly to it over anneal_epochs scheduler calls
    anneal_epochs: int = 50  # scheduler calls (one per dev evaluation): 10 pairwise/contrastive, 50 momentum
    eval_every: int = 1000  # steps between dev evaluations (and scheduler calls)
    batch_size: int = 1  # items per step (the paper: 1)
    epochs: int = 1  # passes over the training items (the paper: a single pass)
    shuffle: bool = True  # shuffle the items once (momentum: random.seed(100)); false keeps file order
    clip_norm: float = 0.0  # 0 = no clipping (the code does not clip)
    seed: int = 100


@dataclass
class CoherenceEvalSection:
    batch_size: int = 16  # documents per scoring batch
    num_negs: int = 5  # negatives per dev/test item compared with the positive (the code: the first 5)


@dataclass
class CoherenceConfig:
    task: str = "coherence"
    model: CoherenceModelSection = field(default_factory=CoherenceModelSection)
    data: CoherenceDataSection = field(default_factory=CoherenceDataSection)
    loss: CoherenceLossSection = field(default_factory=CoherenceLossSection)
    momentum: MomentumSection = field(default_factory=MomentumSection)
    mining: CoherenceMiningSection = field(default_factory=CoherenceMiningSection)
    optim: CoherenceOptimSection = field(default_factory=CoherenceOptimSection)
    eval: CoherenceEvalSection = field(default_factory=CoherenceEvalSection)
    scaling: ScalingSection = field(default_factory=ScalingSection)
    tune: TuneSection = field(default_factory=lambda: TuneSection(metric="dev_acc"))

    def validate(self, where: str) -> None:
        from raycl.models.coherence_presets import COHERENCE_PRESETS

        m, o, mo = self.mining, self.optim, self.momentum
        require(
            self.model.preset in COHERENCE_PRESETS,
            where,
            "model.preset",
            f"one of {', '.join(COHERENCE_PRESETS)}",
            self.model.preset,
        )
        require(
            self.model.max_len >= 0,
            where,
            "model.max_len",
            "an integer ≥ 0 (0 = the preset's)",
            self.model.max_len,
        )
        require(self.loss.kind in LOSS_KINDS, where, "loss.kind", " or ".join(LOSS_KINDS), self.loss.kind)
        require(self.loss.margin >= 0, where, "loss.margin", "a number ≥ 0", self.loss.margin)
        require(0.0 <= self.loss.lam <= 1.0, where, "loss.lam", "a number in [0, 1]", self.loss.lam)
        require(0.0 <= mo.m <= 1.0, where, "momentum.m", "a number in [0, 1]", mo.m)
        require(mo.queue_size >= 0, where, "momentum.queue_size", "an integer ≥ 0", mo.queue_size)
        require(m.num_negs >= 1, where, "mining.num_negs", "an integer ≥ 1", m.num_negs)
        require(
            m.num_rank >= m.num_negs, where, "mining.num_rank", f"≥ mining.num_negs = {m.num_negs}", m.num_rank
        )
        require(m.rank_every >= 1, where, "mining.rank_every", "an integer ≥ 1", m.rank_every)
        require(o.lr > 0 and o.swa_lr > 0, where, "optim.lr", "learning rates > 0", (o.lr, o.swa_lr))
        require(o.anneal_epochs >= 1, where, "optim.anneal_epochs", "an integer ≥ 1", o.anneal_epochs)
        require(o.eval_every >= 1, where, "optim.eval_every", "an integer ≥ 1", o.eval_every)
        require(o.batch_size >= 1, where, "optim.batch_size", "an integer ≥ 1", o.batch_size)
        require(o.epochs >= 0, where, "optim.epochs", "an integer ≥ 0", o.epochs)
        require(self.eval.num_negs >= 1, where, "eval.num_negs", "an integer ≥ 1", self.eval.num_negs)
        p = self.data.permute
        require(
            p.copies >= 1 and p.min_sentences >= 2 and p.block_size >= 2,
            where,
            "data.permute",
            "copies ≥ 1, min_sentences ≥ 2, block_size ≥ 2",
            (p.copies, p.min_sentences, p.block_size),
        )
