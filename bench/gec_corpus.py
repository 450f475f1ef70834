"""The built-in GEC corpus's generation speed: ``python bench/gec_corpus.py --json``.

``raycl.data.gec_corpus.generate`` at each density preset (BEA-train's high density, CWEB-S's and CWEB-G's low),
``--sentences`` sentences with one annotator and with two, ``--repeats`` times each: the best thread CPU seconds
(this thread's CPU time: other processes on a shared machine and other threads do not count), wall seconds and
sentences per CPU second. A test once asserted "20,000 sentences with two annotators in under 2 s of CPU"; on a
loaded 2-core machine that failed, so the figure is measured here, never asserted.

Prints one JSON object: ``sentences``, ``repeats``, and per density and annotator count ``cpu_s``, ``wall_s``,
``sentences_per_cpu_s``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/gec_corpus.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--sentences", type=int, default=20000, help="sentences a generation (default 20000)")
    p.add_argument("--repeats", type=int, default=3, help="generations per row; the best is kept (default 3)")
    p.add_argument("--json", action="store_true", help="print only the JSON object on stdout")
    return p.parse_args(argv)


def measure(n: int, repeats: int) -> dict[str, Any]:
    from raycl.data import gec_corpus as gc

    rows: dict[str, Any] = {}
    for name, density in (("high", gc.HIGH_DENSITY), ("low", gc.LOW_DENSITY), ("low_g", gc.LOW_DENSITY_G)):
        for annotators in (1, 2):
            cpu, wall = [], []
            for seed in range(repeats):
                c0, w0 = time.thread_time(), time.perf_counter()
                sents = gc.generate(
                    n,
                    error_rate=density.error_rate,
                    edits_per_error=density.edits_per_error,
                    annotators=annotators,
                    seed=seed,
                )
                cpu.append(time.thread_time() - c0)
                wall.append(time.perf_counter() - w0)
                if len(sents) != n:  # a benchmark of a generator that lost sentences measures nothing
                    raise SystemExit(f"bench/gec_corpus.py: {len(sents)} sentences generated, {n} asked")
            rows[f"{name}/{annotators}_annotators"] = {
                "cpu_s": round(min(cpu), 3),
                "wall_s": round(min(wall), 3),
                "sentences_per_cpu_s": round(n / max(min(cpu), 1e-9)),
            }
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = {
        "sentences": args.sentences,
        "repeats": args.repeats,
        **measure(args.sentences, args.repeats),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if not args.json:
        print(f"generating {args.sentences} sentences, best of {args.repeats}", file=sys.stderr)
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
