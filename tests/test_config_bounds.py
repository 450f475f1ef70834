"""Every range and consistency check of the configs' validation, pinned at its boundary.

Each row sets one key of a task's default config (``dataclasses.replace`` down the sections) and runs the real
``raycl.config.validate``: the value at the edge must pass, the value just beyond it must fail with the one-line
message that names the key and says what was expected, word for word. A check whose operator, constant, key or
text changes fails a row.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

from raycl.config import validate
from raycl.config.tasks import task_config
from raycl.errors import UserError, shown
from raycl.miners.false_negatives import MODES as FN_MODES
from raycl.models.classifier import CLASSIFIER_PRESETS
from raycl.models.coherence_presets import COHERENCE_PRESETS
from raycl.models.presets import PRESETS as GEC_PRESETS
from raycl.models.sentence_encoder import PRESETS as STS_PRESETS

WHERE = "x"
_BAD = object()  # "the message shows the rejected value itself"
SMOKE_MAX_LEN = CLASSIFIER_PRESETS["smoke"].max_len


def _replaced(obj: Any, dotted: str, value: Any) -> Any:
    """A copy of the dataclass ``obj`` with the dotted key set (each section on the way copied, none shared)."""
    head, _, rest = dotted.partition(".")
    return dataclasses.replace(obj, **{head: _replaced(getattr(obj, head), rest, value) if rest else value})


def _config(space: str, values: dict[str, Any]) -> Any:
    cls = task_config(space)
    assert cls is not None
    cfg = cls()
    for key, value in values.items():
        cfg = _replaced(cfg, key, value)
    return cfg


def _message(key: str, expected: str, got: Any) -> str:
    return f"{WHERE}: config key '{key}': expected {expected}, got {shown(got)}"


def _refused(cfg: Any) -> str:
    with pytest.raises(UserError) as err:
        validate(cfg, where=WHERE)
    return str(err.value)


def edge(
    space: str,
    key: str,
    ok: Any,
    bad: Any,
    expected: str,
    *,
    msg_key: str | None = None,
    got: Any = _BAD,
    base: dict[str, Any] | None = None,
    tag: str = "",
) -> Any:
    """One row: ``key=ok`` passes, ``key=bad`` fails naming ``msg_key`` (default ``key``) with ``expected``;
    ``base`` is set first in both; ``got`` is what the message shows when it is not ``bad`` itself."""
    row = (space, key, ok, bad, msg_key or key, expected, bad if got is _BAD else got, base or {})
    return pytest.param(*row, id=f"{space}-{key}-{tag or repr(bad)}")


def pair(space: str, ok: dict[str, Any], bad: dict[str, Any], msg_key: str, expected: str, got: Any) -> Any:
    """A row of several keys: the settings ``ok`` pass, the settings ``bad`` fail (a consistency check)."""
    return pytest.param(space, "", ok, bad, msg_key, expected, got, {}, id=f"{space}-{msg_key}-{sorted(bad)}")


# ---------------------------------------------------------------------------------------------- raycl/config/
COMMON = [
    edge("gec", "scaling.num_workers", 0, -1, "an integer ≥ 0"),
    edge("gec", "scaling.collective_timeout_s", 1, 0, "a number of seconds > 0"),
    edge("gec", "scaling.cpus_per_worker", 0.01, 0.0, "> 0"),
    edge("gec", "scaling.max_failures", -1, -2, "an integer ≥ -1 (-1: retry forever)"),
    edge("gec", "scaling.start_timeout_s", 0.0, -0.5, "seconds ≥ 0 (0: wait for ever)"),
    edge("gec", "scaling.gpus_per_worker", 0.01, 0.0, "a fraction in (0, 1] or whole GPUs"),
    edge("gec", "scaling.gpus_per_worker", 1.0, 1.5, "a fraction in (0, 1] or whole GPUs"),
    edge("gec", "scaling.gpus_per_worker", 2.0, 2.5, "a fraction in (0, 1] or whole GPUs"),
    edge("gec", "tune.scheduler", "fifo", "median", "fifo or asha"),
    edge("gec", "tune.scheduler", "asha", "ASHA", "fifo or asha"),
    edge("gec", "tune.mode", "max", "maximum", "max or min"),
    edge("gec", "tune.mode", "min", "", "max or min"),
    edge("gec", "tune.num_samples", 1, 0, "an integer ≥ 1"),
    edge("gec", "tune.max_concurrent_trials", 1, 0, "≥ 1"),
    edge("gec", "tune.driver_cpus", 0.01, 0.0, "> 0 (Tune rejects 0)"),
    # LoopOptions: every recipe's optim section
    edge("gec", "optim.precision", "fp32", "fp8", "fp32 | bf16 | fp16"),
    edge("gec", "optim.precision", "bf16", "int8", "fp32 | bf16 | fp16"),
    edge("gec", "optim.precision", "fp16", "FP16", "fp32 | bf16 | fp16"),
    edge("gec", "optim.update_freq", 1, 0, "an integer ≥ 1"),
    edge("gec", "optim.prefetch", 0, -1, "an integer ≥ 0 (0: no background thread)"),
    *[
        edge(
            "gec",
            "optim.compile_mode",
            mode,
            "fast",
            "default | reduce-overhead | max-autotune | max-autotune-no-cudagraphs",
            tag=mode,
        )
        for mode in ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
    ],
    # OptimSection (GEC's)
    edge("gec", "optim.lr", 1e-12, 0.0, "> 0"),
    edge("gec", "optim.betas", [0.0, 0.999], [0.9, 1.0], "two numbers in [0, 1)"),
    edge("gec", "optim.betas", [0.0, 0.999], [-0.1, 0.9], "two numbers in [0, 1)"),
    edge("gec", "optim.betas", [0.9, 0.98], [0.9], "two numbers in [0, 1)"),
    edge("gec", "optim.betas", [0.9, 0.98], [0.9, 0.98, 0.5], "two numbers in [0, 1)"),
    edge("gec", "optim.scheduler", "fixed", "linear", "fixed or polynomial"),
    edge("gec", "optim.scheduler", "polynomial", "Fixed", "fixed or polynomial"),
    edge("gec", "optim.batch_size", 1, 0, "an integer ≥ 1"),
    edge("gec", "optim.max_tokens", 0, -1, "an integer ≥ 0 (0 = batches by sentences)"),
    edge("gec", "optim.epochs", 0, -1, "an integer ≥ 0"),
    edge("gec", "optim.clip_norm", 0.0, -0.01, "≥ 0 (0 = no clipping)"),
    # MiningSection (GEC's and coherence's)
    edge("gec", "mining.num_miners", 1, 0, "an integer ≥ 1"),
    edge("gec", "mining.cpus_per_miner", 0.0, -0.01, "non-negative resources", got=(-0.01, 0.0)),
    edge(
        "gec",
        "mining.gpus_per_miner",
        0.0,
        -0.01,
        "non-negative resources",
        msg_key="mining.cpus_per_miner",
        got=(1.0, -0.01),
    ),
    edge("gec", "mining.gpus_per_miner", 0.5, 1.5, "a fraction in [0, 1] or whole GPUs"),
    edge("gec", "mining.gpus_per_miner", 1.0, 1.01, "a fraction in [0, 1] or whole GPUs"),
    edge("gec", "mining.gpus_per_miner", 2.0, 2.5, "a fraction in [0, 1] or whole GPUs"),
    edge("gec", "mining.max_staleness", 0, -1, "an integer ≥ 0"),
    edge("gec", "mining.sync_every", 0, -1, "an integer ≥ 0"),
    edge("gec", "mining.refresh_every", 0, -1, "an integer ≥ 0"),
    edge("gec", "mining.task_size", 1, 0, "an integer ≥ 1"),
    edge("gec", "mining.queue_size", 32, 31, "≥ mining.task_size = 32"),
    edge("gec", "mining.queue_size", 7, 6, "≥ mining.task_size = 7", base={"mining.task_size": 7}, tag="task7"),
    edge("gec", "mining.lease_s", 0.001, 0.0, "> 0 seconds"),
    *[
        edge("gec", "mining.engine", engine, "vllm", "auto | hf | ctranslate2", tag=engine)
        for engine in ("auto", "hf", "ctranslate2")
    ],
    *[
        edge(
            "gec",
            "mining.precision",
            "int8",
            "int4",
            "fp32 | bf16 | fp16 | int8",
            base={"mining.engine": engine},
            tag=engine,
        )
        for engine in ("auto", "ctranslate2")
    ],
    edge(
        "gec",
        "mining.precision",
        "bf16",
        "int8",
        "fp32 | bf16 | fp16 (int8 with mining.engine=ctranslate2 or auto)",
        base={"mining.engine": "hf"},
        tag="hf",
    ),
    # a miner without an engine (coherence's) is an hf one
    edge(
        "coherence",
        "mining.precision",
        "fp16",
        "int8",
        "fp32 | bf16 | fp16 (int8 with mining.engine=ctranslate2 or auto)",
    ),
    edge("coherence", "mining.num_miners", 1, 0, "an integer ≥ 1"),
]

# ---------------------------------------------------------------------------------------------- upper bounds
# every number finite and bounded by the kind of its key (raycl.config.number_bound): seconds, resources, epochs,
# seeds, other integers, other numbers; a row per kind and section, the bound itself passing
SECONDS = "a finite number of seconds ≤ 604,800 (7 days)"
AMOUNT = "a finite amount ≤ 1,024"
INT = "an integer of magnitude ≤ 2,147,483,647"
NUMBER = "a finite number of magnitude ≤ 1,000,000"
UPPER = [
    edge("gec", "scaling.cpus_per_worker", 1024.0, 1024.5, AMOUNT),
    edge("gec", "scaling.cpus_per_worker", 1024.0, math.inf, AMOUNT, tag="inf"),
    edge("gec", "scaling.gpus_per_worker", 1024.0, 1025.0, AMOUNT),
    edge(
        "gec",
        "scaling.resources",
        {"trainer": 1024.0},
        {"trainer": math.inf},
        AMOUNT,
        msg_key="scaling.resources.trainer",
        got=math.inf,
    ),
    edge("gec", "tune.driver_cpus", 1024.0, 1e9, AMOUNT),
    edge("gec", "mining.cpus_per_miner", 1024.0, 2048.0, AMOUNT),
    edge(
        "gec",
        "mining.resources",
        {"miner": 1.0},
        {"miner": -math.inf},
        AMOUNT,
        msg_key="mining.resources.miner",
        got=-math.inf,
    ),
    edge("gec", "scaling.start_timeout_s", 604_800.0, 604_800.5, SECONDS),
    edge("gec", "scaling.start_timeout_s", 604_800.0, math.inf, SECONDS, tag="inf"),
    edge("gec", "scaling.collective_timeout_s", 604_800, 10**20, SECONDS),
    edge("gec", "mining.lease_s", 604_800.0, math.nan, SECONDS),
    *[
        edge(space, "optim.epochs", 100_000, 10**15, "an integer ≤ 100,000", tag=space)
        for space in ("gec", "idiom", "coherence")
    ],
    edge("sts", "pretrain.epochs", 100_000, 100_001, "an integer ≤ 100,000"),
    edge("coherence", "optim.anneal_epochs", 100_000, 100_001, "an integer ≤ 100,000"),
    edge("gec", "optim.seed", 2**32 - 1, 2**32, "an integer ≤ 4,294,967,295"),
    edge("gec", "optim.batch_size", 2**31 - 1, 2**31, INT),
    edge("gec", "mining.queue_size", 2**31 - 1, 2**63, INT),
    edge("gec", "tune.num_samples", 2**31 - 1, 2**31, INT),
    edge("idiom", "eval.batch_size", 2**31 - 1, 2**31, INT),
    edge("gec", "optim.lr", 1e6, 1.5e6, NUMBER),
    edge("gec", "optim.lr", 1e6, math.inf, NUMBER, tag="inf"),
    edge("gec", "optim.betas", [0.9, 0.98], [0.9, math.nan], NUMBER, got=math.nan),
    edge("sts", "loss.temperature", 1e6, 1e300, NUMBER),
    edge("coherence", "loss.margin", 1e6, math.inf, NUMBER),
]

# ---------------------------------------------------------------------------------------------- the tasks' own
GEC = [
    *[edge("gec", "model.preset", p, "base", f"one of {', '.join(GEC_PRESETS)}", tag=p) for p in GEC_PRESETS],
    edge("gec", "model.max_length", 8, 7, "an integer ≥ 8"),
    edge("gec", "loss.trade_off", 0.0, -0.01, "a number in [0, 1]"),
    edge("gec", "loss.trade_off", 1.0, 1.01, "a number in [0, 1]"),
    edge("gec", "loss.margin", 0.0, -0.01, "a number ≥ 0"),
    edge("gec", "loss.label_smoothing", 0.0, -0.01, "a number in [0, 1)"),
    edge("gec", "loss.label_smoothing", 0.99, 1.0, "a number in [0, 1)"),
    edge("gec", "loss.passes", "joint", "both", "joint | per_slot"),
    edge("gec", "loss.passes", "per_slot", "per-slot", "joint | per_slot"),
    edge("gec", "mining.k", 1, 0, "an integer ≥ 1"),
    edge("gec", "mining.beam", 4, 3, "≥ mining.k + 1 = 4"),
    edge("gec", "mining.beam", 2, 1, "≥ mining.k + 1 = 2", base={"mining.k": 1}, tag="k1"),
    edge("gec", "mining.rank_by", "beam", "score", "beam | sum_logprob"),
    edge("gec", "mining.rank_by", "sum_logprob", "Beam", "beam | sum_logprob"),
    *[edge("gec", "mining.false_negatives", mode, "ignore", " | ".join(FN_MODES), tag=mode) for mode in FN_MODES],
    edge("gec", "mining.max_len_a", 0.0, -0.01, "a number ≥ 0"),
    edge("gec", "mining.max_len_b", 1, 0, "an integer ≥ 1"),
    edge("gec", "eval.beam", 1, 0, "an integer ≥ 1"),
    edge("gec", "data.annotator", 0, -1, "an integer ≥ 0"),
    *[
        edge(
            "gec",
            f"data.builtin.{n}",
            1,
            0,
            "positive sizes",
            msg_key="data.builtin",
            tag=n,
            got={"n_train": 6000, "n_finetune": 1500, "n_dev": 300, "n_test": 300, "seed": 1, n: 0},
        )
        for n in ("n_train", "n_finetune", "n_dev", "n_test")
    ],
]

IDIOM = [
    *[
        edge(
            "idiom",
            "model.preset",
            p,
            "base",
            f"one of {', '.join(CLASSIFIER_PRESETS)}",
            tag=p,
            base={"model.max_len": SMOKE_MAX_LEN},
        )
        for p in CLASSIFIER_PRESETS
    ],  # a length every preset takes
    edge("idiom", "model.max_len", 8, 7, "an integer in [8, 512]"),
    edge("idiom", "model.max_len", 512, 513, "an integer in [8, 512]"),
    edge(
        "idiom", "model.max_len", 512, 513, "an integer in [8, 512]", base={"model.preset": "small"}, tag="small"
    ),
    edge(
        "idiom",
        "model.max_len",
        SMOKE_MAX_LEN,
        SMOKE_MAX_LEN + 1,
        f"an integer in [8, {SMOKE_MAX_LEN}]",
        base={"model.preset": "smoke"},
        tag="smoke",
    ),
    edge(
        "idiom",
        "model.max_len",
        8,
        7,
        f"an integer in [8, {SMOKE_MAX_LEN}]",
        base={"model.preset": "smoke"},
        tag="smoke-low",
    ),
    *[
        edge("idiom", "data.setting", s, "few_shot", "zero_shot, one_shot or both", tag=s)
        for s in ("zero_shot", "one_shot", "both")
    ],
    edge("idiom", "optim.lr", 1e-12, 0.0, "a number > 0"),
    edge("idiom", "optim.weight_decay", 0.0, -0.01, "a number ≥ 0"),
    edge("idiom", "optim.eps", 1e-12, 0.0, "a number > 0"),
    edge("idiom", "optim.warmup_ratio", 0.0, -0.01, "a number in [0, 1)"),
    edge("idiom", "optim.warmup_ratio", 0.99, 1.0, "a number in [0, 1)"),
    edge("idiom", "optim.batch_size", 1, 0, "an integer ≥ 1 (or null: the setting's)"),
    edge("idiom", "optim.batch_size", None, -1, "an integer ≥ 1 (or null: the setting's)", tag="null"),
    edge("idiom", "optim.epochs", 0, -1, "an integer ≥ 0"),
    edge("idiom", "ema.decay", 0.0, -0.01, "a number in [0, 1]"),
    edge("idiom", "ema.decay", 1.0, 1.01, "a number in [0, 1]"),
    *[
        edge("idiom", "adversarial.method", m, "vat", "one of none, fgm, pgd, freelb, smart", tag=m)
        for m in ("none", "fgm", "pgd", "freelb", "smart")
    ],
    edge("idiom", "adversarial.epsilon", 0.0, -0.01, "a number ≥ 0 (0 = off)"),
    edge("idiom", "adversarial.alpha", 0.0, -0.01, "a number ≥ 0"),
    edge("idiom", "adversarial.steps", 1, 0, "an integer ≥ 1"),
    edge("idiom", "adversarial.smart_mu", 0.0, -0.01, "a number ≥ 0"),
    edge("idiom", "ladder.settings", [], ["both"], "a list of zero_shot, one_shot", tag="empty"),
    edge(
        "idiom",
        "ladder.settings",
        ["zero_shot", "one_shot"],
        ["zero_shot", "few_shot"],
        "a list of zero_shot, one_shot",
    ),
    edge("idiom", "eval.batch_size", 1, 0, "an integer ≥ 1"),
    # the official files come with their partners
    edge(
        "idiom",
        "data.dev",
        "",
        "dev.tsv",
        "data.dev and data.dev_gold both given or both empty (built-in)",
        msg_key="data.dev_gold",
        got="",
    ),
    edge(
        "idiom", "data.dev_gold", "", "gold.csv", "data.dev and data.dev_gold both given or both empty (built-in)"
    ),
    edge(
        "idiom",
        "data.dev_gold",
        "gold.csv",
        "",
        "data.dev and data.dev_gold both given or both empty (built-in)",
        base={"data.dev": "dev.tsv"},
        tag="with-dev",
    ),
    pair(
        "idiom",
        {"data.dev": "dev.tsv", "data.dev_gold": "gold.csv", "data.dev_submission_format": "f.csv"},
        {"data.dev_submission_format": "f.csv"},
        "data.dev_submission_format",
        "data.dev given with it",
        "f.csv",
    ),
    edge(
        "idiom",
        "data.eval",
        "eval.tsv",
        "",
        "data.eval given with it",
        msg_key="data.eval_submission_format",
        got="f.csv",
        base={"data.eval_submission_format": "f.csv"},
        tag="format",
    ),
    edge(
        "idiom",
        "data.eval",
        "eval.tsv",
        "",
        "data.eval given with it",
        msg_key="data.eval_gold",
        got="gold.csv",
        base={"data.eval_gold": "gold.csv"},
        tag="gold",
    ),
]

STS = [
    *[edge("sts", "model.preset", p, "base", f"one of {', '.join(STS_PRESETS)}", tag=p) for p in STS_PRESETS],
    edge("sts", "model.max_seq_length", 8, 7, "an integer ≥ 8"),
    edge("sts", "loss.joint", "sum", "both", "sum or alternate"),
    edge("sts", "loss.joint", "alternate", "alternating", "sum or alternate"),
    edge("sts", "loss.lam", 0.0, -0.01, "a number ≥ 0"),
    edge("sts", "loss.temperature", 1e-6, 0.0, "a number > 0"),
    edge("sts", "moco.queue_size", 0, -1, "an integer ≥ 0"),
    edge("sts", "moco.m", 0.0, -0.01, "a number in [0, 1]"),
    edge("sts", "moco.m", 1.0, 1.01, "a number in [0, 1]"),
    *[
        row
        for phase in ("pretrain", "finetune")
        for row in (
            edge("sts", f"{phase}.epochs", 0, -1, "an integer ≥ 0"),
            edge("sts", f"{phase}.eval_every", 1, 0, "an integer ≥ 1"),
        )
    ],
    edge("sts", "optim.lr", 1e-12, 0.0, "a number > 0"),
    edge("sts", "optim.weight_decay", 0.0, -0.01, "a number ≥ 0"),
    edge("sts", "optim.clip_norm", 0.0, -0.01, "a number ≥ 0 (0 = no clipping)"),
    edge("sts", "optim.warmup_ratio", 0.0, -0.01, "a number in [0, 1)"),
    edge("sts", "optim.warmup_ratio", 0.99, 1.0, "a number in [0, 1)"),
    edge("sts", "optim.warmup", "released", "linear", "released | steps"),
    edge("sts", "optim.warmup", "steps", "Steps", "released | steps"),
    # each objective steps its own optimiser every batch with loss.joint=alternate, unless there is one objective
    edge(
        "sts",
        "optim.update_freq",
        1,
        2,
        "1 with loss.joint=alternate (each objective steps its own optimiser every batch)",
    ),
    edge(
        "sts",
        "loss.joint",
        "sum",
        "alternate",
        "1 with loss.joint=alternate (each objective steps its own optimiser every batch)",
        msg_key="optim.update_freq",
        got=2,
        base={"optim.update_freq": 2},
        tag="update_freq2",
    ),
    edge(
        "sts",
        "loss.lam",
        0.0,
        0.01,
        "1 with loss.joint=alternate (each objective steps its own optimiser every batch)",
        msg_key="optim.update_freq",
        got=2,
        base={"optim.update_freq": 2},
        tag="update_freq2",
    ),
    edge("sts", "optim.batch_size", 2, 1, "an integer ≥ 2 (in-batch negatives)"),
    edge("sts", "eval.batch_size", 2, 1, "an integer ≥ 2"),
]
_DEV = {"data.dev": "dev.csv", "data.dev_gold": "gold.csv", "data.dev_submission_format": "f.csv"}
_DEV_TEXT = "data.dev, data.dev_gold, data.dev_submission_format all given or all empty (built-in)"
for _key in _DEV:  # each of the three left out of the others
    _given = {k: v for k, v in _DEV.items() if k != _key}
    STS.append(
        edge(
            "sts",
            _key,
            _DEV[_key],
            "",
            _DEV_TEXT,
            msg_key="data.dev",
            base=_given,
            tag="missing",
            got={k.removeprefix("data."): _given.get(k, "") for k in _DEV},
        )
    )
    STS.append(
        edge(
            "sts",
            _key,
            "",
            _DEV[_key],
            _DEV_TEXT,
            msg_key="data.dev",
            tag="alone",
            got={k.removeprefix("data."): v if k == _key else "" for k, v in _DEV.items()},
        )
    )
_EVAL_TEXT = "data.eval, data.eval_submission_format all given or all empty (built-in)"
STS += [
    edge(
        "sts",
        "data.eval",
        "eval.csv",
        "",
        _EVAL_TEXT,
        msg_key="data.eval",
        tag="missing",
        got={"eval": "", "eval_submission_format": "f.csv"},
        base={"data.eval_submission_format": "f.csv"},
    ),
    edge(
        "sts",
        "data.eval",
        "",
        "eval.csv",
        _EVAL_TEXT,
        msg_key="data.eval",
        tag="alone",
        got={"eval": "eval.csv", "eval_submission_format": ""},
    ),
    edge("sts", "data.eval_gold", "", "gold.csv", "data.eval given with it"),
    pair(
        "sts",
        {"data.eval": "eval.csv", "data.eval_submission_format": "f.csv", "data.eval_gold": "gold.csv"},
        {"data.eval_gold": "gold.csv"},
        "data.eval_gold",
        "data.eval given with it",
        "gold.csv",
    ),
]

# StsMiningSection: dense hard negatives (the pool's selection, refreshed mining's cadence, the miners)
STS += [
    edge("sts", "mining.num_negatives", 0, -1, "an integer in [0, 64]"),
    edge("sts", "mining.num_negatives", 64, 65, "an integer in [0, 64]", base={"mining.pool": 64}),
    edge("sts", "mining.pool", 1, 0, "an integer in [1, 1024]", base={"mining.num_negatives": 1}),
    edge("sts", "mining.pool", 1024, 1025, "an integer in [1, 1024]"),
    edge(
        "sts",
        "mining.num_negatives",
        5,
        6,
        "at most mining.pool (5), the candidates mined per anchor",
        base={"mining.pool": 5},
        tag="pool",
    ),
    pair(
        "sts",
        {"mining.pool": 5, "mining.num_negatives": 6, "mining.negatives": "pool.parquet"},
        {"mining.pool": 5, "mining.num_negatives": 6},
        "mining.num_negatives",
        "at most mining.pool (5), the candidates mined per anchor",
        6,
    ),  # a pool read from a file was mined with its own size
    edge("sts", "mining.relative_margin", 0.0, -0.01, "a number in [0, 1] or null"),
    edge("sts", "mining.relative_margin", 1.0, 1.01, "a number in [0, 1] or null"),
    edge("sts", "mining.relative_margin", None, 2.0, "a number in [0, 1] or null", tag="null"),
    edge("sts", "mining.absolute_margin", 0.0, -0.01, "a number in [0, 2] (cosines) or null"),
    edge("sts", "mining.absolute_margin", 2.0, 2.01, "a number in [0, 2] (cosines) or null"),
    edge("sts", "mining.absolute_margin", None, 3.0, "a number in [0, 2] (cosines) or null", tag="null"),
    edge("sts", "mining.positive_min_score", 0.0, -0.01, "an STS score in [0, 5]"),
    edge("sts", "mining.positive_min_score", 5.0, 5.01, "an STS score in [0, 5]"),
    edge(
        "sts",
        "mining.refresh_every",
        1,
        0,
        "an integer ≥ 1 with mining.refresh (training steps between weight publications)",
        base={"mining.refresh": True},
    ),
    pair(
        "sts",
        {"mining.refresh": False, "mining.refresh_every": 0},
        {"mining.refresh": True, "mining.refresh_every": 0},
        "mining.refresh_every",
        "an integer ≥ 1 with mining.refresh (training steps between weight publications)",
        0,
    ),  # without refresh the cadence is not read
    edge("sts", "mining.max_staleness", 0, -1, "an integer ≥ 0 (weight versions)"),
    edge("sts", "mining.wait_s", 0.0, -0.5, "a number of seconds ≥ 0"),
    edge("sts", "mining.num_miners", 1, 0, "an integer ≥ 1"),
    edge("sts", "mining.cpus_per_miner", 0.01, 0.0, "a number > 0"),
    edge("sts", "mining.task_size", 1, 0, "an integer ≥ 1"),
]

COHERENCE = [
    *[
        edge("coherence", "model.preset", p, "xlnet", f"one of {', '.join(COHERENCE_PRESETS)}", tag=p)
        for p in COHERENCE_PRESETS
    ],
    edge("coherence", "model.max_len", 0, -1, "an integer ≥ 0 (0 = the preset's)"),
    *[
        edge("coherence", "loss.kind", k, "margin", "pairwise or contrastive or momentum", tag=k)
        for k in ("pairwise", "contrastive", "momentum")
    ],
    edge("coherence", "loss.margin", 0.0, -0.01, "a number ≥ 0"),
    edge("coherence", "loss.lam", 0.0, -0.01, "a number in [0, 1]"),
    edge("coherence", "loss.lam", 1.0, 1.01, "a number in [0, 1]"),
    edge("coherence", "momentum.m", 0.0, -0.01, "a number in [0, 1]"),
    edge("coherence", "momentum.m", 1.0, 1.01, "a number in [0, 1]"),
    edge("coherence", "momentum.queue_size", 0, -1, "an integer ≥ 0"),
    edge("coherence", "mining.num_negs", 1, 0, "an integer ≥ 1"),
    edge("coherence", "mining.num_rank", 5, 4, "≥ mining.num_negs = 5"),
    edge("coherence", "mining.num_rank", 1, 0, "≥ mining.num_negs = 1", base={"mining.num_negs": 1}, tag="negs1"),
    edge("coherence", "mining.rank_every", 1, 0, "an integer ≥ 1"),
    edge("coherence", "optim.lr", 1e-12, 0.0, "learning rates > 0", got=(0.0, 1e-6)),
    edge("coherence", "optim.swa_lr", 1e-12, 0.0, "learning rates > 0", msg_key="optim.lr", got=(5e-6, 0.0)),
    edge("coherence", "optim.anneal_epochs", 1, 0, "an integer ≥ 1"),
    edge("coherence", "optim.eval_every", 1, 0, "an integer ≥ 1"),
    edge("coherence", "optim.batch_size", 1, 0, "an integer ≥ 1"),
    edge("coherence", "optim.epochs", 0, -1, "an integer ≥ 0"),
    edge("coherence", "eval.num_negs", 1, 0, "an integer ≥ 1"),
    edge(
        "coherence",
        "data.permute.copies",
        1,
        0,
        "copies ≥ 1, min_sentences ≥ 2, block_size ≥ 2",
        msg_key="data.permute",
        got=(0, 4, 10),
    ),
    edge(
        "coherence",
        "data.permute.min_sentences",
        2,
        1,
        "copies ≥ 1, min_sentences ≥ 2, block_size ≥ 2",
        msg_key="data.permute",
        got=(20, 1, 10),
    ),
    edge(
        "coherence",
        "data.permute.block_size",
        2,
        1,
        "copies ≥ 1, min_sentences ≥ 2, block_size ≥ 2",
        msg_key="data.permute",
        got=(20, 4, 1),
    ),
]


@pytest.mark.parametrize(
    ("space", "key", "ok", "bad", "msg_key", "expected", "got", "base"),
    [*COMMON, *UPPER, *GEC, *IDIOM, *STS, *COHERENCE],
)
def test_edge_passes_and_beyond_is_refused_naming_the_key(
    space: str, key: str, ok: Any, bad: Any, msg_key: str, expected: str, got: Any, base: dict[str, Any]
) -> None:
    def settings(value: Any) -> dict[str, Any]:
        return {**base, **({key: value} if key else value)}  # no key: a pair() row, the value is the settings

    validate(_config(space, settings(ok)), where=WHERE)
    message = _refused(_config(space, settings(bad)))
    assert message == _message(msg_key, expected, got)
    assert "\n" not in message


@pytest.mark.parametrize("space", ["gec", "idiom", "sts", "coherence"])
def test_every_task_default_passes_and_gets_the_common_checks(space: str) -> None:
    validate(_config(space, {}), where=WHERE)
    message = _refused(_config(space, {"scaling.num_workers": -1}))
    assert message == _message("scaling.num_workers", "an integer ≥ 0", -1)
    message = _refused(_config(space, {"optim.update_freq": 0}))
    assert message == _message("optim.update_freq", "an integer ≥ 1", 0)


def _two_rank_text(workers: int, gpus: float) -> str:
    return (
        f"{WHERE}: config key 'scaling.gpus_per_worker': expected > 0.5 with scaling.num_workers={workers} "
        f"GPU workers (Ray may put two workers of {gpus:g} GPU on one GPU, and NCCL refuses two ranks of one "
        f"run on one GPU), got {gpus:g}; share a GPU with one worker, or give each worker a GPU"
    )


@pytest.mark.parametrize(
    ("use_gpu", "workers", "gpus", "refused"),
    [
        (True, 2, 0.5, True),  # two ranks of 0.5 GPU may land on one GPU
        (True, 3, 0.25, True),
        (True, 2, 0.51, False),  # two such workers never fit one GPU
        (True, 1, 0.5, False),  # one worker may share a GPU (with miners, other trials)
        (False, 2, 0.5, False),  # no GPUs asked for
    ],
)
def test_gpu_workers_of_one_run_never_share_a_gpu(use_gpu: bool, workers: int, gpus: float, refused: bool) -> None:
    cfg = _config(
        "gec", {"scaling.use_gpu": use_gpu, "scaling.num_workers": workers, "scaling.gpus_per_worker": gpus}
    )
    if refused:
        assert _refused(cfg) == _two_rank_text(workers, gpus)
    else:
        validate(cfg, where=WHERE)


def test_validate_runs_through_set_dotted_too() -> None:
    """A ``--set`` / Tune point goes through the same checks (the path users meet)."""
    from raycl.config import set_dotted

    cfg = _config("idiom", {})
    assert set_dotted(cfg, {"optim.warmup_ratio": 0.0}, where=WHERE).optim.warmup_ratio == 0.0
    with pytest.raises(UserError) as err:
        set_dotted(cfg, {"optim.warmup_ratio": 1.0}, where=WHERE)
    assert str(err.value) == _message("optim.warmup_ratio", "a number in [0, 1)", 1.0)


@pytest.mark.parametrize(
    ("setting", "batch_size", "seed", "expected"),
    [
        ("both", None, None, {"zero_shot": (16, 0), "one_shot": (32, 1)}),  # the released scripts' values
        ("one_shot", None, None, {"one_shot": (32, 1)}),
        ("zero_shot", 8, 5, {"zero_shot": (8, 5)}),  # given values win over the setting's
    ],
)
def test_idiom_settings_and_their_released_batch_sizes_and_seeds(
    setting: str, batch_size: int | None, seed: int | None, expected: dict[str, tuple[int, int]]
) -> None:
    cfg = _config("idiom", {"data.setting": setting, "optim.batch_size": batch_size, "optim.seed": seed})
    assert cfg.settings == tuple(expected)
    assert {s: (cfg.batch_size(s), cfg.seed(s)) for s in cfg.settings} == expected


def test_sts_trial_ends_in_fine_tuning_unless_it_has_no_epochs() -> None:
    assert _config("sts", {"finetune.epochs": 1}).final_setting == "fine_tune"
    assert _config("sts", {"finetune.epochs": 0}).final_setting == "pre_train"


# ---------------------------------------------------------------------------------------------- at the edge
def _space_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _load_refused(space: str, overrides: list[str] | None = None) -> str:
    from raycl.config.tasks import load_space

    with pytest.raises(UserError) as err:
        load_space(space, overrides=overrides)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_search_space_is_counted_before_it_is_expanded(tmp_path: Path) -> None:
    """A qrange of 1e11 values is refused with its count, in milliseconds and without building the list; one
    step of 1e-10 expands (its decimals read from the number, not from its repr's '.'); a grid of more trials
    than the cap, counted over keys, is refused too."""
    from raycl.config import MAX_SEARCH_VALUES, expand_values
    from raycl.config.tasks import load_space

    path = _space_file(tmp_path, "task: idiom\nsearch:\n  optim.lr: {qrange: [0.00001, 1000000, 0.00001]}\n")
    assert _load_refused(str(path)) == (
        f"{path}: search key 'optim.lr': 'qrange' [1e-05, 1000000, 1e-05] expands "
        f"to 100,000,000,000 values, expected at most {MAX_SEARCH_VALUES:,}"
    )
    path = _space_file(tmp_path, "task: idiom\nsearch:\n  optim.warmup_ratio: {qrange: [0.0, 1.0e-9, 1.0e-10]}\n")
    assert load_space(str(path)).search["optim.warmup_ratio"] == {"qrange": [0.0, 1e-9, 1e-10]}
    assert expand_values("qrange", [0.0, 1e-9, 1e-10]) == [round(i * 1e-10, 10) for i in range(11)]
    path = _space_file(tmp_path, "task: idiom\nsearch:\n  optim.warmup_ratio: {qrange: [0.0, 0.5, 1.0e-320]}\n")
    assert "expands to inf values" in _load_refused(str(path))  # (stop - start) / step overflows: counted as inf
    path = _space_file(tmp_path, "task: idiom\nsearch:\n  optim.warmup_ratio: {qrange: [0.0, 0.5, .inf]}\n")
    assert "of finite numbers" in _load_refused(str(path))
    grid = (
        "task: idiom\ntune: {num_samples: 2}\nsearch:\n  optim.warmup_ratio: {qrange: [0.0, 0.5, 0.001]}\n"
        "  optim.weight_decay: {grid: [0.0, 0.01, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]}\n"
    )
    path = _space_file(tmp_path, grid)
    assert _load_refused(str(path)) == (
        f"{path}: 'search' expands to 10,020 trials (5,010 grid points × "
        "tune.num_samples = 2), expected at most 10,000"
    )
    assert load_space(str(_space_file(tmp_path, grid.replace("num_samples: 2", "num_samples: 1")))).search


def test_numbers_from_the_command_line_and_yaml_are_read_and_bounded() -> None:
    """``--set`` reads scientific notation as the number it is (YAML 1.1 reads it as a string), so ``1e15``
    epochs meets the bound that names it; a YAML integer of 5,000 digits is refused as one line, not a
    ValueError from ``int()``; infinities and NaN are refused by the bounds."""
    from raycl.config.tasks import load_space

    assert load_space("idiom", overrides=["optim.lr=2e-5"]).config.optim.lr == 2e-5
    assert _load_refused("idiom", ["optim.epochs=1e15"]) == (
        "--set: config key 'optim.epochs': expected an integer ≤ 100,000, got 1000000000000000"
    )
    assert _load_refused("idiom", ["scaling.start_timeout_s=.inf"]) == (
        f"--set: config key 'scaling.start_timeout_s': expected {SECONDS}, got inf"
    )
    assert _load_refused("idiom", ["scaling.cpus_per_worker=.inf"]) == (
        f"--set: config key 'scaling.cpus_per_worker': expected {AMOUNT}, got inf"
    )
    digits = "9" * 5000
    assert _load_refused("idiom", [f"optim.epochs={digits}"]).startswith(
        "--set: config key 'optim.epochs': expected an integer, got '999"
    )
    one_and_a_half = _load_refused("idiom", ["optim.epochs=1.5"])
    assert one_and_a_half == "--set: config key 'optim.epochs': expected an integer, got 1.5"


def test_a_yaml_integer_of_thousands_of_digits_names_the_file_and_line(tmp_path: Path) -> None:
    path = _space_file(tmp_path, f"task: idiom\noptim:\n  epochs: {'9' * 5000}\n")
    expected = "invalid YAML (an integer of 5,000 characters, expected at most 40)"
    assert _load_refused(str(path)) == f"{path}:3: {expected}"


@pytest.mark.parametrize("bound", ["1" + "0" * 30, "9" * 5000, "-1000000000001"])
def test_a_data_slice_bound_is_an_integer_of_at_most_a_trillion(bound: str) -> None:
    from raycl.data.specs import MAX_BOUND, parse_spec

    with pytest.raises(UserError) as err:
        parse_spec(f"a.m2[{bound}:]", must_exist=False)
    assert "\n" not in str(err.value)
    assert str(err.value).endswith(f", expected an integer of magnitude at most {MAX_BOUND:,} (sentences)")
    assert parse_spec(f"a.m2[-{MAX_BOUND}:{MAX_BOUND}]", must_exist=False).stop == MAX_BOUND


@pytest.mark.parametrize(
    "setting", ["scaling.cpus_per_worker=.inf", "scaling.collective_timeout_s=1e20", "optim.epochs=1e15"]
)
def test_the_cli_refuses_an_unbounded_number_in_one_line_before_ray_starts(
    tmp_path: Path, setting: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """As the issue ran them: exit status 2, one line naming the key, nothing under ``--out`` (Ray never
    started: its session folder and the run folder's ``ray/`` are made only after the checks). The first as a
    process of its own (its exit status, no traceback); the others through the same ``main`` in this process."""
    import subprocess
    import sys

    out = tmp_path / "run"
    argv = ["idiom", "--preset", "smoke", "--set", setting, "--out", str(out)]
    if setting.startswith("scaling.cpus_per_worker"):
        proc = subprocess.run(
            [sys.executable, "-m", "raycl.tune", *argv], capture_output=True, text=True, timeout=120
        )
        code, err = proc.returncode, proc.stderr
    else:
        from raycl import tune

        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            tune.main(argv)
        code, err = exit_.value.code, capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("raycl: error: --set: config key "), err
    assert setting.split("=")[0] in err and "Traceback" not in err
    assert not out.exists() or not any(out.rglob("*"))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("a: &a [*a]\n", "an alias refers to a node that holds it"),  # found by tests/test_fuzz_readers.py
        ("a: &a {b: *a}\n", "an alias refers to a node that holds it"),
        (
            "".join(f"a{i}: &a{i} [*a{i - 1}]\n" if i else "a0: &a0 [x]\n" for i in range(70)),
            "aliases nest deeper than 64 levels",
        ),
    ],
)
def test_yaml_aliases_that_nest_without_end_are_one_line(tmp_path: Path, text: str, why: str) -> None:
    """A recursive alias made the alias counter recurse until RecursionError; aliases of aliases nest deeper than
    the text's own nesting, which the loader bounds. The line is the aliased node's."""
    path = _space_file(tmp_path, "task: idiom\n" + text)
    line = 2 if "holds it" in why else 63  # the node an alias holds; a61, whose alias nests 65 levels in a62
    assert _load_refused(str(path)) == f"{path}:{line}: invalid YAML ({why})"


def _nested(levels: int) -> str:
    """``levels`` flow lists around one scalar: ``levels + 1`` nested nodes."""
    return "[" * levels + "1" + "]" * levels


def _unwrapped(value: Any, levels: int) -> Any:
    for _ in range(levels):
        assert isinstance(value, list) and len(value) == 1
        value = value[0]
    return value


def test_yaml_nested_64_levels_deep_loads_and_one_more_is_one_line(tmp_path: Path) -> None:
    from raycl.config.bounded_yaml import safe_yaml

    assert _unwrapped(safe_yaml(_nested(63)), 63) == 1  # 64 nodes deep, the bound itself
    path = _space_file(tmp_path, f"task: idiom\nx: {_nested(63)}\n")  # under the top mapping: 65
    assert _load_refused(str(path)) == f"{path}:2: invalid YAML (nested deeper than 64 levels)"
    # counted from the top wherever the nesting starts: after siblings, and in a document that went deep before
    assert _unwrapped(safe_yaml(f"[0, {_nested(61)}, {_nested(62)}]")[2], 62) == 1
    path = _space_file(tmp_path, f"task: idiom\nx: [0, {_nested(61)}, {_nested(62)}]\n")
    assert _load_refused(str(path)) == f"{path}:2: invalid YAML (nested deeper than 64 levels)"


def _chain(anchors: int) -> str:
    """``a0: &a0 [x]``, then each ``ai: &ai [*a(i-1)]``: ``a(n-1)`` nests ``anchors`` lists through aliases."""
    return "".join(f"a{i}: &a{i} [*a{i - 1}]\n" if i else "a0: &a0 [x]\n" for i in range(anchors))


def test_aliases_that_nest_64_levels_load_and_one_more_is_one_line(tmp_path: Path) -> None:
    from raycl.config.bounded_yaml import safe_yaml

    loaded = safe_yaml(_chain(62))  # the top mapping, a61's 62 lists, x: 64 levels
    assert _unwrapped(loaded["a61"], 62) == "x" and _unwrapped(loaded["a0"], 1) == "x"
    path = _space_file(tmp_path, "task: idiom\n" + _chain(63))
    assert _load_refused(str(path)) == f"{path}:63: invalid YAML (aliases nest deeper than 64 levels)"


def _copies(copies: int, extra: str = "") -> str:
    """``a:`` a list of 101 scalars, ``b:`` ``copies`` aliases of it (then ``extra``): the top mapping, two keys
    and two lists are 4 nodes, each list of 101 is 102: 4 + (copies + 1) · 102 nodes once the aliases expand."""
    return "a: &a [" + ", ".join(["x"] * 101) + "]\nb: [" + ", ".join(["*a"] * copies) + extra + "]\n"


def test_yaml_whose_aliases_expand_to_10000_nodes_loads_and_one_more_is_refused(tmp_path: Path) -> None:
    import yaml

    from raycl.config.bounded_yaml import safe_yaml

    loaded = safe_yaml(_copies(97))  # 4 + 98 · 102 = 10,000
    assert len(loaded["b"]) == 97 and all(b == ["x"] * 101 for b in loaded["b"])
    with pytest.raises(yaml.YAMLError) as err:
        safe_yaml(_copies(97, ", y"))  # 10,001
    assert getattr(err.value, "problem", None) == "aliases expand to more than 10000 nodes"
    path = _space_file(tmp_path, "task: idiom\n" + _copies(97))  # 10,002
    assert _load_refused(str(path)) == f"{path}:1: invalid YAML (aliases expand to more than 10000 nodes)"


def test_a_yaml_integer_of_40_characters_is_read_and_of_41_refused(tmp_path: Path) -> None:
    from raycl.config.bounded_yaml import safe_yaml

    assert safe_yaml(f"a: {'9' * 40}\nb: -{'9' * 39}\n") == {"a": int("9" * 40), "b": -int("9" * 39)}
    path = _space_file(tmp_path, f"task: idiom\noptim:\n  epochs: -{'9' * 40}\n")
    expected = "invalid YAML (an integer of 41 characters, expected at most 40)"
    assert _load_refused(str(path)) == f"{path}:3: {expected}"


@pytest.mark.parametrize(
    ("overrides", "key", "bad", "expected"),
    [
        ({"wait_s": 604_800.0}, "wait_s", 604_800.5, SECONDS),  # a seconds key, below a section
        ({"cpus_per_head": 1024.0}, "cpus_per_head", 1025.0, AMOUNT),
        ({"driver_cpus": 1024.0}, "driver_cpus", 1025.0, AMOUNT),
        ({"warmup_epochs": 100_000}, "warmup_epochs", 100_001, "an integer ≤ 100,000"),
        ({"seed": 2**32 - 1}, "seed", 2**32, "an integer ≤ 4,294,967,295"),
        (  # a seed four mappings down (BartConfig's task_specific_params): the last part names the kind
            {"task_specific_params": {"summarization": {"seed": 2**32 - 1}}},
            "task_specific_params.summarization.seed",
            2**32,
            "an integer ≤ 4,294,967,295",
        ),
        (  # a resource is a value of a resources mapping, not anything further down
            {"resources": {"gpu": {"count": 2**31 - 1}}},
            "resources.gpu.count",
            2**31,
            INT,
        ),
    ],
)
def test_a_number_is_bounded_by_its_last_key_at_any_depth(
    overrides: dict[str, Any], key: str, bad: Any, expected: str
) -> None:
    """``model.overrides`` (BartConfig's fields) is a mapping of anything: its numbers are bounded by the kind
    their own key names, as a section's are, however deep."""
    validate(_config("gec", {"model.overrides": overrides}), where=WHERE)
    nested = bad
    for part in reversed(key.split(".")):
        nested = {part: nested}
    message = _refused(_config("gec", {"model.overrides": nested}))
    assert message == _message(f"model.overrides.{key}", expected, bad)


def test_a_config_without_checks_of_its_own_gets_the_common_ones() -> None:
    """``validate`` runs a config's own ``validate(where)`` when it has one (every task's does); a config of
    only the shared sections is checked by them alone."""
    from raycl.config import LoopOptions, ScalingSection, TuneSection

    @dataclasses.dataclass
    class Plain:
        scaling: ScalingSection = dataclasses.field(default_factory=ScalingSection)
        tune: TuneSection = dataclasses.field(default_factory=TuneSection)
        optim: LoopOptions = dataclasses.field(default_factory=LoopOptions)

    validate(Plain(), where=WHERE)
    message = _refused(Plain(optim=LoopOptions(update_freq=0)))
    assert message == _message("optim.update_freq", "an integer ≥ 1", 0)
    message = _refused(Plain(tune=TuneSection(num_samples=2**31)))
    assert message == _message("tune.num_samples", INT, 2**31)
