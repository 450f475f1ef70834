"""GEC batches built from tensors, for tests and benchmarks that make their own token ids (the product collates
examples: :func:`raycl.recipes.gec.step.collate`)."""

from __future__ import annotations

from torch import Tensor

from raycl.recipes.gec.step import GecBatch, _assemble


def batch_from_tensors(
    src_ids: Tensor,
    src_mask: Tensor,
    target_ids: Tensor,
    neg_ids: Tensor,
    n_neg: Tensor,
    *,
    pad_id: int,
    num_slots: int | None = None,
    pad_to_multiple_of: int = 1,
) -> GecBatch:
    """A batch from already tokenised CPU tensors: sources (B, S) with their mask, gold targets (B, T) and
    negatives (B, M, T') pad-filled, slot j of sentence i real iff j < n_neg[i] (the others are ignored)."""
    counts = [int(n) for n in n_neg.tolist()]
    sources = [
        [t for t, m in zip(row, mask, strict=True) if m]
        for row, mask in zip(src_ids.tolist(), src_mask.tolist(), strict=True)
    ]
    targets = [[t for t in row if t != pad_id] for row in target_ids.tolist()]
    negs = [
        [[t for t in neg if t != pad_id] for neg in slots[:c]]
        for slots, c in zip(neg_ids.tolist(), counts, strict=True)
    ]
    return _assemble(sources, targets, negs, pad_id=pad_id, num_slots=num_slots, multiple=pad_to_multiple_of)


def positives(batch: GecBatch) -> tuple[Tensor, Tensor, Tensor]:
    """The positives' sources (B, S₀), their mask and their gold targets (B, T₀), each at its own longest: the
    batch's sentences as a plain forward takes them."""
    b, sp = batch.num_sentences, batch.spans[0]
    return batch.row_src[:b, : sp.src_len], batch.row_src_mask[:b, : sp.src_len], batch.row_tgt[:b, : sp.tgt_len]
