"""The coherence scorer of Jwalapuram, Joty & Lin (2022): any HF encoder + Linear(H, 1) on the document rep.

f(x) = wᵀ h_doc(x) + b, where h_doc is the hidden state of the document token (paper §3.1):
- XLNet-like encoders (``pooling="last"``): the paper's input — the space-joined sentences are tokenised,
  truncated to ``max_len`` ids, and ``<sep> <cls>`` appended; the score is read at ``<cls>``, the last position.
- BERT-like encoders (``pooling="first"``): the tokenizer's own ``[CLS] … [SEP]``, read at ``[CLS]``.

``mask_padding=True`` (raycl's default; docs/recipes/coherence.md) passes a real attention mask; XLNet inputs
are then padded on the *left*, so ``<cls>`` stays last and (with relative positions) a document scores the same
whatever the batch's padding. ``mask_padding=False`` reproduces the released code: every input is padded to a
fixed length (XLNet: ``max_len`` pads *before* ``<sep><cls>``, total ``max_len + 2``) and no mask is passed, so
pads are attended.

The momentum encoder of the full model (``MomentumEncoder``) is a second copy of the encoder with no linear
layer: it gives detached document reps (the ``<cls>`` state, 768-d for XLNet-base).
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from raycl.errors import UserError
from raycl.models import masks
from raycl.models.folders import save_encoder_folder

if TYPE_CHECKING:  # transformers where used: a Tune trial's actor imports this module and needs none of it
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

HEAD_FILE = "coherence_head.safetensors"
CONFIG_FILE = "coherence_config.json"
POOLINGS = ("first", "last")


def prefix_slice(sentences: Sequence[str], rng: random.Random) -> tuple[str, ...]:
    """The length-invariance positive ``doc[:e]``, e uniform in {4..len−1} (paper §3.4, "Length Invariance
    Training"; the released code takes this prefix).

    Documents of ≤ 4 sentences are kept whole (and draw nothing from ``rng``); 5-sentence documents give their
    first 4 (e ∈ {4..4}).
    """
    if len(sentences) <= 4:
        return tuple(sentences)
    return tuple(sentences[: rng.randint(4, len(sentences) - 1)])


def default_pooling(encoder: PreTrainedModel) -> str:
    """XLNet reads its document token at the end (``<cls>`` last); BERT-like encoders at the start."""
    return "last" if encoder.config.model_type == "xlnet" else "first"


def document_rep(hidden: Tensor, pooling: str) -> Tensor:
    """The document token's hidden state: (B, T, H) -> (B, H)."""
    return hidden[:, -1] if pooling == "last" else hidden[:, 0]  # (B, H)


def _encoder_reps(encoder: nn.Module, pooling: str, input_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
    if attention_mask is not None and getattr(encoder.config, "model_type", "") != "xlnet":  # XLNet: its own 2-D
        attention_mask = masks.attention_mask(attention_mask, encoder)  # as the attention reads it: no sync
    hidden = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, H)
    return document_rep(hidden, pooling)  # (B, H)


class CoherenceScorer(nn.Module):
    """``encoder`` (any ``AutoModel``) + ``head`` = Linear(H, 1) on the document representation.

    Args:
        encoder: the HF encoder (XLNet in the paper).
        tokenizer: its tokenizer; XLNet-like ones need ``sep_token``/``cls_token``/``pad_token``.
        max_len: token budget of the text (600 in the paper); XLNet adds ``<sep><cls>`` after it.
        mask_padding: pass a real attention mask (True) or attend to fixed-length padding like the code (False).
        pooling: ``"last"`` (XLNet) or ``"first"`` (BERT-like); inferred from the encoder when None.
        head: the scoring layer; a fresh ``Linear(H, 1)`` when None.
    """

    def __init__(
        self,
        encoder: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_len: int,
        mask_padding: bool = True,
        pooling: str | None = None,
        head: nn.Linear | None = None,
    ) -> None:
        super().__init__()
        self.encoder, self.tokenizer = encoder, tokenizer
        self.max_len, self.mask_padding = int(max_len), bool(mask_padding)
        self.pooling = default_pooling(encoder) if pooling is None else pooling
        if self.pooling not in POOLINGS:
            raise UserError(f"model.pooling: expected one of {list(POOLINGS)}, got {self.pooling!r}")
        if tokenizer.pad_token_id is None:
            raise UserError("model: the coherence tokenizer needs a pad token")
        self.head = nn.Linear(int(encoder.config.hidden_size), 1) if head is None else head

    @property
    def device(self) -> torch.device:
        return next(self.encoder.parameters()).device

    # ---- inputs -------------------------------------------------------------------------------------------------
    def encode(self, docs: Sequence[Sequence[str]]) -> dict[str, Tensor]:
        """Ids and mask of documents (sentence lists, space-joined): {input_ids, attention_mask}, (B, T) each, on
        the model's device."""
        return {k: v.to(self.device) for k, v in self.inputs(docs).items()}

    def inputs(self, docs: Sequence[Sequence[str]], *, pad_to_multiple_of: int | None = None) -> dict[str, Tensor]:
        """:meth:`encode` on the CPU (a training batch is collated ahead of its step): {input_ids, attention_mask},
        (B, T) each; with ``pad_to_multiple_of``, T is rounded up to a multiple of it (a few shapes for a compiled
        model; the padding is masked)."""
        texts = [" ".join(doc) for doc in docs]
        rows = self._xlnet_rows(texts) if self.pooling == "last" else self._bert_rows(texts)
        if not rows:
            empty = torch.zeros((0, 0), dtype=torch.long)
            return {"input_ids": empty, "attention_mask": empty.clone()}
        width = max(len(r) for r in rows) if self.mask_padding else len(rows[0])
        if pad_to_multiple_of and self.mask_padding:
            width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
        pad, left = int(self.tokenizer.pad_token_id), self.pooling == "last"  # type: ignore[arg-type]
        ids = torch.full((len(rows), width), pad, dtype=torch.long)  # (B, T)
        mask = torch.zeros((len(rows), width), dtype=torch.long)  # (B, T)
        for i, row in enumerate(rows):
            span = slice(width - len(row), width) if left else slice(0, len(row))
            ids[i, span], mask[i, span] = torch.tensor(row, dtype=torch.long), 1
        if not self.mask_padding:
            mask.fill_(1)  # the released code passes no mask: every position, pads included, is attended
        return {"input_ids": ids, "attention_mask": mask}

    def _xlnet_rows(self, texts: list[str]) -> list[list[int]]:
        """Paper input: ids truncated to max_len, (code mode: right-padded to max_len), then ``<sep> <cls>``."""
        tok = self.tokenizer
        sep, cls, pad = tok.sep_token_id, tok.cls_token_id, tok.pad_token_id
        if sep is None or cls is None:
            raise UserError("model: an XLNet-style coherence tokenizer needs <sep> and <cls> tokens")
        rows = []
        for ids in tok(texts, add_special_tokens=False)["input_ids"]:
            ids = list(ids[: self.max_len])
            if not self.mask_padding:
                ids += [pad] * (self.max_len - len(ids))  # pads before <sep><cls>, as in the code
            rows.append([*ids, sep, cls])
        return rows

    def _bert_rows(self, texts: list[str]) -> list[list[int]]:
        padding = False if self.mask_padding else "max_length"  # code mode: one fixed length, pads attended
        enc = self.tokenizer(texts, truncation=True, max_length=self.max_len, padding=padding)
        return [list(ids) for ids in enc["input_ids"]]

    # ---- model --------------------------------------------------------------------------------------------------
    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Scores (B,) and document reps (B, H) of encoded documents; the reps keep their gradient. No mask: every
        position is attended (a batch without padding)."""
        mask = attention_mask if self.mask_padding else None  # code mode: no mask reaches the encoder
        reps = _encoder_reps(self.encoder, self.pooling, input_ids, mask)  # (B, H)
        return self.head(reps).squeeze(-1), reps  # (B,), (B, H)

    def score_documents(self, docs: Sequence[Sequence[str]], *, batch_size: int = 16) -> Tensor:
        """f(doc) for each document, in eval mode without gradients: (N,) float on the CPU.

        Documents are batched by length (less padding); the scores come back in the input order.
        """
        order = sorted(range(len(docs)), key=lambda i: sum(len(s) for s in docs[i]))
        scores = torch.empty(len(docs), dtype=torch.float64)  # (N,)
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                for lo in range(0, len(order), batch_size):
                    chunk = order[lo : lo + batch_size]
                    batch_scores, _ = self(**self.encode([docs[i] for i in chunk]))  # (b,)
                    scores[chunk] = batch_scores.double().cpu()
        finally:
            self.train(was_training)
        return scores.to(next(self.head.parameters()).dtype)

    # ---- persistence --------------------------------------------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        return {"max_len": self.max_len, "mask_padding": self.mask_padding, "pooling": self.pooling}

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """An HF folder: encoder + tokenizer + ``coherence_head.safetensors`` + ``coherence_config.json``."""
        return save_encoder_folder(
            out_dir,
            self.encoder,
            self.tokenizer,
            extra=self.head,
            extra_file=HEAD_FILE,
            settings=self.settings(),
            settings_file=CONFIG_FILE,
        )

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        max_len: int | None = None,
        mask_padding: bool | None = None,
        device: str | torch.device | None = None,
    ) -> CoherenceScorer:
        """Load a folder written by ``save_pretrained`` or any HF encoder (then with a fresh head).

        ``max_len``/``mask_padding`` override the saved settings; unsaved ones default to the tokenizer's
        ``model_max_length`` (capped at 512) and True.
        """
        from transformers import AutoModel, AutoTokenizer

        folder = Path(path)
        if not folder.is_dir():
            raise UserError(f"{folder}: not a model folder (expected an HF encoder folder with its tokenizer)")
        saved = json.loads((folder / CONFIG_FILE).read_text()) if (folder / CONFIG_FILE).exists() else {}
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        encoder = AutoModel.from_pretrained(str(folder))
        length = max_len or saved.get("max_len") or min(int(tokenizer.model_max_length), 512)
        masked = saved.get("mask_padding", True) if mask_padding is None else mask_padding
        model = cls(encoder, tokenizer, max_len=length, mask_padding=masked, pooling=saved.get("pooling"))
        if (folder / HEAD_FILE).exists():
            model.head.load_state_dict(load_file(str(folder / HEAD_FILE)))
        return model.to(device) if device is not None else model


class MomentumEncoder(nn.Module):
    """The momentum encoder: a copy of ``scorer.encoder`` (no linear layer) giving detached document reps.

    It reads the same inputs as the scorer (``scorer.encode``), with the same pooling and masking. Its weights
    never get gradients; ``raycl.memory.momentum.momentum_update(self.encoder, scorer.encoder, m=m)`` moves them.
    Dropout follows the module's own train/eval mode (in the released code both encoders train together).
    """

    def __init__(self, scorer: CoherenceScorer) -> None:
        super().__init__()
        self.encoder = copy.deepcopy(scorer.encoder)
        self.encoder.requires_grad_(False)
        self.pooling, self.mask_padding = scorer.pooling, scorer.mask_padding

    @torch.no_grad()
    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Detached document reps (B, H)."""
        mask = attention_mask if self.mask_padding else None
        return _encoder_reps(self.encoder, self.pooling, input_ids, mask).detach()  # (B, H)
