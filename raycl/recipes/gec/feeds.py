"""How a GEC epoch's examples are cut into batches: shards, global batches, token budgets.

Where their negatives come from is the negative source's (:mod:`raycl.training.negatives`); these give the order
it follows where negatives are known ahead (:func:`global_batches`), each rank's share of what a stream schedules
(:func:`shard`), and fairseq's token budget within a pool (:func:`token_batches`). Every data-parallel rank gets
the same number of batches.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import replace

from raycl.data.gec import GecExample
from raycl.training.negatives import PAD

Batch = tuple[list[GecExample], list[list[str]]]


def shard(examples: Sequence[GecExample], rank: int, world_size: int) -> list[GecExample]:
    """Every ``world_size``-th example, padded by wrap-around so every rank has as many (DistributedSampler):
    ranks must take the same number of steps, or the gradient all-reduce waits forever. Padding copies get
    their own id (``#pad``), so every id of an epoch is unique across ranks."""
    per_rank = math.ceil(len(examples) / world_size)
    pad = [replace(ex, id=f"{ex.id}{PAD}") for ex in examples[: per_rank * world_size - len(examples)]]
    return [*examples, *pad][rank::world_size]


def global_batches(n: int, *, batch_size: int, seed: int, rank: int, world_size: int) -> list[list[int]]:
    """This rank's batches (indices into the whole data) of an epoch: one seeded shuffle shared by every rank, cut
    into global batches of ``world_size × batch_size``, of which each rank takes a strided share — so N workers'
    i-th update is one worker's i-th batch of N·B, and nothing is padded. A rank's share of the last, short global
    batch may be empty: it is left out, and the rank joins the others' last update (the loop's ``join``)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    size = batch_size * world_size
    shares = (order[i : i + size][rank::world_size] for i in range(0, n, size))
    return [s for s in shares if s]


def token_batches(batch: Batch, *, max_tokens: int, size: Callable[[GecExample, list[str]], int],
                  rng: random.Random) -> list[Batch]:  # fmt: skip
    """fairseq's ``--max-tokens`` within one pool of examples: sorted by size, cut so that every batch's sentences
    × its longest ``size`` stay ≤ ``max_tokens`` (a longer sentence is a batch of its own), in shuffled order.
    ``size``: fairseq's ``num_tokens`` of a GEC-CL example, max(source, the whole target line with negatives)."""
    examples, negatives = batch
    groups = token_groups([size(ex, negs) for ex, negs in zip(examples, negatives, strict=True)], max_tokens)
    rng.shuffle(groups)
    return [([examples[i] for i in g], [negatives[i] for i in g]) for g in groups]


def token_groups(sizes: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices into ``sizes``, sorted by size and cut so that each group's count × its largest size stays within
    ``max_tokens`` (a larger one alone): the batches of :func:`token_batches`, before their shuffle."""
    groups: list[list[int]] = []
    longest = 0
    for i in sorted(range(len(sizes)), key=lambda j: sizes[j]):
        if groups and (len(groups[-1]) + 1) * max(longest, sizes[i]) <= max_tokens:
            groups[-1].append(i)
            longest = max(longest, sizes[i])
        else:
            groups.append([i])
            longest = sizes[i]
    return groups


