"""EMA (ZhichunRoad): shadow updates against a plain-Python recurrence, swaps, checkpoints, degenerate decays."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from raycl.errors import UserError
from raycl.memory.ema import EMA


def tiny() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    model[1].bias.requires_grad_(False)  # frozen: the shadow must leave it out
    return model


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    torch.manual_seed(seed)
    model(torch.randn(4, 3)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_shadow_follows_the_naive_recurrence() -> None:
    model, decay = tiny(), 0.9
    ema = EMA(model, decay)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    expected = {n: p.detach().flatten().tolist() for n, p in model.named_parameters() if p.requires_grad}
    for step in range(4):
        train_step(model, optimizer, step)
        ema.update()
        for n, p in model.named_parameters():
            if p.requires_grad:
                live = p.detach().flatten().tolist()
                expected[n] = [(1 - decay) * t + decay * s for t, s in zip(live, expected[n], strict=True)]
    assert set(ema.shadow) == {"0.weight", "0.bias", "1.weight"}
    for n, values in expected.items():
        assert ema.shadow[n].flatten().tolist() == pytest.approx(values, rel=1e-6)


def test_decay_zero_equals_the_model_and_decay_one_keeps_the_start() -> None:
    model = tiny()
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    follow, frozen = EMA(model, 0.0), EMA(model, 1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    train_step(model, optimizer, 1)
    follow.update()
    frozen.update()
    for n, p in model.named_parameters():
        if p.requires_grad:
            assert torch.equal(follow.shadow[n], p.detach()), n
            assert torch.equal(frozen.shadow[n], start[n]), n
            assert not torch.equal(p.detach(), start[n]), n  # the step did move the weights


def test_applied_swaps_in_the_shadow_and_restores_bit_exactly(tmp_path: Path) -> None:
    model = tiny()
    ema = EMA(model, 0.5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    train_step(model, optimizer, 2)
    ema.update()
    live = {n: p.detach().clone() for n, p in model.named_parameters()}
    with ema.applied() as inside:
        assert inside is model
        torch.save(model.state_dict(), tmp_path / "best.pt")  # what the recipe saves as the best checkpoint
    saved = torch.load(tmp_path / "best.pt")
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), live[n]), n
        want = ema.shadow[n] if p.requires_grad else live[n]
        assert torch.equal(saved[n], want), n


def test_applied_restores_after_an_error_and_misuse_is_refused() -> None:
    model = tiny()
    ema = EMA(model, 0.5)
    with torch.no_grad():
        model[0].weight.add_(1.0)
    live = model[0].weight.detach().clone()
    with pytest.raises(KeyError), ema.applied():
        raise KeyError("eval failed")
    assert torch.equal(model[0].weight.detach(), live)
    with pytest.raises(RuntimeError, match="without swap_in"):
        ema.swap_out()
    ema.swap_in()
    with pytest.raises(RuntimeError, match="swapped in"):
        ema.update()
    ema.swap_out()


def test_state_dict_round_trip_and_mismatch() -> None:
    model = tiny()
    ema = EMA(model, 0.7)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    train_step(model, optimizer, 3)
    ema.update()
    resumed = EMA(model, 0.1)
    resumed.load_state_dict(ema.state_dict())
    assert resumed.decay == 0.7
    for n, t in ema.shadow.items():
        assert torch.equal(resumed.shadow[n], t), n
    state = ema.state_dict()
    del state["shadow"]["0.bias"]
    with pytest.raises(UserError, match=r"^ema state: .*missing \['0.bias'\]"):
        resumed.load_state_dict(state)


def test_a_loaded_shadow_takes_the_models_dtype_and_device_and_the_default_decay() -> None:
    assert EMA(tiny()).decay == 0.999  # the paper's η
    state = EMA(tiny(), 0.3).state_dict()  # fp32 CPU copies
    half = tiny().half()
    ema = EMA(half, 0.9)
    ema.load_state_dict(state)
    assert {t.dtype for t in ema.shadow.values()} == {torch.float16}
    with torch.device("meta"):
        on_meta = tiny()
    ema = EMA(on_meta, 0.9)
    ema.load_state_dict(state)
    assert {t.device.type for t in ema.shadow.values()} == {"meta"}


@pytest.mark.parametrize("decay", [-0.1, 1.5])
def test_decay_out_of_range_is_a_user_error(decay: float) -> None:
    with pytest.raises(UserError, match=r"^ema\.decay: expected a value in \[0, 1\]"):
        EMA(tiny(), decay)
