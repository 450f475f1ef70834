"""Dense text embeddings for mining (``raycl.mine_dense_negatives``): a sentence-transformers folder or raycl's
own STS encoder folder, encoded the way sentence-transformers encodes for ``mine_hard_negatives``.

A sentence-transformers folder (``modules.json``) is read without importing sentence-transformers: its
Transformer (``sentence_bert_config.json``: ``max_seq_length``, ``do_lower_case``), its Pooling (mean, CLS, max
or last token, ``1_Pooling/config.json``) and, always, L2 normalisation (``mine_hard_negatives`` asks for
normalised embeddings whatever the folder's modules). Texts are stripped, prompts prepended, as
sentence-transformers does; batches are formed by length (the longest first) so that padding stays small, and
the embeddings come back in the input order. A folder with ``sentence_encoder.json`` (the STS recipe's) encodes
with :meth:`raycl.models.sentence_encoder.SentenceEncoder.encode`: mean pooling, no cross-attention. A plain
HF encoder folder gets mean pooling, as sentence-transformers gives one. Anything else (an encoder-decoder, a
folder without ``config.json``, a module such as ``Dense`` that raycl does not run) is a one-line error.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from raycl.errors import UserError, at

_POOLINGS = ("cls_token", "mean_tokens", "max_tokens", "lasttoken")
_KNOWN = ("Transformer", "Pooling", "Normalize")
_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_model(name_or_path: str | Path) -> Path:
    """A local folder, or a hub name already in the local cache (``HF_HUB_OFFLINE`` honoured: never a
    download at mining time unless the user's environment allows it)."""
    folder = Path(name_or_path)
    if folder.is_dir():
        return folder.resolve()
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(name_or_path))).resolve()
    except Exception as err:  # the hub's errors are many; the user needs one line
        raise UserError(
            f"{at(name_or_path)}: not a model folder, and not a model name in the local hub cache "
            f"({type(err).__name__}); expected a sentence-transformers or raycl encoder folder"
        ) from None


def check_encoder_folder(folder: Path, *, what: str = "model") -> None:
    """One line, before anything is loaded, for a folder that cannot embed text."""
    if not (folder / "config.json").is_file():
        raise UserError(
            f"{at(folder)}: no config.json, expected a sentence-transformers or raycl encoder folder ({what})"
        )
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{at(folder / 'config.json')}: unreadable ({err}), expected an HF model config") from None
    if not isinstance(config, dict) or config.get("is_encoder_decoder"):
        raise UserError(f"{at(folder)}: an encoder-decoder model, expected a text encoder ({what})")
    for module in _modules(folder):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind not in _KNOWN:
            raise UserError(
                f"{at(folder / 'modules.json')}: module {kind!r} is not supported, expected "
                f"{', '.join(_KNOWN)} ({what})"
            )


def _modules(folder: Path) -> list[dict[str, Any]]:
    path = folder / "modules.json"
    if not path.is_file():
        return []
    try:
        got = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise UserError(f"{at(path)}: invalid JSON ({err}), expected sentence-transformers' module list") from None
    if not isinstance(got, list):
        raise UserError(f"{at(path)}: expected a JSON list of modules")
    return [m for m in got if isinstance(m, dict)]


def folder_prompts(folder: Path) -> dict[str, str]:
    """The prompts a sentence-transformers folder defines (``config_sentence_transformers.json``)."""
    prompts = _json(folder / "config_sentence_transformers.json").get("prompts", {})
    return {str(k): str(v) for k, v in prompts.items()}


def resolve_prompt(folder: Path, prompt: str | None, prompt_name: str | None) -> str:
    """sentence-transformers' rule: a raw ``prompt`` wins; else ``prompt_name`` from the folder's prompts."""
    if prompt is not None:
        return prompt
    if prompt_name is None:
        return ""
    prompts = folder_prompts(folder)
    if prompt_name not in prompts:
        raise UserError(
            f"{at(folder)}: no prompt named {prompt_name!r}, expected one of "
            f"{sorted(prompts) or 'none (the folder defines no prompts)'}"
        )
    return prompts[prompt_name]


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    got = json.loads(path.read_text(encoding="utf-8"))
    return got if isinstance(got, dict) else {}


class DenseEncoder:
    """Normalised embeddings of texts, float32 numpy (N, D), in the input order."""

    def __init__(self, name_or_path: str | Path, *, device: str = "cpu", precision: str = "fp32") -> None:
        from transformers import AutoTokenizer

        from raycl.models.sentence_encoder import _load_encoder as load_encoder  # BERT without its unused pooler

        if precision not in _DTYPES:
            raise UserError(f"precision: expected one of {sorted(_DTYPES)}, got {precision!r}")
        folder = resolve_model(name_or_path)
        check_encoder_folder(folder)
        self.folder, self.device, self.autocast = folder, torch.device(device), _DTYPES[precision]
        st = _json(folder / "sentence_bert_config.json")
        meta = _json(folder / "sentence_encoder.json")
        self.lower = bool(st.get("do_lower_case", False))
        self.pooling = self._pooling(folder)
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        model: Any = _quietly(load_encoder, str(folder))
        limit = st.get("max_seq_length", meta.get("max_seq_length"))
        self.max_len = min(
            int(limit) if limit else int(getattr(self.tokenizer, "model_max_length", 512)),
            _positions(model.config),
        )
        self.model = model.to(self.device).eval()
        self.accepts = frozenset(inspect.signature(self.model.forward).parameters)  # DistilBERT: no token types

    @staticmethod
    def _pooling(folder: Path) -> str:
        for module in _modules(folder):
            if str(module.get("type", "")).endswith("Pooling"):
                conf = _json(folder / str(module.get("path", "")) / "config.json")
                modes = [m for m in _POOLINGS if conf.get(f"pooling_mode_{m}")]
                if len(modes) != 1:
                    raise UserError(
                        f"{at(folder / str(module.get('path', '')))}: pooling {modes or 'none'}, "
                        f"expected exactly one of {', '.join(_POOLINGS)}"
                    )
                return modes[0]
        return "mean_tokens"

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    @torch.inference_mode()
    def encode(self, texts: Sequence[str], *, batch_size: int = 32, prompt: str = "") -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        full = [(prompt + str(t)).strip() for t in texts]
        full = [t.lower() for t in full] if self.lower else full
        order = np.argsort([-len(t) for t in full], kind="stable")  # longest first, as sentence-transformers
        out = np.empty((len(full), self.dim), np.float32)
        for i in range(0, len(full), batch_size):
            idx = order[i : i + batch_size]
            out[idx] = self._batch([full[j] for j in idx])
        return out

    def _batch(self, texts: list[str]) -> np.ndarray:
        enc = self.tokenizer(
            texts, padding=True, truncation="longest_first", max_length=self.max_len, return_tensors="pt"
        ).to(self.device)
        inputs = {k: v for k, v in enc.items() if k in self.accepts}
        with torch.autocast(self.device.type, dtype=self.autocast, enabled=self.autocast is not None):
            states = self.model(**inputs).last_hidden_state
        pooled = pool(states.float(), enc["attention_mask"], self.pooling)
        return torch.nn.functional.normalize(pooled, p=2, dim=1).cpu().numpy()


def _quietly(load: Any, folder: str) -> Any:
    """``load(folder)`` without transformers' load report (BERT's pooler, left out on purpose, listed as
    unexpected on every miner's stderr) and its progress bar."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        return load(folder)
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _positions(config: Any) -> int:
    """The longest input the model's position embeddings allow (RoBERTa's reserve the padding offset)."""
    n = int(getattr(config, "max_position_embeddings", 512) or 512)
    return n - 2 if "roberta" in str(getattr(config, "model_type", "")) else n


def pool(states: Tensor, mask: Tensor, mode: str) -> Tensor:
    """(B, T, H) token states, (B, T) mask -> (B, H), as sentence-transformers' Pooling."""
    m = mask.unsqueeze(-1).to(states.dtype)
    if mode == "cls_token":
        return states[:, 0]
    if mode == "max_tokens":
        return states.masked_fill(m == 0, -1e9).max(dim=1).values
    if mode == "lasttoken":
        last = mask.sum(dim=1) - 1
        return states[torch.arange(states.size(0), device=states.device), last]
    return (states * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)
