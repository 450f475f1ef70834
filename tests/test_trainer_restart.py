"""A Ray Train worker killed mid-epoch: Ray Train restarts the worker group from the last checkpoint (model,
optimizer, scheduler, epoch, step, weight version), the interrupted epoch is delivered again by the negative
stream, and the run completes. The restore republishes the weights under a newer version, since the dead run had
published past its checkpoint."""

from __future__ import annotations

from pathlib import Path

from conftest import GEC_TINY

from raycl import driver
from raycl.config.tasks import load_space
from raycl.recipes import recipe_for
from raycl.records import read_history
from raycl.testing.loop_hooks import CrashSwitch


def test_a_trainer_killed_mid_epoch_resumes_from_its_checkpoint(ray_local, tmp_path: Path) -> None:
    over = [
        *GEC_TINY,
        "scaling.num_workers=1",
        "scaling.cpus_per_worker=0.5",
        "scaling.max_failures=1",
        "optim.epochs=2",
        "optim.batch_size=8",
        "mining.sync_every=2",
        "mining.max_staleness=1",
    ]
    space = load_space("gec_pd", preset="smoke", overrides=over)
    gec = recipe_for("gec")
    run = driver.prepare(gec, space, tmp_path / "run")
    marker, out = tmp_path / "crashed", tmp_path / "ft"
    # 40 sentences in batches of 8: 5 steps an epoch; the worker dies after step 7, in the middle of epoch 2
    run.trainer_hooks = (CrashSwitch(exit_at_step=7, marker=str(marker)),)  # the trainer's crash switch
    result = driver.train(gec, run, run.cfg, out, name="restart", in_tune=False)
    assert marker.read_text().strip() == "exited at step 7" and result.error is None
    history = read_history(out)
    assert [h["epoch"] for h in history] == [1, 2]  # epoch 2 once: the replay replaced the lost part
    assert [h["step"] for h in history] == [5, 10]  # the replayed epoch ran all its 5 batches again
    assert history[1]["stream/negatives"] > 0 and history[1]["stream/staleness_max"] <= 1
    # published at steps 2, 4 (checkpoint: version 2), 6 (3, lost with the worker); the restore goes out as 4,
    # then steps 6, 8, 10 give 5, 6, 7 — one more than a run without the crash would count
    assert history[0]["stream/version"] == 2 and history[1]["stream/version"] == 7
    assert result.checkpoint is not None and (out / "best_model" / "config.json").exists()
