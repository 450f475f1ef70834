"""The worker placement group of a Ray Train run whose controller died (a trial Tune stopped early) is removed by
raycl's reaper, which asks the controller through its handle, not the dashboard's State API."""

from __future__ import annotations

import time

import pytest

from raycl.distributed.placement import PlacementReaper


def _state(ray, group) -> str | None:  # noqa: ANN001
    return ray.util.placement_group_table(group).get("state")


def _until(check, limit_s: float = 60.0) -> bool:  # noqa: ANN001
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.2)
    return False


@pytest.fixture
def trial(ray_local):  # noqa: ANN001, ANN201
    """A Tune trial's actor that owns a Ray Train controller, a placement group, and a reaper watching it."""
    ray = ray_local

    @ray.remote(num_cpus=0)
    class Controller:
        def busy(self, seconds: float) -> None:
            time.sleep(seconds)

    @ray.remote(num_cpus=0)
    class Trial:
        def start(self):  # noqa: ANN202
            self.controller = Controller.remote()
            return self.controller

    owner = Trial.remote()
    controller = ray.get(owner.start.remote())
    group = ray.util.placement_group([{"CPU": 0.01}])
    ray.get(group.ready(), timeout=60)
    reaper = ray.remote(num_cpus=0, max_concurrency=2)(PlacementReaper).remote(controller, 0.1, 0.5)
    ended = reaper.run.remote()
    ray.get(reaper.watch.remote(group))
    yield ray, owner, controller, group, reaper, ended
    ray.kill(owner)
    ray.kill(reaper)
    ray.util.remove_placement_group(group)


def test_the_group_of_a_dead_controller_is_removed_and_the_reaper_ends(trial) -> None:  # noqa: ANN001
    ray, owner, _, group, _, ended = trial
    time.sleep(1.0)  # ten questions to a live controller: the group stays
    assert _state(ray, group) == "CREATED"
    ray.kill(owner)  # Tune ends the trial's actor; the controller it owns dies with it
    assert _until(lambda: _state(ray, group) == "REMOVED"), _state(ray, group)
    with pytest.raises(ray.exceptions.RayActorError):  # the reaper ended itself
        ray.get(ended, timeout=60)


def test_a_controller_slow_to_answer_is_not_taken_for_dead(trial) -> None:  # noqa: ANN001
    ray, _, controller, group, _, ended = trial
    busy = controller.busy.remote(3.0)  # its questions wait behind this call, longer than the reaper's 0.5 s
    ray.get(busy, timeout=60)
    assert _state(ray, group) == "CREATED"
    assert not ray.wait([ended], timeout=0)[0]  # still watching
