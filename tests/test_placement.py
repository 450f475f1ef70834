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


def _removes_on_second_try() -> type[PlacementReaper]:
    """A reaper whose first removal fails, as a call to a GCS too busy to answer does (made in a function: Ray
    pickles it by value, as its workers cannot import a test module)."""

    class RemovesOnSecondTry(PlacementReaper):
        def __init__(self, *args: float) -> None:
            super().__init__(*args)
            self.removals = 0

        def remove(self) -> None:
            self.removals += 1
            if self.removals == 1:
                raise TimeoutError("the GCS did not answer")
            super().remove()

    return RemovesOnSecondTry


def _watched(ray, reaper_cls: type[PlacementReaper]):  # noqa: ANN001, ANN202
    """A Tune trial's actor that owns a Ray Train controller, a placement group, and a reaper watching it."""

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
    reaper = ray.remote(num_cpus=0, max_concurrency=2)(reaper_cls).remote(controller, 0.1, 0.5)
    ended = reaper.run.remote()
    ray.get(reaper.watch.remote(group))
    return owner, controller, group, reaper, ended


@pytest.fixture(params=["reaper", "first-removal-fails"])
def trial(ray_local, request):  # noqa: ANN001, ANN201
    ray = ray_local
    cls = PlacementReaper if request.param == "reaper" else _removes_on_second_try()
    owner, controller, group, reaper, ended = _watched(ray, cls)
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
    with pytest.raises(ray.exceptions.RayActorError):  # the reaper ended itself (a failed removal: tried again)
        ray.get(ended, timeout=60)


@pytest.mark.parametrize("hook", ["before_controller_abort", "before_controller_shutdown"])
def test_a_controller_dying_before_its_group_is_removed_leaves_the_group_to_the_reaper(ray_local, hook) -> None:  # noqa: ANN001
    """Ray Train's abort calls ``before_controller_abort`` before it removes the worker group, and its shutdown
    calls ``before_controller_shutdown`` even when removing the group failed: a controller killed then (its trial's
    actor ended meanwhile) must not have ended the reaper."""
    ray = ray_local
    group = ray.util.placement_group([{"CPU": 0.01}])
    ray.get(group.ready(), timeout=60)

    @ray.remote(num_cpus=0)
    class Controller:
        def ending(self, group, hook: str):  # noqa: ANN001, ANN202
            import asyncio
            import inspect
            from types import SimpleNamespace

            from raycl.distributed.training import ReaperCallback

            state = SimpleNamespace(placement_group_handle=SimpleNamespace(placement_group=group))
            self.callback = ReaperCallback()  # what Ray Train's controller calls, in its order
            self.callback.after_controller_start(None)
            self.callback.after_worker_group_start(SimpleNamespace(get_worker_group_state=lambda: state))
            called = getattr(self.callback, hook)()
            if inspect.isawaitable(called):
                asyncio.run(called)
            return self.callback.reaper

    controller = Controller.remote()
    reaper = ray.get(controller.ending.remote(group, hook), timeout=120)
    try:
        time.sleep(1.5)  # the reaper asks the live controller: the group stays
        assert _state(ray, group) == "CREATED"
        ray.kill(controller)  # before the group was removed
        assert _until(lambda: _state(ray, group) == "REMOVED"), _state(ray, group)
    finally:
        ray.kill(reaper)
        ray.util.remove_placement_group(group)


def test_a_controller_slow_to_answer_is_not_taken_for_dead(trial) -> None:  # noqa: ANN001
    ray, _, controller, group, _, ended = trial
    busy = controller.busy.remote(3.0)  # its questions wait behind this call, longer than the reaper's 0.5 s
    ray.get(busy, timeout=60)
    assert _state(ray, group) == "CREATED"
    assert not ray.wait([ended], timeout=0)[0]  # still watching
