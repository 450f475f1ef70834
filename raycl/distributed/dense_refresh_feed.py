"""Dense hard negatives refreshed while training: the trainer's side (the miners: :mod:`.dense_refresh`).

:class:`RefreshedNegatives` is the ``{anchor: its negatives}`` mapping the STS step reads, with the version of the
weights that mined each entry. It starts from the pre-mined pool (version 0: training never waits for a first
mining) and, every ``refresh_every`` training steps, moves the weight version on (rank 0 publishes the weights,
:class:`~raycl.distributed.consumer.StreamConsumer`); at a publication where every rank has received the whole
running *round*, rank 0 starts the next one: a stream epoch holding every anchor, to be mined with weights ≥ the
new version. Between publications each update takes what is ready (never waiting); right after one, a rank waits
— at most ``wait_s`` — until every anchor has negatives within the bound or its round is complete.

The staleness bound is kept at every read: an entry mined with version v is returned only while the trainer's
version is ≤ v + ``max_staleness``; a staler one reads as absent (that anchor gets in-batch negatives only, counted
in ``refresh/skipped_stale``). Items the stream hands over already too stale are refused and re-mined with newer
weights (the stream's rule). The ledger underneath delivers each anchor of a round once to each rank, also when a
miner dies mid-round (its task goes back to the others, or to it once restarted). Every rank receives every anchor
(each rank's batches hold any sentence), so a round is mined once per trainer rank.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import ray
import torch

from raycl.collectives import all_gather_floats
from raycl.distributed.consumer import StreamConsumer
from raycl.miners.sources import RefreshAnchor

POLL_S = 0.2  # a waiting rank's take() slice


class RefreshedNegatives(Mapping[str, list[str]]):
    def __init__(
        self,
        initial: Mapping[str, Sequence[str]],
        anchors: list[list[RefreshAnchor]],
        *,
        stream: Any,
        store: Any,
        rank: int,
        world_size: int,
        refresh_every: int,
        max_staleness: int,
        wait_s: float,
    ) -> None:
        self.consumer = StreamConsumer(
            stream, store, rank=rank, world_size=world_size, max_staleness=max_staleness
        )
        self.table: dict[str, tuple[list[str], int]] = {a: (list(n), 0) for a, n in initial.items()}
        self.anchors, self.every, self.wait_s = anchors, refresh_every, wait_s
        self.query_of = {a.id: a.query for a in anchors[rank]}
        self.step, self.round = 0, 0
        self.in_round: set[str] | None = None  # ids of this rank's running round received so far; None: no round
        self.counts: Counter[str] = Counter()
        self.republish = False

    # ------------------------------------------------------------------------------------------ the step's reads
    @property
    def floor(self) -> int:
        return self.consumer.version - self.consumer.max_staleness

    def __getitem__(self, anchor: str) -> list[str]:
        negatives, version = self.table[anchor]
        if version < self.floor:
            self.counts["skipped_stale"] += 1
            raise KeyError(anchor)
        self.counts["used"] += 1
        self.counts["used_refreshed"] += version > 0
        self.counts["staleness_max"] = max(self.counts["staleness_max"], self.consumer.version - version)
        return negatives

    def __iter__(self) -> Iterator[str]:
        return iter(self.table)

    def __len__(self) -> int:
        return len(self.table)

    # ------------------------------------------------------------------------------------------ the loop's hooks
    read_ahead = False  # the step reads the table under the version its updates move on

    def after_update(self, step: int, model: torch.nn.Module) -> None:
        """After every optimizer update (``step``: the training steps so far; alternating objectives update twice
        a step): a publication every ``refresh_every`` steps, else what is ready."""
        if self.republish:  # resumed: the miners may hold weights the checkpoint never saw
            self.republish = False
            self._publish(model, after=self.consumer.store_version())
        elif step != self.step and step % self.every == 0:
            self._publish(model)
        else:
            self._take(0.0)
        self.step = step

    def _publish(self, model: torch.nn.Module, *, after: int | None = None) -> None:
        self.consumer.publish(model, after=after)
        done = self.in_round is None or len(self.in_round) == len(self.query_of)
        if all(v[0] > 0 for v in all_gather_floats([float(done)])):  # every rank's round complete
            self.round += 1
            self.in_round = set()
            self.counts["rounds"] += 1
            if self.consumer.rank == 0:
                version = self.consumer.version
                floors = {a.id: version for share in self.anchors for a in share}
                ray.get(
                    self.consumer.stream.start_epoch.remote(
                        self.round, self.anchors, shuffle=False, min_versions=floors
                    )
                )
        self._wait()

    def _wait(self) -> None:
        """Up to ``wait_s``: until every anchor has negatives within the bound, or this rank's round is done."""
        t0 = time.perf_counter()
        deadline = t0 + self.wait_s
        while not self._within_bound() and not self._round_done() and (left := deadline - time.perf_counter()) > 0:
            self._take(min(POLL_S, left))
        self.counts["wait_ms"] += round(1000 * (time.perf_counter() - t0))

    def _within_bound(self) -> bool:
        floor = self.floor
        return all(q in self.table and self.table[q][1] >= floor for q in self.query_of.values())

    def _round_done(self) -> bool:
        return self.in_round is not None and len(self.in_round) == len(self.query_of)

    def _take(self, timeout: float) -> None:
        """This rank's items of the running round that are ready (waiting up to ``timeout`` s for them)."""
        if self.in_round is None or self._round_done():
            return
        c = self.consumer
        items = ray.get(c.stream.take.remote(c.rank, len(self.query_of), timeout, epoch=self.round))
        floor = self.floor
        stale = [it.id for it in items if it.model_version < floor]
        if stale:  # mined before the bound: back to the miners, with weights ≥ the floor
            self.counts["refused"] += len(stale)
            ray.get(c.stream.refuse.remote(c.rank, stale, min_version=floor))
        for it in items:
            if it.model_version < floor:
                continue
            self.counts["duplicates"] += it.id in self.in_round
            self.in_round.add(it.id)
            self.counts["received"] += 1
            self.counts["mined_version_max"] = max(self.counts["mined_version_max"], it.model_version)
            self.table[self.query_of[it.id]] = (list(it.negatives), it.model_version)
        self.counts["rounds_done"] += self._round_done()

    # ---------------------------------------------------------------------------------- reports, checkpoints
    def metrics(self) -> dict[str, float]:
        """This rank's counts since the training started (``refresh/…``)."""
        keys = (
            "rounds",
            "rounds_done",
            "received",
            "refused",
            "duplicates",
            "used",
            "used_refreshed",
            "skipped_stale",
            "staleness_max",
            "mined_version_max",
        )
        out = {f"refresh/{k}": float(self.counts[k]) for k in keys}
        out["refresh/wait_s"] = self.counts["wait_ms"] / 1e3
        return {**out, "refresh/version": float(self.consumer.version)}

    def state(self) -> dict[str, Any]:
        return {}  # the checkpoint holds it as one of the state's extras (``state_dict``)

    def resume(self, state: dict[str, Any], model: torch.nn.Module) -> None:
        pass  # ``load_state_dict`` restored it; the next update republishes

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": self.consumer.version,
            "step": self.step,
            "round": self.round,
            "counts": dict(self.counts),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """A resumed training: the version and the cadence go on; the next update publishes again (its weights
        are the checkpoint's) and starts a new round. Until then the table is the pool's (version 0), read under
        the same bound."""
        self.consumer.version, self.step = int(state["version"]), int(state["step"])
        self.round, self.in_round, self.republish = int(state["round"]), None, True
        self.counts = Counter(state.get("counts", {}))
