"""The GEC recipe's config (Cao, Yang & Ng, Findings of EMNLP 2021): ``tune_spaces/gec_pd.yaml``, ``gec_bart``.

See docs/recipes/gec.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from raycl.config import MiningSection, OptimSection, ScalingSection, TuneSection, require
from raycl.miners.false_negatives import MODES as FN_MODES
from raycl.miners.sources import LiveStream, PreMined, SharedNBest, SourceSpec
from raycl.models.decoding import MAX_LEN_A, MAX_LEN_B

PASSES = ("joint", "per_slot")  # loss.passes: how the GEC-CL step runs its forward passes (raycl.recipes.gec.step)


@dataclass
class GecModelSection:
    preset: str = "smoke"  # smoke | small | gec_pd | gec_bart (raycl.models.presets.PRESETS)
    name: str | None = None  # HF name or local path for from_pretrained; replaces the preset's weights
    checkpoint: str | None = None  # an already trained base model: skips step 1 of Algorithm 1
    max_length: int = 64  # tokens, source and target
    vocab_size: int = 0  # locally trained BPE size for config presets; 0 = the preset's
    seed: int = 0  # random init of config presets
    overrides: dict[str, Any] = field(default_factory=dict)  # BartConfig fields, e.g. dropout: 0.3


@dataclass
class BuiltinGecSection:
    n_train: int = 6000
    n_finetune: int = 1500
    n_dev: int = 300
    n_test: int = 300
    seed: int = 1


@dataclass
class GecDataSection:
    train: list[str] = field(default_factory=list)  # D_T file specs; empty = built-in corpus
    finetune: list[str] = field(default_factory=list)  # D_F
    dev: dict[str, list[str]] = field(default_factory=dict)  # name -> specs (M2), scored per annotator
    test: dict[str, list[str]] = field(default_factory=dict)
    annotator: int = 0  # whose edits make the training target (the paper uses annotator 0)
    builtin: BuiltinGecSection = field(default_factory=BuiltinGecSection)


@dataclass
class GecLossSection:
    trade_off: float = 0.5  # λ: (1-λ)·CE + λ·CL, as the released code (paper: NLL + CL)
    margin: float = 0.25  # γ
    label_smoothing: float = 0.1  # on CE only
    # joint: one forward over the positives and every real negative, each row its own source copy and dropout
    # masks (the released loss's distribution, one pass) | per_slot: one forward per slot, as the released code
    passes: str = "joint"


DECODING = ("beam", "rank_by", "engine", "precision", "max_len_a", "max_len_b")  # mining keys that make an n-best
SELECTION = ("k", "source_negative", "refill", "false_negatives")  # those that choose a trial's negatives from it


@dataclass
class GecMiningSection(MiningSection):
    k: int = 3
    beam: int = 5  # beam ≥ k+1; one n-best serves every k ≤ beam-1 of a sweep
    source_negative: bool = True  # CL (True) or CL⁻ (False)
    rank_by: str = "beam"  # the n-best's order: beam (length-normalised beam score, the paper) | sum_logprob
    refill: bool = False  # False: top k of the n-best less the target (the paper: k−1 if it is there); True: k ≠ t
    engine: str = "auto"  # auto: ctranslate2 where it converts the model, else hf | hf (generate) | ctranslate2
    max_len_a: float = MAX_LEN_A  # hypotheses ≤ max_len_a · source tokens + max_len_b tokens (fairseq's bound);
    max_len_b: int = MAX_LEN_B  # one cut there is never a negative (eval.max_new_tokens is the test decoding's)
    share: bool = True  # version-0 negatives (no sync_every/refresh_every): one n-best per run, read by all trials
    # negatives another annotator's correction equals (raycl.miners.false_negatives): keep (the paper) | drop
    # (with refill, the n-best refills); counted either way
    false_negatives: str = "keep"

    def decoding(self) -> dict[str, Any]:
        """The keys that make an n-best list (:data:`DECODING`)."""
        return {key: getattr(self, key) for key in DECODING}

    def miner_options(self, *, nbest: bool = False) -> dict[str, Any]:
        """The beam miner's keyword arguments (``raycl.miners.beam_search.BeamSearchMiner``): the decoding and a
        trial's selection (:data:`SELECTION`); ``nbest``: the run's shared raw n-best instead, k = beam − 1, from
        which every trial selects its own k, CL/CL⁻ and false-negative filter."""
        opts = {**super().miner_options(), **self.decoding()}
        if nbest:
            return {**opts, "k": self.beam - 1, "nbest": True}
        return {**opts, **{key: getattr(self, key) for key in SELECTION}}

    def source(self, *, stream: Any = None, store: Any = None, nbest: Any = None) -> SourceSpec | None:
        """Where a fine-tuning's negatives come from: the run's shared n-best (``nbest``, its actor), the stream
        of this training's own miners (``stream`` and ``store``), pre-mined ``negatives``, or none."""
        if nbest is not None:
            return SharedNBest(nbest, self.k, self.source_negative, self.refill, self.false_negatives)
        if stream is not None:
            return LiveStream(stream, store, self.max_staleness, self.sync_every, self.refresh_every)
        if self.negatives:
            return PreMined(self.negatives, drop_false_negatives=self.false_negatives == "drop")
        return None


@dataclass
class GecPretrainSection:
    """Step 1 of Algorithm 1: train the base model on D_T (skipped when ``model.checkpoint`` is set)."""

    epochs: int = 6
    lr: float = 1e-3
    batch_size: int = 64
    max_tokens: int = 0  # as optim.max_tokens, for step 1
    warmup_updates: int = 200
    label_smoothing: float = 0.1


@dataclass
class GecEvalSection:
    beam: int = 1  # test/dev decoding beam (GEC-BART: greedy; GEC-PD: 5)
    batch_size: int = 64
    max_new_tokens: int = 64


@dataclass
class GecConfig:
    task: str = "gec"
    model: GecModelSection = field(default_factory=GecModelSection)
    data: GecDataSection = field(default_factory=GecDataSection)
    pretrain: GecPretrainSection = field(default_factory=GecPretrainSection)
    loss: GecLossSection = field(default_factory=GecLossSection)
    mining: GecMiningSection = field(default_factory=GecMiningSection)
    optim: OptimSection = field(default_factory=OptimSection)
    eval: GecEvalSection = field(default_factory=GecEvalSection)
    scaling: ScalingSection = field(default_factory=ScalingSection)
    tune: TuneSection = field(default_factory=TuneSection)

    def validate(self, where: str) -> None:
        c = self
        from raycl.models.presets import PRESETS

        require(c.model.preset in PRESETS, where, "model.preset", f"one of {', '.join(PRESETS)}", c.model.preset)
        require(c.model.max_length >= 8, where, "model.max_length", "an integer ≥ 8", c.model.max_length)
        require(0.0 <= c.loss.trade_off <= 1.0, where, "loss.trade_off", "a number in [0, 1]", c.loss.trade_off)
        require(c.loss.margin >= 0.0, where, "loss.margin", "a number ≥ 0", c.loss.margin)
        require(
            0.0 <= c.loss.label_smoothing < 1.0,
            where,
            "loss.label_smoothing",
            "a number in [0, 1)",
            c.loss.label_smoothing,
        )
        require(c.loss.passes in PASSES, where, "loss.passes", " | ".join(PASSES), c.loss.passes)
        require(c.mining.k >= 1, where, "mining.k", "an integer ≥ 1", c.mining.k)
        require(
            c.mining.beam >= c.mining.k + 1,
            where,
            "mining.beam",
            f"≥ mining.k + 1 = {c.mining.k + 1}",
            c.mining.beam,
        )
        require(
            c.mining.rank_by in ("beam", "sum_logprob"),
            where,
            "mining.rank_by",
            "beam | sum_logprob",
            c.mining.rank_by,
        )
        require(
            c.mining.false_negatives in FN_MODES,
            where,
            "mining.false_negatives",
            " | ".join(FN_MODES),
            c.mining.false_negatives,
        )
        require(c.mining.max_len_a >= 0, where, "mining.max_len_a", "a number ≥ 0", c.mining.max_len_a)
        require(c.mining.max_len_b >= 1, where, "mining.max_len_b", "an integer ≥ 1", c.mining.max_len_b)
        require(c.eval.beam >= 1, where, "eval.beam", "an integer ≥ 1", c.eval.beam)
        require(c.data.annotator >= 0, where, "data.annotator", "an integer ≥ 0", c.data.annotator)
        b = c.data.builtin
        require(
            min(b.n_train, b.n_finetune, b.n_dev, b.n_test) >= 1,
            where,
            "data.builtin",
            "positive sizes",
            dataclasses.asdict(b),
        )
