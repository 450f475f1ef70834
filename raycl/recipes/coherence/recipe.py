"""Coherence modelling with contrastive learning, a momentum queue and hard negatives (Jwalapuram, Joty, Lin;
ACL 2022), as the released code runs it.

The run, as the driver (``raycl.driver``) runs it with this recipe::

    1. data      documents → the permuted set (blocks of 10, copies with distinct permutations)   check_data()
    2. model     the preset's encoder + a linear scorer (XLNet: <cls> last)                       base_model()
    3. train     one pass, batch 1: pairwise | contrastive | momentum (λ·L_c + (1−λ)·L_m, queue)  train_one()
                 ‖ miners rank num_rank permutations per item with the freshest published weights
    4. select    dev pairwise accuracy; the test sets (held-out permuted, independent) on the best
    5. report    Table 1 (pairwise / contrastive / full model), Fig. 2a–d                       report.py

Hard negatives: the paper's released code stops training every 200 items to rank the next 200 items' 50
permutations.
Here the ranking runs in the miner pool while the trainer trains; ``mining.max_staleness = 0`` keeps the paper's
schedule exactly (a chunk is ranked by the weights published at its start), 1 lets the miners rank the next chunk
during this one. The sweep's best point is the full model; the space's ``baselines:`` give Table 1's other rows
and the runs of Fig. 2a (contrastive with and without hard negatives).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from raycl import storage
from raycl.config import Space
from raycl.configs.coherence import CoherenceConfig
from raycl.data.coherence import (
    CoherenceItem,
    write_pairs_jsonl,
)  # fmt: skip
from raycl.distributed.miner_pool import MinerFactory
from raycl.distributed.mining_service import trial_resources
from raycl.distributed.resources import MiningPlan
from raycl.driver import RecipeBase, Run, TrainPoint, fit_job, miners
from raycl.miners.permutation import COHERENCE_RANK
from raycl.models.coherence_presets import build_coherence_model
from raycl.recipes.coherence import inputs as coherence_inputs
from raycl.recipes.coherence import report
from raycl.recipes.coherence.worker import CoherenceTask
from raycl.records import TrialOutcome
from raycl.training.task import Job


class CoherenceRecipe(RecipeBase):
    task = "coherence"

    with_data = staticmethod(coherence_inputs.with_data)
    check_data = staticmethod(coherence_inputs.check_data)

    def base_model(self, run: Run) -> None:
        """The permuted training set, written in file order (each trial orders it by its own ``optim.shuffle``),
        and the starting scorer."""
        items = coherence_inputs.training_items(run.cfg, shuffle=False)
        (run.run_dir / "data").mkdir(exist_ok=True)
        run.files["train_items"] = run.run_dir / "data" / "train_items.jsonl"
        write_pairs_jsonl(items, run.files["train_items"])
        base_model(run.cfg, run.run_dir, items)

    def train_points(self, run: Run) -> list[TrainPoint]:
        return [TrainPoint("train", {}, "train ‖ mine")]

    def train_one(self, run: Run, cfg: CoherenceConfig, out_dir: Path, *, name: str, in_tune: bool) -> Any:
        """One training run; with hard negatives, its own miners rank permutations meanwhile."""
        task = CoherenceTask(cfg, str(run.files["train_items"]))
        job = Job(task, str(run.base_model), str(out_dir), negatives=cfg.mining.source())
        if not mines_while_training(cfg):
            return fit_job(run, cfg, job, name=name, in_tune=in_tune)
        factory = MinerFactory(COHERENCE_RANK, str(run.base_model), cfg.mining.miner_options())
        with miners(factory, cfg.mining, world_size=cfg.scaling.num_workers, seed=cfg.optim.seed) as service:
            job = dataclasses.replace(job, negatives=cfg.mining.source(stream=service.stream, store=service.store))
            return fit_job(run, cfg, job, name=name, in_tune=in_tune)

    def max_t(self, run: Run) -> int:
        """Reports a trial makes: every ``eval_every`` updates of an epoch, and one at the end of training."""
        o, world = run.cfg.optim, max(run.cfg.scaling.num_workers, 1)
        steps = math.ceil(math.ceil(run.counts["train"] / world) / o.batch_size)  # the longest shard's
        return o.epochs * (steps // o.eval_every) + 1

    def trial_resources(self, run: Run) -> Any:
        return trial_resources(run.cfg.tune.driver_cpus, run.cfg.mining if run.cfg.mining.hard_negatives else None)

    def mining_plan(self, cfg: CoherenceConfig, space: Space) -> MiningPlan:
        return MiningPlan(cfg.mining if mines_while_training(cfg) else None)

    def write_report(self, run: Run, space: Space, trials: list[TrialOutcome], extra: list[TrialOutcome]
                     ) -> dict[str, Any]:  # fmt: skip
        return report.write_all(run, space, trials, extra)


def mines_while_training(cfg: CoherenceConfig) -> bool:
    return cfg.mining.hard_negatives and cfg.optim.epochs > 0


# ---------------------------------------------------------------------------------------------- model
def base_model(cfg: CoherenceConfig, run_dir: Path, items: list[CoherenceItem]) -> Path:
    """The starting scorer: the preset (a tiny XLNet's tokenizer trained on the training sentences, the offline
    MiniLM, or xlnet-base-cased), ``model.name`` (any encoder) or ``model.checkpoint`` (a trained scorer)."""
    out = run_dir / "base_model"
    if (out / "config.json").exists():
        return out
    from raycl.models.coherence import CoherenceScorer

    source = storage.fetch(cfg.model.checkpoint) if cfg.model.checkpoint else cfg.model.name  # a URI: fetched
    texts = None if source else sorted({s for it in items for s in it.pos})
    build_coherence_model(cfg.model.preset, out, texts=texts, checkpoint=source, seed=cfg.model.seed)
    scorer = CoherenceScorer.from_pretrained(out, max_len=cfg.model.max_len or None,
                                             mask_padding=cfg.model.mask_padding)  # fmt: skip
    scorer.tokenizer.model_max_length = scorer.max_len + 2  # the text budget plus <sep><cls> (or [CLS] [SEP])
    scorer.save_pretrained(out)
    return out
