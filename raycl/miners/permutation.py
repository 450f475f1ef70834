"""Coherence hard negatives: rank an item's candidate permutations by the current model (docs/mining.md).

For each item, score its first ``num_rank`` candidate negative documents (the pickle's ``negs``, permutations
of ``pos``) with the scorer, in eval mode without gradients, sort them by f descending (highest = hardest,
ties keep candidate order) and keep the top ``num_negs``. Items with fewer than ``num_negs`` candidates get no
negatives; the trainer skips them, as the released code does. Scoring is batched across items.

A negative document crosses process boundaries as one string: its sentences joined with "\\n"
(``encode_doc`` / ``decode_doc``).

References: Jwalapuram, Joty & Lin (ACL 2022) §3.4 and Algorithm 1 (hard negative mining; 50 ranked, top 5).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from raycl.miners.base_miner import BaseMiner
from raycl.miners.records import MinedNegatives
from raycl.miners.registry import load_module, register_miner

if TYPE_CHECKING:
    from raycl.models.coherence import CoherenceScorer

SENTENCE_SEP = "\n"


class CoherenceItemLike(Protocol):
    """What the miner reads of a ``raycl.data.coherence.CoherenceItem``: its id and candidate negatives."""

    @property
    def id(self) -> str: ...

    @property
    def negs(self) -> Sequence[Sequence[str]]: ...


def encode_doc(sentences: Sequence[str]) -> str:
    """One string for a document: its sentences joined with "\\n" (no sentence may contain one)."""
    if any(SENTENCE_SEP in s for s in sentences):
        raise ValueError("a sentence contains a newline; documents are encoded one sentence per line")
    return SENTENCE_SEP.join(sentences)


def decode_doc(text: str) -> tuple[str, ...]:
    """The sentences of an ``encode_doc`` string."""
    return tuple(text.split(SENTENCE_SEP))


class PermutationMiner(BaseMiner[CoherenceItemLike, MinedNegatives]):
    """Keeps the ``num_negs`` highest-scoring of each item's first ``num_rank`` candidate negatives.

    Args:
        scorer: the current main model (a ``CoherenceScorer``: anything with ``score_documents``).
        num_rank: candidates ranked per item (paper: 50).
        num_negs: negatives kept per item (paper: 5).
        batch_size: documents per scoring batch (across items).

    Returns (``mine``): one ``MinedNegatives`` per item, in order.
    Degenerate case: num_rank = num_negs keeps every ranked candidate, only reordered by score.
    """

    def __init__(
        self,
        scorer: CoherenceScorer,
        *,
        num_rank: int = 50,
        num_negs: int = 5,
        batch_size: int = 16,
        precision: str = "fp32",
    ) -> None:
        super().__init__(scorer, precision=precision)
        if num_negs < 1 or num_rank < num_negs:
            raise ValueError(f"need 1 ≤ num_negs ≤ num_rank, got num_negs={num_negs}, num_rank={num_rank}")
        self.scorer = scorer
        self.num_rank, self.num_negs, self.batch_size = num_rank, num_negs, batch_size

    def _mine(self, examples: Sequence[CoherenceItemLike]) -> list[MinedNegatives]:
        pools = [list(item.negs[: self.num_rank]) if len(item.negs) >= self.num_negs else [] for item in examples]
        flat = [doc for pool in pools for doc in pool]
        scores = self.scorer.score_documents(flat, batch_size=self.batch_size).tolist() if flat else []  # (Σ n_i,)
        results, start = [], 0
        for item, pool in zip(examples, pools, strict=True):
            item_scores = scores[start : start + len(pool)]
            start += len(pool)
            # sorted() is stable: tied candidates keep their order in the item
            order = sorted(range(len(pool)), key=lambda j: -item_scores[j])[: self.num_negs]
            results.append(
                MinedNegatives(
                    id=item.id,
                    negatives=tuple(encode_doc(pool[j]) for j in order),
                    scores=tuple(float(item_scores[j]) for j in order),
                )
            )
        return results


def build_permutation_miner(model_path: str, options: dict[str, Any]) -> PermutationMiner:
    """A ``coherence_rank`` miner in an actor: the scorer from ``model_path`` on ``options["device"]``."""
    from raycl.models.coherence import CoherenceScorer

    opts = dict(options)
    device = opts.pop("device", "cpu")
    return PermutationMiner(CoherenceScorer.from_pretrained(model_path, device=device), **opts)


COHERENCE_RANK = register_miner("coherence_rank", build=build_permutation_miner, load=load_module)
