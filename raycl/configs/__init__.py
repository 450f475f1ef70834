"""One config dataclass per task; a space file's ``task:`` key picks it (default ``gec``)."""

from __future__ import annotations

from raycl.configs.gec import GecConfig

TASKS: dict[str, type] = {"gec": GecConfig}
