"""One GEC-CL training step's loss: collate (source, target, negatives) and run the passes of SPEC §1.2.

Per batch: one teacher-forced pass on the positives (it gives CE and S_pos with one dropout mask), then
one full forward per negative slot j — encoder re-run, the model's current (train) mode, gradients
through the negatives — exactly as the released criterion does; or, with ``stack_negatives=True``, one
batched pass over every real (sentence, slot) pair, which is the same loss in eval mode and faster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from raycl.losses.gec_margin import GecContrastiveLoss, GecLossOutput

if TYPE_CHECKING:
    from raycl.data.gec import GecExample
    from raycl.models.seq2seq import Seq2SeqScorer


@dataclass(frozen=True)
class GecBatch:
    """A collated batch with negatives; filler slots (j ≥ n_i) hold pads and are never scored."""

    src_ids: Tensor  # (B, S)
    src_mask: Tensor  # (B, S)
    target_ids: Tensor  # (B, T) pad-filled
    neg_ids: Tensor  # (B, M, T') pad-filled; slot j of row i is real iff j < n_neg[i]
    n_neg: Tensor  # (B,) real negatives per sentence

    def to(self, device: torch.device | str) -> GecBatch:
        parts = (self.src_ids, self.src_mask, self.target_ids, self.neg_ids, self.n_neg)
        return GecBatch(*(t.to(device) for t in parts))


def collate(
    examples: Sequence[GecExample],
    negatives: Sequence[Sequence[str]],
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_length: int,
    num_slots: int | None = None,
) -> GecBatch:
    """Tokenise a batch; M = ``num_slots`` or the largest negative count in the batch."""
    if len(examples) != len(negatives):
        raise ValueError(f"{len(examples)} examples but {len(negatives)} negative lists")
    pad = int(tokenizer.pad_token_id)  # type: ignore[arg-type]
    opts = dict(padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    enc = tokenizer([e.source for e in examples], **opts)
    tgt = tokenizer([e.target for e in examples], **opts)["input_ids"]
    counts = [len(n) for n in negatives]
    M = max(counts, default=0) if num_slots is None else num_slots
    if max(counts, default=0) > M:
        raise ValueError(f"a sentence has {max(counts)} negatives but num_slots={M}")
    flat = [neg for negs in negatives for neg in negs]
    neg_ids = torch.full((len(examples), M, 1), pad, dtype=torch.long)  # (B, M, 1) all filler
    if flat:
        ids = tokenizer(flat, **opts)["input_ids"]
        neg_ids = torch.full((len(examples), M, ids.size(1)), pad, dtype=torch.long)  # (B, M, T')
        rows = torch.tensor([i for i, c in enumerate(counts) for _ in range(c)])
        slots = torch.tensor([j for c in counts for j in range(c)])
        neg_ids[rows, slots] = ids
    return GecBatch(enc["input_ids"], enc["attention_mask"], tgt, neg_ids, torch.tensor(counts, dtype=torch.long))


def gec_loss(
    scorer: Seq2SeqScorer, batch: GecBatch, loss_fn: GecContrastiveLoss, *, stack_negatives: bool = False
) -> GecLossOutput:
    """The GEC-CL loss of one batch (SPEC §1.2); call ``.loss.backward()`` on the result."""
    prev = scorer.shift_right(batch.target_ids)  # (B, T)
    lprobs = scorer.log_probs(batch.src_ids, batch.src_mask, prev, batch.target_ids)  # (B, T, V)
    score_negatives = _stacked_negative_scores if stack_negatives else _per_slot_negative_scores
    s_neg = score_negatives(scorer, batch, dtype=lprobs.dtype)  # (B, M)
    return loss_fn(lprobs, batch.target_ids, s_neg, batch.n_neg, pad_id=scorer.pad_id)


def _per_slot_negative_scores(scorer: Seq2SeqScorer, batch: GecBatch, *, dtype: torch.dtype) -> Tensor:
    """S_neg[:, j] by one full forward per slot j over the sentences that have a real j-th negative."""
    B, M, _ = batch.neg_ids.shape
    s_neg = torch.zeros(B, M, dtype=dtype, device=batch.src_ids.device)  # (B, M) filler stays 0 (masked)
    for j in range(M):
        rows = (batch.n_neg > j).nonzero().squeeze(1)  # (b,)
        if rows.numel() == 0:
            continue  # no sentence has a j-th negative
        s_neg[rows, j] = _score(scorer, batch, rows, batch.neg_ids[rows, j])
    return s_neg


def _stacked_negative_scores(scorer: Seq2SeqScorer, batch: GecBatch, *, dtype: torch.dtype) -> Tensor:
    """S_neg for every real (sentence, slot) pair in one batched forward."""
    B, M, _ = batch.neg_ids.shape
    s_neg = torch.zeros(B, M, dtype=dtype, device=batch.src_ids.device)  # (B, M)
    real = torch.arange(M, device=batch.n_neg.device).unsqueeze(0) < batch.n_neg.unsqueeze(1)  # (B, M)
    rows, slots = real.nonzero(as_tuple=True)  # (P,), (P,)
    if rows.numel() > 0:
        s_neg[rows, slots] = _score(scorer, batch, rows, batch.neg_ids[rows, slots])
    return s_neg


def _score(scorer: Seq2SeqScorer, batch: GecBatch, rows: Tensor, targets: Tensor) -> Tensor:
    """S(targets[p] | source[rows[p]]) with padding trimmed to the longest in this pass: -> (P,)."""
    real_src = batch.src_mask[rows].sum(0).nonzero().max().item() + 1
    real_tgt = targets.ne(scorer.pad_id).sum(0).nonzero().max().item() + 1
    src_ids, src_mask = batch.src_ids[rows, :real_src], batch.src_mask[rows, :real_src]  # (P, S')
    targets = targets[:, :real_tgt]  # (P, T'')
    return scorer.sequence_scores(src_ids, src_mask, scorer.shift_right(targets), targets)  # (P,)
