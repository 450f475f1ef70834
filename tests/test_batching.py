"""The one batch plan (``raycl.training.batching``) against the three epoch cutters it replaced, kept here as
they were written (GEC's ``global_batches``, idiom's and STS's ``epoch_batches``): the same batches, in the same
order, from the same random draws — so no recipe's results move — and a length that is the count of a dry run."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import pytest

from raycl.training.batching import BatchPlan, Loader, global_batches, global_batches_in, token_groups
from raycl.training.task import LoopSettings, updates_in


def gec_reference(n: int, *, batch_size: int, seed: int, rank: int, world_size: int) -> list[list[int]]:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    size = batch_size * world_size
    shares = (order[i : i + size][rank::world_size] for i in range(0, n, size))
    return [s for s in shares if s]


def idiom_reference(n: int, *, batch_size: int, seed: int, rank: int, world_size: int) -> list[list[int]]:
    order = random.Random(seed).sample(range(n), n)
    size = batch_size * world_size
    return [order[i : i + size][rank::world_size] for i in range(0, n, size)]


def sts_reference(
    pairs: list[Any], sentences: list[str], *, batch_size: int, seed: int, rank: int, world_size: int
) -> list[tuple[list[Any], list[str]]]:
    rng = random.Random(seed)
    pairs, sentences = rng.sample(pairs, len(pairs)), rng.sample(sentences, len(sentences))
    size = batch_size * world_size
    pb = [pairs[i : i + size][rank::world_size] for i in range(0, len(pairs), size)]
    if not sentences:
        return [(b, []) for b in pb]
    chunks = (sentences[i : i + size] for i in range(0, len(sentences), size))
    sb = [c[rank::world_size] for c in chunks if len(c) >= 2 * world_size]
    return list(zip(pb, sb, strict=False))


CASES = list(itertools.product([0, 1, 5, 23, 101], [1, 4], [1, 2, 3], [7]))  # n, batch, world, seed


@pytest.mark.parametrize(("n", "bs", "ws", "seed"), CASES)
def test_the_plan_cuts_every_epoch_as_the_three_cutters_did(n: int, bs: int, ws: int, seed: int) -> None:
    for epoch, rank in itertools.product(range(3), range(ws)):
        s = seed * 1000 + epoch
        gec = BatchPlan([n], batch_size=bs, seed=seed, rank=rank, world_size=ws, draw="shuffle", keep_empty=False)
        gec.set_epoch(epoch)
        assert [b for (b,) in gec] == gec_reference(n, batch_size=bs, seed=s, rank=rank, world_size=ws)
        gec.set_epoch(epoch + 1, 1)  # rows(epoch): that epoch's batches from its first, wherever the plan stood
        assert gec.rows(epoch) == gec_reference(n, batch_size=bs, seed=s, rank=rank, world_size=ws)
        assert global_batches(n, batch_size=bs, seed=s, rank=rank, world_size=ws) == gec_reference(
            n, batch_size=bs, seed=s, rank=rank, world_size=ws
        )
        idiom = BatchPlan([n], batch_size=bs, seed=seed, rank=rank, world_size=ws)
        idiom.set_epoch(epoch)
        assert [b for (b,) in idiom] == idiom_reference(n, batch_size=bs, seed=s, rank=rank, world_size=ws)
        pairs = [(f"a{i}", f"b{i}", i / max(n, 1)) for i in range(n)]
        for sentences in ([], [x for a, b, _ in pairs for x in (a, b)]):
            loaders = [Loader(n), *([Loader(2 * n, min_rows=2 * ws)] if sentences else [])]
            sts = BatchPlan(loaders, batch_size=bs, seed=seed, rank=rank, world_size=ws)
            sts.set_epoch(epoch)
            got = [([pairs[i] for i in b[0]], [sentences[i] for i in b[1]] if sentences else []) for b in sts]
            assert got == sts_reference(pairs, sentences, batch_size=bs, seed=s, rank=rank, world_size=ws)


@pytest.mark.parametrize(("n", "bs", "ws", "seed"), CASES)
def test_coherences_shards_cut_into_batches_count_as_the_plans_global_batches(
    n: int, bs: int, ws: int, seed: int
) -> None:
    """Coherence trains rank r's items[r::W] in batches of B; its schedule counts the plan's global batches of W·B:
    the longest shard's batches."""
    longest = max(len(range(n)[r::ws]) for r in range(ws))
    assert len(BatchPlan([n], batch_size=bs, seed=seed, world_size=ws)) == math.ceil(longest / bs)


@pytest.mark.parametrize(("n", "bs", "ws", "seed"), CASES)
def test_the_length_is_the_most_batches_a_rank_has_without_a_dry_run(n: int, bs: int, ws: int, seed: int) -> None:
    for sentences in (False, True):
        loaders = [Loader(n), *([Loader(2 * n, min_rows=2 * ws)] if sentences else [])]
        for keep_empty in (True, False):
            plans = [
                BatchPlan(loaders, batch_size=bs, seed=seed, rank=r, world_size=ws, keep_empty=keep_empty)
                for r in range(ws)
            ]
            dry = max(len(p.batches()) for p in plans)  # what the recipes counted by cutting an epoch
            assert len(plans[0]) == dry, (loaders, keep_empty)
            assert plans[0].updates(3, 2) == updates_in([dry] * 3, 2)
    assert global_batches_in(n, batch_size=bs, world_size=ws, min_rows=2 * ws) == len(
        [c for c in range(0, n, bs * ws) if min(bs * ws, n - c) >= 2 * ws]
    )


def test_the_position_resumes_mid_epoch_and_is_in_the_state() -> None:
    plan = BatchPlan([23], batch_size=2, seed=4, rank=1, world_size=2)
    plan.set_epoch(2)
    whole = list(plan)
    assert plan.state_dict() == {"epoch": 2, "start": len(whole)}
    plan.set_epoch(2)
    first = list(itertools.islice(plan, 3))
    saved = plan.state_dict()
    assert saved == {"epoch": 2, "start": 3}
    resumed = BatchPlan([23], batch_size=2, seed=4, rank=1, world_size=2)
    resumed.load_state_dict(saved)
    assert first + list(resumed) == whole
    plan.set_epoch(3)
    assert list(plan) != whole  # another epoch, another order


def test_token_batch_counts_are_the_token_groups_of_each_ranks_shares() -> None:
    rng = random.Random(0)
    sizes = [rng.randint(1, 12) for _ in range(37)]
    for ws in (1, 2, 3):
        plan = BatchPlan([37], batch_size=4, seed=5, rank=0, world_size=ws, draw="shuffle", keep_empty=False)
        want = [
            max(
                sum(
                    len(token_groups([sizes[i] for i in pool], 16))
                    for pool in gec_reference(37, batch_size=4, seed=5 * 1000 + e, rank=r, world_size=ws)
                )
                for r in range(ws)
            )
            for e in range(3)
        ]
        assert plan.token_batch_counts(sizes, 16, 3) == want


def test_compiled_shapes_are_padded_in_one_place() -> None:
    assert LoopSettings().pad_to_multiple_of is None  # eager: each batch its own longest
    assert LoopSettings(compile=True).pad_to_multiple_of == 16
    assert LoopSettings(compile=True, shape_bucket=8).pad_to_multiple_of == 8


def test_a_plan_without_rows_or_with_a_bad_size_is_refused() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        BatchPlan([5], batch_size=0, seed=1)
    with pytest.raises(ValueError, match="draw"):
        BatchPlan([5], batch_size=1, seed=1, draw="sorted").batches()
