"""The recipes: one package per task (``gec``, ``coherence``, ``idiom``, ``sts``), each holding only what differs —
``recipe.py`` (the driver's side: data, base model, one training, report's selection), ``worker.py`` (the loop's
side: state, feed, step), ``evaluation.py`` (its scores, used by both) and ``report.py`` (its tables and plots) —
composed by the one driver (:mod:`raycl.driver`) and the one loop (:mod:`raycl.training.loop`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raycl.driver import Recipe


def _gec() -> Recipe:
    from raycl.recipes.gec.recipe import GecRecipe

    return GecRecipe()


def _coherence() -> Recipe:
    from raycl.recipes.coherence.recipe import CoherenceRecipe

    return CoherenceRecipe()


def _idiom() -> Recipe:
    from raycl.recipes.idiom.recipe import IdiomRecipe

    return IdiomRecipe()


def _sts() -> Recipe:
    from raycl.recipes.sts.recipe import StsRecipe

    return StsRecipe()


# task → its recipe (imported on first use: a CLI call loads one recipe's models, not all four)
RECIPES: dict[str, Callable[[], Recipe]] = {"gec": _gec, "coherence": _coherence, "idiom": _idiom, "sts": _sts}


def recipe_for(task: str) -> Recipe:
    if task not in RECIPES:
        raise KeyError(f"no recipe for task {task!r} (known: {', '.join(RECIPES)})")
    return RECIPES[task]()
