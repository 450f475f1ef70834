"""Coherence evaluation, used by the worker (dev after every report, the test sets when dev improved) and by
``raycl.eval coherence``'s numbers: pairwise accuracy (ties wrong) on dev and on each test set and, with
annotations, Krippendorff's α (nominal) with the model as one more coder."""

from __future__ import annotations

from typing import Any

from raycl.config.tasks.coherence import CoherenceConfig
from raycl.data.coherence import CoherenceItem, read_annotations, read_pairs
from raycl.models.coherence import CoherenceScorer
from raycl.scoring.coherence_eval import score_items
from raycl.scoring.coherence_metrics import alpha_with_model, krippendorff_alpha_nominal, pairwise_accuracy


class Evaluator:
    """Rank 0's dev and test sets, read once."""

    def __init__(self, cfg: CoherenceConfig) -> None:
        self.cfg = cfg
        self.dev_items = [it for spec in cfg.data.dev for it in read_pairs(spec)]
        self.tests = {
            name: [it for spec in specs for it in read_pairs(spec)] for name, specs in cfg.data.test.items()
        }
        self.coders = {name: read_annotations(path) for name, path in cfg.data.annotations.items()}

    def _scores(self, scorer: CoherenceScorer, items: list[CoherenceItem]) -> tuple[list[float], list[Any]]:
        return score_items(scorer, items, num_negs=self.cfg.eval.num_negs, batch_size=self.cfg.eval.batch_size)

    def dev(self, scorer: CoherenceScorer) -> dict[str, float]:
        return {"dev_acc": pairwise_accuracy(*self._scores(scorer, self.dev_items))}

    def test(self, scorer: CoherenceScorer) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, items in self.tests.items():
            pos, negs = self._scores(scorer, items)
            out[f"test/{name}/acc"] = pairwise_accuracy(pos, negs)
            if (coders := self.coders.get(name)) is not None:
                out[f"test/{name}/alpha"] = alpha_with_model(coders, pos, negs)
                out[f"test/{name}/human_alpha"] = krippendorff_alpha_nominal(coders)
        return out
