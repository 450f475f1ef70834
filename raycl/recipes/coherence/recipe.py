"""Coherence modelling with contrastive learning, a momentum queue and hard negatives (Jwalapuram, Joty, Lin;
ACL 2022), as the released code runs it (docs/recipes/coherence.md): the permuted training set and the scorer
once a run; each trial one pass (pairwise | contrastive | momentum), its miners ranking the next items'
permutations with the freshest published weights (``mining.max_staleness = 0``: the paper's schedule); dev
pairwise accuracy selects; the space's baselines give Table 1's other rows and Fig. 2a.
"""

from __future__ import annotations

from pathlib import Path

from raycl import storage
from raycl.config import Space
from raycl.config.tasks.coherence import CoherenceConfig
from raycl.data.coherence import write_pairs_jsonl
from raycl.driver import Miners, MiningPlan, Phase, RecipeBase, Run
from raycl.miners.permutation import COHERENCE_RANK
from raycl.models.coherence_presets import build_coherence_model
from raycl.recipes.coherence import inputs as coherence_inputs
from raycl.recipes.coherence.report import REPORT
from raycl.recipes.coherence.worker import CoherenceTask
from raycl.training.batching import BatchPlan


class CoherenceRecipe(RecipeBase):
    task = "coherence"

    with_data = staticmethod(coherence_inputs.with_data)
    report = REPORT
    check_data = staticmethod(coherence_inputs.check_data)

    def base_model(self, run: Run) -> None:
        """The permuted training set, written in file order (each trial orders it by its own ``optim.shuffle``),
        and the starting scorer: the preset (a tiny XLNet's tokenizer trained on the training sentences, the
        offline MiniLM, or xlnet-base-cased), ``model.name`` (any encoder) or ``model.checkpoint`` (a trained
        scorer)."""
        from raycl.models.coherence import CoherenceScorer

        cfg, out = run.cfg, run.base_model
        items = coherence_inputs.training_items(cfg, shuffle=False)
        (run.run_dir / "data").mkdir(exist_ok=True)
        write_pairs_jsonl(items, train_items(run))
        if (out / "config.json").exists():
            return
        source = storage.fetch(cfg.model.checkpoint) if cfg.model.checkpoint else cfg.model.name  # a URI: fetched
        texts = None if source else sorted({s for it in items for s in it.pos})
        build_coherence_model(cfg.model.preset, out, texts=texts, checkpoint=source, seed=cfg.model.seed)
        m = cfg.model
        scorer = CoherenceScorer.from_pretrained(out, max_len=m.max_len or None, mask_padding=m.mask_padding)
        scorer.tokenizer.model_max_length = scorer.max_len + 2  # the text budget plus <sep><cls> (or [CLS] [SEP])
        scorer.save_pretrained(out)

    def phase(self, run: Run, cfg: CoherenceConfig, out_dir: Path) -> Phase:
        """One training run; with hard negatives, its own miners rank permutations meanwhile."""
        m, task = cfg.mining, CoherenceTask(cfg, str(train_items(run)))
        mined = Miners(COHERENCE_RANK, m.miner_options(), m, cfg.optim.seed, m.source)
        negatives = mined if mines_while_training(cfg) else m.source()
        return Phase("train", "train ‖ mine", task, run.base_model, negatives)

    def max_t(self, run: Run) -> int:
        """Reports a trial makes: every ``eval_every`` updates of an epoch (its batch plan's), one at the end."""
        o, world = run.cfg.optim, max(run.cfg.scaling.num_workers, 1)
        steps = len(BatchPlan([run.counts["train"]], batch_size=o.batch_size, seed=o.seed, world_size=world))
        return o.epochs * (steps // o.eval_every) + 1

    def mining_plan(self, cfg: CoherenceConfig, space: Space) -> MiningPlan:
        return MiningPlan(cfg.mining if mines_while_training(cfg) else None)


def train_items(run: Run) -> Path:
    """The run's permuted training set, written once (``base_model``), read by every trial's workers."""
    return run.run_dir / "data" / "train_items.jsonl"


def mines_while_training(cfg: CoherenceConfig) -> bool:
    return cfg.mining.hard_negatives and cfg.optim.epochs > 0
