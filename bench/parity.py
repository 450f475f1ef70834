"""Engine parity on a model that corrects text (issue 19 §5): ``python bench/parity.py --json``.

A small BART (the smoke preset's shape, a BPE trained here) is taught GEC on the built-in synthetic corpus
(:mod:`raycl.data.gec_corpus`, fresh BEA-like pairs) until greedy decoding corrects ``--until`` of the erroneous
sentences of a dev set (checked every ``--eval-every`` updates) or ``--max-minutes`` have passed (on a 2-core
machine shared with other jobs: 30 minutes, 8,101 updates, half the held-out erroneous sentences corrected by
beam 5), then saved with ``save_pretrained``: ``--model
PATH`` keeps it there (a folder that already holds a model is reused, no training). On ``--held-out`` sentences the
trainer never saw, each engine mines as ``raycl.mine`` does (:func:`raycl.miners.beam_search.build_beam_miner`,
``k`` and ``beam`` of the GEC config, ``max_len_b`` 200, ``rank_by`` beam): its n-best lists (distinct texts), then
the negatives raycl selects from them. One JSON object with

- ``model``: the folder, its shape and training (updates, seconds, the dev figures at the stop);
- ``quality``: what HF's top-1 does on the held-out sentences — ``erroneous_corrected`` (top-1 = the target on
  sentences with an edit), ``clean_kept`` (top-1 = the source on sentences without), ``exact`` (all);
- ``ctranslate2-fp32`` and ``ctranslate2-int8``, each against HF: ``top1`` (the same best hypothesis),
  ``nbest_set`` (the same set of distinct hypotheses), ``nbest_list`` (the same list, in order), ``negatives``
  (identical selected negatives, in order), ``max_abs_dS`` / ``mean_abs_dS`` (|S_HF − S_engine| over hypotheses
  both return, rank by rank in identical lists, and over identical selected negatives), each engine's seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

if TYPE_CHECKING:
    from raycl.data.gec import GecExample
    from raycl.miners.records import MinedNegatives
    from raycl.models.seq2seq import Seq2SeqScorer

SHAPE = dict(vocab_size=1000)  # the smoke preset: d_model 128, 2+2 layers, 4 heads, ffn 256, dropout 0.1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/parity.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        type=Path,
        default=None,
        help="the trained model's folder: reused if it holds one, else trained and saved there "
        "(default: a temporary folder)",
    )
    p.add_argument("--held-out", type=int, default=400, help="held-out sentences compared (default 400)")
    p.add_argument(
        "--until",
        type=float,
        default=0.6,
        help="stop training when greedy decoding corrects this share of the dev set's erroneous "
        "sentences (default 0.6)",
    )
    p.add_argument("--max-updates", type=int, default=20000, help="stop training there anyway (default 20000)")
    p.add_argument(
        "--max-minutes",
        type=float,
        default=30.0,
        help="stop training after this many minutes even short of --until (default 30)",
    )
    p.add_argument("--eval-every", type=int, default=500, help="updates between dev checks (default 500)")
    p.add_argument("--dev", type=int, default=200, help="dev sentences of the stop criterion (default 200)")
    p.add_argument("--train-sentences", type=int, default=100_000, help="training pairs (default 100000)")
    p.add_argument("--batch-size", type=int, default=32, help="training sentences an update (default 32)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    p.add_argument("--warmup", type=int, default=300, help="linear warm-up updates (default 300)")
    p.add_argument("--k", type=int, default=None, help="negatives a sentence (default: the GEC config's)")
    p.add_argument("--beam", type=int, default=None, help="beam = n-best size (default: the GEC config's)")
    p.add_argument("--threads", type=int, default=2, help="torch/CTranslate2 threads (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print only the JSON object on stdout")
    return p.parse_args(argv)


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def splits(args: argparse.Namespace) -> tuple[list[tuple[str, str]], list[GecExample], list[GecExample]]:
    """(training pairs, dev, held-out): BEA-like density, distinct seeds; held-out and dev sources never among
    the training ones."""
    from raycl.data.gec import GecExample
    from raycl.data.gec_corpus import HIGH_DENSITY, generate_pairs

    def pairs(n: int, seed: int) -> list[tuple[str, str]]:
        got = generate_pairs(
            n, error_rate=HIGH_DENSITY.error_rate, edits_per_error=HIGH_DENSITY.edits_per_error, seed=seed
        )
        return [(m.source, m.target()) for _, m in got]

    held = pairs(args.held_out, 1_000 + args.seed)
    dev = pairs(args.dev, 2_000 + args.seed)
    unseen = {s for s, _ in held + dev}
    train = [p for p in pairs(args.train_sentences, 3_000 + args.seed) if p[0] not in unseen]
    return (
        train,
        [GecExample(f"dev:{i}", s, t) for i, (s, t) in enumerate(dev)],
        [GecExample(f"held-out:{i}", s, t) for i, (s, t) in enumerate(held)],
    )


def corrects(scorer: Seq2SeqScorer, examples: list[GecExample], *, beam: int = 1) -> dict[str, float]:
    """Top-1 of ``beam`` search against the target: erroneous sentences corrected, clean ones kept, exact."""
    from raycl.miners.beam_search import normalize

    hyps = scorer.generate([ex.source for ex in examples], num_beams=beam, max_new_tokens=200, batch_size=64)
    hit = [bool(h) and normalize(h[0][0]) == normalize(ex.target) for h, ex in zip(hyps, examples, strict=True)]
    wrong = [normalize(ex.source) != normalize(ex.target) for ex in examples]
    n_wrong = sum(wrong)
    fixed = sum(h for h, w in zip(hit, wrong, strict=True) if w)
    return {
        "sentences": len(examples),
        "erroneous": n_wrong,
        "erroneous_corrected": round(fixed / max(n_wrong, 1), 4),
        "clean_kept": round((sum(hit) - fixed) / max(len(examples) - n_wrong, 1), 4),
        "exact": round(sum(hit) / len(examples), 4),
    }


def train(
    out: Path, pairs: list[tuple[str, str]], dev: list[GecExample], args: argparse.Namespace
) -> dict[str, Any]:
    """Teach GEC (token-level NLL, AdamW, linear warm-up) until the dev criterion holds; save to ``out``."""
    import random

    import torch

    from raycl.models.presets import build_model
    from raycl.models.seq2seq import Seq2SeqScorer
    from raycl.training.optim import build_optimizer, build_scheduler

    scratch = out.with_name(f".{out.name}.tmp")
    build_model("smoke", out_dir=scratch, texts=[t for p in pairs[:20_000] for t in p], seed=args.seed, **SHAPE)
    torch.manual_seed(args.seed)
    scorer = Seq2SeqScorer.from_pretrained(scratch)
    opt = build_optimizer(scorer, args.lr, betas=(0.9, 0.98))
    sched = build_scheduler(opt, "fixed", warmup=args.warmup, total=args.max_updates)
    order, rng = list(range(len(pairs))), random.Random(args.seed)
    t0, update, pos, dev_stats, history = time.perf_counter(), 0, len(order), {}, []
    while update < args.max_updates and time.perf_counter() - t0 < 60 * args.max_minutes:
        if pos + args.batch_size > len(order):
            rng.shuffle(order)
            pos = 0
        batch = [pairs[i] for i in order[pos : pos + args.batch_size]]
        pos += args.batch_size
        scorer.model.train()
        x = scorer.tokenize([s for s, _ in batch], [t for _, t in batch], max_length=128)
        assert x.target_ids is not None and x.prev_output_ids is not None
        ntok = x.target_ids.ne(scorer.pad_id).sum()
        loss = -scorer.sequence_scores(x.src_ids, x.src_mask, x.prev_output_ids, x.target_ids).sum() / ntok
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(scorer.parameters(), 1.0)
        opt.step()
        sched.step()
        update += 1
        if update % 100 == 0:
            say(f"update {update}: loss {loss.item():.3f}, {time.perf_counter() - t0:.0f} s")
        if update % args.eval_every == 0:
            dev_stats = corrects(scorer, dev)
            history.append(
                {
                    "updates": update,
                    "loss": round(loss.item(), 4),
                    **dev_stats,
                    "seconds": round(time.perf_counter() - t0, 1),
                }
            )
            say(f"update {update}: loss {loss.item():.3f}, dev {dev_stats}, {time.perf_counter() - t0:.0f} s")
            if dev_stats["erroneous_corrected"] >= args.until:
                break
    if update % args.eval_every:  # stopped by the clock: the dev figures of the weights saved
        dev_stats = corrects(scorer, dev)
        history.append(
            {
                "updates": update,
                "loss": round(loss.item(), 4),
                **dev_stats,
                "seconds": round(time.perf_counter() - t0, 1),
            }
        )
    scorer.model.eval()
    scorer.save_pretrained(scratch)
    (scratch / "raycl_parity_training.json").write_text(json.dumps(history))
    scratch.replace(out)  # the folder appears whole or not at all
    return {
        "trained_now": True,
        "updates": update,
        "seconds": round(time.perf_counter() - t0, 1),
        "train_pairs": len(pairs),
        "batch_size": args.batch_size,
        "lr": args.lr,
        "history": history,
        "until": args.until,
        "reached": dev_stats.get("erroneous_corrected", 0.0) >= args.until,
    }


def mine_all(
    model: Path, examples: list[GecExample], *, engine: str, precision: str, k: int, beam: int
) -> tuple[list[MinedNegatives], list[MinedNegatives], float]:
    """One engine's n-best lists and selected negatives, as a ``gec_beam`` miner makes them, and its seconds."""
    from raycl.miners.beam_search import build_beam_miner

    miner = build_beam_miner(str(model), {"k": k, "beam": beam, "engine": engine, "precision": precision})
    t0 = time.perf_counter()
    nbest = miner.nbest(examples)
    selected = miner.select(nbest, examples)
    return nbest, selected, time.perf_counter() - t0


def compare(
    a: tuple[list[MinedNegatives], list[MinedNegatives]], b: tuple[list[MinedNegatives], list[MinedNegatives]]
) -> dict[str, Any]:
    """Engine b against engine a (HF): agreement of top-1s, n-best sets and lists, selected negatives; |ΔS|."""
    (nb_a, sel_a), (nb_b, sel_b) = a, b
    n = len(nb_a)
    diffs = [
        abs(p - q)
        for x, y in zip(nb_a, nb_b, strict=True)
        if x.negatives == y.negatives
        for p, q in zip(x.scores, y.scores, strict=True)
    ]
    diffs += [
        abs(p - q)
        for x, y in zip(sel_a, sel_b, strict=True)
        if x.negatives == y.negatives
        for p, q in zip(x.scores, y.scores, strict=True)
    ]
    same_neg = sum(x.negatives == y.negatives for x, y in zip(sel_a, sel_b, strict=True))
    return {
        "top1": round(sum(x.negatives[:1] == y.negatives[:1] for x, y in zip(nb_a, nb_b, strict=True)) / n, 4),
        "nbest_set": round(
            sum(set(x.negatives) == set(y.negatives) for x, y in zip(nb_a, nb_b, strict=True)) / n, 4
        ),
        "nbest_list": round(sum(x.negatives == y.negatives for x, y in zip(nb_a, nb_b, strict=True)) / n, 4),
        "negatives": round(same_neg / n, 4),
        "negatives_differ": n - same_neg,
        "max_abs_dS": max(diffs, default=0.0),
        "mean_abs_dS": sum(diffs) / max(len(diffs), 1),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from raycl.config.tasks.gec import GecMiningSection
    from raycl.models.seq2seq import Seq2SeqScorer

    torch.set_num_threads(args.threads)
    k = GecMiningSection().k if args.k is None else args.k
    beam = GecMiningSection().beam if args.beam is None else args.beam
    pairs, dev, held = splits(args)
    with tempfile.TemporaryDirectory(prefix="raycl-bench-parity-") as tmp:
        model = args.model or Path(tmp) / "model"
        if (model / "config.json").exists():
            history = (
                json.loads((model / "raycl_parity_training.json").read_text())
                if (model / "raycl_parity_training.json").exists()
                else []
            )
            training: dict[str, Any] = {"trained_now": False, "history_tail": history[-1:] if history else None}
        else:
            model.parent.mkdir(parents=True, exist_ok=True)
            training = train(model, pairs, dev, args)
        hf_scorer = Seq2SeqScorer.from_pretrained(model).eval()
        quality = corrects(hf_scorer, held, beam=beam)
        say(f"held-out quality (HF, beam {beam}): {quality}")
        runs = {
            name: mine_all(model, held, engine=e, precision=p, k=k, beam=beam)
            for name, (e, p) in {
                "hf-fp32": ("hf", "fp32"),
                "ctranslate2-fp32": ("ctranslate2", "fp32"),
                "ctranslate2-int8": ("ctranslate2", "int8"),
            }.items()
        }
        cfg = hf_scorer.model.config
        report: dict[str, Any] = {
            "bench": "parity",
            "k": k,
            "beam": beam,
            "max_len_b": 200,
            "rank_by": "beam",
            "held_out": len(held),
            "model": {
                "path": str(args.model) if args.model else None,
                "d_model": cfg.d_model,
                "layers": [cfg.encoder_layers, cfg.decoder_layers],
                "vocab": cfg.vocab_size,
                "parameters": sum(p.numel() for p in hf_scorer.parameters()),
                **training,
            },
            "quality": quality,
            "seconds": {name: round(r[2], 2) for name, r in runs.items()},
        }
        for name in ("ctranslate2-fp32", "ctranslate2-int8"):
            report[name] = compare(runs["hf-fp32"][:2], runs[name][:2])
        report["machine"] = {"platform": platform.platform(), "threads": args.threads, "torch": torch.__version__}
        report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
