"""One STS training step (the released code's ``fit`` with MSE and MoCo-InfoNCE losses): a batch of pairs (MSE of
the cross-attended cosine against score/5) and, when λ > 0, a batch of sentences for InfoNCE (SimCSE views through
dropout, mean-pooled encoder outputs, cross-attention bypassed, MoCo keys and each sentence's own mined dense
negatives as extra negatives).

A batch is collated on the CPU ahead of its step (:func:`collate`); :func:`sts_loss` runs the objective the batch
names (``mse``, ``con`` or ``joint``) and its backward.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from raycl.config.tasks.sts import StsConfig
from raycl.losses.infonce_queue import InfoNCEQueueLoss, joint_loss
from raycl.losses.mse_cosine import MSECosineLoss
from raycl.memory.moco import MoCoKeyEncoder
from raycl.models.sentence_encoder import SentenceEncoder
from raycl.training.task import StepContext


@dataclass(frozen=True)
class Sentences:
    """Tokenised sentences (CPU, then the device): ids and mask (B, T), and whether any position is padding."""

    ids: torch.Tensor  # (B, T)
    mask: torch.Tensor  # (B, T)
    padded: bool

    @classmethod
    def of(cls, enc: SentenceEncoder, sentences: list[str], *, pad_to_multiple_of: int | None) -> Sentences:
        ids, mask = enc.inputs(sentences, pad_to_multiple_of=pad_to_multiple_of)
        return cls(ids, mask, not bool(mask.all()))


@dataclass(frozen=True)
class StsBatch:
    """One step's objective (``mse``, ``con`` or ``joint``) and its tensors, collated ahead of the step."""

    kind: str
    a: Sentences | None  # the pairs' first sentences (MSE)
    b: Sentences | None  # their second sentences
    labels: torch.Tensor | None  # (P,) score / 5
    sentences: Sentences | None  # the contrastive objective's sentences (SimCSE views of each)
    n_pairs: int
    n_sentences: int
    negatives: SentenceNegatives | None = None  # the sentences' own dense hard negatives (``mining``)


@dataclass(frozen=True)
class SentenceNegatives:
    """The contrastive batch's mined negatives: each distinct text once, and each sentence's columns in them."""

    texts: Sentences  # (N, T)
    index: torch.Tensor  # (B, K) long: sentence i's k-th negative is row index[i, k] of ``texts``; −1: none

    @classmethod
    def of(
        cls,
        enc: SentenceEncoder,
        sentences: list[str],
        mined: Mapping[str, list[str]],
        *,
        pad_to_multiple_of: int | None,
    ) -> SentenceNegatives | None:
        """None when no sentence of the batch has negatives (the step is then the plain InfoNCE)."""
        per = [mined.get(s, []) for s in sentences]
        k = max(map(len, per), default=0)
        if k == 0:
            return None
        texts = list(dict.fromkeys(t for negs in per for t in negs))
        row = {t: i for i, t in enumerate(texts)}
        index = torch.tensor([[row[t] for t in negs] + [-1] * (k - len(negs)) for negs in per])  # (B, K)
        return cls(Sentences.of(enc, texts, pad_to_multiple_of=pad_to_multiple_of), index)


def collate(
    enc: SentenceEncoder, data: Any, mined: Mapping[str, list[str]], *, pad_to_multiple_of: int | None
) -> StsBatch:
    """A batch ``(kind, pairs, sentences)`` as tensors on the CPU, with the sentences' mined negatives."""
    kind, pairs, sentences = data
    pad = pad_to_multiple_of
    a = b = labels = con = None
    if pairs:
        first, second, y = zip(*pairs, strict=True)
        a = Sentences.of(enc, list(first), pad_to_multiple_of=pad)
        b = Sentences.of(enc, list(second), pad_to_multiple_of=pad)
        labels = torch.tensor(y)  # (P,)
    negatives = None
    if sentences:
        con = Sentences.of(enc, sentences, pad_to_multiple_of=pad)
        negatives = SentenceNegatives.of(enc, sentences, mined, pad_to_multiple_of=pad) if mined else None
    return StsBatch(kind, a, b, labels, con, len(pairs), len(sentences), negatives)


def sts_loss(
    cfg: StsConfig, enc: SentenceEncoder, moco: MoCoKeyEncoder | None, data: StsBatch, ctx: StepContext
) -> dict[str, Any]:
    """The MSE objective, the contrastive one, or their joint sum (backward of the summed loss: the weight is
    the batch's pairs, or sentences, so workers' shards average to the global batch)."""
    lam, kind = cfg.loss.lam, data.kind
    out: dict[str, Any] = {"n_mse": float(kind != "con"), "n_con": float(kind != "mse")}
    zero = torch.zeros((), device=ctx.device)
    l_mse = mse_loss(enc, data, cross=cfg.model.cross_attention) if data.a is not None else zero
    l_con, keys = contrastive_loss(cfg, enc, moco, data) if data.sentences is not None else (zero, None)
    if kind == "con":
        ctx.backward(lam * l_con, weight=float(data.n_sentences))  # the released MoCo loss carries the ×λ
    else:
        loss = joint_loss(l_mse, l_con, lam=lam) if kind == "joint" else l_mse
        ctx.backward(loss, weight=float(data.n_pairs))
    if keys is not None and moco is not None:
        moco.enqueue(keys)  # after the loss: a key never meets its own anchor
    return {**out, "l_mse": l_mse.detach(), "l_con": l_con.detach()}


def mse_loss(enc: SentenceEncoder, data: StsBatch, *, cross: bool) -> torch.Tensor:
    a, b = data.a, data.b
    assert a is not None and b is not None and data.labels is not None
    if cross:
        u, v = enc.cross_embeddings(a.ids, a.mask, b.ids, b.mask, padded=(a.padded, b.padded))  # (B, H) ×2
    else:
        u, v = enc.embed(a.ids, a.mask, padded=a.padded), enc.embed(b.ids, b.mask, padded=b.padded)
    return MSECosineLoss()(u, v, data.labels).loss


def contrastive_loss(
    cfg: StsConfig, enc: SentenceEncoder, moco: MoCoKeyEncoder | None, data: StsBatch
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """L_con of SimCSE views of the sentences against in-batch positives, the queue and each sentence's own
    mined negatives (embedded by the trained encoder, with gradient, as SimCSE's); this step's keys."""
    s = data.sentences
    assert s is not None
    h = enc.embed(s.ids, s.mask, padded=s.padded)  # (B, H)
    h_pos = enc.embed(s.ids, s.mask, padded=s.padded)  # (B, H): dropout is the augmentation
    keys, queue = None, None
    if moco is not None:
        if not cfg.moco.update_every_forward:
            moco.momentum_update(enc)
        keys, queue = moco.keys(s.ids, s.mask), moco.queued()  # (B, H), (Q, H)
    negatives = mask = None
    if (mined := data.negatives) is not None:
        t = mined.texts
        rows = enc.embed(t.ids, t.mask, padded=t.padded)  # (N, H)
        negatives, mask = rows[mined.index.clamp(min=0)], mined.index >= 0  # (B, K, H), (B, K)
    loss = InfoNCEQueueLoss(temperature=cfg.loss.temperature)(h, h_pos, queue, negatives, mask).loss
    return loss, keys
