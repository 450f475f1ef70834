"""The optimiser and the learning-rate schedules: each update's rate against a formula written here, from the first
update on (a warm-up off by one moves the first updates of GEC, idiom and STS)."""

from __future__ import annotations

import pytest
import torch

from raycl.training import optim
from raycl.training.optim import adamw, adamw_no_decay, build_optimizer, build_scheduler, from_section, fusable

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


def test_an_optim_sections_adamw_takes_its_settings_and_adamws_betas_where_it_has_none() -> None:
    from raycl.config.sections import OptimSection
    from raycl.config.tasks.idiom import IdiomOptimSection

    model = torch.nn.Linear(3, 2)
    gec = OptimSection(lr=0.01, betas=[0.8, 0.95], eps=1e-6, weight_decay=0.1)
    (group,) = from_section(model, gec, lr=0.03).param_groups  # a phase's own rate (GEC's pretraining)
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (0.03, (0.8, 0.95), 1e-6, 0.1)
    idiom = IdiomOptimSection(lr=2e-5, weight_decay=0.01)  # no betas: AdamW's own, its eps 1e-6
    (group,) = from_section(model, idiom).param_groups
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (2e-5, (0.9, 0.999), 1e-6, 0.01)


class _Tensor:
    """What ``fusable`` reads of a parameter: its device kind and dtype kind (no GPU in CI)."""

    def __init__(self, cuda: bool, floating: bool = True) -> None:
        self.is_cuda, self._floating = cuda, floating

    def is_floating_point(self) -> bool:
        return self._floating


def test_fused_adamw_only_where_every_parameter_is_a_floating_cuda_tensor() -> None:
    gpu, cpu, ints = _Tensor(True), _Tensor(False), _Tensor(True, floating=False)
    assert fusable([gpu, gpu]) and fusable([{"params": [gpu]}, {"params": [gpu, gpu]}])  # groups read through
    assert not fusable([]) and not fusable([{"params": []}])  # nothing to fuse
    assert not fusable([gpu, cpu]) and not fusable([{"params": [gpu]}, {"params": [cpu]}])
    assert not fusable([gpu, ints])


def test_adamw_asks_the_fused_kernel_exactly_when_the_parameters_allow_it(monkeypatch) -> None:  # noqa: ANN001
    params = [torch.nn.Parameter(torch.ones(2))]
    assert adamw(params, lr=0.1).defaults["fused"] is None  # CPU tensors: PyTorch's own choice
    monkeypatch.setattr(optim, "fusable", lambda p: True)  # as on a GPU (PyTorch fuses on CPUs too)
    assert adamw(params, lr=0.1).defaults["fused"] is True


def test_adamw_defaults_step_as_pytorchs_adamw() -> None:
    """Without settings, one update equals torch's AdamW with its documented defaults, eps 1e-8 and no decay."""
    torch.manual_seed(0)
    a, b = (torch.nn.Parameter(torch.randn(4)) for _ in range(2))
    b.data.copy_(a.data)
    ours, ref = adamw([{"params": [a]}], lr=0.1), torch.optim.AdamW([b], lr=0.1, weight_decay=0.0)
    (group,) = ours.param_groups
    assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.9, 0.999), 1e-8, 0.0)
    for p, opt in ((a, ours), (b, ref)):
        p.grad = torch.full_like(p, 1e-9)  # a gradient near eps: eps's value shows in the update
        opt.step()
    torch.testing.assert_close(a.data, b.data, rtol=0, atol=0)


def test_adamw_no_decay_spares_biases_and_layernorm_as_sentence_transformers() -> None:
    """sentence-transformers' ``fit``: weight decay on every trainable weight but biases and LayerNorm's."""

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dense, self.LayerNorm, self.frozen = (
                torch.nn.Linear(3, 3),
                torch.nn.LayerNorm(3),
                torch.nn.Linear(3, 1),
            )
            self.frozen.requires_grad_(False)

    model = Block()
    opt = adamw_no_decay(model, lr=0.02, weight_decay=0.3)
    assert isinstance(opt, torch.optim.AdamW)
    decay, spared = opt.param_groups
    assert [id(p) for p in decay["params"]] == [id(model.dense.weight)]  # the frozen layer is not optimised
    want = [id(model.dense.bias), id(model.LayerNorm.weight), id(model.LayerNorm.bias)]
    assert sorted(id(p) for p in spared["params"]) == sorted(want)
    assert (decay["weight_decay"], spared["weight_decay"]) == (0.3, 0.0)
    assert all(g["lr"] == 0.02 and g["eps"] == 1e-6 for g in (decay, spared))
