"""Dense hard negatives at corpus scale on Ray Data: ``raycl.mine_dense_negatives`` and ``python -m raycl.mine
dense`` (the filters and formats: :mod:`raycl.miners.dense`; the files: :mod:`raycl.miners.dense_io`).

Two stages, each an actor pool (``num_miners`` actors, or ``(min, max)`` to autoscale; CPUs or fractions of GPUs
each) over items that are all-or-nothing::

    embed    a range of ``corpus_shard_size`` corpus rows (read from Parquet by the actor) or of the pairs'
             positives → OUT/_embeddings/part-<range>.parquet (text, 64-bit text key, normalised embedding) and,
             with ``index="usearch"``, part-<range>.usearch (an HNSW index of the shard)
    mine     a block of ``query_block_size`` unique queries: embedded, then every embedding shard read in turn —
             exact: one matmul per shard and the top ``2·window`` kept per query, merged with the best so far;
             usearch: the shard's index searched — the positives' scores taken from their own corpus rows, the
             filters applied, the block written as OUT/part-<block>.parquet in sentence-transformers' columns

The driver holds the pairs (the query side: what ``mine_hard_negatives`` is given) and per-item summaries; it
never reads the corpus, an embedding or a candidate list. A shard is written to a temp name and renamed by the
actor that made it, so a killed actor's item is done again (Ray restarts it and retries the item) and a killed
driver's rerun with the same OUT skips every shard present: no item is done twice, none lost. The settings
(model by content, pairs and corpus by digest, every option) are in OUT/_mining.json; a rerun with others is one
line naming them (``overwrite`` starts afresh). OUT may be an object-store URI: shards are staged and uploaded
as they land (:mod:`raycl.storage`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import ray

from raycl import storage
from raycl.distributed.miner_pool import FaultSite, MinerFaults, first_life
from raycl.distributed.mining_actors import actor_pool, quiet_ray_data, start_ray, user_error
from raycl.errors import UserError, at
from raycl.files import write_atomic
from raycl.miners.corpus import MANIFEST, check_resume, clear_mining, load_manifest, save_manifest
from raycl.miners.dense import (
    Candidates,
    DenseOptions,
    Mined,
    Stats,
    arrow_schema,
    format_rows,
    keys_of,
    mined,
    select,
)
from raycl.miners.dense_io import (
    EMBEDDINGS,
    embedding_shards,
    embedding_table,
    read_corpus_range,
    read_embeddings,
    with_stats,
    write_embeddings,
)
from raycl.miners.parquet_input import read_columns
from raycl.miners.shards import locked_out_dir, shard_files, shard_name, write_shard
from raycl.records import hash_folder


@dataclasses.dataclass(frozen=True)
class Encoding:
    """How texts are embedded, for every actor: the model folder, prompts, batch size, device, precision."""

    model: str
    query_prompt: str = ""
    corpus_prompt: str = ""
    batch_size: int = 32
    device: str | None = None
    precision: str = "fp32"
    cross_encoder: str | None = None  # rescores the candidates and positives (only where a filter reads scores)

    def where(self) -> str:
        return self.device or ("cuda" if ray.is_initialized() and ray.get_gpu_ids() else "cpu")

    def encoder(self) -> Any:
        from raycl.models.dense_encoder import DenseEncoder

        return DenseEncoder(self.model, device=self.where(), precision=self.precision)

    def scorer(self) -> Any:
        from raycl.models.cross_scorer import CrossScorer

        return None if self.cross_encoder is None else CrossScorer(self.cross_encoder, device=self.where())


class CorpusEmbedder:
    """Ray Data's callable class: a batch of corpus ranges in, each written as an embedding shard."""

    def __init__(self, encoding: Encoding, out_dir: str, index: str, faults: MinerFaults | None) -> None:
        self.encoding, self.encoder = encoding, encoding.encoder()
        self.out_dir, self.index = storage.on_node(out_dir) / EMBEDDINGS, index
        self.faults, self.site, self.done = faults, FaultSite(0, first_life(), "embed"), 0

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {"index": [], "rows": [], "seconds": []}
        for item in map(json.loads, batch["item"]):
            t0 = time.perf_counter()
            texts = (
                item["texts"]
                if "texts" in item
                else read_corpus_range(item["path"], item["column"], item["start"], item["stop"])
            )
            emb = self.encoder.encode(
                texts, batch_size=self.encoding.batch_size, prompt=self.encoding.corpus_prompt
            )
            self.done += 1
            if self.faults is not None:  # a test's (raycl.testing.faults)
                self.faults.after_task(self.done, self.site)
            if self.index == "usearch":
                _save_index(self.out_dir / f"part-{item['index']:05d}.usearch", emb)
            write_embeddings(self.out_dir, int(item["index"]), embedding_table(texts, keys_of(texts), emb))
            for k, v in (("index", item["index"]), ("rows", len(texts)), ("seconds", time.perf_counter() - t0)):
                out[k].append(v)
        return out


def _save_index(path: Path, emb: np.ndarray) -> None:
    from usearch.index import Index

    index = Index(ndim=emb.shape[1], metric="ip", dtype="f32")
    index.add(np.arange(len(emb)), emb)
    write_atomic(path, bytes(index.save() or b""))  # a buffer, through raycl.files' temp names
    storage.mirror(path)  # an object-store OUT: uploaded before the shard that says the range is done


class QueryMiner:
    """Ray Data's callable class: a batch of query blocks in, each mined against every embedding shard and
    written as ``part-<block>.parquet``; per block, its summary (rows, negatives, the filters' counts)."""

    def __init__(
        self,
        encoding: Encoding,
        out_dir: str,
        options: DenseOptions,
        columns: tuple[str, str],
        index: str,
        faults: MinerFaults | None,
    ) -> None:
        self.encoding, self.encoder, self.scorer = encoding, encoding.encoder(), encoding.scorer()
        self.out_dir, self.options, self.columns, self.index = storage.on_node(out_dir), options, columns, index
        storage.refresh(self.out_dir / EMBEDDINGS)  # an object-store OUT: the shards other nodes embedded
        self.faults, self.site, self.done = faults, FaultSite(0, first_life(), "mine"), 0

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {"index": [], "rows": [], "stats": [], "seconds": []}
        for block in map(json.loads, batch["item"]):
            t0 = time.perf_counter()
            table, stats = self.mine(block)
            self.done += 1
            if self.faults is not None:  # a test's (raycl.testing.faults)
                self.faults.after_task(self.done, self.site)
            write_shard(self.out_dir, int(block["index"]), with_stats(table, stats))
            for k, v in (
                ("index", block["index"]),
                ("rows", len(table)),
                ("stats", json.dumps(stats.as_dict())),
                ("seconds", time.perf_counter() - t0),
            ):
                out[k].append(v)
        return out

    def mine(self, block: dict[str, Any]) -> tuple[Any, Stats]:
        import pyarrow as pa

        records, stats = self.records(block)
        rows = format_rows(records, self.options, *self.columns)
        return pa.table(rows, schema=arrow_schema(self.options, *self.columns)), stats

    def records(self, block: dict[str, Any]) -> tuple[list[Mined], Stats]:
        """Each unique query of ``block`` mined against the embedding shards of ``out_dir`` (also the refreshed
        miners' search: :mod:`raycl.distributed.dense_refresh`)."""
        queries, positives = block["queries"], block["positives"]
        q = self.encoder.encode(queries, batch_size=self.encoding.batch_size, prompt=self.encoding.query_prompt)
        pos_keys = [keys_of(p) for p in positives]
        cands, pos_scores = self._search(q, pos_keys)
        if self.scorer is not None:
            pos_scores = self._rescore(queries, positives, cands)
        stats = Stats()
        chosen = select(cands, pos_keys, pos_scores, self.options, int(block["first"]), stats)
        return mined(queries, positives, pos_scores, cands, chosen), stats

    def _search(self, q: np.ndarray, pos_keys: list[np.ndarray]) -> tuple[Candidates, list[list[float]]]:
        """Every embedding shard in turn: the best ``2·window`` per query kept (repeated texts collapse at the
        end, so up to ``window`` copies of a text cost no candidate), and the positives' own scores."""
        window = self.options.window
        best = Candidates.empty(len(q))
        found: dict[tuple[int, int], float] = {}
        wanted: dict[int, list[int]] = {}  # a positive's key -> the queries (rows of the block) it belongs to
        for i, keys in enumerate(pos_keys):
            for k in keys:
                wanted.setdefault(int(k), []).append(i)
        for path in embedding_shards(self.out_dir):
            texts, keys, emb = read_embeddings(path)
            scores, cols = self._top(q, emb, path, 2 * window)
            best = best.merge(Candidates(scores, keys[cols], texts[cols]), 2 * window) if cols.size else best
            hit = np.flatnonzero(np.isin(keys, np.fromiter(wanted, np.int64, count=len(wanted))))
            for row in hit:
                for i in wanted[int(keys[row])]:
                    found[(i, int(keys[row]))] = float(np.float32(q[i] @ emb[row]))
        pos_scores = [[found.get((i, int(k)), float("nan")) for k in keys] for i, keys in enumerate(pos_keys)]
        return best.distinct(window), pos_scores

    def _rescore(self, queries: list[str], positives: list[list[str]], cands: Candidates) -> list[list[float]]:
        """The cross-encoder's scores in place of the cosines: every candidate's (in ``cands``) and every
        positive's (returned)."""
        rows, cols = np.nonzero(np.isfinite(cands.scores))
        batch = self.encoding.batch_size
        got = self.scorer.score(
            [queries[i] for i in rows], [str(t) for t in cands.texts[rows, cols]], batch_size=batch
        )
        cands.scores[rows, cols] = got
        flat = [(i, p) for i, ps in enumerate(positives) for p in ps]
        scores = self.scorer.score([queries[i] for i, _ in flat], [p for _, p in flat], batch_size=batch)
        out: list[list[float]] = [[] for _ in positives]
        for (i, _), s in zip(flat, scores, strict=True):
            out[i].append(float(s))
        return out

    def _top(self, q: np.ndarray, emb: np.ndarray, path: Path, k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, len(emb))
        if k == 0:
            return np.zeros((len(q), 0), np.float32), np.zeros((len(q), 0), np.int64)
        if self.index == "usearch":
            from usearch.index import Index

            index = Index.restore(str(path.with_suffix(".usearch")), view=True)
            if index is None:
                raise UserError(
                    f"{at(path.with_suffix('.usearch'))}: not a usearch index, expected the one the "
                    "embedding stage wrote (overwrite to mine afresh)"
                )
            found = index.search(q, k)
            cols = np.asarray(found.keys, np.int64).reshape(len(q), -1)
            scores = (1.0 - np.asarray(found.distances, np.float32)).reshape(len(q), -1)
            scores[cols < 0] = -np.inf
            return scores, np.maximum(cols, 0)
        import torch

        got = torch.topk(torch.from_numpy(q) @ torch.from_numpy(emb).T, k=k, dim=1)
        return got.values.numpy(), got.indices.numpy()


# ---------------------------------------------------------------------------------------------- the driver
@dataclasses.dataclass(frozen=True)
class Pool:
    """Where the actors run: ``num_miners`` (0: this process), their resources, the cluster."""

    num_miners: int | tuple[int, int] = 1
    cpus_per_miner: float = 1.0
    gpus_per_miner: float = 0.0
    address: str | None = None
    progress: bool = True


def run_stage(
    cls: type, items: list[dict[str, Any]], kwargs: dict[str, Any], pool: Pool, desc: str, unit_key: str
) -> Iterator[dict[str, Any]]:
    """``items`` through an actor pool of ``cls`` (or one instance in this process), the summaries streamed."""
    from raycl.progress import bar

    if not items:
        return
    with bar(sum(int(i.get("count", 1)) for i in items), desc=desc, unit=unit_key, enabled=pool.progress) as b:
        if pool.num_miners == 0:
            worker = cls(**kwargs)
            for item in items:
                got = worker({"item": [json.dumps(item)]})
                b.update(int(item.get("count", 1)))
                yield {k: v[0] for k, v in got.items()}
            return
        start_ray(pool.address, pool.num_miners, pool.cpus_per_miner)
        counts = {int(i["index"]): int(i.get("count", 1)) for i in items}
        with quiet_ray_data():
            source = ray.data.from_items([{"item": json.dumps(i)} for i in items], override_num_blocks=len(items))
            ds = source.map_batches(
                cls,
                batch_size=1,
                compute=actor_pool(pool.num_miners, len(items)),
                num_cpus=pool.cpus_per_miner,
                num_gpus=pool.gpus_per_miner or None,
                fn_constructor_kwargs=kwargs,
            )
            try:
                for row in ds.iter_rows():
                    b.update(counts[int(row["index"])])
                    yield row
            except Exception as err:
                raise user_error(err) or err from None


def settings(encoding: Encoding, options: DenseOptions, **more: Any) -> dict[str, Any]:
    """What makes the negatives, as the manifest records it (not the batch size, device or miners)."""

    def digest(folder: str | None) -> str | None:
        return None if folder is None else "sha256:" + hash_folder(hashlib.sha256(), Path(folder)).hexdigest()

    return {
        "model": digest(encoding.model),
        "cross_encoder": digest(encoding.cross_encoder),
        "query_prompt": encoding.query_prompt,
        "corpus_prompt": encoding.corpus_prompt,
        "precision": encoding.precision,
        **dataclasses.asdict(options),
        **more,
    }


def check_settings(out_dir: Path, new: dict[str, Any]) -> None:
    """One mining per OUT: with output or embedding shards to resume, the manifest's settings must be these."""
    old = load_manifest(out_dir)
    manifest = {"mode": "dense", "shard_size": new["query_block_size"], "dense": new}
    if old is not None and (shard_files(out_dir) or embedding_shards(out_dir)):
        if old.get("mode") != "dense":
            raise UserError(f"{at(out_dir)}: holds a {old.get('mode')} mining, expected a dense one (another OUT)")
        check_resume(out_dir if shard_files(out_dir) else out_dir / EMBEDDINGS, old, manifest)
    elif embedding_shards(out_dir) and old is None:
        raise UserError(
            f"{at(out_dir / EMBEDDINGS)}: embedding shards but no {MANIFEST}, expected a directory "
            "raycl wrote (overwrite to mine afresh)"
        )
    save_manifest(out_dir, manifest)


def clear_dense(out_dir: Path) -> None:
    """``overwrite``: the output shards, manifest and embeddings removed, nothing else."""
    clear_mining(out_dir)
    for path in [*(out_dir / EMBEDDINGS).glob("part-*"), out_dir / "_report.json", out_dir / "_scores.png"]:
        path.unlink(missing_ok=True)
    storage.remove(out_dir, only=lambda rel: rel.startswith(f"{EMBEDDINGS}/"))


def mine_blocks(
    out_dir: Path,
    *,
    encoding: Encoding,
    options: DenseOptions,
    columns: tuple[str, str],
    corpus: list[dict[str, Any]],
    blocks: list[dict[str, Any]],
    index: str,
    pool: Pool,
    faults: MinerFaults | None,
) -> dict[str, Any]:
    """Both stages over the items whose shard is not in ``out_dir`` yet; a summary of this run's work."""
    (out_dir / EMBEDDINGS).mkdir(parents=True, exist_ok=True)
    portable = storage.portable(out_dir)
    have = {p.name for p in embedding_shards(out_dir)}
    todo = [c for c in corpus if shard_name(int(c["index"])) not in have]
    t0 = time.perf_counter()
    embed_kw = {"encoding": encoding, "out_dir": portable, "index": index, "faults": faults}
    embedded = sum(int(r["rows"]) for r in run_stage(CorpusEmbedder, todo, embed_kw, pool, "embedding", "text"))
    t1 = time.perf_counter()
    storage.refresh(out_dir)
    have = {p.name for p in shard_files(out_dir)}
    left = [b for b in blocks if shard_name(int(b["index"])) not in have]
    mine_kw = {
        "encoding": encoding,
        "out_dir": portable,
        "options": options,
        "columns": columns,
        "index": index,
        "faults": faults,
    }
    rows = sum(int(r["rows"]) for r in run_stage(QueryMiner, left, mine_kw, pool, "mining", "query"))
    storage.refresh(out_dir)
    lost = [shard_name(int(b["index"])) for b in left if not (out_dir / shard_name(int(b["index"]))).is_file()]
    if lost:
        raise UserError(
            f"{at(out_dir / lost[0])}: mined but not in the output directory ({len(lost)} shards "
            "missing), expected OUT on a filesystem that every Ray node sees"
        )
    return {
        "embedded": embedded,
        "embed_s": round(t1 - t0, 3),
        "mine_s": round(time.perf_counter() - t1, 3),
        "blocks_written": len(left),
        "blocks_resumed": len(blocks) - len(left),
        "rows_written": rows,
        "ranges_written": len(todo),
        "ranges_resumed": len(corpus) - len(todo),
    }


@dataclasses.dataclass
class OutDir:
    """The run's OUT on this machine: a folder, a staged object-store prefix, or a temp folder (no ``out``)."""

    given: str | Path | None

    def __enter__(self) -> Path:
        self.uri = str(self.given) if self.given is not None and storage.is_uri(str(self.given)) else None
        self.tmp = tempfile.TemporaryDirectory(prefix="raycl-dense-") if self.given is None else None
        if self.uri is not None:
            return storage.stage(storage.check_uri(self.uri, key="out"))
        return Path(self.tmp.name) if self.tmp is not None else Path(os.path.abspath(self.given))  # type: ignore[arg-type]

    def __exit__(self, *exc: Any) -> None:
        if self.uri is not None:
            storage.push(storage.stage_dir(self.uri))
        if self.tmp is not None:
            self.tmp.cleanup()


def locked(out_dir: Path) -> Any:
    return locked_out_dir(out_dir)


def read_output(out_dir: Path, schema: Any) -> Any:
    """The output shards, in block order, as one ``datasets.Dataset`` (copied into memory: the temp OUT goes)."""
    import datasets
    import pyarrow as pa

    parts = [read_columns(p, schema.names, schema) for p in shard_files(out_dir)]  # each bounded as it decodes
    table = pa.concat_tables(parts) if parts else schema.empty_table()
    return datasets.Dataset(table.replace_schema_metadata(None))


def blocks_of(queries: Sequence[str], positives: Sequence[Sequence[str]], size: int) -> list[dict[str, Any]]:
    return [
        {
            "index": b,
            "first": s,
            "count": len(queries[s : s + size]),
            "queries": list(queries[s : s + size]),
            "positives": [list(p) for p in positives[s : s + size]],
        }
        for b, s in enumerate(range(0, len(queries), size))
    ]
