"""``python -m raycl.mine TASK ...``: mining alone, to Parquet (``id, source, target, negatives, scores,
model_version``).

``gec``: beam-search negatives of a GEC model for every sentence of the data: the top-k distinct outputs
≠ target (beam ≥ k+1) plus the source when it differs from the target (CL; ``--no-source-negative`` for CL⁻).
The file is what ``--set mining.negatives=PATH`` reads.

    python -m raycl.mine gec --model DIR --data train.m2 --k 3 --out neg.parquet
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raycl.errors import UserError, at, cli_entry


def _add_gec(sub: Any) -> None:
    p = sub.add_parser("gec", help="beam-search negatives for grammatical error correction",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--model", required=True, help="HF model folder (model + tokenizer), e.g. a run's base_model")
    p.add_argument("--data", required=True, action="append", metavar="SPEC",
                   help="M2 file, .tsv or SRC|TGT pair, optionally PATH[START:STOP] (repeatable)")  # fmt: skip
    p.add_argument("--annotator", type=int, default=0, help="M2 annotator whose correction is the target")
    p.add_argument("--k", type=int, default=3, help="beam negatives per sentence (default 3)")
    p.add_argument("--beam", type=int, default=None, help="beam size, ≥ k+1 (default k+1)")
    p.add_argument("--no-source-negative", dest="source_negative", action="store_false",
                   help="CL⁻: never add the source sentence as a negative")  # fmt: skip
    p.add_argument("--batch-size", type=int, default=32, help="sentences per beam-search batch (default 32)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="longest hypothesis in tokens (default 128)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--out", required=True, type=Path, help="the Parquet file to write")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.set_defaults(run=_run_gec)


def _check_gec_args(args: argparse.Namespace) -> None:
    if args.k < 0:
        raise UserError(f"--k: expected an integer ≥ 0, got {args.k}")
    if args.beam is not None and args.beam < args.k + 1:
        raise UserError(f"--beam: expected ≥ k+1 = {args.k + 1}, got {args.beam}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size: expected an integer ≥ 1, got {args.batch_size}")
    if not (Path(args.model) / "config.json").is_file():
        raise UserError(f"{at(args.model)}: expected an HF model folder with config.json (--model)")


def _run_gec(args: argparse.Namespace) -> dict[str, Any]:
    _check_gec_args(args)  # before the slow imports, so a typo fails at once
    from tqdm.auto import tqdm

    from raycl.data.gec import load_examples
    from raycl.miners.beam_search import BeamSearchMiner, length_chunks, write_negatives_parquet
    from raycl.models.seq2seq import Seq2SeqScorer

    examples = load_examples(args.data, annotator=args.annotator)
    scorer = Seq2SeqScorer.from_pretrained(args.model, device=args.device)
    miner = BeamSearchMiner(scorer, k=args.k, beam=args.beam, source_negative=args.source_negative,
                            batch_size=args.batch_size, max_new_tokens=args.max_new_tokens)  # fmt: skip
    mined: list[Any] = [None] * len(examples)
    n_neg, t0 = 0, time.perf_counter()
    with tqdm(total=len(examples), unit="sent", desc="mining", file=sys.stderr) as bar:
        for idx in length_chunks([ex.source for ex in examples], args.batch_size):
            for i, record in zip(idx, miner.mine([examples[i] for i in idx]), strict=True):
                mined[i] = record
                n_neg += len(record.negatives)
            bar.update(len(idx))
            bar.set_postfix(neg_per_s=f"{n_neg / (time.perf_counter() - t0):.1f}")
    seconds = time.perf_counter() - t0
    write_negatives_parquet(args.out, examples, mined, model_version=0)
    return {"out": str(args.out), "sentences": len(examples), "negatives": n_neg, "seconds": round(seconds, 3),
            "negatives_per_s": round(n_neg / max(seconds, 1e-9), 2)}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m raycl.mine", description="Mine hard negatives to Parquet.")
    sub = parser.add_subparsers(dest="task", required=True, metavar="TASK")
    _add_gec(sub)
    return parser


@cli_entry
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    summary = args.run(args)
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"wrote {summary['sentences']} sentences, {summary['negatives']} negatives "
              f"({summary['negatives_per_s']} negatives/s) to {summary['out']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
