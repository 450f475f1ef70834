"""A cross-encoder's scores of (query, passage) pairs, as sentence-transformers' ``CrossEncoder.predict`` gives
them: an HF sequence-classification folder with one label, the pair tokenised together (truncated to the
tokenizer's limit, at most 512), the logit through a sigmoid (sentence-transformers' default activation for one
label; ``sentence_transformers.activation_fn`` in the folder's config may name ``Identity`` instead)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from raycl.errors import UserError, at


class CrossScorer:
    def __init__(self, folder: str | Path, *, device: str = "cpu") -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.folder = Path(folder)
        check_cross_encoder(self.folder)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.folder))
        self.model = AutoModelForSequenceClassification.from_pretrained(str(self.folder)).to(device).eval()
        self.device = torch.device(device)
        self.max_len = min(int(getattr(self.tokenizer, "model_max_length", 512)), 512)
        config = json.loads((self.folder / "config.json").read_text(encoding="utf-8"))
        activation = str(config.get("sentence_transformers", {}).get("activation_fn", "Sigmoid"))
        self.sigmoid = not activation.endswith("Identity")

    @torch.inference_mode()
    def score(self, queries: Sequence[str], passages: Sequence[str], *, batch_size: int = 32) -> np.ndarray:
        out = np.empty(len(queries), np.float32)
        for i in range(0, len(queries), batch_size):
            enc = self.tokenizer(
                list(queries[i : i + batch_size]),
                list(passages[i : i + batch_size]),
                padding=True,
                truncation=True,
                max_length=self.max_len,
                return_tensors="pt",
            ).to(self.device)
            logits = self.model(**enc).logits[:, 0].float()
            out[i : i + batch_size] = (torch.sigmoid(logits) if self.sigmoid else logits).cpu().numpy()
        return out


def check_cross_encoder(folder: Path) -> None:
    """One line for a folder that is not a one-label sequence classifier."""
    path = folder / "config.json"
    if not path.is_file():
        raise UserError(f"{at(folder)}: no config.json, expected a cross-encoder folder (cross_encoder)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise UserError(f"{at(path)}: invalid JSON ({err}), expected an HF model config") from None
    labels = len(config.get("id2label", {})) or int(config.get("num_labels", 2))
    if labels != 1:
        raise UserError(
            f"{at(folder)}: a classifier with {labels} labels, expected a cross-encoder with one "
            "(a relevance score)"
        )
