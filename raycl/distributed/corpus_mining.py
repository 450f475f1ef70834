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

Examples already in memory (``GecExample``s, dicts) go to the same kind of actor pool as rows; with ``out=``
they resume by id (the done ids are read back, O(#examples) like the examples the caller already holds).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import math
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray

from raycl import storage
from raycl.data.gec import GecExample
from raycl.data.specs import parse_spec
from raycl.distributed.miner_pool import ACTOR_KEYS, CHAOS_KEYS
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
    resume_settings,
    resume_shard_size,
    save_manifest,
    scan_cache,
    scan_specs,
)
from raycl.miners.false_negatives import FalseNegativeCounts, rate_text
from raycl.miners.parquet_input import batches, read_columns
from raycl.miners.shards import (
    done_ids,
    locked_out_dir,
    next_shard_index,
    schema,
    shard_counts,
    shard_files,
    shard_name,
    with_counts,
    write_shard,
)
from raycl.records import hash_folder

_SUMMARY = ("index", "examples", "negatives", "seconds", "error")  # a RangeMiner's row per range
_NOT_OUTPUT = ("batch_size", "device", "engine", *ACTOR_KEYS)  # options that do not change the negatives


def resolve_miners_engine(model: str, options: dict[str, Any], *, gpus_per_miner: float) -> dict[str, Any]:
    """The engine every miner decodes with (``hf`` | ``ctranslate2``) and its libraries' versions, resolved before
    any miner starts: on the driver for CPU miners, by one Ray task on a GPU like theirs for GPU miners with
    ``auto`` (Ray must be up). The miners are then given it explicitly, so no two of them resolve ``auto``
    differently; an impossible choice (int8 without CTranslate2) is a one-line error here."""
    from raycl.models.ct2_engine import resolve_on_driver

    engine, precision = str(options.get("engine", "auto")), str(options.get("precision", "fp32"))
    got = resolve_on_driver(engine, model, precision=precision, gpus_per_miner=gpus_per_miner,
                            device=str(options.get("device", "cpu")))  # fmt: skip
    if got is not None:
        return {"engine": got[0], "versions": engine_versions(got[0])}
    return ray.get(ray.remote(_resolve_on_gpu).options(num_cpus=0, num_gpus=gpus_per_miner).remote(
        engine, model, precision))  # fmt: skip


def _resolve_on_gpu(engine: str, model: str, precision: str) -> dict[str, Any]:
    from raycl.models.ct2_engine import resolve_engine

    got = resolve_engine(engine, model, device="cuda", precision=precision)[0]
    return {"engine": got, "versions": engine_versions(got)}


def engine_versions(engine: str) -> dict[str, str]:
    """The libraries that decode (HF's tokenizer also feeds CTranslate2)."""
    from importlib.metadata import version

    return {lib: version(lib) for lib in ("torch", "transformers", *(["ctranslate2"] * (engine == "ctranslate2")))}


def mining_settings(model: str, options: dict[str, Any], engine: dict[str, Any]) -> dict[str, Any]:
    """What makes the negatives, as a shard directory's manifest records it: the model's files by content
    (sha256, about 1 s a GB), the resolved engine and its versions, and every miner option (beam as used: k+1 by
    default) but the batch size (float noise only) and the device (engine and precision say it)."""
    opts = {k: v for k, v in options.items() if k not in _NOT_OUTPUT}
    if opts.get("beam") is None:
        opts["beam"] = int(opts.get("k", 3)) + 1
    return {"model": "sha256:" + hash_folder(hashlib.sha256(), Path(model)).hexdigest(), **engine, **opts}


def _build_miner(model: str, options: dict[str, Any]) -> Any:
    import torch

    from raycl.distributed.resources import cap_gpu_memory
    from raycl.miners.beam_search import build_beam_miner
    from raycl.miners.registry import miner_device

    opts = {k: v for k, v in options.items() if k not in CHAOS_KEYS}
    gpus = ray.get_gpu_ids() if ray.is_initialized() else []
    opts.setdefault("device", miner_device(gpus))
    if gpus and opts["device"] == "cpu":
        from raycl.distributed.miner_pool import said_gpu_fallback

        said_gpu_fallback()
    cap_gpu_memory(torch.device(opts["device"]))  # a share of a GPU (--gpus-per-miner < 1): its memory capped
    return build_beam_miner(model, opts)


class RangeMiner:
    """Ray Data's callable class: one beam-search miner per actor; a batch of ranges in, their summaries out.

    A range is tried at most ``attempts`` times, counted in OUT (``next_attempt``) so that deaths count too: Ray
    restarts a dead actor and Ray Data gives it the range again, and the attempt after the last comes back as a
    failure instead of killing the next life. A range whose mining raises is tried again at once. Either way the
    summary's ``error`` names what went wrong, no shard is written, and the other ranges go on."""

    def __init__(self, model: str, options: dict[str, Any], out_dir: str, annotator: int = 0, attempts: int = 3
                 ) -> None:  # fmt: skip
        from raycl.distributed.miner_pool import Chaos, _first_life

        self.miner = _build_miner(model, options)
        self.out_dir, self.annotator, self.attempts = storage.on_node(out_dir), annotator, attempts
        self.chaos = Chaos.of(options, 0, first_life=_first_life())
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
                self.chaos.before_range(r.index)
                examples = read_range(r, annotator=self.annotator)
                mined = self.miner.mine(examples) if examples else []
                self.done += 1
                self.chaos.after_task(self.done, 0)
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


def mine_corpus(model: str, specs: Sequence[str], out_dir: Path, *, options: dict[str, Any],
                shard_size: int | None = None, num_miners: int | tuple[int, int] = 1, cpus_per_miner: float = 1.0,
                gpus_per_miner: float = 0.0, annotator: int = 0, address: str | None = None,
                progress: bool = True, overwrite: bool = False, max_failed_ranges: int = 0, range_retries: int = 2,
                ) -> dict[str, Any]:  # fmt: skip
    """Mine ``specs`` into ``out_dir``'s shards with an actor pool (``num_miners`` 0: in this process); resumes.

    Paths are made absolute here, on the driver, before they reach remote miners. The output directory is locked
    for the run; its manifest must match this run's settings (``overwrite``: its mining is removed first). Ray
    starts (:func:`raycl.distributed.runtime.init_ray`: embedded, or the cluster at ``address``) only when there is
    a range left to mine, after the scan — a malformed file fails in seconds — unless GPU miners need their engine
    resolved on a GPU. A range is tried ``range_retries`` + 1 times; failed ranges go to ``_failures.json``, the
    others on, until more than ``max_failed_ranges`` have failed; then :class:`RangesFailed`. Returns a summary."""
    t_scan = time.perf_counter()
    model, out_dir = str(Path(model).resolve()), Path(os.path.abspath(out_dir))
    specs = [absolute_spec(t) for t in specs]
    gpus = 0.0 if num_miners == 0 else gpus_per_miner
    if gpus > 0 and options.get("engine", "auto") == "auto":
        start_ray(address, num_miners, cpus_per_miner)
    engine = resolve_miners_engine(model, options, gpus_per_miner=gpus)
    options = {**options, "engine": engine["engine"]}
    with locked_out_dir(out_dir):
        if overwrite:
            clear_mining(out_dir)
        ranges, resumed, size = _plan(out_dir, specs, shard_size=shard_size, annotator=annotator,
                                      settings=mining_settings(model, options, engine))  # fmt: skip
        scan_s, t0 = time.perf_counter() - t_scan, time.perf_counter()
        if ranges and num_miners != 0:
            start_ray(address, num_miners, cpus_per_miner)
        t1 = time.perf_counter()
        miner: dict[str, Any] = {"options": options, "annotator": annotator, "attempts": range_retries + 1}
        if num_miners == 0 or not ranges:
            rows = _in_process(model, ranges, out_dir, **miner)
        else:
            rows = _ray_data(model, ranges, out_dir, num_miners=num_miners, cpus=cpus_per_miner,
                             gpus=gpus_per_miner, **miner)  # fmt: skip
        n_ex, n_neg, busy, failed = _tally(rows, total=sum(r.count for r in ranges), progress=progress,
                                           max_failed=max_failed_ranges)  # fmt: skip
        seconds = time.perf_counter() - t1  # the pool's start (actors loading the model) included, Ray's not
        _check_done(out_dir, ranges, failed, stopped=len(failed) > max_failed_ranges)
    return {"out": str(out_dir), "examples": n_ex, "negatives": n_neg, "seconds": round(seconds, 3),
            "negatives_per_s": round(n_neg / max(seconds, 1e-9), 2), "num_miners": num_miners,
            "miner_busy_s": round(busy, 3), "negatives_per_miner_s": round(n_neg / max(busy, 1e-9), 2),
            "scan_s": round(scan_s, 3), "ray_start_s": round(t1 - t0, 3), "shard_size": size,
            "shards": len(shard_files(out_dir)), "shards_written": len(ranges), "resumed": resumed,
            "engine": engine["engine"], "false_negatives": shard_counts(out_dir).as_dict()}  # fmt: skip


def absolute_spec(text: str) -> str:
    """A data spec with absolute paths (not resolved through links: ids are ``<file name>:index``), so that miners
    on other nodes, or with another working directory, read the same files."""
    spec = parse_spec(text)
    target = spec.target_path and Path(os.path.abspath(spec.target_path))
    return str(dataclasses.replace(spec, path=Path(os.path.abspath(spec.path)), target_path=target))


def _plan(out_dir: Path, specs: Sequence[str], *, shard_size: int | None, annotator: int,
          settings: dict[str, Any]) -> tuple[list[Range], int, int]:  # fmt: skip
    """The scan (or the manifest's cached one), checked against and recorded in the manifest: the ranges whose
    shard is not in ``out_dir`` yet, how many sentences the others hold, and the shard size."""
    old = load_manifest(out_dir)
    size = resume_shard_size(out_dir, old, mode="ranges", shard_size=shard_size)
    cached = old.get("scan", []) if old is not None and int(old["shard_size"]) == size else []
    scans = scan_specs(specs, range_size=size, cached=cached)
    manifest = {"mode": "ranges", "shard_size": size, "data": [s.key for s in scans], "annotator": annotator,
                "mining": settings, "scan": scan_cache(scans)}  # fmt: skip
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
        {"range": r.index, "shard": shard_name(r.index), "file": r.path, "first_line": r.first_line,
         "sentences": r.count, "error": str(f["error"])} for f in failed for r in [by_index[int(f["index"])]]
    ]  # fmt: skip
    record_failures(out_dir, failures)
    reset_attempts(out_dir)
    if failures:
        listed = ", ".join(f"{f['shard']} ({Path(f['file']).name}:{f['first_line']}: {f['error']})"
                           for f in failures[:3]) + (", ..." if len(failures) > 3 else "")  # fmt: skip
        then = "stopped early (more than --max-failed-ranges)" if stopped else "the other ranges are mined"
        raise RangesFailed(f"{at(out_dir / FAILURES)}: {len(failures)} range(s) failed: {listed}; {then}; run "
                           "again to retry only the ranges without a shard")  # fmt: skip
    storage.refresh(out_dir)  # a staged run: the shards miners on other nodes wrote to the store, cached here
    lost = [shard_name(r.index) for r in ranges if not (out_dir / shard_name(r.index)).is_file()]
    if lost:
        raise UserError(f"{at(out_dir / lost[0])}: mined but not in the output directory ({len(lost)} shards "
                        "missing), expected OUT on a filesystem that every Ray node sees")  # fmt: skip


def _in_process(model: str, ranges: list[Range], out_dir: Path, *, options: dict[str, Any], annotator: int,
                attempts: int) -> Iterator[dict[str, Any]]:  # fmt: skip
    """The ranges mined one after the other by one miner in this process: the pool's per-range summaries."""
    miner = RangeMiner(model, options, str(out_dir), annotator, attempts) if ranges else None
    for r in ranges:
        assert miner is not None
        got = miner({k: [v] for k, v in dataclasses.asdict(r).items()})
        yield {k: v[0] for k, v in got.items()}


def _tally(rows: Iterator[dict[str, Any]], *, total: int, progress: bool, max_failed: int
           ) -> tuple[int, int, float, list[dict[str, Any]]]:  # fmt: skip
    """Sentences, negatives, the miners' busy seconds (model loading and Ray's start-up not included) and the
    failed ranges of the per-range summaries as they stream back, with a progress bar in sentences; stops the
    mining (closes the stream) once more than ``max_failed`` ranges have failed."""
    n_ex = n_neg = 0
    busy, t0 = 0.0, time.perf_counter()
    failed: list[dict[str, Any]] = []
    bar = _bar(total, progress)
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


def start_ray(address: str | None, num_miners: int | tuple[int, int], cpus_per_miner: float) -> None:
    """Join the cluster at ``address`` (or ``RAY_ADDRESS``), or start an embedded Ray with a CPU per miner."""
    from raycl.distributed.runtime import init_ray, local_cpus

    most = num_miners[1] if isinstance(num_miners, tuple) else num_miners
    on_cluster = bool(address or os.environ.get("RAY_ADDRESS"))
    init_ray(address, num_cpus=None if on_cluster else local_cpus(most * cpus_per_miner))


def _ray_data(model: str, ranges: list[Range], out_dir: Path, *, options: dict[str, Any],
              num_miners: int | tuple[int, int], cpus: float, gpus: float, annotator: int, attempts: int
              ) -> Iterator[dict[str, Any]]:  # fmt: skip
    with quiet_ray_data():
        ds = ray.data.from_items([dataclasses.asdict(r) for r in ranges], override_num_blocks=len(ranges))
        mined = ds.map_batches(
            RangeMiner, batch_size=1, compute=_pool(num_miners, len(ranges)), num_cpus=cpus,
            num_gpus=gpus or None,
            fn_constructor_kwargs={"model": model, "options": options, "out_dir": storage.portable(out_dir),
                                   "annotator": annotator, "attempts": attempts},
        )  # fmt: skip
        try:
            yield from mined.iter_rows()
        except Exception as err:  # a UserError raised while reading a range reaches here wrapped by Ray
            raise _user_error(err) or err from None


@contextmanager
def quiet_ray_data() -> Iterator[None]:
    """Ray Data without its progress bars, execution banners and per-task error logs (raycl's bar counts
    sentences; an error reaches the caller as the exception), restored afterwards."""
    ctx = ray.data.DataContext.get_current()
    saved = ctx.enable_progress_bars, ctx.print_on_execution_start
    logger = logging.getLogger("ray.data")
    level = logger.level
    ctx.enable_progress_bars = ctx.print_on_execution_start = False
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        ctx.enable_progress_bars, ctx.print_on_execution_start = saved
        logger.setLevel(level)


def _pool(num_miners: int | tuple[int, int], inputs: int) -> Any:
    """An actor pool of ``num_miners`` actors, or one that autoscales between ``(min, max)``; never more actors
    than inputs (a resumed run with one range left starts one miner)."""
    inputs = max(inputs, 1)
    if isinstance(num_miners, tuple):
        lo, hi = min(num_miners[0], inputs), min(num_miners[1], inputs)
        return ray.data.ActorPoolStrategy(min_size=lo, max_size=hi)
    return ray.data.ActorPoolStrategy(size=min(num_miners, inputs))


def _user_error(err: BaseException) -> UserError | None:
    seen: set[int] = set()
    todo: list[Any] = [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, UserError):
            return e
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
    text = str(err)
    marker = "UserError: "
    if marker in text:
        return UserError(text.split(marker, 1)[1].strip().splitlines()[0])
    return None


def _bar(total: int, progress: bool) -> Any:
    from raycl.progress import bar

    return bar(total, desc="mining", unit="sent", enabled=progress)


# ---------------------------------------------------------------------------------------------- the library call
class ExampleMiner:
    """Ray Data's callable class for examples already in memory: a batch of pos/id/source/target rows in, the
    schema's rows (and ``pos``, the input order) out."""

    def __init__(self, model: str, options: dict[str, Any]) -> None:
        self.miner = _build_miner(model, options)

    def __call__(self, batch: dict[str, Any]) -> Any:
        import pyarrow as pa

        examples = [GecExample(str(i), str(s), str(t), tuple(map(str, r)))
                    for i, s, t, r in zip(batch["id"], batch["source"], batch["target"], batch["references"],
                                          strict=True)]  # fmt: skip
        # typed: an all-empty list column stays list<string>
        table = negatives_table(examples, self.miner.mine(examples))
        return table.add_column(0, "pos", pa.array([int(p) for p in batch["pos"]], pa.int64()))


def mine_negatives(
    model: str | Path, examples: str | Path | Sequence[Any], *, k: int = 3, beam: int | None = None,
    source_negative: bool = True, engine: str = "auto", precision: str = "fp32",
    num_miners: int | tuple[int, int] = 1, cpus_per_miner: float = 1.0, gpus_per_miner: float = 0.0,
    batch_size: int = 32, max_len_a: float = 0.0, max_len_b: int = 200, rank_by: str = "beam",
    refill: bool = False, false_negatives: str = "keep",
    annotator: int = 0, out: str | Path | None = None, shard_size: int | None = None, address: str | None = None,
    device: str | None = None, progress: bool = True, overwrite: bool = False, max_failed_ranges: int = 0,
    range_retries: int = 2,
) -> Any:  # fmt: skip
    """Beam-search hard negatives for GEC, as ``sentence_transformers.util.mine_hard_negatives`` is for retrieval.

    ``model``: an HF seq2seq folder (model + tokenizer). ``examples``: data specs (an M2 file, ``src.txt|tgt.txt``,
    a TSV, ``PATH[START:STOP]``; streamed: the miners read their ranges from the files) or in-memory
    ``GecExample``s / dicts with ``id``, ``source``, ``target`` (ids unique). Per example: the top-``k`` distinct
    beam outputs ≠ target (``beam`` ≥ k+1, default k+1) plus the source for CL (``source_negative``), each with
    its summed log-prob S(t~|s) (``false_negatives``: ``keep``, or ``drop`` those another M2 annotator's correction
    equals; the shards' footers count them, :func:`raycl.miners.shards.shard_counts`), hypotheses bounded as
    fairseq's (``max_len_a · source tokens + max_len_b``;
    one cut there is never a negative). ``engine``: ``auto`` (CTranslate2 where it converts the model, else HF),
    ``hf`` or ``ctranslate2`` (``precision`` ``int8`` on CPU, ``fp16``/``bf16`` on GPUs).
    ``num_miners`` actors (``(min, max)`` to autoscale; 0 = this process, on ``device``) with
    ``cpus_per_miner`` / ``gpus_per_miner`` each, on an embedded local Ray or the cluster at ``address``.

    Returns the columns ``id, source, target, negatives, scores, model_version`` in the order of the input: a
    ``datasets.Dataset`` in memory, or, for data specs with ``out``, a ``datasets.IterableDataset`` streaming the
    shards themselves (no second copy in an Arrow cache; ``datasets.load_dataset("parquet", data_files=...)``
    makes a map-style one when wanted). ``out``: a shard directory (``part-*.parquet``,
    :mod:`raycl.miners.shards`) written as ranges finish and resumed when it exists, with the same settings only
    (``shard_size`` sentences a shard, default 10,000; a resumed directory keeps its own; ``overwrite`` mines it
    afresh). Data specs on a cluster of several nodes need ``out`` on storage every node sees. A range that
    fails ``range_retries`` + 1 times is listed in ``out/_failures.json``; more than ``max_failed_ranges`` of
    them stop the mining; any raises :class:`raycl.errors.RangesFailed` at the end.
    """
    options = {"k": k, "beam": beam, "source_negative": source_negative, "batch_size": batch_size,
               "max_len_a": max_len_a, "max_len_b": max_len_b, "rank_by": rank_by, "refill": refill,
               "precision": precision, "engine": engine, "false_negatives": false_negatives}  # fmt: skip
    if num_miners == 0 and device is not None:
        options["device"] = device
    model = str(Path(model).resolve())
    if not (Path(model) / "config.json").is_file():
        raise UserError(f"{at(model)}: expected an HF model folder with config.json")
    if isinstance(examples, (str, Path)):
        examples = [str(examples)]
    if all(isinstance(e, (str, Path)) for e in examples):
        mine = functools.partial(mine_corpus, model, [str(e) for e in examples], options=options,
                                 shard_size=shard_size, num_miners=num_miners, cpus_per_miner=cpus_per_miner,
                                 gpus_per_miner=gpus_per_miner, annotator=annotator, address=address,
                                 progress=progress, overwrite=overwrite, max_failed_ranges=max_failed_ranges,
                                 range_retries=range_retries)  # fmt: skip
        if out is not None:
            _say_counts(mine(Path(out)), progress)
            return _stream_shards(Path(out))
        if num_miners != 0:
            _require_one_node(address, num_miners, cpus_per_miner)
        with tempfile.TemporaryDirectory(prefix="raycl-mine-") as tmp:
            _say_counts(mine(Path(tmp)), progress)
            return _dataset(_read_shards(Path(tmp)))
    return _mine_in_memory(model, [_example(e) for e in examples], options, out=out, shard_size=shard_size,
                           num_miners=num_miners, cpus=cpus_per_miner, gpus=gpus_per_miner, address=address,
                           overwrite=overwrite)  # fmt: skip


def _say_counts(summary: dict[str, Any], progress: bool) -> None:
    """The library call returns the negatives: their false-negative counts go to stderr, as its progress does."""
    if progress:
        import sys

        fn = summary["false_negatives"]
        print(f"raycl mine_negatives: false negatives (another annotator's correction): source "
              f"{rate_text(fn, 'source')}, beam {rate_text(fn, 'beam')}", file=sys.stderr)  # fmt: skip


def _require_one_node(address: str | None, num_miners: int | tuple[int, int], cpus_per_miner: float) -> None:
    """Without ``out`` the shards go to a temp folder of the driver, which miners on other nodes cannot write."""
    start_ray(address, num_miners, cpus_per_miner)
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    if nodes > 1:
        raise UserError(f"mine_negatives: a Ray cluster of {nodes} nodes mines data specs into shards, expected "
                        "out=DIR on storage every node sees (NFS), got no out")  # fmt: skip


def _mine_in_memory(model: str, rows: list[dict[str, Any]], options: dict[str, Any], *, out: str | Path | None,
                    shard_size: int | None, num_miners: int | tuple[int, int], cpus: float, gpus: float,
                    address: str | None, overwrite: bool) -> Any:  # fmt: skip
    """In-memory examples on the pool (or in this process); the rows come back through Ray, so any cluster works.
    With ``out``: rows go to shards as batches come back (a killed run resumes by id, losing at most one shard's
    rows), the dataset is read back from them."""
    import pyarrow as pa

    _check_unique_ids(rows)
    order = [r["id"] for r in rows]
    gpus = 0.0 if num_miners == 0 else gpus
    if gpus > 0 and options.get("engine", "auto") == "auto":
        start_ray(address, num_miners, cpus)
    engine = resolve_miners_engine(model, options, gpus_per_miner=gpus)  # before the pool starts
    options = {**options, "engine": engine["engine"]}
    mined = functools.partial(_mined_tables, model, options=options, num_miners=num_miners, cpus=cpus, gpus=gpus,
                              address=address)  # fmt: skip
    if out is None:
        parts = list(mined([{"pos": i, **r} for i, r in enumerate(rows)]))
        if not parts:
            return _dataset(schema().empty_table())
        table = pa.concat_tables(parts).sort_by("pos")  # an actor pool hands batches back in any order
        return _dataset(table.drop_columns(["pos"]).select(schema().names).cast(schema()))
    out_dir = Path(os.path.abspath(out))
    with locked_out_dir(out_dir):
        if overwrite:
            clear_mining(out_dir)
        size = resume_settings(out_dir, mode="ids", shard_size=shard_size,
                               mining=mining_settings(model, options, engine))  # fmt: skip
        shards, done = _IdShards(out_dir, size), done_ids(out_dir)
        for table in mined([{"pos": i, **r} for i, r in enumerate(rows) if r["id"] not in done]):
            shards.add(table.drop_columns(["pos"]).select(schema().names).cast(schema()))
        shards.flush()
    return _in_order(_dataset(_read_shards(out_dir)), order)  # the caller holds the examples already


def _check_unique_ids(rows: list[dict[str, Any]]) -> None:
    seen: set[str] = set()  # resuming by id needs unique ids
    for r in rows:
        if r["id"] in seen:
            raise UserError(f"mine_negatives: id {r['id']!r} appears twice, expected unique example ids")
        seen.add(r["id"])


def _mined_tables(model: str, todo: list[dict[str, Any]], *, options: dict[str, Any],
                  num_miners: int | tuple[int, int], cpus: float, gpus: float, address: str | None
                  ) -> Iterator[Any]:  # fmt: skip
    """Arrow tables of mined rows (with ``pos``, the input position) as the miners hand them back."""
    if not todo:
        return
    if num_miners == 0:
        yield ExampleMiner(model, {"device": "cpu", **options})({k: [r[k] for r in todo] for k in todo[0]})
        return
    start_ray(address, num_miners, cpus)
    batch = int(options["batch_size"])
    with quiet_ray_data():
        ds = ray.data.from_items(todo).map_batches(
            ExampleMiner, batch_size=batch, compute=_pool(num_miners, math.ceil(len(todo) / batch)),
            num_cpus=cpus, num_gpus=gpus or None, fn_constructor_kwargs={"model": model, "options": options})
        try:
            yield from ds.iter_batches(batch_size=None, batch_format="pyarrow")  # each block as it is done
        except Exception as err:
            raise _user_error(err) or err from None


class _IdShards:
    """Rows of in-memory examples written as the next ``part-*.parquet`` every ``size`` rows (resume is by id)."""

    def __init__(self, out_dir: Path, size: int) -> None:
        self.out_dir, self.size = out_dir, size
        self.next = next_shard_index(out_dir)
        self.buffer: list[Any] = []
        self.rows = 0

    def add(self, table: Any) -> None:
        self.buffer.append(table)
        self.rows += len(table)
        if self.rows >= self.size:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa

        if not self.rows:
            return
        table = pa.concat_tables(self.buffer)
        for i in range(0, len(table), self.size):
            write_shard(self.out_dir, self.next, table.slice(i, self.size))
            self.next += 1
        self.buffer, self.rows = [], 0


def _in_order(ds: Any, order: list[str]) -> Any:
    """``ds`` (read back from shards, in shard order) in the caller's order of ids."""
    where = {id_: i for i, id_ in enumerate(ds["id"])}
    return ds.select([where[id_] for id_ in order if id_ in where])


def _read_shards(out_dir: Path) -> Any:
    """The shards of ``out_dir`` as one table, in range order; each read in batches bounded before they decode
    (:mod:`raycl.miners.parquet_input`): a shard a resumed run finds is not trusted to be the one it wrote."""
    import pyarrow as pa

    parts = [read_columns(p, schema().names, schema()) for p in shard_files(out_dir)]
    return pa.concat_tables(parts) if parts else schema().empty_table()


def _dataset(table: Any) -> Any:
    import datasets

    return datasets.Dataset(table)


def _stream_shards(out_dir: Path) -> Any:
    """The shards as a ``datasets.IterableDataset``: read where they are, never copied into an Arrow cache, each
    in batches bounded before they decode (:mod:`raycl.miners.parquet_input`), one shard per dataset shard."""
    import datasets

    files = [str(p) for p in shard_files(out_dir)]
    if not files:
        return _dataset(schema().empty_table())
    return datasets.IterableDataset.from_generator(_shard_rows, gen_kwargs={"files": files},
                                                   features=datasets.Features.from_arrow_schema(schema()))


def _shard_rows(files: list[str]) -> Iterator[dict[str, Any]]:
    for file in files:
        for batch in batches(file, schema().names):
            yield from batch.to_pylist()


def _example(e: Any) -> dict[str, Any]:
    """A row of ``id, source, target, references`` (a dict without references: the target is the only one)."""
    if isinstance(e, GecExample):
        refs = list(e.references or (e.target,))
        return {"id": e.id, "source": e.source, "target": e.target, "references": refs}
    if isinstance(e, dict) and {"id", "source", "target"} <= set(e):
        refs = [str(r) for r in e.get("references") or (e["target"],)]
        return {"id": str(e["id"]), "source": str(e["source"]), "target": str(e["target"]), "references": refs}
    raise UserError(f"mine_negatives: expected data specs, GecExamples or dicts with id/source/target, got {e!r}")
