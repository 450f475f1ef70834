"""Shared command-line plumbing of ``python -m raycl.tune`` and ``python -m raycl.train``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from raycl.config import Space, space_names, to_dict
from raycl.config.tasks import load_space
from raycl.errors import TrialsFailed, UserError, summary_out
from raycl.storage import check_uri, is_uri, push, remote_of, stage

TRACKERS = ("mlflow", "wandb")


def parse_track(text: str) -> tuple[str, ...]:
    """``--track``'s value: ``mlflow``, ``wandb`` or both, comma-separated (anything else: argparse's exit 2)."""
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    if not names or any(n not in TRACKERS for n in names):
        raise argparse.ArgumentTypeError(f"{text!r}: expected {' or '.join(TRACKERS)} (or both, comma-separated)")
    return names


def space_parser(prog: str, description: str, *, sweep: bool = False) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument(
        "space",
        help=f"a tune space of this raycl — {', '.join(space_names()) or 'none'} — or a path to a YAML file",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a dotted config key, e.g. --set loss.margin=0.3 (repeatable)",
    )
    p.add_argument("--preset", default=None, help="a preset of the space: smoke | small | paper")
    p.add_argument(
        "--address",
        default=None,
        help="Ray address (auto, HOST:PORT); default: RAY_ADDRESS or an embedded local Ray",
    )
    p.add_argument(
        "--cluster-config",
        default=None,
        metavar="FILE",
        help="the autoscaler's node types to check a run against: a `ray up` cluster YAML or a KubeRay "
        "RayCluster/RayJob manifest (default: found on the head, docs/cluster.md)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="run folder (default runs/SPACE/TIMESTAMP; inside a Ray job an absolute one is required), "
        "or an object store URI (s3://bucket/prefix, gs://…); an earlier run's is resumed, any "
        "other existing non-empty folder refused",
    )
    p.add_argument("--json", action="store_true", help="print a machine-readable summary on stdout")
    p.add_argument(
        "--track",
        type=parse_track,
        default=None,
        metavar="mlflow|wandb|mlflow,wandb",
        help="log every trial's (or training's) params and reports, and the run's report, to MLflow "
        "(MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME) and/or W&B (WANDB_MODE, WANDB_PROJECT, …)",
    )
    p.add_argument(
        "--trust-out",
        action="store_true",
        help="use a local --out that is not yours alone (another user owns or can write it or a folder "
        "above it, or a link leads out of it), which raycl otherwise refuses. RISK: a resumed run "
        "reads back what the folder holds, and a sweep's restore unpickles Ray Tune's state: "
        "anyone who can write it can run code as you; give it only for a folder whose writers you "
        "trust",
    )
    if sweep:
        p.add_argument(
            "--trust-store",
            action="store_true",
            help="with --out on an object store: restore the sweep's Ray Tune state from the store "
            "even when raycl has no record of writing it as you on this machine (another machine, "
            "a lost cache). RISK: that state is pickles: anyone who can write the prefix can run "
            "code as you; give it only for a prefix that you alone can write",
        )
    return p


def load(args: argparse.Namespace) -> tuple[Space, Path]:
    address = args.address or os.environ.get("RAY_ADDRESS")
    if address:  # a cluster that refuses us ends in one line now, not after the inputs were read
        from raycl.distributed.runtime import check_cluster

        check_cluster(address)
    if getattr(args, "track", None):
        from raycl.distributed.tracking import check

        check(args.track)
    space = load_space(args.space, preset=args.preset, overrides=args.overrides)
    check_uris(space)
    run_dir = run_folder(args.out, space.name)
    if getattr(args, "trust_store", False) and (uri := remote_of(run_dir)) is not None:
        from raycl.distributed.tune_state import trust

        trust(uri)
    return space, run_dir


STORE_ENDPOINTS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


def check_uris(space: Space) -> None:
    """Every URI the space names (its config, search points and baselines) and the store's endpoint, refused in one
    line when it carries credentials or a '..' (``raycl.storage.check_uri``): before anything is staged, read or
    written, and before the URI can reach a message, a folder name or a tracker."""
    for key, value in _strings(
        {"config": to_dict(space.config), "search": space.search, "baselines": space.baselines}
    ):
        if is_uri(value):
            check_uri(value, key=f"{space.source}: config key '{key.split('.', 1)[1]}'")
    for var in STORE_ENDPOINTS:
        if is_uri(os.environ.get(var, "")):
            check_uri(os.environ[var], key=f"environment variable {var}", endpoint=True)


def _strings(tree: Any, key: str = "") -> list[tuple[str, str]]:
    if isinstance(tree, dict):
        return [s for k, v in tree.items() for s in _strings(v, f"{key}.{k}" if key else str(k))]
    if isinstance(tree, (list, tuple)):
        return [s for v in tree for s in _strings(v, key)]
    return [(key, tree)] if isinstance(tree, str) else []


def run_folder(out: str | Path | None, space_name: str) -> Path:
    """The absolute run folder of ``--out`` (default ``runs/SPACE/TIMESTAMP``; an object store URI's local staging
    folder). Inside a Ray job a relative one is refused: it would land in the job's working_dir,
    unpacked in Ray's package cache on the head, which the client cannot reach, a second job of the same code
    resumes, and Ray may delete."""
    from raycl.distributed.runtime import in_ray_job

    if out is not None and is_uri(str(out)):  # a local folder for the URI, holding what the run already wrote
        return stage(check_uri(str(out), key="--out"))
    out = Path(out) if out is not None else None
    if in_ray_job() and (out is None or not out.is_absolute()):
        given = f"--out {out}" if out is not None else f"the default --out runs/{space_name}/TIMESTAMP"
        raise UserError(
            f"{given} is relative: inside a Ray job it would land in the job's working_dir "
            f"({Path.cwd()}), in Ray's package cache; give an absolute --out on storage that every "
            "node shares and you can reach (e.g. --out /mnt/raycl/runs/NAME)"
        )
    return (out or Path("runs") / space_name / time.strftime("%Y%m%d-%H%M%S")).resolve()


def say_resumed(run_dir: Path) -> None:
    """``resumed run: DIR`` (or its URI) on stderr when ``run_dir`` holds an earlier run (its ``config.yaml``,
    which the driver's prepare step writes first) — said once the folder was found to be one raycl may resume."""
    if (run_dir / "config.yaml").exists():
        print(f"resumed run: {remote_of(run_dir) or run_dir}", file=sys.stderr, flush=True)


def recipe(space: Space) -> Any:
    """The space's task's recipe (``raycl.recipes.RECIPES``)."""
    from raycl.recipes import recipe_for

    return recipe_for(space.config.task)


def check_inputs(space: Space, run_dir: Path, *, trust_out: bool = False) -> None:
    """Read every input file before Ray starts: a malformed file ends in one line and exit status 2 with nothing
    started. The run folder first: the user's alone (or ``trust_out``: ``--trust-out``)."""
    from raycl.distributed.tune_state import check_run
    from raycl.driver import check_inputs as check
    from raycl.run_folder import open_run_folder

    open_run_folder(run_dir, space=space.name, trusted=trust_out)  # the user's; an earlier run's checkpoints: data
    check_run(run_dir)  # a staged run: the sweep state in the store is what raycl wrote, or trusted
    say_resumed(run_dir)
    check(recipe(space), space, run_dir)


def check_resources(
    space: Space, *, sweep: bool, address: str | None, connected: bool, cluster_config: str | None = None
) -> Space:
    """Before anything starts on Ray: a run that can never fit the cluster ends in one line; a sweep runs no more
    trials at once than can all start (``raycl.distributed.resources``). Called before Ray starts (``connected``
    false) — the embedded Ray's resources are known then, and a refusal costs no Ray start — and again once it is
    up, against the Ray it joined."""
    import dataclasses

    import ray

    from raycl.distributed.autoscaler import before_connecting
    from raycl.distributed.resources import check_run, cluster, embedded_cluster, of_types

    joined = address or os.environ.get("RAY_ADDRESS")
    if connected and ray.is_initialized():
        have = cluster(cluster_config, fixed=not joined)
    elif not connected and not joined:
        have = embedded_cluster(space.config)
    elif joined and (types := before_connecting(joined, cluster_config)) is not None:
        have = of_types(types)  # a shape no node type holds: refused before Ray connects
    else:
        return space  # a cluster's: known once connected
    cfg = check_run(space, sweep=sweep, recipe=recipe(space), cluster_=have)
    return dataclasses.replace(space, config=cfg)


def run(space: Space, run_dir: Path, *, sweep: bool, track: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The verb's driver; with ``track``, inside a tracked run (``raycl.distributed.tracking``)."""
    from raycl import driver
    from raycl.distributed.tracking import tracked

    try:
        with tracked(track, run_dir=run_dir, space=space.name):
            summary = (driver.run_tune if sweep else driver.run_train)(recipe(space), space, run_dir)
    finally:  # a staged run: what it wrote, then its index — also when it failed, so that a re-run resumes
        push(run_dir)
    uri = remote_of(run_dir)
    return {**summary, "store": uri} if uri else summary


def finish(summary: dict[str, Any], *, as_json: bool) -> None:
    """Print the summary (``--json``) or where the report is; then say which trials failed, on stderr — and when
    every one did, end with exit status 1: a sweep that trained nothing has not succeeded, whatever its report."""
    where = (summary.get("store") or summary["run_dir"]).rstrip("/")
    if as_json:
        print(json.dumps(summary, indent=2, default=str), file=summary_out())
    else:
        print(f"report: {where}/report.md")
    failed, total = summary.get("failed_trials") or [], summary.get("trials", 0)
    if not failed:
        return
    what = f"{len(failed)} of {total} trials failed ({', '.join(failed)}): their errors are in {where}/results.csv"
    if len(failed) >= total:
        raise TrialsFailed(what)
    print(f"raycl: {what}", file=sys.stderr)


def quiet_ray() -> None:
    """Keep the terminal readable: Ray's own progress tables off unless RAYCL_VERBOSE=1; raycl's progress as a bar
    on a terminal, else as lines — decided here, from this process's stderr, for Ray's workers too."""
    from raycl.progress import mode

    os.environ["RAYCL_PROGRESS"] = mode()
    if os.environ.get("RAYCL_VERBOSE") != "1":
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
        os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")


def space_verb(verb: str, doc: str, argv: list[str] | None, *, sweep: bool, prog: str | None = None) -> None:
    """``python -m raycl.tune`` (``sweep``) and ``python -m raycl.train`` (as ``raycl tune``, ``raycl train``:
    ``prog``): parse, load the space, check the inputs and the resources before Ray starts (Ray is started for a
    sweep, and for a training on Ray Train workers: ``scaling.num_workers=0`` asks nothing of Ray), run the driver,
    print the summary."""
    args = space_parser(prog or f"python -m raycl.{verb}", doc, sweep=sweep).parse_args(argv)
    space, run_dir = load(args)
    on_ray = sweep or space.config.scaling.num_workers > 0
    if on_ray:
        space = check_resources(
            space, sweep=sweep, address=args.address, connected=False, cluster_config=args.cluster_config
        )
    check_inputs(space, run_dir, trust_out=args.trust_out)
    quiet_ray()
    started = False
    try:
        if on_ray:
            from raycl.distributed.runtime import cpus_of_a_run, init_ray, local_cpus

            started = init_ray(args.address, num_cpus=local_cpus(cpus_of_a_run(space.config)))
            space = check_resources(
                space, sweep=sweep, address=args.address, connected=True, cluster_config=args.cluster_config
            )
        summary = run(space, run_dir, sweep=sweep, track=args.track)
        finish(summary, as_json=args.json)  # every trial failed: a one-line error too, after Ray's output
    except UserError:
        if started:  # the Ray this command started or joined: its workers' output ends before the error's line
            from raycl.distributed.runtime import stop_ray

            stop_ray()
        raise
