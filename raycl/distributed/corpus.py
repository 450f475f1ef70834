"""Corpus mining on Ray Data: ``raycl.mine_negatives`` and ``python -m raycl.mine`` at scale.

The pipeline (the Ray-free parts are :mod:`raycl.miners.corpus`)::

    scan (driver)          ``scan_specs``: every record checked, a content digest and byte offsets per range of
                           ``shard_size`` records, O(#ranges) memory (or the manifest's cached scan of unchanged
                           files); checked against ``_mining.json`` (one mining per directory, held by a lock);
                           ranges whose shard exists are done (resume)
    ray.data.from_items    the ranges not mined yet, one block each
    .map_batches(RangeMiner, compute=ActorPoolStrategy(size=M | min_size, max_size), num_cpus=…, num_gpus=…)
                           an actor pool: each actor builds the beam-search miner once (on ``cuda`` when Ray gave
                           it a GPU), reads its range from the file (``read_range``), mines it in ``batch_size``
                           chunks and writes ``part-<range>.parquet`` (temp name + rename)
    driver                 sums the small per-range summaries as they stream back (a tqdm bar on stderr; Ray
                           Data's own bars and logs are quieted while it runs)

Why not Ray Data's own machinery: its id-column checkpointing (``DataContext.checkpoint_config``) only wraps
``ray.data.read_*`` datasources (an M2 reader would have to be a custom ``Datasource``), still reads and parses
every input row in order to filter it, and loads every checkpointed id into one array in the object store and
in each filter actor (sized 1.5× the array): the O(#sentences) growth this design avoids. ``write_parquet``
(``filename_provider``, ``min_rows_per_file``) names files by dataset, write task and block, so a re-run could
not tell which input a file covers without reading every id back. Actors restart after a crash and Ray Data
retries the range (its actor-pool defaults, ``max_restarts=-1``, ``max_task_retries=-1``); a range is
all-or-nothing, so a retry never duplicates an id, and its attempts are counted in OUT, so a range that kills
every miner it meets ends as a failure in ``_failures.json`` instead of being retried forever.

On a multi-node cluster (``--address auto``) the data files must be on a filesystem every node sees (NFS), and
OUT too unless it is an object store (``--out s3://…``): miners read the ranges by path — made absolute on the
driver — and write their shards to OUT; on a store, each miner is given OUT's URI, writes into its own node's
staging folder and uploads each shard as it lands, and the driver's final check pulls the shards it lacks. A
shard that appears in neither is an error naming it.

Examples already in memory (``GecExample``s, dicts) go to the same kind of actor pool as rows, from the library
call (:mod:`raycl.distributed.negatives_api`); what the pools share is :mod:`raycl.distributed.mining_actors`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from raycl import storage
from raycl.data.specs import parse_spec
from raycl.distributed.miner_pool import ACTOR_KEYS, FaultSite, MinerFaults, first_life
from raycl.distributed.mining_actors import (
    MinersEngine,
    actor_pool,
    build_miner,
    progress_bar,
    quiet_ray_data,
    resolve_miners_engine,
    start_ray,
    user_error,
)
from raycl.errors import RangesFailed, UserError, at
from raycl.miners.corpus import (
    FAILURES,
    Range,
    check_resume,
    clear_mining,
    load_manifest,
    negatives_table,
    next_attempt,
    read_range,
    record_failures,
    reset_attempts,
    resume_shard_size,
    save_manifest,
    scan_cache,
    scan_specs,
)
from raycl.miners.false_negatives import FalseNegativeCounts
from raycl.miners.registry import MinerKind
from raycl.miners.shards import (
    locked_out_dir,
    shard_counts,
    shard_files,
    shard_name,
    with_counts,
    write_shard,
)
from raycl.records import hash_folder

_SUMMARY = ("index", "examples", "negatives", "seconds", "error")  # a RangeMiner's row per range


_NOT_OUTPUT = ("batch_size", "device", "engine", *ACTOR_KEYS)  # options that do not change the negatives


def mining_settings(model: str, options: dict[str, Any], engine: MinersEngine) -> dict[str, Any]:
    """What makes the negatives, as a shard directory's manifest records it: the model's files by content
    (sha256, about 1 s a GB), the resolved engine and its versions, and every miner option (beam as used: k+1 by
    default) but the batch size (float noise only) and the device (engine and precision say it)."""
    opts = {k: v for k, v in options.items() if k not in _NOT_OUTPUT}
    if opts.get("beam") is None:
        opts["beam"] = int(opts.get("k", 3)) + 1
    digest = hash_folder(hashlib.sha256(), Path(model)).hexdigest()
    return {"model": "sha256:" + digest, "engine": engine.engine, "versions": engine.versions, **opts}


@dataclass(frozen=True)
class RangeJob:
    """What every :class:`RangeMiner` of a mining is given: small and picklable (Ray Data's constructor
    arguments)."""

    model: str
    options: dict[str, Any]  # the miner's keyword arguments, the engine resolved
    out_dir: str  # OUT (given to miners on other nodes as a staged run's URI)
    kind: MinerKind  # the miner (``gec_beam``)
    annotator: int = 0
    attempts: int = 3  # tries of a range, its miner's deaths counted
    faults: MinerFaults | None = None  # a test's or benchmark's (``raycl.testing``); none in a run


class RangeMiner:
    """Ray Data's callable class: one miner per actor; a batch of ranges in, their summaries out.

    A range is tried at most ``attempts`` times, counted in OUT (``next_attempt``) so that deaths count too: Ray
    restarts a dead actor and Ray Data gives it the range again, and the attempt after the last comes back as a
    failure instead of killing the next life. A range whose mining raises is tried again at once. Either way the
    summary's ``error`` names what went wrong, no shard is written, and the other ranges go on."""

    def __init__(self, job: RangeJob) -> None:
        self.miner = build_miner(job.kind, job.model, job.options)
        self.out_dir, self.annotator, self.attempts = storage.on_node(job.out_dir), job.annotator, job.attempts
        self.faults, self.site = job.faults, FaultSite(0, first_life())
        self.done = 0

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {k: [] for k in _SUMMARY}
        for row in _rows(batch):
            for key, value in self._mine(Range(**row)).items():
                out[key].append(value)
        return out

    def _mine(self, r: Range) -> dict[str, Any]:
        t0 = time.perf_counter()
        while True:
            attempt = next_attempt(self.out_dir, r.index)
            if attempt > self.attempts:
                error = f"its miner died in each of {self.attempts} attempts (out of memory? a crash?)"
                return dict(zip(_SUMMARY, (r.index, 0, 0, time.perf_counter() - t0, error), strict=True))
            self.miner.counts = FalseNegativeCounts()  # this range's: kept in its shard (with_counts)
            try:
                if self.faults is not None:
                    self.faults.before_range(r.index, self.site)
                examples = read_range(r, annotator=self.annotator)
                mined = self.miner.mine(examples) if examples else []
                self.done += 1
                if self.faults is not None:
                    self.faults.after_task(self.done, self.site)
                table = with_counts(negatives_table(examples, mined), self.miner.counts)
                write_shard(self.out_dir, r.index, table)
            except UserError:
                raise  # the data, not the range: one line for the user, as the scan's
            except Exception as err:
                if attempt < self.attempts:
                    continue
                error = f"{type(err).__name__}: {err}".splitlines()[0][:300]
                return dict(zip(_SUMMARY, (r.index, 0, 0, time.perf_counter() - t0, error), strict=True))
            done = (r.index, len(examples), sum(len(m.negatives) for m in mined), time.perf_counter() - t0, "")
            return dict(zip(_SUMMARY, done, strict=True))


def _rows(batch: dict[str, Any]) -> Iterator[dict[str, Any]]:
    keys = [f.name for f in dataclasses.fields(Range)]
    n = len(batch["index"])
    for i in range(n):
        yield {k: (v.item() if hasattr(v, "item") else v) for k in keys for v in [batch[k][i]]}


def mine_corpus(
    model: str,
    specs: Sequence[str],
    out_dir: Path,
    *,
    options: dict[str, Any],
    shard_size: int | None = None,
    num_miners: int | tuple[int, int] = 1,
    cpus_per_miner: float = 1.0,
    gpus_per_miner: float = 0.0,
    annotator: int = 0,
    address: str | None = None,
    progress: bool = True,
    overwrite: bool = False,
    max_failed_ranges: int = 0,
    range_retries: int = 2,
    kind: MinerKind | None = None,
    faults: MinerFaults | None = None,
) -> dict[str, Any]:
    """Mine ``specs`` into ``out_dir``'s shards with an actor pool (``num_miners`` 0: in this process); resumes.

    Paths are made absolute here, on the driver, before they reach remote miners. The output directory is locked
    for the run; its manifest must match this run's settings (``overwrite``: its mining is removed first). Ray
    starts (:func:`raycl.distributed.runtime.init_ray`: embedded, or the cluster at ``address``) only when there is
    a range left to mine, after the scan — a malformed file fails in seconds — unless GPU miners need their engine
    resolved on a GPU. A range is tried ``range_retries`` + 1 times; failed ranges go to ``_failures.json``, the
    others on, until more than ``max_failed_ranges`` have failed; then :class:`RangesFailed`. ``kind``: the miner
    (``gec_beam`` by default); ``faults``: what a test or benchmark breaks in the miners. Returns a summary."""
    t_scan = time.perf_counter()
    model, out_dir = str(Path(model).resolve()), Path(os.path.abspath(out_dir))
    specs = [absolute_spec(t) for t in specs]
    gpus = 0.0 if num_miners == 0 else gpus_per_miner
    if gpus > 0 and options.get("engine", "auto") == "auto":
        start_ray(address, num_miners, cpus_per_miner)
    engine = resolve_miners_engine(model, options, gpus_per_miner=gpus)
    options = {**options, "engine": engine.engine}
    with locked_out_dir(out_dir):
        if overwrite:
            clear_mining(out_dir)
        ranges, resumed, size = _plan(
            out_dir,
            specs,
            shard_size=shard_size,
            annotator=annotator,
            settings=mining_settings(model, options, engine),
        )
        scan_s, t0 = time.perf_counter() - t_scan, time.perf_counter()
        if ranges and num_miners != 0:
            start_ray(address, num_miners, cpus_per_miner)
        t1 = time.perf_counter()
        job = RangeJob(model, options, str(out_dir), kind or _gec_beam(), annotator, range_retries + 1, faults)
        if num_miners == 0 or not ranges:
            rows = _in_process(job, ranges)
        else:
            rows = _ray_data(job, ranges, num_miners=num_miners, cpus=cpus_per_miner, gpus=gpus_per_miner)
        n_ex, n_neg, busy, failed = _tally(
            rows, total=sum(r.count for r in ranges), progress=progress, max_failed=max_failed_ranges
        )
        seconds = time.perf_counter() - t1  # the pool's start (actors loading the model) included, Ray's not
        _check_done(out_dir, ranges, failed, stopped=len(failed) > max_failed_ranges)
    return {
        "out": str(out_dir),
        "examples": n_ex,
        "negatives": n_neg,
        "seconds": round(seconds, 3),
        "negatives_per_s": round(n_neg / max(seconds, 1e-9), 2),
        "num_miners": num_miners,
        "miner_busy_s": round(busy, 3),
        "negatives_per_miner_s": round(n_neg / max(busy, 1e-9), 2),
        "scan_s": round(scan_s, 3),
        "ray_start_s": round(t1 - t0, 3),
        "shard_size": size,
        "shards": len(shard_files(out_dir)),
        "shards_written": len(ranges),
        "resumed": resumed,
        "engine": engine.engine,
        "false_negatives": shard_counts(out_dir).as_dict(),
    }


def absolute_spec(text: str) -> str:
    """A data spec with absolute paths (not resolved through links: ids are ``<file name>:index``), so that miners
    on other nodes, or with another working directory, read the same files."""
    spec = parse_spec(text)
    target = spec.target_path and Path(os.path.abspath(spec.target_path))
    return str(dataclasses.replace(spec, path=Path(os.path.abspath(spec.path)), target_path=target))


def _plan(
    out_dir: Path, specs: Sequence[str], *, shard_size: int | None, annotator: int, settings: dict[str, Any]
) -> tuple[list[Range], int, int]:
    """The scan (or the manifest's cached one), checked against and recorded in the manifest: the ranges whose
    shard is not in ``out_dir`` yet, how many sentences the others hold, and the shard size."""
    old = load_manifest(out_dir)
    size = resume_shard_size(out_dir, old, mode="ranges", shard_size=shard_size)
    cached = old.get("scan", []) if old is not None and int(old["shard_size"]) == size else []
    scans = scan_specs(specs, range_size=size, cached=cached)
    manifest = {
        "mode": "ranges",
        "shard_size": size,
        "data": [s.key for s in scans],
        "annotator": annotator,
        "mining": settings,
        "scan": scan_cache(scans),
    }
    check_resume(out_dir, old, manifest)
    save_manifest(out_dir, manifest)
    reset_attempts(out_dir)  # a re-run gives every range left, the failed ones too, its attempts again
    have = {p.name for p in shard_files(out_dir)}
    every = [r for s in scans for r in s.ranges]
    left = [r for r in every if shard_name(r.index) not in have]
    return left, sum(r.count for r in every) - sum(r.count for r in left), size


def _check_done(out_dir: Path, ranges: list[Range], failed: list[dict[str, Any]], *, stopped: bool) -> None:
    """``_failures.json`` written (or removed); failed ranges, or mined ones missing from OUT, are errors."""
    by_index = {r.index: r for r in ranges}
    failures: list[dict[str, Any]] = [
        {
            "range": r.index,
            "shard": shard_name(r.index),
            "file": r.path,
            "first_line": r.first_line,
            "sentences": r.count,
            "error": str(f["error"]),
        }
        for f in failed
        for r in [by_index[int(f["index"])]]
    ]
    record_failures(out_dir, failures)
    reset_attempts(out_dir)
    if failures:
        listed = ", ".join(
            f"{f['shard']} ({Path(f['file']).name}:{f['first_line']}: {f['error']})" for f in failures[:3]
        ) + (", ..." if len(failures) > 3 else "")
        then = "stopped early (more than --max-failed-ranges)" if stopped else "the other ranges are mined"
        raise RangesFailed(
            f"{at(out_dir / FAILURES)}: {len(failures)} range(s) failed: {listed}; {then}; run "
            "again to retry only the ranges without a shard"
        )
    storage.refresh(out_dir)  # a staged run: the shards miners on other nodes wrote to the store, cached here
    lost = [shard_name(r.index) for r in ranges if not (out_dir / shard_name(r.index)).is_file()]
    if lost:
        raise UserError(
            f"{at(out_dir / lost[0])}: mined but not in the output directory ({len(lost)} shards "
            "missing), expected OUT on a filesystem that every Ray node sees"
        )


def _gec_beam() -> MinerKind:
    from raycl.miners.beam_search import GEC_BEAM

    return GEC_BEAM


def _in_process(job: RangeJob, ranges: list[Range]) -> Iterator[dict[str, Any]]:
    """The ranges mined one after the other by one miner in this process: the pool's per-range summaries."""
    miner = RangeMiner(job) if ranges else None
    for r in ranges:
        assert miner is not None
        got = miner({k: [v] for k, v in dataclasses.asdict(r).items()})
        yield {k: v[0] for k, v in got.items()}


def _tally(
    rows: Iterator[dict[str, Any]], *, total: int, progress: bool, max_failed: int
) -> tuple[int, int, float, list[dict[str, Any]]]:
    """Sentences, negatives, the miners' busy seconds (model loading and Ray's start-up not included) and the
    failed ranges of the per-range summaries as they stream back, with a progress bar in sentences; stops the
    mining (closes the stream) once more than ``max_failed`` ranges have failed."""
    n_ex = n_neg = 0
    busy, t0 = 0.0, time.perf_counter()
    failed: list[dict[str, Any]] = []
    bar = progress_bar(total, progress)
    try:
        for row in rows:
            if row["error"]:
                failed.append(row)
                if len(failed) > max_failed:
                    break
                continue
            n_ex, n_neg = n_ex + int(row["examples"]), n_neg + int(row["negatives"])
            busy += float(row["seconds"])
            bar.update(int(row["examples"]))
            bar.set_postfix(neg_per_s=f"{n_neg / max(time.perf_counter() - t0, 1e-9):.1f}")
    finally:
        bar.close()
        close = getattr(rows, "close", None)
        if close is not None:
            close()  # a stopped Ray Data stream shuts its actor pool down
    return n_ex, n_neg, busy, failed


def _ray_data(
    job: RangeJob, ranges: list[Range], *, num_miners: int | tuple[int, int], cpus: float, gpus: float
) -> Iterator[dict[str, Any]]:
    job = dataclasses.replace(job, out_dir=storage.portable(job.out_dir))  # a staged run's URI: any node maps it
    with quiet_ray_data():
        ds = ray.data.from_items([dataclasses.asdict(r) for r in ranges], override_num_blocks=len(ranges))
        mined = ds.map_batches(
            RangeMiner,
            batch_size=1,
            compute=actor_pool(num_miners, len(ranges)),
            num_cpus=cpus,
            num_gpus=gpus or None,
            fn_constructor_kwargs={"job": job},
        )
        try:
            yield from mined.iter_rows()
        except Exception as err:  # a UserError raised while reading a range reaches here wrapped by Ray
            raise user_error(err) or err from None
