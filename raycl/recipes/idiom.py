"""SemEval-2022 Task 2 Subtask A: idiomaticity detection with EMA and adversarial training (ZhichunRoad: Cui,
Xiong, Wang 2022), as SPEC §3.1 and §4 run it.

The run, read top to bottom::

    1. data      official CSVs (or the built-in set), read and checked before anything trains   prepare()
    2. model     the preset's classifier (smoke: a BPE trained on the run's texts)               base_model()
    3. train     per trial, one setting in a TorchTrainer (idiom_worker):                          train_one()
                   zero_shot: "Previous Target Next" of train_zero_shot;
                   one_shot: (Target, MWE) of train_one_shot + train_zero_shot;
                   AdamW + linear schedule, adversarial terms on the word embeddings, EMA; dev macro-F1 with
                   the EMA weights every epoch, the best epoch kept
    4. select    per setting, dev macro-F1 (EN+PT) over the sweep (adversarial method, batch, EMA on/off)
    5. ladder    the space's ``baselines`` (baseline → + EMA → + FGM / PGD / FreeLB / SMART) at each setting's
                 best point: the paper's Tables 3–4
    6. report    submissions with both settings filled, results.csv, best.json, report.md, dev curves

The sweep gets a grid dimension over the settings (``data.setting: both``) unless its ``search`` names
``data.setting``; Tune's metric ``dev_f1`` is only compared within a setting. Each trial writes its setting's
rows of ``dev.submission.csv`` and ``eval.submission.csv`` under ``trials/<id>/``; the run folder's files take
each setting's rows from its best trial.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raycl.config import Space, dump_yaml, set_dotted, to_dict
from raycl.configs.idiom import SETTINGS, IdiomConfig
from raycl.data.semeval import (
    A_SUBMISSION_HEADER,
    IdiomExample,
    read_idiom_gold,
    read_idiom_inputs,
    read_idiom_train,
    read_rows,
    with_gold,
)  # fmt: skip
from raycl.data.semeval_corpus import write_builtin_semeval
from raycl.distributed.sweep import TrialOutcome, grid, run_sweep, to_param_space, trial_run_name
from raycl.distributed.trainer import fit
from raycl.errors import UserError, at
from raycl.models.classifier import build_classifier
from raycl.recipes import idiom_report
from raycl.recipes.common import read_history, say
from raycl.recipes.idiom_worker import train_worker
from raycl.train.progress import follow

BASE_MODEL = "base_model"
DATA_KEYS = {"train_zero_shot": "a.train_zero_shot", "train_one_shot": "a.train_one_shot", "dev": "a.dev",
             "dev_gold": "a.dev_gold", "dev_submission_format": "a.dev_submission_format", "eval": "a.eval",
             "eval_gold": "a.eval_gold", "eval_submission_format": "a.eval_submission_format"}  # fmt: skip
SPLIT_OF = {"dev_gold": "dev", "dev_submission_format": "dev", "eval_gold": "eval",
            "eval_submission_format": "eval"}  # fmt: skip


@dataclass
class IdiomRun:
    """What every trial of a run shares."""

    cfg: IdiomConfig
    run_dir: Path
    base_model: Path
    builtin: list[str]
    counts: dict[str, int]
    timings: dict[str, float]


# ---------------------------------------------------------------------------------------------- 1. data
def with_data(cfg: IdiomConfig, data_dir: Path) -> tuple[IdiomConfig, list[str]]:
    """Fill the empty ``data`` keys with the built-in set (written once into ``data_dir``); a split's optional
    files (gold of eval, format files) are filled only when the split itself is built-in."""
    d = cfg.data
    empty = [k for k in DATA_KEYS if not getattr(d, k) and not getattr(d, SPLIT_OF.get(k, k))]
    if not empty:
        return cfg, []
    files = write_builtin_semeval(data_dir, seed=d.builtin.seed)
    fill: dict[str, Any] = {k: str(files[DATA_KEYS[k]]) for k in empty}
    return dataclasses.replace(cfg, data=dataclasses.replace(d, **fill)), empty


def _inputs(path: str, gold: str, key: str) -> list[IdiomExample]:
    """A dev/eval input file, checked against its gold file (the same IDs in the same order, as upstream)."""
    examples = read_idiom_inputs(path)
    if gold:
        with_gold(examples, read_idiom_gold(gold), name=f"data.{key}: {gold}")
    return examples


def _check_format(path: str, examples: list[IdiomExample], settings: tuple[str, ...], key: str) -> None:
    """Every input ID has a row per trained setting in the submission format file."""
    rows = {(r[0], r[2]) for _, r in read_rows(path, A_SUBMISSION_HEADER)}
    for e in examples:
        for s in settings:
            if (e.id, s) not in rows:
                raise UserError(f"{at(path)}: no row for ID {e.id} setting {s}; expected the IDs of "
                                f"data.{key.removesuffix('_submission_format')}")  # fmt: skip


def check_data(cfg: IdiomConfig) -> dict[str, int]:
    """Read every file in the driver: a malformed one fails here (one line, exit 2), not in a worker."""
    d = cfg.data
    counts = {"train_zero_shot": len(read_idiom_train(d.train_zero_shot))}
    if "one_shot" in cfg.settings:
        counts["train_one_shot"] = len(read_idiom_train(d.train_one_shot))
    if counts["train_zero_shot"] + counts.get("train_one_shot", 0) == 0:
        raise UserError(f"data.train_zero_shot: {d.train_zero_shot} has no rows, expected labelled examples")
    for split in ("dev", "eval"):
        if not getattr(d, split):
            continue
        examples = _inputs(getattr(d, split), getattr(d, f"{split}_gold"), f"{split}_gold")
        counts[split] = len(examples)
        if getattr(d, f"{split}_submission_format"):
            _check_format(getattr(d, f"{split}_submission_format"), examples, cfg.settings,
                          f"{split}_submission_format")  # fmt: skip
    return counts


def check_inputs(space: Space, run_dir: Path) -> None:
    """Before Ray starts (``raycl.cli``): every data file of the run is read once."""
    cfg, _ = with_data(space.config, run_dir / "data")
    check_data(cfg)


# ---------------------------------------------------------------------------------------------- 2. model
def base_model(cfg: IdiomConfig, run_dir: Path) -> Path:
    """The preset's classifier (``model.checkpoint`` replaces a pretrained preset's encoder); the smoke preset's
    BPE is trained on every text the run reads. An existing folder (a resumed run) is reused."""
    m, out = cfg.model, run_dir / BASE_MODEL
    if (out / "config.json").exists():
        return out
    texts = None
    if m.preset == "smoke" and not m.checkpoint:
        d = cfg.data
        rows = read_idiom_train(d.train_zero_shot) + read_idiom_train(d.train_one_shot)
        rows += read_idiom_inputs(d.dev) + (read_idiom_inputs(d.eval) if d.eval else [])
        texts = [t for e in rows for t in (e.zero_shot_text(), e.mwe)]
    return build_classifier(m.preset, out, texts=texts, seed=m.seed, checkpoint=m.checkpoint)


def prepare(space: Space, run_dir: Path) -> IdiomRun:
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
    return IdiomRun(cfg, run_dir, model, builtin, counts, {"prepare_s": time.perf_counter() - t0})


# ---------------------------------------------------------------------------------------------- 3. train
def train_one(run: IdiomRun, cfg: IdiomConfig, out_dir: Path, *, name: str, in_tune: bool) -> Any:
    """One setting at one point in a TorchTrainer (``scaling.num_workers=0``: in-process)."""
    loop_config = {"config": to_dict(cfg), "init_model": str(run.base_model), "out_dir": str(out_dir)}
    result = fit(train_worker, loop_config, scaling=cfg.scaling, name=name, storage_path=run.run_dir / "ray",
                 in_tune=in_tune)  # fmt: skip
    if result.error is not None:
        raise result.error
    return result


def idiom_trial(params: dict[str, Any], *, run: IdiomRun, baselines: dict[str, dict[str, Any]],
                points: dict[str, dict[str, Any]]) -> None:  # fmt: skip
    """One Tune trial: the space's point, or a named baseline's overrides at its setting's best point."""
    over = dict(params)
    name = over.pop("baseline", None)
    if name is not None:
        over = {**points.get(over["data.setting"], {}), **over, **baselines[name]}
    cfg = set_dotted(run.cfg, over, where="trial")
    trial = trial_run_name()
    train_one(run, cfg, run.run_dir / "trials" / trial.split("=", 1)[-1], name=trial, in_tune=True)


def _sweep(run: IdiomRun, space: Space, param_space: dict[str, Any], *, name: str,
           points: dict[str, dict[str, Any]], fifo: bool = False) -> list[TrialOutcome]:  # fmt: skip
    tune_cfg = dataclasses.replace(run.cfg.tune, scheduler="fifo") if fifo else run.cfg.tune
    return run_sweep(idiom_trial, param_space,
                     trial_kwargs={"run": run, "baselines": space.baselines, "points": points},
                     tune_cfg=tune_cfg, name=name, storage_path=run.run_dir / "ray",
                     max_t=run.cfg.optim.epochs + 1)  # fmt: skip


def sweep_space(space: Space, cfg: IdiomConfig) -> dict[str, Any]:
    """The search as Tune domains, with a grid over the run's settings unless the search names one."""
    param_space = to_param_space(space.search)
    if "data.setting" not in param_space:
        param_space["data.setting"] = grid(list(cfg.settings))
    values = next(iter(space.search.get("data.setting", {"grid": list(SETTINGS)}).values()))
    if any(v not in SETTINGS for v in values):
        raise UserError(f"{space.source}: search key 'data.setting': expected values among {', '.join(SETTINGS)} "
                        f"(one setting per trial), got {values!r}")  # fmt: skip
    return param_space


def ladder_of(space: Space, cfg: IdiomConfig) -> list[str]:
    """The baselines run as the table's rows: ``ladder.baselines``, or all of the space's, in the space's order."""
    unknown = [n for n in cfg.ladder.baselines if n not in space.baselines]
    if unknown:
        raise UserError(f"{space.source}: config key 'ladder.baselines': expected names among the space's "
                        f"baselines ({', '.join(space.baselines) or 'none'}), got {unknown!r}")  # fmt: skip
    return [n for n in space.baselines if not cfg.ladder.baselines or n in cfg.ladder.baselines]


# ---------------------------------------------------------------------------------------------- drivers
def run_tune(space: Space, run_dir: Path) -> dict[str, Any]:
    """``python -m raycl.tune idiom``: the sweep, the strategy ladder at each setting's best point, the report."""
    param_space = sweep_space(space, space.config)
    ladder_of(space, space.config)
    run = prepare(space, run_dir)
    say(f"sweep over {', '.join(param_space)} (one setting per trial)")
    t0 = time.perf_counter()
    trials = _sweep(run, space, param_space, name="sweep", points={})
    run.timings["sweep_s"] = time.perf_counter() - t0
    best = idiom_report.best_trials(trials, metric=run.cfg.tune.metric, mode=run.cfg.tune.mode)
    extra: list[TrialOutcome] = []
    names, settings = ladder_of(space, run.cfg), [s for s in best if s in (run.cfg.ladder.settings or SETTINGS)]
    if names and settings:
        say(f"Tables 3–4's ladder at the best point of {', '.join(settings)}: {', '.join(names)}")
        t0 = time.perf_counter()
        points = {s: t.params for s, t in best.items()}
        extra = _sweep(run, space, {"baseline": grid(names), "data.setting": grid(settings)}, name="baselines",
                       points=points, fifo=True)  # fmt: skip
        run.timings["baselines_s"] = time.perf_counter() - t0
    return idiom_report.write_all(run, space, trials, extra)


def run_train(space: Space, run_dir: Path) -> dict[str, Any]:
    """``python -m raycl.train idiom``: the space's default point, one training per setting, then the report."""
    run = prepare(space, run_dir)
    trials = []
    t0 = time.perf_counter()
    for setting in run.cfg.settings:
        cfg = set_dotted(run.cfg, {"data.setting": setting}, where="train")
        out_dir = run.run_dir / "trials" / setting
        with follow(out_dir, desc=setting, unit="step"):
            train_one(run, cfg, out_dir, name=f"train-{setting}", in_tune=False)
        trials.append(TrialOutcome(setting, {"data.setting": setting}, read_history(out_dir)))
    run.timings["train_s"] = time.perf_counter() - t0
    return idiom_report.write_all(run, space, trials, [])
