"""Data parallelism with fairseq's normalisation: gradients summed over workers, divided by *global* tokens.

Each worker's loss is ``sum_over_its_tokens / its_ntokens``. Scaling it by ``its_ntokens / global_ntokens``
before ``backward`` and summing gradients over workers gives exactly the gradient of
``sum_over_all_tokens / global_ntokens`` — the single-process loss on the union of the shards (SPEC §1.2:
"sum both terms, then divide by ntokens"). Several forward passes per step (one per negative slot) are fine,
unlike DDP's reducer, because the gradients are summed once, after ``backward``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum(value: float) -> float:
    """Sum a Python number over workers (identity with one worker)."""
    if not _distributed():
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item())


def backward_global(loss: torch.Tensor, ntokens: float, model: torch.nn.Module) -> float:
    """Backward of this worker's share of the global per-token loss, then sum gradients; returns global tokens."""
    global_tokens = all_reduce_sum(float(ntokens))
    (loss * (float(ntokens) / max(global_tokens, 1.0))).backward()
    if _distributed():
        # One all-reduce over a flat copy: per-tensor calls cost a round trip each (~100 tensors in a BART).
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
    return global_tokens
