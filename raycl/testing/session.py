"""A :class:`raycl.training.session.TrainSession` without Ray, for tests and benchmarks that run the loop or a
recipe's task in one process: rank 0 of 1 on the given device, reports kept in a list, checkpoints kept in a
folder (the next run started with the same session resumes from the last), negatives only where no miner stands
behind them (pre-mined, none, coherence's own permutations). ``crash_after``: the report after which the run
"dies" (``SystemExit``)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from raycl.miners.sources import DenseRefresh, RefreshAnchor, SourceSpec
from raycl.training.negatives import NegativeSource, Place, open_unmined


class LocalSession:
    def __init__(self, root: Path | None = None, device: torch.device | None = None) -> None:
        self.root, self._device = root, device or torch.device("cpu")
        self.reports: list[dict[str, Any]] = []
        self.ckpt: Path | None = None
        self.crash_after: int | None = None

    def world(self) -> tuple[int, int]:
        return 0, 1

    def device(self) -> torch.device:
        return self._device

    def wrap_ddp(self, model: torch.nn.Module, *, find_unused_parameters: bool = False) -> torch.nn.Module:
        return model

    def report(self, metrics: dict[str, Any], *, checkpoint_dir: Path | None = None) -> None:
        self.reports.append(metrics)
        if checkpoint_dir is not None:
            if self.root is None:
                raise ValueError("LocalSession(root=None) keeps no checkpoints")
            self.ckpt = self.root / f"ckpt{len(self.reports)}"
            shutil.copytree(checkpoint_dir, self.ckpt)
        if self.crash_after == len(self.reports):
            raise SystemExit("crash")

    @contextmanager
    def resume_dir(self) -> Iterator[Path | None]:
        yield self.ckpt

    @contextmanager
    def scratch_dir(self) -> Iterator[Path]:
        with tempfile.TemporaryDirectory(prefix="raycl-ckpt-") as tmp:
            yield Path(tmp)

    def open_source(self, spec: SourceSpec | None, at: Place[Any]) -> NegativeSource[Any]:
        if (source := open_unmined(spec, at)) is None:
            raise TypeError(f"LocalSession opens no {type(spec).__name__} with miners: they need Ray (RaySession)")
        return source

    def open_refreshed(
        self,
        spec: DenseRefresh,
        initial: Mapping[str, Sequence[str]],
        anchors: list[list[RefreshAnchor]],
        *,
        rank: int,
        world_size: int,
    ) -> Mapping[str, list[str]]:
        raise TypeError("LocalSession refreshes no dense negatives: its miners need Ray (RaySession)")
