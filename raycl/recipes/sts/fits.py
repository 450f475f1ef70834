"""A trial's *fits*, as the released code calls sentence-transformers' ``fit``: one pre-training fit of
``pretrain.epochs`` epochs, then ``finetune.epochs`` fits of one epoch each (warm-up recomputed each time); each
fit's data (STS pairs, then train_data.csv labelled by the kept pre-trained model) and its released warm-up."""

from __future__ import annotations

import math
from dataclasses import dataclass

from raycl.config.tasks.sts import StsConfig
from raycl.data.semeval import StsPair, read_sts_pretrain, read_sts_train
from raycl.models.sentence_encoder import SentenceEncoder
from raycl.recipes.sts import evaluation
from raycl.training.task import Stage

Pair = tuple[str, str, float]  # (sentence 1, sentence 2, label in [0, 1])


@dataclass(frozen=True)
class Fit(Stage):
    """One ``fit`` call of the released code: a stage named by its setting (pre_train | fine_tune)."""

    index: int = 1  # k of the k-th fine-tuning fit (the released warm-up grows with it)


def fits(cfg: StsConfig) -> list[Fit]:
    p, f = cfg.pretrain, cfg.finetune
    out = [Fit("pre_train", p.epochs, p.eval_every, p.seed)] if p.epochs else []
    return out + [Fit("fine_tune", 1, f.eval_every, f.seed + e, e + 1) for e in range(f.epochs)]


def pair_sentences(pairs: list[Pair]) -> list[str]:
    """The contrastive objective's data: both sentences of every pair, repeats kept, as the released scripts
    build ``train_samples_unsup`` (SimCSE pairs each with itself)."""
    return [s for a, b, _ in pairs for s in (a, b)]


def warmup_steps(cfg: StsConfig, fit: Fit, *, steps: int, pair_batches: int, sentence_batches: int) -> int:
    """``optim.warmup=released``: the released scripts' ``warmup_steps`` — ratio × the contrastive loader × epochs
    in pre-training (that loader is twice the pair loader that ends the epoch: 20% of the steps), ratio × the pair
    loader × k in the k-th one-epoch fine-tuning fit; ``steps``: ratio × the fit's steps."""
    o = cfg.optim
    if o.warmup == "steps":
        return math.ceil(o.warmup_ratio * steps)
    if fit.name == "pre_train":
        return math.ceil(o.warmup_ratio * (sentence_batches or pair_batches) * fit.epochs)
    return math.ceil(o.warmup_ratio * pair_batches * fit.index)


def pretrain_pairs(cfg: StsConfig, split: str) -> list[Pair]:
    return [
        (p.sentence1, p.sentence2, p.score / 5.0)
        for spec in cfg.data.sts_pretrain
        for p in read_sts_pretrain(spec)
        if p.split == split
    ]


def finetune_pairs(cfg: StsConfig, encoder: SentenceEncoder) -> list[Pair]:
    """train_data.csv as (tokenised s1, tokenised s2, label): sim, or the pre-trained model's cosine of the two
    alternatives when sim is 'None', as upstream."""
    rows = read_sts_train(cfg.data.train_data)
    todo = [r for r in rows if r.sim is None]
    alt = [StsPair(r.id, r.language, None, None, r.alternative_1, r.alternative_2) for r in todo]
    labels = evaluation.predict(encoder, alt, cross=cfg.model.cross_attention, batch_size=cfg.eval.batch_size)
    out = []
    for r in rows:
        a, b = r.tokenised(upstream_quirk=cfg.data.upstream_quirk)
        out.append((a, b, float(r.sim if r.sim is not None else labels[r.id])))
    return out
