"""``python -m raycl.mine dense``: :func:`raycl.mine_dense_negatives` as a command (the options keep
sentence-transformers' names, dashed).

    python -m raycl.mine dense --model DIR --data pairs.parquet [--corpus passages.parquet] --out negs/ \\
        --num-negatives 5 --relative-margin 0.05 --num-miners 2

It prints a summary line (queries, negatives written, candidates dropped by each filter, queries left short,
seconds) or, with ``--json``, the summary as JSON on stdout; OUT holds the Parquet shards in
sentence-transformers' columns, ``_report.json`` and ``_scores.png``. Bad input ends in one line, exit 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from raycl.errors import UserError, at

FORMATS = ("triplet", "n-tuple", "labeled-pair", "labeled-list")


def add_dense(sub: Any) -> None:
    p = sub.add_parser(
        "dense",
        help="dense hard negatives for embedding models (sentence-transformers' options)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        required=True,
        help="sentence-transformers folder (or a cached name), or a raycl STS encoder folder",
    )
    p.add_argument("--data", required=True, help="the (anchor, positive) pairs: .parquet, .jsonl or .csv")
    p.add_argument("--corpus", default=None, help="more candidates: .parquet, .jsonl, .csv or .txt (one a line)")
    p.add_argument("--corpus-column", default=None, help="the corpus' text column (default: text, or its only)")
    p.add_argument(
        "--cross-encoder",
        default=None,
        help="a cross-encoder folder (one label) that rescores the "
        "candidates and positives where a margin or score bound is set",
    )
    p.add_argument("--out", required=True, help="a folder or object-store prefix for the shards (resumes)")
    p.add_argument(
        "--trust-out",
        action="store_true",
        help="use a local --out that is not yours alone (another user owns or can write it or a folder "
        "above it, or a link leads out of it), which raycl otherwise refuses: a resumed shard "
        "directory is read back; give it only for a folder whose writers you trust",
    )
    p.add_argument("--anchor-column-name", default=None, help="default: the first column")
    p.add_argument("--positive-column-name", default=None, help="default: the second column")
    p.add_argument("--range-min", type=int, default=0)
    p.add_argument("--range-max", type=int, default=None)
    for name in ("max-score", "min-score", "absolute-margin", "relative-margin"):
        p.add_argument(f"--{name}", type=float, default=None)
    p.add_argument("--num-negatives", type=int, default=3)
    p.add_argument("--sampling-strategy", choices=["top", "random"], default="top")
    p.add_argument("--seed", type=int, default=0, help="seeds --sampling-strategy random (default 0)")
    for name in ("query-prompt-name", "query-prompt", "corpus-prompt-name", "corpus-prompt"):
        p.add_argument(f"--{name}", default=None)
    p.add_argument("--include-positives", action="store_true")
    p.add_argument("--output-format", choices=FORMATS, default="triplet")
    p.add_argument("--output-scores", action="store_true")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--num-miners", default="1", metavar="N|MIN-MAX", help="actors (0: in this process)")
    p.add_argument("--cpus-per-miner", type=float, default=1.0)
    p.add_argument("--gpus-per-miner", type=float, default=0.0, help="fractions allowed")
    p.add_argument("--device", default=None, help="torch device (default: cuda where Ray gives a GPU, else cpu)")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    p.add_argument(
        "--index",
        choices=["exact", "usearch"],
        default="exact",
        help="exact: blockwise matmul + top-k per corpus shard; usearch: HNSW per shard (approximate)",
    )
    p.add_argument("--corpus-shard-size", type=int, default=10_000, help="corpus rows per embedding shard")
    p.add_argument("--query-block-size", type=int, default=1_000, help="unique queries per output shard")
    p.add_argument("--address", default=None, help="Ray cluster: auto or HOST:PORT (default: an embedded Ray)")
    p.add_argument("--overwrite", action="store_true", help="mine OUT afresh")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.set_defaults(run=run_dense_cli, check=check_dense_args)


def check_dense_args(args: argparse.Namespace) -> None:
    """The checks that need no model or data loaded: a typo fails at once (numbers within bounds, a URI that is
    storage raycl knows: http(s) refused before any request)."""
    from raycl.miners.dense import FLOAT_BOUNDS, INT_BOUNDS, check_numbers
    from raycl.storage import check_uri, is_uri

    for key in ("out", "data", "corpus", "model", "cross_encoder"):
        value = getattr(args, key)
        if value is not None and is_uri(str(value)):
            check_uri(str(value), key=f"--{key.replace('_', '-')}")
    if args.range_max is not None and args.range_min > args.range_max:
        raise UserError(
            f"--range-min {args.range_min} > --range-max {args.range_max}: expected range_min ≤ range_max"
        )
    for key in ("num_negatives", "batch_size", "corpus_shard_size", "query_block_size"):
        if getattr(args, key) < 1:
            raise UserError(f"--{key.replace('_', '-')}: expected an integer ≥ 1, got {getattr(args, key)}")
    for key in ("data", "corpus"):
        path = getattr(args, key)
        if path is not None and not is_uri(str(path)) and not Path(path).is_file():
            raise UserError(f"{at(path)}: no such file (--{key})")
    numbers = {k: getattr(args, k) for k in (*INT_BOUNDS, *FLOAT_BOUNDS) if k != "num_miners"}
    try:  # MIN-MAX or N; anything else is parse_miners' one line
        numbers["num_miners"] = tuple(int(v) for v in str(args.num_miners).split("-", 1))
    except ValueError:
        pass
    check_numbers(flags=True, **numbers)


def run_dense_cli(args: argparse.Namespace) -> dict[str, Any]:
    check_dense_args(args)
    from raycl.distributed.dense_api import run_dense
    from raycl.files import TRUST_HINT

    names = (
        "cross_encoder",
        "anchor_column_name",
        "positive_column_name",
        "range_min",
        "range_max",
        "max_score",
        "min_score",
        "absolute_margin",
        "relative_margin",
        "num_negatives",
        "sampling_strategy",
        "query_prompt_name",
        "query_prompt",
        "corpus_prompt_name",
        "corpus_prompt",
        "include_positives",
        "output_format",
        "output_scores",
        "batch_size",
        "num_miners",
        "device",
        "precision",
        "seed",
        "index",
        "corpus_column",
        "corpus_shard_size",
        "query_block_size",
        "cpus_per_miner",
        "gpus_per_miner",
        "address",
        "overwrite",
    )
    summary, _ = run_dense(
        dataset=args.data,
        model=args.model,
        corpus=args.corpus,
        out=str(args.out),
        verbose=True,
        faults=None,
        trust_out=args.trust_out,
        trust_hint=TRUST_HINT,
        **{k: getattr(args, k) for k in names},
    )
    return summary
