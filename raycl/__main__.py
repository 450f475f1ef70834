"""``raycl VERB …`` (the console command an install puts on ``PATH``) and ``python -m raycl VERB …``: the verbs of
``python -m raycl.<verb>`` under one command, each with the same flags, exit statuses and output.

Only the verb's own module is imported, once the verb is known: ``raycl --help`` starts in a fraction of a
second, without torch or Ray.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from raycl import __version__

# verb: (its module, what it does) — the table that `raycl --help` prints
VERBS = {
    "tune": ("raycl.tune", "a Ray Tune sweep over a tune space: trials mine ‖ train ‖ evaluate; select on dev"),
    "train": ("raycl.train", "one run at a tune space's default point (no sweep)"),
    "mine": ("raycl.mine", "hard negatives to Parquet, in this process or on a Ray Data actor pool"),
    "eval": ("raycl.eval", "scoring alone: ERRANT, pairwise accuracy and α, the SemEval evaluators"),
    "convert": ("raycl.convert", "a fairseq transformer checkpoint → a Hugging Face model folder"),
}


def parser() -> argparse.ArgumentParser:
    """The top level alone (``--help``, ``--version``, the verb's name); the verb parses the rest itself."""
    verbs = "\n".join(f"  {verb:<9}{what}" for verb, (_, what) in VERBS.items())
    p = argparse.ArgumentParser(
        prog="raycl",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Contrastive training with hard negatives mined in parallel on Ray.",
        epilog=f"verbs:\n{verbs}\n\n`raycl VERB --help` lists a verb's flags; `raycl VERB …` is the same as "
        "`python -m raycl.VERB …`.",
    )
    p.add_argument("--version", action="version", version=f"raycl {__version__}")
    p.add_argument("verb", choices=list(VERBS), metavar="VERB", help=f"one of {', '.join(VERBS)}")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``raycl VERB ARGS…``: the verb's ``main`` with ``ARGS``, its usage lines named ``raycl VERB``."""
    args = list(sys.argv[1:] if argv is None else argv)
    head = args[:1] if args and not args[0].startswith("-") else args  # options before a verb are raycl's own
    verb = parser().parse_args(head).verb  # --help, --version, no verb or an unknown one: argparse exits
    done = importlib.import_module(VERBS[verb][0]).main(args[1:], prog=f"raycl {verb}")
    return int(done or 0)


if __name__ == "__main__":
    sys.exit(main())
