"""Corpus mining throughput (issue 11): ``python bench/mine.py --json``.

One run prints one JSON object with
- ``engines``: negatives/s of ``python -m raycl.mine`` (a Ray Data actor pool,
  :mod:`raycl.distributed.corpus`) for the HF engine (one-pass scores) and CTranslate2 (float32 and int8 on
  CPU; float16/bfloat16 with ``--gpus-per-miner``) at the same model, beam and k, for M = 1, 2 miners — on the
  smoke preset and on a model of BART-base's shape (``d_model`` 768, 6+6 layers, 12 heads, ffn 3072, 50,265-word
  output layer) built from its config with random weights. ``negatives_per_s`` is wall time from the pool's start
  (actors loading the model included); ``negatives_per_miner_s`` divides by the miners' busy seconds.
  ``ct2_speedup`` = CTranslate2 / HF at M = 1.
  ``scaling_efficiency`` = rate at M / (M × rate at 1).
- ``decoding_passes``: HF beam search on BART-base's shape, scored in the same pass (now) vs rescored by a second
  teacher-forced pass (before), in this process on one thread.
- ``driver_rss``: the driver's peak RSS mining a corpus of N and of 10 N sentences (a fresh process each).
- ``scan``: the driver's scan (``scan_ranges``: every byte read, records found) of a synthetic M2 of ``--scan-mb``
  MB, in MB/s.
- ``null_model``: the Ray Data pipeline's own ceiling — ranges read, selected, written as shards, with decoding
  skipped (``raycl.testing.miners.NULL_BEAM``) — in sentences/s for M = 1, 2 at each of ``--null-sentences``,
  with the driver's peak RSS (a fresh process each).
- ``conversions_per_node``: CTranslate2 conversions (``conversions.log`` of each model's cache) per host and
  folder: 1 each when miners share them.
Random models never stop early: every hypothesis runs to ``--max-new-tokens`` (``--max-len-b`` of the miners: a
fixed amount of work) and, cut there, is no negative: ``negatives`` then counts the sources only. ``--model PATH``
(a trained folder, e.g. ``bench/parity.py``'s) adds the model ``trained``, whose hypotheses end as a GEC model's
do: its rows count the beam negatives too (``negatives_per_sentence`` ≈ k + 1 − the targets found).
Ray gets one logical CPU per miner: on a machine with fewer cores than M, miners share cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
BART_BASE = dict(
    d_model=768,
    encoder_layers=6,
    decoder_layers=6,
    encoder_attention_heads=12,
    decoder_attention_heads=12,
    encoder_ffn_dim=3072,
    decoder_ffn_dim=3072,
    max_position_embeddings=1024,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/mine.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--models",
        default=None,
        help="of smoke,bart_base,bart_large,trained (default smoke,bart_base; trained with --model)",
    )
    p.add_argument(
        "--model",
        type=Path,
        default=None,
        help="a trained HF folder (bench/parity.py's --model): the model 'trained' of the engine rows",
    )
    p.add_argument(
        "--sentences",
        default="smoke=1000,bart_base=96,bart_large=96,trained=1000",
        help="sentences mined per model (default smoke=1000,bart_base=96,trained=1000)",
    )
    p.add_argument("--miners", default="1,2", help="comma-separated miner counts (default 1,2)")
    p.add_argument("--k", type=int, default=3, help="negatives per sentence; beam k+1 (default 3)")
    p.add_argument("--max-new-tokens", type=int, default=24, help="hypothesis length (default 24)")
    p.add_argument("--batch-size", type=int, default=16, help="sentences per beam-search call (default 16)")
    p.add_argument("--gpus-per-miner", type=float, default=0.0, help="GPUs per miner (GPU engines fp16/bf16)")
    p.add_argument("--rss-sentences", type=int, default=5000, help="N of the driver-RSS runs (N and 10 N)")
    p.add_argument(
        "--passes-sentences",
        type=int,
        default=32,
        help="sentences of the one-pass vs two-pass HF decoding comparison (BART-base shape)",
    )
    p.add_argument(
        "--scan-mb", type=int, default=64, help="size of the scanned synthetic M2 (default 64; 1024 = 1 GB)"
    )
    p.add_argument(
        "--null-sentences",
        default="100000",
        help="comma-separated corpus sizes of the null-model runs (default 100000; 0 = none)",
    )
    p.add_argument(
        "--engines",
        default=None,
        help="engine-precision rows, comma-separated (default: hf-fp32,ctranslate2-fp32,"
        "ctranslate2-int8 on CPUs; hf-fp32,hf-bf16,ctranslate2-fp16,ctranslate2-bf16 with "
        "--gpus-per-miner)",
    )
    p.add_argument(
        "--parts",
        default="engines,passes,rss,scan,null",
        help="what to measure, of engines,passes,rss,scan,null (default all)",
    )
    p.add_argument("--quick", action="store_true", help="smoke model only, M=1, small corpora")
    p.add_argument("--workdir", type=Path, default=None, help="keep corpora, models and shards here")
    p.add_argument("--json", action="store_true", help="print only the JSON object on stdout")
    args = p.parse_args(argv)
    if args.models is None:
        args.models = "trained" if args.model else "smoke,bart_base"
    if "trained" in args.models.split(",") and not (args.model and (args.model / "config.json").is_file()):
        p.error(f"--models trained: expected --model PATH, a folder with a config.json (got {args.model})")
    return args


def corpus(work: Path, n: int, name: str) -> Path:
    from raycl.data.gec_corpus import LOW_DENSITY, generate
    from raycl.data.m2 import write_m2

    path = work / f"{name}.m2"
    if not path.exists():
        d = LOW_DENSITY
        write_m2(path, generate(n, error_rate=d.error_rate, edits_per_error=d.edits_per_error, seed=0))
    return path


def model(work: Path, kind: str, texts_from: Path) -> Path:
    """An HF folder: the smoke preset, or BART-base/large's shape (random weights, 50,265-word output layer)."""
    from transformers import BartForConditionalGeneration

    from raycl.data.m2 import read_m2
    from raycl.models.presets import build_model

    out = work / f"model-{kind}"
    if (out / "config.json").exists():
        return out
    texts = [t for s in read_m2(texts_from)[:3000] for t in (s.source, s.target())]
    if kind == "smoke":
        return build_model("smoke", out_dir=out, texts=texts, seed=0)
    shape = (
        BART_BASE
        if kind == "bart_base"
        else dict(
            d_model=1024,
            encoder_layers=12,
            decoder_layers=12,
            encoder_attention_heads=16,
            decoder_attention_heads=16,
            encoder_ffn_dim=4096,
            decoder_ffn_dim=4096,
            max_position_embeddings=1024,
        )
    )
    build_model("smoke", out_dir=out, texts=texts, seed=0, **shape)
    m = BartForConditionalGeneration.from_pretrained(str(out))
    m.resize_token_embeddings(50265)  # BART's vocabulary: the output layer's cost
    m.save_pretrained(str(out))
    return out


def mine(
    data: Path, model_dir: Path, out: Path, *, m: int, engine: str, precision: str, args: argparse.Namespace
) -> dict[str, Any]:
    from raycl.mine import build_parser

    shutil.rmtree(out, ignore_errors=True)
    argv = [
        "gec",
        "--model",
        str(model_dir),
        "--data",
        str(data),
        "--out",
        str(out),
        "--num-miners",
        str(m),
        "--cpus-per-miner",
        "1",
        "--gpus-per-miner",
        str(args.gpus_per_miner),
        "--k",
        str(args.k),
        "--max-len-b",
        str(args.max_new_tokens),
        "--batch-size",
        str(args.batch_size),
        "--shard-size",
        str(max(8, args.batch_size)),
        "--engine",
        engine,
        "--precision",
        precision,
    ]
    parsed = build_parser().parse_args(argv)
    parsed.out = out  # a local folder, as raycl.mine's main passes it (the parser keeps URIs as text)
    return parsed.run(parsed)


def decoding_passes(model_dir: Path, data: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Item 2, in this process on one thread: HF beam search scoring its n-best in the same pass (raycl now) vs the
    same search followed by a teacher-forced pass over every hypothesis (raycl before: ``score_texts`` over the
    decoded texts, ``batch_size × beam`` rows at once, full-vocabulary fp32 log-probs)."""
    import torch

    from raycl.data.gec import load_examples
    from raycl.models.seq2seq import Seq2SeqScorer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        scorer = Seq2SeqScorer.from_pretrained(model_dir).eval()
        sources = [ex.source for ex in load_examples([str(data)])][: args.passes_sentences]
        beam = args.k + 1
        t0 = time.perf_counter()
        hyps = scorer.generate(
            sources,
            num_beams=beam,
            num_return_sequences=beam,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
        )
        one = time.perf_counter() - t0
        texts = [text for h in hyps for text, _ in h]
        repeated = [s for s, h in zip(sources, hyps, strict=True) for _ in h]
        t0 = time.perf_counter()
        scorer.score_texts(repeated, texts, batch_size=args.batch_size * beam)
        second = time.perf_counter() - t0
    finally:
        torch.set_num_threads(threads)
    return {
        "sentences": len(sources),
        "hypotheses": len(texts),
        "one_pass_s": round(one, 2),
        "second_pass_s": round(second, 2),
        "two_pass_s": round(one + second, 2),
        "one_pass_speedup": round((one + second) / one, 2),
    }


# VmHWM is this process image's peak RSS; ru_maxrss is not: after fork + exec it keeps the high-water mark of the
# forked copy of the parent (this benchmark, holding BART-base), so it reported the parent's size at both N
RSS_SNIPPET = """
import json, resource, sys
from raycl.mine import main
main(sys.argv[1:])
try:
    hwm = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:")) / 1024
except (OSError, StopIteration):
    hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"peak_rss_mib": hwm}))
"""


def driver_rss(work: Path, model_dir: Path, n: int) -> dict[str, Any]:
    """The driver's peak RSS (a fresh process) mining ``n`` sentences with 2 miners and a 2-token cap."""
    data = corpus(work, n, f"rss-{n}")
    out = work / f"rss-{n}-out"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            RSS_SNIPPET,
            "gec",
            "--model",
            str(model_dir),
            "--data",
            str(data),
            "--out",
            str(out),
            "--num-miners",
            "2",
            "--cpus-per-miner",
            "1",
            "--k",
            "1",
            "--max-len-b",
            "2",
            "--batch-size",
            "64",
            "--shard-size",
            "1000",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    return {
        "sentences": n,
        "peak_rss_mib": round(lines[-1]["peak_rss_mib"], 1),
        "examples": lines[0]["examples"],
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def big_corpus(work: Path, n: int) -> Path:
    """A synthetic M2 of ``n`` sentences, a 10,000-sentence corpus repeated (generating each is slow)."""
    path = work / f"big-{n}.m2"
    if path.exists():
        return path
    block = corpus(work, 10_000, "block-10000").read_bytes().rstrip(b"\n") + b"\n\n"
    per = block.count(b"\nS ") + 1
    with open(path, "wb") as f:
        for _ in range(n // per):
            f.write(block)
        if n % per:
            records = block.split(b"\n\n")[: n % per]
            f.write(b"\n\n".join(records) + b"\n\n")
    return path


def scan(work: Path, mb: int) -> dict[str, Any]:
    """The driver's scan of a synthetic M2 of about ``mb`` MB (the file cache warm: written just before)."""
    from raycl.miners.corpus import scan_ranges

    block_bytes = corpus(work, 10_000, "block-10000").stat().st_size
    path = big_corpus(work, max(1, mb * 2**20 * 10_000 // block_bytes))
    t0 = time.perf_counter()
    ranges = list(scan_ranges([str(path)], range_size=10_000))
    seconds = time.perf_counter() - t0
    size = path.stat().st_size / 2**20
    return {
        "mb": round(size, 1),
        "sentences": sum(r.count for r in ranges),
        "seconds": round(seconds, 2),
        "mb_per_s": round(size / seconds, 1),
    }


NULL_SNIPPET = """
import json, sys
from pathlib import Path
from raycl.distributed.corpus import mine_corpus
from raycl.testing.miners import NULL_BEAM
data, out, model, m = sys.argv[1:5]
s = mine_corpus(model, [data], Path(out), options={"k": 3, "engine": "hf"}, kind=NULL_BEAM,
                shard_size=10000, num_miners=int(m), cpus_per_miner=1.0, progress=False)
hwm = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:")) / 1024
print(json.dumps({**s, "peak_rss_mib": hwm}))
"""


def null_model(work: Path, model_dir: Path, n: int, m: int) -> dict[str, Any]:
    """Mining ``n`` sentences with M = ``m`` null miners in a fresh driver process: sentences/s and peak RSS."""
    data, out = big_corpus(work, n), work / f"null-{n}-{m}"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", NULL_SNIPPET, str(data), str(out), str(model_dir), str(m)],
        capture_output=True,
        text=True,
        check=True,
    )
    s = json.loads([x for x in proc.stdout.splitlines() if x.startswith("{")][-1])
    shutil.rmtree(out, ignore_errors=True)
    return {
        "sentences": s["examples"],
        "miners": m,
        "scan_s": s["scan_s"],
        "seconds": s["seconds"],
        "sentences_per_s": round(s["examples"] / max(s["seconds"], 1e-9), 1),
        "peak_rss_mib": round(s["peak_rss_mib"], 1),
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def conversions(models: list[Path]) -> dict[str, dict[str, int]]:
    """Conversions per host and converted folder, from each model cache's ``conversions.log``."""
    from collections import Counter

    from raycl.models.ct2_engine import CONVERSIONS_LOG, _cache_root

    got: Counter[tuple[str, str]] = Counter()
    for model in models:
        log = _cache_root(model) / CONVERSIONS_LOG  # this user's cache of the model (docs/mining.md: engines)
        for line in log.read_text().splitlines() if log.is_file() else []:
            row = json.loads(line)
            got[row["host"], f"{model.name}/{row['folder']}"] += 1
    out: dict[str, dict[str, int]] = {}
    for (host, folder), count in got.items():
        out.setdefault(host, {})[folder] = count
    return out


def cpu_flags() -> list[str]:
    """The CPU features int8 and bf16 kernels depend on (CTranslate2 int8 is fastest with VNNI)."""
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16")
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return [f for f in wanted if f in flags]


def machine() -> dict[str, Any]:
    import psutil
    import ray
    import torch

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": ray.__version__,
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "cpu_flags": cpu_flags(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    kinds = ["smoke"] if args.quick else args.models.split(",")
    counts = [1] if args.quick else [int(x) for x in args.miners.split(",")]
    sizes = {k: int(v) for k, v in (x.split("=") for x in args.sentences.split(","))}
    parts = set(args.parts.split(","))
    gpu = args.gpus_per_miner > 0
    engines = (
        [("hf", "fp32"), ("ctranslate2", "fp32"), ("ctranslate2", "int8")]
        if not gpu
        else [("hf", "fp32"), ("hf", "bf16"), ("ctranslate2", "fp16"), ("ctranslate2", "bf16")]
    )
    if args.engines:
        engines = [tuple(e.strip().rsplit("-", 1)) for e in args.engines.split(",")]  # type: ignore[misc]
    from raycl.distributed.runtime import init_ray

    report: dict[str, Any] = {
        "bench": "mine",
        "k": args.k,
        "beam": args.k + 1,
        "max_new_tokens": args.max_new_tokens,
        "batch_size": args.batch_size,
        "gpus_per_miner": args.gpus_per_miner,
        "engines": {},
        "trained_model": str(args.model) if args.model else None,
    }
    with tempfile.TemporaryDirectory(prefix="raycl-bench-mine-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        texts = corpus(work, 3000, "texts")
        init_ray(num_cpus=max(2, *counts))
        for kind in kinds if "engines" in parts else []:
            n = 200 if args.quick else sizes[kind]
            data = corpus(work, n, f"{kind}-{n}")
            model_dir = args.model if kind == "trained" else model(work, kind, texts)
            rows: dict[str, Any] = {"sentences": n}
            for engine, precision in engines:
                name = f"{engine}-{precision}"
                for m in counts:
                    s = mine(
                        data,
                        model_dir,
                        work / f"out-{kind}-{name}-{m}",
                        m=m,
                        engine=engine,
                        precision=precision,
                        args=args,
                    )
                    keys = ("negatives", "seconds", "negatives_per_s", "miner_busy_s", "negatives_per_miner_s")
                    rows.setdefault(name, {})[str(m)] = {
                        **{k: s[k] for k in keys},
                        "negatives_per_sentence": round(s["negatives"] / n, 2),
                    }
                    if not args.json:
                        print(f"{kind} {name} M={m}: {s['negatives_per_s']} negatives/s", file=sys.stderr)
                one = rows[name]["1"]["negatives_per_s"]
                rows[name]["scaling_efficiency"] = {
                    str(m): round(rows[name][str(m)]["negatives_per_s"] / (m * one), 3) for m in counts
                }
            hf = next((rows[name]["1"] for name in rows if name.startswith("hf-")), None)  # the first HF row
            if hf is not None:
                rows["ct2_speedup"] = {
                    name: round(rows[name]["1"]["negatives_per_miner_s"] / hf["negatives_per_miner_s"], 2)
                    for name in rows
                    if name.startswith("ctranslate2")
                }
            report["engines"][kind] = rows
        if not args.quick and "bart_base" in kinds and "passes" in parts:
            n = sizes["bart_base"]
            report["decoding_passes"] = decoding_passes(
                model(work, "bart_base", texts), corpus(work, n, f"bart_base-{n}"), args
            )
        if "engines" in parts:
            folders = [*work.glob("model-*"), *([args.model] if args.model else [])]
            report["conversions_per_node"] = conversions(folders)
        if "scan" in parts:
            report["scan"] = scan(work, args.scan_mb)
        sizes_null = [int(x) for x in args.null_sentences.split(",") if int(x) > 0]
        if "null" in parts and sizes_null:
            small = model(work, "smoke", texts)
            report["null_model"] = [null_model(work, small, n, m) for n in sizes_null for m in counts]
        if not args.quick and "rss" in parts:
            small = model(work, "smoke", texts)
            report["driver_rss"] = [
                driver_rss(work, small, args.rss_sentences),
                driver_rss(work, small, 10 * args.rss_sentences),
            ]
            a, b = report["driver_rss"]
            report["driver_rss_ratio_10x"] = round(b["peak_rss_mib"] / a["peak_rss_mib"], 3)
    report["machine"] = machine()
    report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
