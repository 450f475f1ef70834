"""Updates of many tensors at once (``torch._foreach_*``): a handful of ops an update, not one per parameter.

On a GPU a ``_foreach`` op is one launch (or a few) for a whole list of tensors of one device and dtype, where a
Python loop launches a kernel per parameter (BART-large has 511): the host, not the card, would bound the
update. On a CPU it is one dispatch looping in C++. Lists are grouped by (device, dtype) first, so each call
takes the fast path.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor


def grouped(*lists: Sequence[Tensor]) -> list[tuple[list[Tensor], ...]]:
    """Parallel lists split by the (device, dtype) of the first list's tensors, order kept within a group."""
    groups: dict[tuple[torch.device, torch.dtype], tuple[list[Tensor], ...]] = {}
    for items in zip(*lists, strict=True):
        key = (items[0].device, items[0].dtype)
        group = groups.setdefault(key, tuple([] for _ in lists))
        for out, t in zip(group, items, strict=True):
            out.append(t)
    return list(groups.values())


def scale_(tensors: Iterable[Tensor], factor: float) -> None:
    """t ← factor·t for every tensor (sparse ones one by one: ``_foreach`` ops take dense tensors)."""
    dense = []
    for t in tensors:
        if t.is_sparse:
            t.mul_(factor)
        else:
            dense.append(t)
    for (group,) in grouped(dense):
        torch._foreach_mul_(group, factor)


def momentum_(targets: Sequence[Tensor], sources: Sequence[Tensor], m: float) -> None:
    """θ_t ← m·θ_t + (1 − m)·θ_s in place, pairwise (a source of another dtype or device is cast to its target's).

    The same arithmetic as ``t.mul_(m).add_(s, alpha=1 − m)`` per pair: m = 0 copies the sources exactly,
    m = 1 leaves the targets unchanged."""
    pairs = zip(targets, sources, strict=True)
    sources = [s if s.dtype == t.dtype and s.device == t.device else s.to(t) for t, s in pairs]
    for tgt, src in grouped(targets, sources):
        torch._foreach_mul_(tgt, m)
        torch._foreach_add_(tgt, src, alpha=1.0 - m)


def copy_(targets: Sequence[Tensor], sources: Sequence[Tensor]) -> None:
    """t ← s for every pair (buffers: a momentum encoder's are copies of its source's)."""
    for tgt, src in grouped(targets, sources):
        torch._foreach_copy_(tgt, src)
