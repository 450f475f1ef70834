"""What every negative source is (:class:`NegativeSource`) and what a worker opens one with (:class:`Place`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from torch import nn

from raycl.training.prefetch import Call

PAD = "#pad"  # the id suffix of an example copied to even out the ranks' shares (its negatives are the original's)
Plan = Callable[[int], list[list[int]]]  # an epoch → this rank's batches of it, as indices into its examples


class Example(Protocol):
    @property
    def id(self) -> str: ...


E = TypeVar("E", bound=Example)


class NegativeSource(Protocol[E]):
    """Where a trainer's negatives come from. ``read_ahead``: whether pools may be read ahead of the step (in a
    background thread); False where each read must see the updates before it (a staleness rule against a version
    that updates move on)."""

    read_ahead: bool

    @property
    def version(self) -> int:
        """The weight version the trainer holds (0 for negatives mined once, by the base model)."""

    def pools(self, epoch: int, start: int, model: nn.Module) -> Iterator[list[E] | Call]:
        """This rank's examples of ``epoch`` from its ``start``-th, pool by pool, in the order their negatives can
        be given; a :class:`Call` where something must run in the training thread first (publishing weights)."""

    def negatives(self, ids: Sequence[str], version: int) -> list[list[Any]]:
        """The negatives of the examples ``ids`` (of the pool just given) for a trainer at weight ``version``."""

    def after_update(self, step: int, model: nn.Module) -> None: ...
    def metrics(self) -> dict[str, float]: ...
    def state(self) -> dict[str, Any]: ...

    def resume(self, state: dict[str, Any], model: nn.Module) -> None:
        """From a checkpoint's ``state()``."""


@dataclass(frozen=True)
class Place(Generic[E]):
    """What a worker knows that the driver does not."""

    rank: int
    world_size: int
    examples: Sequence[E]  # every rank's, in the data's order
    shards: list[list[E]]  # each rank's share: a stream schedules every rank's (rank 0)
    batch_size: int
    plan: Plan | None = None  # this rank's batches of an epoch, indices into ``examples``, where known ahead

    def planned(self) -> Plan:
        if self.plan is None:
            raise ValueError("negatives known ahead need the plan of an epoch's batches (Place.plan)")
        return self.plan


class Metered(Protocol):
    def metrics(self) -> dict[str, float]: ...


class StreamEnd(Protocol):
    """A worker's end of the negative stream (``raycl.distributed.consumer.StreamConsumer``): the exactly-once
    ledger's deliveries, the staleness bound, the weight version it publishes. The live sources hold one; the
    session builds it from the driver's stream and weight store."""

    rank: int
    version: int
    max_staleness: int

    @property
    def stats(self) -> Metered:
        """This epoch's waits, staleness and refusals."""

    def start_epoch(
        self,
        epoch: int,
        items_per_rank: list[list[Any]],
        *,
        shuffle: bool = True,
        min_versions: dict[str, int] | None = None,
    ) -> None: ...
    def ledger_state(self, consumed: list[int]) -> dict[str, Any] | None: ...
    def restore(self, state: dict[str, Any]) -> None: ...
    def take(self, n: int, *, epoch: int) -> list[Any]: ...
    def publish(self, model: nn.Module, *, after: int | None = None) -> None: ...
    def store_version(self) -> int: ...
    def buffer(self) -> dict[str, float]: ...


def base_id(id_: str) -> str:
    """The id of the example a padding copy copies (its negatives are that example's)."""
    return id_.removesuffix(PAD)
