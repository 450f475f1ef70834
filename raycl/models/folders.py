"""A model folder of raycl's own: a Hugging Face encoder folder (``AutoModel`` + tokenizer) with one extra module's
weights (a scoring head, a cross-attention) and a JSON of raycl's settings beside it — each file written to a
temporary name and renamed, the JSON last, so a folder that has it is whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.torch import save as safetensors_bytes
from torch import nn

from raycl.files import write_atomic


def save_encoder_folder(
    out_dir: str | Path,
    encoder: Any,
    tokenizer: Any,
    *,
    extra: nn.Module,
    extra_file: str,
    settings: dict[str, Any],
    settings_file: str,
) -> Path:
    """Write ``encoder`` and ``tokenizer`` (``save_pretrained``), ``extra``'s weights to ``extra_file``
    (safetensors) and ``settings`` to ``settings_file`` (JSON) in ``out_dir``; return it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    encoder.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    # a folder written after training, off the step: safetensors serialises host tensors
    state = {k: v.detach().cpu().contiguous() for k, v in extra.state_dict().items()}
    write_atomic(out / extra_file, safetensors_bytes(state))
    write_atomic(out / settings_file, (json.dumps(settings, indent=2) + "\n").encode())
    return out
