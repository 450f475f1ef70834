"""Per-token log-probabilities from logits without keeping a full-vocabulary log-softmax for the backward.

A teacher-forced sequence loss needs, per target token, only two numbers from the vocabulary distribution:

- the target's log-probability, ``log p_y = x_y − lse(x)`` (the sequence score and the NLL), and
- the sum of all log-probabilities, ``Σ_v log p_v = Σ_v x_v − V·lse(x)`` (the label-smoothing term of fairseq's
  label-smoothed NLL).

``F.log_softmax`` followed by a gather keeps its whole ``(N, V)`` fp32 output for the backward (the softmax is
read back from it). :func:`token_log_probs` instead keeps the logits in their own dtype (bf16 under autocast) and
the ``(N,)`` fp32 log-normaliser, and recomputes the softmax in the backward, in row chunks, so that neither pass
holds more than one chunk of fp32 temporaries. The arithmetic is fp32 whatever the logits' dtype: summing many
token log-probs in bf16 would lose most of a sequence score's digits.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from raycl.losses.full_precision import autocast_off

CHUNK_BYTES = 1 << 28  # fp32 temporaries of at most 256 MiB a chunk (a (3840, 50265) BART batch is 3 chunks)


class TokenLogProbs(NamedTuple):
    """Per-token quantities of a teacher-forced pass; pads are not zeroed here (the caller masks them)."""

    target: Tensor  # (..., T) fp32 log p(y_t | y_<t, s)
    total: Tensor  # (..., T) fp32 Σ_v log p(v | y_<t, s)
    vocab_size: int  # V, for the smoothing weight ε/V

    @classmethod
    def from_log_probs(cls, lprobs: Tensor, target_ids: Tensor) -> TokenLogProbs:
        """The same quantities read off a full log-softmax: (..., T, V), (..., T) -> (..., T) each."""
        target = lprobs.gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)  # (..., T)
        return cls(target, lprobs.sum(-1), lprobs.size(-1))


def token_log_probs(logits: Tensor, target_ids: Tensor, *, chunk_bytes: int = CHUNK_BYTES) -> TokenLogProbs:
    """``log p_y`` and ``Σ_v log p_v`` per position, in fp32, from logits of any float dtype.

    Args:
        logits: (..., T, V) unnormalised scores (fp32, bf16 or fp16; float64 works too, for gradcheck).
        target_ids: (..., T) the token scored at each position (any valid id at padded positions).
        chunk_bytes: bound on the fp32 temporaries of one chunk of rows (forward and backward).

    Returns:
        :class:`TokenLogProbs` with ``target`` and ``total`` of shape (..., T), fp32 (float64 for float64
        logits). Saved for the backward: the logits as given and the (..., T) fp32 log-normaliser.
    """
    V = logits.size(-1)
    flat = logits.reshape(-1, V)  # (N, V) a view for contiguous logits
    rows = max(1, chunk_bytes // (4 * V))
    target, total = _TokenLogProbs.apply(flat, target_ids.reshape(-1), rows)  # (N,), (N,)
    shape = target_ids.shape
    return TokenLogProbs(target.view(shape), total.view(shape), V)


def _compute_dtype(logits: Tensor) -> torch.dtype:
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


class _TokenLogProbs(torch.autograd.Function):
    """(N, V) logits, (N,) targets -> (N,) log p_y, (N,) Σ_v log p_v; the backward recomputes the softmax."""

    @staticmethod
    def forward(ctx: FunctionCtx, logits: Tensor, target: Tensor, rows: int) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        N, V = logits.shape
        dtype = _compute_dtype(logits)
        lse = logits.new_empty(N, dtype=dtype)  # (N,)
        target_lp = logits.new_empty(N, dtype=dtype)  # (N,)
        total = logits.new_empty(N, dtype=dtype)  # (N,)
        with autocast_off(logits.device.type):  # fp32 on purpose: no autocast re-cast
            for lo in range(0, N, rows):
                x = logits[lo : lo + rows].to(dtype)  # (n, V) one chunk in fp32 (a view if already fp32)
                c = torch.logsumexp(x, dim=-1)  # (n,)
                lse[lo : lo + rows] = c
                target_lp[lo : lo + rows] = x.gather(-1, target[lo : lo + rows, None]).squeeze(-1) - c
                total[lo : lo + rows] = x.sum(-1) - V * c
        ctx.save_for_backward(logits, target, lse)
        ctx.rows = rows  # type: ignore[attr-defined]
        return target_lp, total

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g_target: Tensor, g_total: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        # d log p_y / dx_v = [v = y] − p_v;  d Σ_u log p_u / dx_v = 1 − V·p_v
        logits, target, lse = ctx.saved_tensors
        N, V = logits.shape
        rows, dtype = ctx.rows, lse.dtype
        grad = torch.empty_like(logits)  # (N, V) in the logits' dtype
        coef = g_target + V * g_total  # (N,) weight of −p_v
        with autocast_off(logits.device.type):
            for lo in range(0, N, rows):
                hi = min(lo + rows, N)
                out = grad[lo:hi] if logits.dtype == dtype else None  # write in place when no cast is needed
                p = torch.sub(logits[lo:hi].to(dtype), lse[lo:hi, None], out=out).exp_()  # (n, V) softmax
                p.mul_(-coef[lo:hi, None]).add_(g_total[lo:hi, None])  # (n, V)
                p.scatter_add_(-1, target[lo:hi, None], g_target[lo:hi, None])
                if out is None:
                    grad[lo:hi] = p  # one cast back to the logits' dtype
        return grad, None, None
