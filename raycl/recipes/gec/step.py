"""One GEC-CL training step's loss: collate (source, target, negatives) on the CPU, score every row on the device.

The released criterion of Cao, Yang & Ng (2021) runs one teacher-forced pass on the positives (CE and S_pos share
its dropout mask), then one full forward per negative slot j: the encoder re-run, the model in train mode,
gradients through the negatives. ``passes="per_slot"`` does exactly that. ``passes="joint"`` (the default) runs
the same (source, target) pairs as the rows of **one** batched forward — the positives and every real negative,
each row with its own copy of its sentence's source — so that every row draws its own dropout masks in the
encoder and in the decoder, as the per-slot passes do: the loss has the same distribution (an encoder pass shared
by a sentence's rows would correlate their scores, and would not be the released computation). With dropout off
the two are equal. Filler slots (j ≥ n_i) are never scored.

Nothing in the step reads a value back from the device: the row layout, the lengths, whether there is padding at
all and the token count are fixed by :func:`collate` on the CPU (a prefetcher runs it, off the step's critical
path), and the loss's parts stay device tensors for the caller to accumulate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from raycl.config.tasks.gec import PASSES
from raycl.losses.gec_margin import GecContrastiveLoss, GecLossOutput
from raycl.losses.token_log_probs import TokenLogProbs

if TYPE_CHECKING:  # transformers too: a Tune trial's actor imports this module and needs none of it
    from transformers import PreTrainedTokenizerBase

    from raycl.data.gec import GecExample
    from raycl.models.seq2seq import Seq2SeqScorer


class Span(NamedTuple):
    """Rows ``[start, stop)`` of one per-slot pass, and that pass's own padded source and target lengths."""

    start: int
    stop: int
    src_len: int
    tgt_len: int
    src_padded: bool  # some source of the pass is shorter than src_len


@dataclass(frozen=True)
class GecBatch:
    """A collated GEC-CL batch in the joint layout: one row per scored (source, target) pair.

    Rows: the B positives (row i is sentence i with its gold target), then the real negatives slot by slot (slot 0
    of every sentence that has one, then slot 1, …). Each row holds its own copy of its sentence's source. Sources
    are padded to the longest source, targets to the longest real row (or up to a multiple, see :func:`collate`).
    """

    row_src: Tensor  # (R, S) the source of each row's sentence
    row_src_mask: Tensor  # (R, S) 1 = real token
    row_tgt: Tensor  # (R, T) gold target (r < B) or a negative, pad-filled
    row_sentence: Tensor  # (R,) the sentence of each row (r for r < B)
    row_slot: Tensor  # (R,) a negative row's slot j < n_i; −1 for a positive
    n_neg: Tensor  # (B,) real negatives per sentence
    ntokens: int  # real tokens of the positive targets, EOS included (fairseq's sample_size)
    num_slots: int  # M, the width of s_neg
    src_padded: bool  # some source is shorter than S: the mask is needed
    tgt_padded: bool  # some row's target is shorter than T
    spans: tuple[Span, ...]  # the per-slot passes: the positives, then each slot that has a real negative
    pad_id: int

    @property
    def num_sentences(self) -> int:
        return self.spans[0].stop


def collate(
    examples: Sequence[GecExample],
    negatives: Sequence[Sequence[str]],
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_length: int,
    num_slots: int | None = None,
    pad_to_multiple_of: int = 1,
) -> GecBatch:
    """Tokenise and lay out a batch on the CPU; M = ``num_slots`` or the largest negative count in the batch.

    ``pad_to_multiple_of`` rounds the padded source and target lengths up (never past ``max_length``), so that
    batches repeat a few shapes (compiled steps, CUDA graphs); 1 pads to the longest row only.
    """
    if len(examples) != len(negatives):
        raise ValueError(f"{len(examples)} examples but {len(negatives)} negative lists")
    pad = int(tokenizer.pad_token_id)  # type: ignore[arg-type]
    B = len(examples)
    flat = [neg for negs in negatives for neg in negs]
    texts = [e.source for e in examples] + [e.target for e in examples] + flat
    ids = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    negs, at = [], 2 * B
    for ns in negatives:
        negs.append(ids[at : at + len(ns)])
        at += len(ns)
    return _assemble(
        ids[:B], ids[B : 2 * B], negs, pad_id=pad, num_slots=num_slots, multiple=pad_to_multiple_of, cap=max_length
    )


def _padded_len(longest: int, multiple: int, cap: int | None) -> int:
    up = -(-longest // multiple) * multiple
    return min(up, max(cap, longest)) if cap is not None else up


def _assemble(
    sources: list[list[int]],
    targets: list[list[int]],
    negatives: list[list[list[int]]],
    *,
    pad_id: int,
    num_slots: int | None,
    multiple: int,
    cap: int | None = None,
) -> GecBatch:
    """The joint row layout and the per-slot spans from token id lists (no padding in them)."""
    if not sources:
        raise ValueError("an empty batch")
    counts = [len(n) for n in negatives]
    M = max(counts, default=0) if num_slots is None else num_slots
    if max(counts, default=0) > M:
        raise ValueError(f"a sentence has {max(counts)} negatives but num_slots={M}")
    B = len(sources)
    rows = [(i, -1, targets[i]) for i in range(B)]  # (sentence, slot, target ids)
    groups = [list(range(B))] + [[i for i in range(B) if counts[i] > j] for j in range(M)]
    for j, members in enumerate(groups[1:]):
        rows += [(i, j, negatives[i][j]) for i in members]
    spans, start = [], 0
    for members in groups:
        if not members:
            continue  # no sentence has a j-th negative: no pass
        stop = start + len(members)
        s_len = _padded_len(max(len(sources[i]) for i in members), multiple, cap)
        t_len = _padded_len(max(len(rows[r][2]) for r in range(start, stop)), multiple, cap)
        spans.append(Span(start, stop, s_len, t_len, any(len(sources[i]) < s_len for i in members)))
        start = stop
    S = _padded_len(max((len(s) for s in sources), default=1), multiple, cap)
    T = _padded_len(max((len(r[2]) for r in rows), default=1), multiple, cap)
    src = [sources[i] for i, _, _ in rows]
    return GecBatch(
        row_src=_padded(src, S, pad_id),
        row_src_mask=_padded([[1] * len(s) for s in src], S, 0),
        row_tgt=_padded([t for _, _, t in rows], T, pad_id),
        row_sentence=torch.tensor([i for i, _, _ in rows], dtype=torch.long),
        row_slot=torch.tensor([j for _, j, _ in rows], dtype=torch.long),
        n_neg=torch.tensor(counts, dtype=torch.long),
        ntokens=sum(len(t) for t in targets),
        num_slots=M,
        src_padded=any(len(s) < S for s in sources),
        tgt_padded=any(len(r[2]) < T for r in rows),
        spans=tuple(spans),
        pad_id=pad_id,
    )


def _padded(seqs: list[list[int]], width: int, fill: int) -> Tensor:
    """Right-padded (len(seqs), width) long tensor."""
    return torch.tensor([q + [fill] * (width - len(q)) for q in seqs], dtype=torch.long).view(len(seqs), width)


def gec_loss(
    scorer: Seq2SeqScorer, batch: GecBatch, loss_fn: GecContrastiveLoss, *, passes: str = "joint"
) -> GecLossOutput:
    """The GEC-CL loss of one batch; call ``.loss.backward()`` on the result (its parts stay on the device).

    ``passes``: ``joint`` — one forward over every row; ``per_slot`` — the positives, then one forward per slot,
    as the released criterion runs them.
    """
    if passes == "joint":
        tok, s_rows = _joint(scorer, batch)
    elif passes == "per_slot":
        tok, s_rows = _per_slot(scorer, batch)
    else:
        raise ValueError(f"passes must be one of {', '.join(PASSES)}, got {passes!r}")
    B = batch.num_sentences
    s_neg = s_rows.new_zeros(B, batch.num_slots)  # (B, M) filler slots stay 0 and are masked by n_neg
    s_neg = s_neg.index_put((batch.row_sentence[B:], batch.row_slot[B:]), s_rows[B:])  # (B, M)
    keep = batch.row_tgt[:B, : tok.target.shape[1]].ne(batch.pad_id)  # (B, T)
    return loss_fn(tok, keep, s_neg, batch.n_neg, ntokens=batch.ntokens)


def _row_scores(tok: TokenLogProbs, targets: Tensor, pad_id: int) -> Tensor:
    """S per row: summed target log-probs, pads zeroed: (R, T) -> (R,)."""
    return tok.target.masked_fill(targets.eq(pad_id), 0.0).sum(-1)


def _joint(scorer: Seq2SeqScorer, batch: GecBatch) -> tuple[TokenLogProbs, Tensor]:
    """One forward over all R rows: the positives' token scores (B, T) and every row's S (R,)."""
    if scorer.training and scorer.layerdrop > 0:
        raise ValueError(
            f"LayerDrop ({scorer.layerdrop}) drops a layer for every row of a forward at once, so a "
            "joint pass would correlate the rows' scores: use loss.passes=per_slot"
        )
    tgt = batch.row_tgt  # (R, T)
    tok = scorer.token_log_probs(
        batch.row_src, batch.row_src_mask, scorer.shift_right(tgt), tgt, src_padded=batch.src_padded
    )
    B = batch.num_sentences
    return TokenLogProbs(tok.target[:B], tok.total[:B], tok.vocab_size), _row_scores(tok, tgt, batch.pad_id)


def _per_slot(scorer: Seq2SeqScorer, batch: GecBatch) -> tuple[TokenLogProbs, Tensor]:
    """The positives' pass, then one pass per slot over the sentences that have a real j-th negative."""
    passes, scores = [], []
    for sp in batch.spans:
        src = batch.row_src[sp.start : sp.stop, : sp.src_len]  # (b, S_j)
        mask = batch.row_src_mask[sp.start : sp.stop, : sp.src_len]  # (b, S_j)
        tgt = batch.row_tgt[sp.start : sp.stop, : sp.tgt_len]  # (b, T_j)
        tok = scorer.token_log_probs(src, mask, scorer.shift_right(tgt), tgt, src_padded=sp.src_padded)
        passes.append(tok)
        scores.append(_row_scores(tok, tgt, batch.pad_id))  # (b,)
    return passes[0], torch.cat(scores)  # (B, T₀) token scores, (R,)
