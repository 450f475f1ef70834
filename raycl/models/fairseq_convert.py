"""A fairseq ``transformer`` checkpoint as a Hugging Face model folder: FSMT weights and a tokenizer that
reproduces the checkpoint's preprocessing.

GEC-PD (Cao et al., 2021) fine-tunes Kiyono et al. (2019)'s released fairseq transformer-big. transformers' FSMT
family is fairseq's ``transformer`` architecture itself — post-norm layers, sinusoidal positions counted from
``padding_idx + 1``, √d-scaled embeddings, no embedding LayerNorm, an output projection — so the weights map one
to one (``encoder.*`` → ``model.encoder.*``). The tokenizer
(:class:`raycl.models.fairseq_tokenizer.FairseqBPETokenizer`) does what ``fairseq-preprocess`` + subword-nmt did
to the (already tokenised) GEC text: split on whitespace, apply the BPE codes, map to the fairseq dictionary's
ids and end every sentence with ``</s>``; the decoder starts from ``</s>``, as fairseq's ``prev_output_tokens``.

A fairseq checkpoint is a ``torch.save``d dict: ``args`` (an ``argparse.Namespace``, fairseq < 0.10) or ``cfg``
(with a ``model`` section) and ``model`` (the state dict). It is read with ``weights_only=True`` and only
``argparse.Namespace`` allowed; ``trust=True`` (``--trust-checkpoint``) unpickles anything else it holds.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import torch

from raycl.errors import UserError, at

SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # fairseq's Dictionary: bos 0, pad 1, eos 2, unk 3
MARKER = "raycl_conversion.json"  # in every folder the converter writes: the only folders it replaces


# ---------------------------------------------------------------------------------------------- reading
def load_checkpoint(path: Path, *, trust: bool = False) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(hyper-parameters, state dict)`` of a fairseq checkpoint."""
    if not path.is_file():
        raise UserError(f"{at(path)}: no such checkpoint file")
    try:
        if trust:
            ckpt = torch.load(path, map_location="cpu", weights_only=False)
        else:
            with torch.serialization.safe_globals([argparse.Namespace]):
                ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - unpickling errors have many types; all mean "cannot read"
        hint = "" if trust else " (it may hold other pickled objects: --trust-checkpoint loads those)"
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(f"{at(path)}: cannot read a fairseq checkpoint: {first}{hint}") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise UserError(f"{at(path)}: expected a fairseq checkpoint (a dict with 'model' and 'args' or 'cfg')")
    args: dict[str, Any]
    if ckpt.get("args") is not None:
        args = dict(vars(ckpt["args"]))
    elif isinstance(ckpt.get("cfg"), dict) and ckpt["cfg"].get("model") is not None:
        model = ckpt["cfg"]["model"]
        args = dict(vars(model) if isinstance(model, argparse.Namespace) else model)
        args.update({k: v for k, v in (ckpt["cfg"].get("task") or {}).items() if k not in args})
    else:
        raise UserError(
            f"{at(path)}: the checkpoint has neither 'args' nor 'cfg.model': its architecture is unknown"
        )
    return args, ckpt["model"]


def read_dictionary(path: Path) -> list[str]:
    """A fairseq ``dict.*.txt`` (``symbol count [#fairseq:overwrite]`` per line) with the four specials first."""
    if not path.is_file():
        raise UserError(f"{at(path)}: no such dictionary file")
    symbols = list(SPECIALS)
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        parts = line.rstrip().split(" ")
        if len(parts) < 2 or not parts[1].isdigit():
            raise UserError(f"{at(path, n)}: expected 'symbol count', got {line!r}")
        if parts[0] not in SPECIALS:
            symbols.append(parts[0])
    return symbols


def read_codes(path: Path) -> list[tuple[str, str]]:
    """subword-nmt (``#version: 0.2`` then ``a b`` per line) or fastBPE (``a b count``) merge operations."""
    if not path.is_file():
        raise UserError(f"{at(path)}: no such BPE codes file")
    merges = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if n == 1 and line.startswith("#version"):
            continue
        parts = line.split()
        if len(parts) not in (2, 3):
            raise UserError(f"{at(path, n)}: expected a merge 'a b' (or fastBPE's 'a b count'), got {line!r}")
        merges.append((parts[0], parts[1]))
    return merges


# ---------------------------------------------------------------------------------------------- the model
def _arg(args: dict[str, Any], *names: str, default: Any = None) -> Any:
    return next((args[n] for n in names if args.get(n) is not None), default)


def fsmt_config(args: dict[str, Any], state: dict[str, torch.Tensor], src: list[str], tgt: list[str]) -> Any:
    """FSMT's config from the checkpoint's hyper-parameters; variants FSMT cannot express are refused."""
    from transformers import FSMTConfig

    for flag, what in (
        ("encoder_normalize_before", "pre-norm encoder layers"),
        ("decoder_normalize_before", "pre-norm decoder layers"),
        ("encoder_learned_pos", "learned encoder positions"),
        ("decoder_learned_pos", "learned decoder positions"),
        ("layernorm_embedding", "an embedding LayerNorm"),
    ):
        if args.get(flag):
            raise UserError(
                f"checkpoint args: {flag}=True ({what}): FSMT expresses fairseq's post-norm "
                "transformer with sinusoidal positions only"
            )
    d = int(state["encoder.embed_tokens.weight"].shape[1])
    layers = sum(1 for k in state if re.fullmatch(r"encoder\.layers\.\d+\.fc1\.weight", k))
    dec_layers = sum(1 for k in state if re.fullmatch(r"decoder\.layers\.\d+\.fc1\.weight", k))
    # tied when fairseq shares the decoder's input and output embeddings (no separate tensor, or the same values)
    out_w = state.get("decoder.output_projection.weight")
    tied = out_w is None or torch.equal(out_w, state["decoder.embed_tokens.weight"])
    return FSMTConfig(
        langs=[str(_arg(args, "source_lang", default="src")), str(_arg(args, "target_lang", default="trg"))],
        src_vocab_size=int(state["encoder.embed_tokens.weight"].shape[0]),
        tgt_vocab_size=int(state["decoder.embed_tokens.weight"].shape[0]),
        d_model=d,
        encoder_layers=layers,
        decoder_layers=dec_layers,
        encoder_ffn_dim=int(state["encoder.layers.0.fc1.weight"].shape[0]),
        decoder_ffn_dim=int(state["decoder.layers.0.fc1.weight"].shape[0]),
        encoder_attention_heads=int(_arg(args, "encoder_attention_heads", default=8)),
        decoder_attention_heads=int(_arg(args, "decoder_attention_heads", default=8)),
        max_position_embeddings=int(_arg(args, "max_source_positions", default=1024)),
        dropout=float(_arg(args, "dropout", default=0.1)),
        attention_dropout=float(_arg(args, "attention_dropout", default=0.0)),
        activation_dropout=float(_arg(args, "activation_dropout", "relu_dropout", default=0.0)),
        activation_function=str(_arg(args, "activation_fn", default="relu")),
        scale_embedding=not _arg(args, "no_scale_embedding", default=False),
        tie_word_embeddings=tied,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        num_beams=5,
    )


def fsmt_state(state: dict[str, torch.Tensor], model: Any) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under FSMT's names; FSMT's own sinusoidal positions are kept."""
    ours = model.state_dict()
    out = {k: v for k, v in ours.items() if "embed_positions" in k}
    for key, value in state.items():
        if key.endswith(".version") or "embed_positions" in key:
            continue
        name = f"model.{key}"
        if name not in ours:
            raise UserError(
                f"checkpoint: unexpected tensor {key!r} (not part of fairseq's transformer as FSMT has it)"
            )
        out[name] = value.float()
    if "model.decoder.output_projection.weight" not in out:  # shared input/output embeddings
        out["model.decoder.output_projection.weight"] = out["model.decoder.embed_tokens.weight"]
    missing = sorted(set(ours) - set(out))
    if missing:
        more = " …" if len(missing) > 3 else ""
        raise UserError(f"checkpoint: tensors missing for {', '.join(missing[:3])}{more}")
    return out


# ---------------------------------------------------------------------------------------------- the verb
def dictionaries(dict_dir: Path, args: dict[str, Any]) -> tuple[Path, Path]:
    """``dict.{source_lang}.txt`` and ``dict.{target_lang}.txt`` of ``dict_dir`` (one ``dict.*.txt`` serves
    both)."""
    if not dict_dir.is_dir():
        raise UserError(f"{at(dict_dir)}: --dict-dir: no such folder")
    langs = [_arg(args, "source_lang"), _arg(args, "target_lang")]
    found = sorted(dict_dir.glob("dict.*.txt"))
    named = [dict_dir / f"dict.{lang}.txt" for lang in langs if lang]
    if len(named) == 2 and all(p.is_file() for p in named):
        return named[0], named[1]
    if len(found) == 1:
        return found[0], found[0]
    want = " and ".join(p.name for p in named) or "dict.<lang>.txt"
    raise UserError(
        f"{at(dict_dir)}: expected {want} (fairseq-preprocess's dictionaries), found "
        f"{', '.join(p.name for p in found) or 'none'}"
    )


def convert_fairseq_transformer(
    ckpt: Path, *, dict_dir: Path, bpe_codes: Path, out: Path, trust: bool = False, force: bool = False
) -> dict[str, Any]:
    """Write ``out`` (``config.json``, weights, the dictionary and BPE codes of its tokenizer): loadable by
    ``Seq2SeqScorer.from_pretrained`` and so by ``model.checkpoint``, mining and evaluation. ``out`` is replaced
    whole: an existing, non-empty one must be an earlier conversion (its :data:`MARKER`), unless ``force``."""
    from transformers import FSMTForConditionalGeneration

    from raycl.models.fairseq_tokenizer import FairseqBPETokenizer
    from raycl.records import refuse_foreign_dir, save_dir_atomic

    if not force:
        refuse_foreign_dir(
            out,
            marker=MARKER,
            what="an earlier conversion",
            hint="expected a new or empty folder, or an earlier conversion's (--force replaces it)",
        )
    args, state = load_checkpoint(ckpt, trust=trust)
    for key in (
        "encoder.embed_tokens.weight",
        "decoder.embed_tokens.weight",
        "encoder.layers.0.fc1.weight",
        "decoder.layers.0.fc1.weight",
    ):
        if key not in state:
            raise UserError(f"{at(ckpt)}: no tensor {key!r}: not a fairseq transformer checkpoint")
    src_path, tgt_path = dictionaries(dict_dir, args)
    src, tgt = read_dictionary(src_path), read_dictionary(tgt_path)
    for path, symbols, key in ((src_path, src, "encoder"), (tgt_path, tgt, "decoder")):
        rows = int(state[f"{key}.embed_tokens.weight"].shape[0])
        if not len(symbols) <= rows < len(symbols) + 8:
            raise UserError(f"{at(path)}: {len(symbols)} symbols for a {key} embedding of {rows} rows")
    if src != tgt:
        raise UserError(
            f"{at(tgt_path)}: differs from {src_path.name}; raycl's scorer uses one tokenizer for "
            "sources and targets (GEC-PD shares one dictionary)"
        )
    config = fsmt_config(args, state, src, tgt)
    model = FSMTForConditionalGeneration(config).eval()
    model.load_state_dict(fsmt_state(state, model))
    read_codes(bpe_codes)  # checked here: the tokenizer reads it as it is

    def save(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer = FairseqBPETokenizer(
            str(src_path), str(bpe_codes), model_max_length=config.max_position_embeddings
        )
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(
            json.dumps(
                {
                    "from": str(ckpt),
                    "arch": args.get("arch"),
                    "dictionary": str(src_path),
                    "bpe_codes": str(bpe_codes),
                },
                indent=2,
            )
            + "\n"
        )

    out.parent.mkdir(parents=True, exist_ok=True)
    save_dir_atomic(save, out)
    params = sum(p.numel() for p in model.parameters())
    return {
        "out": str(out),
        "arch": args.get("arch"),
        "layers": [config.encoder_layers, config.decoder_layers],
        "d_model": config.d_model,
        "vocab": config.src_vocab_size,
        "parameters": params,
    }
