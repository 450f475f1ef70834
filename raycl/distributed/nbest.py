"""Mine once per run: the base model's n-best of D_F, mined by one miner pool and read by every trial.

In the paper's setting every negative comes from the base model, version 0 (``mining.sync_every`` =
``refresh_every`` = 0), so the n-best lists of a sweep's trials are identical: the run mines them once
(:func:`shared_nbest`, beam = ``mining.beam`` ≥ the largest k + 1 of the grid) while the first trials already
train, and each trial *selects* its own k and CL/CL⁻ from them (``select_from_nbest``, the rule the per-trial
miners apply), so results do not change. The pieces:

* :class:`NBestStream` — the miners' target, a :class:`~raycl.distributed.stream.NegativeStream` with one rank
  and one epoch (the same ledger: leases, re-assignment when a miner dies, exactly-once acceptance) whose accepted
  records are written as they arrive to ``<run>/nbest/part-*.parquet`` (atomic shards) and kept for the trials,
  which ask for their examples' lists with ``wait_ready`` (:class:`raycl.training.negatives.NBestNegatives`).
* ``<run>/nbest/meta.json`` — the content key: a hash of the base model's files, D_F (ids, sources, targets),
  the decoding options and the engine that ran (resolved from ``auto``, with its libraries' versions). A resumed
  run (``--out`` an existing folder) with the same key reuses the shards and mines only what is missing; a
  changed base model, D_F, option or engine is detected and re-mined, never reused.

Online mining (weights published while training) keeps per-trial miners: there, each trial's weights differ.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from raycl import storage
from raycl.distributed.messages import MinedBatch
from raycl.distributed.stream import NegativeStream
from raycl.errors import UserError, at
from raycl.miners.parquet_input import batches
from raycl.miners.records import MinedNegatives
from raycl.miners.shards import next_shard_index, prepare_out_dir, shard_files, write_shard
from raycl.records import atomic_write, hash_folder

if TYPE_CHECKING:
    from raycl.distributed.miner_pool import MinerFactory, MinerPool

NBEST_COLUMNS = ("id", "negatives", "scores", "model_version")  # negatives: the n-best, then the source (last)


def content_key(model_dir: str | Path, examples: Sequence[Any], options: dict[str, Any]) -> str:
    """sha256 over the model folder's files (names and bytes), the examples' (id, source, target) and options."""
    h = hash_folder(hashlib.sha256(), Path(model_dir))
    for ex in examples:
        h.update(f"{ex.id}\t{ex.source}\t{ex.target}\n".encode())
    h.update(json.dumps(options, sort_keys=True).encode())
    return h.hexdigest()


def read_nbest_shards(out_dir: str | Path) -> dict[str, MinedNegatives]:
    """The records of the complete shards of ``out_dir`` (temp files of an interrupted write are not shards). A
    staged run's folder, or its URI (a reader on another node), first gets the shards the store holds that this
    node lacks (:func:`raycl.storage.refresh`), which stay here as the node's cache. Each shard is read in small
    batches, bounded before it decodes (:mod:`raycl.miners.parquet_input`): a shard planted in a run's ``nbest/``
    cannot make this process decode gigabytes."""
    out: dict[str, MinedNegatives] = {}
    for path in shard_files(storage.refresh(storage.on_node(out_dir))):
        for batch in batches(path, NBEST_COLUMNS):
            for id_, negs, scores, version in zip(
                *(batch.column(c).to_pylist() for c in NBEST_COLUMNS), strict=True
            ):
                if id_ is None or negs is None or scores is None or version is None:
                    raise UserError(
                        f"{at(path)}: a row with a null id, negatives, scores or model_version, "
                        "expected an n-best shard written by raycl"
                    )
                out[id_] = MinedNegatives(id_, tuple(negs), tuple(scores), model_version=int(version))
    return out


class NBestStream(NegativeStream):
    """One epoch of D_F for one consumer (the run), no back-pressure; accepted records go to shards and stay
    readable (``wait_ready``) for every trial. Made an async actor by :func:`shared_nbest`."""

    def __init__(
        self, *, examples: Sequence[Any], out_dir: str, task_size: int, lease_s: float, shard_size: int = 2000
    ) -> None:
        super().__init__(
            world_size=1,
            capacity=max(len(examples), task_size),
            task_size=task_size,
            lease_s=lease_s,
            ordered=False,
        )
        self.out_dir, self.shard_size, self.total = storage.on_node(out_dir), shard_size, len(examples)
        self.cache.update(read_nbest_shards(self.out_dir))
        self.resumed = len(self.cache)
        self.next_index = next_shard_index(self.out_dir)
        self.ledger.start_epoch(0, [list(examples)], cached=dict(self.cache), shuffle=False)  # file order
        self.error: str | None = None
        self._rows: list[MinedNegatives] = []

    async def put(self, batch: MinedBatch) -> int:
        accepted = self._accept(batch)
        self._rows += accepted
        if len(self._rows) >= self.shard_size or len(self.cache) >= self.total:
            self._flush()
        await self._notify()
        return len(accepted)

    def _flush(self) -> None:
        if not self._rows:
            return
        import pyarrow as pa

        rows = self._rows
        table = pa.table(
            {
                "id": [r.id for r in rows],
                "negatives": [list(r.negatives) for r in rows],
                "scores": [list(r.scores) for r in rows],
                "model_version": [r.model_version for r in rows],
            },
            schema=pa.schema(
                [
                    ("id", pa.string()),
                    ("negatives", pa.list_(pa.string())),
                    ("scores", pa.list_(pa.float64())),
                    ("model_version", pa.int64()),
                ]
            ),
        )
        write_shard(self.out_dir, self.next_index, table)  # complete or absent: a resume trusts every shard
        self.next_index += 1
        self._rows = []

    async def wait_ready(self, ids: list[str], timeout: float) -> list[MinedNegatives]:
        """The records of those of ``ids`` mined so far; waits up to ``timeout`` s while none is."""
        deadline = time.monotonic() + timeout
        while True:
            if self.error is not None:
                raise RuntimeError(f"the run's n-best miners failed: {self.error}")
            got = [self.cache[i] for i in ids if i in self.cache]
            left = deadline - time.monotonic()
            if got or self._closed or left <= 0:
                return got
            await self._wait(min(left, self._tick))

    async def fail(self, error: str) -> None:
        self.error = error
        await self._notify()

    async def progress(self) -> dict[str, Any]:
        return {
            "mined": len(self.cache),
            "total": self.total,
            "resumed": self.resumed,
            "beam_searched": self.searched,
            "mine_s": round(self.mine_s, 3),
            "complete": len(self.cache) >= self.total,
        }


@dataclass(frozen=True)
class SharedNBest:
    """A run's shared n-best while its trials train: the stream every trial reads its lists from
    (:class:`NBestStream`, a Ray actor) and the decoding options they were mined with — a trial whose own decoding
    differs mines its own."""

    stream: Any  # the NBestStream actor's handle
    decoding: dict[str, Any]


def start_nbest_stream(*, out_dir: str | Path, **kwargs: Any) -> Any:
    """The stream as an async actor: on this (the driver's) node, where the run folder is, or — a staged run's
    (``--out s3://…``), given as its URI — on any node, which reads the shards from the store and writes its own
    there."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raycl.distributed.resources import on_head

    where = storage.portable(out_dir)
    options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 1000}
    if not storage.is_uri(where):
        node = ray.get_runtime_context().get_node_id()
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
    else:  # on the head, where the cluster has a head-only resource
        options.update(on_head())
    cls: Any = ray.remote(NBestStream)
    return cls.options(**options).remote(out_dir=where, **kwargs)


@contextmanager
def shared_nbest(
    factory: MinerFactory,
    mining: Any,
    examples: Sequence[Any],
    out_dir: Path,
    *,
    options: dict[str, Any],
    model_dir: Path,
    say: Any = print,
    shard_size: int = 2000,
) -> Iterator[Any]:
    """The run's n-best of ``examples``: reused from ``out_dir`` when its key matches, else (re-)mined by a
    miner pool of ``mining.num_miners`` that stops once every list is in. Yields the stream's handle.
    The engine (``factory.options["engine"]``, ``auto`` by default) is resolved before the miners start — for
    GPU miners on a GPU — and given to every miner; ``meta.json`` and the key hold what ran and its versions."""
    # here, not above: the stream's actor process (this module's NBestStream) imports this module and never needs
    # the miners' torch
    from raycl.distributed.miner_pool import MinerPool
    from raycl.distributed.mining_actors import resolve_miners_engine

    ran = resolve_miners_engine(str(model_dir), factory.options, gpus_per_miner=float(mining.gpus_per_miner))
    asked = str(factory.options.get("engine", "auto"))
    factory = dataclasses.replace(factory, options={**factory.options, "engine": ran.engine})
    engine = {"engine": ran.engine, "engine_versions": ran.versions, "engine_requested": asked}
    key = content_key(model_dir, examples, {**options, **engine})
    meta_path = out_dir / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    if meta.get("key") not in (None, key):
        say(
            f"{out_dir}: the base model, D_F or the decoding options changed since these n-best lists were "
            "mined: mining them again"
        )
        shutil.rmtree(out_dir)
        storage.remove(out_dir)  # a staged run's: its readers fetch from the store
    prepare_out_dir(out_dir)
    _write_meta(out_dir, key=key, examples=len(examples), options=options, complete=False, **engine)
    stream = start_nbest_stream(
        examples=list(examples),
        out_dir=out_dir,
        task_size=mining.task_size,
        lease_s=mining.lease_s,
        shard_size=shard_size,
    )
    first = ray.get(stream.progress.remote())
    pool: MinerPool | None = None
    watcher: threading.Thread | None = None
    stop = threading.Event()
    if first["complete"]:
        say(f"n-best lists of D_F: reusing {out_dir} ({first['total']} sentences)")
    else:
        done = f", {first['resumed']} already there" if first["resumed"] else ""
        say(
            f"n-best lists of D_F: mining {first['total'] - first['resumed']} sentences once for the whole run "
            f"({mining.num_miners} miner(s){done}), in parallel with the first trials"
        )
        pool = MinerPool.from_config(factory, mining, resources=mining.resources or None)
        pool.start(stream)
        watcher = threading.Thread(target=_watch, args=(stream, pool, stop), daemon=True, name="nbest-watch")
        watcher.start()
    try:
        yield stream
    finally:
        stop.set()
        if watcher is not None:
            watcher.join(timeout=60)
        last = ray.get(stream.progress.remote())
        if pool is not None:
            _stop_pool(stream, pool)
        _write_meta(
            out_dir,
            key=key,
            examples=len(examples),
            options=options,
            complete=last["complete"],
            resumed=last["resumed"],
            beam_searched=last["beam_searched"],
            mine_s=last["mine_s"],
            **engine,
        )
        ray.kill(stream)


def _write_meta(out_dir: Path, **meta: Any) -> None:
    atomic_write(out_dir / "meta.json", json.dumps(meta, indent=1, sort_keys=True))


def _watch(stream: Any, pool: MinerPool, stop: threading.Event) -> None:
    """Until the n-best is complete: report a broken miner loop to the readers; then free the miners."""
    while not stop.wait(1.0):
        if ray.get(stream.progress.remote())["complete"]:
            _stop_pool(stream, pool)
            return
        errors = pool.errors()
        if errors:
            ray.get(stream.fail.remote(errors[0]))
            return


def _stop_pool(stream: Any, pool: MinerPool) -> None:
    ray.get(stream.close.remote())  # the miners' loops end; readers still get every record mined
    try:
        pool.join(timeout=30)
    except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
        pass
    pool.shutdown()


def nbest_records(stream: Any) -> dict[str, tuple[MinedNegatives, float]]:
    """Every record mined so far by id: (the n-best, S(s|s))."""
    from raycl.miners.beam_search import split_nbest

    items = ray.get(stream.cached.remote())
    return {it.id: split_nbest(it) for it in items}


def wait_nbest(stream: Any, ids: list[str], timeout: float) -> dict[str, tuple[MinedNegatives, float]]:
    """The n-best lists of those of ``ids`` mined so far, by id: (the n-best, S(s|s)); waits up to ``timeout`` s
    while none is (a trainer reading the run's n-best as it is mined)."""
    from raycl.miners.beam_search import split_nbest

    items = ray.get(stream.wait_ready.remote(ids, timeout)) if ids else []
    return {it.id: split_nbest(it) for it in items}
