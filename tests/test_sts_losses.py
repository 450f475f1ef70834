"""Subtask B losses (ZhichunRoad) against naive per-example loops: MSE-cosine, InfoNCE + queue, the joint sum."""

from __future__ import annotations

import math

import pytest
import torch

from raycl.losses.infonce_queue import LAMBDA, InfoNCEQueueLoss, joint_loss
from raycl.losses.mse_cosine import MSECosineLoss


def _cos(x: list[float], y: list[float]) -> float:
    dot = sum(a * b for a, b in zip(x, y, strict=True))
    return dot / (math.sqrt(sum(a * a for a in x)) * math.sqrt(sum(b * b for b in y)))


def _naive_mse_cosine(u: torch.Tensor, v: torch.Tensor, labels: torch.Tensor) -> list[float]:
    return [(_cos(a, b) - y) ** 2 for a, b, y in zip(u.tolist(), v.tolist(), labels.tolist(), strict=True)]


def _naive_infonce(h: torch.Tensor, h_pos: torch.Tensor, queue: torch.Tensor, tau: float) -> list[float]:
    """ℓ_i = −log(e^{s_ii} / (Σ_j e^{s_ij} + Σ_q e^{s_iq})), Cui et al. (2022) Eq. 4, one anchor at a time."""
    losses = []
    for i, anchor in enumerate(h.tolist()):
        positive = math.exp(_cos(anchor, h_pos[i].tolist()) / tau)
        in_batch = sum(math.exp(_cos(anchor, p) / tau) for p in h_pos.tolist())
        queued = sum(math.exp(_cos(anchor, k) / tau) for k in queue.tolist())
        losses.append(-math.log(positive / (in_batch + queued)))
    return losses


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_mse_cosine_matches_naive_loop() -> None:
    u, v = _rand(5, 7, seed=0), _rand(5, 7, seed=1)
    v[2] = 3.0 * u[2]  # cos = 1 exactly: ℓ = (1 − y)²
    labels = torch.tensor([0.0, 0.2, 0.4, 0.8, 1.0], dtype=torch.float64)  # STS scores / 5
    out = MSECosineLoss()(u, v, labels)
    expected = _naive_mse_cosine(u, v, labels)
    torch.testing.assert_close(out.per_example, torch.tensor(expected, dtype=torch.float64))
    assert out.loss.item() == pytest.approx(sum(expected) / len(expected), rel=1e-12)
    assert out.per_example[2].item() == pytest.approx((1 - 0.4) ** 2, rel=1e-12)
    torch.testing.assert_close(out.cos, torch.cosine_similarity(u, v, dim=1))
    # labels of another dtype are compared in the embeddings' (a float64 label does not promote an fp32 loss)
    out32 = MSECosineLoss()(u.float(), v.float(), labels)
    assert out32.per_example.dtype == out32.loss.dtype == torch.float32
    torch.testing.assert_close(out32.per_example, out.per_example.float())


def test_mse_cosine_gradient_flows_to_both_sides() -> None:
    u, v = _rand(3, 4, seed=2).requires_grad_(), _rand(3, 4, seed=3).requires_grad_()
    MSECosineLoss()(u, v, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).loss.backward()
    assert u.grad is not None and v.grad is not None
    assert u.grad.abs().sum() > 0 and v.grad.abs().sum() > 0


@pytest.mark.parametrize("tau", [0.05, 0.5])
def test_infonce_with_queue_matches_naive_loop(tau: float) -> None:
    h, h_pos, queue = _rand(4, 6, seed=4), _rand(4, 6, seed=5), _rand(7, 6, seed=6)
    queue[0] = 10.0 * h[1]  # a queued key that is very close to an anchor: large denominator term
    out = InfoNCEQueueLoss(temperature=tau)(h, h_pos, queue)
    expected = _naive_infonce(h, h_pos, queue, tau)
    torch.testing.assert_close(out.per_example, torch.tensor(expected, dtype=torch.float64))
    assert out.loss.item() == pytest.approx(sum(expected) / len(expected), rel=1e-12)
    assert out.logits.shape == (4, 4 + 7)


def test_empty_queue_is_in_batch_infonce() -> None:
    h, h_pos = _rand(5, 3, seed=7), _rand(5, 3, seed=8)
    expected = torch.tensor(_naive_infonce(h, h_pos, torch.empty(0, 3), 0.05), dtype=torch.float64)
    for queue in (None, torch.empty(0, 3, dtype=torch.float64)):
        out = InfoNCEQueueLoss()(h, h_pos, queue)
        torch.testing.assert_close(out.per_example, expected)
        assert out.logits.shape == (5, 5)


def test_infonce_of_half_precision_inputs_is_computed_in_fp32_on_their_device() -> None:
    h, h_pos, queue = _rand(4, 6, seed=12), _rand(4, 6, seed=13), _rand(1, 6, seed=14)  # a queue of one key
    want = InfoNCEQueueLoss()(h.bfloat16().float(), h_pos.bfloat16().float(), queue.bfloat16().float())
    got = InfoNCEQueueLoss()(h.bfloat16(), h_pos.bfloat16(), queue.bfloat16())
    assert got.logits.dtype == got.per_example.dtype == torch.float32 and got.logits.shape == (4, 5)
    torch.testing.assert_close(got.per_example, want.per_example)
    on_meta = InfoNCEQueueLoss()(h.to("meta"), h_pos.to("meta"), queue.to("meta"))  # the labels follow h
    assert on_meta.loss.device.type == "meta"


def test_queue_only_adds_negatives() -> None:
    """Keys enlarge the denominator only: every ℓ_i grows, and the queue itself never gets a gradient."""
    h, h_pos = _rand(3, 4, seed=9).requires_grad_(), _rand(3, 4, seed=10)
    queue = _rand(6, 4, seed=11).requires_grad_()
    with_queue = InfoNCEQueueLoss()(h, h_pos, queue)
    without = InfoNCEQueueLoss()(h, h_pos)
    assert bool((with_queue.per_example > without.per_example).all())
    with_queue.loss.backward()
    assert h.grad is not None and queue.grad is None


def test_joint_loss_is_mse_plus_lambda_con() -> None:
    u, v, h, h_pos = (_rand(3, 5, seed=s) for s in (12, 13, 14, 15))
    labels = torch.tensor([0.3, 0.6, 0.9], dtype=torch.float64)
    l_mse = MSECosineLoss()(u, v, labels).loss
    queue = _rand(2, 5, seed=16)
    l_con = InfoNCEQueueLoss()(h, h_pos, queue).loss
    naive = sum(_naive_mse_cosine(u, v, labels)) / 3 + 0.15 * sum(_naive_infonce(h, h_pos, queue, 0.05)) / 3
    assert LAMBDA == 0.15
    assert joint_loss(l_mse, l_con).item() == pytest.approx(naive, rel=1e-12)
    assert joint_loss(l_mse, l_con, lam=0.0).item() == pytest.approx(l_mse.item(), rel=1e-12)


def test_bad_temperature_is_refused() -> None:
    with pytest.raises(ValueError, match="temperature"):
        InfoNCEQueueLoss(temperature=0.0)


def test_the_losses_and_their_gradients_never_wait_for_the_device() -> None:
    """MSE-cosine and InfoNCE with a queue, forward and backward, under bf16 autocast as in training: 0 syncs (the
    CPU stands in for the device)."""
    from raycl.training.counting import count_ops

    u, v = (_rand(6, 8, seed=s).float().requires_grad_(True) for s in (0, 1))
    queue = _rand(5, 8, seed=2).float()
    with count_ops(cpu_as_device=True) as c, torch.autocast("cpu", dtype=torch.bfloat16):
        l_mse = MSECosineLoss()(u, v, torch.rand(6)).loss
        l_con = InfoNCEQueueLoss()(u, v, queue).loss
        joint_loss(l_mse, l_con).backward()
    assert c.syncs == 0, c.sync_sites


def _naive_hard_negative_infonce(
    h: torch.Tensor, h_pos: torch.Tensor, queue: torch.Tensor, negatives: list[list[list[float]]], tau: float
) -> list[float]:
    """ℓ_i with anchor i's own mined negatives added to its denominator only (SimCSE's supervised form), one anchor
    and one negative at a time; ``negatives[i]`` holds anchor i's real negatives (any number, none allowed)."""
    losses = []
    for i, anchor in enumerate(h.tolist()):
        positive = math.exp(_cos(anchor, h_pos[i].tolist()) / tau)
        denominator = sum(math.exp(_cos(anchor, p) / tau) for p in h_pos.tolist())
        denominator += sum(math.exp(_cos(anchor, k) / tau) for k in queue.tolist())
        denominator += sum(math.exp(_cos(anchor, n) / tau) for n in negatives[i])
        losses.append(-math.log(positive / denominator))
    return losses


@pytest.mark.parametrize("queue_size", [0, 5])
def test_infonce_with_per_anchor_hard_negatives_matches_naive_loop(queue_size: int) -> None:
    h, h_pos, queue = _rand(4, 6, seed=20), _rand(4, 6, seed=21), _rand(queue_size, 6, seed=22)
    negatives = _rand(4, 3, 6, seed=23)  # (B, K, H)
    negatives[1, 0] = 5.0 * h[1]  # a mined negative as close to its anchor as can be: a large term in row 1 only
    mask = torch.tensor([[True, True, True], [True, False, False], [False, False, False], [True, True, False]])
    out = InfoNCEQueueLoss(temperature=0.1)(h, h_pos, queue, negatives, mask)
    real = [[negatives[i, k].tolist() for k in range(3) if mask[i, k]] for i in range(4)]
    expected = _naive_hard_negative_infonce(h, h_pos, queue, real, 0.1)
    torch.testing.assert_close(out.per_example, torch.tensor(expected, dtype=torch.float64))
    assert out.logits.shape == (4, 4 + queue_size + 3)
    # row 1's close negative is in row 1's denominator alone: the other rows equal the loss without it
    other = negatives.clone()
    other[1, 0] = _rand(6, seed=24)
    moved = InfoNCEQueueLoss(temperature=0.1)(h, h_pos, queue, other, mask).per_example
    torch.testing.assert_close(moved[[0, 2, 3]], out.per_example[[0, 2, 3]])
    assert moved[1] < out.per_example[1]


def test_no_mined_negatives_is_the_in_batch_and_queue_infonce_exactly() -> None:
    h, h_pos, queue = _rand(5, 4, seed=25), _rand(5, 4, seed=26), _rand(3, 4, seed=27)
    for q in (None, queue):
        plain = InfoNCEQueueLoss()(h, h_pos, q)
        for negatives, mask in (
            (None, None),
            (torch.empty(5, 0, 4, dtype=torch.float64), None),
            (_rand(5, 2, 4, seed=28), torch.zeros(5, 2, dtype=torch.bool)),
        ):
            out = InfoNCEQueueLoss()(h, h_pos, q, negatives, mask)
            assert torch.equal(out.per_example, plain.per_example) and torch.equal(out.loss, plain.loss)


def test_mined_negatives_carry_gradient_and_masked_ones_none() -> None:
    h, h_pos = _rand(3, 4, seed=29).requires_grad_(), _rand(3, 4, seed=30)
    negatives = _rand(3, 2, 4, seed=31).requires_grad_()
    mask = torch.tensor([[True, False], [True, True], [False, False]])
    InfoNCEQueueLoss()(h, h_pos, None, negatives, mask).loss.backward()
    assert negatives.grad is not None
    assert bool((negatives.grad[~mask] == 0).all()) and bool((negatives.grad[mask].abs().sum(-1) > 0).all())


def test_mined_negatives_without_a_mask_are_all_in_the_denominators() -> None:
    h, h_pos, queue = _rand(3, 4, seed=32), _rand(3, 4, seed=33), _rand(2, 4, seed=34)
    negatives = _rand(3, 2, 4, seed=35)
    out = InfoNCEQueueLoss(temperature=0.1)(h, h_pos, queue, negatives)
    expected = _naive_hard_negative_infonce(h, h_pos, queue, negatives.tolist(), 0.1)
    torch.testing.assert_close(out.per_example, torch.tensor(expected, dtype=torch.float64))


def test_one_mined_negative_in_half_precision_is_in_the_fp32_denominators() -> None:
    """K = 1, bf16 embeddings (autocast's): the loss is computed in fp32 from the bf16 values."""
    h, h_pos = _rand(3, 4, seed=36).bfloat16(), _rand(3, 4, seed=37).bfloat16()
    negatives = _rand(3, 1, 4, seed=38).bfloat16()
    out = InfoNCEQueueLoss(temperature=0.1)(h, h_pos, None, negatives)
    assert out.per_example.dtype == torch.float32 and out.logits.shape == (3, 3 + 1)
    wide = [t.double() for t in (h, h_pos, negatives)]
    expected = _naive_hard_negative_infonce(wide[0], wide[1], torch.empty(0, 4), wide[2].tolist(), 0.1)
    torch.testing.assert_close(
        out.per_example.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-5
    )
