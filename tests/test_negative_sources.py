"""The one negative source a worker holds: what the driver names (``cfg.mining.source``), what a worker opens from
it (``open_source``), and what each source gives when asked for a pool's negatives by id and weight version —
coherence's own permutations from a resumed position, the shared n-best's selections in the plan's order (the live
stream's, on a real local Ray: tests/test_stream_source.py)."""

from __future__ import annotations

import dataclasses

import pytest

from raycl.config.tasks.coherence import CoherenceMiningSection
from raycl.config.tasks.gec import GecMiningSection
from raycl.data.coherence import CoherenceItem
from raycl.data.gec import GecExample
from raycl.distributed.session import open_source
from raycl.miners.sources import LiveStream, Permutations, PreMined, SharedNBest
from raycl.training.negatives import NBestNegatives, PermutationNegatives, Place, StaticNegatives

STREAM, STORE, NBEST = object(), object(), object()  # what the driver holds: actor handles, opaque to the config


def test_the_gec_mining_section_names_the_source_the_driver_has() -> None:
    m = GecMiningSection(
        k=2,
        source_negative=False,
        refill=True,
        false_negatives="drop",
        max_staleness=1,
        sync_every=5,
        refresh_every=2,
        negatives="/data/negs.parquet",
    )
    assert m.source(nbest=NBEST) == SharedNBest(
        NBEST, k=2, source_negative=False, refill=True, false_negatives="drop"
    )
    assert m.source(stream=STREAM, store=STORE) == LiveStream(
        STREAM, STORE, max_staleness=1, sync_every=5, refresh_every=2
    )
    assert m.source() == PreMined("/data/negs.parquet", drop_false_negatives=True)
    assert dataclasses.replace(m, false_negatives="keep").source() == PreMined("/data/negs.parquet")
    assert GecMiningSection().source() is None  # nothing mined or pre-mined: a worker that needs some says so


def test_the_coherence_mining_section_names_its_permutations() -> None:
    m = CoherenceMiningSection(rank_every=3, max_staleness=1)
    assert m.source() == Permutations(3, max_staleness=1)
    assert m.source(stream=STREAM, store=STORE) == Permutations(3, 1, STREAM, STORE)


def _items(n: int) -> list[CoherenceItem]:
    return [CoherenceItem(f"d{i}", (f"s{i}",), ((f"n{i}a",), (f"n{i}b",))) for i in range(n)]


def test_coherence_items_train_on_their_own_permutations_from_where_a_checkpoint_left_off() -> None:
    items = _items(5)
    shards = [items[0::2], items[1::2]]
    source = open_source(CoherenceMiningSection(rank_every=2).source(), Place(1, 2, items, shards, 1))
    assert isinstance(source, PermutationNegatives) and source.version == 0 and source.read_ahead
    pools = list(source.pools(0, 1, None))  # type: ignore[arg-type]  # rank 1's second item onwards
    assert pools == [[items[3]]]
    assert source.negatives(["d3"], 0) == [[("n3a",), ("n3b",)]]
    # no stream: no wait, no ledger (the loop still reports the trainer's wait, as for every source)
    assert source.metrics() == {"timing/mine_wait": 0.0, "timing/mine_wait_first": 0.0}
    assert source.state() == {"version": 0, "ledger": None} and source.ledger_state(0, [1, 1]) is None
    source.resume({"version": 4, "ledger": {"epoch": 0}}, None)  # type: ignore[arg-type]  # no stream: nothing moves
    assert source.version == 0 and list(source.pools(1, 0, None)) == [[items[1], items[3]]]  # type: ignore[arg-type]


def test_a_source_no_worker_opens_is_named() -> None:
    @dataclasses.dataclass(frozen=True)
    class Dense:
        index: str

    with pytest.raises(TypeError, match="^no negative source opens Dense: add it to open_source$"):
        open_source(Dense("x"), Place(0, 1, [], [[]], 1))  # type: ignore[arg-type]


def test_sources_known_ahead_are_opened_with_the_plan() -> None:
    exs = [GecExample(f"f:{i}", f"s{i}", f"t{i}") for i in range(3)]
    at = Place(0, 1, exs, [exs], 2, plan=lambda epoch: [[1, 2], [0]])
    nbest = open_source(GecMiningSection(k=1).source(nbest=NBEST), at)
    assert isinstance(nbest, NBestNegatives) and nbest.plan(0) == [[1, 2], [0]] and nbest.batch_size == 2
    nbest.selected = {ex.id: [f"{ex.id}-neg"] for ex in exs}  # every list in: the plan's order, no wait
    assert [[ex.id for ex in p] for p in nbest.pools(0, 0, None)] == [["f:1", "f:2"], ["f:0"]]  # type: ignore[arg-type,union-attr]
    assert nbest.negatives(["f:1", "f:2#pad"], 0) == [["f:1-neg"], ["f:2-neg"]]
    assert nbest.metrics()["stream/negatives"] == 2.0 and nbest.version == 0
    assert isinstance(open_source(None, at), StaticNegatives)
