"""An epoch's batches prepared ahead of the step: read, sized and collated in a background thread, pinned, copied.

The training thread should only launch kernels. What a batch needs before that — pulling it from the feed (mined
negatives from the stream, a token budget's sizing), tokenising and collating it into tensors — runs in one
background thread ``depth`` batches ahead (fairseq's ``BufferedIterator``, PyTorch's ``DataLoader`` with workers);
on a GPU each collated batch is put in pinned memory there, and the training thread copies it to the device with
``non_blocking=True`` (the copy overlaps the previous step's kernels). Tokenisers release the GIL while encoding.

A feed may hold :class:`Call` points — work that must run in the training thread between two
batches, such as publishing the weights at the start of a chunk that the miners will rank with them: the thread
stops there until the training thread has run it, so nothing after the point is read with the state before it.
Order is kept (one thread), so a collate that draws random numbers draws them in the batches' order.

``depth=0`` runs everything in the training thread, one batch at a time (for debugging, and the reference the
threaded path is tested against).
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

_END = object()


@dataclasses.dataclass(frozen=True)
class Call:
    """A point in an epoch's batches where ``fn`` must run in the training thread, between the batches before and
    after it (weights published to the miners at a chunk's start): the feed waits for it."""

    fn: Callable[[], None]


def move(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``obj`` with ``fn`` applied to every tensor in it: tensors, dataclasses (frozen ones too), tuples, lists and
    dicts, nested; anything else as it is."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: move(getattr(obj, f.name), fn) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)
    if isinstance(obj, tuple):
        moved = [move(x, fn) for x in obj]
        return type(obj)(*moved) if hasattr(obj, "_fields") else tuple(moved)
    if isinstance(obj, list):
        return [move(x, fn) for x in obj]
    if isinstance(obj, dict):
        return {k: move(v, fn) for k, v in obj.items()}
    return obj


def to_device(obj: Any, device: torch.device) -> Any:
    """``obj``'s tensors on ``device``; from pinned memory the copies do not block the training thread."""
    if device.type == "cpu":
        return obj
    return move(obj, lambda t: t.to(device, non_blocking=True))


def pinned(obj: Any, device: torch.device) -> Any:
    """``obj``'s tensors in page-locked memory when they are bound for a CUDA device (what makes ``non_blocking``
    copies asynchronous); as they are otherwise."""
    if device.type != "cuda":
        return obj
    return move(obj, lambda t: t.pin_memory() if t.device.type == "cpu" else t)


class Prefetcher:
    """Iterates ``items`` (batches and calls) with each batch's data collated, pinned and on ``device``; measures
    how long the training thread waited for each batch (``wait_s``, the first one's in ``first_wait_s``).

    Use as a context manager: leaving it (the epoch's end, or an error in the step) stops the thread."""

    def __init__(
        self, items: Iterable[Any], collate: Callable[[Any], Any], *, device: torch.device, depth: int = 2
    ) -> None:
        self.items, self.collate, self.device, self.depth = items, collate, device, depth
        self.wait_s = self.first_wait_s = 0.0
        self._taken = 0
        self._stop = threading.Event()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(depth, 1))
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Prefetcher:
        if self.depth > 0:
            self._thread = threading.Thread(target=self._fill, name="raycl-prefetch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            while self._thread.is_alive():  # a put blocked on a full queue ends once the queue has room
                with contextlib.suppress(queue.Empty):
                    item = self._queue.get(timeout=0.05)
                    if isinstance(item, _Pending):
                        item.done.set()  # a feed waiting for a call that will not run: let it see the stop
                self._thread.join(timeout=0.05)

    def __iter__(self) -> Iterator[Any]:
        source = self._threaded() if self._thread is not None else self._inline()
        for item in source:
            if isinstance(item, _Pending):
                item.call.fn()
                item.done.set()
            elif isinstance(item, Call):
                item.fn()
            else:
                yield item

    # ---------------------------------------------------------------------------------------------- the two paths
    def _prepare(self, batch: Any) -> Any:
        return dataclasses.replace(batch, data=pinned(self.collate(batch.data), self.device))

    def _deliver(self, batch: Any) -> Any:
        return dataclasses.replace(batch, data=to_device(batch.data, self.device))

    def _waited(self, t0: float) -> None:
        waited = time.perf_counter() - t0
        self.wait_s += waited
        if self._taken == 0:
            self.first_wait_s += waited

    def _inline(self) -> Iterator[Any]:
        it = iter(self.items)
        while True:
            t0 = time.perf_counter()
            item = next(it, _END)
            if item is _END:
                return
            if isinstance(item, Call):
                yield item
                continue
            batch = self._deliver(self._prepare(item))
            self._waited(t0)
            self._taken += 1
            yield batch

    def _threaded(self) -> Iterator[Any]:
        while True:
            t0 = time.perf_counter()
            item = self._queue.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.error
            if isinstance(item, _Pending):
                yield item
                continue
            batch = self._deliver(item)
            self._waited(t0)
            self._taken += 1
            yield batch

    def _fill(self) -> None:
        try:
            for item in self.items:
                if self._stop.is_set():
                    return
                if isinstance(item, Call):
                    pending = _Pending(item)
                    self._put(pending)
                    pending.done.wait()  # the training thread runs it between the batches before and after it
                    continue
                self._put(self._prepare(item))
            self._put(_END)
        except BaseException as error:  # the feed's or the collate's error surfaces in the training thread
            self._put(_Failure(error))

    def _put(self, item: Any) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue


@dataclasses.dataclass
class _Pending:
    call: Any
    done: threading.Event = dataclasses.field(default_factory=threading.Event)


@dataclasses.dataclass
class _Failure:
    error: BaseException
