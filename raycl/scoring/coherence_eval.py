"""``python -m raycl.eval coherence``: pairwise accuracy of a coherence model and LMvLM agreement (α).

Accuracy per pairs file: an item is right iff the model scores its ``pos`` strictly higher than every one
of its first ``--num-negs`` negatives (the code's ``eval.py``; test sets have one ``neg``). With
``--annotations`` (LMvLM_Annotations: the human coders' '0'/'1' lists aligned with the one ``--pairs``
file), the model joins the humans as one more coder and Krippendorff's nominal α is reported (``alpha``),
with the humans' own α (``human_alpha``); a model tie is a missing label. ``--annotations`` without
``--model`` reports ``human_alpha`` alone.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raycl.data.coherence import CoherenceItem, read_annotations, read_pairs
from raycl.errors import UserError, at, summary_out
from raycl.scoring.coherence_metrics import alpha_with_model, krippendorff_alpha_nominal, pairwise_accuracy


def add_coherence_parser(sub: Any) -> None:
    """Add the ``coherence`` subcommand to ``raycl.eval``'s subparsers (``run`` = :func:`run_coherence`)."""
    p = sub.add_parser(
        "coherence",
        help="pairwise accuracy and LMvLM Krippendorff alpha of a coherence model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default=None, metavar="DIR", help="coherence model folder (save_pretrained)")
    p.add_argument(
        "--pairs",
        action="append",
        default=[],
        metavar="FILE",
        help="pairs file: pickle (.pkl, or the shipped suffix-less sets) or .jsonl (repeatable)",
    )
    p.add_argument(
        "--annotations",
        default=None,
        metavar="FILE",
        help="human label lists aligned with the one --pairs file (pickle or .json)",
    )
    p.add_argument("--batch-size", type=int, default=8, help="documents scored per forward pass (default 8)")
    p.add_argument(
        "--num-negs",
        type=int,
        default=5,
        help="negatives of a training-layout item compared with its pos (default 5, as eval.py)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of a table")
    p.set_defaults(run=run_coherence)


def _check_args(args: argparse.Namespace) -> None:
    if args.model is None and args.pairs:
        raise UserError("--pairs: scoring pairs needs --model DIR")
    if args.model is None and args.annotations is None:
        raise UserError("--model: missing, expected --model DIR with --pairs FILE (and/or --annotations FILE)")
    if args.model is not None and not args.pairs:
        raise UserError("--pairs: missing, expected at least one pairs file to score with --model")
    if args.model is not None and args.annotations is not None and len(args.pairs) != 1:
        raise UserError(
            f"--annotations: given with {len(args.pairs)} --pairs files, expected exactly one "
            "(the file the labels are aligned with)"
        )
    if args.batch_size < 1 or args.num_negs < 1:
        raise UserError("--batch-size/--num-negs: expected integers >= 1")


def score_items(
    scorer: Any, items: Sequence[CoherenceItem], *, num_negs: int, batch_size: int
) -> tuple[list[float], list[list[float]]]:
    """Scores of each item's pos and of its first ``num_negs`` negatives, in one batched pass."""
    docs: list[tuple[str, ...]] = []
    for item in items:
        docs += [item.pos, *item.negs[:num_negs]]
    scores = scorer.score_documents(docs, batch_size=batch_size)  # (N,)
    flat = [float(s) for s in scores.reshape(-1).tolist()]
    if len(flat) != len(docs):
        raise RuntimeError(f"scorer returned {len(flat)} scores for {len(docs)} documents")
    pos, negs, k = [], [], 0
    for item in items:
        n = min(num_negs, len(item.negs))
        pos.append(flat[k])
        negs.append(flat[k + 1 : k + 1 + n])
        k += 1 + n
    return pos, negs


def run_coherence(args: argparse.Namespace) -> int:
    """Score ``--pairs`` with ``--model`` and/or compute α from ``--annotations``; print JSON or a table."""
    _check_args(args)
    coders = read_annotations(args.annotations) if args.annotations is not None else None
    result: dict[str, Any] = {}
    if args.model is not None:
        if not Path(args.model).is_dir():
            raise UserError(f"{at(args.model)}: not a directory, expected a coherence model folder")
        from raycl.models.coherence import CoherenceScorer  # torch/transformers only when a model is scored

        scorer = CoherenceScorer.from_pretrained(args.model)
        result["files"] = {}
        for path in args.pairs:
            items = read_pairs(path)
            pos, negs = score_items(scorer, items, num_negs=args.num_negs, batch_size=args.batch_size)
            result["files"][path] = {"n": len(items), "accuracy": pairwise_accuracy(pos, negs)}
            if coders is not None:
                result["alpha"] = _model_alpha(path, items, coders=coders, pos=pos, negs=negs)
    if coders is not None:
        result["human_alpha"] = krippendorff_alpha_nominal(coders)
    print(json.dumps(result, indent=2) if args.json else format_coherence_table(result), file=summary_out())
    return 0


def _model_alpha(
    path: str,
    items: Sequence[CoherenceItem],
    *,
    coders: list[list[str | None]],
    pos: list[float],
    negs: list[list[float]],
) -> float:
    """α of the human coders plus the model's labels on the pairs file they annotated."""
    if len(coders[0]) != len(items):
        raise UserError(
            f"{at(path)}: {len(items)} pairs but {len(coders[0])} labels per coder in "
            "--annotations, expected the file the labels were made for"
        )
    if any(len(n) != 1 for n in negs):
        raise UserError(f"{at(path)}: items with several negatives, expected one 'neg' per annotated pair")
    return alpha_with_model(coders, pos, negs)


def format_coherence_table(result: dict[str, Any]) -> str:
    """The readable report: accuracy (%) per pairs file, then α with and without the model."""
    lines: list[str] = []
    if "files" in result:
        lines.append(f"{'pairs':<48}{'n':>8}{'accuracy%':>11}")
        for path, row in result["files"].items():
            lines.append(f"{path:<48}{row['n']:>8}{100 * row['accuracy']:>11.2f}")
    if "alpha" in result:
        lines.append(f"Krippendorff alpha, humans + model: {result['alpha']:.4f}")
    if "human_alpha" in result:
        lines.append(f"Krippendorff alpha, humans only:    {result['human_alpha']:.4f}")
    return "\n".join(lines)
