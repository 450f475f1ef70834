"""Model presets for GEC: tiny CPU models built from configs, and the papers' models (docs/recipes/gec.md).

``build_model(preset, out_dir=...)`` writes an HF folder (model + tokenizer) that
``Seq2SeqScorer.from_pretrained(out_dir)`` loads. Config presets never download anything: their
tokenizer is a byte-level BPE trained here on ``texts``. ``gec_bart`` is the only preset that reads a
pretrained checkpoint (``facebook/bart-large`` unless ``checkpoint=PATH`` is given).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raycl.errors import UserError

if TYPE_CHECKING:
    from transformers import BartConfig

# torch and transformers are imported where a model is built: validating a config reads PRESETS only, and a
# command that refuses its input ends before paying for them (about 3 CPU seconds)


@dataclass(frozen=True)
class Preset:
    """A named model: either a ``BartConfig`` built here (``config``) or a checkpoint to load (``pretrained``)."""

    description: str
    config: dict[str, Any] = field(default_factory=dict)
    vocab_size: int = 1000  # BPE merges target for the locally trained tokenizer
    pretrained: str | None = None


_SMOKE = dict(
    d_model=128,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=256,
    decoder_ffn_dim=256,
    dropout=0.1,
    max_position_embeddings=128,
)
_SMALL = dict(
    d_model=256,
    encoder_layers=3,
    decoder_layers=3,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=1024,
    decoder_ffn_dim=1024,
    dropout=0.1,
    max_position_embeddings=256,
)
# transformer_vaswani_wmt_en_de_big as a BART-architecture config: ReLU, scaled embeddings, dropout 0.3.
# BART keeps learned positions and an embedding LayerNorm where fairseq's transformer has sinusoids.
_TRANSFORMER_BIG = dict(
    d_model=1024,
    encoder_layers=6,
    decoder_layers=6,
    encoder_attention_heads=16,
    decoder_attention_heads=16,
    encoder_ffn_dim=4096,
    decoder_ffn_dim=4096,
    dropout=0.3,
    attention_dropout=0.0,
    activation_dropout=0.0,
    activation_function="relu",
    scale_embedding=True,
    max_position_embeddings=1024,
)

# A trained checkpoint keeps its shape; only the preset's regularisation is applied on top of it.
_DROPOUT_KEYS = frozenset({"dropout", "attention_dropout", "activation_dropout"})

PRESETS: dict[str, Preset] = {
    "smoke": Preset("tiny BART (d 128, 2+2 layers) for CPU tests and the demo", _SMOKE, vocab_size=1000),
    "small": Preset("small BART (d 256, 3+3 layers) for CPU experiments", _SMALL, vocab_size=4000),
    "gec_pd": Preset(
        "GEC-PD: transformer-big (6+6, d 1024, 16 heads, ffn 4096)", _TRANSFORMER_BIG, vocab_size=8000
    ),
    "gec_bart": Preset(
        "GEC-BART: facebook/bart-large (dropout 0.3, attention dropout 0.3)",
        dict(dropout=0.3, attention_dropout=0.3),
        pretrained="facebook/bart-large",
    ),
}


def preset_config(preset: str, *, vocab_size: int, **overrides: Any) -> BartConfig:
    """The ``BartConfig`` of a config preset, with ``overrides`` (BartConfig fields) applied."""
    from transformers import BartConfig

    spec = _get(preset)
    unknown = sorted(set(overrides) - set(BartConfig().to_dict()))
    if unknown:
        raise UserError(f"model: unknown BartConfig field(s) {unknown} for preset {preset!r}")
    return BartConfig(vocab_size=vocab_size, **{**spec.config, **overrides})


def build_model(preset: str, *, out_dir: str | Path, texts: Iterable[str] | None = None, **overrides: Any) -> Path:
    """Write preset ``preset`` as an HF folder (model + tokenizer) in ``out_dir`` and return the path.

    ``overrides``: ``checkpoint=PATH`` loads that trained model instead of building one; ``vocab_size=N``
    sizes the local BPE; ``seed=N`` seeds the random init; anything else is a ``BartConfig`` field.
    """
    import torch
    from transformers import BartForConditionalGeneration

    from raycl.models.tokenizer import train_bpe_tokenizer

    spec, out = _get(preset), Path(out_dir)
    checkpoint = overrides.pop("checkpoint", None) or spec.pretrained
    if checkpoint is not None:
        regularisation = {k: v for k, v in spec.config.items() if k in _DROPOUT_KEYS}
        return _copy_pretrained(str(checkpoint), out, {**regularisation, **overrides})
    if texts is None:
        raise UserError(f"model.preset={preset!r} trains its tokenizer locally: pass the training sentences")
    tokenizer = train_bpe_tokenizer(
        texts,
        out,
        vocab_size=int(overrides.pop("vocab_size", spec.vocab_size)),
        model_max_length=int(overrides.get("max_position_embeddings", spec.config["max_position_embeddings"])),
    )
    torch.manual_seed(int(overrides.pop("seed", 0)))
    model = BartForConditionalGeneration(preset_config(preset, vocab_size=len(tokenizer), **overrides))
    model.save_pretrained(str(out))
    return out


def _copy_pretrained(name: str, out: Path, config: dict[str, Any]) -> Path:
    """Load ``name`` (hub name or folder) with the preset's dropout settings and save it to ``out``."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name)
    model = AutoModelForSeq2SeqLM.from_pretrained(name, **config)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def _get(preset: str) -> Preset:
    if preset not in PRESETS:
        raise UserError(f"model.preset: unknown preset {preset!r}; expected one of {sorted(PRESETS)}")
    return PRESETS[preset]
