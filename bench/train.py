"""Benchmark: one training step of a recipe through the one training loop (``raycl.training.loop``), at fp32 and
bf16, on its paper's model built from a config (random weights: nothing is downloaded). Prints one JSON object: per
precision, step time, tokens/s, peak memory; the step's aten ops, host–device syncs (by kind and call site) and
casts (``raycl.training.counting``: the forward and backward, the update apart); its model FLOPs and MFU against
the card's peak (``--peak-tflops``, or a large matmul measured at that precision); on a GPU the largest batch that
fits and the same figures there.

``--recipe gec`` (default): a GEC-CL step, batch 16 sentences × (48 source + 5 × 48 target-line tokens: the
target and 4 negatives), BART-large's shape on a GPU, a small BART on a CPU; tokens are counted as fairseq's
``num_tokens``: the source plus the whole target line. ``--recipe idiom|sts|coherence``: the encoder recipes at
their papers' shapes — InfoXLM-base (XLM-R-base's config), seq 128, batch 16, FGM and EMA; multilingual
BERT-base, seq 64, batch 32, cross-attention and the MoCo queue (an MSE batch and a contrastive batch a step);
XLNet-base, 602 tokens, one document and 5 negatives, the momentum encoder and queue. Models and steps:
``bench/train_steps.py``.

``--count-only`` counts instead of timing: ``--shape narrow`` (its default) keeps the paper model's layers at a
small width (the counts depend on the layout, not the width: a CPU counts BART-large's in seconds, bf16
included); ``--shape smoke`` counts the recipe's own smoke steps (its preset, built-in data, ``task.build`` and
``task.epoch``: ``bench/train_smoke.py``). Usage::

    .venv/bin/python bench/train.py --json                      # auto: bart-large on a GPU, small on a CPU
    .venv/bin/python bench/train.py --json --count-only         # GEC at BART-large's layout, batch 16: counts
    .venv/bin/python bench/train.py --json --count-only --recipe coherence --shape smoke
    python3 bench/train.py --json --recipe idiom --batch 32     # on a GPU machine without the venv
    .venv/bin/python bench/train.py --json --workers 2          # data parallel: 2 gloo workers against 1

``--workers N`` runs the same GEC-CL step in N processes (gloo on a CPU, NCCL on GPUs), batch B per worker, one
thread each, three ways: ``none`` (no gradient exchange: the compute alone), ``sum`` (the loop's path: backward,
then the bucketed all-reduce of :func:`raycl.collectives.sum_gradients`) and ``ddp`` (the step's forward
through DDP, whose bucketed all-reduce overlaps the backward). It prints tokens/s of N workers against 1 and each
exchange's overhead per step over ``none``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# Before CUDA starts: growable segments, so that the largest-batch search's freed blocks do not fragment the card.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its helpers beside it, however it is run (runpy too)
from train_steps import PAPER_BATCH, Recipe, gec_micro_batches, gec_model  # noqa: E402

STEP_MICRO_BATCHES = {"sts": 2}  # STS's released schedule: an MSE batch, then a contrastive one, per step


class CountedTask:
    """The recipe's task as the loop sees it, its ``step`` counted in the region "step" while ``counter`` is set
    (the forward and backward; the rest of a micro-batch is the update)."""

    def __init__(self, task: Any) -> None:
        self._task, self.counter, self.calls = task, None, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)

    def step(self, st: Any, data: Any, ctx: Any) -> dict[str, float]:
        if self.counter is None:
            return self._task.step(st, data, ctx)  # type: ignore[no-any-return]
        self.calls += 1  # each micro-batch of the step in a region of its own too: "micro_batch 1", …
        with self.counter.region("step"), self.counter.region(f"micro_batch {self.calls}"):
            return self._task.step(st, data, ctx)  # type: ignore[no-any-return]


COMPILE: str | None = None  # --compile MODE: the task's modules through torch.compile, as optim.compile does
COMPILE_BACKEND = "inductor"  # --compile-backend: aot_eager traces without generating code (a quick CPU check)


def _runner(case: Any, precision: str, device: torch.device) -> tuple[Any, CountedTask]:
    import dataclasses

    from raycl.training import loop
    from raycl.training.precision import Precision, enable_tf32
    from raycl.training.task import Job, Worker

    enable_tf32(device)
    task = CountedTask(case.task)
    w = Worker(0, 1, device, Precision(precision, device), None, Job(None, "", ""))  # type: ignore[arg-type]
    runner = loop.Loop(task, case.state, w)
    if COMPILE:  # the loop's own compile (optim.compile=true, optim.compile_mode=MODE); warm-up steps compile
        runner.s = dataclasses.replace(
            runner.s, compile=True, compile_mode=COMPILE, compile_backend=COMPILE_BACKEND
        )
        runner.compile()
    return runner, task


def compile_stats() -> dict[str, Any]:
    """What torch.compile made of the step since the counters were last cleared: graphs (a CUDA graph each under
    reduce-overhead), graph breaks (each splits the step into pieces launched from Python) with their reasons, and
    frames compiled (more than the graphs' owners: recompilations for new shapes), and the kernels inductor
    generated for them (forward and backward, after fusion: what the step launches besides its matmuls)."""
    from torch._dynamo.utils import counters
    from torch._inductor import metrics

    breaks = counters["graph_break"]
    return {
        "graphs": counters["stats"]["unique_graphs"],
        "frames": counters["frames"]["total"],
        "graph_breaks": sum(breaks.values()),
        "break_reasons": sorted(breaks)[:5],
        "generated_kernels": metrics.generated_kernel_count,
    }


def _clear_compile_stats() -> None:
    from torch._dynamo.utils import counters
    from torch._inductor import metrics

    counters.clear()
    metrics.reset()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _run(runner: Any, batches: list[Any]) -> None:
    for batch in batches:
        runner.micro_batch(batch)


def count_step(runner: Any, task: CountedTask, batches: list[Any], device: torch.device) -> dict[str, Any]:
    """Aten ops, syncs (by kind and call site) and casts of one step's forward and backward; the update's apart."""
    from raycl.training.counting import Counts, count_ops

    with count_ops(cpu_as_device=device.type == "cpu") as c:
        task.counter, task.calls = c, 0
        try:
            _run(runner, batches)
        finally:
            task.counter = None
    step = c.regions.get("step", Counts())
    # the update's syncs are not given: on a CPU run its optimizer's step counters (CPU tensors on a GPU too) count
    out = {**step.summary(), "update_ops": c.ops - step.ops}
    if COMPILE:  # torch.compile runs eagerly under the counter's dispatch mode: the counts are the eager step's
        out["counts_of"] = "eager"
    if len(batches) > 1:
        out["micro_batches"] = [c.regions[f"micro_batch {i + 1}"].summary() for i in range(len(batches))]
    return out


def step_flops(runner: Any, batches: list[Any]) -> int:
    """Model FLOPs of a step: matmuls and attention of the forward and backward, as FlopCounterMode counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as flops:
        _run(runner, batches)
    return int(flops.get_total_flops())


def peak_tflops(precision: str, device: torch.device) -> float:
    """The card's matmul rate at this precision (TF32 where on for fp32): the best of several timed square
    matmuls (a shared machine's other load only slows some of them down)."""
    from raycl.training.precision import enable_tf32

    enable_tf32(device)  # as the step runs: its fp32 matmuls are TF32 ones, so is the peak they are held against
    n = 8192 if device.type == "cuda" else 1024
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(10):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(5):
            a @ b
        _sync(device)
        best = min(best, (time.perf_counter() - t0) / 5)
    return 2 * n**3 / best / 1e12


def measure(
    case: Any, precision: str, args: argparse.Namespace, device: torch.device, *, peak: float | None = None
) -> dict[str, Any]:
    """Median step time over ``args.steps`` (after ``args.warmup``), tokens/s, peak memory; then, untimed, the
    step's counts and FLOPs (MFU against ``peak`` TFLOP/s)."""
    _clear_compile_stats()
    runner, task = _runner(case, precision, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, first = [], 0.0
    for i in range(args.warmup + args.steps):
        _sync(device)
        t0 = time.perf_counter()
        _run(runner, case.batches)
        _sync(device)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
        elif i == 0:
            first = time.perf_counter() - t0  # the first step: kernels loaded (and compiled with --compile)
    step_s = sorted(times)[len(times) // 2]
    peak_mem = (
        torch.cuda.max_memory_allocated(device)
        if device.type == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    row = {
        "batch": case.items,
        "step_s": step_s,
        "tokens_per_s": case.tokens / step_s,
        "items_per_s": case.items / step_s,
        "tokens_per_step": case.tokens,
        "peak_memory_gib": peak_mem / 2**30,
        "peak_memory_kind": "cuda allocated" if device.type == "cuda" else "process max RSS",
        "first_step_s": first,
    }
    if COMPILE:
        row["compiled"] = compile_stats()
    if args.no_counts:
        return row
    flops = step_flops(runner, case.batches)
    row.update(flops_per_step=flops, achieved_tflops=flops / step_s / 1e12)
    if peak:
        row.update(peak_tflops=peak, mfu=flops / step_s / 1e12 / peak)
    row["counts"] = count_step(runner, task, case.batches, device)
    return row


def largest_batch(recipe: Any, precision: str, args: argparse.Namespace, device: torch.device) -> int:
    """Doubling then bisection on the batch size until a step runs out of GPU memory."""
    ok, bad = 0, None
    b = args.batch
    quick = argparse.Namespace(**{**vars(args), "steps": 1, "warmup": 0, "no_counts": True})
    while bad is None or bad - ok > max(ok // 8, 1):
        try:
            measure(recipe.case(b), precision, quick, device)
            ok = b
        except torch.OutOfMemoryError:
            bad = b
        recipe.model.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        if bad is None and b >= args.max_batch:
            break
        b = b * 2 if bad is None else (ok + bad) // 2
    return ok


def measure_largest(
    recipe: Any, largest: int, precision: str, args: argparse.Namespace, device: torch.device, peak: float | None
) -> dict[str, Any]:
    """The full measurement at the largest batch the search found, an eighth smaller each time the card runs out
    of memory (several timed steps and the counted ones hold more than the search's single step)."""
    keys = ("batch", "step_s", "tokens_per_s", "peak_memory_gib", "achieved_tflops", "mfu")
    batch = largest
    for _ in range(4):
        try:
            big = measure(recipe.case(batch), precision, args, device, peak=peak)
            return {k: big[k] for k in keys if k in big} | {"searched": largest}
        except torch.OutOfMemoryError:
            recipe.model.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            batch = max(args.batch, batch - max(batch // 8, 1))
    return {"searched": largest, "error": "out of memory at every batch tried"}


def count_only(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Counts of one step per precision (after ``args.warmup`` steps), no timing."""
    out: dict[str, Any] = {
        "bench": "train_counts",
        "recipe": args.recipe,
        "shape": args.shape,
        "device": _device_name(device),
    }
    recipe = None if args.shape == "smoke" else Recipe(args.recipe, args.shape, device, args)
    for precision in args.precisions.split(","):
        print(f"[bench] counting {args.recipe} {args.shape} {precision}", file=sys.stderr, flush=True)
        out[precision] = (
            smoke_counts(args, precision, device)
            if recipe is None
            else _counts(recipe.case(args.batch), precision, args, device)
        )
    if recipe is not None:
        out.update(batch=args.batch, params_m=recipe.params() / 1e6)
    if "fp32" in out and "bf16" in out:
        out["bf16_added_casts"] = out["bf16"]["casts"] - out["fp32"]["casts"]
    return out


def _counts(case: Any, precision: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    _clear_compile_stats()
    runner, task = _runner(case, precision, device)
    for _ in range(args.warmup):
        _run(runner, case.batches)
    out = count_step(runner, task, case.batches, device)
    return {**out, "compiled": compile_stats()} if COMPILE else out


def smoke_counts(args: argparse.Namespace, precision: str, device: torch.device) -> dict[str, Any]:
    """The recipe's own smoke steps: ``args.warmup`` steps, then ``args.steps`` counted ones (each its own batch
    from the stream); the last one's counts in full, every counted step's ops and syncs."""
    import tempfile

    from train_smoke import smoke_batches

    per = STEP_MICRO_BATCHES.get(args.recipe, 1)
    with tempfile.TemporaryDirectory(prefix=f"bench-smoke-{args.recipe}-") as tmp:
        task, st, batches = smoke_batches(
            args.recipe, device, Path(tmp), (args.warmup + args.steps) * per, phase=args.gec_phase
        )
        case = SimpleNamespace(task=task, state=st)
        runner, counted = _runner(case, precision, device)
        steps = [batches[i : i + per] for i in range(0, len(batches), per)]
        for step in steps[: args.warmup]:
            _run(runner, step)
        counts = [count_step(runner, counted, step, device) for step in steps[args.warmup :]]
    return {**counts[-1], "steps": [{"ops": c["ops"], "syncs": c["syncs"]} for c in counts]}


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _worker_step(rank: int, world: int, port: int, mode: str, args: argparse.Namespace, out: str) -> None:
    """One process of the data-parallel benchmark: ``args.steps`` timed steps (after ``args.warmup``)."""
    import os

    import torch.distributed as dist

    from raycl.collectives import average_gradients
    from raycl.losses.gec_margin import GecContrastiveLoss
    from raycl.recipes.gec.step import gec_loss

    torch.set_num_threads(args.threads_per_worker)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    scorer = gec_model(args.shape, device)
    loss_fn = GecContrastiveLoss(margin=0.25, trade_off=0.5)

    class Step(torch.nn.Module):  # the step as a module, so that DDP can run it through forward
        def __init__(self) -> None:
            super().__init__()
            self.scorer = scorer

        def forward(self, batch: Any) -> Any:
            out = gec_loss(self.scorer, batch, loss_fn)
            return out.loss * float(out.ntokens), float(out.ntokens)

    step = Step()
    module = torch.nn.parallel.DistributedDataParallel(step) if mode == "ddp" and world > 1 else step
    opt = torch.optim.AdamW(scorer.parameters(), lr=1e-5)
    params = list(scorer.parameters())
    batch = gec_micro_batches(args.batch, args, scorer.model.config.vocab_size, device)[0].data
    times = []
    for i in range(args.warmup + args.steps):
        dist.barrier()
        _sync(device)
        t0 = time.perf_counter()
        loss, weight = module(batch)
        loss.backward()
        if mode == "sum":
            average_gradients(params, weight)
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        tokens = args.batch * (args.src_len + args.tgt_len * (1 + args.negatives)) * world
        step_s = sorted(times)[len(times) // 2]
        Path(out).write_text(json.dumps({"step_s": step_s, "tokens_per_s": tokens / step_s}))
    dist.destroy_process_group()


def workers_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Tokens/s of ``args.workers`` workers against 1, and the gradient exchange's overhead, by mode."""
    import tempfile

    import torch.multiprocessing as mp

    out: dict[str, Any] = {
        "bench": "train_workers",
        "shape": args.shape,
        "batch_per_worker": args.batch,
        "threads_per_worker": args.threads_per_worker,
        "backend": "nccl" if torch.cuda.is_available() else "gloo",
    }
    port = 29500 + (os.getpid() % 500) * 2
    with tempfile.TemporaryDirectory() as tmp:
        for world in (1, args.workers):
            for mode in ("none", "sum", "ddp") if world > 1 else ("none",):
                port += 1
                print(f"[bench] {world} worker(s), {mode}", file=sys.stderr, flush=True)
                res = f"{tmp}/{world}-{mode}.json"
                mp.spawn(_worker_step, args=(world, port, mode, args, res), nprocs=world, join=True)
                out[f"{world}w_{mode}"] = json.loads(Path(res).read_text())
    n, one = out[f"{args.workers}w_sum"], out["1w_none"]
    base = out[f"{args.workers}w_none"]["step_s"]
    out["tokens_per_s_ratio"] = n["tokens_per_s"] / one["tokens_per_s"]  # ideal: the number of workers
    out["scaling_efficiency"] = out["tokens_per_s_ratio"] / args.workers
    out["sum_overhead_s"] = n["step_s"] - base  # the loop's bucketed all-reduce after the backward
    out["ddp_overhead_s"] = out[f"{args.workers}w_ddp"]["step_s"] - base  # DDP's, overlapped with the backward
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--recipe", choices=["gec", "idiom", "sts", "coherence"], default="gec")
    p.add_argument(
        "--shape",
        choices=["auto", "paper", "bart-large", "small", "narrow", "smoke"],
        default="auto",
        help="paper (GEC: bart-large), narrow (the paper's layout at a small width), small (GEC), "
        "smoke (the recipe's smoke run); auto: paper on a GPU, else small (GEC) or narrow, "
        "narrow with --count-only",
    )
    p.add_argument("--count-only", action="store_true", help="aten ops, syncs and casts of a step; no timing")
    p.add_argument(
        "--batch",
        type=int,
        default=0,
        help="examples per step (default: the paper's; GEC on a CPU: 4, 16 with --count-only)",
    )
    p.add_argument("--negatives", type=int, default=4)
    p.add_argument("--src-len", type=int, default=48)
    p.add_argument("--tgt-len", type=int, default=48)
    p.add_argument(
        "--passes",
        choices=["joint", "per_slot"],
        default="joint",
        help="GEC: one pass over positives and negatives, or the released code's pass per slot",
    )
    p.add_argument("--adversarial", default="fgm", help="idiom: the adversarial method of the step")
    p.add_argument("--gec-phase", choices=["pretrain", "finetune"], default="finetune", help="GEC --shape smoke")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 2; --count-only: 1)")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=0.0,
        help="the card's peak (default: measured per precision on a large matmul)",
    )
    p.add_argument(
        "--compile",
        default=None,
        metavar="MODE",
        help="torch.compile the step's model as optim.compile does: default, reduce-overhead (CUDA "
        "graphs) or max-autotune; the warm-up steps compile (give --warmup 3 or more)",
    )
    p.add_argument(
        "--compile-backend",
        default="inductor",
        help="with --compile: torch.compile's backend (aot_eager: traced, no code generated)",
    )
    p.add_argument("--no-counts", action="store_true", help="timing only (no counted or FLOP-counted step)")
    p.add_argument("--max-batch", type=int, default=1024, help="largest batch tried on a GPU")
    p.add_argument("--workers", type=int, default=0, help="GEC data-parallel processes against 1 (0: off)")
    p.add_argument("--threads-per-worker", type=int, default=1)
    args = p.parse_args()
    global COMPILE, COMPILE_BACKEND
    COMPILE, COMPILE_BACKEND = args.compile, args.compile_backend
    gpu = torch.cuda.is_available()
    args.warmup = args.warmup if args.warmup is not None else 1 if args.count_only else 2
    if args.workers:
        args.shape = args.shape if args.shape != "auto" else ("bart-large" if gpu else "small")
        args.batch = args.batch or 4
        print(json.dumps(workers_bench(args), indent=2 if args.json else None))
        return
    device = torch.device("cuda" if gpu else "cpu")
    args.shape = _shape(args, gpu)
    args.batch = args.batch or (
        4 if args.recipe == "gec" and not gpu and not args.count_only else PAPER_BATCH[args.recipe]
    )
    out = count_only(args, device) if args.count_only else timing(args, device)
    out["compile"] = args.compile
    print(json.dumps(out, indent=2 if args.json else None))


def _shape(args: argparse.Namespace, gpu: bool) -> str:
    shape = args.shape
    if shape == "auto":
        shape = "narrow" if args.count_only else "paper" if gpu else "small" if args.recipe == "gec" else "narrow"
    if args.recipe == "gec" and shape == "paper":
        return "bart-large"
    if args.recipe != "gec" and shape in ("bart-large", "small"):
        raise SystemExit(f"--shape {shape} is a GEC shape; --recipe {args.recipe} has paper, narrow, smoke")
    return shape


def timing(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Per precision: step time, tokens/s, memory, counts and MFU at the batch; on a GPU also at the largest."""
    if args.shape == "smoke":
        raise SystemExit("--shape smoke counts (--count-only); time the smoke runs with raycl.train")
    recipe = Recipe(args.recipe, args.shape, device, args)
    out: dict[str, Any] = {
        "bench": "train",
        "recipe": args.recipe,
        "shape": args.shape,
        "device": _device_name(device),
        "threads": torch.get_num_threads(),
        "params_m": recipe.params() / 1e6,
    }
    if args.recipe == "gec":
        out.update(negatives=args.negatives, src_len=args.src_len, tgt_len=args.tgt_len)
    for precision in args.precisions.split(","):
        print(f"[bench] {args.recipe} {args.shape} {precision} batch {args.batch}", file=sys.stderr, flush=True)
        peak = args.peak_tflops or (None if args.no_counts else peak_tflops(precision, device))
        row = measure(recipe.case(args.batch), precision, args, device, peak=peak)
        if device.type == "cuda":
            row["largest_batch"] = largest = largest_batch(recipe, precision, args, device)
            if largest and largest != args.batch:
                row["at_largest_batch"] = measure_largest(recipe, largest, precision, args, device, peak)
        out[precision] = row
    if "fp32" in out and "bf16" in out:
        out["bf16_speedup"] = out["fp32"]["step_s"] / out["bf16"]["step_s"]
    return out


if __name__ == "__main__":
    main()
