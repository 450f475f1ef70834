"""Miner doubles: :data:`ECHO`, a miner kind that needs no model (its negatives tell which weights it had), and
:data:`NULL_BEAM`, the beam miner over an engine that decodes nothing (what is left of mining is the pipeline's own
work — reading ranges, selecting, writing shards: ``bench/mine.py``'s null-model runs)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from raycl.miners.beam_search import BeamSearchMiner
from raycl.miners.records import MinedNegatives
from raycl.miners.registry import register_miner


class EchoMiner:
    """k negatives ``"<id>~i"`` scored ``w − i``, where w is the sum of the last loaded weights (0 before any);
    ``delay_s`` of sleep per item imitates mining time."""

    def __init__(self, *, k: int = 2, delay_s: float = 0.0) -> None:
        self.k, self.delay_s, self.weight_sum = k, delay_s, 0.0

    def mine(self, items: Sequence[Any]) -> list[MinedNegatives]:
        time.sleep(self.delay_s * len(items))
        return [
            MinedNegatives(
                x.id,
                tuple(f"{x.id}~{i}" for i in range(self.k)),
                tuple(self.weight_sum - i for i in range(self.k)),
            )
            for x in items
        ]

    def load(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.weight_sum = float(sum(t.double().sum() for t in state_dict.values()))


def _build_echo(_path: str, options: dict[str, Any]) -> EchoMiner:
    return EchoMiner(**{k: v for k, v in options.items() if k not in ("device", "precision")})


def _load_echo(miner: Any, state_dict: Mapping[str, torch.Tensor], *, version: int = 0) -> None:
    miner.load(state_dict)


ECHO = register_miner("echo", build=_build_echo, load=_load_echo)


class NullEngine:
    """A decoding engine that decodes nothing (no hypotheses, S = 0)."""

    training = False

    def generate(self, sources: list[str], **_: Any) -> list[list[tuple[str, float]]]:
        return [[] for _ in sources]

    def score_texts(self, sources: list[str], targets: list[str], **_: Any) -> list[float]:
        return [0.0] * len(sources)


def _build_null_beam(_path: str, options: dict[str, Any]) -> BeamSearchMiner:
    """``gec_beam``'s miner and options over :class:`NullEngine`: no model read, no engine chosen."""
    opts = {k: v for k, v in options.items() if k not in ("device", "engine")}
    return BeamSearchMiner(NullEngine(), **opts)  # type: ignore[arg-type]  # Seq2SeqScorer's decoding interface


def _load_nothing(miner: Any, state_dict: Mapping[str, torch.Tensor], *, version: int = 0) -> None:
    pass


NULL_BEAM = register_miner("gec_beam_null", build=_build_null_beam, load=_load_nothing)
