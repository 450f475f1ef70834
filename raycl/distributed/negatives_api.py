"""The library call ``raycl.mine_negatives``: beam-search hard negatives for GEC, as
``sentence_transformers.util.mine_hard_negatives`` is for retrieval — data specs mined by the corpus pipeline
(:mod:`raycl.distributed.corpus`), examples already in memory by the same kind of actor pool as rows
(resumed by id with ``out=``), the result a ``datasets`` dataset."""

from __future__ import annotations

import functools
import math
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import ray

from raycl.data.gec import GecExample
from raycl.distributed.corpus import mine_corpus, mining_settings
from raycl.distributed.mining_actors import (
    actor_pool,
    build_miner,
    quiet_ray_data,
    resolve_miners_engine,
    start_ray,
    user_error,
)
from raycl.errors import UserError, at
from raycl.miners.corpus import clear_mining, negatives_table, resume_settings
from raycl.miners.false_negatives import rate_text
from raycl.miners.parquet_input import batches, read_columns
from raycl.miners.shards import done_ids, locked_out_dir, next_shard_index, schema, shard_files, write_shard


class ExampleMiner:
    """Ray Data's callable class for examples already in memory: a batch of pos/id/source/target rows in, the
    schema's rows (and ``pos``, the input order) out."""

    def __init__(self, model: str, options: dict[str, Any]) -> None:
        from raycl.miners.beam_search import GEC_BEAM

        self.miner = build_miner(GEC_BEAM, model, options)

    def __call__(self, batch: dict[str, Any]) -> Any:
        import pyarrow as pa

        examples = [
            GecExample(str(i), str(s), str(t), tuple(map(str, r)))
            for i, s, t, r in zip(batch["id"], batch["source"], batch["target"], batch["references"], strict=True)
        ]
        # typed: an all-empty list column stays list<string>
        table = negatives_table(examples, self.miner.mine(examples))
        return table.add_column(0, "pos", pa.array([int(p) for p in batch["pos"]], pa.int64()))


def mine_negatives(
    model: str | Path,
    examples: str | Path | Sequence[Any],
    *,
    k: int = 3,
    beam: int | None = None,
    source_negative: bool = True,
    engine: str = "auto",
    precision: str = "fp32",
    num_miners: int | tuple[int, int] = 1,
    cpus_per_miner: float = 1.0,
    gpus_per_miner: float = 0.0,
    batch_size: int = 32,
    max_len_a: float = 0.0,
    max_len_b: int = 200,
    rank_by: str = "beam",
    refill: bool = False,
    false_negatives: str = "keep",
    annotator: int = 0,
    out: str | Path | None = None,
    shard_size: int | None = None,
    address: str | None = None,
    device: str | None = None,
    progress: bool = True,
    overwrite: bool = False,
    max_failed_ranges: int = 0,
    range_retries: int = 2,
) -> Any:
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
    options = {
        "k": k,
        "beam": beam,
        "source_negative": source_negative,
        "batch_size": batch_size,
        "max_len_a": max_len_a,
        "max_len_b": max_len_b,
        "rank_by": rank_by,
        "refill": refill,
        "precision": precision,
        "engine": engine,
        "false_negatives": false_negatives,
    }
    if num_miners == 0 and device is not None:
        options["device"] = device
    model = str(Path(model).resolve())
    if not (Path(model) / "config.json").is_file():
        raise UserError(f"{at(model)}: expected an HF model folder with config.json")
    if isinstance(examples, (str, Path)):
        examples = [str(examples)]
    if all(isinstance(e, (str, Path)) for e in examples):
        mine = functools.partial(
            mine_corpus,
            model,
            [str(e) for e in examples],
            options=options,
            shard_size=shard_size,
            num_miners=num_miners,
            cpus_per_miner=cpus_per_miner,
            gpus_per_miner=gpus_per_miner,
            annotator=annotator,
            address=address,
            progress=progress,
            overwrite=overwrite,
            max_failed_ranges=max_failed_ranges,
            range_retries=range_retries,
        )
        if out is not None:
            _say_counts(mine(Path(out)), progress)
            return _stream_shards(Path(out))
        if num_miners != 0:
            _require_one_node(address, num_miners, cpus_per_miner)
        with tempfile.TemporaryDirectory(prefix="raycl-mine-") as tmp:
            _say_counts(mine(Path(tmp)), progress)
            return _dataset(_read_shards(Path(tmp)))
    return _mine_in_memory(
        model,
        [_example(e) for e in examples],
        options,
        out=out,
        shard_size=shard_size,
        num_miners=num_miners,
        cpus=cpus_per_miner,
        gpus=gpus_per_miner,
        address=address,
        overwrite=overwrite,
    )


def _say_counts(summary: dict[str, Any], progress: bool) -> None:
    """The library call returns the negatives: their false-negative counts go to stderr, as its progress does."""
    if progress:
        import sys

        fn = summary["false_negatives"]
        print(
            f"raycl mine_negatives: false negatives (another annotator's correction): source "
            f"{rate_text(fn, 'source')}, beam {rate_text(fn, 'beam')}",
            file=sys.stderr,
        )


def _require_one_node(address: str | None, num_miners: int | tuple[int, int], cpus_per_miner: float) -> None:
    """Without ``out`` the shards go to a temp folder of the driver, which miners on other nodes cannot write."""
    start_ray(address, num_miners, cpus_per_miner)
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    if nodes > 1:
        raise UserError(
            f"mine_negatives: a Ray cluster of {nodes} nodes mines data specs into shards, expected "
            "out=DIR on storage every node sees (NFS), got no out"
        )


def _mine_in_memory(
    model: str,
    rows: list[dict[str, Any]],
    options: dict[str, Any],
    *,
    out: str | Path | None,
    shard_size: int | None,
    num_miners: int | tuple[int, int],
    cpus: float,
    gpus: float,
    address: str | None,
    overwrite: bool,
) -> Any:
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
    options = {**options, "engine": engine.engine}
    mined = functools.partial(
        _mined_tables, model, options=options, num_miners=num_miners, cpus=cpus, gpus=gpus, address=address
    )
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
        size = resume_settings(
            out_dir, mode="ids", shard_size=shard_size, mining=mining_settings(model, options, engine)
        )
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


def _mined_tables(
    model: str,
    todo: list[dict[str, Any]],
    *,
    options: dict[str, Any],
    num_miners: int | tuple[int, int],
    cpus: float,
    gpus: float,
    address: str | None,
) -> Iterator[Any]:
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
            ExampleMiner,
            batch_size=batch,
            compute=actor_pool(num_miners, math.ceil(len(todo) / batch)),
            num_cpus=cpus,
            num_gpus=gpus or None,
            fn_constructor_kwargs={"model": model, "options": options},
        )
        try:
            yield from ds.iter_batches(batch_size=None, batch_format="pyarrow")  # each block as it is done
        except Exception as err:
            raise user_error(err) or err from None


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
    return datasets.IterableDataset.from_generator(
        _shard_rows, gen_kwargs={"files": files}, features=datasets.Features.from_arrow_schema(schema())
    )


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
