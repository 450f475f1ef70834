"""One training run on Ray Train V2: a ``TorchTrainer`` with 1…N DDP workers, or local mode with 0."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray.train
from ray._common.constants import HEAD_NODE_RESOURCE_NAME
from ray.train.torch import TorchConfig, TorchTrainer
from ray.train.torch.config import _TorchBackend
from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback

from raycl.config import ScalingSection
from raycl.distributed.placement import PlacementReaper, gone
from raycl.distributed.resources import cluster, gpu_problem, start_attempts_limit, worker_bundle, workers_ask
from raycl.errors import UserError
from raycl.storage import ray_storage

log = logging.getLogger(__name__)


def has_checkpoint(storage_path: Path, name: str) -> bool:
    """Whether the run ``name`` under ``storage_path`` reported a checkpoint: :func:`fit` with that name continues
    from it (Ray Train's run snapshot)."""
    from ray.train.v2._internal.constants import CHECKPOINT_MANAGER_SNAPSHOT_FILENAME

    return (Path(storage_path) / name / CHECKPOINT_MANAGER_SNAPSHOT_FILENAME).is_file()


def fit(
    train_fn: Callable[[], Any],
    *,
    scaling: ScalingSection,
    name: str,
    storage_path: Path,
    in_tune: bool = False,
    score_attribute: str | None = None,
    score_mode: str = "max",
) -> ray.train.Result:
    """Run ``train_fn`` (``functools.partial(raycl.training.loop.run, job)``: the job travels with the function,
    typed) on ``scaling.num_workers`` workers and return Ray's ``Result``.

    A worker that dies restarts the worker group from the last reported checkpoint, up to
    ``scaling.max_failures`` times; a worker group that cannot start ends the run in one line after
    ``scaling.start_timeout_s`` (:func:`_failure_config`). Inside a Tune trial the documented Train-in-Tune
    pattern applies (Ray Train's hyperparameter-optimization guide): a stable run name per trial (re-using it
    resumes that trial's run) and a ``TuneReportCallback`` forwarding rank 0's metrics.
    """
    where, filesystem = ray_storage(storage_path)  # a staged run's Ray storage is the object store itself
    callbacks: list[Any] = []
    if in_tune:
        from ray.tune.integration.ray_train import TuneReportCallback

        callbacks.append(TuneReportCallback())
    trainer = _Trainer(
        train_fn,
        # a collective that never completes (ranks that disagree on what comes next) fails the run after this long
        torch_config=CheckedTorchConfig(timeout_s=scaling.collective_timeout_s),
        scaling_config=ray.train.ScalingConfig(
            num_workers=scaling.num_workers,
            use_gpu=scaling.use_gpu,
            resources_per_worker=worker_bundle(scaling),  # a GPU share: scaling.gpus_per_worker
        ),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=where,
            storage_filesystem=filesystem,
            failure_config=_failure_config(scaling),
            checkpoint_config=ray.train.CheckpointConfig(
                num_to_keep=1,
                checkpoint_score_attribute=score_attribute,
                checkpoint_score_order=score_mode,
            ),
            callbacks=callbacks,
        ),
    )
    try:
        with _sigint_kept():
            return trainer.fit()
    except ray.train.ControllerError as err:
        said = _user_error(err.controller_failure)
        if said is not None:  # a worker's node cannot run it (CheckedTorchConfig): its one line
            raise said from None
        if not _did_not_start(err):
            raise
        raise UserError(
            f"the Ray Train worker group did not start within scaling.start_timeout_s="
            f"{scaling.start_timeout_s:g} s: {workers_ask(scaling)}; {cluster()}, and other work "
            "(another run, a sweep's trials, miners) may hold part of it"
        ) from None


def fit_in_trial(train_fn: Callable[[], Any]) -> ray.train.Result:
    """``scaling.num_workers=0`` in a Tune trial: ``train_fn`` in the trial's own process, no ``TorchTrainer``
    (Ray Train's functions refuse to run in a Tune trial); its job's session reports to Tune itself
    (:class:`raycl.distributed.session.TuneTrialSession`), and an error ends the trial."""
    train_fn()
    return ray.train.Result(metrics={}, checkpoint=None, error=None, path="")


@contextmanager
def _sigint_kept() -> Iterator[None]:
    """The process's SIGINT handler as it was before a training. On the main thread Ray Train's ``fit`` installs
    a handler that aborts its controller and never puts the old one back: after the training, Ctrl-C in the
    driver (its evaluation, report, the next phase) only asked a finished controller to abort — the third one
    exited with status 0 — and the handler's hold on the controller kept that actor (and what it holds) alive
    until the next training."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGINT)  # None: a handler not set from Python, which Ray's replaces anyway
    try:
        yield
    finally:
        if before is not None:
            signal.signal(signal.SIGINT, before)


def _attempt_s() -> float:
    """How long Ray Train waits for a worker group's resources in one attempt (its controller reads the same)."""
    from ray.train.v2._internal.constants import (
        DEFAULT_WORKER_GROUP_START_TIMEOUT_S,
        WORKER_GROUP_START_TIMEOUT_S_ENV_VAR,
    )

    return float(os.environ.get(WORKER_GROUP_START_TIMEOUT_S_ENV_VAR, DEFAULT_WORKER_GROUP_START_TIMEOUT_S))


def _failure_config(scaling: ScalingSection) -> Any:
    """Worker-group restarts after a failure (``scaling.max_failures``) and, apart from them, start attempts: Ray
    Train V2 counts a worker group that did not start in time as a controller failure, which it retries for ever
    by default (``controller_failure_limit=-1``); here until ``scaling.start_timeout_s`` has passed."""
    from ray.train.v2.api.config import FailureConfig

    limit = start_attempts_limit(scaling.start_timeout_s, _attempt_s())
    return FailureConfig(max_failures=scaling.max_failures, controller_failure_limit=limit)


def _did_not_start(err: ray.train.ControllerError) -> bool:
    from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError

    return isinstance(err.controller_failure, WorkerGroupStartupTimeoutError)


def _gpu_node_problem() -> str | None:
    return gpu_problem("a Ray Train worker", "scaling.use_gpu=true", nccl=True)


class _Trainer(TorchTrainer):  # type: ignore[misc]
    """``TorchTrainer`` without Ray Data's part when no Ray Dataset is given (raycl gives none: a recipe's data is
    read by its workers). Ray Train V2 starts a ``DatasetManager`` actor for every worker group whether or not
    there are datasets — one more process per training, which imports Ray Data (``ray.data``) and, with the
    controller's handle, lives as long as it. A worker group started without the callback gets no dataset shard
    provider, which only ``get_dataset_shard`` reads. Train's placement-group cleaner, which learns through the
    dashboard that a controller died, gives way to :class:`ReaperCallback`, which asks
    the controller."""

    def _create_default_callbacks(self) -> list[Any]:
        from ray.train.v2._internal.callbacks import DatasetsCallback
        from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

        callbacks = [
            ReaperCallback() if isinstance(c, PlacementGroupCleanerCallback) else c
            for c in super()._create_default_callbacks()  # type: ignore[misc]
        ]
        return callbacks if self.datasets else [c for c in callbacks if not isinstance(c, DatasetsCallback)]


class _CheckedTorchBackend(_TorchBackend):  # type: ignore[misc]
    """Ray Train's torch backend, which first asks every worker given a GPU whether its node can use it: without
    CUDA (or NCCL) there, ``init_process_group("nccl")`` ends the run in an NCCL traceback instead."""

    def on_start(self, worker_group: Any, backend_config: Any) -> None:
        if worker_group.get_resources_per_worker().get("GPU", 0) > 0:
            problems = [p for p in worker_group.execute(_gpu_node_problem) if p]
            if problems:
                raise UserError(problems[0])
        super().on_start(worker_group, backend_config)


class ReaperCallback(ControllerCallback, WorkerGroupCallback):  # type: ignore[misc]
    """Starts a :class:`PlacementReaper` beside the controller, gives it each worker group's placement group, and
    ends it when the controller shuts down in order, which removes the group first. An abort leaves it be: Ray
    Train calls ``before_controller_abort`` before it aborts the worker group, and the reaper removes the group
    should the controller die in between. Replaces Train's ``PlacementGroupCleanerCallback``
    (:class:`_Trainer`)."""

    def __init__(self) -> None:
        self.reaper: Any = None
        self.group: Any = None  # the worker group's placement group, as the reaper was told

    def after_controller_start(self, train_run_context: Any) -> None:
        self.reaper = (
            ray.remote(PlacementReaper)
            .options(  # two threads: its watch; what the controller tells it. Not in the trial's placement group
                num_cpus=0,
                max_concurrency=2,
                lifetime="detached",
                resources={HEAD_NODE_RESOURCE_NAME: 0.001},  # on the head: it outlives any worker node
                scheduling_strategy="DEFAULT",
            )
            .remote(ray.get_runtime_context().current_actor)
        )
        self.reaper.run.remote()

    def after_worker_group_start(self, worker_group: Any) -> None:
        group = self.group = worker_group.get_worker_group_state().placement_group_handle.placement_group
        try:  # bounded: a reaper that never started must not hold the run
            ray.get(self.reaper.watch.remote(group), timeout=60)
        except Exception as err:  # the run goes on; only the clean-up after a stop is at risk
            log.warning("raycl: the placement-group reaper was not told of group %s (%s)", group.id.hex(), err)

    async def before_controller_shutdown(self) -> None:
        """Ray Train calls this after it shut the worker group down, which removed its group: the reaper ends
        (a group a failed shutdown left stays with it, until the controller is gone)."""
        if self.reaper is not None and gone(self.group):
            ray.kill(self.reaper)
            self.reaper = None


class CheckedTorchConfig(TorchConfig):  # type: ignore[misc]
    """``TorchConfig`` with :class:`_CheckedTorchBackend`."""

    @property
    def backend_cls(self) -> type[_TorchBackend]:
        return _CheckedTorchBackend


def _user_error(err: BaseException | None) -> UserError | None:
    """The :class:`UserError` a Ray worker raised, as the driver's own (its message, without Ray's traceback)."""
    cause = getattr(err, "cause", err)  # a RayTaskError holds the worker's exception
    return UserError(str(cause)) if isinstance(cause, UserError) else None
