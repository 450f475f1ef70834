"""Which engine decodes a miner's beam search (``mining.engine``): chosen here and nowhere else.

``hf`` is the model's own ``generate`` (:class:`~raycl.models.seq2seq.Seq2SeqScorer`), ``ctranslate2`` the same
search in CTranslate2 (:class:`~raycl.models.ct2_engine.CT2Seq2Seq`); ``auto`` takes CTranslate2 where it
converts the model and runs the precision on the device, else HF. :func:`choose_engine` is the rule — on the
driver, before any miner starts, or on a GPU like the miners' (``raycl.distributed.mining_actors``);
:func:`open_decoder` opens the chosen engine in a miner, where ``auto`` still falls back to HF when CTranslate2's
CUDA libraries fail to load.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from raycl.errors import UserError
from raycl.models.ct2_engine import COMPUTE_TYPES, ct2_missing, ct2_unsupported, cuda_libraries_missing
from raycl.models.decoding import ENGINES

if TYPE_CHECKING:
    from raycl.models.seq2seq import Seq2SeqScorer

DEFERRED = "auto"  # the engine of a choice left to each GPU miner, on its own device


@dataclass(frozen=True)
class EngineChoice:
    """What decodes: ``engine`` (``hf`` | ``ctranslate2``, or :data:`DEFERRED` while GPU miners choose on their own
    device), why, and what was asked for (``mining.engine``)."""

    wanted: str
    engine: str
    why: str

    @property
    def deferred(self) -> bool:
        return self.engine == DEFERRED

    def line(self, precision: str) -> str | None:
        """What the driver says of the choice (None where nothing was left to choose: an engine as configured)."""
        if self.deferred:
            return (
                "mining.engine=auto: each GPU miner decodes with CTranslate2 if it converts the model and "
                f"runs {precision} there, else with HF"
            )
        if self.wanted == "auto":
            return f"mining.engine=auto → {self.engine} ({self.why.removeprefix('auto: ')})"
        return None


def choose_engine(
    wanted: str, model_dir: str | Path, *, device: str, precision: str, gpus_per_miner: float = 0.0
) -> EngineChoice:
    """``mining.engine`` → the engine that decodes ``model_dir`` at ``precision`` on ``device``. ``auto``:
    CTranslate2 where it converts the model and runs ``precision`` on ``device`` (its candidates are HF's for the
    large majority of sentences, faster), else HF; ``int8`` exists only in CTranslate2, so ``auto`` at int8 is
    CTranslate2 or an error. With ``gpus_per_miner`` > 0, ``auto`` is left to each GPU miner (:data:`DEFERRED`):
    this process may have no GPU like theirs. An impossible choice (int8 without CTranslate2) is one line here,
    before Ray or any trial starts."""
    if wanted not in ENGINES:
        raise UserError(f"mining.engine: expected one of {' | '.join(ENGINES)}, got {wanted!r}")
    if gpus_per_miner > 0 and wanted == "auto":
        return EngineChoice(wanted, DEFERRED, "auto: each GPU miner chooses on its own device")
    if wanted == "hf" and precision == "int8":
        raise UserError("mining.precision: int8 exists only with mining.engine=ctranslate2 or auto, got hf")
    if wanted == "ctranslate2" and (missing := ct2_missing() or cuda_libraries_missing(device)) is not None:
        raise UserError(f"mining.engine=ctranslate2: {missing}; or set mining.engine=hf (or auto)")
    if wanted != "auto":
        return EngineChoice(wanted, wanted, "as configured")
    why = ct2_unsupported(model_dir, device=device, precision=precision)
    if why is None:
        return EngineChoice(
            wanted,
            "ctranslate2",
            f"auto: CTranslate2 decodes this model at {COMPUTE_TYPES[precision]} on {device}",
        )
    if precision == "int8":
        raise UserError(f"mining.precision: int8 needs CTranslate2, which cannot run here ({why})")
    return EngineChoice(wanted, "hf", f"auto: {why}")


def engine_versions(engine: str) -> dict[str, str]:
    """The libraries that decode (HF's tokenizer also feeds CTranslate2)."""
    from importlib.metadata import version

    return {lib: version(lib) for lib in ("torch", "transformers", *(["ctranslate2"] * (engine == "ctranslate2")))}


def open_decoder(model_path: str, *, wanted: str, device: str, precision: str) -> Any:
    """The decoding engine over ``model_path`` on ``device``, with ``Seq2SeqScorer``'s decoding interface
    (``generate``, ``score_texts``): :func:`choose_engine`'s choice, said once on stderr for ``auto``; CTranslate2
    converts the folder once per weight version (``precision`` → its compute type), HF runs ``precision`` as
    autocast (GPU weights cast: :func:`in_precision`). ``auto`` whose CTranslate2 cannot load its CUDA libraries
    here decodes with HF."""
    choice = choose_engine(wanted, model_path, device=device, precision=precision)
    decoder = (
        _open_ct2(model_path, device, precision, auto=wanted == "auto") if choice.engine == "ctranslate2" else None
    )
    if isinstance(decoder, str):  # auto, and its CUDA libraries would not load
        choice, decoder = EngineChoice(wanted, "hf", f"auto: {decoder}"), None
    if wanted == "auto":
        print(f"raycl miner: mining.engine={choice.engine} ({choice.why})", file=sys.stderr)
    if decoder is not None:
        return decoder
    from raycl.models.seq2seq import Seq2SeqScorer

    return in_precision(Seq2SeqScorer.from_pretrained(model_path, device=device), device, precision)


def in_precision(scorer: Seq2SeqScorer, device: str, precision: str) -> Seq2SeqScorer:
    """A GPU miner's HF weights in its precision (bf16, fp16) rather than autocast around them: a beam search is
    driven step by step from the host, and autocast's casts of activations and weights around every op add kernels
    to each step (bf16 mined 8.9 negatives per miner-busy second against fp32's 25.3 on an H200, BART-large's
    shape). The scores stay fp32 (the scorer's log-probs are taken in fp32). On a CPU autocast stays."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    if dtype is not None and device.startswith("cuda"):
        scorer.to(dtype)
    return scorer


def _open_ct2(model_path: str, device: str, precision: str, *, auto: bool) -> Any:
    """The CTranslate2 engine over ``model_path``; where it cannot load the CUDA libraries it needs, why (with
    ``auto``: HF decodes instead) or one line naming them (``mining.engine=ctranslate2``)."""
    from raycl.models.ct2_engine import CT2Seq2Seq, load_failure

    try:
        return CT2Seq2Seq.from_pretrained(model_path, device=device, precision=precision)
    except (RuntimeError, OSError) as err:
        why = load_failure(err, device)
        if why is None:
            raise
        if auto:
            return why
        raise UserError(f"mining.engine=ctranslate2: {why}; or set mining.engine=hf (or auto)") from None
