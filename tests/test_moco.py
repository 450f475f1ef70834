"""MoCo key encoder and queue (ZhichunRoad): momentum limits, ring-buffer order, Q = 0 as in-batch InfoNCE."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from raycl.losses.infonce_queue import InfoNCEQueueLoss
from raycl.memory.moco import MoCoKeyEncoder
from raycl.models.cross_attention import mean_pool
from raycl.models.sentence_encoder import SentenceEncoder, build_sentence_encoder
from raycl.training.counting import count_ops

DIM = 6


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: a second thread only contends with the busy other core
    yield
    torch.set_num_threads(threads)


class TokenEncoder(nn.Module):
    """A stand-in f_q: (input_ids, attention_mask) -> token states (B, T, DIM), with dropout like BERT."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.drop = nn.Dropout(0.5)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.drop(self.proj(self.embed(input_ids)))


def _encoders(seed: int = 0) -> tuple[TokenEncoder, TokenEncoder]:
    """Two encoders with the same architecture and different weights."""
    torch.manual_seed(seed)
    return TokenEncoder().double(), TokenEncoder().double()


def _params(module: nn.Module) -> dict[str, list[float]]:
    return {n: p.detach().flatten().tolist() for n, p in module.named_parameters()}


def _moco_from(start: nn.Module, **kwargs: object) -> MoCoKeyEncoder:
    return MoCoKeyEncoder(start, dim=DIM, **kwargs).double()  # type: ignore[arg-type]


@pytest.mark.parametrize("m", [0.0, 0.3, 0.999, 1.0])
def test_momentum_update_matches_per_element_formula(m: float) -> None:
    start, query = _encoders()
    moco = _moco_from(start, m=m)
    before, q = _params(moco.encoder_k), _params(query)
    moco.momentum_update(query)
    after = _params(moco.encoder_k)
    for name in before:
        expected = [m * k + (1 - m) * x for k, x in zip(before[name], q[name], strict=True)]
        assert after[name] == pytest.approx(expected, rel=1e-12, abs=1e-15)
    if m == 0.0:
        assert after == q  # key encoder = query encoder, exactly
    if m == 1.0:
        assert after == before  # frozen, exactly


def test_key_encoder_is_a_gradient_free_copy() -> None:
    start, _ = _encoders()
    moco = _moco_from(start)
    assert _params(moco.encoder_k) == _params(start)
    assert all(not p.requires_grad for p in moco.encoder_k.parameters())
    assert all(p.requires_grad for p in start.parameters())  # the query encoder is untouched
    keys = moco.eval().keys(torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([[1, 1, 1], [1, 1, 0]]))
    assert keys.shape == (2, DIM) and not keys.requires_grad
    h = moco.encoder_k.proj(moco.encoder_k.embed(torch.tensor([[4, 5]])))  # (1, 2, DIM) unpadded 2nd sentence
    torch.testing.assert_close(keys[1], mean_pool(h, torch.ones(1, 2))[0].detach())


def _naive_ring(K: int, batches: list[list[int]]) -> tuple[list[int | None], int]:
    """Write key ids one at a time into K slots, wrapping; returns the slot contents and the pointer."""
    slots: list[int | None] = [None] * K
    ptr = 0
    for batch in batches:
        for key in batch:
            slots[ptr] = key
            ptr = (ptr + 1) % K
    return slots, ptr


@pytest.mark.parametrize("K", [5, 8])
def test_queue_ring_buffer_wraps_in_order(K: int) -> None:
    moco = _moco_from(_encoders()[0], queue_size=K)
    torch.testing.assert_close(moco.queue.norm(dim=0), torch.ones(K, dtype=torch.float64))  # unit random init
    batches = [[1, 2, 3], [4, 5], [6, 7, 8, 9], list(range(10, 22)), [22]]  # the 12-key batch laps the ring
    for batch in batches:
        keys = torch.tensor([[float(k)] * DIM for k in batch], dtype=torch.float64)  # (B, DIM) key k = k·1
        moco.enqueue(keys)
    slots, ptr = _naive_ring(K, batches)
    assert moco.queued()[:, 0].tolist() == [float(k) for k in slots]  # type: ignore[arg-type]
    assert moco.queued().shape == (K, DIM) and int(moco.queue_ptr[0]) == ptr


def test_queue_size_zero_is_in_batch_infonce() -> None:
    moco = _moco_from(_encoders()[0], queue_size=0)
    moco.enqueue(torch.ones(3, DIM, dtype=torch.float64))  # nothing to keep
    assert moco.queued().shape == (0, DIM)
    g = torch.Generator().manual_seed(1)
    h, h_pos = (torch.randn(4, DIM, generator=g, dtype=torch.float64) for _ in range(2))
    out = InfoNCEQueueLoss(temperature=0.05)(h, h_pos, moco.queued())

    def cos(x: list[float], y: list[float]) -> float:
        return sum(a * b for a, b in zip(x, y, strict=True)) / math.hypot(*x) / math.hypot(*y)

    for i, anchor in enumerate(h.tolist()):
        logits = [cos(anchor, p) / 0.05 for p in h_pos.tolist()]
        naive = -math.log(math.exp(logits[i]) / sum(math.exp(z) for z in logits))
        assert out.per_example[i].item() == pytest.approx(naive, rel=1e-10)


def test_training_step_uses_the_queue_before_enqueueing() -> None:
    """loss with the old queue → enqueue this step's keys → backward still works; the keys are never positives."""
    query, _ = _encoders()
    moco = _moco_from(query, queue_size=4).train()
    ids, mask = torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.ones(2, 3, dtype=torch.long)
    old_queue = moco.queued().clone()
    moco.momentum_update(query)
    h, h_pos = mean_pool(query(ids, mask), mask), mean_pool(query(ids, mask), mask)  # two dropout views
    out = InfoNCEQueueLoss()(h, h_pos, moco.queued())
    moco.enqueue(moco.keys(ids, mask))
    out.loss.backward()
    expected = InfoNCEQueueLoss()(h.detach(), h_pos.detach(), old_queue)
    torch.testing.assert_close(out.per_example.detach(), expected.per_example)
    assert not torch.equal(moco.queued(), old_queue)
    assert all(p.grad is not None for p in query.parameters())
    assert all(p.grad is None for p in moco.encoder_k.parameters())


def test_state_dict_carries_key_encoder_queue_and_pointer() -> None:
    start, other = _encoders()
    moco = _moco_from(start, queue_size=4)
    moco.momentum_update(other)
    moco.enqueue(torch.randn(3, DIM, dtype=torch.float64))
    restored = _moco_from(_encoders(seed=5)[0], queue_size=4)
    restored.load_state_dict(moco.state_dict())
    assert {"queue", "queue_ptr"} <= set(moco.state_dict())
    torch.testing.assert_close(restored.queue, moco.queue)
    assert int(restored.queue_ptr[0]) == 3 and _params(restored.encoder_k) == _params(moco.encoder_k)


def test_enqueue_never_reads_the_device_and_a_restored_ring_goes_on_alike() -> None:
    """The pointer moves by batch sizes, known on the host: enqueueing waits for nothing (the CPU stands in for the
    device). A ring restored from a checkpoint continues where the uninterrupted one does."""
    moco = _moco_from(_encoders()[0], queue_size=5)
    batches = [[1, 2, 3], [4], [6, 7, 8]]  # the pointer at the checkpoint: 4 (not its initial 0)
    with count_ops(cpu_as_device=True) as c:
        for batch in batches[:2]:
            moco.enqueue(torch.tensor([[float(k)] * DIM for k in batch], dtype=torch.float64))
    assert c.syncs == 0, c.sync_sites
    restored = _moco_from(_encoders(seed=5)[0], queue_size=5)
    restored.load_state_dict(moco.state_dict())
    for ring in (moco, restored):
        ring.enqueue(torch.tensor([[float(k)] * DIM for k in batches[2]], dtype=torch.float64))
    slots, ptr = _naive_ring(5, batches)
    assert restored.queued()[:, 0].tolist() == moco.queued()[:, 0].tolist() == [float(k) for k in slots]
    assert int(restored.queue_ptr[0]) == ptr


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="momentum"):
        MoCoKeyEncoder(TokenEncoder(), dim=DIM, m=1.5)
    with pytest.raises(ValueError, match="queue size"):
        MoCoKeyEncoder(TokenEncoder(), dim=DIM, queue_size=-1)


@pytest.fixture(scope="module")
def sentence_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    texts = ["the cat sat on the mat .", "he kicked the bucket .", "a big fish swims ."] * 4
    return build_sentence_encoder("smoke", tmp_path_factory.mktemp("moco") / "m", texts=texts)


@pytest.mark.parametrize("every_forward", [False, True])
def test_update_schedule_step_or_every_forward(sentence_encoder: Path, every_forward: bool) -> None:
    """Default — the released cadence, once per contrastive step: θ_k moves only when the step calls
    momentum_update, never on other passes (MSE pairs, dev predictions). The ablation: any encode moves it."""
    model = SentenceEncoder.from_pretrained(sentence_encoder).eval()
    moco = MoCoKeyEncoder(model, dim=model.hidden_size, m=0.5, update_every_forward=every_forward)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1)  # an optimizer step on θ_q
    start = _params(moco.encoder_k)
    with torch.no_grad():
        model.encode(["a cat ."])
    moved = _params(moco.encoder_k) != start
    assert moved == every_forward
    moco.momentum_update(model)  # the per-step update, in both schedules
    assert _params(moco.encoder_k) != start
    assert moco.keys(*model.tokenize(["a cat ."])).shape == (1, model.hidden_size)


def test_default_schedule_leaves_the_key_encoder_alone_on_a_query_forward_and_the_pointer_is_one_long() -> None:
    """Without update_every_forward the released once-a-step cadence holds: a query forward moves nothing."""
    query = TokenEncoder()
    moco = MoCoKeyEncoder(query, dim=DIM, m=0.5)
    with torch.no_grad():
        for p in query.parameters():
            p.add_(0.1)  # an optimizer step on θ_q
        start = _params(moco.encoder_k)
        query(torch.tensor([[1, 2]]), torch.ones(1, 2))
    assert _params(moco.encoder_k) == start
    assert moco.queue_ptr.dtype == torch.long and moco.queue_ptr.tolist() == [0]  # a (1,) integer index
