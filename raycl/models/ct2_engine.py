"""CTranslate2 as the beam-search engine of the GEC miner (``mining.engine: ctranslate2``).

A miner only proposes candidates — the trainer rescores every negative under its current weights with gradients
(``raycl.recipes.gec.step``) — so the fastest engine that finds the same n-best is the right one. CTranslate2 runs
BART/mBART/Marian/T5 beam search in C++ with int8 weights on CPU and fp16/bf16 on GPU. :class:`CT2Seq2Seq` gives
it the decoding interface of :class:`~raycl.models.seq2seq.Seq2SeqScorer` (``generate``, ``score_texts``): the
same tokenizer (HF's, or the fairseq BPE of a converted checkpoint), the same search (:mod:`raycl.models.decoding`:
forced ``<s>``, beam, length penalty 1, fairseq's length bound, no n-gram blocking) and S(t|s) as the *sum* of the
hypothesis's token log-probs (``<s>`` and ``</s>`` included), recovered from the engine's length-normalised beam
score — one decoding pass, no rescoring.

Conversion runs once per node, weight version and compute type (:func:`converted`: a file lock), cached in the
user's own cache (``$XDG_CACHE_HOME/raycl/ct2/<model path digest>/v<version>-<digest>-<type>/``, ``~/.cache``
without ``XDG_CACHE_HOME``; mode 0700, and a folder is reused only if this user owns it — never a shared or
predictable place another user could plant a model in), written to a temp name and renamed; a killed
converter's temporary folders are removed by the next, and versions older than the newest two are pruned
(version 0, the base, stays). The digest is of the weights themselves (the folder's bytes for version 0, the
published state dict's after): Tune trials that publish their own "version 1" of the same base model never read
each other's conversion. ``conversions.log`` in the cache folder has a line per conversion.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch

from raycl.errors import UserError
from raycl.files import check_owner, flocked
from raycl.models.decoding import Decoding, ct2_options, keep

T = TypeVar("T")
CONVERSIONS_LOG = "conversions.log"  # one JSON line per conversion in a cache folder (host, pid, seconds)
_VERSION_DIR = re.compile(r"v(\d+)-[0-9a-f]+-\w+")  # v<version>-<digest>-<compute type>
COMPUTE_TYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "int8": "int8"}


CUBLAS_HELP = "CTranslate2's CUDA build needs cuBLAS 12: pip install nvidia-cublas-cu12"
_LIBRARY = re.compile(r"(lib[\w.+-]+\.so(?:\.\d+)*) is not found or cannot be loaded")


def ct2_missing() -> str | None:
    """Why CTranslate2 cannot be imported here (a partial install: it is a dependency, but a machine whose
    packages were carried in by hand may lack it); None if it can."""
    try:
        import ctranslate2  # noqa: F401
        from ctranslate2.converters import transformers  # noqa: F401
    except ImportError as err:
        return f"ctranslate2 cannot be imported here ({err}): pip install ctranslate2"
    return None


def load_failure(err: BaseException, device: str) -> str | None:
    """What a failed CTranslate2 model load on a GPU lacks, said for the user, or None for any other error. Its
    CUDA build opens cuBLAS when a model is loaded on the GPU, not at import: a machine with CUDA 13's libraries
    only (a CUDA 13 build of torch brings no ``libcublas.so.12``) imports it, lists compute types, then fails."""
    if not device.startswith("cuda") or not isinstance(err, (RuntimeError, OSError)):
        return None
    found = _LIBRARY.search(str(err))
    if found is None:
        return None
    help_ = CUBLAS_HELP if "cublas" in found.group(1) else "install the CUDA library CTranslate2's build needs"
    return f"CTranslate2 cannot load {found.group(1)} on {device} ({help_})"


def ct2_unsupported(model_dir: str | Path, *, device: str, precision: str) -> str | None:
    """Why CTranslate2 cannot decode the HF folder ``model_dir`` at ``precision`` on ``device``; None if it can."""
    missing = ct2_missing()
    if missing is not None:
        return missing
    from ctranslate2.converters import transformers as converters
    from transformers import CONFIG_MAPPING

    model_type = _read_config(Path(model_dir)).get("model_type", "")
    name = CONFIG_MAPPING[model_type].__name__ if model_type in CONFIG_MAPPING else repr(model_type)
    if name not in getattr(converters, "_MODEL_LOADERS", {name: None}):
        return f"CTranslate2 has no converter for {name}"
    try:
        compute_type(precision, device)
    except (UserError, RuntimeError, ValueError) as err:  # RuntimeError: no CUDA driver here
        return str(err).removeprefix("mining.precision: ")
    return cuda_libraries_missing(device)


# the CUDA libraries a CTranslate2 CUDA build opens when a model is loaded, by its major version
CUDA_LIBRARIES = {4: ("libcublas.so.12",)}


def cuda_libraries_missing(device: str) -> str | None:
    """Which CUDA library CTranslate2 would fail to open on ``device`` (found as its loader finds it: by name, in
    the process's library path or already loaded, e.g. by torch), said for the user; None if none."""
    if not device.startswith("cuda"):
        return None
    import ctranslate2

    for name in CUDA_LIBRARIES.get(int(ctranslate2.__version__.split(".")[0]), ()):
        try:
            _dlopen(name)
        except OSError:
            return load_failure(RuntimeError(f"Library {name} is not found or cannot be loaded"), device)
    return None


def _dlopen(name: str) -> None:
    import ctypes

    ctypes.CDLL(name)


def compute_type(precision: str, device: str) -> str:
    """``mining.precision`` → CTranslate2 compute type on ``device`` (int8 on a GPU: int8 weights, fp16 math)."""
    import ctranslate2

    kind = "cuda" if device.startswith("cuda") else "cpu"
    if precision not in COMPUTE_TYPES:
        raise UserError(
            f"mining.precision: expected one of {', '.join(COMPUTE_TYPES)} with mining.engine="
            f"ctranslate2, got {precision!r}"
        )
    wanted = COMPUTE_TYPES[precision] if not (precision == "int8" and kind == "cuda") else "int8_float16"
    supported = set(ctranslate2.get_supported_compute_types(kind))
    if wanted not in supported:
        raise UserError(
            f"mining.precision: {precision} ({wanted}) is not supported by CTranslate2 on {kind} "
            f"here, expected one of {', '.join(sorted(supported))}"
        )
    return wanted


def convert(hf_dir: str | Path, out_dir: Path, *, quantization: str) -> Path:
    """``hf_dir`` converted for CTranslate2 into ``out_dir`` unless it is there (:func:`converted`)."""
    return converted(out_dir, lambda _: Path(hf_dir), quantization=quantization, load=lambda folder: folder)


def converted(
    out_dir: Path, make_hf: Callable[[Path], Path], *, quantization: str, load: Callable[[Path], T]
) -> T:
    """``load(out_dir)`` once ``out_dir`` holds the conversion of the HF folder ``make_hf(scratch)`` gives.

    One conversion per node and folder: every miner of a node takes ``out_dir``'s lock file (``fcntl.flock``, let
    go by the kernel when a miner dies), the first converts and the others wait, then find it done. Under the
    lock, temporary folders of ``out_dir`` left by a killed converter are removed (none can be in use: the lock
    is held); the conversion is written to a temporary name and renamed; ``load`` runs under the lock too, so that
    no pruner deletes the folder while it is read. Afterwards old versions are pruned (:func:`prune`)."""
    root = out_dir.parent
    root.mkdir(parents=True, exist_ok=True)
    with flocked(root / f".{out_dir.name}.lock"):
        if (out_dir / "model.bin").is_file():
            check_owner(out_dir, what=CACHE, hint=CACHE_HINT)
        else:
            for stale in root.glob(f".{out_dir.name}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            _convert_now(make_hf, out_dir, quantization=quantization)
        got = load(out_dir)
    prune(root, keep=out_dir.name)
    return got


def _convert_now(make_hf: Callable[[Path], Path], out_dir: Path, *, quantization: str) -> None:
    """The conversion itself, into a temporary sibling renamed to ``out_dir``; one line in ``conversions.log``."""
    from ctranslate2.converters import TransformersConverter

    class Converter(TransformersConverter):  # type: ignore[misc]
        vocab_size = 0

        def load_model(self, model_class: Any, model_name_or_path: str, **kwargs: Any) -> Any:
            model = super().load_model(model_class, model_name_or_path, **kwargs)
            # CTranslate2's BART loader reads BartConfig.normalize_before, which transformers 5 dropped: BART is
            # post-norm (mBART's loader sets its own True)
            if not hasattr(model.config, "normalize_before"):
                model.config.normalize_before = False
            self.vocab_size = int(model.config.vocab_size)
            return model

        def load_tokenizer(self, tokenizer_class: Any, model_name_or_path: str, **kwargs: Any) -> Any:
            # raycl's own tokenizer choice (a converted fairseq folder has its BPE); an embedding matrix larger
            # than the tokenizer (padded vocabularies) gets placeholder tokens that are never produced
            return _PaddedVocab(_tokenizer(Path(model_name_or_path)), self.vocab_size)

    t0 = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-hf-", dir=out_dir.parent))
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        Converter(str(make_hf(scratch)), load_as_float16=False).convert(
            str(tmp), quantization=quantization, force=True
        )
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    line = {
        "folder": out_dir.name,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "seconds": round(time.perf_counter() - t0, 3),
        "at": time.time(),
    }
    with open(out_dir.parent / CONVERSIONS_LOG, "a") as log:
        log.write(json.dumps(line) + "\n")


def prune(root: Path, *, keep: str = "", versions: int = 2) -> list[str]:
    """Remove the conversions in ``root`` older than its newest ``versions`` weight versions (version 0, the base
    every miner starts from, stays), and temporary folders no converter holds the lock of (a killed miner's).
    A folder whose lock another process holds (converting or loading it) is left for a later prune."""
    folders = {p.name: int(m.group(1)) for p in root.iterdir() if (m := _VERSION_DIR.fullmatch(p.name))}
    newest = sorted(set(folders.values()), reverse=True)[:versions]
    old = [name for name, v in folders.items() if v != 0 and v not in newest and name != keep]
    temps = {p.name.split(".tmp-")[0][1:] for p in root.glob(".*.tmp-*")} - {keep}
    removed = []
    for name in [*old, *temps]:
        with flocked(root / f".{name}.lock", blocking=False) as mine:
            if not mine:
                continue
            for stale in root.glob(f".{name}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            if name in old:
                shutil.rmtree(root / name, ignore_errors=True)
                removed.append(name)
    return removed


def state_digest(state_dict: Mapping[str, torch.Tensor]) -> str:
    """A short hash of a state dict's names, shapes, dtypes and bytes (about 1 s a GB)."""
    h = hashlib.blake2b(digest_size=8)
    for name in sorted(state_dict):
        v = state_dict[name].detach().cpu().contiguous()
        h.update(f"{name}:{tuple(v.shape)}:{v.dtype}".encode())
        h.update(v.reshape(-1).view(torch.uint8).numpy().data)  # the bytes, without a copy
    return h.hexdigest()


def folder_digest(hf_dir: Path) -> str:
    """A short hash of an HF folder's files by content (names and bytes, about 1 s a GB): a folder rewritten in
    place with other weights is converted again; one copied, or touched, with the same weights is not."""
    h = hashlib.blake2b(digest_size=8)
    for path in sorted(p for p in hf_dir.iterdir() if p.is_file() and not p.name.startswith(".")):
        h.update(f"{path.name}:{path.stat().st_size}\n".encode())
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
    return h.hexdigest()


CACHE, CACHE_HINT = "a CTranslate2 cache folder", "remove it, or set XDG_CACHE_HOME"


def _cache_root(hf_dir: Path) -> Path:
    """This user's conversion cache of ``hf_dir`` (mode 0700, owned by this user, or refused); where the home
    folder cannot be written, a fresh private temp folder (conversion per process, never a predictable path)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "raycl"
    digest = hashlib.sha256(str(hf_dir.resolve()).encode()).hexdigest()[:16]
    try:
        for d in (base, base / "ct2"):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            check_owner(d, what=CACHE, hint=CACHE_HINT)
            d.chmod(0o700)
    except OSError:
        return Path(tempfile.mkdtemp(prefix="raycl-ct2-"))
    root = base / "ct2" / digest
    root.mkdir(mode=0o700, exist_ok=True)
    check_owner(root, what=CACHE, hint=CACHE_HINT)
    return root


class CT2Seq2Seq:
    """A CTranslate2 ``Translator`` over an HF seq2seq folder with ``Seq2SeqScorer``'s decoding interface.

    The search and the scores are HF ``generate``'s (:mod:`raycl.models.decoding`); float32 kernels differ, so
    near-ties in the beam may resolve the other way (docs/mining.md, "Mining engines")."""

    training = False  # never trained: the miner's eval-mode switch has nothing to do

    def __init__(
        self, hf_dir: Path, tokenizer: Any, *, device: str, compute: str, cache_dir: Path, version: int = 0
    ) -> None:
        self.hf_dir, self.tokenizer, self.compute, self.cache_dir = hf_dir, tokenizer, compute, cache_dir
        self.device_name = device
        self.version = -1
        self.translator: Any = None
        self._config = _read_config(hf_dir)
        self._load(hf_dir, version)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        *,
        device: str = "cpu",
        precision: str = "fp32",
        cache_dir: str | Path | None = None,
        version: int = 0,
    ) -> CT2Seq2Seq:
        hf_dir = Path(name_or_path)
        tokenizer = _tokenizer(hf_dir)
        compute = compute_type(precision, device)
        return cls(
            hf_dir,
            tokenizer,
            device=device,
            compute=compute,
            cache_dir=Path(cache_dir) if cache_dir else _cache_root(hf_dir),
            version=version,
        )

    # ------------------------------------------------------------------------------------------ weights
    def _load(self, hf_dir: Path, version: int) -> None:
        folder = self.cache_dir / f"v{version}-{folder_digest(hf_dir)}-{self.compute}"
        self.translator = converted(folder, lambda _: hf_dir, quantization=self.compute, load=self._translator)
        self.version = version

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], *, version: int) -> None:
        """Published weights: the HF model with them saved and converted once for ``version``, then loaded."""
        if version == self.version:
            return
        # keyed by content, not the version alone: concurrent trials publish their own "version 1" of one base
        folder = self.cache_dir / f"v{version}-{state_digest(state_dict)}-{self.compute}"

        def save_hf(scratch: Path) -> Path:  # only when this miner converts: the others find it done
            from transformers import AutoConfig, AutoModelForSeq2SeqLM

            model = AutoModelForSeq2SeqLM.from_config(AutoConfig.from_pretrained(str(self.hf_dir)))
            model.load_state_dict(_hf_keys(model, state_dict))
            model.save_pretrained(scratch)
            self.tokenizer.save_pretrained(scratch)
            return scratch

        self.translator = converted(folder, save_hf, quantization=self.compute, load=self._translator)
        self.version = version

    def _translator(self, folder: Path) -> Any:
        import ctranslate2

        device, _, index = self.device_name.partition(":")
        return ctranslate2.Translator(
            str(folder),
            device=device,
            device_index=int(index or 0),
            compute_type=self.compute,
            intra_threads=torch.get_num_threads() if device == "cpu" else 0,
        )

    # ------------------------------------------------------------------------------------------ decoding
    @property
    def max_positions(self) -> int:
        return int(self._config.get("max_position_embeddings") or 1024)

    @property
    def device(self) -> torch.device:
        return torch.device(self.device_name)

    def _tokens(self, texts: list[str], max_length: int) -> list[list[str]]:
        ids = self.tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
        return [self.tokenizer.convert_ids_to_tokens(row) for row in ids]

    def _prefix(self) -> list[str] | None:
        bos = self.tokenizer.bos_token_id
        adds_bos = bos is not None and self.tokenizer("a")["input_ids"][0] == bos
        return [self.tokenizer.bos_token] if adds_bos else None

    def generate(
        self,
        sources: list[str],
        *,
        num_beams: int,
        num_return_sequences: int = 1,
        max_new_tokens: int = 128,
        max_len_a: float = 0.0,
        drop_cut: bool = False,
        batch_size: int = 32,
        max_length: int | None = None,
        rank_by: str = "sum_logprob",
    ) -> list[list[tuple[str, float]]]:
        """Per source, up to ``num_return_sequences`` ``(text, S(text|source))`` in the beam's order (``rank_by=
        "beam"``) or by S; the search is :mod:`raycl.models.decoding`'s, as ``Seq2SeqScorer.generate``'s. S = the
        engine's score × the hypothesis length (``<s>`` and ``</s>`` included: at length penalty 1 CTranslate2
        divides the summed log-prob of the decoded tokens by it) + the forced ``<s>``'s log-prob, which the engine
        leaves out of its sum (one step of the decoder, ``score_batch``)."""
        max_length = max_length or self.max_positions
        d = Decoding(num_beams, num_return_sequences, max_len_a, max_new_tokens, drop_cut)
        prefix = self._prefix()
        tokens = self._tokens(sources, max_length)
        limits = [d.limit(len(t), self.max_positions) for t in tokens]
        results = self.translator.translate_batch(
            tokens,
            [prefix] * len(sources) if prefix else None,
            **ct2_options(d, steps=max(limits, default=1), prefix_tokens=len(prefix or []), batch_size=batch_size),
        )
        first = self._prefix_log_probs(tokens, prefix)
        eos = self.tokenizer.eos_token
        out: list[list[tuple[str, float]]] = []
        for res, limit, lp0 in zip(results, limits, first, strict=True):
            hyps = []
            for toks, score in zip(res.hypotheses, res.scores, strict=True):
                if keep(toks, eos=eos, limit=limit, drop_cut=drop_cut):
                    ids = self.tokenizer.convert_tokens_to_ids(toks)
                    text = " ".join(self.tokenizer.decode(ids, skip_special_tokens=True).split())
                    hyps.append((text, float(score) * len(toks) + lp0))
            out.append(hyps if rank_by == "beam" else sorted(hyps, key=lambda h: -h[1]))
        return out

    def _prefix_log_probs(self, tokens: list[list[str]], prefix: list[str] | None) -> list[float]:
        """Each source's log-prob of the forced prefix (``<s>``), 0 without one."""
        if not prefix:
            return [0.0] * len(tokens)
        got = self.translator.score_batch(tokens, [prefix] * len(tokens))  # the prefix, then the appended </s>
        return [float(sum(r.log_probs[: len(prefix)])) for r in got]

    def score_texts(
        self, sources: list[str], targets: list[str], *, max_length: int | None = None, batch_size: int = 32
    ) -> list[float]:
        """S(target_i | source_i): summed log-probs of the target's tokens as the tokenizer writes it."""
        max_length = max_length or self.max_positions
        eos = self.tokenizer.eos_token
        # score_batch appends the end token itself: the targets go without theirs
        targets_tok = [t[:-1] if t and t[-1] == eos else t for t in self._tokens(targets, max_length)]
        results = self.translator.score_batch(
            self._tokens(sources, max_length), targets_tok, max_batch_size=batch_size
        )
        return [float(sum(r.log_probs)) for r in results]


def _tokenizer(hf_dir: Path) -> Any:
    from transformers import AutoTokenizer

    from raycl.models.fairseq_tokenizer import FairseqBPETokenizer, is_fairseq_folder

    return (
        FairseqBPETokenizer.from_folder(hf_dir)
        if is_fairseq_folder(hf_dir)
        else AutoTokenizer.from_pretrained(str(hf_dir))
    )


class _PaddedVocab:
    """A tokenizer whose ``get_vocab`` is padded to ``size`` entries (for the converter only)."""

    def __init__(self, tokenizer: Any, size: int) -> None:
        self._tokenizer, self._size = tokenizer, size

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def get_vocab(self) -> dict[str, int]:
        vocab = dict(self._tokenizer.get_vocab())
        for i in range(len(vocab), self._size):
            vocab[f"<raycl_unused_{i}>"] = i
        return vocab


def _read_config(hf_dir: Path) -> dict[str, Any]:
    import json

    return dict(json.loads((hf_dir / "config.json").read_text()))


def _hf_keys(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The HF model's own keys from a published state dict: the model's, a ``Seq2SeqScorer``'s (``model.``) or a
    DDP-wrapped one's (``module.``)."""
    sd = {k.removeprefix("module."): v for k, v in state_dict.items()}
    own = set(model.state_dict())
    if not set(sd) <= own and all(k.startswith("model.") for k in sd):
        sd = {k.removeprefix("model."): v for k, v in sd.items()}
    return sd
