"""SemEval-2022 Task 2 Subtask A: idiomaticity detection with EMA and adversarial training (ZhichunRoad: Cui,
Xiong, Wang 2022), as the released code runs it.

The run, as the driver (``raycl.recipes.driver``) runs it with this recipe::

    1. data      official CSVs (or the built-in set), read and checked before anything trains   check_data()
    2. model     the preset's classifier (smoke: a BPE trained on the run's texts)               base_model()
    3. train     per trial, one setting on the one loop (worker.py):                               train_one()
                   zero_shot: "Previous Target Next" of train_zero_shot;
                   one_shot: (Target, MWE) of train_one_shot + train_zero_shot;
                   AdamW + linear schedule, adversarial terms on the word embeddings, EMA; dev macro-F1 with
                   the EMA weights every epoch, the best epoch kept
    4. select    per setting, dev macro-F1 (EN+PT) over the sweep (adversarial method, batch, EMA on/off)
    5. ladder    the space's ``baselines`` (baseline → + EMA → + FGM / PGD / FreeLB / SMART) at each setting's
                 best point: the paper's Tables 3–4
    6. report    submissions with both settings filled, results.csv, best.json, report.md, dev curves

The sweep gets a grid dimension over the settings (``data.setting: both``) unless its ``search`` names
``data.setting``; Tune's metric ``dev_f1`` is only compared within a setting (``group_key``). Each trial writes its
setting's rows of ``dev.submission.csv`` and ``eval.submission.csv`` under ``trials/<id>/``; the run folder's files
take each setting's rows from its best trial.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from raycl.config import Space
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
from raycl.distributed.sweep import TrialOutcome, grid, to_param_space
from raycl.errors import UserError, at
from raycl.models.classifier import build_classifier
from raycl.recipes.driver import RecipeBase, Run, TrainPoint, fit_job
from raycl.recipes.idiom import report
from raycl.recipes.idiom.worker import IdiomTask
from raycl.train.loop import Job

DATA_KEYS = {"train_zero_shot": "a.train_zero_shot", "train_one_shot": "a.train_one_shot", "dev": "a.dev",
             "dev_gold": "a.dev_gold", "dev_submission_format": "a.dev_submission_format", "eval": "a.eval",
             "eval_gold": "a.eval_gold", "eval_submission_format": "a.eval_submission_format"}  # fmt: skip
SPLIT_OF = {"dev_gold": "dev", "dev_submission_format": "dev", "eval_gold": "eval",
            "eval_submission_format": "eval"}  # fmt: skip


class IdiomRecipe(RecipeBase):
    task = "idiom"
    group_key: str | None = "data.setting"

    # ------------------------------------------------------------------------------------------ 1. data
    def with_data(self, cfg: IdiomConfig, data_dir: Path) -> tuple[IdiomConfig, list[str]]:
        """Fill the empty ``data`` keys with the built-in set (written once into ``data_dir``); a split's optional
        files (gold of eval, format files) are filled only when the split itself is built-in."""
        d = cfg.data
        empty = [k for k in DATA_KEYS if not getattr(d, k) and not getattr(d, SPLIT_OF.get(k, k))]
        if not empty:
            return cfg, []
        files = write_builtin_semeval(data_dir, seed=d.builtin.seed)
        fill: dict[str, Any] = {k: str(files[DATA_KEYS[k]]) for k in empty}
        return dataclasses.replace(cfg, data=dataclasses.replace(d, **fill)), empty

    def check_data(self, cfg: IdiomConfig) -> dict[str, int]:
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

    # ------------------------------------------------------------------------------------------ 2. model
    def base_model(self, run: Run) -> None:
        """The preset's classifier (``model.checkpoint`` replaces a pretrained preset's encoder); the smoke
        preset's BPE is trained on every text the run reads. An existing folder (a resumed run) is reused."""
        m, out = run.cfg.model, run.base_model
        if (out / "config.json").exists():
            return
        texts = None
        if m.preset == "smoke" and not m.checkpoint:
            d = run.cfg.data
            rows = read_idiom_train(d.train_zero_shot) + read_idiom_train(d.train_one_shot)
            rows += read_idiom_inputs(d.dev) + (read_idiom_inputs(d.eval) if d.eval else [])
            texts = [t for e in rows for t in (e.zero_shot_text(), e.mwe)]
        build_classifier(m.preset, out, texts=texts, seed=m.seed, checkpoint=m.checkpoint)

    # ------------------------------------------------------------------------------------------ 3–5. train
    def search_space(self, space: Space, cfg: IdiomConfig) -> dict[str, Any]:
        """The search as Tune domains, with a grid over the run's settings unless the search names one."""
        param_space = to_param_space(space.search)
        if "data.setting" not in param_space:
            param_space["data.setting"] = grid(list(cfg.settings))
        values = next(iter(space.search.get("data.setting", {"grid": list(SETTINGS)}).values()))
        if any(v not in SETTINGS for v in values):
            raise UserError(f"{space.source}: search key 'data.setting': expected values among "
                            f"{', '.join(SETTINGS)} (one setting per trial), got {values!r}")  # fmt: skip
        return param_space

    def ladder(self, space: Space, cfg: IdiomConfig) -> list[str]:
        """The baselines run as the table's rows: ``ladder.baselines``, or all of the space's, in its order."""
        unknown = [n for n in cfg.ladder.baselines if n not in space.baselines]
        if unknown:
            raise UserError(f"{space.source}: config key 'ladder.baselines': expected names among the space's "
                            f"baselines ({', '.join(space.baselines) or 'none'}), got {unknown!r}")  # fmt: skip
        return [n for n in space.baselines if not cfg.ladder.baselines or n in cfg.ladder.baselines]

    def train_points(self, run: Run) -> list[TrainPoint]:
        return [TrainPoint(s, {"data.setting": s}, s) for s in run.cfg.settings]

    def train_one(self, run: Run, cfg: IdiomConfig, out_dir: Path, *, name: str, in_tune: bool) -> Any:
        """One setting at one point (``scaling.num_workers=0``: in-process)."""
        result = fit_job(run, cfg, Job(IdiomTask(cfg), str(run.base_model), str(out_dir)), name=name,
                         in_tune=in_tune)  # fmt: skip
        if result.error is not None:
            raise result.error
        return result

    def max_t(self, run: Run) -> int:
        return int(run.cfg.optim.epochs) + 1

    def best(self, trials: list[TrialOutcome], cfg: IdiomConfig) -> dict[Any, TrialOutcome]:
        return dict(report.best_trials(trials, metric=cfg.tune.metric, mode=cfg.tune.mode))

    def write_report(self, run: Run, space: Space, trials: list[TrialOutcome], extra: list[TrialOutcome]
                     ) -> dict[str, Any]:  # fmt: skip
        return report.write_all(run, space, trials, extra)


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
