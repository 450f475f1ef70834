"""Subtask B's evaluation, used by the worker (dev Spearman during training, the labels of train_data's 'None'
rows, the closing submissions) and the report: similarity predictions (the cross-attended cosine, or the plain
cosine of mean-pooled embeddings without cross-attention), the official Spearman of dev, the official submissions
of dev and eval for both settings scored with ``evaluate_sts``, and the alignment and uniformity of the sentence
embeddings (the paper's §5, Fig. 5)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from raycl.data.semeval import B_GOLD_HEADER, StsPair, read_sts_inputs, read_sts_pretrain
from raycl.models.sentence_encoder import SentenceEncoder
from raycl.scoring.embedding_geometry import alignment, uniformity
from raycl.scoring.semeval_metrics import evaluate_sts, score_sts, spearman
from raycl.scoring.semeval_splits import OfficialEvaluator, Predictions, batched, submit

if TYPE_CHECKING:
    from raycl.config.tasks.sts import StsConfig


@torch.no_grad()
def similarities(
    enc: SentenceEncoder, a: Sequence[str], b: Sequence[str], *, cross: bool, batch_size: int
) -> list[float]:
    """Each pair's cosine: cross-attended, or of each side's mean-pooled encoder output (no cross-attention)."""

    def cosines(pairs: list[tuple[str, str]]) -> list[float]:
        x, y = [p[0] for p in pairs], [p[1] for p in pairs]
        u, v = enc.pair_embeddings(x, y) if cross else (enc.encode(x), enc.encode(y))  # (b, H), (b, H)
        # evaluation, not a training step: the cosines go to Spearman's ρ on the host, one copy a batch
        return torch.cosine_similarity(u, v, dim=-1).tolist()  # (b,)

    return batched(cosines, list(zip(a, b, strict=True)), batch_size)


def predict(
    enc: SentenceEncoder, pairs: Sequence[StsPair], *, cross: bool, batch_size: int, upstream_quirk: bool = True
) -> dict[str, float]:
    """``{ID: similarity}`` of Subtask B pairs, with their MWEs as single tokens."""
    texts = [p.tokenised(upstream_quirk=upstream_quirk) for p in pairs]
    sims = similarities(enc, [t[0] for t in texts], [t[1] for t in texts], cross=cross, batch_size=batch_size)
    return {p.id: s for p, s in zip(pairs, sims, strict=True)}


@torch.no_grad()
def embed_all(enc: SentenceEncoder, texts: Sequence[str], *, batch_size: int) -> torch.Tensor:
    """Mean-pooled encoder outputs: N texts -> (N, H)."""
    return torch.cat([enc.encode(list(texts[i : i + batch_size])) for i in range(0, len(texts), batch_size)])


def _flatten(prefix: str, scores: dict[str, dict[str, dict[str, float | None]]]) -> dict[str, float | None]:
    """``{setting: {"EN,PT": {"ALL": ρ}}}`` -> ``{"dev/fine_tune/EN+PT/ALL": ρ}``."""
    return {
        f"{prefix}/{s}/{langs.replace(',', '+')}/{k}": v
        for s, by_lang in scores.items()
        for langs, row in by_lang.items()
        for k, v in row.items()
    }


class Evaluator(OfficialEvaluator[StsPair]):
    """Rank 0's dev and eval sets, read once."""

    def __init__(self, cfg: StsConfig) -> None:
        super().__init__(cfg.data, read_sts_inputs, B_GOLD_HEADER)
        self.cfg, self.cross, self.bs = cfg, cfg.model.cross_attention, cfg.eval.batch_size
        held_out = [p for spec in cfg.data.sts_pretrain for p in read_sts_pretrain(spec) if p.split != "train"]
        self.sts_dev = [p for p in held_out if p.split == "dev"]
        self.has_sts_dev = len(self.sts_dev) >= 2
        self.geometry_pairs = held_out  # the STS dev and test pairs: alignment of score ≥ 4, uniformity of all

    def _predict(self, enc: SentenceEncoder, pairs: Sequence[StsPair], setting: str) -> Predictions:
        sims = predict(
            enc, pairs, cross=self.cross, batch_size=self.bs, upstream_quirk=self.cfg.data.upstream_quirk
        )
        return {(i, setting): v for i, v in sims.items()}

    def dev(self, enc: SentenceEncoder, *, setting: str) -> dict[str, float | None]:
        """``sts_dev_spearman`` (STS dev split) and the official dev Spearman of ``setting`` (EN+PT)."""
        out: dict[str, float | None] = {}
        if self.has_sts_dev:
            d = self.sts_dev
            sims = similarities(
                enc, [p.sentence1 for p in d], [p.sentence2 for p in d], cross=self.cross, batch_size=self.bs
            )
            out["sts_dev_spearman"] = spearman([p.score for p in d], sims)
        preds = self._predict(enc, self.dev_examples, setting)
        scores = self.score_dev(score_sts, preds, setting, languages=("EN", "PT"))
        out.update({f"dev/{k}": v for k, v in scores.items()})
        out["dev_spearman"] = scores["ALL"]
        return out

    def final(self, models: dict[str, Path], out_dir: Path, *, device: Any) -> dict[str, float | None]:
        """Both settings' submissions of dev and eval (``fill_submission``), scored where gold exists."""
        preds: dict[str, Predictions] = {s.name: {} for s in self.splits}
        out: dict[str, float | None] = {}
        for setting, path in models.items():
            enc = SentenceEncoder.from_pretrained(path, device=device).eval()
            for s in self.splits:
                preds[s.name].update(self._predict(enc, s.examples, setting))
            out.update(self.geometry(enc, setting))
        for split, scores in submit(self.splits, preds, out_dir, evaluate_sts).items():
            out.update(_flatten(split, scores))
        out["dev_spearman"] = out.get(f"dev/{self.cfg.final_setting}/EN+PT/ALL")
        return out

    def geometry(self, enc: SentenceEncoder, setting: str) -> dict[str, float | None]:
        """ℓ_align over held-out STS pairs with score ≥ ``eval.align_min_score``, ℓ_uniform over all of them."""
        pairs = self.geometry_pairs
        if not pairs:
            return {}
        x = embed_all(enc, [p.sentence1 for p in pairs], batch_size=self.bs)  # (N, H)
        y = embed_all(enc, [p.sentence2 for p in pairs], batch_size=self.bs)  # (N, H)
        pos = torch.tensor([p.score >= self.cfg.eval.align_min_score for p in pairs])  # (N,)
        align = float(alignment(x[pos], y[pos], batch_size=self.bs)) if pos.any() else None
        return {f"align/{setting}": align, f"uniform/{setting}": float(uniformity(x, y, batch_size=self.bs))}
