"""One config dataclass per task, in ``raycl/configs/<task>.py``; a space file's ``task:`` key picks it."""

from __future__ import annotations

import importlib

TASK_CONFIGS = {"gec": "GecConfig", "coherence": "CoherenceConfig", "idiom": "IdiomConfig", "sts": "StsConfig"}


def task_config(task: str) -> type | None:
    """The config class of ``task`` (None for an unknown task); modules load on first use."""
    if task not in TASK_CONFIGS:
        return None
    return getattr(importlib.import_module(f"raycl.configs.{task}"), TASK_CONFIGS[task])
