"""``python -m raycl.mine TASK ...``: mining alone, to Parquet (``id, source, target, negatives, scores,
model_version``).

``gec``: beam-search negatives of a GEC model for every sentence of the data: the top-k distinct outputs
≠ target (beam ≥ k+1) plus the source when it differs from the target (CL; ``--no-source-negative`` for CL⁻).
The file is what ``--set mining.negatives=PATH`` reads.

    python -m raycl.mine gec --model DIR --data train.m2 --k 3 --out neg.parquet

At scale, OUT is a directory: the data is streamed (never held whole) in tasks of ``--task-size`` sentences
to a pool of ``--num-miners`` Ray actors (an embedded local Ray, or the cluster with ``--address auto``) and
written as one Parquet file per ``--shard-size`` sentences (``part-00000.parquet``, ...). Running it again
with the same OUT resumes: sentences already in a shard are skipped. ``--num-miners 0`` streams and shards
in this process, without Ray.

    python -m raycl.mine gec --model DIR --data big.m2 --k 3 --out negs/ --num-miners 4 --address auto
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raycl.errors import UserError, at, cli_entry

if TYPE_CHECKING:
    from raycl.data.gec import GecExample
    from raycl.miners.beam_search import MinedNegatives


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
    p.add_argument("--rank-by", choices=["beam", "sum_logprob"], default="beam",
                   help="the n-best's order: the beam's length-normalised score (the paper; default) or S(t~|s)")
    p.add_argument("--refill", action="store_true",
                   help="k negatives ≠ target even when the target is in the top k (default: the paper's k−1)")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32", help="autocast (default fp32)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--out", required=True, type=Path,
                   help="a .parquet file (mined in this process), or a directory of Parquet shards")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    g = p.add_argument_group("streamed, sharded mining (any of these makes OUT a shard directory)")
    g.add_argument("--shards", action="store_true", help="write OUT as a shard directory even if named *.parquet")
    g.add_argument("--num-miners", type=int, default=None, help="miner actors (default 1; 0 = in this process)")
    g.add_argument("--address", default=None, help="Ray cluster: auto or HOST:PORT (default: an embedded Ray)")
    g.add_argument("--cpus-per-miner", type=float, default=1.0, help="CPUs per miner actor (default 1)")
    g.add_argument("--gpus-per-miner", type=float, default=0.0, help="GPUs per miner actor, fractions allowed")
    g.add_argument("--task-size", type=int, default=32, help="sentences per miner task (default 32)")
    g.add_argument("--shard-size", type=int, default=10_000, help="sentences per shard file (default 10000)")
    p.set_defaults(run=_run_gec)


def _check_gec_args(args: argparse.Namespace) -> None:
    if args.k < 0:
        raise UserError(f"--k: expected an integer ≥ 0, got {args.k}")
    if args.beam is not None and args.beam < args.k + 1:
        raise UserError(f"--beam: expected ≥ k+1 = {args.k + 1}, got {args.beam}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size: expected an integer ≥ 1, got {args.batch_size}")
    for flag, value in (("--task-size", args.task_size), ("--shard-size", args.shard_size)):
        if value < 1:
            raise UserError(f"{flag}: expected an integer ≥ 1, got {value}")
    if args.num_miners is not None and args.num_miners < 0:
        raise UserError(f"--num-miners: expected an integer ≥ 0, got {args.num_miners}")
    if args.cpus_per_miner < 0 or args.gpus_per_miner < 0:
        raise UserError(f"--cpus-per-miner/--gpus-per-miner: expected ≥ 0, got {args.cpus_per_miner}, "
                        f"{args.gpus_per_miner}")  # fmt: skip
    if not (Path(args.model) / "config.json").is_file():
        raise UserError(f"{at(args.model)}: expected an HF model folder with config.json (--model)")


def _is_sharded(args: argparse.Namespace) -> bool:
    given = args.shards or args.num_miners is not None or args.address is not None
    return given or args.out.is_dir() or args.out.suffix.lower() != ".parquet"


def _run_gec(args: argparse.Namespace) -> dict[str, Any]:
    _check_gec_args(args)  # before the slow imports, so a typo fails at once
    if _is_sharded(args):
        return _run_sharded(args)
    from tqdm.auto import tqdm

    from raycl.data.gec import load_examples
    from raycl.miners.beam_search import BeamSearchMiner, length_chunks, write_negatives_parquet
    from raycl.models.seq2seq import Seq2SeqScorer

    examples = load_examples(args.data, annotator=args.annotator)
    scorer = Seq2SeqScorer.from_pretrained(args.model, device=args.device)
    miner = BeamSearchMiner(scorer, **_miner_options(args))
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
    return {"out": str(args.out), "sentences": len(examples), "examples": len(examples), "negatives": n_neg,
            "seconds": round(seconds, 3), "negatives_per_s": round(n_neg / max(seconds, 1e-9), 2)}  # fmt: skip


Rows = list[tuple["GecExample", "MinedNegatives"]]
# A mining backend: chunks of examples in, (rows, model version, ids dropped as duplicates) out.
Backend = Callable[[Iterable[list["GecExample"]]], Generator[tuple[Rows, int, int], None, None]]


def _run_sharded(args: argparse.Namespace) -> dict[str, Any]:
    """Stream the data in tasks to the miners, write shards as rows come back; skip ids already in OUT.

    ``seconds`` (and negatives/s) count from the moment the miners are built; ``startup_s`` is building them.
    """
    from raycl.miners.shards import ShardWriter, shard_files, stream_examples

    writer = ShardWriter(args.out, shard_size=args.shard_size)
    todo = (ex for ex in stream_examples(args.data, annotator=args.annotator) if ex.id not in writer.done)
    num_miners = 1 if args.num_miners is None else args.num_miners
    t_start = time.perf_counter()
    backend = _pool_backend(args, num_miners) if num_miners > 0 else _local_backend(args)
    n_ex, n_neg, dropped, t0 = 0, 0, 0, time.perf_counter()
    batches = backend(_chunks(todo, args.task_size))
    try:
        with _progress(initial=writer.resumed) as bar:
            for rows, version, n_dup in batches:
                dropped += n_dup
                for ex, mined in rows:
                    if writer.add(ex, mined, model_version=version):
                        n_ex, n_neg = n_ex + 1, n_neg + len(mined.negatives)
                bar.update(len(rows))
                bar.set_postfix(neg_per_s=f"{n_neg / (time.perf_counter() - t0):.1f}")
    finally:
        batches.close()  # stops the miners now, also on an error or Ctrl-C
        writer.close()  # rows mined before an interruption are kept: a re-run skips them
    seconds = time.perf_counter() - t0
    return {"out": str(args.out), "examples": n_ex, "negatives": n_neg, "seconds": round(seconds, 3),
            "negatives_per_s": round(n_neg / max(seconds, 1e-9), 2), "num_miners": num_miners,
            "startup_s": round(t0 - t_start, 3),
            "shards": len(shard_files(args.out)), "shards_written": len(writer.written),
            "resumed": writer.resumed, "duplicates": dropped + writer.duplicates}  # fmt: skip


def _chunks(examples: Iterable[GecExample], size: int) -> Iterator[list[GecExample]]:
    it = iter(examples)
    while chunk := list(islice(it, size)):
        yield chunk


def _progress(*, initial: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(unit="sent", desc="mining", file=sys.stderr, initial=initial)


def _miner_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"k": args.k, "beam": args.beam, "source_negative": args.source_negative, "batch_size": args.batch_size,
            "max_new_tokens": args.max_new_tokens, "rank_by": args.rank_by, "refill": args.refill,
            "precision": args.precision}  # fmt: skip


def _local_backend(args: argparse.Namespace) -> Backend:
    """``--num-miners 0``: one ``BeamSearchMiner`` in this process, the same streaming and shards."""
    from raycl.miners.beam_search import BeamSearchMiner
    from raycl.models.seq2seq import Seq2SeqScorer

    miner = BeamSearchMiner(Seq2SeqScorer.from_pretrained(args.model, device=args.device), **_miner_options(args))

    def mine(chunks: Iterable[list[GecExample]]) -> Generator[tuple[Rows, int, int], None, None]:
        for chunk in chunks:
            yield list(zip(chunk, miner.mine(chunk), strict=True)), 0, 0

    return mine


def _pool_backend(args: argparse.Namespace, num_miners: int) -> Backend:
    """``MinerPool.map`` over ``MineTask``s: bounded in flight, so memory holds only the tasks being mined."""
    from raycl.distributed.messages import MineTask
    from raycl.distributed.miner_pool import MinerFactory, MinerPool
    from raycl.distributed.runtime import init_ray
    from raycl.miners.beam_search import GEC_BEAM, MinedNegatives

    on_cluster = bool(args.address or os.environ.get("RAY_ADDRESS"))
    init_ray(args.address, num_cpus=None if on_cluster else _local_cpus(num_miners * args.cpus_per_miner))
    options = {**_miner_options(args), "device": "cuda" if args.gpus_per_miner > 0 else args.device}
    factory = MinerFactory(GEC_BEAM, str(Path(args.model).resolve()), options)  # actors may have another cwd
    pool = MinerPool(factory, num_miners=num_miners, cpus_per_miner=args.cpus_per_miner,
                     gpus_per_miner=args.gpus_per_miner)  # fmt: skip
    try:
        pool.ready()  # models loaded: the clock of negatives/s starts after this
    except BaseException:
        pool.shutdown()
        raise

    def mine(chunks: Iterable[list[GecExample]]) -> Generator[tuple[Rows, int, int], None, None]:
        pending: dict[str, GecExample] = {}  # examples of the tasks in flight, by id

        def tasks() -> Iterator[MineTask]:
            for task_id, chunk in enumerate(chunks):
                pending.update((ex.id, ex) for ex in chunk)
                yield MineTask(epoch=0, task_id=task_id, rank=0, items=tuple(chunk))

        try:
            for batch in pool.map(tasks()):
                rows = [(pending.pop(i), MinedNegatives(i, tuple(n), tuple(s)))
                        for i, n, s in zip(batch.ids, batch.negatives, batch.scores, strict=True) if i in pending]
                yield rows, batch.model_version, len(batch.ids) - len(rows)  # the rest: a retried task's repeat
        finally:
            pool.shutdown()

    return mine


def _local_cpus(wanted: float) -> int:
    """Logical CPUs for an embedded Ray: at least the miners' (oversubscribing a small machine, said on stderr)."""
    cores = os.cpu_count() or 1
    if wanted > cores:
        print(f"raycl: {wanted:g} miner CPUs on {cores} cores: miners share cores", file=sys.stderr)
    return max(cores, math.ceil(wanted))


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
        print(f"wrote {summary['examples']} sentences, {summary['negatives']} negatives "
              f"({summary['negatives_per_s']} negatives/s) to {summary['out']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
