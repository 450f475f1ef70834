"""PermutationMiner (the paper's Algorithm 1): ranking equals a naive per-candidate loop, top-N, ties, skips."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from raycl.miners.permutation import (
    PermutationMiner,
    build_permutation_miner,
    decode_doc,
    encode_doc,
)
from raycl.miners.records import MinedNegatives
from raycl.models.coherence import CoherenceScorer
from raycl.models.coherence_presets import build_coherence_model


@dataclass(frozen=True)
class Item:
    """The contract's ``CoherenceItem``: a coherent document and candidate negative documents."""

    id: str
    pos: tuple[str, ...]
    negs: tuple[tuple[str, ...], ...]


DOC = ("Anna bought a bike .", "It was red .", "She rode it to work .", "Her boss liked it .", "Then it rained .")


def _permutations(doc: tuple[str, ...], n: int, skip: int = 0) -> tuple[tuple[str, ...], ...]:
    perms = (p for p in itertools.permutations(doc) if p != doc)
    return tuple(itertools.islice(perms, skip, skip + n))


class FixedScorer(nn.Module):
    """Scores a document by a lookup table; records each ``score_documents`` call."""

    def __init__(self, table: dict[tuple[str, ...], float]) -> None:
        super().__init__()
        self.table, self.calls = table, list[tuple[int, bool, bool]]()
        self.batch_sizes: list[int] = []
        self.anchor = nn.Parameter(torch.zeros(1))  # BaseMiner toggles train/eval on a real module

    def score_documents(self, docs: Sequence[Sequence[str]], *, batch_size: int = -1) -> torch.Tensor:
        self.calls.append((len(docs), torch.is_grad_enabled(), self.training))
        self.batch_sizes.append(batch_size)
        return torch.tensor([self.table[tuple(d)] for d in docs], dtype=torch.float64)


Ranked = list[tuple[tuple[str, ...], float]]


def _naive(scorer: CoherenceScorer | FixedScorer, item: Item, num_rank: int, num_negs: int) -> Ranked:
    """Score every candidate alone, then pick the top num_negs by repeatedly taking the first maximum."""
    if len(item.negs) < num_negs:
        return []
    pool = list(item.negs[:num_rank])
    scores = [float(scorer.score_documents([doc])[0]) for doc in pool]
    chosen: Ranked = []
    while len(chosen) < num_negs:
        best = 0
        for j in range(1, len(pool)):
            if scores[j] > scores[best]:
                best = j
        chosen.append((pool.pop(best), scores.pop(best)))
    return chosen


def test_encode_decode_doc_round_trip() -> None:
    assert decode_doc(encode_doc(DOC)) == DOC
    with pytest.raises(ValueError, match="^a sentence contains a newline"):
        encode_doc(("one\ntwo",))


def test_top_n_order_ties_and_skips() -> None:
    negs = _permutations(DOC, 8)
    values = [0.1, 0.9, 0.5, 0.9, -1.0, 0.5, 0.3, 2.0]  # ties at 0.9 (1, 3) and 0.5 (2, 5); 7 is beyond num_rank
    scorer = FixedScorer(dict(zip(negs, values, strict=True)))
    items = [Item("a", DOC, negs), Item("few", DOC, negs[:2]), Item("b", DOC, negs[2:7])]
    mined = PermutationMiner(scorer, num_rank=7, num_negs=3, batch_size=4).mine(items)
    assert [m.id for m in mined] == ["a", "few", "b"]
    assert mined[0] == MinedNegatives("a", tuple(encode_doc(negs[j]) for j in (1, 3, 2)), (0.9, 0.9, 0.5))
    assert mined[1] == MinedNegatives("few", (), ())  # < num_negs candidates: skipped, as the code does
    assert [decode_doc(n) for n in mined[2].negatives] == [negs[3], negs[2], negs[5]]
    # one scoring call across items, in eval mode without gradients; the skipped item is not scored
    assert scorer.calls == [(7 + 5, False, False)]
    for item, result in zip(items, mined, strict=True):
        assert [(decode_doc(n), f) for n, f in zip(result.negatives, result.scores, strict=True)] == _naive(
            scorer, item, 7, 3
        )


def test_an_item_with_exactly_num_negs_candidates_gets_them_all() -> None:
    negs = _permutations(DOC, 4)
    scorer = FixedScorer(dict(zip(negs, [0.2, 0.7, 0.1, 0.4], strict=True)))
    items = [Item("exact", DOC, negs[:3]), Item("one_short", DOC, negs[:2]), Item("more", DOC, negs)]
    mined = PermutationMiner(scorer, num_rank=3, num_negs=3).mine(items)
    # exactly num_negs candidates: all three kept, reordered by score; one fewer: none; more: the first num_rank
    assert [decode_doc(n) for n in mined[0].negatives] == [negs[1], negs[0], negs[2]]
    assert mined[0].scores == (0.7, 0.2, 0.1)
    assert mined[1] == MinedNegatives("one_short", (), ())
    assert mined[2] == MinedNegatives("more", mined[0].negatives, mined[0].scores)
    assert scorer.calls == [(6, False, False)] and scorer.batch_sizes == [16]  # the miner's default batch size
    # num_rank = num_negs = 1 (the smallest miner) keeps the best candidate of the first one
    assert PermutationMiner(scorer, num_rank=1, num_negs=1).mine([Item("1", DOC, negs)])[0].scores == (0.2,)
    nothing = FixedScorer({})
    assert PermutationMiner(nothing, num_rank=2, num_negs=2).mine([Item("x", DOC, negs[:1])]) == [
        MinedNegatives("x", (), ())
    ]
    assert PermutationMiner(nothing, num_rank=2, num_negs=2).mine([]) == []
    assert nothing.calls == []  # nothing to rank: the scorer is not called


def test_the_papers_defaults_and_the_scoring_batch_size() -> None:
    scorer = FixedScorer(dict(zip(_permutations(DOC, 12), range(12), strict=True)))
    miner = PermutationMiner(scorer)
    assert (miner.num_rank, miner.num_negs, miner.batch_size, miner.precision) == (50, 5, 16, "fp32")
    assert PermutationMiner(scorer, precision="bf16").precision == "bf16"
    PermutationMiner(scorer, num_rank=12, num_negs=2, batch_size=5).mine([Item("a", DOC, _permutations(DOC, 12))])
    assert scorer.batch_sizes == [5]


def test_scorer_mode_is_restored() -> None:
    scorer = FixedScorer({n: 0.0 for n in _permutations(DOC, 5)})
    scorer.train()
    PermutationMiner(scorer, num_rank=5, num_negs=5).mine([Item("a", DOC, _permutations(DOC, 5))])
    assert scorer.training


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_coherence_model("smoke", tmp_path_factory.mktemp("miner"), texts=list(DOC) * 10)


@pytest.fixture(scope="module")
def smoke_scorer(smoke_dir: Path) -> CoherenceScorer:
    return CoherenceScorer.from_pretrained(smoke_dir).double()


def test_a_miner_built_from_a_model_folder_takes_its_options(smoke_dir: Path) -> None:
    options = {"num_rank": 6, "num_negs": 2, "batch_size": 4, "device": "cpu"}
    miner = build_permutation_miner(str(smoke_dir), options)
    assert (miner.num_rank, miner.num_negs, miner.batch_size) == (6, 2, 4) and options["device"] == "cpu"
    assert isinstance(miner.scorer, CoherenceScorer) and next(miner.scorer.parameters()).device.type == "cpu"
    item = Item("x", DOC, _permutations(DOC, 7))
    direct = PermutationMiner(CoherenceScorer.from_pretrained(smoke_dir), num_rank=6, num_negs=2).mine([item])
    assert miner.mine([item]) == direct  # the folder's weights
    assert build_permutation_miner(str(smoke_dir), {"num_negs": 1}).num_negs == 1  # no device: the CPU
    on_meta = build_permutation_miner(str(smoke_dir), {"device": "meta"})  # a device of its own: the one asked
    assert next(on_meta.scorer.parameters()).device.type == "meta"


def test_ranking_equals_naive_loop_with_real_scorer(smoke_scorer: CoherenceScorer) -> None:
    items = [Item("x", DOC, _permutations(DOC, 9)), Item("y", DOC[:4], _permutations(DOC[:4], 7))]
    mined = PermutationMiner(smoke_scorer, num_rank=6, num_negs=3, batch_size=4).mine(items)  # mixed batches
    for item, result in zip(items, mined, strict=True):
        naive = _naive(smoke_scorer, item, 6, 3)
        assert [decode_doc(n) for n in result.negatives] == [doc for doc, _ in naive]
        assert list(result.scores) == pytest.approx([f for _, f in naive], abs=1e-9)
        assert list(result.scores) == sorted(result.scores, reverse=True)


def test_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match=r"^need 1 ≤ num_negs ≤ num_rank, got num_negs=5, num_rank=3$"):
        PermutationMiner(FixedScorer({}), num_rank=3, num_negs=5)
    with pytest.raises(ValueError):
        PermutationMiner(FixedScorer({}), num_rank=3, num_negs=0)
    PermutationMiner(FixedScorer({}), num_rank=3, num_negs=3)  # the bounds themselves are fine
    PermutationMiner(FixedScorer({}), num_rank=1, num_negs=1)
