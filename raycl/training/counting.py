"""Count what a region of PyTorch code asks of the host: aten ops, host–device syncs by kind, dtype casts.

A GPU step is bound by the host when it launches too many small kernels (each aten op costs a few µs of Python
and dispatch) or waits for the device (a sync: the host reads a device value, so the queue drains). Both can be
counted on a CPU, because they depend on the code, not the card::

    with count_ops() as c:
        with c.region("forward"):
            loss = model(batch)
        with c.region("backward"):
            loss.backward()
    c.ops, c.syncs, c.casts                  # totals; c.regions["forward"].ops, …
    c.sync_kinds                             # Counter({"item": 2, "nonzero": 1, …})
    for s in c.sync_events: print(s.kind, s.site)   # where each one was asked for

What counts:

- **ops**: every aten op that reaches the dispatcher below autograd and autocast (a ``TorchDispatchMode``), the
  backward's included; views and ``detach`` count too (each is a dispatch on the host).
- **syncs**: ops whose result the host must wait for on a GPU — ``_local_scalar_dense`` (``.item()``, ``int()``,
  ``float()``, ``bool()`` of a tensor, a tensor in an ``if``), ops whose output size depends on the data
  (``nonzero``, ``masked_select``, ``unique*``, ``repeat_interleave`` without ``output_size``, ``bincount``,
  indexing with a boolean mask), ``equal``, and copies between the host and the device: device → CPU
  (``d2h``) and CPU → device unless ``non_blocking`` from pinned memory (``h2d``: it waits for the device's queue).
  On a CPU the dispatcher does not see ``.tolist()``, ``.numpy()``, ``.cpu()`` or ``.to("cpu")`` of a CPU tensor
  (they read memory directly or return the tensor itself), so with ``cpu_as_device=True`` (the default on a
  machine without CUDA) a ``TorchFunctionMode`` counts them too: on a GPU run those tensors would be on the
  device. On a CPU run every tensor is a CPU tensor, so host-side work inside the region counts as well (collating
  a CPU batch; ``.item()`` of a CPU counter such as an optimizer's step) — count regions that hold device work.
- **casts**: ``_to_copy`` between two floating dtypes (what autocast adds; ``.long()`` of an index is not one).

Each sync records its Python call site (the innermost frame outside torch), so a count can be read as a list of
lines to fix. Only the thread that entered the counter is watched on the host side (dispatch modes are
thread-local; autograd's backward threads inherit it), so a prefetching thread's work is not counted.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# ops the host waits on: a value read into Python, or an output whose size depends on the input's values
_SIZE_SYNCS = {
    aten.nonzero.default: "nonzero",
    aten.masked_select.default: "masked_select",
    aten.bincount.default: "bincount",
    aten._unique.default: "unique",
    aten._unique2.default: "unique",
    aten.unique_dim.default: "unique",
    aten.unique_consecutive.default: "unique",
    aten.equal.default: "equal",
    aten.is_nonzero.default: "item",
    aten._local_scalar_dense.default: "item",
}
_REPEAT_INTERLEAVE = {aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor}
_BOOL_INDEX = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
_COPIES = {aten._to_copy.default, aten.copy_.default}
# Tensor methods that read a CPU tensor on the host without any aten op (seen only by the function mode)
_HOST_READS = {"tolist": "tolist", "numpy": "numpy", "__array__": "numpy", "cpu": "cpu", "to": "cpu"}
# frames of torch itself and of this module are never the call site: matched by torch's own folder (a checkout
# inside a folder named ``torch`` must not be skipped)
_SKIP_FRAMES = (os.path.dirname(torch.__file__) + os.sep, __file__)


@dataclass(frozen=True)
class Sync:
    """One host–device sync: its kind, the aten op or Tensor method, and the Python line that asked for it."""

    kind: str  # item | nonzero | masked_select | unique | equal | bincount | repeat_interleave | index_bool
    #            | d2h | h2d | tolist | numpy | cpu
    op: str
    site: str  # "path:line in function", the innermost frame outside torch


@dataclass(eq=False)  # regions are told apart by identity: two regions may hold equal counts
class Counts:
    """What one region asked for."""

    ops: int = 0
    casts: int = 0
    by_op: Counter[str] = field(default_factory=Counter)
    cast_kinds: Counter[str] = field(default_factory=Counter)  # "torch.float32->torch.bfloat16": n
    sync_events: list[Sync] = field(default_factory=list)

    @property
    def syncs(self) -> int:
        return len(self.sync_events)

    @property
    def sync_kinds(self) -> Counter[str]:
        return Counter(s.kind for s in self.sync_events)

    @property
    def sync_sites(self) -> Counter[str]:
        """How many syncs each call site asked for."""
        return Counter(f"{s.kind} {s.site}" for s in self.sync_events)

    def summary(self, *, sites: bool = True) -> dict[str, Any]:
        """A JSON-able view: totals, syncs by kind and (``sites``) by call site."""
        out: dict[str, Any] = {
            "ops": self.ops,
            "syncs": self.syncs,
            "casts": self.casts,
            "sync_kinds": dict(self.sync_kinds),
        }
        if sites:
            out["sync_sites"] = dict(self.sync_sites)
        return out


class OpCounter:
    """The counting context (see the module docstring); :func:`count_ops` makes one."""

    def __init__(self, *, cpu_as_device: bool | None = None) -> None:
        self.cpu_as_device = not torch.cuda.is_available() if cpu_as_device is None else cpu_as_device
        self.total = Counts()
        self.regions: dict[str, Counts] = {}
        self._open: list[Counts] = [self.total]
        self._modes: list[Any] = []

    # the totals, for ``c.ops`` etc.
    ops = property(lambda self: self.total.ops)
    syncs = property(lambda self: self.total.syncs)
    casts = property(lambda self: self.total.casts)
    sync_kinds = property(lambda self: self.total.sync_kinds)
    sync_events = property(lambda self: self.total.sync_events)
    sync_sites = property(lambda self: self.total.sync_sites)
    by_op = property(lambda self: self.total.by_op)

    def __enter__(self) -> OpCounter:
        self._modes = [_DispatchCounter(self)]
        if self.cpu_as_device:
            self._modes.insert(0, _HostReadCounter(self))
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        self._modes = []

    @contextmanager
    def region(self, name: str) -> Iterator[Counts]:
        """Count what runs inside into ``self.regions[name]`` too (a region entered again adds to its counts)."""
        counts = self.regions.setdefault(name, Counts())
        self._open.append(counts)
        try:
            yield counts
        finally:
            del self._open[max(i for i, c in enumerate(self._open) if c is counts)]

    def summary(self, *, sites: bool = True) -> dict[str, Any]:
        return {
            **self.total.summary(sites=sites),
            "regions": {k: v.summary(sites=False) for k, v in self.regions.items()},
        }

    # ------------------------------------------------------------------------------------------ recording
    def _op(self, name: str) -> None:
        for c in self._open:
            c.ops += 1
            c.by_op[name] += 1

    def _cast(self, src: torch.dtype, dst: torch.dtype) -> None:
        for c in self._open:
            c.casts += 1
            c.cast_kinds[f"{src}->{dst}"] += 1

    def _sync(self, kind: str, op: str) -> None:
        event = Sync(kind, op, _call_site())
        for c in self._open:
            c.sync_events.append(event)


def count_ops(*, cpu_as_device: bool | None = None) -> OpCounter:
    """``with count_ops() as c:`` — ops, syncs and casts of the block (module docstring). ``cpu_as_device``: count
    the host reads of CPU tensors as syncs (default: when CUDA is not available, i.e. on a CPU run)."""
    return OpCounter(cpu_as_device=cpu_as_device)


# ---------------------------------------------------------------------------------------------- the two modes
class _DispatchCounter(TorchDispatchMode):
    def __init__(self, counter: OpCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        c = self.counter
        c._op(str(func.overloadpacket.__name__))
        kind = _sync_kind(func, args, kwargs, out)
        if kind is not None:
            c._sync(kind, str(func))
        if func in _COPIES:
            src = args[1] if func is aten.copy_.default else args[0]  # copy_(self, src, non_blocking)
            if (
                isinstance(src, torch.Tensor)
                and isinstance(out, torch.Tensor)
                and _float_cast(src.dtype, out.dtype)
            ):
                c._cast(src.dtype, out.dtype)
        return out


def _sync_kind(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> str | None:
    if func in _SIZE_SYNCS:
        return _SIZE_SYNCS[func]
    if func in _REPEAT_INTERLEAVE:
        return None if kwargs.get("output_size") is not None else "repeat_interleave"
    if func in _BOOL_INDEX:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        masks = any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)
        return "index_bool" if masks else None
    if func in _COPIES and isinstance(out, torch.Tensor):
        src = args[1] if func is aten.copy_.default else args[0]
        if not isinstance(src, torch.Tensor) or src.device.type == out.device.type:
            return None
        if out.device.type == "cpu":
            return "d2h"
        if src.device.type == "cpu":  # the host waits for the device's queue unless the copy is asynchronous:
            non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)  # asked for, and
            return None if non_blocking and src.is_pinned() else "h2d"  # from pinned memory
    return None


def _float_cast(src: torch.dtype, dst: torch.dtype) -> bool:
    return src != dst and src.is_floating_point and dst.is_floating_point


class _HostReadCounter(TorchFunctionMode):
    """``tolist``/``numpy``/``cpu``/``to("cpu")`` of CPU tensors: a sync on a GPU run, invisible to the
    dispatcher on a CPU one."""

    def __init__(self, counter: OpCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _HOST_READS and args and isinstance(args[0], torch.Tensor) and args[0].device.type == "cpu":
            if name != "to" or _names_cpu(args[1:], kwargs):
                self.counter._sync(_HOST_READS[name], f"Tensor.{name}")
        return func(*args, **kwargs)


def _names_cpu(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a ``Tensor.to`` call names the CPU by a string (``.to("cpu")``). A ``torch.device`` taken from
    another tensor (``.to(x.device)``, as library code moves masks) is the run's own device: a no-op on a GPU."""
    return any(isinstance(a, str) and a.split(":")[0] == "cpu" for a in (*args, kwargs.get("device")))


def _call_site() -> str:
    """The innermost Python frame outside torch and this module, as ``path:line in function``."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and any(s in frame.f_code.co_filename for s in _SKIP_FRAMES):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{_short(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"


@functools.cache
def _roots() -> list[Path]:
    """The folders a call site's path is shown from, the deepest first: the one holding the ``raycl`` package (a
    checkout's root, with its ``tests/`` and ``bench/``, or site-packages) and the environment's site-packages
    (``transformers/…`` when raycl is a checkout). Taken from where the modules are, never from a folder's name:
    a checkout may itself be called ``raycl``, ``tests`` or ``torch``."""
    found = {Path(__file__).resolve().parents[2], Path(torch.__file__).resolve().parents[1]}
    found |= {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


@functools.lru_cache(maxsize=1024)
def _short(path: str) -> str:
    """A path from the package root (``raycl/…``, ``tests/…``, ``transformers/…``) rather than the machine's."""
    if not os.path.isabs(path):  # <string>, <frozen …>: no file
        return path
    full = Path(path).resolve()
    for root in _roots():
        if full.is_relative_to(root):
            return full.relative_to(root).as_posix()
    return path
