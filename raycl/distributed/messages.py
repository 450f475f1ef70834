"""The records that cross process boundaries between trainers, the negative stream, miners and the weight store.

Each is a frozen dataclass that carries the model version that made it (RLlib's
``WEIGHTS_SEQ_NO``, veRL's per-sample ``param_version``), so a trainer can bound staleness per item.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class MinedRecord(Protocol):
    """What a plain miner returns per example (``raycl.miners.beam_search.MinedNegatives`` is one)."""

    @property
    def id(self) -> str: ...
    @property
    def negatives(self) -> tuple[str, ...]: ...
    @property
    def scores(self) -> tuple[float, ...]: ...


@dataclass(frozen=True)
class MineTask:
    """A small chunk of one rank's examples to mine; it carries the payload, so miners need no dataset."""

    epoch: int
    task_id: int  # unique within the stream (or the standalone mining run)
    rank: int  # the trainer rank these examples belong to
    items: tuple[Any, ...]  # (n,) examples with an ``id`` (``GecExample`` for GEC)
    min_version: int = 0  # the miner must hold weights of at least this version (re-mining refused items)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(item.id for item in self.items)


@dataclass(frozen=True)
class MinedBatch:
    """The negatives of one task, mined by ``miner_id`` with weights of ``model_version``."""

    ids: tuple[str, ...]  # (n,)
    negatives: tuple[tuple[str, ...], ...]  # (n, ≤ k+1) best first
    scores: tuple[tuple[float, ...], ...]  # (n, ≤ k+1) the mining model's score of each negative
    model_version: int
    miner_id: int
    epoch: int
    task_id: int
    seconds: float = 0.0  # the miner's time on this task
    false_negatives: tuple[tuple[int, ...], ...] = ()  # (n,) each selection's counts before a drop, if counted

    @classmethod
    def of(
        cls,
        task: MineTask,
        records: Sequence[MinedRecord],
        *,
        model_version: int,
        miner_id: int,
        seconds: float = 0.0,
    ) -> MinedBatch:
        assert [r.id for r in records] == list(task.ids), "a miner must return one record per item, in order"
        return cls(
            ids=task.ids,
            negatives=tuple(tuple(r.negatives) for r in records),
            scores=tuple(tuple(float(s) for s in r.scores) for r in records),
            model_version=model_version,
            miner_id=miner_id,
            epoch=task.epoch,
            task_id=task.task_id,
            seconds=seconds,
            false_negatives=tuple(tuple(getattr(r, "false_negatives", ())) for r in records),
        )

    def items(self) -> list[StreamItem]:
        counts = self.false_negatives or ((),) * len(self.ids)
        return [
            StreamItem(i, n, s, self.model_version, self.miner_id, c)
            for i, n, s, c in zip(self.ids, self.negatives, self.scores, counts, strict=True)
        ]


@dataclass(frozen=True)
class StreamItem:
    """One example's negatives as a trainer receives them."""

    id: str
    negatives: tuple[str, ...]  # (≤ k+1,)
    scores: tuple[float, ...]  # (≤ k+1,)
    model_version: int  # staleness = trainer version − model_version
    miner_id: int
    false_negatives: tuple[int, ...] = ()  # the selection's false-negative counts before a drop (GEC), if counted


@dataclass(frozen=True)
class TensorSpec:
    """Where one state-dict entry lies in the flat weight buffer."""

    name: str
    dtype: str  # torch dtype name, e.g. "float32", "bfloat16"
    shape: tuple[int, ...]
    offset: int  # byte offset in the buffer (aligned, so typed views need no copy)
    nbytes: int


@dataclass(frozen=True)
class WeightsRef:
    """A published weight version: one flat uint8 buffer in the object store plus its manifest.

    ``refs`` is a one-element list so Ray passes the ObjectRef through actor calls instead of resolving it.
    """

    version: int
    refs: list[Any]  # [ObjectRef[np.ndarray (nbytes,) uint8]]
    manifest: tuple[TensorSpec, ...]
