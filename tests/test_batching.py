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


# ------------------------------------------------------------------------------------------ mutate-units' gaps
def _naive_token_updates(
    n: int, sizes: list[int], *, batch_size: int, world: int, seed: int, max_tokens: int, epochs: int, freq: int
) -> int:
    """Every rank's own plan cut by the token budget, the most batches of any rank an epoch, ⌈· / freq⌉ summed."""
    total = 0
    for epoch in range(epochs):
        most = 0
        for rank in range(world):
            plan = BatchPlan([n], batch_size=batch_size, seed=seed, rank=rank, world_size=world)
            plan.set_epoch(epoch)
            most = max(
                most, sum(len(token_groups([sizes[i] for i in rows], max_tokens)) for (rows,) in plan.batches())
            )
        total += -(-most // freq)
    return total


@pytest.mark.parametrize("case", range(40))
def test_token_budget_updates_are_every_ranks_cut_batches(case: int) -> None:
    """``BatchPlan.updates(sizes=, max_tokens=)`` (GEC's schedule under fairseq's --max-tokens) against each rank's
    plan cut by the budget and counted by hand — sizes, budget, epochs and update_freq each matter."""
    rng = random.Random(case)
    n, batch_size, world = rng.randint(1, 30), rng.randint(1, 6), rng.randint(1, 3)
    sizes = [rng.randint(1, 12) for _ in range(n)]
    max_tokens, epochs, freq, seed = rng.randint(6, 40), rng.randint(1, 3), rng.randint(1, 3), rng.randint(0, 9)
    plan = BatchPlan([n], batch_size=batch_size, seed=seed, world_size=world)
    got = plan.updates(epochs, freq, sizes=sizes, max_tokens=max_tokens)
    assert got == _naive_token_updates(
        n, sizes, batch_size=batch_size, world=world, seed=seed, max_tokens=max_tokens, epochs=epochs, freq=freq
    )


def test_sourced_pairs_each_pool_with_its_negatives_and_passes_calls_through() -> None:
    """``sourced``: the source's pools from ``start`` with the negatives it gives for their ids at its version;
    whole, or cut by the token budget in the seeded shuffled order of ``token_batches``; a Call as it comes."""
    from dataclasses import dataclass

    from raycl.training.batching import sourced, token_batches
    from raycl.training.prefetch import Call

    @dataclass(frozen=True)
    class Ex:
        id: str
        n: int

    call = Call(lambda: None)
    pools = [[Ex("a", 3), Ex("b", 9)], [Ex("c", 1), Ex("d", 4), Ex("e", 2)]]

    class Source:
        version = 7
        asked: list[tuple[Any, ...]] = []

        def pools(self, epoch: int, start: int, model: Any) -> Any:
            self.asked.append(("pools", epoch, start, model))
            yield pools[0]
            yield call
            yield pools[1]

        def negatives(self, ids: list[str], version: int) -> list[list[str]]:
            self.asked.append(("negatives", tuple(ids), version))
            return [[f"{i}-{version}"] * (len(i) + k) for k, i in enumerate(ids)]

    src = Source()
    whole = list(sourced(src, 2, 5, "model"))
    assert src.asked == [("pools", 2, 5, "model"), ("negatives", ("a", "b"), 7), ("negatives", ("c", "d", "e"), 7)]
    assert whole[1] is call and [b.data for b in (whole[0], whole[2])] == [
        (pools[0], src.negatives(["a", "b"], 7)),
        (pools[1], src.negatives(["c", "d", "e"], 7)),
    ]
    size = lambda ex, negs: ex.n + len(negs)  # noqa: E731
    cut = list(sourced(Source(), 0, 0, None, max_tokens=10, size=size, rng=random.Random(3)))
    want_rng = random.Random(3)
    want = [
        *token_batches((pools[0], src.negatives(["a", "b"], 7)), max_tokens=10, size=size, rng=want_rng),
        call,
        *token_batches((pools[1], src.negatives(["c", "d", "e"], 7)), max_tokens=10, size=size, rng=want_rng),
    ]
    assert [b if b is call else b.data for b in cut] == want and len(cut) > len(whole)
    for half in ({}, {"size": size}, {"rng": random.Random(3)}):  # a budget needs both
        with pytest.raises(AssertionError, match=r"^a token budget cuts by each row's size, in a seeded order$"):
            list(sourced(Source(), 0, 0, None, max_tokens=10, **half))  # type: ignore[arg-type]


def test_a_plans_defaults_are_one_rank_from_epoch_0() -> None:
    """A plan made without rank and world size is rank 0 of 1, at epoch 0's first batch; no loader is refused."""
    plan = BatchPlan([7], batch_size=3, seed=2)
    assert plan.state_dict() == {"epoch": 0, "start": 0}
    first = next(iter(plan))
    order = random.Random(2 * 1000).sample(range(7), 7)  # epoch 0 draws from seed × 1000, "sample" by default
    assert first == (order[:3],) and len(plan) == 3 and plan.state_dict() == {"epoch": 0, "start": 1}
    with pytest.raises(ValueError, match="needs loaders"):
        BatchPlan([], batch_size=3, seed=2)
    from raycl.training.batching import draw_order

    assert draw_order(7, random.Random(2 * 1000)) == order  # draw_order's own default draw is "sample" too


@pytest.mark.parametrize("min_rows", [None, 0, 1, 2, 3])
def test_global_batches_in_counts_what_shares_cuts(min_rows: int | None) -> None:
    """The count of global batches against :func:`shares`' own cut (rank 0 has a row of every global batch), the
    default ``min_rows`` (1) included, and a last batch of 0 rows never counted."""
    from raycl.training.batching import shares

    for rows, batch_size, world in itertools.product(range(0, 13), (1, 2, 3), (1, 2)):
        kw = {} if min_rows is None else {"min_rows": min_rows}
        cut = shares(list(range(rows)), batch_size=batch_size, rank=0, world_size=world, **kw)
        assert global_batches_in(rows, batch_size=batch_size, world_size=world, **kw) == len(cut), (rows, kw)
