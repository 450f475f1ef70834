"""What a training worker asks of Ray Train: its rank, DDP wrapping, reporting, the checkpoint to resume.

The recipe loops call these functions and never import Ray themselves, so they run and test in one process without
it. With ``scaling.num_workers=0`` Ray Train runs the loop in-process (local mode) and the same calls work.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray.train
import ray.train.torch
import torch


def world() -> tuple[int, int]:
    """``(rank, world_size)`` of this worker."""
    ctx = ray.train.get_context()
    return ctx.get_world_rank(), ctx.get_world_size()


def device() -> torch.device:
    """This worker's device; on a share of a GPU (``scaling.gpus_per_worker`` < 1) its CUDA memory is capped to
    that share here, once, before the model is moved to it."""
    from raycl.distributed.resources import cap_gpu_memory

    got = ray.train.torch.get_device()
    cap_gpu_memory(got)
    return got


def wrap_ddp(model: torch.nn.Module, *, find_unused_parameters: bool = False) -> torch.nn.Module:
    """DDP over ``model`` (already on this worker's device) when there is more than one worker; its bucketed
    all-reduce overlaps the backward. ``find_unused_parameters`` only for models with parameters a step may not
    use (it costs a graph traversal every step)."""
    _, size = world()
    if size <= 1:
        return model
    return ray.train.torch.prepare_model(
        model, move_to_device=False, parallel_strategy_kwargs={"find_unused_parameters": find_unused_parameters}
    )


def report(metrics: dict[str, Any], *, checkpoint_dir: Path | None = None) -> None:
    """Report metrics (all ranks must call) and, optionally, a checkpoint folder each rank just wrote: the ranks'
    folders are uploaded into one checkpoint (rank 0's state, every rank's RNG)."""
    ckpt = ray.train.Checkpoint.from_directory(str(checkpoint_dir)) if checkpoint_dir is not None else None
    ray.train.report(metrics, checkpoint=ckpt)


@contextmanager
def resume_dir() -> Iterator[Path | None]:
    """The folder of the checkpoint to resume from (after a worker failure or a resumed run), or None."""
    ckpt = ray.train.get_checkpoint()
    if ckpt is None:
        yield None
        return
    with ckpt.as_directory() as path:
        yield Path(path)


@contextmanager
def scratch_dir() -> Iterator[Path]:
    """A temporary folder for a checkpoint about to be reported (Ray copies it into storage)."""
    with tempfile.TemporaryDirectory(prefix="raycl-ckpt-") as tmp:
        yield Path(tmp)
