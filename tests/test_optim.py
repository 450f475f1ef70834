"""The optimiser and the learning-rate schedules: each update's rate against a formula written here, from the first
update on (a warm-up off by one moves the first updates of GEC, idiom and STS)."""

from __future__ import annotations

import pytest
import torch

from raycl.training.optim import build_optimizer, build_scheduler

LR = 0.5


def _rates(kind: str, *, warmup: int, total: int, updates: int, **end_factor: float) -> list[float]:
    """The learning rate each of the first ``updates`` optimizer steps runs at, read as the loop reads it
    (``end_factor`` passed on only where given, so that the default is what runs otherwise)."""
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=LR)
    sched = build_scheduler(opt, kind, warmup=warmup, total=total, **end_factor)
    rates = []
    for _ in range(updates):
        rates.append(opt.param_groups[0]["lr"])  # the rate this update uses
        opt.step()
        sched.step()
    return rates


def _naive(kind: str, u: int, *, warmup: int, total: int, end_factor: float = 0.0) -> float:
    """Update u (1-based): linear warm-up u/warmup over the first ``warmup`` updates, then the full rate (fixed) or
    a straight line from the full rate at update warmup+1 to end_factor·rate at update total+1, flat after."""
    if u <= warmup:
        return LR * u / warmup
    if kind == "fixed" or total <= warmup:
        return LR
    done = min(u - 1 - warmup, total - warmup)  # updates since the warm-up ended
    return LR * (1.0 - (1.0 - end_factor) * done / (total - warmup))


@pytest.mark.parametrize("kind", ["fixed", "polynomial"])
@pytest.mark.parametrize(("warmup", "total"), [(0, 6), (1, 6), (3, 8), (2, 3), (4, 4), (5, 3)])
def test_every_update_runs_at_the_rate_of_the_formula(kind: str, warmup: int, total: int) -> None:
    got = _rates(kind, warmup=warmup, total=total, updates=total + 3)
    want = [_naive(kind, u, warmup=warmup, total=total) for u in range(1, total + 4)]
    assert got == pytest.approx(want, abs=1e-12)


def test_the_first_updates_of_a_warm_up() -> None:
    # written out: a warm-up of 4 starts at a quarter of the rate, and reaches it on the 4th update
    fixed = _rates("fixed", warmup=4, total=10, updates=6)
    assert fixed == pytest.approx([LR / 4, LR / 2, LR * 3 / 4, LR, LR, LR])
    poly = _rates("polynomial", warmup=2, total=6, end_factor=0.2, updates=8)
    # decay over updates 3..7: 1, 0.8, 0.6, 0.4, 0.2 of the rate, then it stays at end_factor
    assert poly == pytest.approx([LR / 2, LR, LR, 0.8 * LR, 0.6 * LR, 0.4 * LR, 0.2 * LR, 0.2 * LR])


def test_polynomial_ends_at_end_factor() -> None:
    assert _rates("polynomial", warmup=0, total=4, updates=6)[4:] == [0.0, 0.0]  # by default: decays to 0
    got = _rates("polynomial", warmup=0, total=5, end_factor=0.25, updates=8)
    want = [_naive("polynomial", u, warmup=0, total=5, end_factor=0.25) for u in range(1, 9)]
    assert got == pytest.approx(want, abs=1e-12)
    assert got[5:] == pytest.approx([0.25 * LR] * 3)


def test_adamw_takes_the_trainable_parameters_and_the_settings() -> None:
    model = torch.nn.Linear(3, 2)
    model.bias.requires_grad_(False)
    opt = build_optimizer(model, 0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    assert isinstance(opt, torch.optim.AdamW)
    (group,) = opt.param_groups
    assert [id(p) for p in group["params"]] == [id(model.weight)]  # the frozen bias is not optimised
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (0.01, (0.8, 0.95), 1e-6, 0.1)
    defaults = build_optimizer(model, 0.02).param_groups[0]
    assert (defaults["betas"], defaults["eps"], defaults["weight_decay"]) == ((0.9, 0.98), 1e-8, 0.0)
