"""Coherence losses (paper §3) against plain-Python loops; the negative queue rule and the momentum update."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from raycl.losses.contrastive_margin import contrastive_margin_loss
from raycl.losses.momentum_contrastive import momentum_contrastive_loss, total_loss
from raycl.losses.pairwise_margin import pairwise_margin_loss
from raycl.memory.momentum import momentum_update
from raycl.memory.negative_queue import NegativeQueue
from raycl.training.counting import count_ops

TAU = 0.1


def _cos(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def _naive_contrastive(f_pos: float, f_negs: list[float], tau: float) -> float:
    """−log(e^{f⁺} / (e^{f⁺} + Σ_j e^{f⁻_j − τ})), written out term by term."""
    denom = math.exp(f_pos)
    for f in f_negs:
        denom += math.exp(f - tau)
    return -math.log(math.exp(f_pos) / denom)


def _naive_momentum(q: list[float], k_pos: list[float], queue: list[list[float]], tau: float) -> float:
    num = math.exp(_cos(q, k_pos))
    denom = num
    for k in queue:
        denom += math.exp(_cos(q, k) - tau)
    return -math.log(num / denom)


def test_pairwise_default_margin_and_shapes() -> None:
    f_pos, f_neg = torch.tensor([0.0, 1.0]), torch.tensor([0.0, 0.5])
    per, _ = pairwise_margin_loss(f_pos, f_neg)
    assert per.tolist() == pytest.approx([0.1, 0.0])  # τ = 0.1, the paper's
    for a, b in ((torch.zeros(2, 1), torch.zeros(2, 1)), (torch.zeros(2), torch.zeros(3))):
        with pytest.raises(ValueError) as err:
            pairwise_margin_loss(a, b)
        assert str(err.value).endswith(f"must both be (B,), got {tuple(a.shape)} and {tuple(b.shape)}")


def test_pairwise_matches_loop() -> None:
    f_pos = [0.15, -1.2, 2.0, 0.05]
    f_neg = [0.1, -1.0, -0.5, 0.0]  # inside the margin, wrong order, zero, inside the margin
    per, loss = pairwise_margin_loss(
        torch.tensor(f_pos, dtype=torch.float64), torch.tensor(f_neg, dtype=torch.float64), margin=TAU
    )
    expected = [max(0.0, TAU - p + n) for p, n in zip(f_pos, f_neg, strict=True)]
    assert per.tolist() == pytest.approx(expected, abs=1e-12)
    assert expected[2] == 0.0 and min(expected[0], expected[1], expected[3]) > 0.0  # both sides of the hinge
    assert float(loss) == pytest.approx(sum(expected) / len(expected))


def test_contrastive_matches_loop_and_gradient_direction() -> None:
    torch.manual_seed(0)
    f_pos = torch.randn(3, dtype=torch.float64, requires_grad=True)
    f_neg = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    per, loss = contrastive_margin_loss(f_pos, f_neg, margin=TAU)
    expected = [_naive_contrastive(float(f_pos.detach()[b]), f_neg.detach()[b].tolist(), TAU) for b in range(3)]
    assert per.tolist() == pytest.approx(expected, abs=1e-12)
    assert loss.item() == pytest.approx(sum(expected) / 3)
    loss.backward()
    assert (f_pos.grad < 0).all() and (f_neg.grad > 0).all()  # raise the positive, push the negatives down


def test_contrastive_margin_is_subtracted_from_negatives() -> None:
    """The code's sign: a larger τ makes the loss *smaller* (negatives handicapped), unlike the paper's Eq. 2."""
    f_pos, f_neg = torch.tensor([0.2]), torch.tensor([[0.4, 0.1]])
    low = contrastive_margin_loss(f_pos, f_neg, margin=0.0)[1]
    high = contrastive_margin_loss(f_pos, f_neg, margin=1.0)[1]
    assert float(high) < float(low)


def test_contrastive_one_negative_no_margin_is_logistic() -> None:
    f_pos, f_neg = torch.tensor([0.7, -0.4, 3.0]), torch.tensor([[0.2], [0.9], [-2.0]])
    per, _ = contrastive_margin_loss(f_pos, f_neg, margin=0.0)
    logistic = [math.log1p(math.exp(float(n) - float(p))) for p, n in zip(f_pos, f_neg[:, 0], strict=True)]
    assert per.tolist() == pytest.approx(logistic, abs=1e-6)


def test_momentum_loss_matches_loop() -> None:
    torch.manual_seed(1)
    q = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    k_pos, queue = torch.randn(2, 4, dtype=torch.float64), torch.randn(7, 4, dtype=torch.float64)
    per, loss = momentum_contrastive_loss(q, k_pos, queue, margin=TAU)
    expected = [_naive_momentum(q.detach()[b].tolist(), k_pos[b].tolist(), queue.tolist(), TAU) for b in range(2)]
    assert per.tolist() == pytest.approx(expected, abs=1e-12)
    assert loss.item() == pytest.approx(sum(expected) / 2)
    loss.backward()
    assert q.grad is not None and q.grad.abs().sum() > 0


def test_momentum_loss_is_scale_free_cosine() -> None:
    """Cosine, no temperature: rescaling any rep leaves the loss unchanged (a dot product would not)."""
    torch.manual_seed(2)
    q, k_pos, queue = torch.randn(1, 6), torch.randn(1, 6), torch.randn(5, 6)
    base = momentum_contrastive_loss(q, k_pos, queue)[1]
    scaled = momentum_contrastive_loss(3.0 * q, 0.5 * k_pos, 7.0 * queue)[1]
    assert float(scaled) == pytest.approx(float(base), abs=1e-5)


def test_momentum_loss_empty_queue_is_zero() -> None:
    q = torch.randn(3, 4, requires_grad=True)
    per, loss = momentum_contrastive_loss(q, torch.randn(3, 4), torch.zeros(0, 4))
    assert per.tolist() == [0.0, 0.0, 0.0] and loss.item() == 0.0


def test_total_loss_weighting() -> None:
    l_c, l_m = torch.tensor(1.7), torch.tensor(0.4)
    assert float(total_loss(l_c, l_m, lam=1.0)) == pytest.approx(1.7)
    assert float(total_loss(l_c, l_m)) == pytest.approx(0.85 * 1.7 + 0.15 * 0.4)
    with pytest.raises(ValueError):
        total_loss(l_c, l_m, lam=1.5)


def _item(step: int, num_negs: int = 5) -> torch.Tensor:
    """num_negs distinct 2-d reps tagged with the step: [step, j]."""
    return torch.tensor([[float(step), float(j)] for j in range(num_negs)])


def _naive_queue(steps: int, size: int, num_negs: int) -> list[list[float]]:
    """The paper's list rule: if len ≥ size, drop the oldest num_negs; then append the item's negatives."""
    queue: list[list[float]] = []
    for step in range(steps):
        if len(queue) >= size:
            queue = queue[num_negs:]
        queue.extend(_item(step, num_negs).tolist())
    return queue


def test_queue_rule_size_10_four_steps() -> None:
    queue = NegativeQueue(2, size=10, num_negs=5)
    for step in range(4):
        queue.enqueue(_item(step))
    expected = _item(2).tolist() + _item(3).tolist()  # steps 0, 1 fill it; 2 evicts step 0; 3 evicts step 1
    assert queue.entries().tolist() == expected == _naive_queue(4, 10, 5)
    assert len(queue) == 10


@pytest.mark.parametrize(("size", "num_negs", "steps"), [(10, 3, 9), (7, 2, 6), (4, 5, 3), (1000, 5, 205)])
def test_queue_matches_list_rule(size: int, num_negs: int, steps: int) -> None:
    queue = NegativeQueue(2, size=size, num_negs=num_negs)
    for step in range(steps):
        queue.enqueue(_item(step, num_negs))
    assert queue.entries().tolist() == _naive_queue(steps, size, num_negs)


def test_queue_batch_is_item_by_item_and_checkpoints() -> None:
    batched, single = NegativeQueue(2, size=10, num_negs=5), NegativeQueue(2, size=10, num_negs=5)
    for step in range(0, 6, 2):
        batched.enqueue(torch.cat([_item(step), _item(step + 1)]))  # B = 2 items per call
        single.enqueue(_item(step))
        single.enqueue(_item(step + 1))
    assert batched.entries().tolist() == single.entries().tolist()
    restored = NegativeQueue(2, size=10, num_negs=5)
    restored.load_state_dict(batched.state_dict())
    assert len(restored) == len(batched) and torch.equal(restored.entries(), batched.entries())


def test_queue_steps_never_read_the_device_and_a_restored_queue_goes_on_alike() -> None:
    """The rule needs only how many reps came: enqueue, len and entries wait for nothing (the CPU stands in for the
    device). A queue restored mid-run knows its fill without being told and continues as the uninterrupted one."""
    whole = NegativeQueue(2, size=10, num_negs=5)
    with count_ops(cpu_as_device=True) as c:
        for step in range(3):
            whole.enqueue(_item(step))  # the third evicts
            whole.entries()
            len(whole)
    assert c.syncs == 0, c.sync_sites
    restored = NegativeQueue(2, size=10, num_negs=5)
    restored.load_state_dict(whole.state_dict())
    for q in (whole, restored):
        q.enqueue(_item(3))
    assert len(restored) == 10
    assert restored.entries().tolist() == whole.entries().tolist() == _naive_queue(4, 10, 5)
    assert int(restored.fill) == 10  # the checkpointed count follows


def test_queue_size_zero_stays_empty() -> None:
    queue = NegativeQueue(3, size=0, num_negs=5)
    queue.enqueue(torch.randn(5, 3))
    assert queue.entries().shape == (0, 3) and len(queue) == 0


def test_queue_slots_the_checkpoint_holds_and_its_bounds() -> None:
    """size + num_negs − 1 slots (the most ever held), none for size 0; the paper's 1000 and 5 by default."""
    assert NegativeQueue(3, size=10, num_negs=5).keys.shape == (14, 3)
    assert NegativeQueue(3, size=1, num_negs=2).keys.shape == (2, 3)
    assert NegativeQueue(3, size=0, num_negs=5).keys.shape == (0, 3)
    default = NegativeQueue(4)
    assert (default.size, default.num_negs, default.keys.shape) == (1000, 5, (1004, 4))
    assert default.fill.dtype == torch.long and default.fill.shape == ()
    assert NegativeQueue(2, size=3, num_negs=1).num_negs == 1  # the bounds are accepted
    for size, num_negs in ((-1, 5), (10, 0)):
        with pytest.raises(ValueError, match=rf"^queue size must be ≥ 0 and num_negs ≥ 1, got {size}, {num_negs}"):
            NegativeQueue(2, size=size, num_negs=num_negs)


def test_queue_rejects_partial_items() -> None:
    with pytest.raises(ValueError):
        NegativeQueue(2, size=10, num_negs=5).enqueue(torch.randn(4, 2))


def _pair() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(3)
    source = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    target = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    source[1].running_mean.fill_(0.5)  # a buffer that differs, to see it copied
    return target, source


def test_momentum_update_m0_copies_and_m1_keeps() -> None:
    target, source = _pair()
    before = {k: v.clone() for k, v in target.state_dict().items()}
    momentum_update(target, source, m=1.0)
    for name, p in target.named_parameters():
        assert torch.equal(p, before[name])
    momentum_update(target, source, m=0.0)
    for (name, p), q in zip(target.state_dict().items(), source.state_dict().values(), strict=True):
        assert torch.equal(p, q), name


def test_momentum_update_matches_elementwise_formula() -> None:
    target, source = _pair()
    m = 0.9
    old_t, src = target[0].weight.detach().clone(), source[0].weight.detach().clone()
    momentum_update(target, source, m=m)
    for i in range(old_t.size(0)):
        for j in range(old_t.size(1)):
            expected = m * float(old_t[i, j]) + (1 - m) * float(src[i, j])
            assert target[0].weight[i, j].item() == pytest.approx(expected, abs=1e-6)
    assert torch.equal(target[1].running_mean, source[1].running_mean)  # buffers copied, not averaged
    assert not any(p.grad is not None for p in target.parameters())


def test_the_coherence_losses_and_their_gradients_never_wait_for_the_device() -> None:
    """Pairwise, contrastive and momentum-queue losses and the total, forward and backward: 0 syncs (the CPU stands
    in for the device)."""
    g = torch.Generator().manual_seed(0)
    f_pos = torch.randn(2, generator=g, requires_grad=True)
    f_neg = torch.randn(2, 5, generator=g, requires_grad=True)
    q = torch.randn(2, 4, generator=g, requires_grad=True)
    k_pos, queue = torch.randn(2, 4, generator=g), torch.randn(7, 4, generator=g)
    with count_ops(cpu_as_device=True) as c:
        _, l_p = pairwise_margin_loss(f_pos, f_neg[:, 0])
        _, l_c = contrastive_margin_loss(f_pos, f_neg)
        _, l_m = momentum_contrastive_loss(q, k_pos, queue)
        (total_loss(l_c, l_m) + l_p).backward()
    assert c.syncs == 0, c.sync_sites


def test_contrastive_default_margin_is_the_papers() -> None:
    f_pos, f_neg = [0.3, -0.2], [[0.1, 0.4], [-0.5, 0.0]]
    pos_t, neg_t = torch.tensor(f_pos, dtype=torch.float64), torch.tensor(f_neg, dtype=torch.float64)
    per, loss = contrastive_margin_loss(pos_t, neg_t)
    want = [_naive_contrastive(p, n, 0.1) for p, n in zip(f_pos, f_neg, strict=True)]  # τ = 0.1
    assert per.tolist() == pytest.approx(want, abs=1e-12)
    assert loss.item() == pytest.approx(sum(want) / 2, abs=1e-12)


Shape = tuple[int, ...]
BAD_SCORE_SHAPES = [((3, 1), (3, 2)), ((3,), (3, 2, 1)), ((3,), (2, 2)), ((3,), (3, 0))]


# each breaks exactly one clause of the shape check: f_pos not (B,), f_neg not 2-D, batch sizes differ, N = 0
@pytest.mark.parametrize("pos_shape, neg_shape", BAD_SCORE_SHAPES)
def test_contrastive_refuses_each_bad_shape_naming_both(pos_shape: Shape, neg_shape: Shape) -> None:
    with pytest.raises(ValueError) as err:
        contrastive_margin_loss(torch.zeros(pos_shape), torch.zeros(neg_shape))
    assert str(err.value) == f"expected f_pos (B,) and f_neg (B, N≥1), got {pos_shape}, {neg_shape}"


def test_momentum_default_margin_is_the_papers() -> None:
    q, k_pos, queue = [[1.0, 2.0, -1.0]], [[0.5, 1.0, 0.0]], [[1.0, 0.0, 0.0], [-1.0, 1.0, 2.0]]
    per, _ = momentum_contrastive_loss(*(torch.tensor(x, dtype=torch.float64) for x in (q, k_pos, queue)))
    assert per.item() == pytest.approx(_naive_momentum(q[0], k_pos[0], queue, 0.1), abs=1e-12)  # τ = 0.1


# each breaks exactly one clause: k_pos's shape, q not 2-D, the queue not 2-D, the queue's width
@pytest.mark.parametrize(
    "shapes",
    [((2, 4), (3, 4), (5, 4)), ((2, 4, 1), (2, 4, 1), (5, 4)), ((2, 4), (2, 4), (5, 4, 1))]
    + [((2, 4), (2, 4), (5, 3))],
)
def test_momentum_refuses_each_bad_shape(shapes: tuple[Shape, ...]) -> None:
    q, k_pos, queue = (torch.ones(s) for s in shapes)
    with pytest.raises(ValueError, match=r"^expected q, k_pos \(B, H\) and queue \(K, H\); got torch.Size"):
        momentum_contrastive_loss(q, k_pos, queue)


def test_total_loss_accepts_both_ends_of_lambda_and_names_a_bad_one() -> None:
    l_c, l_m = torch.tensor(2.0), torch.tensor(5.0)
    assert total_loss(l_c, l_m, lam=0.0).item() == 5.0  # λ = 0: the momentum loss alone
    assert total_loss(l_c, l_m, lam=1.0).item() == 2.0
    with pytest.raises(ValueError, match=r"^λ must be in \[0, 1\], got 1.5$"):
        total_loss(l_c, l_m, lam=1.5)
