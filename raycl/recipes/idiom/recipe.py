"""SemEval-2022 Task 2 Subtask A: idiomaticity detection with EMA and adversarial training (ZhichunRoad: Cui,
Xiong, Wang 2022), as the released code runs it.

The run, as the driver (``raycl.driver``) runs it with this recipe::

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

from pathlib import Path
from typing import Any

from raycl import storage
from raycl.config import Space
from raycl.configs.idiom import SETTINGS, IdiomConfig
from raycl.data.semeval import (
    read_idiom_inputs,
    read_idiom_train,
)  # fmt: skip
from raycl.distributed.sweep import grid, to_param_space
from raycl.driver import RecipeBase, Run, TrainPoint, fit_job
from raycl.errors import UserError
from raycl.models.classifier import build_classifier
from raycl.recipes.idiom import inputs, report
from raycl.recipes.idiom.worker import IdiomTask
from raycl.records import TrialOutcome
from raycl.training.task import Job


class IdiomRecipe(RecipeBase):
    task = "idiom"
    group_key: str | None = "data.setting"

    with_data = staticmethod(inputs.idiom_with_data)
    check_data = staticmethod(inputs.idiom_check_data)

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
        checkpoint = storage.fetch(m.checkpoint) if m.checkpoint else None  # a URI: fetched to this node's cache
        build_classifier(m.preset, out, texts=texts, seed=m.seed, checkpoint=checkpoint)

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
