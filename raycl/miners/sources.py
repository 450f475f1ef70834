"""Where a training's negatives come from, as the driver names it: one small frozen record per kind of source.

A recipe's mining section turns itself into one of these (its ``source`` method); the driver puts it in the job
that crosses into the Ray Train workers, and each worker opens it there as the one
:class:`raycl.training.negatives.NegativeSource` its loop asks for a batch's negatives (docs/architecture.md,
"A negative's path"). These records hold only what the driver knows — a file's address, the handles of the
actors a run started, a selection rule — never data or a rank: they are small and travel by pickle.

A new kind of source (dense retrieval next) is a record here, its source class beside the others, and one row in
``raycl.distributed.session.open_source`` (what a worker's session opens the record with).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PreMined:
    """Negatives known before training: a Parquet file or shard folder (or its URI) as ``raycl.mine`` writes it."""

    uri: str
    drop_false_negatives: bool = False  # less those another annotator's correction equals (the file's references)


@dataclass(frozen=True)
class LiveStream:
    """Negatives mined while training: the run's negative stream (exactly-once ledger) and weight store, both
    actor handles, and the trainer's side of the schedule."""

    stream: Any  # raycl.distributed.stream.NegativeStream actor
    store: Any  # raycl.distributed.weights.WeightStore actor
    max_staleness: int = 0  # a negative mined with weights older than version − this is refused (re-mined)
    sync_every: int = 0  # updates between weight publications (0: never)
    refresh_every: int = 0  # epochs between publications before an epoch (0: never)


@dataclass(frozen=True)
class SharedNBest:
    """The run's one n-best of the base model (version 0), read by every trial, which selects its own k and
    CL/CL⁻ from it with the beam miner's rule (``raycl.miners.beam_search.select_from_nbest``)."""

    stream: Any  # raycl.distributed.nbest.NBestStream actor
    k: int
    source_negative: bool
    refill: bool = False
    false_negatives: str = "keep"


@dataclass(frozen=True)
class Permutations:
    """Coherence: each item's own permuted documents, and — with a stream — those the miners ranked highest with
    published weights, chunk by chunk (``rank_every`` items; the first chunk of the first epoch trains on its
    own)."""

    rank_every: int
    max_staleness: int = 0
    stream: Any = None  # NegativeStream actor (None: every item trains on its own permutations)
    store: Any = None  # WeightStore actor


@dataclass(frozen=True)
class RefreshAnchor:
    """One anchor to re-mine: its id (unique across trainer ranks), its text and its positives."""

    id: str
    query: str
    positives: tuple[str, ...]


@dataclass(frozen=True)
class DenseRefresh:
    """STS: dense negatives refreshed while training (ANCE-style): the stream and weight store of the training's
    own dense miners, which re-embed the corpus with each published weight version; the trainer reads an anchor's
    negatives only within ``max_staleness`` versions (docs/dense.md, "Refreshed while training")."""

    stream: Any  # raycl.distributed.stream.NegativeStream actor
    store: Any  # raycl.distributed.weights.WeightStore actor
    refresh_every: int  # training steps between weight publications
    max_staleness: int
    wait_s: float  # after a publication, the most a trainer waits for negatives within the bound


SourceSpec = PreMined | LiveStream | SharedNBest | Permutations | DenseRefresh
