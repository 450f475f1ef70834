"""Dense hard negatives refreshed while training, ANCE-style (docs/dense.md#refreshed-while-training): the miners.

A miner of kind ``dense_refresh`` runs in the ordinary miner pool (:mod:`raycl.distributed.miner_pool`: restartable
actors, tasks from the negative stream, weights pulled from the weight store before each task). Its plain part,
:class:`RefreshMiner`, is the dense miner of ``raycl.mine_dense_negatives`` itself — a
:class:`~raycl.distributed.dense.QueryMiner` (query embedding, exact blockwise top-k over the corpus'
embedding shards, the filters of :mod:`raycl.miners.dense`) — with the corpus embedded once per weight version:

    version v    the first task a miner mines with weights v embeds the corpus into ``<work>/v<v>/_embeddings/``,
                 one shard per ``shard_size`` rows, each written atomically; miners start at different shards and
                 skip those already there, so M miners share the embedding and a restarted one redoes only what
                 was not written
    a task       its anchors searched against version v's shards: the ``pool`` nearest distinct texts, no
                 positive of the anchor (the STS pool's mining), then the trial's margins against the anchor's
                 hardest positive and its first ``num_negatives`` that are not the anchor's own copy
                 (:func:`raycl.miners.dense.within_margins`) — what the STS recipe selects from a pool mined with
                 the same weights

Weights: the trainer's ``SentenceEncoder`` state dict; its ``encoder.*`` entries are the miner's encoder (the
cross-attention is not used for embeddings). The trainer's side is :mod:`raycl.distributed.dense_refresh_feed`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from raycl.distributed.dense import Encoding, QueryMiner
from raycl.miners.dense import dense_options, keys_of, within_margins
from raycl.miners.dense_io import CORPUS_COLUMN as CORPUS_COLUMN
from raycl.miners.dense_io import EMBEDDINGS, corpus_ranges, embedding_table, read_corpus_range, write_embeddings
from raycl.miners.records import MinedNegatives
from raycl.miners.registry import register_miner
from raycl.miners.shards import shard_name
from raycl.miners.sources import RefreshAnchor as RefreshAnchor


class RefreshMiner:
    """The plain miner (built inside a miner actor by :func:`build_refresh_miner`)."""

    def __init__(
        self,
        model_path: str,
        *,
        corpus: str,
        work_dir: str,
        pool: int,
        max_positives: int,
        num_negatives: int,
        relative_margin: float | None = None,
        absolute_margin: float | None = None,
        batch_size: int = 32,
        shard_size: int = 4096,
        device: str = "cpu",
        precision: str = "fp32",
    ) -> None:
        self.encoding = Encoding(model_path, batch_size=batch_size, device=device, precision=precision)
        # the pool's mining (raycl.distributed.dense_api.mine_pool): ``pool`` negatives, no margin
        options = dense_options(num_negatives=pool, max_positives=max_positives)
        self.work, self.corpus, self.shard_size = Path(work_dir), Path(corpus), shard_size
        self.query = QueryMiner(self.encoding, str(self.folder(0)), options, ("anchor", "positive"), "exact", None)
        self.num_negatives, self.margins = (
            num_negatives,
            {"relative_margin": relative_margin, "absolute_margin": absolute_margin},
        )
        self.version, self.embedded = 0, -1

    def folder(self, version: int) -> Path:
        return self.work / f"v{version:05d}"

    def load(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """A published SentenceEncoder state dict (DDP's ``module.`` and torch.compile's ``_orig_mod.`` names
        too): its encoder into this miner's; the corpus is embedded again at the next task."""
        sd = {k.removeprefix("module.").replace("_orig_mod.", ""): v for k, v in state_dict.items()}
        self.query.encoder.model.load_state_dict(
            {k.removeprefix("encoder."): v for k, v in sd.items() if k.startswith("encoder.")}
        )
        self.version = version

    def mine(self, items: Sequence[RefreshAnchor]) -> list[MinedNegatives]:
        self.embed()
        block = {
            "queries": [it.query for it in items],
            "positives": [list(it.positives) for it in items],
            "first": 0,
        }
        records, _ = self.query.records(block)
        out = []
        for it, r in zip(items, records, strict=True):
            hardest = min(r.positive_scores) if r.positive_scores else None
            kept = [
                i for i in within_margins(r.negative_scores, hardest, **self.margins) if r.negatives[i] != it.query
            ][: self.num_negatives]  # never the anchor's own copy
            out.append(
                MinedNegatives(
                    it.id, tuple(r.negatives[i] for i in kept), tuple(r.negative_scores[i] for i in kept)
                )
            )
        return out

    def embed(self) -> None:
        """This version's corpus shards, embedding those no miner has written yet (starting at a shard of this
        process's own, so that miners share the work)."""
        if self.embedded == self.version:
            return
        folder = self.folder(self.version) / EMBEDDINGS
        folder.mkdir(parents=True, exist_ok=True)
        ranges = corpus_ranges(self.corpus, CORPUS_COLUMN, self.shard_size)
        first = os.getpid() % max(len(ranges), 1)
        for j in range(len(ranges)):
            i = (first + j) % len(ranges)
            if (folder / shard_name(i)).is_file():
                continue
            r = ranges[i]
            texts = read_corpus_range(r["path"], r["column"], r["start"], r["stop"])
            emb = self.query.encoder.encode(texts, batch_size=self.encoding.batch_size)
            write_embeddings(folder, i, embedding_table(texts, keys_of(texts), emb))
        self.query.out_dir, self.embedded = self.folder(self.version), self.version


def build_refresh_miner(model_path: str, options: dict[str, Any]) -> RefreshMiner:
    return RefreshMiner(model_path, **options)


def load_refresh_weights(miner: RefreshMiner, state_dict: Mapping[str, torch.Tensor], *, version: int = 0) -> None:
    miner.load(state_dict, version)


DENSE_REFRESH = register_miner("dense_refresh", build=build_refresh_miner, load=load_refresh_weights)
