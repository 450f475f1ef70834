"""A recipe's own smoke step for ``bench/train.py --shape smoke``: the smoke preset's data (built-in) and model,
the recipe's ``task.build`` and the first micro-batches of its first epoch (``task.epoch``), collated by the task
and on the device — the steps ``raycl.train <recipe> --preset smoke`` trains, without Ray (rank 0 of 1, in
process).

GEC's fine-tuning (step 3) starts from the untrained initial model (pretraining would need Ray Train) and takes
``mining.k`` negatives per sentence made here (the source, and words dropped from or swapped in the target) in
place of mined ones: the step's code is the same, its negatives' text is not what a miner would find.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from itertools import islice
from pathlib import Path
from typing import Any

import torch

SPACES = {"gec": "gec_pd", "idiom": "idiom", "sts": "sts", "coherence": "coherence"}
OVERRIDES = {"idiom": ["data.setting=zero_shot"], "gec": [], "sts": [], "coherence": []}


def smoke_batches(
    recipe: str, device: torch.device, tmp: Path, n: int, *, phase: str = "finetune"
) -> tuple[Any, Any, list[Any]]:
    """(task, state, the stream's first ``n`` micro-batches) of ``recipe``'s smoke run, prepared in ``tmp``."""
    from raycl.config.tasks import load_space
    from raycl.driver import Run
    from raycl.recipes import recipe_for
    from raycl.testing.session import LocalSession
    from raycl.training.precision import Precision
    from raycl.training.task import Job, Worker

    rec = recipe_for(recipe)
    space = load_space(SPACES[recipe], preset="smoke", overrides=OVERRIDES[recipe])
    cfg, _ = rec.with_data(space.config, tmp / "data")
    rec.check_data(cfg)
    run = Run(cfg, tmp, tmp / "base_model", [], {})
    task = _task(recipe, rec, run, phase)
    w = Worker(
        0,
        1,
        device,
        Precision("fp32", device),
        tmp / "out",
        Job(task, str(run.base_model), str(tmp / "out"), session=LocalSession()),
    )
    model = task.load_model(run.base_model)
    model.to(device)
    st = task.build(model, w, None)
    return task, st, _first(task, st, task.epoch(st, w, 0, 0).batches, n, device)


def _first(task: Any, st: Any, batches: Any, n: int, device: torch.device) -> list[Any]:
    from raycl.training.prefetch import to_device
    from raycl.training.task import Batch

    first = list(islice((b for b in batches if isinstance(b, Batch)), n))
    return [dataclasses.replace(b, data=to_device(task.collate(st, b.data), device)) for b in first]


def _task(recipe: str, rec: Any, run: Any, phase: str) -> Any:
    """The recipe's task on the run's base model (GEC: the initial model, its negatives made here)."""
    cfg = run.cfg
    if recipe == "gec":
        from raycl.recipes.gec.recipe import _initial_model

        run.base_model = _initial_model(cfg, run.run_dir / "init")
        return _gec_task(cfg, phase)
    rec.base_model(run)
    if recipe == "idiom":
        from raycl.recipes.idiom.worker import IdiomTask

        return IdiomTask(cfg)
    if recipe == "sts":
        from raycl.recipes.sts.worker import StsTask

        return StsTask(cfg)
    from raycl.recipes.coherence.recipe import train_items
    from raycl.recipes.coherence.worker import CoherenceTask

    return CoherenceTask(cfg, str(train_items(run)))


def _gec_task(cfg: Any, phase: str) -> Any:
    from raycl.recipes.gec.worker import GecTask
    from raycl.training.negatives import StaticNegatives

    @dataclasses.dataclass(frozen=True)
    class SmokeGecTask(GecTask):
        def _source(self, examples: list[Any], w: Any) -> Any:
            if self.phase == "pretrain":
                return super()._source(examples, w)
            negatives = {ex.id: _negatives(ex, self.cfg.mining.k) for ex in examples}
            return StaticNegatives(examples, negatives, functools.partial(self._plan, len(examples), w))

    return SmokeGecTask(cfg, phase)


def _negatives(ex: Any, k: int) -> list[str]:
    """CL's negatives: the source, then the target with a word dropped or two words swapped."""
    rng, words = random.Random(ex.id), ex.target.split()
    out = [ex.source]
    while len(out) < k and len(words) > 2:
        w = list(words)
        i = rng.randrange(len(w) - 1)
        if rng.random() < 0.5:
            del w[i]
        else:
            w[i], w[i + 1] = w[i + 1], w[i]
        out.append(" ".join(w))
    return out[:k]
