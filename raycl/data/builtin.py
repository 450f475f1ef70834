"""The built-in data sets, as a run's config takes them: every ``data`` key the config leaves empty is set to the
built-in set's file(s) for it, which the recipe's generator writes into the run's ``data/`` — once, and only where
a key is empty (GEC's, coherence's and SemEval's sets, ``raycl.data.*_corpus``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

C = TypeVar("C")


def with_builtin(cfg: C, keys: Iterable[str], write: Callable[[], Mapping[str, Any]]) -> tuple[C, list[str]]:
    """``cfg`` with each of its empty ``data`` keys among ``keys`` set to its value in ``write()`` (the built-in
    set's files by key, written when called: only if a key is empty), and the keys it filled in ``keys``' order."""
    given: Any = cfg  # a recipe's config dataclass, with a ``data`` section (a dataclass too)
    empty = [k for k in keys if not getattr(given.data, k)]
    if not empty:
        return cfg, []
    fill = write()
    data = dataclasses.replace(given.data, **{k: fill[k] for k in empty})
    return dataclasses.replace(given, data=data), empty
