"""The SemEval-2022 Task 2 Subtask B recipe's config (ZhichunRoad; docs/recipes/sts.md): ``tune_spaces/sts.yaml``.

Data keys left empty are filled with the built-in set (``raycl.data.semeval_corpus``), written under the run
folder. The official files come in groups: ``dev``, ``dev_gold`` and ``dev_submission_format`` are all given or
all left empty (the same for ``eval`` and ``eval_submission_format``; ``eval_gold`` may stay empty, as in the real
data, and then there are no test scores).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raycl.config import LoopOptions, ScalingSection, TuneSection, require
from raycl.miners.sources import DenseRefresh

JOINT_KINDS = ("sum", "alternate")


@dataclass
class StsModelSection:
    preset: str = "paper"  # smoke | small (offline MiniLM) | paper (bert-base-multilingual-cased)
    checkpoint: str | None = None  # an HF encoder (name or folder) for the preset, or a SentenceEncoder folder
    cross_attention: bool = True  # false: the MSE cosine (and the prediction) on mean-pooled encoder outputs
    max_seq_length: int = 64
    seed: int = 0  # fresh weights: the smoke encoder, the cross-attention, the MWE token rows


@dataclass
class BuiltinStsSection:
    seed: int = 0


@dataclass
class StsDataSection:
    sts_pretrain: list[str] = field(default_factory=list)  # raycl's STS CSV (split, Language, s1, s2, score 0–5)
    train_data: str = ""  # train_data.csv of Subtask B
    dev: str = ""
    dev_gold: str = ""
    dev_submission_format: str = ""
    eval: str = ""
    eval_gold: str = ""  # empty with a user's eval: no test scores (the real data has no eval gold)
    eval_submission_format: str = ""
    upstream_quirk: bool = True  # sentence 2 rewritten with MWE1's pattern, the MWE as a raw regex, as upstream
    builtin: BuiltinStsSection = field(default_factory=BuiltinStsSection)


@dataclass
class StsLossSection:
    joint: str = "alternate"  # alternate: a step per objective, an AdamW each (released code); sum: raycl's option
    lam: float = 0.15  # λ; 0 = MSE only (no contrastive pass)
    temperature: float = 0.05  # τ (the code's scale 20)


@dataclass
class MocoSection:
    queue_size: int = 80  # Q = int(32 · 2.5); 0 = in-batch InfoNCE (no key encoder)
    m: float = 0.999
    update_every_forward: bool = False  # false: once per step (the released cadence); true: after every forward


@dataclass
class StsPhaseSection:
    epochs: int = 30
    eval_every: int = 250  # steps between dev evaluations (each epoch's end is evaluated too)
    seed: int = 4


@dataclass
class StsOptimSection(LoopOptions):
    lr: float = 2e-5  # AdamW, one optimiser per objective with loss.joint=alternate
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    warmup_ratio: float = 0.1  # linear warm-up, then linear decay to 0 at the fit's end
    # released: ratio × the contrastive loader's length × epochs in pre-training (that loader holds both sentences
    # of every pair: effectively 20% of the steps), ratio × the pair loader × k in the k-th one-epoch fine-tuning
    # fit (it grows with k, past the fit from k = 10); steps: ratio × the fit's steps (raycl's option)
    warmup: str = "released"
    batch_size: int = 32  # pairs per MSE step and sentences per contrastive step, per worker


@dataclass
class StsEvalSection:
    batch_size: int = 64  # pairs per prediction batch; also the alignment/uniformity batch (the paper's script)
    align_min_score: float = 4.0  # STS pairs with score ≥ this are ℓ_align's positives


@dataclass
class StsMiningSection:
    """Dense hard negatives for the contrastive objective (docs/recipes/sts.md#dense-hard-negatives): a pool mined
    once per run by ``raycl.mine_dense_negatives`` with the base encoder, or a Parquet file/folder of it; each
    trial keeps, per anchor, the ``num_negatives`` hardest that pass its margins."""

    dense: bool = False  # train with dense negatives: those of ``negatives``, or a pool the driver mines
    negatives: str = ""  # Parquet file/folder of ``raycl.mine dense``; empty: the driver mines <run>/mining/dense
    num_negatives: int = 3  # per anchor, the hardest survivors of the margins (0 = in-batch only)
    relative_margin: float | None = None  # keeps s ≤ p − |p|·r (p: the anchor's hardest positive score)
    absolute_margin: float | None = None  # keeps s ≤ p − m
    positive_min_score: float = 4.0  # STS training pairs with score ≥ this are (anchor, positive) pairs to mine
    pool: int = 16  # candidates mined per anchor, no margin (range_max), eval.batch_size a batch: trials select
    # refreshed while training (ANCE-style; docs/dense.md#refreshed-while-training): the pool is version 0
    refresh: bool = False  # miners re-mine every anchor with the weights the trainer publishes
    refresh_every: int = 100  # training steps between weight publications (≥ 1 with refresh)
    max_staleness: int = 1  # a negative mined with version v is used while the trainer is at ≤ v + this
    wait_s: float = 60.0  # after a publication, the most a trainer waits for negatives within the staleness bound
    num_miners: int = 1
    cpus_per_miner: float = 1.0
    task_size: int = 16  # anchors per miner task

    def source(self, *, stream: Any = None, store: Any = None) -> DenseRefresh | None:
        """Where a training's refreshed negatives come from: the stream and weight store of its own miners
        (``refresh``); None otherwise (the pool's, or in-batch only, are read by the recipe)."""
        if not self.refresh or stream is None:
            return None
        return DenseRefresh(stream, store, self.refresh_every, self.max_staleness, self.wait_s)


@dataclass
class StsConfig:
    task: str = "sts"
    model: StsModelSection = field(default_factory=StsModelSection)
    data: StsDataSection = field(default_factory=StsDataSection)
    loss: StsLossSection = field(default_factory=StsLossSection)
    moco: MocoSection = field(default_factory=MocoSection)
    pretrain: StsPhaseSection = field(default_factory=StsPhaseSection)
    finetune: StsPhaseSection = field(default_factory=lambda: StsPhaseSection(epochs=3, eval_every=250, seed=1))
    optim: StsOptimSection = field(default_factory=StsOptimSection)
    eval: StsEvalSection = field(default_factory=StsEvalSection)
    scaling: ScalingSection = field(default_factory=ScalingSection)
    tune: TuneSection = field(default_factory=lambda: TuneSection(metric="dev_spearman"))
    mining: StsMiningSection = field(default_factory=StsMiningSection)

    @property
    def mines_dense(self) -> bool:
        """Whether the contrastive objective takes dense negatives (the pool mined, or the file given; λ = 0 has no
        contrastive objective, so the MSE-only rung of a ladder at a mining point takes none)."""
        m = self.mining
        return m.dense and m.num_negatives > 0 and self.loss.lam > 0

    @property
    def refreshes(self) -> bool:
        """Whether miners refresh the dense negatives while this trains (a rung without them refreshes none)."""
        return self.mines_dense and self.mining.refresh

    @property
    def final_setting(self) -> str:
        """The setting a trial ends in, whose dev Spearman is the Tune metric."""
        return "fine_tune" if self.finetune.epochs > 0 else "pre_train"

    def validate(self, where: str) -> None:
        from raycl.models.sentence_encoder import PRESETS

        m, lo, mo, o, d = self.model, self.loss, self.moco, self.optim, self.data
        require(m.preset in PRESETS, where, "model.preset", f"one of {', '.join(PRESETS)}", m.preset)
        require(m.max_seq_length >= 8, where, "model.max_seq_length", "an integer ≥ 8", m.max_seq_length)
        require(lo.joint in JOINT_KINDS, where, "loss.joint", " or ".join(JOINT_KINDS), lo.joint)
        require(lo.lam >= 0, where, "loss.lam", "a number ≥ 0", lo.lam)
        require(lo.temperature > 0, where, "loss.temperature", "a number > 0", lo.temperature)
        require(mo.queue_size >= 0, where, "moco.queue_size", "an integer ≥ 0", mo.queue_size)
        require(0.0 <= mo.m <= 1.0, where, "moco.m", "a number in [0, 1]", mo.m)
        for name, p in (("pretrain", self.pretrain), ("finetune", self.finetune)):
            require(p.epochs >= 0, where, f"{name}.epochs", "an integer ≥ 0", p.epochs)
            require(p.eval_every >= 1, where, f"{name}.eval_every", "an integer ≥ 1", p.eval_every)
        require(o.lr > 0, where, "optim.lr", "a number > 0", o.lr)
        require(o.weight_decay >= 0, where, "optim.weight_decay", "a number ≥ 0", o.weight_decay)
        require(o.clip_norm >= 0, where, "optim.clip_norm", "a number ≥ 0 (0 = no clipping)", o.clip_norm)
        require(0.0 <= o.warmup_ratio < 1.0, where, "optim.warmup_ratio", "a number in [0, 1)", o.warmup_ratio)
        require(o.warmup in ("released", "steps"), where, "optim.warmup", "released | steps", o.warmup)
        require(
            o.update_freq == 1 or lo.joint != "alternate" or self.loss.lam == 0,
            where,
            "optim.update_freq",
            "1 with loss.joint=alternate (each objective steps its own optimiser every batch)",
            o.update_freq,
        )
        require(o.batch_size >= 2, where, "optim.batch_size", "an integer ≥ 2 (in-batch negatives)", o.batch_size)
        require(self.eval.batch_size >= 2, where, "eval.batch_size", "an integer ≥ 2", self.eval.batch_size)
        for group in (("dev", "dev_gold", "dev_submission_format"), ("eval", "eval_submission_format")):
            given = [bool(getattr(d, k)) for k in group]
            require(
                all(given) or not any(given),
                where,
                f"data.{group[0]}",
                f"{', '.join('data.' + k for k in group)} all given or all empty (built-in)",
                {k: getattr(d, k) for k in group},
            )
        require(not d.eval_gold or bool(d.eval), where, "data.eval_gold", "data.eval given with it", d.eval_gold)
        self._validate_mining(where)

    def _validate_mining(self, where: str) -> None:
        mi = self.mining
        n = mi.num_negatives
        require(0 <= n <= 64, where, "mining.num_negatives", "an integer in [0, 64]", n)
        require(1 <= mi.pool <= 1024, where, "mining.pool", "an integer in [1, 1024]", mi.pool)
        require(
            n <= mi.pool or bool(mi.negatives),
            where,
            "mining.num_negatives",
            f"at most mining.pool ({mi.pool}), the candidates mined per anchor",
            mi.num_negatives,
        )
        require(
            mi.relative_margin is None or 0.0 <= mi.relative_margin <= 1.0,
            where,
            "mining.relative_margin",
            "a number in [0, 1] or null",
            mi.relative_margin,
        )
        require(
            mi.absolute_margin is None or 0.0 <= mi.absolute_margin <= 2.0,
            where,
            "mining.absolute_margin",
            "a number in [0, 2] (cosines) or null",
            mi.absolute_margin,
        )
        require(
            0.0 <= mi.positive_min_score <= 5.0,
            where,
            "mining.positive_min_score",
            "an STS score in [0, 5]",
            mi.positive_min_score,
        )
        if mi.refresh:
            require(
                mi.refresh_every >= 1,
                where,
                "mining.refresh_every",
                "an integer ≥ 1 with mining.refresh (training steps between weight publications)",
                mi.refresh_every,
            )
        require(
            mi.max_staleness >= 0,
            where,
            "mining.max_staleness",
            "an integer ≥ 0 (weight versions)",
            mi.max_staleness,
        )
        require(mi.wait_s >= 0, where, "mining.wait_s", "a number of seconds ≥ 0", mi.wait_s)
        require(mi.num_miners >= 1, where, "mining.num_miners", "an integer ≥ 1", mi.num_miners)
        require(mi.cpus_per_miner > 0, where, "mining.cpus_per_miner", "a number > 0", mi.cpus_per_miner)
        require(mi.task_size >= 1, where, "mining.task_size", "an integer ≥ 1", mi.task_size)
