"""token_log_probs against torch's log-softmax: values, gradients (gradcheck in float64), bf16, what it saves."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from raycl.losses.token_log_probs import TokenLogProbs, token_log_probs

V = 37


def _inputs(dtype: torch.dtype, rows: int = 6, T: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    logits = (4 * torch.randn(rows, T, V, generator=g, dtype=torch.float64)).to(dtype)  # wide: lse matters
    return logits.requires_grad_(), torch.randint(0, V, (rows, T), generator=g)


def _reference(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lp = F.log_softmax(logits, dim=-1)  # (rows, T, V)
    return lp.gather(-1, target.unsqueeze(-1)).squeeze(-1), lp.sum(-1)


@pytest.mark.parametrize("chunk_bytes", [4 * V * 7, 1 << 28])  # 7 rows a chunk (5 chunks, one short) | one chunk
def test_values_and_gradients_equal_log_softmax_in_fp32(chunk_bytes: int) -> None:
    logits, target = _inputs(torch.float32)
    got = token_log_probs(logits, target, chunk_bytes=chunk_bytes)
    want = _reference(logits, target)
    torch.testing.assert_close(got.target, want[0], rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(got.total, want[1], rtol=1e-6, atol=1e-4)
    assert got.vocab_size == V and got.target.dtype == torch.float32
    w = torch.randn(2, *target.shape, generator=torch.Generator().manual_seed(1))  # any upstream gradients
    g_got = torch.autograd.grad((w[0] * got.target + w[1] * got.total).sum(), logits)[0]
    g_want = torch.autograd.grad((w[0] * want[0] + w[1] * want[1]).sum(), logits)[0]
    torch.testing.assert_close(g_got, g_want, rtol=1e-5, atol=1e-5)


def test_gradcheck_in_float64_across_chunks() -> None:
    logits, target = _inputs(torch.float64, rows=3, T=4)
    assert torch.autograd.gradcheck(
        lambda x: tuple(token_log_probs(x, target, chunk_bytes=4 * V * 5)[:2]), (logits,)
    )


def test_bf16_logits_are_scored_in_fp32_within_bf16_tolerance() -> None:
    logits, target = _inputs(torch.bfloat16)
    got = token_log_probs(logits, target, chunk_bytes=4 * V * 7)
    exact = logits.detach().double().requires_grad_()  # the same (bf16-rounded) values, scored in float64
    want = _reference(exact, target)
    assert got.target.dtype == got.total.dtype == torch.float32  # sums of many tokens need fp32
    torch.testing.assert_close(got.target.double(), want[0], rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(got.total.double(), want[1], rtol=1e-6, atol=1e-3)
    g_got = torch.autograd.grad((got.target + 0.5 * got.total).sum(), logits)[0]
    g_want = torch.autograd.grad((want[0] + 0.5 * want[1]).sum(), exact)[0]
    assert g_got.dtype == torch.bfloat16  # the logits' own dtype
    torch.testing.assert_close(g_got.double(), g_want, rtol=1e-2, atol=1e-2)  # bf16 rounding of the gradient


def test_saves_the_logits_in_their_dtype_and_an_fp32_normaliser_only() -> None:
    logits, target = _inputs(torch.bfloat16)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        token_log_probs(logits, target)
    big = [t for t in saved if t.numel() == logits.numel()]
    assert [t.dtype for t in big] == [torch.bfloat16]  # no (N, V) fp32 softmax or log-softmax
    assert sorted(t.numel() for t in saved if t.is_floating_point()) == [target.numel(), logits.numel()]


def test_from_log_probs_reads_the_same_quantities() -> None:
    logits, target = _inputs(torch.float64)
    got = TokenLogProbs.from_log_probs(F.log_softmax(logits, -1), target)
    want = token_log_probs(logits, target)
    torch.testing.assert_close(got.target, want.target)
    torch.testing.assert_close(got.total, want.total)
    assert got.vocab_size == want.vocab_size == V and logits.size(1) != V  # the last dimension, not another


@pytest.mark.parametrize(
    "chunk_bytes, chunks", [(1, 5), (4 * V, 5), (4 * V * 2, 3), (4 * V * 2 - 1, 5), (1 << 28, 1)]
)
def test_rows_a_chunk_are_chunk_bytes_over_four_bytes_a_logit(
    monkeypatch: pytest.MonkeyPatch, chunk_bytes: int, chunks: int
) -> None:
    # 5 rows of V fp32 logits: one chunk holds chunk_bytes // (4·V) rows, at least one
    calls = []
    real = torch.logsumexp
    monkeypatch.setattr(torch, "logsumexp", lambda x, **kw: calls.append(x.size(0)) or real(x, **kw))
    logits, target = _inputs(torch.float32, rows=5, T=1)
    got = token_log_probs(logits, target, chunk_bytes=chunk_bytes)
    assert len(calls) == chunks and sum(calls) == 5  # every row once, no chunk overlaps another
    torch.testing.assert_close(got.target, _reference(logits, target)[0], rtol=1e-6, atol=1e-5)


def test_autocast_off_turns_a_cpu_autocast_off_and_is_a_no_op_without_one() -> None:
    from raycl.losses.full_precision import autocast_off

    a = torch.ones(2, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16
        with autocast_off("cpu"):
            assert (a @ a).dtype == torch.float32
    with autocast_off("meta"):  # no autocast on meta: nothing to turn off, and no error
        assert (a @ a).dtype == torch.float32
