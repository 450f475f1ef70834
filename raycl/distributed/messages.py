"""The records that cross process boundaries between trainers, the negative stream, miners and the weight store.

Each is a frozen dataclass that carries the model version that made it (RLlib's
``WEIGHTS_SEQ_NO``, veRL's per-sample ``param_version``), so a trainer can bound staleness per item. A mined
negative itself travels as :class:`raycl.miners.records.MinedNegatives`, from the miner to the trainer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from raycl.miners.records import MinedNegatives


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
    """The records of one task, mined by ``miner_id`` with weights of ``model_version`` (each record stamped with
    both: the trainer receives the records themselves)."""

    records: tuple[MinedNegatives, ...]  # (n,) one per task item, in order
    model_version: int
    miner_id: int
    epoch: int
    task_id: int
    seconds: float = 0.0  # the miner's time on this task

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(r.id for r in self.records)

    @classmethod
    def of(
        cls,
        task: MineTask,
        records: Sequence[MinedNegatives],
        *,
        model_version: int,
        miner_id: int,
        seconds: float = 0.0,
    ) -> MinedBatch:
        assert [r.id for r in records] == list(task.ids), "a miner must return one record per item, in order"
        return cls(
            records=tuple(r.stamped(model_version=model_version, miner_id=miner_id) for r in records),
            model_version=model_version,
            miner_id=miner_id,
            epoch=task.epoch,
            task_id=task.task_id,
            seconds=seconds,
        )


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
