"""``python -m raycl.eval idiom|sts``: the official SemEval-2022 Task 2 scores of a submission file.

``idiom`` (Subtask A): macro-F1 per setting (zero_shot, one_shot) and languages (EN, PT, EN+PT), as the
organisers' ``SubTask1Evaluator.py`` prints it from commit b415bf9 (2021-09-03) on, its latest f647c08 included;
``--average weighted|micro|binary`` gives the three columns its first commits (4b9946f, 381fec5) printed.
``sts`` (Subtask B): Spearman ρ over ALL, Idiom and STS rows per setting (pre_train, fine_tune) and languages.
Same numbers as the organisers' ``SubTask1Evaluator.py`` / ``SubTask2Evaluator.py``; settings
absent from the submission are skipped. ``raycl/eval.py`` wires these in with ``add_idiom_parser(sub)``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from raycl.errors import summary_out
from raycl.scoring.semeval_metrics import (
    F1_AVERAGES,
    SUBSETS,
    IdiomScores,
    StsScores,
    evaluate_idiom,
    evaluate_sts,
)


def _add(sub: Any, name: str, help_text: str, run: Any) -> Any:
    p = sub.add_parser(
        name, help=help_text, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--submission",
        required=True,
        metavar="CSV",
        help="submission in the official format (ID, Language, Setting, Label|Sim)",
    )
    p.add_argument("--gold", required=True, metavar="CSV", help="the official gold file of the same split")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of a table")
    p.set_defaults(run=run)
    return p


def add_idiom_parser(sub: Any) -> None:
    """Add the ``idiom`` subcommand (Subtask A macro-F1) to an argparse subparsers object."""
    p = _add(
        sub, "idiom", "SemEval-2022 Task 2 Subtask A: official macro-F1 (zero/one-shot x EN, PT, EN+PT)", run_idiom
    )
    p.add_argument(
        "--average",
        choices=F1_AVERAGES,
        default="macro",
        help="F1 averaging: macro (the task's metric and what SubTask1Evaluator.py prints since "
        "b415bf9, default), or weighted / micro / binary (label 1), the columns its first "
        "commits 4b9946f and 381fec5 printed",
    )


def add_sts_parser(sub: Any) -> None:
    """Add the ``sts`` subcommand (Subtask B Spearman) to an argparse subparsers object."""
    _add(sub, "sts", "SemEval-2022 Task 2 Subtask B: official Spearman (ALL/Idiom/STS x EN, PT, EN+PT)", run_sts)


def _fmt(value: float | None) -> str:
    return f"{value:>9.4f}" if value is not None else f"{'-':>9}"


def format_idiom_table(scores: IdiomScores) -> str:
    """One line per setting, macro-F1 per language set (``-``: a blank label or no rows)."""
    langs = next(iter(scores.values())).keys() if scores else ()
    lines = [f"{'setting':<11}" + "".join(f"{k:>9}" for k in langs)]
    lines += [f"{s:<11}" + "".join(_fmt(v) for v in row.values()) for s, row in scores.items()]
    return "\n".join(lines)


def format_sts_table(scores: StsScores) -> str:
    """One line per (setting, languages), Spearman ρ for ALL, Idiom and STS (``-``: not computable)."""
    lines = [f"{'setting':<11}{'languages':<11}" + "".join(f"{k:>9}" for k in SUBSETS)]
    lines += [
        f"{s:<11}{langs:<11}" + "".join(_fmt(cell[k]) for k in SUBSETS)
        for s, row in scores.items()
        for langs, cell in row.items()
    ]
    return "\n".join(lines)


def run_idiom(args: argparse.Namespace) -> int:
    scores = evaluate_idiom(args.submission, args.gold, average=args.average)
    print(json.dumps(scores, indent=2) if args.json else format_idiom_table(scores), file=summary_out())
    return 0


def run_sts(args: argparse.Namespace) -> int:
    scores = evaluate_sts(args.submission, args.gold)
    print(json.dumps(scores, indent=2) if args.json else format_sts_table(scores), file=summary_out())
    return 0
