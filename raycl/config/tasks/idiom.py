"""The SemEval-2022 Task 2 Subtask A recipe's config (ZhichunRoad): ``tune_spaces/idiom.yaml``.

See docs/recipes/idiom.md.

``data.setting`` picks what a run trains: ``zero_shot`` (train_zero_shot, the text "Previous Target Next"),
``one_shot`` (train_one_shot + train_zero_shot, the pair (Target, MWE)), or ``both`` (the default: one training
per setting, and the sweep gets a grid dimension over the two). ``optim.batch_size`` and ``optim.seed`` left
null take the setting's released values (zero-shot 16 / seed 0, one-shot 32 / seed 1).

Data keys left empty are filled with the built-in set (``raycl.data.semeval_corpus``), written under the run
folder. ``dev`` and ``dev_gold`` are given together (dev F1 picks the epoch); ``*_submission_format`` and
``eval_gold`` are optional with a user's split (without a format file the official layout is written in input
order; without ``eval_gold`` there are no test scores, as with the real data).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from raycl.config import LoopOptions, ScalingSection, TuneSection, require

SETTINGS = ("zero_shot", "one_shot")
BATCH_SIZE = {"zero_shot": 16, "one_shot": 32}  # the released subtaskA scripts
SEED = {"zero_shot": 0, "one_shot": 1}
METHODS = ("none", "fgm", "pgd", "freelb", "smart")


@dataclass
class IdiomModelSection:
    preset: str = "paper"  # smoke | small (offline MiniLM + fresh head) | paper (microsoft/infoxlm-base)
    checkpoint: str | None = None  # an HF encoder (name or folder) for the preset's encoder
    max_len: int = 128  # tokens per (pair of) input(s), special tokens included
    seed: int = 0  # fresh weights: the whole smoke model, the pretrained presets' classification head


@dataclass
class BuiltinIdiomSection:
    seed: int = 0


@dataclass
class IdiomDataSection:
    setting: str = "both"  # zero_shot | one_shot | both (one training per setting)
    train_zero_shot: str = ""
    train_one_shot: str = ""
    dev: str = ""
    dev_gold: str = ""
    dev_submission_format: str = ""  # optional with a user's dev: the layout is then written in input order
    eval: str = ""  # the paper's test split
    eval_gold: str = ""  # empty with a user's eval: no test scores (the real data has no eval gold)
    eval_submission_format: str = ""
    builtin: BuiltinIdiomSection = field(default_factory=BuiltinIdiomSection)


@dataclass
class IdiomOptimSection(LoopOptions):
    lr: float = 2e-5  # AdamW, β 0.9/0.999
    eps: float = 1e-6  # the released transformers.AdamW's default (torch's is 1e-8)
    weight_decay: float = 0.0
    warmup_ratio: float = 0.1  # linear warm-up over this share of the steps, then linear decay; 0 = the scripts
    batch_size: int | None = None  # examples per step per worker; null = the setting's (zero-shot 16, one-shot 32)
    seed: int | None = None  # null = the setting's (zero-shot 0, one-shot 1)
    epochs: int = 100  # dev macro-F1 after every epoch; the best epoch is kept


@dataclass
class EmaSection:
    enabled: bool = True  # dev evaluated (and the best saved) with the EMA weights swapped in
    decay: float = 0.999


@dataclass
class AdversarialSection:
    method: str = "none"  # none | fgm | pgd | freelb | smart (on the word-embedding matrix)
    epsilon: float = 1.0  # ε: radius of the Frobenius ball (FGM: its step)
    alpha: float = 0.3  # α: step of each ascent step (PGD, FreeLB, SMART)
    steps: int = 3  # K
    smart_mu: float = 0.2  # μ: weight of SMART's KL(perturbed ‖ clean)


@dataclass
class LadderSection:
    """Which rows of Tables 3–4 ``python -m raycl.tune`` runs after the sweep (each a trial per setting)."""

    baselines: list[str] = field(default_factory=list)  # names from the space's `baselines:`; empty = all of them
    settings: list[str] = field(default_factory=list)  # settings the ladder runs at; empty = every swept setting


@dataclass
class IdiomEvalSection:
    batch_size: int = 64  # examples per prediction batch


@dataclass
class IdiomConfig:
    task: str = "idiom"
    model: IdiomModelSection = field(default_factory=IdiomModelSection)
    data: IdiomDataSection = field(default_factory=IdiomDataSection)
    optim: IdiomOptimSection = field(default_factory=IdiomOptimSection)
    ema: EmaSection = field(default_factory=EmaSection)
    adversarial: AdversarialSection = field(default_factory=AdversarialSection)
    eval: IdiomEvalSection = field(default_factory=IdiomEvalSection)
    ladder: LadderSection = field(default_factory=LadderSection)
    scaling: ScalingSection = field(default_factory=ScalingSection)
    tune: TuneSection = field(default_factory=lambda: TuneSection(metric="dev_f1"))

    @property
    def settings(self) -> tuple[str, ...]:
        """The settings a run trains, in the official order."""
        return SETTINGS if self.data.setting == "both" else (self.data.setting,)

    def batch_size(self, setting: str) -> int:
        return self.optim.batch_size if self.optim.batch_size is not None else BATCH_SIZE[setting]

    def seed(self, setting: str) -> int:
        return self.optim.seed if self.optim.seed is not None else SEED[setting]

    def validate(self, where: str) -> None:
        from raycl.models.classifier import CLASSIFIER_PRESETS

        m, d, o, a = self.model, self.data, self.optim, self.adversarial
        require(
            m.preset in CLASSIFIER_PRESETS,
            where,
            "model.preset",
            f"one of {', '.join(CLASSIFIER_PRESETS)}",
            m.preset,
        )
        limit = CLASSIFIER_PRESETS[m.preset].max_len if m.preset == "smoke" else 512  # the smoke model's positions
        require(8 <= m.max_len <= limit, where, "model.max_len", f"an integer in [8, {limit}]", m.max_len)
        require(d.setting in (*SETTINGS, "both"), where, "data.setting", "zero_shot, one_shot or both", d.setting)
        require(o.lr > 0, where, "optim.lr", "a number > 0", o.lr)
        require(o.weight_decay >= 0, where, "optim.weight_decay", "a number ≥ 0", o.weight_decay)
        require(o.eps > 0, where, "optim.eps", "a number > 0", o.eps)
        require(0.0 <= o.warmup_ratio < 1.0, where, "optim.warmup_ratio", "a number in [0, 1)", o.warmup_ratio)
        require(
            o.batch_size is None or o.batch_size >= 1,
            where,
            "optim.batch_size",
            "an integer ≥ 1 (or null: the setting's)",
            o.batch_size,
        )
        require(o.epochs >= 0, where, "optim.epochs", "an integer ≥ 0", o.epochs)
        require(0.0 <= self.ema.decay <= 1.0, where, "ema.decay", "a number in [0, 1]", self.ema.decay)
        require(a.method in METHODS, where, "adversarial.method", f"one of {', '.join(METHODS)}", a.method)
        require(a.epsilon >= 0, where, "adversarial.epsilon", "a number ≥ 0 (0 = off)", a.epsilon)
        require(a.alpha >= 0, where, "adversarial.alpha", "a number ≥ 0", a.alpha)
        require(a.steps >= 1, where, "adversarial.steps", "an integer ≥ 1", a.steps)
        require(a.smart_mu >= 0, where, "adversarial.smart_mu", "a number ≥ 0", a.smart_mu)
        require(
            all(s in SETTINGS for s in self.ladder.settings),
            where,
            "ladder.settings",
            f"a list of {', '.join(SETTINGS)}",
            self.ladder.settings,
        )
        require(self.eval.batch_size >= 1, where, "eval.batch_size", "an integer ≥ 1", self.eval.batch_size)
        require(
            bool(d.dev) == bool(d.dev_gold),
            where,
            "data.dev_gold",
            "data.dev and data.dev_gold both given or both empty (built-in)",
            d.dev_gold,
        )
        for split in ("dev", "eval"):
            for key in (f"{split}_submission_format", *(("eval_gold",) if split == "eval" else ())):
                require(
                    not getattr(d, key) or bool(getattr(d, split)),
                    where,
                    f"data.{key}",
                    f"data.{split} given with it",
                    getattr(d, key),
                )
