"""One shared local Ray per test session (started lazily, by the tests that need it); never `ray stop`."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")


@pytest.fixture(scope="session")
def ray_local():
    """A 2-CPU local Ray shared by every test that asks for it; shut down once at the end of the session."""
    import ray

    from raycl.distributed.runtime import init_ray

    init_ray(num_cpus=2)
    yield ray
    ray.shutdown()
