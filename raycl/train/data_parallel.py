"""Data parallelism with fairseq's normalisation: gradients summed over workers, divided by the *global* weight.

A micro-batch's backward is of its *summed* loss (``mean × weight``, weight = its target tokens for GEC, its
pairs for STS, 1 for a mean-reduced loss). After the last micro-batch of an update the gradients are summed over
workers and divided by the global weight (all ranks, all micro-batches), which is exactly the gradient of the
single-process loss over the union of the shards (fairseq: "sum both terms, then divide by ntokens").

Collective tensors live on the device of the process group's backend: NCCL (Ray Train's backend as soon as the
workers have GPUs) accepts only CUDA tensors, gloo CPU ones.

Recipes whose model runs several forward passes per step through methods other than ``forward`` (GEC: one pass
per negative slot through the scorer; STS: SimCSE views, MoCo keys, cross-attended pairs) sum gradients here,
after the backward, bucketed (a few large all-reduces instead of one per tensor or one flat copy of the whole
model); the other recipes use DDP, whose bucketed all-reduce overlaps the backward. Why not DDP for GEC too:
token-budget batches (``optim.max_tokens``) give ranks different numbers of batches per epoch, and a rank that
has run out joins the others' sums with zeros (:func:`join_update`), which DDP could do only inside its ``Join``
context with every forward through the wrapped module; the scorer's passes go through ``log_probs`` /
``sequence_scores``, not ``forward``. What the overlap would save is one all-reduce of the gradients per update
(BART-large: 1.6 GB in fp32), against a step of 1 + k teacher-forced passes — to be measured on a GPU cluster.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

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
    """Sum ``.grad`` over workers in place (bucketed all-reduces); a no-op with one worker."""
    if not distributed():
        return
    device = collective_device(str(dist.get_backend()))
    params = list(params)
    for p in params:  # every rank reduces the same tensors: a parameter this rank did not use counts as zero
        if p.grad is None:
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
    if factor == 1.0:
        return
    for p in params:
        if p.grad is not None:
            p.grad.mul_(factor)


def average_gradients(params: list[torch.nn.Parameter], weight: float, *, averaged_by_ddp: bool = False,
                      active: bool = True) -> float:  # fmt: skip
    """The update's gradient from the summed-loss gradients of this worker's micro-batches: summed over workers
    (unless DDP's all-reduce already averaged them) and divided by the global weight; returns that weight.
    ``active``: this rank counts itself in the update (ranks that finished their epoch join with
    ``join_update``)."""
    if averaged_by_ddp:
        global_weight = all_reduce_sum(weight)
        scale_gradients(params, dist.get_world_size() / max(global_weight, 1e-12))
        return global_weight
    global_weight, _ = _weight_and_active(weight, active)
    sum_gradients(params)
    scale_gradients(params, 1.0 / max(global_weight, 1e-12))
    return global_weight


def _weight_and_active(weight: float, active: bool) -> tuple[float, float]:
    if not distributed():
        return weight, float(active)
    device = collective_device(str(dist.get_backend()))
    t = torch.tensor([weight, float(active)], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t[0].item()), float(t[1].item())


def join_update(params: list[torch.nn.Parameter]) -> bool:
    """A rank with no batch left takes part in one update of the others with zero gradients; returns whether any
    rank was still updating (False: every rank has joined, the epoch is over everywhere)."""
    _, active = _weight_and_active(0.0, False)
    if active == 0:
        return False
    for p in params:
        p.grad = torch.zeros_like(p)
    sum_gradients(params)
    for p in params:
        p.grad = None
    return True
