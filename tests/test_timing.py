"""The loop's one set of timing and learning-rate metrics (``raycl.training.timing``), against naive sums: every
recipe's reports carry them with the same meaning."""

from __future__ import annotations

import time

import pytest
import torch

from raycl.training.timing import Window, interval_metrics


def test_interval_metrics_are_per_step_times_the_interval_wall_its_wait_and_the_rate() -> None:
    w = Window()
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.25)
    seconds = [0.5, 0.25, 0.75, 1.0]  # four micro-batches: two steps of alternating objectives (two updates each)
    for s in seconds:
        w.add({"loss": torch.tensor(1.0)}, s)
    w.updates, w.steps, w.wait_s = 4, 2, 0.125
    time.sleep(0.01)
    opt.param_groups[0]["lr"] = 0.125  # what a schedule set at the interval's last update
    m = interval_metrics(w, opt)
    assert m["timing/step"] == pytest.approx(sum(seconds) / 2)  # per step, not per update or micro-batch
    assert m["timing/interval"] >= 0.01 and m["timing/data_wait"] == 0.125
    assert m["timing/data_wait_fraction"] == pytest.approx(0.125 / m["timing/interval"], rel=0.05)
    assert m["lr"] == 0.125
    assert "lr" not in interval_metrics(Window(), None) and interval_metrics(Window(), None)["timing/step"] == 0.0
