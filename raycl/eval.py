"""``python -m raycl.eval TASK ...``: scoring alone, one subcommand per task.

``gec``: ERRANT span-based correction P/R/F0.5 of a hypothesis file (one corrected sentence per line, in the
order of the reference's ``S`` lines) against one or more M2 references, per annotator, averaged and
combined (errant's best reference per sentence), with OE/IE ratios; ``--compare`` adds the paper's
bootstrap sign test. Same numbers as ``errant_parallel -orig SRC -cor HYP`` + ``errant_compare``.

``coherence``: pairwise accuracy per pairs file (ties wrong) and Krippendorff's α with the model as an extra
coder (``raycl.scoring.coherence_eval``); ``idiom`` / ``sts``: the SemEval-2022 Task 2 official scores
(``raycl.scoring.semeval_eval``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from raycl.errors import UserError, at, cli_entry, summary_out


def _add_gec(sub: Any) -> None:
    p = sub.add_parser(
        "gec",
        help="ERRANT P/R/F0.5, OE/IE and sign test for grammatical error correction",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--hyp", required=True, help="system output, one tokenised sentence per line")
    p.add_argument(
        "--ref",
        required=True,
        action="append",
        metavar="M2",
        help="reference M2 file (repeatable); PATH[START:STOP] keeps a slice of its sentences",
    )
    p.add_argument("--annotator", type=int, default=None, help="score against this annotator id only")
    p.add_argument("--tokenize", action="store_true", help="re-tokenise with spaCy (errant_parallel -tok)")
    p.add_argument("--beta", type=float, default=0.5, help="F-score beta (default 0.5)")
    p.add_argument(
        "--compare",
        metavar="HYP_B",
        default=None,
        help="second system: one-tailed bootstrap sign test for HYP better than HYP_B",
    )
    p.add_argument("--samples", type=int, default=100, help="bootstrap samples for --compare (default 100)")
    p.add_argument("--seed", type=int, default=1, help="bootstrap seed for --compare (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of a table")
    p.set_defaults(run=_run_gec)


def _read_hyp(path: str) -> list[str]:
    from raycl.data.m2 import iter_lines

    return [line for _, line in iter_lines(path)]


def _read_ref(spec: str) -> list[Any]:
    """An M2 file, or the ``[START:STOP]`` slice of its sentences (any suffix is read as M2)."""
    from raycl.data.m2 import read_m2

    if spec.endswith("]"):
        from raycl.data.specs import parse_spec

        parsed = parse_spec(spec)
        if parsed.format != "m2":
            raise UserError(f"{at(spec)}: expected an M2 reference file")
        return [s for _, s in parsed.select(read_m2(parsed.path))]
    return read_m2(spec)


def _run_gec(args: argparse.Namespace) -> int:
    from raycl.scoring.gec_metrics import HypothesisEdits, bootstrap_sign_test, evaluate_gec

    refs = {spec: _read_ref(spec) for spec in args.ref}
    system = HypothesisEdits(_read_hyp(args.hyp), tokenize=args.tokenize, name=args.hyp)
    result: dict[str, Any] = {"hyp": args.hyp, "beta": args.beta}
    result |= evaluate_gec(system, refs, beta=args.beta, annotator=args.annotator)
    if args.compare is not None:
        other = HypothesisEdits(_read_hyp(args.compare), tokenize=args.tokenize, name=args.compare)
        tests = {
            name: bootstrap_sign_test(
                system.for_ref(name, sents),
                other.for_ref(name, sents),
                sents,
                samples=args.samples,
                seed=args.seed,
                annotator=args.annotator,
                beta=args.beta,
            )
            for name, sents in refs.items()
        }
        result["compare"] = {"hyp_b": args.compare, "samples": args.samples, "seed": args.seed, "refs": tests}
    print(json.dumps(result, indent=2) if args.json else format_gec_table(result), file=summary_out())
    return 0


def _fmt_row(label: str, row: dict[str, Any], fkey: str) -> str:
    counts = "".join(f"{row[k]:>7}" if k in row else f"{'':>7}" for k in ("tp", "fp", "fn"))
    pct = "".join(f"{100 * row[k]:>8.2f}" if k in row else f"{'':>8}" for k in ("p", "r", fkey, "oe", "ie"))
    return f"  {label:<10}{counts}{pct}".rstrip()


def format_gec_table(result: dict[str, Any]) -> str:
    """The readable report: per reference, each annotator, the average and the combined score (in %)."""
    fkey = f"f{result['beta']:g}"
    header = f"  {'annotator':<10}{'TP':>7}{'FP':>7}{'FN':>7}{'P%':>8}{'R%':>8}{fkey.upper() + '%':>8}"
    lines = [f"hyp: {result['hyp']}"]
    for name, ref in result["refs"].items():
        lines += ["", f"ref: {name}", header + f"{'OE%':>8}{'IE%':>8}"]
        lines += [_fmt_row(a, row, fkey) for a, row in ref["annotators"].items()]
        lines += [_fmt_row("average", ref["average"], fkey), _fmt_row("combined", ref["combined"], fkey)]
    lines += ["", _fmt_row("all refs", result["average"], fkey)]
    if "compare" in result:
        lines += [
            "",
            f"sign test: {result['hyp']} better than {result['compare']['hyp_b']} "
            f"({result['compare']['samples']} bootstrap samples)",
        ]
        lines += [
            f"  {name}: wins {t['wins']}, losses {t['losses']}, ties {t['ties']}, p = {t['p_value']:.4g}"
            for name, t in result["compare"]["refs"].items()
        ]
    return "\n".join(lines)


def build_parser(prog: str = "python -m raycl.eval") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Score a system's output.")
    sub = parser.add_subparsers(dest="task", required=True, metavar="TASK")
    _add_gec(sub)
    from raycl.scoring.coherence_eval import add_coherence_parser
    from raycl.scoring.semeval_eval import add_idiom_parser, add_sts_parser

    add_coherence_parser(sub)
    add_idiom_parser(sub)
    add_sts_parser(sub)
    return parser


@cli_entry
def main(argv: Sequence[str] | None = None, *, prog: str = "python -m raycl.eval") -> int:
    args = build_parser(prog).parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
