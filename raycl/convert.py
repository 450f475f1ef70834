"""``python -m raycl.convert fairseq-transformer CKPT --dict-dir DIR --bpe-codes FILE --out HF_DIR``.

Converts a fairseq ``transformer`` checkpoint — GEC-PD's base model is Kiyono et al. (2019)'s released
transformer-big — into a Hugging Face model folder (transformers' FSMT, fairseq's architecture) with a tokenizer
that reproduces its preprocessing (whitespace-tokenised text, the BPE codes, the fairseq dictionary's ids). The
folder is what ``--set model.checkpoint=HF_DIR`` (skip step 1 of Algorithm 1), ``raycl.mine --model`` and
evaluation load with ``from_pretrained``. The checkpoint is unpickled with only ``argparse.Namespace`` allowed
unless ``--trust-checkpoint`` is given (a checkpoint is code: trust only files from a source you trust).
``--out`` is replaced whole, so an existing, non-empty folder that is not an earlier conversion is refused unless
``--force``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from raycl.errors import cli_entry, summary_out


def parser(prog: str = "python -m raycl.convert") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="kind", required=True)
    f = sub.add_parser("fairseq-transformer", help="a fairseq transformer checkpoint → an HF (FSMT) model folder")
    f.add_argument("checkpoint", type=Path, help="the fairseq checkpoint (checkpoint_best.pt, …)")
    f.add_argument("--dict-dir", required=True, type=Path, help="folder with fairseq's dict.<lang>.txt files")
    f.add_argument("--bpe-codes", required=True, type=Path, help="the BPE codes (subword-nmt or fastBPE)")
    f.add_argument("--out", required=True, type=Path, help="the Hugging Face model folder to write")
    f.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="unpickle every object the checkpoint holds (default: tensors and argparse.Namespace)",
    )
    f.add_argument(
        "--force",
        action="store_true",
        help="replace --out even if it is not an earlier conversion (its raycl_conversion.json)",
    )
    f.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    return p


@cli_entry
def main(argv: list[str] | None = None, *, prog: str = "python -m raycl.convert") -> None:
    args = parser(prog).parse_args(argv)
    from raycl.models.fairseq_convert import convert_fairseq_transformer

    summary = convert_fairseq_transformer(
        args.checkpoint,
        dict_dir=args.dict_dir,
        bpe_codes=args.bpe_codes,
        out=args.out,
        trust=args.trust_checkpoint,
        force=args.force,
    )
    print(
        json.dumps(summary, indent=2)
        if args.json
        else f"wrote {summary['out']} "
        f"({summary['parameters'] / 1e6:.1f} M parameters, vocabulary {summary['vocab']})",
        file=summary_out(),
    )


if __name__ == "__main__":
    main()
