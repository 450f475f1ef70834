"""SemEval-2022 Task 2 Subtask A: idiomaticity detection with EMA and adversarial training (ZhichunRoad: Cui,
Xiong, Wang 2022), as the released code runs it (docs/recipes/idiom.md): one setting per trial (zero_shot: the
"Previous Target Next" text; one_shot: the (Target, MWE) pair), compared apart (``group_key``); the ladder of
Tables 3–4 (baseline → + EMA → + FGM / PGD / FreeLB / SMART) at each setting's best point; each setting's
submission rows from its best trial.
"""

from __future__ import annotations

from pathlib import Path

from raycl import storage
from raycl.config import Space
from raycl.config.tasks.idiom import SETTINGS, IdiomConfig
from raycl.data.semeval import read_idiom_inputs, read_idiom_train
from raycl.driver import Phase, RecipeBase, Run
from raycl.errors import UserError
from raycl.models.classifier import build_classifier
from raycl.recipes.idiom import inputs
from raycl.recipes.idiom.report import REPORT
from raycl.recipes.idiom.worker import IdiomTask


class IdiomRecipe(RecipeBase):
    task = "idiom"
    group_key: str | None = "data.setting"

    with_data = staticmethod(inputs.idiom_with_data)
    report = REPORT
    check_data = staticmethod(inputs.idiom_check_data)

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

    def groups(self, space: Space) -> list[str]:
        """The settings trained apart (a sweep's grid over them unless its search names ``data.setting``)."""
        values = next(iter(space.search.get("data.setting", {"grid": list(SETTINGS)}).values()))
        if any(v not in SETTINGS for v in values):
            expected = f"expected values among {', '.join(SETTINGS)} (one setting per trial)"
            raise UserError(f"{space.source}: search key 'data.setting': {expected}, got {values!r}")
        return list(space.config.settings)

    def phase(self, run: Run, cfg: IdiomConfig, out_dir: Path) -> Phase:
        """One setting at one point (``scaling.num_workers=0``: in-process)."""
        return Phase("train", cfg.data.setting, IdiomTask(cfg), run.base_model, raises=True)

    def max_t(self, run: Run) -> int:
        return int(run.cfg.optim.epochs) + 1
