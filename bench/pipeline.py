"""Mining in parallel with training, measured on the GEC recipe with the smoke preset.

Prints one JSON object:
- ``sequential``: the paper's schedule — mine every negative first (in-process beam search), then train in a
  plain single-process loop (Ray Train local mode: the same loop, no Ray);
- ``ray_one_worker``: the same training on pre-mined negatives in one Ray Train worker →
  ``overhead_vs_plain`` = its loop time / the plain loop time (and with the worker start-up included);
- ``pipeline[M]``: miners stream negatives while one Ray Train worker trains, for each M in ``--miners`` →
  ``mine_wait_fraction`` (trainer time waiting for negatives / wall time, steady state: without the wait for
  the very first batch), ``negatives_per_s`` (negatives delivered per second of training) and
  ``speedup_vs_sequential`` (sequential mine-then-train time / pipelined time).

Usage: ``.venv/bin/python bench/pipeline.py --json [--miners 1,2,4] [--finetune 600] [--epochs 2]``.
``sweep`` (in the GEC run; ``--sweep`` for it alone, ``--no-sweep`` to leave it out): the GEC sweep
(γ ∈ {0.25, 0.85} × k ∈ {2, 3}, then DI, NLL, CL⁻ at the best point) three times on the same base model — before
(``mining.share=false``: a miner pool per trial, HF) and after (the n-best mined once for the run, with HF and
with ``mining.engine=auto``) — with each run's wall time, sentences beam-searched, the miners' busy seconds and
``mine_wait_fraction``.
``--recipe coherence``: the coherence recipe (smoke preset) instead, each M at ``max_staleness`` 0 (the paper's
schedule: every chunk ranked with the weights published at its start, so the trainer waits for it) and 1 (the
next chunk is ranked while this one trains): ``mine_wait_fraction``, refused (re-ranked) items, versions.
On a CPU machine the resources are logical (``num_cpus`` = 2 + max M): miners and the trainer share the
physical cores, which the JSON records; on a GPU machine give each miner a GPU fraction with ``--gpus-per-miner``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _space(tmp: Path, args: argparse.Namespace, *extra: str) -> Any:
    from raycl.config.tasks import load_space

    return load_space(
        "gec_pd",
        preset="smoke",
        overrides=[
            f"data.builtin.n_train={args.train}",
            f"data.builtin.n_finetune={args.finetune}",
            "data.builtin.n_dev=50",
            "data.builtin.n_test=50",
            f"pretrain.epochs={args.pretrain_epochs}",
            f"optim.epochs={args.epochs}",
            "scaling.num_workers=1",
            "scaling.cpus_per_worker=1",
            f"mining.gpus_per_miner={args.gpus_per_miner}",
            f"scaling.use_gpu={str(args.gpus_per_miner > 0).lower()}",
            *extra,
        ],
    )


def _loop_time(history: list[dict[str, Any]]) -> float:
    return sum(float(h.get("timing/interval", 0.0)) for h in history if "loss" in h)  # reports that trained


def _sequential(run: Any, out: Path) -> dict[str, Any]:
    """The paper's code: every negative mined first (in-process), then a plain training loop."""
    import torch

    from raycl import driver
    from raycl.data.gec import load_examples
    from raycl.miners.beam_search import build_beam_miner, write_negatives_parquet
    from raycl.recipes import recipe_for
    from raycl.records import read_history

    finetune = functools.partial(driver.train, recipe_for("gec"))

    cfg = run.cfg
    examples = load_examples(cfg.data.finetune)
    m = cfg.mining  # the pooled miners' engine and options, in this process
    miner = build_beam_miner(
        str(run.base_model),
        {
            "k": m.k,
            "beam": m.beam,
            "batch_size": m.batch_size,
            "max_len_a": m.max_len_a,
            "max_len_b": m.max_len_b,
            "rank_by": m.rank_by,
            "refill": m.refill,
            "engine": m.engine,
            "precision": m.precision,
        },
    )
    t0 = time.perf_counter()
    mined = miner.mine(examples)
    mine_s = time.perf_counter() - t0
    write_negatives_parquet(out / "neg.parquet", examples, mined, model_version=0)
    plain = _with(cfg, **{"mining.negatives": str(out / "neg.parquet"), "scaling.num_workers": 0})
    # Ray gives a worker of c CPUs OMP_NUM_THREADS=c; the plain loop gets the same threads, so that
    # overhead_vs_plain compares Ray against no Ray, not one thread against all the cores
    threads, train_threads = torch.get_num_threads(), max(1, int(cfg.scaling.cpus_per_worker))
    torch.set_num_threads(train_threads)
    try:
        finetune(dataclasses.replace(run, cfg=plain), plain, out / "plain", name="plain", in_tune=False)
    finally:
        torch.set_num_threads(threads)
    train_s = _loop_time(read_history(out / "plain"))
    negatives = sum(len(m.negatives) for m in mined)
    return {
        "mine_s": mine_s,
        "train_loop_s": train_s,
        "total_s": mine_s + train_s,
        "negatives": negatives,
        "negatives_per_s_in_process": negatives / mine_s,
        "mine_threads": threads,
        "train_threads": train_threads,
    }


def _with(cfg: Any, **dotted: Any) -> Any:
    from raycl.config import set_dotted

    return set_dotted(cfg, dotted, where="bench")


def _ray_one_worker(run: Any, out: Path, plain_loop_s: float) -> dict[str, Any]:
    from raycl import driver
    from raycl.recipes import recipe_for
    from raycl.records import read_history

    finetune = functools.partial(driver.train, recipe_for("gec"))

    cfg = _with(run.cfg, **{"mining.negatives": str(out / "neg.parquet")})
    t0 = time.perf_counter()
    finetune(dataclasses.replace(run, cfg=cfg), cfg, out / "ray1", name="ray1", in_tune=False)
    fit_s = time.perf_counter() - t0
    loop_s = _loop_time(read_history(out / "ray1"))
    return {
        "train_loop_s": loop_s,
        "fit_s": fit_s,
        "overhead_vs_plain": loop_s / plain_loop_s,
        "overhead_vs_plain_with_startup": fit_s / plain_loop_s,
    }


def _pipeline(run: Any, out: Path, miners: int, sequential_s: float) -> dict[str, Any]:
    from raycl import driver
    from raycl.recipes import recipe_for
    from raycl.records import read_history

    finetune = functools.partial(driver.train, recipe_for("gec"))

    cfg = _with(run.cfg, **{"mining.num_miners": miners, "mining.cpus_per_miner": 1.0})
    t0 = time.perf_counter()
    finetune(dataclasses.replace(run, cfg=cfg), cfg, out / f"pipe{miners}", name=f"pipe{miners}", in_tune=False)
    fit_s = time.perf_counter() - t0
    hist = read_history(out / f"pipe{miners}")
    loop_s, first = _loop_time(hist), hist[0]
    negatives = sum(float(h.get("stream/negatives", 0.0)) for h in hist)
    wait = sum(float(h.get("timing/mine_wait", 0.0)) for h in hist)
    wait_first = sum(float(h.get("timing/mine_wait_first", 0.0)) for h in hist)
    return {
        "miners": miners,
        "mine_wait_fraction": (wait - wait_first) / max(loop_s - wait_first, 1e-9),
        "mine_wait_fraction_incl_first_batch": wait / max(loop_s, 1e-9),
        "first_batch_wait_s": float(first.get("timing/mine_wait_first", 0.0)),
        "negatives_per_s": negatives / max(loop_s, 1e-9),
        "train_loop_s": loop_s,
        "fit_s": fit_s,
        "speedup_vs_sequential": sequential_s / loop_s,
        "max_fill": first.get("stream/max_fill"),
        "staleness_max": max(h.get("stream/staleness_max", 0) for h in hist),
    }


def _coherence_run(run: Any, out: Path, *, staleness: int, miners: int) -> dict[str, Any]:
    """One coherence training pass whose hard negatives are ranked by ``miners`` actors at ``staleness``."""
    from raycl import driver
    from raycl.recipes import recipe_for
    from raycl.records import read_history

    train_one = functools.partial(driver.train, recipe_for("coherence"))

    cfg = _with(
        run.cfg, **{"mining.max_staleness": staleness, "mining.num_miners": miners, "mining.cpus_per_miner": 1.0}
    )
    name = f"coh-s{staleness}-m{miners}"
    t0 = time.perf_counter()
    train_one(dataclasses.replace(run, cfg=cfg), cfg, out / name, name=name, in_tune=False)
    fit_s = time.perf_counter() - t0
    hist = read_history(out / name)
    wait = sum(float(h.get("timing/mine_wait", 0.0)) for h in hist)
    wall = sum(float(h.get("timing/interval", 0.0)) for h in hist)
    steady = hist[1:]  # the first interval trains on the items' own negatives (nothing mined yet)
    s_wait = sum(float(h.get("timing/mine_wait", 0.0)) for h in steady)
    s_wall = sum(float(h.get("timing/interval", 0.0)) for h in steady)
    return {
        "max_staleness": staleness,
        "miners": miners,
        "mine_wait_fraction": wait / max(wall, 1e-9),
        "mine_wait_fraction_mining_chunks": s_wait / max(s_wall, 1e-9),
        "train_loop_s": wall,
        "fit_s": fit_s,
        "refused": sum(float(h.get("stream/refused", 0.0)) for h in hist),
        "staleness_max": max(float(h.get("stream/staleness_max", 0.0)) for h in hist),
        "weight_versions": hist[-1].get("stream/version"),
        "dev_acc": hist[-1].get("dev_acc"),
    }


def coherence_main(args: argparse.Namespace) -> dict[str, Any]:
    """The coherence recipe (smoke preset): mine_wait with the paper's schedule (staleness 0) against 1."""
    from raycl import driver
    from raycl.config.tasks import load_space
    from raycl.recipes import recipe_for

    ms = [int(m) for m in args.miners.split(",")]
    with tempfile.TemporaryDirectory(prefix="raycl-bench-") as tmp_name:
        tmp = Path(tmp_name)
        space = load_space(
            "coherence",
            preset="smoke",
            overrides=[
                f"data.builtin.train={args.documents}",
                "scaling.num_workers=1",
                "scaling.cpus_per_worker=1",
            ],
        )
        run = driver.prepare(recipe_for("coherence"), space, tmp / "run")
        runs = [_coherence_run(run, tmp, staleness=s, miners=m) for m in ms for s in (0, 1)]
    return {
        "bench": "pipeline",
        "recipe": "coherence smoke",
        "training_items": run.counts["train"],
        "rank_every": run.cfg.mining.rank_every,
        "num_rank": run.cfg.mining.num_rank,
        "runs": runs,
    }


def _sweep_once(space: Any, run_dir: Path) -> dict[str, Any]:
    """One GEC sweep + baselines; its beam searches, the miners' busy seconds and the trainers' mine_wait."""
    from raycl import driver
    from raycl.recipes import recipe_for
    from raycl.records import read_history

    t0 = time.perf_counter()
    summary = driver.run_tune(recipe_for("gec"), space, run_dir)
    wall = time.perf_counter() - t0
    searched, mine_s = 0, 0.0
    meta = run_dir / "nbest" / "meta.json"
    if meta.exists():  # mined once for the run
        m = json.loads(meta.read_text())
        searched, mine_s = m["beam_searched"], m["mine_s"]
    trials = sorted((run_dir / "trials").iterdir())
    for d in trials:  # per-trial miner pools
        if (d / "mining.json").exists():
            m = json.loads((d / "mining.json").read_text())
            searched, mine_s = searched + m["searched"], mine_s + m["mine_s"]
    hist = [h for d in trials for h in read_history(d) if "loss" in h]  # the reports of epochs that trained
    wait = sum(float(h.get("timing/mine_wait", 0.0)) for h in hist)
    first = sum(float(h.get("timing/mine_wait_first", 0.0)) for h in hist)
    loop = sum(float(h.get("timing/interval", 0.0)) for h in hist)
    return {
        "wall_s": round(wall, 1),
        "trials": len(trials),
        "failed_trials": summary["failed_trials"],
        "beam_searched_sentences": searched,
        "mining_s": round(mine_s, 1),
        "mine_wait_fraction": round(wait / max(loop, 1e-9), 4),
        "mine_wait_fraction_steady": round((wait - first) / max(loop - first, 1e-9), 4),
        "train_loop_s": round(loop, 1),
    }


SWEEP_RUNS = (  # (name, overrides): before this change, the n-best shared with the HF engine, then with auto
    ("before_per_trial_mining", ("mining.share=false", "mining.engine=hf")),
    ("after_mined_once_hf", ("mining.share=true", "mining.engine=hf")),
    ("after_mined_once", ("mining.share=true", "mining.engine=auto")),
)


def sweep_main(args: argparse.Namespace) -> dict[str, Any]:
    """The GEC sweep (2 margins × 2 k + DI, NLL, CL⁻): before (a miner pool per trial, HF), after (the n-best mined
    once per run) with HF and with ``mining.engine=auto`` (CTranslate2 here), on one base model."""

    out: dict[str, Any] = {
        "bench": "pipeline-sweep",
        "recipe": "gec_pd smoke",
        "finetune": args.finetune,
        "grid": {"loss.margin": [0.25, 0.85], "mining.k": [2, 3]},
        "baselines": "DI, NLL, CL⁻",
    }
    with tempfile.TemporaryDirectory(prefix="raycl-bench-sweep-") as tmp_name:
        tmp = Path(tmp_name)
        for name, overrides in SWEEP_RUNS:
            space = _space(
                tmp, args, *overrides, "tune.max_concurrent_trials=2", "mining.cpus_per_miner=1", "mining.beam=4"
            )
            space.search = {"loss.margin": {"grid": [0.25, 0.85]}, "mining.k": {"grid": [2, 3]}}
            run_dir = tmp / name
            if (tmp / "base_model").exists():  # the same base model: the comparison is the sweep's
                shutil.copytree(tmp / "base_model", run_dir / "base_model")
            out[name] = _sweep_once(space, run_dir)
            if not (tmp / "base_model").exists():
                shutil.copytree(run_dir / "base_model", tmp / "base_model")
    b = out["before_per_trial_mining"]
    for name in ("after_mined_once_hf", "after_mined_once"):
        a = out[name]
        out[f"{name}_vs_before"] = {
            "beam_searches_ratio": round(b["beam_searched_sentences"] / max(a["beam_searched_sentences"], 1), 2),
            "mining_time_ratio": round(b["mining_s"] / max(a["mining_s"], 1e-9), 2),
            "wall_time_ratio": round(b["wall_s"] / max(a["wall_s"], 1e-9), 3),
        }
    return out


def json_stdout() -> Any:
    """A stream to the real stdout for the JSON alone; whatever else this process writes to fd 1 from now on
    (Tune's experiment tables, Ray's forwarded worker logs) goes to stderr."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return out


def main() -> None:
    out = json_stdout()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true")
    p.add_argument("--recipe", choices=("gec", "coherence"), default="gec")
    p.add_argument("--miners", default="1,2,4")
    p.add_argument("--train", type=int, default=2000)
    p.add_argument("--finetune", type=int, default=600)
    p.add_argument("--documents", type=int, default=100, help="coherence: built-in training documents")
    p.add_argument("--pretrain-epochs", type=int, default=1)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--gpus-per-miner", type=float, default=0.0)
    p.add_argument("--sweep", action="store_true", help="GEC: only the sweep before/after mining once per run")
    p.add_argument("--no-sweep", action="store_true", help="GEC: leave the sweep out")
    args = p.parse_args()
    ms = [int(m) for m in args.miners.split(",")]
    import ray

    from raycl.distributed.runtime import init_ray

    init_ray(num_cpus=2 + max(ms))
    machine = {
        "cpus": os.cpu_count(),
        "gpus": ray.cluster_resources().get("GPU", 0),
        "logical_cpus": ray.cluster_resources().get("CPU"),
    }
    if args.recipe == "coherence":
        result = coherence_main(args)
    elif args.sweep:
        result = sweep_main(args)
    else:
        result = gec_main(args)
        if not args.no_sweep:
            result["sweep"] = sweep_main(args)
    print(json.dumps({**result, "machine": machine}, indent=2 if args.json else None), file=out, flush=True)


def gec_main(args: argparse.Namespace) -> dict[str, Any]:
    from raycl import driver
    from raycl.recipes import recipe_for

    ms = [int(m) for m in args.miners.split(",")]
    with tempfile.TemporaryDirectory(prefix="raycl-bench-") as tmp_name:
        tmp = Path(tmp_name)
        space = _space(tmp, args)
        t0 = time.perf_counter()
        run = driver.prepare(recipe_for("gec"), space, tmp / "run")
        print(f"[bench] base model ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        seq = _sequential(run, tmp)
        ray1 = _ray_one_worker(run, tmp, seq["train_loop_s"])
        pipes = {str(m): _pipeline(run, tmp, m, seq["total_s"]) for m in ms}
    return {
        "bench": "pipeline",
        "recipe": "gec_pd smoke",
        "finetune_sentences": args.finetune,
        "epochs": args.epochs,
        "sequential": seq,
        "ray_one_worker": ray1,
        "pipeline": pipes,
    }


if __name__ == "__main__":
    main()
