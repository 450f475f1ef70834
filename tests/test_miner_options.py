"""A miner's options are read from the config in one place (``MiningSection.miner_options``): every key is one the
miner (or its actor) takes, each from the config key of its name, and the run's shared n-best asks the beam miner
for what every trial can select from. Fast: no model, no Ray."""

from __future__ import annotations

import dataclasses
import inspect

from raycl.config.tasks import load_space
from raycl.config.tasks.gec import DECODING, SELECTION
from raycl.distributed.miner_pool import ACTOR_KEYS
from raycl.miners.beam_search import BeamSearchMiner
from raycl.miners.permutation import PermutationMiner
from raycl.miners.sources import DenseRefresh


def _keywords(cls: type) -> set[str]:
    return {p.name for p in inspect.signature(cls).parameters.values() if p.kind is p.KEYWORD_ONLY}


def test_gec_miner_options_are_the_beam_miners_keywords_read_from_their_keys() -> None:
    m = dataclasses.replace(
        load_space("gec_pd", preset="smoke").config.mining,
        k=2,
        beam=6,
        refill=True,
        source_negative=False,
        false_negatives="drop",
        rank_by="sum_logprob",
        batch_size=7,
    )
    trial = m.miner_options()
    assert set(trial) - {"engine"} == _keywords(BeamSearchMiner) - {"nbest"}  # the engine: the actor's build
    assert all(trial[key] == getattr(m, key) for key in trial)  # each option from the key of its name
    shared = m.miner_options(nbest=True)
    assert shared == {**{key: getattr(m, key) for key in ("batch_size", *DECODING)}, "k": 5, "nbest": True}
    assert not set(SELECTION) - {"k"} & set(shared)  # each trial selects its own from the n-best


def test_coherence_miner_options_are_the_ranking_miners_keywords_and_its_wait() -> None:
    m = dataclasses.replace(load_space("coherence").config.mining, num_rank=9, num_negs=3, lease_s=12.5)
    got = m.miner_options()
    assert set(got) - set(ACTOR_KEYS) == _keywords(PermutationMiner)
    assert got == {
        "batch_size": m.batch_size,
        "precision": m.precision,
        "num_rank": 9,
        "num_negs": 3,
        "version_wait_s": 12.5,
    }  # a task waits up to its lease for its chunk's weights


def test_sts_refreshes_from_its_own_miners_only_with_refresh_and_a_stream() -> None:
    m = dataclasses.replace(
        load_space("sts").config.mining, refresh=True, refresh_every=7, max_staleness=2, wait_s=4.5
    )
    stream, store = object(), object()
    assert m.source(stream=stream, store=store) == DenseRefresh(stream, store, 7, 2, 4.5)
    assert m.source(stream=None, store=store) is None  # no miners of its own: the pool's, read by the recipe
    assert dataclasses.replace(m, refresh=False).source(stream=stream, store=store) is None
