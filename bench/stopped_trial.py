"""What a trial that Tune stops leaves behind when the Ray it runs on has no dashboard: a Ray Train run with one
worker inside an actor (a Tune trial's shape: the actor owns the Train controller), the actor killed once the
worker runs (what Tune's stop ends in), then the seconds until the worker's placement group is removed — with
raycl's trainer (``raycl.distributed.training.fit``: its reaper asks the controller) and with Ray's
``TorchTrainer`` (Train's cleaner asks the dashboard's State API). ``--wait`` bounds the wait; ``null``: the group
was still there, holding its CPU. Embedded Ray started with ``include_dashboard=False``; one JSON object."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _train(marker: str) -> None:
    Path(marker).write_text("started", encoding="utf-8")
    time.sleep(3600)


def _groups(ray: Any) -> set[str]:
    return {k for k, v in ray.util.placement_group_table().items() if v.get("state") not in ("REMOVED", None)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the group's removal")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import ray
    from ray.util.placement_group import PlacementGroup

    from raycl.config import ScalingSection

    env = {"PYTHONPATH": str(ROOT), "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}
    ray.init(
        address="local", num_cpus=2, include_dashboard=False, runtime_env={"env_vars": env}, log_to_driver=False
    )

    @ray.remote(num_cpus=0)
    class Trial:
        def run(self, which: str, marker: str, storage: str) -> None:
            import functools

            fn = functools.partial(_train, marker)
            if which == "raycl":
                from raycl.distributed.training import fit

                fit(fn, scaling=ScalingSection(num_workers=1), name="stopped", storage_path=Path(storage))
            else:
                import ray.train
                from ray.train.torch import TorchTrainer

                TorchTrainer(
                    fn,
                    scaling_config=ray.train.ScalingConfig(num_workers=1),
                    run_config=ray.train.RunConfig(name="stopped", storage_path=storage),
                ).fit()

    out: dict[str, Any] = {"dashboard": False, "wait_s": args.wait}
    for which in ("raycl", "ray"):
        with tempfile.TemporaryDirectory() as tmp:
            marker, before = os.path.join(tmp, "started"), _groups(ray)
            trial = Trial.remote()
            trial.run.remote(which, marker, os.path.join(tmp, "ray"))
            end = time.monotonic() + 300
            while not os.path.exists(marker) and time.monotonic() < end:
                time.sleep(0.2)
            held = _groups(ray) - before
            ray.kill(trial)  # Tune's stop: the trial's actor ends, its controller with it
            t0 = time.monotonic()
            while _groups(ray) & held and time.monotonic() - t0 < args.wait:
                time.sleep(0.2)
            left = _groups(ray) & held
            out[which] = {
                "worker_started": os.path.exists(marker),
                "groups": len(held),
                "removed_after_s": None if left else round(time.monotonic() - t0, 1),
            }
            for g in left:  # free the CPU for the next case
                ray.util.remove_placement_group(PlacementGroup(ray.PlacementGroupID.from_hex(g)))
            print(f"{which}: {out[which]}", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
