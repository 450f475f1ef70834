"""Token-budget batching and the static negative source's pools, against rules written out here: a budget met
exactly, the last short global batch, padding copies, every rank's share of one shuffle."""

from __future__ import annotations

import dataclasses
import random

import pytest

from raycl.data.gec import GecExample
from raycl.distributed.session import open_source
from raycl.training.batching import global_batches, row_batches, shard, token_batches, token_groups
from raycl.training.negatives import Place, StaticNegatives
from raycl.training.prefetch import Call
from raycl.training.task import Batch


def _naive_groups(sizes: list[int], max_tokens: int) -> list[list[int]]:
    """Sorted by size (ties by index); a group grows while its count × its largest size fits the budget."""
    out: list[list[int]] = []
    for i in sorted(range(len(sizes)), key=lambda j: (sizes[j], j)):
        if out and (len(out[-1]) + 1) * max(sizes[j] for j in [*out[-1], i]) <= max_tokens:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def test_a_budget_met_exactly_fills_the_group() -> None:
    assert token_groups([3, 3, 3, 3], 9) == [[0, 1, 2], [3]]  # 3 × 3 = 9 tokens: within the budget
    assert token_groups([3, 3, 3, 3], 8) == [[0, 1], [2, 3]]
    assert token_groups([2, 4], 8) == [[0, 1]]  # 2 × 4 = 8, the larger size counts
    assert token_groups([5, 1, 4], 8) == [[1, 2], [0]]  # sorted: 1, 4 (2 × 4 = 8) then 5 alone
    assert token_groups([], 8) == []


def test_a_sentence_longer_than_the_budget_is_a_batch_of_its_own() -> None:
    assert token_groups([20, 1, 1], 8) == [[1, 2], [0]]
    assert token_groups([9, 9], 8) == [[0], [1]]


def test_groups_equal_the_naive_rule_on_random_sizes() -> None:
    rng = random.Random(0)
    for _ in range(200):
        sizes = [rng.randint(1, 12) for _ in range(rng.randint(1, 15))]
        budget = rng.randint(1, 40)
        assert token_groups(sizes, budget) == _naive_groups(sizes, budget), (sizes, budget)


def _examples(n: int) -> list[GecExample]:
    return [GecExample(f"f:{i}", f"src {i}", "t " * (i + 1)) for i in range(n)]


def test_token_batches_keep_examples_with_their_negatives_in_a_seeded_order() -> None:
    exs = _examples(6)
    negs = [[f"n{i}"] * (i % 3) for i in range(6)]
    size = lambda ex, ng: len(ex.target.split()) + len(ng)  # noqa: E731 – 1+0, 2+1, 3+2, 4+0, 5+1, 6+2
    got = token_batches((exs, negs), max_tokens=10, size=size, rng=random.Random(3))
    groups = token_groups([size(e, n) for e, n in zip(exs, negs, strict=True)], 10)
    random.Random(3).shuffle(groups)
    assert got == [([exs[i] for i in g], [negs[i] for i in g]) for g in groups]
    assert len(got) > 1 and sorted(ex.id for b, _ in got for ex in b) == sorted(ex.id for ex in exs)
    with pytest.raises(ValueError):  # examples and their negatives, one to one
        token_batches((exs, negs[:-1]), max_tokens=10, size=size, rng=random.Random(3))


@pytest.mark.parametrize(("n", "world"), [(7, 2), (6, 3), (1, 2), (5, 1)])
def test_shard_pads_by_wrapping_around_with_their_own_ids(n: int, world: int) -> None:
    exs = _examples(n)
    per_rank = -(-n // world)
    padded = [*exs, *[GecExample(e.id + "#pad", e.source, e.target) for e in exs][: per_rank * world - n]]
    shards = [shard(exs, r, world) for r in range(world)]
    assert shards == [padded[r::world] for r in range(world)]
    assert {len(s) for s in shards} == {per_rank}
    ids = [e.id for s in shards for e in s]
    assert len(ids) == len(set(ids))


def test_global_batches_are_strided_shares_of_one_shuffle() -> None:
    order = list(range(11))
    random.Random(5).shuffle(order)
    # world 2, batch 2: global batches of 4 from the shuffle, the last one short (3 left)
    assert global_batches(11, batch_size=2, seed=5, rank=0, world_size=2) == [
        order[0:4:2],
        order[4:8:2],
        order[8:11:2],
    ]
    assert global_batches(11, batch_size=2, seed=5, rank=1, world_size=2) == [
        order[1:4:2],
        order[5:8:2],
        order[9:11:2],
    ]
    # one example left for 2 ranks: rank 1's share of the last global batch is empty, and left out
    assert global_batches(5, batch_size=2, seed=5, rank=1, world_size=2)[-1] != []
    assert len(global_batches(5, batch_size=2, seed=5, rank=0, world_size=2)) == 2
    assert len(global_batches(5, batch_size=2, seed=5, rank=1, world_size=2)) == 1
    assert global_batches(0, batch_size=2, seed=5, rank=0, world_size=1) == []


def _static(
    exs: list[GecExample],
    negatives: dict[str, list[str]],
    *,
    batch_size: int,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
) -> StaticNegatives[GecExample]:
    """Pre-mined negatives in the GEC recipe's plan: this rank's share of each epoch's seeded global batches."""

    def plan(epoch: int) -> list[list[int]]:
        return global_batches(
            len(exs), batch_size=batch_size, seed=seed * 1000 + epoch, rank=rank, world_size=world_size
        )

    return StaticNegatives(exs, negatives, plan)


def _asked(source: StaticNegatives[GecExample], epoch: int) -> list[tuple[list[GecExample], list[list[str]]]]:
    """Each pool of ``epoch`` with the negatives the source gives for its ids, as a worker asks for them."""
    return [
        (pool, source.negatives([ex.id for ex in pool], 0))
        for pool in source.pools(epoch, 0, None)  # type: ignore[arg-type]
        if not isinstance(pool, Call)
    ]


def test_static_negatives_carry_the_negatives_of_their_base_ids() -> None:
    exs = [*_examples(5), GecExample("f:0#pad", "src 0", "t ")]
    negatives = {"f:0": ["a", "b"], "f:3": ["c"]}
    feed = _static(exs, negatives, batch_size=2, seed=7, rank=1, world_size=2)
    got = _asked(feed, 3)
    idx = global_batches(6, batch_size=2, seed=7 * 1000 + 3, rank=1, world_size=2)
    assert [b for b, _ in got] == [[exs[i] for i in share] for share in idx]
    assert [n for _, n in got] == [[negatives.get(exs[i].id.removesuffix("#pad"), []) for i in s] for s in idx]
    assert _asked(feed, 4) != got  # another epoch, another shuffle
    one = _asked(_static(exs, negatives, batch_size=4, seed=7), 0)
    pairs = sorted((ex.id, ng) for chunk, negs in one for ex, ng in zip(chunk, negs, strict=True))
    assert pairs == [
        ("f:0", ["a", "b"]),
        ("f:0#pad", ["a", "b"]),
        ("f:1", []),
        ("f:2", []),
        ("f:3", ["c"]),
        ("f:4", []),
    ]  # a padding copy has its base example's negatives
    assert feed.metrics() == {"timing/mine_wait": 0.0, "timing/mine_wait_first": 0.0}
    assert feed.state() == {} and feed.version == 0 and feed.read_ahead
    feed.resume({"version": 3}, None)  # type: ignore[arg-type]  # mined once, by the base model: nothing moves
    feed.after_update(1, None)  # type: ignore[arg-type]
    assert feed.version == 0 and _asked(feed, 3) == got


def test_a_source_known_ahead_needs_the_plan_of_an_epoch() -> None:
    exs = _examples(3)
    at = Place(0, 1, exs, [exs], 2)
    with pytest.raises(ValueError, match=r"known ahead need the plan of an epoch's batches \(Place.plan\)"):
        open_source(None, at)
    source = open_source(None, dataclasses.replace(at, plan=lambda epoch: [[2, 0], [1]]))
    assert isinstance(source, StaticNegatives)
    assert [[ex.id for ex in pool] for pool in source.pools(0, 0, None)] == [["f:2", "f:0"], ["f:1"]]  # type: ignore[arg-type,union-attr]
    assert source.negatives(["f:2", "f:0"], 0) == [[], []]


def test_row_batches_cut_across_pools_skip_rows_and_carry_the_position() -> None:
    """Pools of 3, 4 and 2 rows (a call between the first two), rows with fewer than two negatives skipped, the
    rest trained on their first two; batches of 2 across pools, the last short; each batch's position is the rows
    of the epoch consumed after it (5 before the first: a resumed epoch), skipped ones counted."""
    rows = [(f"x{i}", [f"n{i}"] * (i % 3)) for i in range(9)]  # x0, x3, x6 have none; x1, x4, x7 one
    pools = [rows[:3], rows[3:7], rows[7:]]
    call = Call(print)
    stream = [Batch(([r[0] for r in pools[0]], [r[1] for r in pools[0]])), call]
    stream += [Batch(([r[0] for r in p], [r[1] for r in p])) for p in pools[1:]]

    def take(x: str, negs: list[str]) -> list[str] | None:
        return negs[:2] if len(negs) >= 2 else None

    got = list(row_batches(stream, 2, done=5, take=take))
    assert got[0] is call  # after the first pool's rows: they made no batch of 2 yet (x2 alone)
    batches = [b for b in got if isinstance(b, Batch)]
    kept = [(x, negs[:2]) for x, negs in rows if len(negs) >= 2]  # x2, x5, x8
    assert [list(zip(*b.data, strict=True)) for b in batches] == [kept[:2], kept[2:]]
    # a naive count: the position after a batch is 5 + the index (1-based) of its last row in the epoch
    last = [1 + next(i for i, r in enumerate(rows) if r[0] == b.data[0][-1]) for b in batches]
    assert [b.progress for b in batches] == [{"done": 5 + last[0]}, {"done": 5 + len(rows)}]


def test_row_batches_hand_take_each_row_s_own_example_and_refuse_a_pool_of_unequal_columns() -> None:
    """``take`` decides by the row's example as well as its negatives (here: only odd-numbered examples, each
    trained on its own name); a pool whose examples and negatives differ in number is an error, not a silent
    cut to the shorter."""

    def take(x: str, negs: list[str]) -> list[str] | None:
        return [f"{x}:{n}" for n in negs] if int(x[1:]) % 2 else None

    pool = Batch((["x0", "x1", "x2", "x3"], [["a"], ["b"], ["c"], ["d"]]))
    (batch,) = list(row_batches([pool], 8, done=0, take=take))
    assert batch.data == (["x1", "x3"], [["x1:b"], ["x3:d"]]) and batch.progress == {"done": 4}
    with pytest.raises(ValueError, match="zip"):
        list(row_batches([Batch((["x1", "x3"], [["b"]]))], 8, done=0, take=take))
