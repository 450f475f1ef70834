"""Data parallelism with fairseq's normalisation: gradients summed over workers, divided by the *global* weight.

A micro-batch's backward is of its *summed* loss (``mean × weight``, weight = its target tokens for GEC, its
pairs for STS, 1 for a mean-reduced loss). After the last micro-batch of an update the gradients are summed over
workers and divided by the global weight (all ranks, all micro-batches), which is exactly the gradient of the
single-process loss over the union of the shards (fairseq: "sum both terms, then divide by ntokens").

Collective tensors live on the device of the process group's backend: NCCL (Ray Train's backend as soon as the
workers have GPUs) accepts only CUDA tensors, gloo CPU ones. Every collective raycl makes is in this module
(``tests/test_loop.py`` checks it), so that rule is kept in one place.

Recipes whose model runs several forward passes per step through methods other than ``forward`` (GEC: one pass
per negative slot through the scorer; STS: SimCSE views, MoCo keys, cross-attended pairs), and coherence, whose
ranks may hold different numbers of batches, sum gradients here, after the backward, bucketed (a few large
all-reduces instead of one per tensor or one flat copy of the whole model); idiom uses DDP, whose bucketed
all-reduce overlaps the backward. Why not DDP for GEC too: token-budget batches (``optim.max_tokens``) give ranks
different numbers of batches per epoch, and a rank that has run out joins the others' updates with zero gradients
(the loop's ``join``), which DDP could do only inside its ``Join`` context with every forward through the wrapped
module; the scorer's passes go through ``log_probs`` / ``sequence_scores``, not ``forward``. What the overlap would
save is one all-reduce of the gradients per update (BART-large: 1.6 GB in fp32), against a step of 1 + k
teacher-forced passes — to be measured on a GPU cluster.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

from raycl.memory.multi_tensor import grouped, scale_

BUCKET_BYTES = 64 * 2**20  # gradients per all-reduce: large enough to amortise a call, small to bound the copy


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def collective_device(backend: str) -> torch.device:
    """Where a collective's tensors must be: the current CUDA device under NCCL, else the CPU."""
    return torch.device("cuda") if backend == "nccl" else torch.device("cpu")  # "cuda": the current device


def all_reduce_sum(value: float) -> float:
    """Sum a Python number over workers (identity with one worker)."""
    if not distributed():
        return value
    t = torch.tensor([value], dtype=torch.float64, device=collective_device(str(dist.get_backend())))
    dist.all_reduce(t)
    return float(t.item())


def _buckets(grads: list[torch.Tensor], limit: int) -> Iterable[list[torch.Tensor]]:
    """Consecutive gradients of one dtype and device, each bucket at most ``limit`` bytes (or one tensor)."""
    bucket: list[torch.Tensor] = []
    size = 0
    for g in grads:
        nbytes = g.numel() * g.element_size()
        same = not bucket or (g.dtype == bucket[0].dtype and g.device == bucket[0].device)
        if bucket and (size + nbytes > limit or not same):
            yield bucket
            bucket, size = [], 0
        bucket.append(g)
        size += nbytes
    if bucket:
        yield bucket


def sum_gradients(params: Iterable[torch.nn.Parameter], *, bucket_bytes: int = BUCKET_BYTES) -> None:
    """Sum ``.grad`` over workers in place (bucketed all-reduces); a no-op with one worker.

    A parameter that has a gradient on some rank is summed with zeros from the ranks where it has none; one that
    has a gradient on no rank keeps ``grad = None``, as with one worker (AdamW then neither decays nor moves it:
    with zeros it would apply its weight decay and count a step for a parameter no objective touched)."""
    if not distributed():
        return
    device = collective_device(str(dist.get_backend()))
    params = list(params)
    used = torch.tensor([float(p.grad is not None) for p in params], dtype=torch.float32, device=device)
    dist.all_reduce(used)  # (P,) how many ranks have a gradient of each parameter
    for p, n in zip(params, used.tolist(), strict=True):
        if n > 0 and p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params if p.grad is not None]
    for bucket in _buckets(grads, bucket_bytes):
        flat = torch.cat([g.reshape(-1) for g in bucket]).to(device)
        dist.all_reduce(flat)
        offset = 0
        for g in bucket:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def scale_gradients(params: Iterable[torch.nn.Parameter], factor: float) -> None:
    """grad ← factor·grad for every parameter that has one: one multi-tensor op per (device, dtype), not a kernel
    per parameter."""
    if factor == 1.0:
        return
    scale_([p.grad for p in params if p.grad is not None], factor)


def average_gradients(
    params: list[torch.nn.Parameter], weight: float, *, averaged_by_ddp: bool = False, active: bool = True
) -> bool:
    """The update's gradient from the summed-loss gradients of this worker's micro-batches: summed over workers
    (unless DDP's all-reduce already averaged them) and divided by the global weight. A rank whose epoch is over
    joins the others' update with ``weight`` 0, ``active=False`` and no gradients. Returns whether any rank took
    part with batches of its own; when none did the gradients are left alone (there is no update to make).

    The global weight stays on the collective's device and divides the gradients there: an active rank reads
    nothing back (under NCCL a read waits for the all-reduce); a joined rank reads whether anyone is active."""
    if averaged_by_ddp:
        total = _all_reduced([weight])  # (1,) Σ weight
        divide_(params, total[0] / dist.get_world_size())
        return True
    if not distributed():
        if active:
            scale_gradients(params, 1.0 / max(weight, 1e-12))
        return active
    sums = _all_reduced([weight, float(active)])  # (2,) Σ weight, ranks with batches
    if not active and float(sums[1].item()) == 0:
        return False
    sum_gradients(params)
    divide_(params, sums[0])
    return True


def _all_reduced(values: list[float]) -> torch.Tensor:
    device = collective_device(str(dist.get_backend()))
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t


def divide_(params: Iterable[torch.nn.Parameter], divisor: torch.Tensor) -> None:
    """grad ← grad / divisor for every parameter that has one, ``divisor`` a 0-d tensor on the collective's device
    (the CPU's under gloo): one multi-tensor op per (device, dtype), nothing read back."""
    grads = [p.grad for p in params if p.grad is not None]
    for (group,) in grouped(grads):
        torch._foreach_div_(group, divisor.clamp(min=1e-12).to(group[0].device, group[0].dtype))


def broadcast_int(value: int, src: int = 0) -> int:
    """Rank ``src``'s ``value`` on every rank (identity with one worker)."""
    if not distributed():
        return value
    t = torch.tensor([value], dtype=torch.int64, device=collective_device(str(dist.get_backend())))
    dist.broadcast(t, src=src)
    return int(t.item())


def all_gather_floats(values: list[float]) -> list[list[float]]:
    """Every rank's ``values`` (one small all-gather on the backend's device); ``[values]`` with one worker."""
    if not distributed():
        return [list(values)]
    device = collective_device(str(dist.get_backend()))
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return [t.tolist() for t in out]
