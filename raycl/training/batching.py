"""One batch plan for every recipe: an epoch's global batches, sharded by rank, in a seeded order.

Every recipe's data-parallel epoch is cut the same way (fairseq's ``EpochBatchIterator`` with ``num_shards`` /
``shard_id``; sentence-transformers' batch samplers): one seeded permutation of the rows, shared by every rank, cut
into *global* batches of ``world_size × batch_size`` rows, of which rank r takes the strided share
``batch[r::world_size]`` — so N workers' i-th update is one worker's i-th batch of N·B rows, and nothing is
padded. Epoch e draws its permutation from ``random.Random(seed × 1000 + e)`` (:meth:`BatchPlan.set_epoch`).

A plan may hold several *loaders* drawn one after the other from the epoch's generator and zipped, the epoch
ending with the shortest (STS: its pairs and its contrastive sentences, as sentence-transformers' ``fit``); a
loader may drop global batches too small for its objective (``min_rows``: in-batch negatives need two rows a
rank). A rank's empty share of the last, short global batch is kept where every rank must make every step (DDP:
the step then runs with weight 0) or left out (``keep_empty=False``: the rank joins the others' updates, the
loop's ``join``).

``len(plan)`` is the batches of an epoch the rank with the most has — arithmetic, no dry run — and
:meth:`BatchPlan.updates` the schedule's total. Token budgets (fairseq's ``--max-tokens``) cut a pool of rows by
their sizes (:func:`token_groups`, :func:`token_batches`); :meth:`BatchPlan.token_batch_counts` counts them. A
source's pools may instead be re-cut across pools into batches of a number of rows (:func:`row_batches`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from raycl.training.negatives.base import PAD
from raycl.training.prefetch import Call
from raycl.training.task import Batch, updates_in

T = TypeVar("T")

DRAWS = ("sample", "shuffle")  # random.sample(range(n), n) | random.shuffle(list(range(n))): different orders


def draw_order(n: int, rng: random.Random, draw: str = "sample") -> list[int]:
    """A permutation of ``range(n)`` drawn from ``rng``. The two draws give different orders from one seed; each
    recipe keeps the one its results were made with (GEC ``shuffle``, the encoders ``sample``)."""
    if draw == "shuffle":
        order = list(range(n))
        rng.shuffle(order)
        return order
    if draw != "sample":
        raise ValueError(f"draw {draw!r}: expected one of {DRAWS}")
    return rng.sample(range(n), n)


def shares(
    order: Sequence[int],
    *,
    batch_size: int,
    rank: int,
    world_size: int,
    min_rows: int = 1,
    keep_empty: bool = True,
) -> list[list[int]]:
    """Rank ``rank``'s shares of the global batches of ``world_size × batch_size`` rows cut from ``order``; global
    batches of fewer than ``min_rows`` rows are dropped, and so are empty shares unless ``keep_empty``."""
    size = batch_size * world_size
    chunks = (order[i : i + size] for i in range(0, len(order), size))
    out = [list(c[rank::world_size]) for c in chunks if len(c) >= min_rows]
    return out if keep_empty else [s for s in out if s]


def global_batches_in(rows: int, *, batch_size: int, world_size: int, min_rows: int = 1) -> int:
    """How many global batches :func:`shares` cuts from ``rows`` rows (the shares rank 0 has: it has a row of
    every global batch)."""
    size = batch_size * world_size
    full, last = divmod(rows, size)
    return full * int(size >= min_rows) + int(last > 0 and last >= min_rows)


@dataclass(frozen=True)
class Loader:
    """One stream of rows an epoch draws from: ``rows`` of them; global batches with fewer than ``min_rows`` rows
    are dropped (two a rank: in-batch negatives)."""

    rows: int
    min_rows: int = 1


class BatchPlan:
    """This rank's batches of every epoch (row indices, one list per loader), its position in the current epoch
    (``state_dict``), and its length without a dry run. Epoch e draws from ``seed`` × 1000 + e."""

    def __init__(
        self,
        loaders: Sequence[Loader | int],
        *,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        draw: str = "sample",
        keep_empty: bool = True,
    ) -> None:
        if batch_size < 1 or world_size < 1 or not loaders:
            raise ValueError(
                f"a batch plan needs loaders, batch_size ≥ 1 and world_size ≥ 1: got {len(loaders)}, "
                f"{batch_size}, {world_size}"
            )
        self.loaders = tuple(x if isinstance(x, Loader) else Loader(x) for x in loaders)
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.draw, self.keep_empty = draw, keep_empty
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """The epoch the next iteration draws, from its ``start``-th batch (a resumed epoch's position)."""
        self.epoch, self.start = epoch, start

    def epoch_seed(self) -> int:
        return self.seed * 1000 + self.epoch

    def batches(self) -> list[tuple[list[int], ...]]:
        """Every batch of this rank in the current epoch (from its first): one share per loader, zipped."""
        rng = random.Random(self.epoch_seed())
        orders = [draw_order(x.rows, rng, self.draw) for x in self.loaders]  # one after the other, one generator
        per = [
            shares(o, batch_size=self.batch_size, rank=self.rank, world_size=self.world_size, min_rows=x.min_rows)
            for o, x in zip(orders, self.loaders, strict=True)
        ]
        out = list(zip(*per, strict=False))  # the shortest loader ends the epoch
        return out if self.keep_empty else [b for b in out if any(b)]

    def __iter__(self) -> Iterator[tuple[list[int], ...]]:
        """This rank's batches of the current epoch from its position; the position moves as they are taken."""
        for b in self.batches()[self.start :]:
            self.start += 1
            yield b

    def rows(self, epoch: int) -> list[list[int]]:
        """This rank's batches of ``epoch`` from its first, for a plan of one loader: the pools a negative source
        that knows its negatives ahead hands out."""
        self.set_epoch(epoch)
        return [rows for (rows,) in self.batches()]

    def __len__(self) -> int:
        """Batches an epoch of the rank that has the most (rank 0: it has a row of every global batch)."""
        return min(
            global_batches_in(x.rows, batch_size=self.batch_size, world_size=self.world_size, min_rows=x.min_rows)
            for x in self.loaders
        )

    def updates(self, epochs: int, update_freq: int, *, sizes: Sequence[int] = (), max_tokens: int = 0) -> int:
        """The optimizer updates of ``epochs`` epochs: the schedule's total (:func:`updates_in`); under a token
        budget (``max_tokens``, each row's ``sizes``) of the batches it cuts (:meth:`token_batch_counts`)."""
        if max_tokens:
            return updates_in(self.token_batch_counts(sizes, max_tokens, epochs), update_freq)
        return updates_in([len(self)] * epochs, update_freq)

    def token_batch_counts(self, sizes: Sequence[int], max_tokens: int, epochs: int) -> list[int]:
        """Under a token budget, each epoch's batches of the rank that has the most: every global batch's share
        cut by :func:`token_groups` (``sizes``: each row's ``num_tokens``; a plan of one loader)."""
        most = []
        for epoch in range(epochs):
            rng = random.Random(self.seed * 1000 + epoch)
            order = draw_order(self.loaders[0].rows, rng, self.draw)
            counts = [
                sum(
                    len(token_groups([sizes[i] for i in s], max_tokens))
                    for s in shares(
                        order,
                        batch_size=self.batch_size,
                        rank=r,
                        world_size=self.world_size,
                        keep_empty=self.keep_empty,
                    )
                )
                for r in range(self.world_size)
            ]
            most.append(max(counts))
        return most

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "start": self.start}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.set_epoch(int(state["epoch"]), int(state["start"]))


def global_batches(n: int, *, batch_size: int, seed: int, rank: int, world_size: int) -> list[list[int]]:
    """This rank's batches (indices into the whole data) of an epoch drawn from ``random.Random(seed)`` — GEC's
    order, a shuffle — with empty shares left out (the rank joins the others' last update)."""
    order = draw_order(n, random.Random(seed), "shuffle")
    return shares(order, batch_size=batch_size, rank=rank, world_size=world_size, keep_empty=False)


def token_groups(sizes: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices into ``sizes``, sorted by size and cut so that each group's count × its largest size stays within
    ``max_tokens`` (a larger one alone): fairseq's ``batch_by_size``, the batches of :func:`token_batches`
    before their shuffle."""
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


def token_batches(
    batch: tuple[list[T], list[list[str]]],
    *,
    max_tokens: int,
    size: Callable[[T, list[str]], int],
    rng: random.Random,
) -> list[tuple[list[T], list[list[str]]]]:
    """fairseq's ``--max-tokens`` within one pool of examples and their negatives: sorted by size, cut so that
    every batch's rows × its longest ``size`` stay ≤ ``max_tokens`` (a longer row is a batch of its own), in
    shuffled order. ``size``: fairseq's ``num_tokens`` of a row (GEC-CL: max(source, the whole target line with
    negatives))."""
    examples, negatives = batch
    groups = token_groups([size(ex, negs) for ex, negs in zip(examples, negatives, strict=True)], max_tokens)
    rng.shuffle(groups)
    return [([examples[i] for i in g], [negatives[i] for i in g]) for g in groups]


def shard(examples: Sequence[T], rank: int, world_size: int) -> list[T]:
    """Every ``world_size``-th example, padded by wrap-around so every rank has as many (DistributedSampler):
    ranks must take the same number of steps, or the gradient all-reduce waits forever. Padding copies get
    their own id (``#pad``), so every id of an epoch is unique across ranks (examples are dataclasses with an
    ``id``)."""
    per_rank = math.ceil(len(examples) / world_size)
    pad = [replace(ex, id=f"{ex.id}{PAD}") for ex in examples[: per_rank * world_size - len(examples)]]  # type: ignore[type-var, attr-defined]
    return [*examples, *pad][rank::world_size]


def sourced(
    source: Any,
    epoch: int,
    start: int,
    model: Any,
    *,
    max_tokens: int = 0,
    size: Callable[[Any, list[str]], int] | None = None,
    rng: random.Random | None = None,
) -> Iterator[Batch | Call]:
    """An epoch's batches of examples and their negatives: the source's pools (from the ``start``-th example),
    each with the negatives the source gives for its example ids at the weight version it holds, cut by a token
    budget (``max_tokens``: :func:`token_batches` with ``size`` and ``rng``) or whole; the source's calls (a
    weight publication) pass through where they come."""
    for pool in source.pools(epoch, start, model):
        if isinstance(pool, Call):
            yield pool
            continue
        both = (pool, source.negatives([ex.id for ex in pool], source.version))
        if max_tokens:
            assert size is not None and rng is not None, (
                "a token budget cuts by each row's size, in a seeded order"
            )
            yield from map(Batch, token_batches(both, max_tokens=max_tokens, size=size, rng=rng))
        else:
            yield Batch(both)


def row_batches(
    pools: Iterable[Batch | Call], batch_size: int, *, done: int, take: Callable[[Any, Any], Any | None]
) -> Iterator[Batch | Call]:
    """:func:`sourced`'s pools re-cut across pools into batches of ``batch_size`` rows (fairseq's
    ``--batch-size``; the last one shorter), each an ``(examples, negatives)`` of the rows ``take(example,
    negatives)`` keeps (None: the row is skipped; else the negatives it trains on) and carrying the epoch's
    position after it (``progress["done"]``: rows consumed, ``done`` of them before the first); the source's
    calls pass through where they come."""
    rows: list[tuple[Any, Any]] = []
    for pool in pools:
        if isinstance(pool, Call):
            yield pool
            continue
        for example, negatives in zip(*pool.data, strict=True):
            done += 1
            if (kept := take(example, negatives)) is not None:
                rows.append((example, kept))
            if len(rows) == batch_size:
                yield Batch(([r[0] for r in rows], [r[1] for r in rows]), progress={"done": done})
                rows = []
    if rows:
        yield Batch(([r[0] for r in rows], [r[1] for r in rows]), progress={"done": done})
