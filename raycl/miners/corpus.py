"""Corpus mining on Ray Data: ``raycl.mine_negatives`` and ``python -m raycl.mine`` (issue 11 item 4).

The pipeline::

    scan (driver)          one pass over the files, keeping a byte offset per range of ``shard_size`` records:
                           O(#ranges) memory, never the sentences
    ray.data.from_items    the ranges not mined yet (a range whose shard exists is done)
    .map_batches(RangeMiner, concurrency=M or (min, max), num_cpus=…, num_gpus=…)
                           an actor pool: each actor builds the beam-search miner once, reads its range from the
                           file (seek to the offset; ``iter_m2`` / the TSV reader check every line), mines it in
                           ``batch_size`` chunks and writes ``part-<range>.parquet`` (temp name + rename)
    driver                 sums the small per-range summaries as they stream back

Resume: the shard of range i is ``part-{i:05d}.parquet``, written atomically by whoever mined it, so a re-run
skips every range whose shard exists — O(#shards) driver memory. Ray Data's own checkpointing (``DataContext.
checkpoint_config``) was not used: its batch backends load every checkpointed id into memory before the dataset
runs, which is the growth this design avoids; and ``write_parquet`` names files by write task and block, so a
re-run could not tell which input a file covers without reading every id back. Actors restart after a crash
(``max_restarts=-1``) and Ray Data retries the range (``max_task_retries=-1``); a range is all-or-nothing.
Ids are ``<file name>:<index in the file>``, as :func:`raycl.data.gec.load_examples` makes them.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice, zip_longest
from pathlib import Path
from typing import Any

from raycl.data.gec import GecExample, _target
from raycl.data.m2 import iter_lines, iter_m2
from raycl.data.specs import Spec, parse_spec
from raycl.errors import UserError, at
from raycl.miners.shards import _check_disjoint, schema, shard_files, shard_name


@dataclass(frozen=True)
class Range:
    """``count`` consecutive records of one data spec, from byte ``start`` (line ``first_line``) of its file."""

    index: int  # the shard number: part-{index:05d}.parquet
    path: str
    target_path: str  # "" unless a SRC|TGT pair
    fmt: str  # m2 | tsv | pair
    start: int
    first_line: int
    target_start: int
    target_first_line: int
    first_index: int  # the index in the file of the first record (ids are name:index)
    count: int


# ---------------------------------------------------------------------------------------------- the scan
def scan_ranges(specs: Sequence[str], *, range_size: int) -> Iterator[Range]:
    """The ranges of ``specs`` in order, ``range_size`` records each (the last of a spec may be shorter)."""
    parsed = [parse_spec(text) for text in specs]
    _check_disjoint(parsed, specs)
    index = 0
    for spec in parsed:
        lo, hi = _bounds(spec)
        run: list[tuple[int, int, int, int, int]] = []  # (index, offset, line, target offset, target line)
        for i, start in enumerate(_record_starts(spec)):
            if hi is not None and i >= hi:
                break
            if i < lo:
                continue
            if (i - lo) % range_size == 0:
                if run:
                    yield _range(index, spec, run[0], i - run[0][0])
                    index += 1
                run = [(i, *start)]
            last = i
        if run:
            yield _range(index, spec, run[0], last + 1 - run[0][0])
            index += 1


def _range(index: int, spec: Spec, first: tuple[int, int, int, int, int], count: int) -> Range:
    i, offset, line, t_offset, t_line = first
    return Range(index, str(spec.path), str(spec.target_path or ""), spec.format, offset, line, t_offset, t_line,
                 i, count)  # fmt: skip


def _bounds(spec: Spec) -> tuple[int, int | None]:
    lo, hi = spec.start, spec.stop
    if (lo is not None and lo < 0) or (hi is not None and hi < 0):  # needs the file's length: one more pass
        n = sum(1 for _ in _record_starts(spec))
        lo, hi = slice(lo, hi).indices(n)[:2]
    return max(lo or 0, 0), hi


def _record_starts(spec: Spec) -> Iterator[tuple[int, int, int, int]]:
    """(byte offset, line number) of each record's first line, and of its target line for a pair."""
    if spec.format == "pair":
        assert spec.target_path is not None
        for src, tgt in zip_longest(_line_starts(spec.path), _line_starts(spec.target_path)):
            if src is None or tgt is None:
                raise UserError(f"data spec '{spec}': {spec.path} and {spec.target_path} differ in line count, "
                                "expected one target line per source line")  # fmt: skip
            yield (*src, *tgt)
        return
    if spec.format == "tsv":
        yield from ((a, la, 0, 0) for a, la in _line_starts(spec.path))
        return
    offset, blank = 0, True
    with _open(spec.path) as f:
        for lineno, raw in enumerate(f, 1):
            if blank and (raw.startswith(b"S ") or raw.rstrip(b"\r\n") == b"S"):
                yield offset, lineno, 0, 0
            blank = not raw.strip()
            offset += len(raw)


def _line_starts(path: Path) -> Iterator[tuple[int, int]]:
    offset = 0
    with _open(path) as f:
        for lineno, raw in enumerate(f, 1):
            yield offset, lineno
            offset += len(raw)


def _open(path: Path) -> Any:
    try:
        return open(path, "rb")
    except OSError as err:
        raise UserError(f"{at(path)}: cannot read ({err.strerror or err})") from None


# ---------------------------------------------------------------------------------------------- reading
def read_range(r: Range, *, annotator: int = 0) -> list[GecExample]:
    """The examples of one range, read from its offset; every line is checked as the whole-file readers do."""
    name = Path(r.path).name
    if r.fmt == "m2":
        lines = iter_lines(r.path, start=r.start, first_line=r.first_line)
        sents = islice(iter_m2(r.path, lines), r.count)
        return [GecExample(f"{name}:{r.first_index + j}", s.source, _target(s, annotator))
                for j, s in enumerate(sents)]  # fmt: skip
    if r.fmt == "pair":
        src = islice(iter_lines(r.path, start=r.start, first_line=r.first_line), r.count)
        tgt = islice(iter_lines(r.target_path, start=r.target_start, first_line=r.target_first_line), r.count)
        pairs = enumerate(zip(src, tgt, strict=True))
        return [GecExample(f"{name}:{r.first_index + j}", s, t) for j, ((_, s), (_, t)) in pairs]
    out = []
    lines = islice(iter_lines(r.path, start=r.start, first_line=r.first_line), r.count)
    for j, (lineno, line) in enumerate(lines):
        fields = line.split("\t")
        if len(fields) != 2:
            raise UserError(f"{at(r.path, lineno)}: {len(fields)} tab-separated fields, "
                            "expected 'source<TAB>target'")  # fmt: skip
        out.append(GecExample(f"{name}:{r.first_index + j}", fields[0], fields[1]))
    return out


# ---------------------------------------------------------------------------------------------- mining
def _table(examples: Sequence[GecExample], mined: Sequence[Any], version: int = 0) -> Any:
    import pyarrow as pa

    return pa.table({
        "id": [e.id for e in examples], "source": [e.source for e in examples],
        "target": [e.target for e in examples],
        "negatives": [list(m.negatives) for m in mined], "scores": [list(m.scores) for m in mined],
        "model_version": [version] * len(examples),
    }, schema=schema())  # fmt: skip


def write_shard(out_dir: Path, index: int, table: Any) -> Path:
    import pyarrow.parquet as pq

    path = out_dir / shard_name(index)
    tmp = out_dir / f".{path.name}.{os.getpid()}.tmp"
    pq.write_table(table, tmp)
    tmp.replace(path)  # complete or absent: a re-run trusts every part-*.parquet
    return path


class RangeMiner:
    """Ray Data's callable class: one beam-search miner per actor; a batch of ranges in, their summaries out."""

    def __init__(self, model: str, options: dict[str, Any], out_dir: str, annotator: int = 0) -> None:
        import ray

        from raycl.distributed.miner_pool import Chaos, _first_life
        from raycl.miners.beam_search import build_beam_miner
        from raycl.miners.registry import miner_device

        opts = {k: v for k, v in options.items() if k not in ("fail_after_tasks", "stall_s", "stall_after_tasks")}
        opts.setdefault("device", miner_device(ray.get_gpu_ids() if ray.is_initialized() else []))
        self.miner = build_beam_miner(model, opts)
        self.out_dir, self.annotator = Path(out_dir), annotator
        self.chaos = Chaos.of(options, 0) if _first_life() else Chaos()
        self.done = 0

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {"index": [], "examples": [], "negatives": [], "seconds": []}
        for row in _rows(batch):
            t0 = time.perf_counter()
            r = Range(**row)
            examples = read_range(r, annotator=self.annotator)
            mined = self.miner.mine(examples) if examples else []
            self.done += 1
            self.chaos.after_task(self.done, 0)
            write_shard(self.out_dir, r.index, _table(examples, mined))
            out["index"].append(r.index)
            out["examples"].append(len(examples))
            out["negatives"].append(sum(len(m.negatives) for m in mined))
            out["seconds"].append(time.perf_counter() - t0)
        return out


def _rows(batch: dict[str, Any]) -> Iterator[dict[str, Any]]:
    keys = [f.name for f in dataclasses.fields(Range)]
    n = len(batch["index"])
    for i in range(n):
        yield {k: (v.item() if hasattr(v, "item") else v) for k in keys for v in [batch[k][i]]}


def mine_corpus(model: str, specs: Sequence[str], out_dir: Path, *, options: dict[str, Any], shard_size: int,
                num_miners: int | tuple[int, int], cpus_per_miner: float = 1.0, gpus_per_miner: float = 0.0,
                annotator: int = 0, progress: bool = True) -> dict[str, Any]:  # fmt: skip
    """Mine ``specs`` into ``out_dir``'s shards with an actor pool (``num_miners`` 0: in this process)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob(".part-*.tmp"):
        stale.unlink()
    have = {p.name for p in shard_files(out_dir)}
    t_scan = time.perf_counter()
    ranges, resumed = [], 0
    for r in scan_ranges(specs, range_size=shard_size):
        if shard_name(r.index) in have:
            resumed += r.count
        else:
            ranges.append(r)
    scan_s = time.perf_counter() - t_scan
    n_ex = n_neg = 0
    busy = 0.0  # the miners' seconds on ranges (model loading and Ray's start-up not included)
    t0 = time.perf_counter()
    bar = _bar(sum(r.count for r in ranges), progress)
    try:
        if num_miners == 0 or not ranges:
            miner = RangeMiner(model, options, str(out_dir), annotator) if ranges else None
            for r in ranges:
                assert miner is not None
                got = miner({k: [v] for k, v in dataclasses.asdict(r).items()})
                n_ex, n_neg = n_ex + got["examples"][0], n_neg + got["negatives"][0]
                busy += got["seconds"][0]
                bar.update(got["examples"][0])
        else:
            for row in _ray_data(model, ranges, out_dir, options=options, num_miners=num_miners,
                                 cpus=cpus_per_miner, gpus=gpus_per_miner, annotator=annotator):  # fmt: skip
                n_ex, n_neg = n_ex + int(row["examples"]), n_neg + int(row["negatives"])
                busy += float(row["seconds"])
                bar.update(int(row["examples"]))
                bar.set_postfix(neg_per_s=f"{n_neg / (time.perf_counter() - t0):.1f}")
    finally:
        bar.close()
    seconds = time.perf_counter() - t0
    return {"out": str(out_dir), "examples": n_ex, "negatives": n_neg, "seconds": round(seconds, 3),
            "negatives_per_s": round(n_neg / max(seconds, 1e-9), 2), "num_miners": num_miners,
            "miner_busy_s": round(busy, 3), "negatives_per_miner_s": round(n_neg / max(busy, 1e-9), 2),
            "scan_s": round(scan_s, 3), "shards": len(shard_files(out_dir)), "shards_written": len(ranges),
            "resumed": resumed}  # fmt: skip


def _ray_data(model: str, ranges: list[Range], out_dir: Path, *, options: dict[str, Any],
              num_miners: int | tuple[int, int], cpus: float, gpus: float, annotator: int
              ) -> Iterator[dict[str, Any]]:  # fmt: skip
    import ray

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # raycl's own bar counts sentences
    ctx.print_on_execution_start = False
    ds = ray.data.from_items([dataclasses.asdict(r) for r in ranges], override_num_blocks=len(ranges))
    mined = ds.map_batches(
        RangeMiner, batch_size=1, compute=_pool(num_miners), num_cpus=cpus, num_gpus=gpus or None,
        fn_constructor_kwargs={"model": model, "options": options, "out_dir": str(out_dir),
                               "annotator": annotator},
        max_restarts=-1, max_task_retries=-1,
    )  # fmt: skip
    try:
        yield from mined.iter_rows()
    except Exception as err:  # a UserError raised while reading a range reaches here wrapped by Ray
        raise _user_error(err) or err from None


def _pool(num_miners: int | tuple[int, int]) -> Any:
    """An actor pool of ``num_miners`` actors, or one that autoscales between ``(min, max)``."""
    import ray

    if isinstance(num_miners, tuple):
        return ray.data.ActorPoolStrategy(min_size=num_miners[0], max_size=num_miners[1])
    return ray.data.ActorPoolStrategy(size=num_miners)


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
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="sent", desc="mining", file=sys.stderr, disable=not progress)



# ---------------------------------------------------------------------------------------------- the library call
class ExampleMiner:
    """Ray Data's callable class for examples already in memory: a batch of id/source/target rows in, rows out."""

    def __init__(self, model: str, options: dict[str, Any]) -> None:
        import ray

        from raycl.miners.beam_search import build_beam_miner
        from raycl.miners.registry import miner_device

        opts = {"device": miner_device(ray.get_gpu_ids() if ray.is_initialized() else []), **options}
        self.miner = build_beam_miner(model, opts)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        examples = [GecExample(str(i), str(s), str(t))
                    for i, s, t in zip(batch["id"], batch["source"], batch["target"], strict=True)]  # fmt: skip
        return _table(examples, self.miner.mine(examples)).to_pydict()


def mine_negatives(
    model: str | Path, examples: str | Path | Sequence[Any], *, k: int = 3, beam: int | None = None,
    source_negative: bool = True, engine: str = "hf", precision: str = "fp32",
    num_miners: int | tuple[int, int] = 1, cpus_per_miner: float = 1.0, gpus_per_miner: float = 0.0,
    batch_size: int = 32, max_new_tokens: int = 128,
    rank_by: str = "beam", refill: bool = False, annotator: int = 0, out: str | Path | None = None,
    shard_size: int = 10_000, address: str | None = None, progress: bool = True,
) -> Any:  # fmt: skip
    """Beam-search hard negatives for GEC, as ``sentence_transformers.util.mine_hard_negatives`` is for retrieval.

    ``examples``: data specs (an M2 file, ``src.txt|tgt.txt``, a TSV, ``PATH[START:STOP]``; streamed, read by the
    miners) or in-memory ``GecExample``s / dicts with ``id``, ``source``, ``target``. Per example: the top-``k``
    distinct beam outputs ≠ target (beam ≥ k+1) plus the source for CL (``source_negative``), each with its
    summed log-prob S(t~|s). ``num_miners`` actors (``(min, max)`` to autoscale; 0 = this process) on an embedded
    local Ray or the cluster at ``address``. ``out``: a shard directory, written as ranges finish and resumed
    when it exists. Returns a ``datasets.Dataset`` with the columns ``id, source, target, negatives, scores,
    model_version`` (memory-mapped from ``out`` when given).
    """
    import datasets

    options = {"k": k, "beam": beam, "source_negative": source_negative, "batch_size": batch_size,
               "max_new_tokens": max_new_tokens, "rank_by": rank_by, "refill": refill, "precision": precision,
               "engine": engine}  # fmt: skip
    model = str(Path(model).resolve())
    if isinstance(examples, (str, Path)):
        examples = [str(examples)]
    if num_miners != 0:
        from raycl.distributed.runtime import init_ray

        most = num_miners[1] if isinstance(num_miners, tuple) else num_miners
        on_cluster = bool(address or os.environ.get("RAY_ADDRESS"))
        init_ray(address, num_cpus=None if on_cluster else local_cpus(most * cpus_per_miner))
    if all(isinstance(e, str) for e in examples):
        target = Path(out) if out is not None else Path(_tempdir())
        mine_corpus(model, [str(e) for e in examples], target, options=options, shard_size=shard_size,
                    num_miners=num_miners, cpus_per_miner=cpus_per_miner, gpus_per_miner=gpus_per_miner,
                    annotator=annotator, progress=progress)  # fmt: skip
        if out is None:
            import pyarrow.parquet as pq

            table = pq.read_table(target, schema=schema())
            _rmtree(target)
            return datasets.Dataset(table)
        return datasets.load_dataset("parquet", data_files=[str(p) for p in shard_files(target)], split="train")
    rows = [_example(e) for e in examples]
    if num_miners == 0:
        miner = ExampleMiner(model, {**options, "device": "cpu"})
        table = _table([GecExample(**r) for r in rows], miner.miner.mine([GecExample(**r) for r in rows]))
    else:
        import pyarrow as pa
        import ray

        ds = ray.data.from_items(rows).map_batches(
            ExampleMiner, batch_size=batch_size, compute=_pool(num_miners), num_cpus=cpus_per_miner,
            num_gpus=gpus_per_miner or None, fn_constructor_kwargs={"model": model, "options": options},
            max_restarts=-1, max_task_retries=-1)  # fmt: skip
        table = pa.concat_tables([ray.get(ref) for ref in ds.to_arrow_refs()]).cast(schema())
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        for i in range(0, len(table), shard_size):
            write_shard(Path(out), i // shard_size, table.slice(i, shard_size))
    return datasets.Dataset(table)


def _example(e: Any) -> dict[str, str]:
    if isinstance(e, GecExample):
        return {"id": e.id, "source": e.source, "target": e.target}
    if isinstance(e, dict) and {"id", "source", "target"} <= set(e):
        return {"id": str(e["id"]), "source": str(e["source"]), "target": str(e["target"])}
    raise UserError(f"mine_negatives: expected data specs, GecExamples or dicts with id/source/target, got {e!r}")


def local_cpus(wanted: float) -> int:
    """Logical CPUs for an embedded Ray: at least the miners' (oversubscribing a small machine, said on stderr)."""
    cores = os.cpu_count() or 1
    if wanted > cores:
        print(f"raycl: {wanted:g} miner CPUs on {cores} cores: miners share cores", file=sys.stderr)
    return max(cores, math.ceil(wanted))


def _tempdir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="raycl-mine-")


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
