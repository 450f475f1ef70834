"""``python -m raycl.mine TASK ...``: mining alone, to Parquet (``id, source, target, negatives, scores,
model_version``).

``gec``: beam-search negatives of a GEC model for every sentence of the data: the top-k distinct outputs
≠ target (beam ≥ k+1) plus the source when it differs from the target (CL; ``--no-source-negative`` for CL⁻).
The file is what ``--set mining.negatives=PATH`` reads. Negatives that another M2 annotator's correction equals
(false negatives) are counted (``--json``: ``false_negatives``) and kept, or dropped (``--false-negatives drop``).

    python -m raycl.mine gec --model DIR --data train.m2 --k 3 --out neg.parquet

At scale, OUT is a directory and the mining runs on Ray Data (``raycl.distributed.corpus``): one scan of the
files cuts them into ranges of ``--shard-size`` sentences (byte offsets only: the driver never holds sentences), an
actor pool of ``--num-miners`` miners (``MIN-MAX`` autoscales; an embedded local Ray, or the cluster with
``--address auto``) reads each range from the file, mines it and writes it as ``part-<range>.parquet``. Running it
again with the same OUT and settings resumes: ranges whose shard exists are skipped (other settings: exit 2 naming
them; ``--overwrite`` mines afresh). A range that fails ``--range-retries`` + 1 times is listed in
OUT/_failures.json; the run stops after more than ``--max-failed-ranges`` of them and exits 1 listing them.
``--num-miners 0`` mines the ranges in this process, without Ray. The same as a library call:
``raycl.mine_negatives``.

    python -m raycl.mine gec --model DIR --data big.m2 --k 3 --out negs/ --num-miners 4 --address auto
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raycl.errors import UserError, at, cli_entry, summary_out
from raycl.files import TRUST_HINT, check_ours
from raycl.mine_dense import add_dense
from raycl.miners.false_negatives import rate_text
from raycl.storage import check_uri, is_uri, push, stage


def _add_gec(sub: Any) -> None:
    p = sub.add_parser(
        "gec",
        help="beam-search negatives for grammatical error correction",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, help="HF model folder (model + tokenizer), e.g. a run's base_model")
    p.add_argument(
        "--data",
        required=True,
        action="append",
        metavar="SPEC",
        help="M2 file, .tsv or SRC|TGT pair, optionally PATH[START:STOP] (repeatable)",
    )
    p.add_argument("--annotator", type=int, default=0, help="M2 annotator whose correction is the target")
    p.add_argument("--k", type=int, default=3, help="beam negatives per sentence (default 3)")
    p.add_argument("--beam", type=int, default=None, help="beam size, ≥ k+1 (default k+1)")
    p.add_argument(
        "--no-source-negative",
        dest="source_negative",
        action="store_false",
        help="CL⁻: never add the source sentence as a negative",
    )
    p.add_argument("--batch-size", type=int, default=32, help="sentences per beam-search batch (default 32)")
    p.add_argument(
        "--max-len-a",
        type=float,
        default=0.0,
        help="hypotheses ≤ a · source tokens + b tokens, fairseq's bound (default a 0, b 200); "
        "one that does not end within it is never a negative",
    )
    p.add_argument("--max-len-b", type=int, default=200, help="see --max-len-a (default 200)")
    p.add_argument(
        "--rank-by",
        choices=["beam", "sum_logprob"],
        default="beam",
        help="the n-best's order: the beam's length-normalised score (the paper; default) or S(t~|s)",
    )
    p.add_argument(
        "--refill",
        action="store_true",
        help="k negatives ≠ target even when the target is in the top k (default: the paper's k−1)",
    )
    p.add_argument(
        "--false-negatives",
        choices=["keep", "drop"],
        default="keep",
        help="negatives that another M2 annotator's correction equals (the source where one made no "
        "edit): keep (the paper; default) or drop (with --refill the n-best refills); counted "
        "either way, in --json's false_negatives",
    )
    p.add_argument(
        "--engine",
        choices=["auto", "hf", "ctranslate2"],
        default="auto",
        help="beam search: CTranslate2 (converted once, cached by the model folder) or HF generate; "
        "auto (default) = CTranslate2 where it converts the model and runs --precision, else HF",
    )
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16", "fp16", "int8"],
        default="fp32",
        help="hf: autocast; ctranslate2: compute type, int8 on CPU (default fp32)",
    )
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument(
        "--out",
        required=True,
        help="a .parquet file (mined in this process), or a directory of Parquet shards; an object "
        "store URI (s3://bucket/prefix, gs://…) is always a shard directory",
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.add_argument(
        "--trust-out",
        action="store_true",
        help="use a local --out that is not yours alone (another user owns or can write it or a folder "
        "above it, or a link leads out of it), which raycl otherwise refuses: a resumed shard "
        "directory is read back; give it only for a folder whose writers you trust",
    )
    g = p.add_argument_group("streamed, sharded mining (any of these makes OUT a shard directory)")
    g.add_argument("--shards", action="store_true", help="write OUT as a shard directory even if named *.parquet")
    g.add_argument(
        "--num-miners",
        type=_miners,
        default=None,
        metavar="N|MIN-MAX",
        help="miner actors, MIN-MAX to autoscale (default 1; 0 = in this process)",
    )
    g.add_argument("--address", default=None, help="Ray cluster: auto or HOST:PORT (default: an embedded Ray)")
    g.add_argument("--cpus-per-miner", type=float, default=1.0, help="CPUs per miner actor (default 1)")
    g.add_argument("--gpus-per-miner", type=float, default=0.0, help="GPUs per miner actor, fractions allowed")
    g.add_argument(
        "--shard-size",
        type=int,
        default=None,
        help="sentences per range = per shard file, the unit of resuming (default 10000; resuming "
        "an OUT keeps the size it was mined with)",
    )
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="mine OUT afresh: its shards, manifest and failures are removed first (default: resume, "
        "which the same settings only may do)",
    )
    g.add_argument(
        "--max-failed-ranges",
        type=int,
        default=0,
        metavar="N",
        help="ranges that may fail (listed in OUT/_failures.json) before the mining stops (default 0)",
    )
    g.add_argument(
        "--range-retries",
        type=int,
        default=2,
        metavar="N",
        help="retries of a range whose mining raises or whose miner dies (default 2)",
    )
    p.set_defaults(run=_run_gec, check=_check_gec_args)


def _check_gec_args(args: argparse.Namespace) -> None:
    if args.k < 0:
        raise UserError(f"--k: expected an integer ≥ 0, got {args.k}")
    if args.beam is not None and args.beam < args.k + 1:
        raise UserError(f"--beam: expected ≥ k+1 = {args.k + 1}, got {args.beam}")
    if args.max_len_a < 0 or args.max_len_b < 1:
        raise UserError(
            f"--max-len-a/--max-len-b: expected a ≥ 0 and b ≥ 1, got {args.max_len_a}, {args.max_len_b}"
        )
    if args.batch_size < 1:
        raise UserError(f"--batch-size: expected an integer ≥ 1, got {args.batch_size}")
    if args.engine == "hf" and args.precision == "int8":
        raise UserError("--precision int8: expected --engine ctranslate2 or auto (no int8 in HF), got --engine hf")
    if args.shard_size is not None and args.shard_size < 1:
        raise UserError(f"--shard-size: expected an integer ≥ 1, got {args.shard_size}")
    if args.max_failed_ranges < 0 or args.range_retries < 0:
        raise UserError(
            "--max-failed-ranges/--range-retries: expected integers ≥ 0, got "
            f"{args.max_failed_ranges}, {args.range_retries}"
        )
    if args.cpus_per_miner < 0 or args.gpus_per_miner < 0:
        raise UserError(
            f"--cpus-per-miner/--gpus-per-miner: expected ≥ 0, got {args.cpus_per_miner}, {args.gpus_per_miner}"
        )
    if not (Path(args.model) / "config.json").is_file():
        raise UserError(f"{at(args.model)}: expected an HF model folder with config.json (--model)")


def _is_sharded(args: argparse.Namespace) -> bool:
    given = args.shards or args.num_miners is not None or args.address is not None or args.overwrite
    return given or args.out.is_dir() or args.out.suffix.lower() != ".parquet"


def _run_gec(args: argparse.Namespace) -> dict[str, Any]:
    _check_gec_args(args)  # before the slow imports, so a typo fails at once
    if _is_sharded(args):
        return _run_sharded(args)
    from raycl.data.gec import load_examples
    from raycl.miners.beam_search import build_beam_miner, length_chunks, write_negatives_parquet

    examples = load_examples(args.data, annotator=args.annotator)
    miner = build_beam_miner(args.model, {**_miner_options(args), "device": args.device})
    mined: list[Any] = [None] * len(examples)
    n_neg, t0 = 0, time.perf_counter()
    from raycl.progress import bar as progress_bar

    with progress_bar(len(examples), desc="mining", unit="sent") as bar:
        for idx in length_chunks([ex.source for ex in examples], args.batch_size):
            for i, record in zip(idx, miner.mine([examples[i] for i in idx]), strict=True):
                mined[i] = record
                n_neg += len(record.negatives)
            bar.update(len(idx))
            bar.set_postfix(neg_per_s=f"{n_neg / (time.perf_counter() - t0):.1f}")
    seconds = time.perf_counter() - t0
    write_negatives_parquet(args.out, examples, mined, model_version=0)
    return {
        "out": str(args.out),
        "sentences": len(examples),
        "examples": len(examples),
        "negatives": n_neg,
        "seconds": round(seconds, 3),
        "negatives_per_s": round(n_neg / max(seconds, 1e-9), 2),
        "false_negatives": miner.counts.as_dict(),
    }


def _miners(text: str) -> int | tuple[int, int]:
    """``--num-miners``: N, or MIN-MAX for an autoscaling actor pool."""
    lo, sep, hi = text.partition("-")
    try:
        got = (int(lo), int(hi)) if sep else int(text)
    except ValueError:
        raise UserError(f"--num-miners: expected an integer ≥ 0 or MIN-MAX, got {text!r}") from None
    if isinstance(got, tuple) and not 1 <= got[0] <= got[1]:
        raise UserError(f"--num-miners: expected 1 ≤ MIN ≤ MAX, got {text!r}")
    if isinstance(got, int) and got < 0:
        raise UserError(f"--num-miners: expected an integer ≥ 0, got {got}")
    return got


def _run_sharded(args: argparse.Namespace) -> dict[str, Any]:
    """The data in ranges to a Ray Data actor pool (or this process), one shard per range; resumes. The same
    machinery as :func:`raycl.mine_negatives` (``raycl.distributed.corpus.mine_corpus``), with a summary
    instead of a dataset."""
    from raycl.distributed.corpus import mine_corpus

    if args.out.exists() and not args.out.is_dir():
        raise UserError(f"{at(args.out)}: exists and is not a directory, expected a shard directory")
    num_miners = 1 if args.num_miners is None else args.num_miners
    t0 = time.perf_counter()
    options = {**_miner_options(args), **({"device": args.device} if num_miners == 0 else {})}
    summary = mine_corpus(
        str(Path(args.model).resolve()),
        args.data,
        args.out,
        options=options,
        shard_size=args.shard_size,
        num_miners=num_miners,
        cpus_per_miner=args.cpus_per_miner,
        gpus_per_miner=args.gpus_per_miner,
        annotator=args.annotator,
        address=args.address,
        overwrite=args.overwrite,
        max_failed_ranges=args.max_failed_ranges,
        range_retries=args.range_retries,
    )
    return {
        **summary,
        "num_miners": num_miners if isinstance(num_miners, int) else list(num_miners),
        "startup_s": round(time.perf_counter() - t0 - summary["seconds"] - summary["scan_s"], 3),
    }


def _miner_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "k": args.k,
        "beam": args.beam,
        "source_negative": args.source_negative,
        "batch_size": args.batch_size,
        "max_len_a": args.max_len_a,
        "max_len_b": args.max_len_b,
        "rank_by": args.rank_by,
        "refill": args.refill,
        "precision": args.precision,
        "engine": args.engine,
        "false_negatives": args.false_negatives,
    }


def _run_staged(args: argparse.Namespace) -> dict[str, Any]:
    """``--out URI``: shards mined into the URI's staging folder (what the store holds pulled first, so a re-run
    resumes), each uploaded as it is written (``raycl.storage``); the run's index last. The arguments are checked
    first: a mistyped command pulls nothing from the store."""
    args.check(args)
    uri, args.out, args.shards = args.out, stage(check_uri(args.out, key="--out")), True
    try:
        summary = args.run(args)
    finally:
        push(args.out)
    return {**summary, "out": uri}


def build_parser(prog: str = "python -m raycl.mine") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Mine hard negatives to Parquet.")
    sub = parser.add_subparsers(dest="task", required=True, metavar="TASK")
    _add_gec(sub)
    add_dense(sub)
    return parser


@cli_entry
def main(argv: Sequence[str] | None = None, *, prog: str = "python -m raycl.mine") -> int:
    args = build_parser(prog).parse_args(argv)
    if args.task == "dense":  # an object-store OUT is staged by the library call itself
        summary = args.run(args)
    elif is_uri(args.out):
        summary = _run_staged(args)
    else:
        args.out = Path(args.out)
        if not args.trust_out:  # a resumed shard directory is read back; a new file's folder nobody else can swap
            check_ours(args.out, what="an output of raycl.mine", hint=TRUST_HINT)
        summary = args.run(args)
    if args.json:
        print(json.dumps(summary), file=summary_out())
    elif args.task == "dense":
        from raycl.distributed.dense_api import summary_line

        print(summary_line(summary))
    else:
        print(
            f"wrote {summary['examples']} sentences, {summary['negatives']} negatives "
            f"({summary['negatives_per_s']} negatives/s) to {summary['out']}"
        )
        fn = summary["false_negatives"]
        print(
            f"false negatives (another annotator's correction): source {rate_text(fn, 'source')}, "
            f"beam {rate_text(fn, 'beam')}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
