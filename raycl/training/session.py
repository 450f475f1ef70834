"""What a training worker asks of the system it runs on: its rank, its device, DDP, reporting, the checkpoint to
resume, and its negative source opened from the driver's spec.

The loop and the recipes ask these of the :class:`TrainSession` their :class:`~raycl.training.task.Job` carries and
never import Ray: the driver puts Ray Train's in the job (``raycl.distributed.session.RaySession``), a test may put
its own. So ``raycl.training`` sits below ``raycl.distributed``, and a mined negative's way from the miners to the
loss descends into the loop instead of climbing to it (docs/architecture.md, "A negative's path").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import torch

from raycl.miners.sources import DenseRefresh, RefreshAnchor, SourceSpec
from raycl.training.negatives.base import NegativeSource, Place


class TrainSession(Protocol):
    def world(self) -> tuple[int, int]:
        """``(rank, world_size)`` of this worker."""

    def device(self) -> torch.device:
        """This worker's device."""

    def wrap_ddp(self, model: torch.nn.Module, *, find_unused_parameters: bool = False) -> torch.nn.Module:
        """DDP over ``model`` (on this worker's device) when there is more than one worker, else ``model``."""

    def report(self, metrics: dict[str, Any], *, checkpoint_dir: Path | None = None) -> None:
        """Report metrics (every rank calls it) and, optionally, the checkpoint folder this rank just wrote."""

    def resume_dir(self) -> AbstractContextManager[Path | None]:
        """The folder of the checkpoint to resume from, or None."""

    def scratch_dir(self) -> AbstractContextManager[Path]:
        """A temporary folder for a checkpoint about to be reported."""

    def open_source(self, spec: SourceSpec | None, at: Place[Any]) -> NegativeSource[Any]:
        """The negative source a worker holds for the driver's ``spec`` (None: no negatives)."""

    def open_refreshed(
        self,
        spec: DenseRefresh,
        initial: Mapping[str, Sequence[str]],
        anchors: list[list[RefreshAnchor]],
        *,
        rank: int,
        world_size: int,
    ) -> Mapping[str, list[str]]:
        """STS's dense negatives, ``{anchor: negatives}``, from ``initial`` (version 0) on, refreshed by the
        miners behind ``spec``."""
