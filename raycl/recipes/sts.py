"""SemEval-2022 Task 2 Subtask B: idiom-aware sentence embeddings (ZhichunRoad: Cui, Xiong, Wang 2022), as SPEC
§3.2 and §4 run it.

The run, read top to bottom::

    1. data      official CSVs (or the built-in set), raycl's STS pre-training pairs          prepare()
    2. model     the preset's encoder with every MWE as one token, + cross-attention          base_model()
    3. train     per trial, in a TorchTrainer (sts_worker):                                    train_one()
                   pre_train: STS pairs, MSE of the cross-attended cosine + λ·InfoNCE (MoCo queue), keep best
                   fine_tune: train_data.csv, 'None' rows labelled by the pre-trained model, keep best on dev
    4. select    dev Spearman (ALL, EN+PT) of the trial's final setting over the sweep (λ, τ, Q, m)
    5. report    Table 5's ladder (baselines at the best point), Fig. 5, submissions            sts_report

Each trial writes ``dev.submission.csv`` and ``eval.submission.csv`` in the official layout (pre_train rows from
the pre-trained model, fine_tune rows from the fine-tuned one) under ``trials/<id>/``; the best trial's are
copied to the run folder.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raycl.config import Space, dump_yaml, set_dotted, to_dict
from raycl.configs.sts import StsConfig
from raycl.data.semeval import (
    B_GOLD_HEADER,
    B_SUBMISSION_HEADER,
    mwe_token,
    read_rows,
    read_sts_inputs,
    read_sts_pretrain,
    read_sts_train,
)  # fmt: skip
from raycl.data.semeval_corpus import write_builtin_semeval
from raycl.distributed.sweep import TrialOutcome, grid, run_sweep, to_param_space, trial_run_name
from raycl.distributed.trainer import fit
from raycl.errors import UserError
from raycl.models.sentence_encoder import CONFIG_FILE, build_sentence_encoder
from raycl.recipes import sts_report
from raycl.recipes.common import read_history, say
from raycl.recipes.sts_worker import fits, train_worker
from raycl.train.progress import follow

BASE_MODEL = "base_model"
DATA_KEYS = {"train_data": "b.train_data", "dev": "b.dev", "dev_gold": "b.dev_gold",
             "dev_submission_format": "b.dev_submission_format", "eval": "b.eval", "eval_gold": "b.eval_gold",
             "eval_submission_format": "b.eval_submission_format"}  # fmt: skip


@dataclass
class StsRun:
    """What every trial of a run shares."""

    cfg: StsConfig
    run_dir: Path
    base_model: Path
    builtin: list[str]
    counts: dict[str, int]
    timings: dict[str, float]


# ---------------------------------------------------------------------------------------------- 1. data
def with_data(cfg: StsConfig, data_dir: Path) -> tuple[StsConfig, list[str]]:
    """Fill every empty ``data`` key with the built-in set (written once into ``data_dir``)."""
    d = cfg.data
    empty = [k for k in DATA_KEYS if not getattr(d, k) and not (k == "eval_gold" and d.eval)]
    if not d.sts_pretrain:
        empty.append("sts_pretrain")
    if not empty:
        return cfg, []
    files = write_builtin_semeval(data_dir, seed=d.builtin.seed)
    fill: dict[str, Any] = {k: str(files[DATA_KEYS[k]]) for k in empty if k in DATA_KEYS}
    if "sts_pretrain" in empty:
        fill["sts_pretrain"] = [str(files["b.sts_pretrain"])]
    return dataclasses.replace(cfg, data=dataclasses.replace(d, **fill)), empty


def check_data(cfg: StsConfig) -> dict[str, int]:
    """Read every file in the driver: a malformed one fails here (one line, exit 2), not in a worker."""
    d = cfg.data
    pretrain = [p for spec in d.sts_pretrain for p in read_sts_pretrain(spec)]
    counts = {f"sts_{s}": sum(p.split == s for p in pretrain) for s in ("train", "dev", "test")}
    if counts["sts_train"] < 2 and cfg.pretrain.epochs:
        raise UserError(f"data.sts_pretrain: {', '.join(d.sts_pretrain)} has {counts['sts_train']} train pairs, "
                        "expected at least 2 (or pretrain.epochs: 0)")
    train = read_sts_train(d.train_data)
    for pair in train:
        pair.tokenised(upstream_quirk=d.upstream_quirk)  # an MWE missing from its sentence ends here
    counts["train_data"] = len(train)
    for split in ("dev", "eval"):
        pairs = read_sts_inputs(getattr(d, split))
        for pair in pairs:
            pair.tokenised(upstream_quirk=d.upstream_quirk)
        counts[split] = len(pairs)
        list(read_rows(getattr(d, f"{split}_submission_format"), B_SUBMISSION_HEADER))
    counts["dev_gold"] = len(list(read_rows(d.dev_gold, B_GOLD_HEADER)))
    if d.eval_gold:
        counts["eval_gold"] = len(list(read_rows(d.eval_gold, B_GOLD_HEADER)))
    return counts


def check_inputs(space: Space, run_dir: Path) -> None:
    """Before Ray starts (``raycl.cli``): every data file of the run is read once."""
    cfg, _ = with_data(space.config, run_dir / "data")
    check_data(cfg)


def mwe_tokens(cfg: StsConfig) -> list[str]:
    """The organisers' single tokens of every MWE in train, dev and eval (the "tokenised" mBERT's new words)."""
    d = cfg.data
    pairs = read_sts_train(d.train_data) + read_sts_inputs(d.dev) + read_sts_inputs(d.eval)
    return sorted({mwe_token(m) for p in pairs for m in (p.mwe1, p.mwe2) if m is not None})


# ---------------------------------------------------------------------------------------------- 2. model
def base_model(cfg: StsConfig, run_dir: Path) -> Path:
    """The preset with the MWE tokens (a tiny BERT's BPE is trained on every sentence of the run), or
    ``model.checkpoint``: an HF encoder for the preset, or a SentenceEncoder folder used as it is."""
    m = cfg.model
    if m.checkpoint and (Path(m.checkpoint) / CONFIG_FILE).exists():
        return Path(m.checkpoint)
    out = run_dir / BASE_MODEL
    if (out / CONFIG_FILE).exists():
        return out
    texts = None
    if m.preset == "smoke" and not m.checkpoint:
        d = cfg.data
        pretrain = [p for spec in d.sts_pretrain for p in read_sts_pretrain(spec)]
        rows = read_sts_train(d.train_data) + read_sts_inputs(d.dev) + read_sts_inputs(d.eval)
        texts = [s for p in pretrain for s in (p.sentence1, p.sentence2)]
        texts += [s for p in rows for s in (p.sentence1, p.sentence2, p.alternative_1, p.alternative_2) if s]
    return build_sentence_encoder(m.preset, out, texts=texts, extra_tokens=mwe_tokens(cfg), seed=m.seed,
                                  checkpoint=m.checkpoint, max_seq_length=m.max_seq_length)  # fmt: skip


def prepare(space: Space, run_dir: Path) -> StsRun:
    """Steps 1–2 and the run folder: resolved data, ``config.yaml``, the base model."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg, builtin = with_data(space.config, run_dir / "data")
    counts = check_data(cfg)
    if builtin:
        say(f"built-in SemEval set for {', '.join(builtin)} (written to {run_dir / 'data'})")
    say("data: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    dump_yaml(cfg, run_dir / "config.yaml")
    t0 = time.perf_counter()
    model = base_model(cfg, run_dir)
    return StsRun(cfg, run_dir, model, builtin, counts, {"prepare_s": time.perf_counter() - t0})


# ---------------------------------------------------------------------------------------------- 3. train
def train_one(run: StsRun, cfg: StsConfig, out_dir: Path, *, name: str, in_tune: bool) -> Any:
    """Both phases of one point in a TorchTrainer (``scaling.num_workers=0``: in-process)."""
    loop_config = {"config": to_dict(cfg), "init_model": str(run.base_model), "out_dir": str(out_dir)}
    return fit(train_worker, loop_config, scaling=cfg.scaling, name=name, storage_path=run.run_dir / "ray",
               in_tune=in_tune)  # fmt: skip


def sts_trial(params: dict[str, Any], *, run: StsRun, baselines: dict[str, dict[str, Any]]) -> None:
    """One Tune trial: the space's point (plus a named baseline's overrides)."""
    over = dict(params)
    name = over.pop("baseline", None)
    if name is not None:
        over.update(baselines[name])
    cfg = set_dotted(run.cfg, over, where="trial")
    name = trial_run_name()
    train_one(run, cfg, run.run_dir / "trials" / name.split("=", 1)[-1], name=name, in_tune=True)


def planned_reports(cfg: StsConfig, counts: dict[str, int]) -> int:
    """How many reports a trial makes (ASHA's ``max_t``): one per ``eval_every`` steps and epoch end, + 1."""
    world = max(cfg.scaling.num_workers, 1)
    total = 1
    for f in fits(cfg):
        n = counts["sts_train"] if f.setting == "pre_train" else counts["train_data"]
        steps = math.ceil(n // world / cfg.optim.batch_size)  # the pair loader; the sentence loader is longer
        total += f.epochs * (steps // f.eval_every + 1)
    return total


def _sweep(run: StsRun, space: Space, param_space: dict[str, Any], *, name: str, fifo: bool = False
           ) -> list[TrialOutcome]:  # fmt: skip
    tune_cfg = dataclasses.replace(run.cfg.tune, scheduler="fifo") if fifo else run.cfg.tune
    return run_sweep(sts_trial, param_space, trial_kwargs={"run": run, "baselines": space.baselines},
                     tune_cfg=tune_cfg, name=name, storage_path=run.run_dir / "ray",
                     max_t=planned_reports(run.cfg, run.counts))  # fmt: skip


# ---------------------------------------------------------------------------------------------- drivers
def run_tune(space: Space, run_dir: Path) -> dict[str, Any]:
    """``python -m raycl.tune sts``: the sweep (the full model), Table 5's ladder at its best point, the report."""
    run = prepare(space, run_dir)
    say(f"sweep over {', '.join(space.search) or 'the default point'} (pre-train → fine-tune per trial)")
    t0 = time.perf_counter()
    trials = _sweep(run, space, to_param_space(space.search), name="sweep")
    run.timings["sweep_s"] = time.perf_counter() - t0
    best = sts_report.best_trial(trials, metric=run.cfg.tune.metric, mode=run.cfg.tune.mode)
    extra: list[TrialOutcome] = []
    if best is not None and space.baselines:
        say(f"Table 5's ladder at the best point: {', '.join(space.baselines)}")
        t0 = time.perf_counter()
        extra = _sweep(run, space, {**best.params, "baseline": grid(list(space.baselines))}, name="baselines",
                       fifo=True)  # fmt: skip
        run.timings["baselines_s"] = time.perf_counter() - t0
    if best is not None:
        _export_submissions(run, best)
    return sts_report.write_all(run, space, trials, extra)


def run_train(space: Space, run_dir: Path) -> dict[str, Any]:
    """``python -m raycl.train sts``: one trial at the space's default point, then the report."""
    run = prepare(space, run_dir)
    out_dir = run.run_dir / "trials" / "train"
    t0 = time.perf_counter()
    with follow(out_dir, desc="pre-train → fine-tune"):
        result = train_one(run, run.cfg, out_dir, name="train", in_tune=False)
    run.timings["train_s"] = time.perf_counter() - t0
    if result.error is not None:
        raise result.error
    trial = TrialOutcome("train", {}, read_history(out_dir))
    _export_submissions(run, trial)
    return sts_report.write_all(run, space, [trial], [])


def _export_submissions(run: StsRun, trial: TrialOutcome) -> None:
    """The chosen trial's official-format submissions, copied to the run folder."""
    for name in ("dev.submission.csv", "eval.submission.csv"):
        src = run.run_dir / "trials" / trial.trial_id / name
        if src.exists():
            tmp = run.run_dir / f".{name}.tmp"
            shutil.copyfile(src, tmp)
            tmp.replace(run.run_dir / name)
