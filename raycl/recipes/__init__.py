"""The recipes: one package per task (``gec``, ``coherence``, ``idiom``, ``sts``), each holding only what differs —
``recipe.py`` (the driver's side: data, base model, the phases it declares, report's selection), ``worker.py`` (the
loop's side: state, feed, step), ``evaluation.py`` (its scores, used by both) and ``report.py`` (its tables and
plots) — composed by the one driver (:mod:`raycl.driver`) and the one loop (:mod:`raycl.training.loop`)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:  # mypy checks each recipe against the driver's protocol here
    from raycl.driver import Recipe
    from raycl.recipes.coherence.recipe import CoherenceRecipe
    from raycl.recipes.gec.recipe import GecRecipe
    from raycl.recipes.idiom.recipe import IdiomRecipe
    from raycl.recipes.sts.recipe import StsRecipe

    _CHECKED: tuple[Recipe, ...] = (GecRecipe(), CoherenceRecipe(), IdiomRecipe(), StsRecipe())

# task → its recipe class (imported on first use: a CLI call loads one recipe's models, not all four)
RECIPES: dict[str, str] = {
    "gec": "gec.recipe.GecRecipe",
    "coherence": "coherence.recipe.CoherenceRecipe",
    "idiom": "idiom.recipe.IdiomRecipe",
    "sts": "sts.recipe.StsRecipe",
}


def recipe_for(task: str) -> Recipe:
    if task not in RECIPES:
        raise KeyError(f"no recipe for task {task!r} (known: {', '.join(RECIPES)})")
    module, name = f"{__name__}.{RECIPES[task]}".rsplit(".", 1)
    return cast("Recipe", getattr(importlib.import_module(module), name)())
