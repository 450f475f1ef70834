"""Versioned weights: rank 0 publishes a flat CPU buffer once per sync; miners pull only newer versions.

RLlib's ``EnvRunnerStateServer`` pattern (Ray 2.60's default for IMPALA/APPO): one ``WeightStore`` actor holds the
latest ``(version, [ref], manifest)``; ``pull_if_newer(v)`` returns it only when its version is > v, so a miner
never goes back to older weights. A flat numpy buffer is put in 2–14 ms and read zero-copy in < 1 ms, where a dict
of tensors costs 16–38 ms / 4–5 ms (a 10.5 MB state dict on Ray 2.60, measured on a 2-core machine).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import ray

from raycl.distributed import metrics
from raycl.distributed.messages import TensorSpec, WeightsRef

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
ALIGN = 64  # bytes; every entry starts aligned, so `view(dtype)` of its slice needs no copy


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def flatten_state_dict(state_dict: Mapping[str, torch.Tensor]) -> tuple[np.ndarray, tuple[TensorSpec, ...]]:
    """All tensors in one uint8 buffer (CPU) plus a manifest of (name, dtype, shape, offset, nbytes).

    Entries sharing storage (tied embeddings: BART's ``shared``/``embed_tokens``/``lm_head``) are written once
    and their specs point at the same bytes.
    """
    import torch  # here, not above: the store's actor process (this module's WeightStore) never needs torch

    specs, first = [], dict[tuple, TensorSpec]()
    end = 0
    for name, t in state_dict.items():
        key = (t.device, t.data_ptr(), t.dtype, tuple(t.shape), t.stride()) if t.numel() else None
        if key is not None and key in first:
            specs.append(TensorSpec(name, *_dtype_shape(t), first[key].offset, first[key].nbytes))
            continue
        spec = TensorSpec(name, *_dtype_shape(t), end, t.numel() * t.element_size())
        specs.append(spec)
        if key is not None:
            first[key] = spec
        end = _aligned(end + spec.nbytes)
    buf = np.zeros(end, dtype=np.uint8)  # (nbytes,)
    flat = torch.from_numpy(buf)
    for spec, t in zip(specs, state_dict.values(), strict=True):
        if spec.nbytes:
            src = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)  # (nbytes,)
            flat[spec.offset : spec.offset + spec.nbytes].copy_(src)
    return buf, tuple(specs)


def _dtype_shape(t: torch.Tensor) -> tuple[str, tuple[int, ...]]:
    return str(t.dtype).removeprefix("torch."), tuple(t.shape)


def unflatten(buf: np.ndarray, manifest: tuple[TensorSpec, ...]) -> dict[str, torch.Tensor]:
    """The state dict back from ``flatten_state_dict``'s output: typed views into ``buf`` (no copy).

    A buffer from ``ray.get`` is read-only; the views are only read (``load_state_dict`` copies them).
    """
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "the given NumPy array is not writable"
        flat = torch.from_numpy(buf)  # (nbytes,) uint8
    out = {}
    for s in manifest:
        raw = flat[s.offset : s.offset + s.nbytes]  # (nbytes,)
        out[s.name] = raw.view(getattr(torch, s.dtype)).reshape(s.shape)
    return out


class WeightStore:
    """Holds only the latest published weights; a plain class made remote by :func:`start_weight_store`."""

    def __init__(self) -> None:
        self._latest: WeightsRef | None = None

    def publish(self, version: int, refs: list, manifest: tuple[TensorSpec, ...]) -> bool:
        """Keep ``(version, refs)`` as the latest; False (and nothing kept) when version ≤ the current one."""
        if version <= self.version():
            log.warning("weight store: refused version %d (current %d)", version, self.version())
            return False
        self._latest = WeightsRef(version, list(refs), tuple(manifest))
        metrics.weight_version("store", version)
        return True

    def version(self) -> int:
        """The latest published version, -1 before any publication."""
        return -1 if self._latest is None else self._latest.version

    def pull_if_newer(self, version: int) -> WeightsRef | None:
        latest = self._latest
        return latest if latest is not None and latest.version > version else None


def start_weight_store(**options: Any) -> Any:
    """The store actor (no CPU reserved; ``options`` go to ``.options()``, e.g. a placement-group strategy)."""
    cls: Any = ray.remote(WeightStore)
    return cls.options(num_cpus=0, **options).remote()


def publish_weights(store: Any, version: int, state_dict: Mapping[str, torch.Tensor]) -> bool:
    """Flatten ``state_dict``, ``ray.put`` it once and publish it as ``version``; returns the store's verdict.

    The publishing process owns the buffer (Ray 2.56 removed ``ray.put(_owner=...)``); the store's reference
    keeps it alive after this returns. If the publisher dies, miners fail to fetch it and keep their weights
    until the next publication (a restored trainer republishes under a new version).
    """
    buf, manifest = flatten_state_dict(state_dict)
    ref = ray.put(buf)
    return bool(ray.get(store.publish.remote(version, [ref], manifest)))


def fetch_weights(weights: WeightsRef) -> dict[str, torch.Tensor]:
    """The state dict of a published version (zero-copy views into the object store's buffer)."""
    return unflatten(ray.get(weights.refs[0]), weights.manifest)
