"""Updates over every parameter in a few multi-tensor ops: gradient scaling, EMA, the coherence momentum update and
MoCo's key encoder. Each equals its per-parameter formula, written here in a plain loop, and runs in a number of
aten ops that does not grow with the number of parameters (a per-parameter Python loop would: 3 ops a tensor)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from raycl.collectives import scale_gradients
from raycl.memory.ema import EMA
from raycl.memory.moco import MoCoKeyEncoder
from raycl.memory.momentum import momentum_update
from raycl.memory.multi_tensor import grouped, momentum_, scale_
from raycl.training.counting import count_ops

LAYERS = 12  # 2 parameters a layer: 24 tensors, far more than the op bounds below


def net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(5, 5) for _ in range(LAYERS)]
    layers.append(nn.BatchNorm1d(5))  # buffers (running statistics), and a 0-dim one (num_batches_tracked)
    return nn.Sequential(*layers)


def with_mixed_dtypes(model: nn.Module) -> nn.Module:
    """Half of the layers in float64: two (device, dtype) groups."""
    for layer in list(model)[::2]:
        layer.double()
    return model


def snapshot(model: nn.Module) -> dict[str, list[float]]:
    return {n: p.detach().flatten().tolist() for n, p in model.named_parameters()}


def test_grouped_splits_by_dtype_and_keeps_order() -> None:
    a, b, c = torch.zeros(2), torch.zeros(3, dtype=torch.float64), torch.ones(4)
    groups = grouped([a, b, c], [c, a, b])
    assert [[t.shape for t in g[0]] for g in groups] == [[(2,), (4,)], [(3,)]]
    assert groups[0][1][0] is c and groups[0][1][1] is b and groups[1][1][0] is a


def test_scale_takes_sparse_tensors_one_by_one() -> None:
    dense, sparse = torch.tensor([1.0, -2.0]), torch.tensor([[0.0, 3.0], [4.0, 0.0]]).to_sparse()
    scale_([dense, sparse], 0.5)
    assert dense.tolist() == [0.5, -1.0] and sparse.to_dense().tolist() == [[0.0, 1.5], [2.0, 0.0]]


def test_scale_gradients_equals_a_multiplication_per_gradient_in_two_ops() -> None:
    model = with_mixed_dtypes(net())
    params = list(model.parameters())
    for i, p in enumerate(params):
        p.grad = None if i == 3 else torch.randn_like(p)  # a parameter without a gradient keeps none
    want = [None if p.grad is None else [0.37 * g for g in p.grad.flatten().tolist()] for p in params]
    with count_ops() as c:
        scale_gradients(params, 0.37)
    assert c.ops <= 2, c.by_op  # one _foreach_mul_ per (device, dtype)
    for p, w in zip(params, want, strict=True):
        assert (p.grad is None) == (w is None)
        if w is not None:
            assert p.grad.flatten().tolist() == pytest.approx(w, rel=1e-6)


def test_ema_update_equals_the_recurrence_in_a_few_ops_and_keeps_dtypes() -> None:
    model, decay = with_mixed_dtypes(net()), 0.8
    ema = EMA(model, decay)
    shadow = snapshot(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    live = snapshot(model)
    with count_ops() as c:
        ema.update()
    assert c.ops <= 4, c.by_op  # _foreach_mul_ and _foreach_add_ per dtype group
    for n, s in ema.shadow.items():
        want = [(1 - decay) * t + decay * s0 for t, s0 in zip(live[n], shadow[n], strict=True)]
        assert s.flatten().tolist() == pytest.approx(want, rel=1e-6, abs=1e-7), n
        assert s.dtype == dict(model.named_parameters())[n].dtype


def test_coherence_momentum_update_equals_the_formula_and_copies_buffers_in_a_few_ops() -> None:
    source, m = with_mixed_dtypes(net(1)), 0.75
    target = copy.deepcopy(source)
    with torch.no_grad():
        for p in target.parameters():
            p.add_(1.0)
    with torch.no_grad():  # the source's running statistics moved on
        source[-1].running_mean.add_(0.5)
        source[-1].num_batches_tracked.add_(3)
    before, theta = snapshot(target), snapshot(source)
    with count_ops() as c:
        momentum_update(target, source, m=m)
    assert c.ops <= 6, c.by_op  # mul and add per dtype group, a copy per buffer dtype (float, long)
    for n, p in target.named_parameters():
        want = [m * k + (1 - m) * x for k, x in zip(before[n], theta[n], strict=True)]
        assert p.detach().flatten().tolist() == pytest.approx(want, rel=1e-6, abs=1e-7), n
    for (n, b), (_, src) in zip(target.named_buffers(), source.named_buffers(), strict=True):
        assert torch.equal(b, src), n


def test_moco_momentum_update_equals_the_formula_in_a_few_ops() -> None:
    query, m = net(2), 0.9
    moco = MoCoKeyEncoder(net(3), dim=5, queue_size=4, m=m)
    before, theta = snapshot(moco.encoder_k), snapshot(query)
    with count_ops() as c:
        moco.momentum_update(query)
    assert c.ops <= 2, c.by_op
    for n, p in moco.encoder_k.named_parameters():
        want = [m * k + (1 - m) * x for k, x in zip(before[n], theta[n], strict=True)]
        assert p.flatten().tolist() == pytest.approx(want, rel=1e-6, abs=1e-7), n


def test_grouped_refuses_lists_of_unequal_length() -> None:
    a, b = torch.zeros(2), torch.zeros(3)
    for lists in (([a, b], [a]), ([a], [a, b])):
        with pytest.raises(ValueError, match="zip"):
            grouped(*lists)


def test_momentum_refuses_more_sources_than_targets() -> None:
    target = torch.zeros(2)
    with pytest.raises(ValueError, match="zip"):
        momentum_([target], [torch.ones(2), torch.ones(2)], 0.5)
    assert target.tolist() == [0.0, 0.0]  # refused before anything moved


def test_momentum_casts_a_source_to_its_targets_dtype_before_the_update() -> None:
    # fp64 sources rounded to fp32 first, then the fp32 update: not the update done in fp64 and rounded once
    g = torch.Generator().manual_seed(0)
    target = torch.randn(1000, generator=g)  # fp32
    source = torch.randn(1000, generator=g, dtype=torch.float64)
    want = target.clone().mul_(0.9).add_(source.to(torch.float32), alpha=0.1)
    momentum_([target], [source], 0.9)
    assert target.dtype == torch.float32 and torch.equal(target, want)


def test_momentum_moves_a_source_to_its_targets_device(monkeypatch: pytest.MonkeyPatch) -> None:
    # the meta device stands in for an accelerator (it accepts a CPU operand where a GPU would refuse it, so the
    # sources handed to the fused add are recorded): a CPU source must be moved to its target's device first
    seen: list[str] = []
    real = torch._foreach_add_

    def add_(targets: list[torch.Tensor], sources: list[torch.Tensor], **kw: float) -> None:
        seen.extend(s.device.type for s in sources)
        real(targets, sources, **kw)

    monkeypatch.setattr(torch, "_foreach_add_", add_)
    target = torch.zeros(4, device="meta")
    momentum_([target], [torch.ones(4)], 0.5)
    assert seen == ["meta"] and target.device.type == "meta"
