"""A Ray Train run's worker placement group, removed once the run's controller is gone, without Ray's State API.

Ray Train V2's worker placement group lives as long as the Ray job, not as the controller that made it
(ray-project/ray#54305): when Tune stops a trial early (ASHA, PBT) its actor ends, the controller with it, and the
group keeps its CPUs and GPUs until something removes it. Train's own ``PlacementGroupCleaner`` learns that the
controller died through the State API (``ray.util.state.get_actor``), that is through the dashboard's HTTP server:
where the dashboard is missing, not yet up, or too slow on a loaded head node, it only logs "Failed to query Ray
Train Controller actor state" and the group stays, and the next trial's workers wait for resources that never come
(``scaling.start_timeout_s`` then ends that trial). :class:`PlacementReaper` asks the controller itself, through
its actor handle: a call to a dead actor fails at once with ``RayActorError`` (the core worker, not the
dashboard, knows), a live one answers. :class:`raycl.distributed.training.ReaperCallback` starts it; the process
costs what Train's cleaner's did (``bench/trial_cost.py``: 2.3–2.5 CPU-s against 2.5–2.6)."""

from __future__ import annotations

import logging
import time
from typing import Any

import ray

log = logging.getLogger(__name__)


class PlacementReaper:
    """A detached actor beside one Train controller: it keeps the controller's latest worker placement group and
    removes it once the controller is dead, then exits. The controller kills it when it shuts down in order, once
    it has removed its group itself."""

    def __init__(self, controller: Any, interval_s: float = 1.0, answer_s: float = 10.0) -> None:
        self.controller, self.interval_s, self.answer_s = controller, interval_s, answer_s
        self.group: Any = None

    def watch(self, group: Any) -> None:
        """The controller's worker group (re)started on ``group``: the one to remove if the controller dies."""
        self.group = group

    def controller_alive(self) -> bool:
        """False only when a call to the controller failed because the actor is dead; a slow answer (a loaded
        node) counts as alive, and is asked again."""
        ref = self.controller.__ray_ready__.remote()
        ready, _ = ray.wait([ref], timeout=self.answer_s)
        if not ready:
            return True
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError:
            return False
        return True

    def run(self) -> None:
        """Ask every ``interval_s`` until the controller is dead; then remove its group and end this actor."""
        while True:
            time.sleep(self.interval_s)
            try:
                if self.controller_alive():
                    continue
                self.remove()
            except Exception as err:  # never give up on the group: a failed question or removal is tried again
                log.warning("raycl: the placement-group reaper's question or removal failed (%s); again", err)
                continue
            ray.actor.exit_actor()

    def remove(self) -> None:
        """Remove the watched group unless it is gone already."""
        group = self.group
        if gone(group):
            return
        log.warning("raycl: the Ray Train controller died; removing its worker placement group %s", group.id.hex())
        ray.util.remove_placement_group(group)


def gone(group: Any) -> bool:
    """Whether the placement group ``group`` (None: none was made) no longer holds resources."""
    return group is None or ray.util.placement_group_table(group).get("state") in (None, "REMOVED")
