"""The driver side asks for a share of the head-only resource ``raycl_head`` (issue 38): the embedded Ray provides
it, Tune accepts a trial bundle of CPU plus a share of it (it rejects one of no CPU), and the stream and weight
store outside a trial ask for it; without it on the cluster they ask for nothing more than before."""

from __future__ import annotations

from typing import Any

import pytest

from raycl.distributed.resources import HEAD_RESOURCE, HEAD_SHARE, driver_bundle, head_share, on_head


@pytest.mark.slow
def test_tune_accepts_a_trial_bundle_of_cpu_plus_a_share_of_the_head_resource(
    ray_local: Any, tmp_path: Any
) -> None:
    from ray import tune
    from ray.tune.execution.placement_groups import PlacementGroupFactory

    def _trial(config: dict[str, Any]) -> None:  # defined here: pickled by value (this module is not importable)
        import ray
        from ray import tune

        tune.report({"assigned": ray.get_runtime_context().get_assigned_resources().get("raycl_head", 0.0)})

    assert ray_local.cluster_resources()[HEAD_RESOURCE] == 1.0  # init_ray's embedded Ray is the head
    bundle = driver_bundle(0.25)
    assert bundle == {"CPU": 0.25, HEAD_RESOURCE: HEAD_SHARE}
    tuner = tune.Tuner(
        tune.with_resources(_trial, PlacementGroupFactory([bundle])),
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
    )
    result = tuner.fit()[0]
    assert result.error is None and result.metrics["assigned"] == pytest.approx(HEAD_SHARE)


@pytest.mark.slow
def test_the_stream_and_the_store_outside_a_trial_ask_for_the_head(ray_local: Any) -> None:
    from ray.util.state import list_actors

    from raycl.distributed.stream import start_stream
    from raycl.distributed.weights import start_weight_store

    assert on_head() == {"resources": {HEAD_RESOURCE: HEAD_SHARE}}
    store = start_weight_store(**on_head())
    stream = start_stream(world_size=1, capacity=4, task_size=2, **on_head())
    ray_local.get(stream.stats.remote())
    ray_local.get(store.pull_if_newer.remote(-1))
    ids = {stream._actor_id.hex(), store._actor_id.hex()}
    gcs = ray_local.get_runtime_context().gcs_address  # (other Rays may run on this machine)
    asked = [a.required_resources for a in list_actors(address=gcs, detail=True, limit=1000) if a.actor_id in ids]
    assert asked == [{HEAD_RESOURCE: HEAD_SHARE}] * 2, asked
    ray_local.kill(stream)
    ray_local.kill(store)


def test_without_the_head_resource_the_driver_side_asks_nothing_more(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0})  # a user's own cluster
    assert head_share() == {} and on_head() == {} and driver_bundle(0.25) == {"CPU": 0.25}
