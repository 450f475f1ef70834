"""Standalone mining throughput at M = 1, 2, 4 miner actors (issue 3): ``python bench/mine.py --json``.

Mines the built-in GEC corpus (``raycl.data.gec_corpus``, CWEB-like density) with ``python -m raycl.mine gec
--out DIR --num-miners M`` (the miner pool on an embedded local Ray, streamed input, Parquet shards) and prints
one JSON object: ``negatives_per_s`` per M, ``scaling_efficiency`` (rate at M / (M × rate at 1)) and the
machine. The model is the smoke preset *untrained* (0 steps): throughput depends on its shape, not its
weights, except that an untrained model never stops early, so every hypothesis runs to ``--max-new-tokens``
(24 by default, about twice the corpus's mean sentence length) — a pessimistic, fixed amount of work.
Rates count from the moment the miners have loaded their model (``startup_s`` is reported apart).

Ray gets ``num_cpus = max(4, M)`` logical CPUs, one per miner: on a machine with fewer physical cores than
M, miners share cores and the efficiency measures that oversubscription, not Ray's overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/mine.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--sentences", type=int, default=20_000, help="corpus size (default 20000)")
    p.add_argument("--miners", default="1,2,4", help="comma-separated miner counts (default 1,2,4)")
    p.add_argument("--k", type=int, default=3, help="negatives per sentence (beam k+1)")
    p.add_argument("--max-new-tokens", type=int, default=24, help="hypothesis length cap (default 24)")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per beam-search call (default 32)")
    p.add_argument("--task-size", type=int, default=64, help="sentences per miner task (default 64)")
    p.add_argument("--gpus-per-miner", type=float, default=0.0, help="on a GPU machine: GPUs per miner (0.25, 1)")
    p.add_argument("--workdir", type=Path, default=None, help="keep corpus, model and shards here")
    p.add_argument("--json", action="store_true", help="print only the JSON object on stdout")
    return p.parse_args(argv)


def make_inputs(work: Path, n: int) -> tuple[Path, Path]:
    """The built-in corpus as M2 and an untrained smoke-preset model (tokenizer trained on the corpus)."""
    from raycl.data.gec_corpus import LOW_DENSITY, generate
    from raycl.data.m2 import write_m2
    from raycl.models.presets import build_model

    sentences = generate(n, error_rate=LOW_DENSITY.error_rate, edits_per_error=LOW_DENSITY.edits_per_error, seed=0)
    corpus = work / "corpus.m2"
    write_m2(corpus, sentences)
    texts = [t for s in sentences[:5000] for t in (s.source, s.target())]
    model = build_model("smoke", out_dir=work / "model", texts=texts, seed=0)
    return corpus, model


def mine_once(corpus: Path, model: Path, out: Path, m: int, args: argparse.Namespace) -> dict[str, Any]:
    """One ``python -m raycl.mine`` run, in this process (so it joins the Ray started here)."""
    from raycl.mine import build_parser

    argv = ["gec", "--model", str(model), "--data", str(corpus), "--out", str(out), "--num-miners", str(m),
            "--cpus-per-miner", "1", "--gpus-per-miner", str(args.gpus_per_miner), "--k", str(args.k),
            "--max-new-tokens", str(args.max_new_tokens), "--batch-size", str(args.batch_size),
            "--task-size", str(args.task_size), "--shard-size", "5000"]
    parsed = build_parser().parse_args(argv)
    return parsed.run(parsed)


def machine(num_cpus: int) -> dict[str, Any]:
    import psutil
    import ray
    import torch

    physical = psutil.cpu_count(logical=False) or os.cpu_count()
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(), "torch": torch.__version__, "ray": ray.__version__,
            "logical_cores": os.cpu_count(), "physical_cores": physical, "ray_num_cpus": num_cpus,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "load_avg_1m": round(os.getloadavg()[0], 2)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    counts = [int(x) for x in args.miners.split(",")]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from raycl.distributed.runtime import init_ray

    with tempfile.TemporaryDirectory(prefix="raycl-bench-mine-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        corpus, model = make_inputs(work, args.sentences)
        num_cpus = max(4, *counts)
        init_ray(num_cpus=num_cpus)  # logical CPUs: one per miner even where the cores are fewer
        runs: dict[str, dict[str, Any]] = {}
        for m in counts:
            out = work / f"negatives-M{m}"
            shutil.rmtree(out, ignore_errors=True)  # a kept workdir would otherwise resume: nothing to mine
            summary = mine_once(corpus, model, out, m, args)
            runs[str(m)] = {k: summary[k] for k in ("examples", "negatives", "seconds", "startup_s",
                                                    "negatives_per_s", "shards")}  # fmt: skip
            if not args.json:
                print(f"M={m}: {summary['negatives_per_s']} negatives/s", file=sys.stderr)
        info = machine(num_cpus)
    base = runs[str(counts[0])]["negatives_per_s"] / counts[0]
    physical = info["physical_cores"] or 1
    report = {
        "bench": "mine", "sentences": args.sentences, "k": args.k, "max_new_tokens": args.max_new_tokens,
        "task_size": args.task_size, "batch_size": args.batch_size, "gpus_per_miner": args.gpus_per_miner,
        "model": "smoke preset (d 128, 2+2 layers), untrained: 0 steps (throughput, not quality)",
        "negatives_per_s": {m: r["negatives_per_s"] for m, r in runs.items()},
        "scaling_efficiency": {m: round(r["negatives_per_s"] / (int(m) * base), 3) for m, r in runs.items()},
        "runs": runs, "machine": info,
        "note": (f"{physical} physical cores: M > {physical} oversubscribes (miners share cores), so efficiency "
                 f"there measures core sharing, not pool overhead") if max(counts) > physical else "",
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }  # fmt: skip
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
