"""What a training worker asks of Ray Train: its rank, DDP wrapping, reporting, the checkpoint to resume — and its
negative source, opened from the driver's spec (the stream's and weight store's handles in it).

:class:`RaySession` is the :class:`raycl.training.session.TrainSession` the driver puts in every job; the loop and
the recipes call it and never import Ray themselves. With ``scaling.num_workers=0`` Ray Train runs the loop
in-process (local mode) and the same calls work; a Tune trial with ``scaling.num_workers=0`` runs it in the
trial's own process with :class:`TuneTrialSession` (Ray Train's functions refuse to run in a Tune trial).
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray.train
import ray.train.torch
import torch

from raycl.distributed.consumer import StreamConsumer
from raycl.distributed.nbest import wait_nbest
from raycl.errors import UserError
from raycl.miners.sources import (
    DenseRefresh,
    LiveStream,
    Permutations,
    RefreshAnchor,
    SharedNBest,
    SourceSpec,
)
from raycl.training.negatives import (
    NBestNegatives,
    NegativeSource,
    PermutationNegatives,
    Place,
    StreamNegatives,
    open_unmined,
)
from raycl.training.negatives.nbest import selected


class RaySession:
    """Ray Train's side of a worker (stateless: it travels in the job)."""

    def world(self) -> tuple[int, int]:
        """``(rank, world_size)`` of this worker."""
        ctx = ray.train.get_context()
        return ctx.get_world_rank(), ctx.get_world_size()

    def device(self) -> torch.device:
        """This worker's device; on a share of a GPU (``scaling.gpus_per_worker`` < 1) its CUDA memory is capped
        to that share here, once, before the model is moved to it."""
        from raycl.distributed.resources import cap_gpu_memory

        got = ray.train.torch.get_device()
        cap_gpu_memory(got)
        return got

    def wrap_ddp(self, model: torch.nn.Module, *, find_unused_parameters: bool = False) -> torch.nn.Module:
        """DDP over ``model`` (already on this worker's device) when there is more than one worker; its bucketed
        all-reduce overlaps the backward. ``find_unused_parameters`` only for models with parameters a step may
        not use (it costs a graph traversal every step)."""
        _, size = self.world()
        if size <= 1:
            return model
        return ray.train.torch.prepare_model(
            model,
            move_to_device=False,
            parallel_strategy_kwargs={"find_unused_parameters": find_unused_parameters},
        )

    def report(self, metrics: dict[str, Any], *, checkpoint_dir: Path | None = None) -> None:
        """Report metrics (all ranks must call) and, optionally, a checkpoint folder each rank just wrote: the
        ranks' folders are uploaded into one checkpoint (rank 0's state, every rank's RNG)."""
        ckpt = ray.train.Checkpoint.from_directory(str(checkpoint_dir)) if checkpoint_dir is not None else None
        self._report(metrics, ckpt)

    def _report(self, metrics: dict[str, Any], checkpoint: ray.train.Checkpoint | None) -> None:
        ray.train.report(metrics, checkpoint=checkpoint)

    def _checkpoint(self) -> ray.train.Checkpoint | None:
        return ray.train.get_checkpoint()

    @contextmanager
    def resume_dir(self) -> Iterator[Path | None]:
        """The folder of the checkpoint to resume from (after a worker failure or a resumed run), or None."""
        ckpt = self._checkpoint()
        if ckpt is None:
            yield None
            return
        with ckpt.as_directory() as path:
            yield Path(path)

    @contextmanager
    def scratch_dir(self) -> Iterator[Path]:
        """A temporary folder for a checkpoint about to be reported (Ray copies it into storage)."""
        with tempfile.TemporaryDirectory(prefix="raycl-ckpt-") as tmp:
            yield Path(tmp)

    def open_source(self, spec: SourceSpec | None, at: Place[Any]) -> NegativeSource[Any]:
        """The source a worker holds for the driver's ``spec`` (None: no negatives)."""
        return open_source(spec, at)

    def open_refreshed(
        self,
        spec: DenseRefresh,
        initial: Mapping[str, Sequence[str]],
        anchors: list[list[RefreshAnchor]],
        *,
        rank: int,
        world_size: int,
    ) -> Mapping[str, list[str]]:
        """STS's dense negatives refreshed while training: the ``{anchor: negatives}`` mapping its step reads, from
        the pre-mined ``initial`` (version 0) on, refreshed by the miners behind ``spec``
        (:class:`raycl.distributed.dense_refresh_feed.RefreshedNegatives`)."""
        from raycl.distributed.dense_refresh_feed import RefreshedNegatives

        return RefreshedNegatives(
            initial,
            anchors,
            stream=spec.stream,
            store=spec.store,
            rank=rank,
            world_size=world_size,
            refresh_every=spec.refresh_every,
            max_staleness=spec.max_staleness,
            wait_s=spec.wait_s,
        )


class TuneTrialSession(RaySession):
    """A Tune trial's own process as the one worker (``scaling.num_workers=0`` in a sweep): reports and
    checkpoints go to Tune (``ray.tune.report``, ``ray.tune.get_checkpoint``); no Ray Train controller, worker or
    helper actor is started."""

    def world(self) -> tuple[int, int]:
        return 0, 1

    def device(self) -> torch.device:
        """Asked only with ``scaling.use_gpu``: a trial's bundle holds no GPU (``tune.driver_cpus`` and its
        miners'), so such a training is refused in one line rather than run on the CPU unasked."""
        raise UserError(
            "scaling.use_gpu=true with scaling.num_workers=0 in a sweep: the trial trains in its own process, "
            "which holds no GPU; set scaling.num_workers to 1 or more (Ray Train workers with GPUs)"
        )

    def _report(self, metrics: dict[str, Any], checkpoint: ray.train.Checkpoint | None) -> None:
        from ray import tune

        tune.report(metrics, checkpoint=checkpoint)

    def _checkpoint(self) -> ray.train.Checkpoint | None:
        from ray import tune

        return tune.get_checkpoint()


def open_source(spec: SourceSpec | None, at: Place[Any]) -> NegativeSource[Any]:
    """The one place a negative source is built from the driver's spec (``raycl.training.negatives``)."""
    if (unmined := open_unmined(spec, at)) is not None:
        return unmined
    if isinstance(spec, SharedNBest):
        select = functools.partial(
            selected,
            k=spec.k,
            source_negative=spec.source_negative,
            refill=spec.refill,
            false_negatives=spec.false_negatives,
        )
        wait = functools.partial(wait_nbest, spec.stream)
        return NBestNegatives(wait, at.examples, at.planned(), batch_size=at.batch_size, select=select)
    if isinstance(spec, LiveStream):
        return StreamNegatives(
            _consumer(spec.stream, spec.store, spec.max_staleness, at),
            at.shards,
            batch_size=at.batch_size,
            sync_every=spec.sync_every,
            refresh_every=spec.refresh_every,
        )
    if isinstance(spec, Permutations):
        consumer = _consumer(spec.stream, spec.store, spec.max_staleness, at)
        return PermutationNegatives(
            at.shards, at.rank, batch_size=at.batch_size, rank_every=spec.rank_every, consumer=consumer
        )
    raise TypeError(f"no negative source opens {type(spec).__name__}: add it to open_source")


def _consumer(stream: Any, store: Any, max_staleness: int, at: Place[Any]) -> StreamConsumer:
    return StreamConsumer(stream, store, rank=at.rank, world_size=at.world_size, max_staleness=max_staleness)
