"""How a GEC epoch's examples are cut into batches: shards, global batches, token budgets.

Where their negatives come from is the negative source's (:mod:`raycl.training.negatives`); these give the order
it follows where negatives are known ahead (:func:`global_batches`), each rank's share of what a stream schedules
(:func:`shard`), and fairseq's token budget within a pool (:func:`token_batches`). Every data-parallel rank gets
the same number of batches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from raycl.data.gec import GecExample

# the batch plan's (raycl.training.batching), named here as before
from raycl.training.batching import global_batches as global_batches
from raycl.training.batching import token_batches as token_batches
from raycl.training.batching import token_groups as token_groups
from raycl.training.negatives import PAD

Batch = tuple[list[GecExample], list[list[str]]]


def shard(examples: Sequence[GecExample], rank: int, world_size: int) -> list[GecExample]:
    """Every ``world_size``-th example, padded by wrap-around so every rank has as many (DistributedSampler):
    ranks must take the same number of steps, or the gradient all-reduce waits forever. Padding copies get
    their own id (``#pad``), so every id of an epoch is unique across ranks."""
    per_rank = math.ceil(len(examples) / world_size)
    pad = [replace(ex, id=f"{ex.id}{PAD}") for ex in examples[: per_rank * world_size - len(examples)]]
    return [*examples, *pad][rank::world_size]
