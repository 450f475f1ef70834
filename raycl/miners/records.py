"""The one record a mined negative travels in, from the miner that mines it to the trainer that trains on it.

Every miner returns one :class:`MinedNegatives` per example (beam search for GEC, ranked permutations for
coherence, dense retrieval refreshed while training); the miner actor stamps it with the weight version it mined
with and its own id (:meth:`MinedNegatives.stamped`), the negative stream's ledger keeps it until a trainer takes
it, and the trainer's staleness bound reads its ``model_version`` (RLlib's ``WEIGHTS_SEQ_NO``, veRL's per-sample
``param_version``). Written to Parquet and read back (``raycl.miners.beam_search``) it is the same record.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class MinedNegatives:
    """The negatives of one example, best (hardest) first, with the mining model's score of each."""

    id: str
    negatives: tuple[str, ...]  # (n,) GEC: corrections; coherence: encoded documents; dense: corpus texts
    scores: tuple[float, ...]  # (n,) the mining model's score of each (GEC: S(t~|s); coherence: f; dense: cos)
    # this selection's false-negative counts before any drop (FalseNegativeCounts.flat); () where not selected
    false_negatives: tuple[int, ...] = ()
    model_version: int = 0  # the weights that mined it: staleness = trainer version − model_version
    miner_id: int = -1  # the miner actor that mined it (-1: mined outside a miner pool)

    def stamped(self, *, model_version: int, miner_id: int) -> MinedNegatives:
        return dataclasses.replace(self, model_version=model_version, miner_id=miner_id)
