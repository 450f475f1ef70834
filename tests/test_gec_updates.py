"""GEC's update counting, in the loop: the schedule's total and fp16's first updates.

The schedule: with a token budget the feed's pools are cut into more batches than the pools themselves; counting
pools as updates (as the schedule did when ``optim.total_updates`` is unset) ended the decay early and ran the last
updates at the end learning rate.

fp16: the backward is of a loss summed over the batch's target tokens, so PyTorch's first loss scale
(2¹⁶) overflowed the gradients and the scaler skipped the first ≈ log2(tokens) updates while the warm-up moved
on. GEC starts at fairseq's 2⁷: at most the very first update may be skipped (CPU autocast, the CPU GradScaler)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_equivalence import GEC, _cfg, _prepare, _train

from raycl.recipes.gec.worker import GecTask
from raycl.records import read_history


def test_fp16_gec_skips_no_update_after_the_first(ray_local, tmp_path: Path) -> None:
    run = _prepare("gec_pd", [*GEC, "data.builtin.n_train=64"], tmp_path)
    cfg = _cfg(run, ["pretrain.epochs=3", "pretrain.batch_size=8", "optim.precision=fp16"])
    state = _train(run, GecTask(cfg, "pretrain"), tmp_path / "fp16", workers=0)[0]
    history = read_history(tmp_path / "fp16")
    skipped = [h["fp16/skipped"] for h in history]
    assert len(skipped) == 3 and state["progress"]["step"] == 24
    assert sum(skipped) <= 1, f"fp16 updates skipped per epoch: {skipped}"
    assert state["scaler"]["scale"] >= 2.0**6  # no run of overflows drove the scale down


def test_a_token_budget_schedule_decays_over_the_updates_the_run_makes(ray_local, tmp_path: Path) -> None:
    """The NLL baseline (fine-tuning without negatives) with GEC-BART's polynomial schedule and a token budget: the
    learning rate after epoch 1 is where linear decay over the run's real number of updates puts it, and 0 at the
    end."""
    run = _prepare("gec_pd", [*GEC, "data.builtin.n_finetune=40"], tmp_path)
    cfg = _cfg(
        run,
        [
            "optim.epochs=2",
            "optim.batch_size=20",
            "optim.max_tokens=120",
            "optim.scheduler=polynomial",
            "optim.warmup_updates=0",
            "loss.trade_off=0",
            "optim.lr=0.001",
        ],
    )
    state = _train(run, GecTask(cfg, "finetune"), tmp_path / "poly", workers=0)[0]
    epoch1, epoch2 = read_history(tmp_path / "poly")[:2]
    total = state["progress"]["step"]
    assert epoch2["step"] == total > 2 * 2  # more updates than the 2 pools an epoch
    assert epoch1["lr"] == pytest.approx(1e-3 * (1 - epoch1["step"] / total))
    assert epoch2["lr"] == 0.0 and state["optimizers"][0]["param_groups"][0]["lr"] == 0.0
