"""``raycl.mine_dense_negatives``: sentence-transformers' ``mine_hard_negatives``, on a Ray actor pool, resumable.

The pipeline is :mod:`raycl.distributed.dense`; the filters, their formulas and the formats are
:mod:`raycl.miners.dense`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raycl import storage
from raycl.distributed.dense import (
    Encoding,
    OutDir,
    Pool,
    blocks_of,
    check_settings,
    clear_dense,
    mine_blocks,
    read_output,
    settings,
)
from raycl.distributed.miner_pool import MinerFaults
from raycl.errors import UserError
from raycl.files import TRUST_HINT, check_ours, flocked
from raycl.miners.dense import FILTERS, arrow_schema, check_numbers, dense_options, group_pairs
from raycl.miners.dense_io import (
    check_columns,
    corpus_parquet,
    corpus_ranges,
    file_digest,
    read_pairs,
    read_stats,
    texts_digest,
    write_report,
)
from raycl.miners.parquet_input import open_checked
from raycl.miners.shards import locked_out_dir, shard_files
from raycl.training.negatives.dense import ANCHOR, POSITIVE

INDEXES = ("exact", "usearch")


def mine_dense_negatives(
    dataset: Any,
    model: str | Path,
    anchor_column_name: str | None = None,
    positive_column_name: str | None = None,
    corpus: Sequence[str] | str | Path | None = None,
    cross_encoder: str | Path | None = None,
    range_min: int = 0,
    range_max: int | None = None,
    max_score: float | None = None,
    min_score: float | None = None,
    absolute_margin: float | None = None,
    relative_margin: float | None = None,
    num_negatives: int = 3,
    sampling_strategy: str = "top",
    query_prompt_name: str | None = None,
    query_prompt: str | None = None,
    corpus_prompt_name: str | None = None,
    corpus_prompt: str | None = None,
    include_positives: bool = False,
    output_format: str = "triplet",
    output_scores: bool = False,
    batch_size: int = 32,
    verbose: bool = True,
    *,
    num_miners: int | tuple[int, int] | str = 1,
    out: str | Path | None = None,
    device: str | None = None,
    precision: str = "fp32",
    seed: int = 0,
    index: str = "exact",
    corpus_column: str | None = None,
    corpus_shard_size: int = 10_000,
    query_block_size: int = 1_000,
    cpus_per_miner: float = 1.0,
    gpus_per_miner: float = 0.0,
    address: str | None = None,
    overwrite: bool = False,
    trust_out: bool = False,
    faults: MinerFaults | None = None,
) -> Any:
    """Hard negatives for (anchor, positive) pairs from a dense encoder: sentence-transformers'
    ``mine_hard_negatives`` with the same parameters and output columns, on an actor pool, resumable.

    ``dataset``: a ``datasets.Dataset``, a list of dicts, or a pairs file (Parquet, JSON lines, CSV);
    ``anchor_column_name`` / ``positive_column_name`` default to its first two columns (a name that is not a
    column is an error). ``model``: a sentence-transformers folder (or a name in the local hub cache), a raycl STS
    encoder folder, or a plain HF encoder folder (mean pooling). ``corpus``: more candidate texts (a list, or a
    Parquet / JSON lines / CSV / text file, column ``corpus_column`` or ``text``), always with every positive.

    Filters (their formulas: :mod:`raycl.miners.dense`): with p the query's hardest positive score,
    ``absolute_margin`` m keeps s ≤ p − m, ``relative_margin`` r keeps s ≤ p − |p|·r, ``max_score`` keeps
    s ≤ max_score, ``min_score`` keeps s ≥ min_score; a candidate equal to one of the query's own positives never
    is a negative (``include_positives`` keeps them, n-tuple format); ranks ``range_min`` … ``range_max``−1 of the
    rest, ``num_negatives`` of them, the ``top`` ones or ``random`` ones (seeded by ``seed``). ``output_format``
    ``triplet``, ``n-tuple``, ``labeled-pair`` or ``labeled-list``, with ``output_scores`` as
    sentence-transformers names them.

    raycl's own: ``num_miners`` actors (``(min, max)`` or ``"2-8"`` autoscale; 0 = this process) with
    ``cpus_per_miner`` / ``gpus_per_miner`` (fractions allowed), on an embedded Ray or the cluster at ``address``;
    ``device`` (default: ``cuda`` where Ray gives the actor a GPU) and ``precision`` (``fp32``, ``bf16``,
    ``fp16``); ``index``: ``exact`` (blockwise matmul and top-k per corpus shard) or ``usearch`` (an HNSW index
    per corpus shard, approximate; ``pip install raycl[ann]``). ``out``: a folder or object-store prefix where
    the shards, embeddings, ``_report.json`` and ``_scores.png`` stay; a rerun with the same ``out`` resumes (other
    settings: a one-line error; ``overwrite`` starts afresh). A local ``out`` must be yours alone (nobody else can
    write it or a folder above it, no link leads out of it: :func:`raycl.files.check_ours`) unless ``trust_out``;
    a URI (``out``, ``dataset``, ``corpus``, ``model``, ``cross_encoder``) must be storage raycl knows
    (:func:`raycl.storage.check_uri`: http(s) is refused before any request), an input one is fetched to this
    node's cache. Returns a ``datasets.Dataset``.
    """
    summary, ds = run_dense(**{k: v for k, v in locals().items()})
    if verbose:
        print(summary_line(summary), file=sys.stderr)
    return ds


def run_dense(**kw: Any) -> tuple[dict[str, Any], Any]:
    """:func:`mine_dense_negatives`' work: the summary and the dataset."""
    t0 = time.perf_counter()
    check_numbers(**{k: kw[k] for k in NUMBERS}, num_miners=parse_miners(kw["num_miners"]))
    _check_out(kw["out"], trust=bool(kw.get("trust_out")), hint=kw.get("trust_hint") or LIBRARY_HINT)
    kw = {**kw, **{k: _input(kw[k], k) for k in ("dataset", "corpus", "model", "cross_encoder")}}
    pairs = read_pairs(kw["dataset"]) if isinstance(kw["dataset"], (str, Path)) else _dataset(kw["dataset"])
    where = str(kw["dataset"]) if isinstance(kw["dataset"], (str, Path)) else "dataset"
    anchor, positive = check_columns(
        pairs.column_names, kw["anchor_column_name"], kw["positive_column_name"], where
    )
    if len(pairs) == 0:
        raise UserError(f"{where}: no pairs, expected at least one (anchor, positive) row")
    queries, positives, max_pos = group_pairs([str(a) for a in pairs[anchor]], [str(p) for p in pairs[positive]])
    options = dense_options(
        num_negatives=kw["num_negatives"],
        range_min=kw["range_min"],
        range_max=kw["range_max"],
        max_positives=max_pos,
        sampling_strategy=kw["sampling_strategy"],
        max_score=kw["max_score"],
        min_score=kw["min_score"],
        absolute_margin=kw["absolute_margin"],
        relative_margin=kw["relative_margin"],
        include_positives=kw["include_positives"],
        output_format=kw["output_format"],
        output_scores=kw["output_scores"],
        seed=kw["seed"],
        cross_encoder=kw["cross_encoder"] is not None,
    )
    filtered = any(kw[k] is not None for k in ("absolute_margin", "relative_margin", "max_score", "min_score"))
    encoding, pool = _encoding(kw, rescore=filtered), _pool(kw)
    if kw["index"] not in INDEXES:
        raise UserError(f"index: expected exact or usearch, got {kw['index']!r}")
    for key in ("corpus_shard_size", "query_block_size", "batch_size"):
        if int(kw[key]) < 1:
            raise UserError(f"{key}: expected an integer ≥ 1, got {kw[key]}")
    with OutDir(kw["out"]) as out_dir, locked_out_dir(out_dir):
        if kw["overwrite"]:
            clear_dense(out_dir)
        corpus, corpus_key = _corpus(kw["corpus"], kw["corpus_column"], out_dir, int(kw["corpus_shard_size"]))
        unique = list(dict.fromkeys(p for ps in positives for p in ps))
        start = len(corpus)
        size = int(kw["corpus_shard_size"])
        corpus += [
            {"index": start + j, "count": len(unique[s : s + size]), "texts": unique[s : s + size]}
            for j, s in enumerate(range(0, len(unique), size))
        ]
        check_settings(
            out_dir,
            settings(
                encoding,
                options,
                pairs=texts_digest(queries, positives),
                columns=[anchor, positive],
                corpus=corpus_key,
                index=kw["index"],
                corpus_shard_size=size,
                query_block_size=int(kw["query_block_size"]),
            ),
        )
        blocks = blocks_of(queries, positives, int(kw["query_block_size"]))
        work = mine_blocks(
            out_dir,
            encoding=encoding,
            options=options,
            columns=(anchor, positive),
            corpus=corpus,
            blocks=blocks,
            index=kw["index"],
            pool=pool,
            faults=kw["faults"],
        )
        stats = read_stats(out_dir)
        schema = arrow_schema(options, anchor, positive)
        rows = _rows(out_dir)
        summary = {
            "out": str(kw["out"]) if kw["out"] is not None else None,
            "queries": len(queries),
            "pairs": len(pairs),
            "rows": rows,
            "negatives": stats.negatives,
            "candidates": stats.candidates,
            "dropped": stats.dropped,
            "short": stats.short,
            "num_negatives": options.num_negatives,
            "range_max": options.range_max,
            "num_miners": _shown(pool.num_miners),
            "index": kw["index"],
            **work,
            "seconds": round(time.perf_counter() - t0, 3),
        }
        write_report(out_dir, stats, summary=summary)
        ds = read_output(out_dir, schema)
    return summary, ds


NUMBERS = (
    "num_negatives",
    "range_min",
    "range_max",
    "max_score",
    "min_score",
    "absolute_margin",
    "relative_margin",
    "batch_size",
    "seed",
    "corpus_shard_size",
    "query_block_size",
    "cpus_per_miner",
    "gpus_per_miner",
)
LIBRARY_HINT = TRUST_HINT.replace("--out", "out").replace("--trust-out", "trust_out=True")


def _check_out(out: str | Path | None, *, trust: bool, hint: str) -> None:
    """A local ``out`` that others could write is refused (its shards and manifest are read back on a resume);
    a URI is checked before anything is made or requested."""
    if out is None:
        return
    if storage.is_uri(str(out)):
        storage.check_uri(str(out), key="out")
    elif not trust:
        check_ours(Path(out), what="an output of raycl.mine", hint=hint)


def _input(value: Any, key: str) -> Any:
    """An input given as a URI, checked (http(s) refused before any request) and fetched to this node's cache;
    anything else as it is."""
    if isinstance(value, (str, Path)) and storage.is_uri(str(value)):
        storage.check_uri(str(value), key=key)
        return storage.fetch(str(value))
    return value


def _dataset(data: Any) -> Any:
    import datasets

    if isinstance(data, datasets.Dataset):
        return data
    if isinstance(data, (list, tuple)) and all(isinstance(r, dict) for r in data):
        return datasets.Dataset.from_list(list(data))
    if isinstance(data, dict):
        return datasets.Dataset.from_dict(data)
    raise UserError(
        f"dataset: expected a datasets.Dataset, a list of dicts or a pairs file, got {type(data).__name__}"
    )


def _encoding(kw: dict[str, Any], *, rescore: bool) -> Encoding:
    """How actors embed (and rescore: a cross-encoder is used, as sentence-transformers uses it, only where a
    margin or a score bound reads the scores)."""
    from raycl.models.cross_scorer import check_cross_encoder
    from raycl.models.dense_encoder import check_encoder_folder, resolve_model, resolve_prompt

    folder = resolve_model(kw["model"])
    check_encoder_folder(folder)
    if kw["precision"] not in ("fp32", "bf16", "fp16"):
        raise UserError(f"precision: expected fp32, bf16 or fp16, got {kw['precision']!r}")
    cross = None
    if kw["cross_encoder"] is not None:
        cross = resolve_model(kw["cross_encoder"])
        check_cross_encoder(cross)
    return Encoding(
        str(folder),
        query_prompt=resolve_prompt(folder, kw["query_prompt"], kw["query_prompt_name"]),
        corpus_prompt=resolve_prompt(folder, kw["corpus_prompt"], kw["corpus_prompt_name"]),
        batch_size=int(kw["batch_size"]),
        device=kw["device"],
        precision=kw["precision"],
        cross_encoder=str(cross) if cross is not None and rescore else None,
    )


def parse_miners(value: int | tuple[int, int] | str) -> int | tuple[int, int]:
    """``num_miners``: N (0: this process), ``(min, max)`` or ``"MIN-MAX"`` to autoscale."""
    if isinstance(value, str):
        lo, sep, hi = value.partition("-")
        try:
            value = (int(lo), int(hi)) if sep else int(value)
        except ValueError:
            raise UserError(f"num_miners: expected an integer ≥ 0 or MIN-MAX, got {value!r}") from None
    if isinstance(value, tuple):
        if len(value) != 2 or not 1 <= value[0] <= value[1]:
            raise UserError(f"num_miners: expected 1 ≤ MIN ≤ MAX, got {value!r}")
        return (int(value[0]), int(value[1]))
    if int(value) < 0:
        raise UserError(f"num_miners: expected an integer ≥ 0, got {value}")
    return int(value)


def _pool(kw: dict[str, Any]) -> Pool:
    if kw["cpus_per_miner"] < 0 or kw["gpus_per_miner"] < 0:
        raise UserError(
            f"cpus_per_miner/gpus_per_miner: expected ≥ 0, got {kw['cpus_per_miner']}, {kw['gpus_per_miner']}"
        )
    return Pool(
        parse_miners(kw["num_miners"]),
        float(kw["cpus_per_miner"]),
        float(kw["gpus_per_miner"]),
        kw["address"],
        progress=bool(kw["verbose"]),
    )


def _corpus(corpus: Any, column: str | None, out_dir: Path, size: int) -> tuple[list[dict[str, Any]], Any]:
    """The corpus' ranges (items for the embedding pool) and its key in the manifest."""
    if corpus is None:
        return [], None
    if isinstance(corpus, (str, Path)):
        path, col = corpus_parquet(corpus, out_dir, column)
        ranges = corpus_ranges(path, col, size)
        if not ranges:
            raise UserError(f"{corpus}: an empty corpus, expected at least one text")
        items = [{"index": i, "count": r["stop"] - r["start"], **r} for i, r in enumerate(ranges)]
        return items, {"file": Path(corpus).name, "column": col, "blake2b": file_digest(Path(corpus))}
    texts = [str(t) for t in corpus]
    if not texts:
        raise UserError("corpus: an empty list, expected at least one text (or None: the positives only)")
    items = [
        {"index": i, "count": len(texts[s : s + size]), "texts": texts[s : s + size]}
        for i, s in enumerate(range(0, len(texts), size))
    ]
    return items, {"texts": len(texts), "blake2b": texts_digest(texts)}


def _rows(out_dir: Path) -> int:
    return sum(open_checked(p).metadata.num_rows for p in shard_files(out_dir))  # footers, checked


def _shown(n: int | tuple[int, int]) -> Any:
    return list(n) if isinstance(n, tuple) else n


def summary_line(s: dict[str, Any]) -> str:
    dropped = ", ".join(f"{k} {s['dropped'].get(k, 0):,}" for k in FILTERS)
    return (
        f"mined {s['queries']:,} queries: {s['negatives']:,} negatives in {s['rows']:,} rows; of "
        f"{s['candidates']:,} candidates dropped: {dropped}; {s['short']:,} queries short of "
        f"{s['num_negatives']}; {s['seconds']:.1f} s"
    )


def mine_pool_once(
    rows: list[dict[str, str]], corpus: list[str], model: Path, out: Path, *, pool: int, batch_size: int
) -> Path:
    """The run's pool in ``out``: mined by the first training that needs it; one that comes while it is being
    mined waits on the lock, then finds it done (the miner resumes a finished output without redoing anything)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with flocked(out.parent / f"{out.name}.lock"):
        return mine_pool(rows, corpus, model, out, pool=pool, batch_size=batch_size)


def mine_pool(
    rows: list[dict[str, str]], corpus: list[str], model: Path, out: Path, *, pool: int, batch_size: int
) -> Path:
    """A pool: ``raycl.mine_dense_negatives`` with ``model`` of the (anchor, positive) ``rows`` against ``corpus``,
    the ``pool`` nearest candidates of each anchor with no margin, in sentence-transformers' ``labeled-list``
    format with scores (a rerun with the same settings resumes it; the miner's manifest refuses other ones)."""
    mine_dense_negatives(
        rows,
        str(model),
        ANCHOR,
        POSITIVE,
        corpus=corpus,
        num_negatives=pool,
        output_format="labeled-list",
        output_scores=True,
        batch_size=batch_size,
        verbose=False,
        num_miners=0,
        out=out,
        device="cpu",
    )
    return out
