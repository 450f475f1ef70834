"""Benchmark: one GEC-CL training step (a positive pass and 4 negatives per sentence) through the one training loop
(``raycl.train.loop``), at fp32 and bf16, on a model of BART-large's shape built from its config (random weights:
nothing is downloaded). Prints one JSON object: per precision, step time, tokens/s, peak memory, and on a GPU the
largest batch that fits. On a machine without a GPU it runs the same on a small config (``--shape small``).

Tokens are counted as fairseq's ``num_tokens`` counts a GEC-CL example: the source plus the whole target line
(the target and every negative). Usage::

    .venv/bin/python bench/train.py --json                      # auto: bart-large on a GPU, small on a CPU
    python3 bench/train.py --json --shape bart-large --batch 16 # on a GPU machine without the venv
    .venv/bin/python bench/train.py --json --workers 2          # data parallel: 2 gloo workers against 1

``--workers N`` runs the same GEC-CL step in N processes (gloo on a CPU, NCCL on GPUs), batch B per worker, one
thread each, three ways: ``none`` (no gradient exchange: the compute alone), ``sum`` (the loop's path: backward,
then the bucketed all-reduce of :func:`raycl.train.data_parallel.sum_gradients`) and ``ddp`` (the step's forward
through DDP, whose bucketed all-reduce overlaps the backward). It prints tokens/s of N workers against 1 and each
exchange's overhead per step over ``none``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

SHAPES = {  # BartConfig fields
    "bart-large": dict(vocab_size=50265, d_model=1024, encoder_layers=12, decoder_layers=12, encoder_ffn_dim=4096,
                       decoder_ffn_dim=4096, encoder_attention_heads=16, decoder_attention_heads=16,
                       max_position_embeddings=1024),
    "small": dict(vocab_size=8000, d_model=256, encoder_layers=3, decoder_layers=3, encoder_ffn_dim=1024,
                  decoder_ffn_dim=1024, encoder_attention_heads=4, decoder_attention_heads=4,
                  max_position_embeddings=256),
}  # fmt: skip


def _model(shape: str, device: torch.device) -> Any:
    from transformers import BartConfig, BartForConditionalGeneration

    from raycl.models.seq2seq import Seq2SeqScorer

    torch.manual_seed(0)
    config = BartConfig(**SHAPES[shape], dropout=0.1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                        decoder_start_token_id=2)  # fmt: skip
    tokenizer = SimpleNamespace(pad_token_id=1, eos_token_id=2)  # ids are made here: no vocabulary needed
    return Seq2SeqScorer(BartForConditionalGeneration(config), tokenizer).to(device)  # type: ignore[arg-type]


def _batch(b: int, args: argparse.Namespace, vocab: int, device: torch.device) -> Any:
    from raycl.train.gec_step import GecBatch

    g = torch.Generator().manual_seed(b)

    def ids(*shape: int) -> torch.Tensor:
        t = torch.randint(4, vocab, shape, generator=g)
        t[..., -1] = 2  # </s>
        return t

    src = ids(b, args.src_len)
    return GecBatch(src, torch.ones_like(src), ids(b, args.tgt_len), ids(b, args.negatives, args.tgt_len),
                    torch.full((b,), args.negatives)).to(device)  # fmt: skip


def _runner(scorer: Any, precision: str, device: torch.device) -> Any:
    from raycl.configs.gec import GecConfig
    from raycl.losses.gec_margin import GecContrastiveLoss
    from raycl.recipes.gec.worker import GecState, GecTask
    from raycl.train import loop
    from raycl.train.precision import Precision, enable_tf32

    class BenchTask(GecTask):
        def step(self, st: Any, data: Any, ctx: Any) -> dict[str, float]:  # a prebuilt batch: no tokenizer
            from raycl.train.gec_step import gec_loss

            out = gec_loss(st.model, data, st.loss_fn)
            ctx.backward(out.loss, weight=float(out.ntokens))
            return {"loss": float(out.loss.detach())}

        def after_update(self, st: Any) -> None:
            pass

    cfg = GecConfig()
    cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, precision=precision))
    enable_tf32(device)
    opt = torch.optim.AdamW(scorer.parameters(), lr=1e-5)
    st = GecState(scorer, [opt], [None], {}, loss_fn=GecContrastiveLoss(margin=0.25, trade_off=0.5))
    w = loop.Worker(0, 1, device, Precision(precision, device), None, loop.Job(None, "", ""))  # type: ignore[arg-type]
    return loop._Loop(BenchTask(cfg, "finetune"), st, w)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(scorer: Any, precision: str, b: int, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    from raycl.train.loop import Batch

    runner = _runner(scorer, precision, device)
    batch = _batch(b, args, scorer.model.config.vocab_size, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for i in range(args.warmup + args.steps):
        _sync(device)
        t0 = time.perf_counter()
        runner.micro_batch(Batch(batch))
        _sync(device)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    step_s = sorted(times)[len(times) // 2]
    tokens = b * (args.src_len + args.tgt_len * (1 + args.negatives))
    peak = (torch.cuda.max_memory_allocated(device) if device.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # fmt: skip
    return {"batch": b, "step_s": step_s, "tokens_per_s": tokens / step_s, "tokens_per_step": tokens,
            "peak_memory_gib": peak / 2**30, "peak_memory_kind": "cuda allocated" if device.type == "cuda"
            else "process max RSS"}  # fmt: skip


def largest_batch(scorer: Any, precision: str, args: argparse.Namespace, device: torch.device) -> int:
    """Doubling then bisection on the batch size until a step runs out of GPU memory."""
    ok, bad = 0, None
    b = args.batch
    while bad is None or bad - ok > max(ok // 8, 1):
        try:
            measure(scorer, precision, b, argparse.Namespace(**{**vars(args), "steps": 1, "warmup": 0}), device)
            ok = b
        except torch.OutOfMemoryError:
            bad = b
        scorer.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        if bad is None and b >= args.max_batch:
            break
        b = b * 2 if bad is None else (ok + bad) // 2
    return ok


def _worker_step(rank: int, world: int, port: int, mode: str, args: argparse.Namespace, out: str) -> None:
    """One process of the data-parallel benchmark: ``args.steps`` timed steps (after ``args.warmup``)."""
    import os

    import torch.distributed as dist

    from raycl.losses.gec_margin import GecContrastiveLoss
    from raycl.train.data_parallel import average_gradients
    from raycl.train.gec_step import gec_loss

    torch.set_num_threads(args.threads_per_worker)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    scorer = _model(args.shape, device)
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
    batch = _batch(args.batch, args, scorer.model.config.vocab_size, device)
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

    out: dict[str, Any] = {"bench": "train_workers", "shape": args.shape, "batch_per_worker": args.batch,
                           "threads_per_worker": args.threads_per_worker, "backend": "nccl"
                           if torch.cuda.is_available() else "gloo"}  # fmt: skip
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
    p.add_argument("--shape", choices=["auto", *SHAPES], default="auto")
    p.add_argument("--batch", type=int, default=0, help="sentences per step (default: 16 on a GPU, 4 on a CPU)")
    p.add_argument("--negatives", type=int, default=4)
    p.add_argument("--src-len", type=int, default=48)
    p.add_argument("--tgt-len", type=int, default=48)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--max-batch", type=int, default=1024, help="largest batch tried on a GPU")
    p.add_argument("--workers", type=int, default=0, help="data-parallel processes against 1 (0: off)")
    p.add_argument("--threads-per-worker", type=int, default=1)
    args = p.parse_args()
    if args.workers:
        gpu = torch.cuda.is_available()
        args.shape = args.shape if args.shape != "auto" else ("bart-large" if gpu else "small")
        args.batch = args.batch or 4
        print(json.dumps(workers_bench(args), indent=2 if args.json else None))
        return
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = args.shape if args.shape != "auto" else ("bart-large" if device.type == "cuda" else "small")
    args.batch = args.batch or (16 if device.type == "cuda" else 4)
    scorer = _model(shape, device)
    out: dict[str, Any] = {"bench": "train", "shape": shape, "device": torch.cuda.get_device_name(device)
                           if device.type == "cuda" else "cpu", "threads": torch.get_num_threads(),
                           "params_m": sum(p.numel() for p in scorer.parameters()) / 1e6,
                           "negatives": args.negatives, "src_len": args.src_len,
                           "tgt_len": args.tgt_len}  # fmt: skip
    for precision in args.precisions.split(","):
        print(f"[bench] {shape} {precision} batch {args.batch}", file=sys.stderr, flush=True)
        row = measure(scorer, precision, args.batch, args, device)
        if device.type == "cuda":
            row["largest_batch"] = largest_batch(scorer, precision, args, device)
        out[precision] = row
    if "fp32" in out and "bf16" in out:
        out["bf16_speedup"] = out["fp32"]["step_s"] / out["bf16"]["step_s"]
    print(json.dumps(out, indent=2 if args.json else None))


if __name__ == "__main__":
    main()
