"""One config dataclass per task, in ``raycl/config/tasks/<task>.py``; a space file's ``task:`` key picks it, and
:func:`load_space` reads a space file into its task's config (the machinery it uses is :mod:`raycl.config`'s)."""

from __future__ import annotations

import importlib

from raycl.config import Space, build_space, read_space
from raycl.errors import UserError, shown

TASK_CONFIGS = {"gec": "GecConfig", "coherence": "CoherenceConfig", "idiom": "IdiomConfig", "sts": "StsConfig"}


def task_config(task: str) -> type | None:
    """The config class of ``task`` (None for an unknown task); modules load on first use."""
    if task not in TASK_CONFIGS:
        return None
    return getattr(importlib.import_module(f"raycl.config.tasks.{task}"), TASK_CONFIGS[task])  # type: ignore[no-any-return]


def load_space(space: str, *, preset: str | None = None, overrides: list[str] | None = None) -> Space:
    """Load a space file, apply ``--preset`` then ``--set`` overrides, validate config, search and baselines."""
    path, raw, search, baselines = read_space(space, preset=preset)
    task = raw.get("task", "gec")
    cls = task_config(task) if isinstance(task, str) else None
    if cls is None:
        raise UserError(f"{path}: config key 'task': expected one of {', '.join(TASK_CONFIGS)}, got {shown(task)}")
    return build_space(path, cls, raw, search=search, baselines=baselines, preset=preset, overrides=overrides)
