"""Base class of the miners: mining runs without gradients, in eval mode, and returns one record per example.

As in pytorch-metric-learning's ``BaseMiner``: the public ``mine`` wraps the subclass's ``_mine`` in
``torch.no_grad()`` (and here also eval mode, restoring the module's previous mode afterwards) and asserts
its output — one result per input example, in order, with the example's id.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Generic, Protocol, TypeVar

import torch
from torch import nn


class HasId(Protocol):
    @property
    def id(self) -> str: ...


ExampleT = TypeVar("ExampleT", bound=HasId)
ResultT = TypeVar("ResultT", bound=HasId)


@contextmanager
def inference(module: Any) -> Iterator[None]:
    """``torch.no_grad()`` and eval mode for the duration; the module's previous train/eval mode comes back.
    A decoding engine that is not a torch module (CTranslate2) only gets ``no_grad``."""
    if not isinstance(module, nn.Module):
        with torch.no_grad():
            yield
        return
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        module.train(was_training)


class BaseMiner(Generic[ExampleT, ResultT]):
    """Subclasses implement ``_mine(examples) -> results``; callers use ``miner(examples)`` or ``mine``."""

    def __init__(self, module: Any, *, precision: str = "fp32") -> None:
        self.module = module
        self.precision = precision  # fp32 | bf16 | fp16: the forward passes' autocast (mining.precision)

    def __call__(self, examples: Sequence[ExampleT]) -> list[ResultT]:
        return self.mine(examples)

    def mine(self, examples: Sequence[ExampleT]) -> list[ResultT]:
        with inference(self.module), self._autocast():
            results = self._mine(examples)
        assert len(results) == len(examples), f"{type(self).__name__}: {len(results)} results for {len(examples)}"
        for ex, res in zip(examples, results, strict=True):
            assert res.id == ex.id, f"{type(self).__name__}: result {res.id!r} in the place of example {ex.id!r}"
        return results

    def _autocast(self) -> AbstractContextManager[None]:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)
        if dtype is None or not isinstance(self.module, nn.Module):  # an engine applies its own compute type
            return nullcontext()
        param = next(self.module.parameters())
        if param.dtype == dtype:  # weights already in the precision (a GPU miner's): nothing left to cast
            return nullcontext()
        return torch.autocast(device_type=param.device.type, dtype=dtype)

    def _mine(self, examples: Sequence[ExampleT]) -> list[ResultT]:
        raise NotImplementedError
