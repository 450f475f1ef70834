"""Shared command-line plumbing of ``python -m raycl.tune`` and ``python -m raycl.train``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from raycl.config import Space, load_space


def space_parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("space", help="a tune space name (tune_spaces/SPACE.yaml) or a path to a YAML file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted config key, e.g. --set loss.margin=0.3 (repeatable)")
    p.add_argument("--preset", default=None, help="a preset of the space: smoke | small | paper")
    p.add_argument("--address", default=None, help="Ray address (auto, HOST:PORT); default: RAY_ADDRESS or "
                   "an embedded local Ray")
    p.add_argument("--out", default=None, type=Path,
                   help="run folder (default runs/SPACE/TIMESTAMP); an earlier run's is resumed, any other "
                   "existing non-empty folder refused")
    p.add_argument("--json", action="store_true", help="print a machine-readable summary on stdout")
    return p


def load(args: argparse.Namespace) -> tuple[Space, Path]:
    space = load_space(args.space, preset=args.preset, overrides=args.overrides)
    run_dir = args.out or Path("runs") / space.name / time.strftime("%Y%m%d-%H%M%S")
    return space, run_dir.resolve()


def recipe(space: Space) -> Any:
    """The space's task's recipe (``raycl.recipes.RECIPES``)."""
    from raycl.recipes import recipe_for

    return recipe_for(space.config.task)


def check_inputs(space: Space, run_dir: Path) -> None:
    """Read every input file before Ray starts: a malformed file ends in one line and exit status 2 with nothing
    started."""
    from raycl.driver import check_inputs as check
    from raycl.run_folder import open_run_folder

    open_run_folder(run_dir, space=space.name)  # not a folder of the user's; an earlier run's checkpoints are data
    check(recipe(space), space, run_dir)


def run(space: Space, run_dir: Path, *, sweep: bool) -> dict[str, Any]:
    from raycl import driver

    return (driver.run_tune if sweep else driver.run_train)(recipe(space), space, run_dir)


def finish(summary: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        json.dump(summary, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return
    print(f"report: {Path(summary['run_dir']) / 'report.md'}")


def quiet_ray() -> None:
    """Keep the terminal readable: Ray's own progress tables off unless RAYCL_VERBOSE=1."""
    if os.environ.get("RAYCL_VERBOSE") != "1":
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
        os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
