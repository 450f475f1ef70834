"""GEC with contrastive learning in low error density domains (Cao, Yang, Ng; Findings of EMNLP 2021),
Algorithm 1 (docs/recipes/gec.md): 1. the base model θ̂ trained on D_T with NLL (the run's first phase, or
``model.checkpoint``); 2.–3. each trial fine-tunes on D_F with Eq. 5 while miners beam-search its negatives with
θ̂ (version 0) — the run's one shared n-best (``mining.share``) or the trial's own pool, or pre-mined
``mining.negatives``; 4. dev F0.5 selects, the baselines of Table 2 (DI, NLL, CL⁻) run at the best CL point.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

from raycl import storage
from raycl.config import Space
from raycl.config.tasks.gec import DECODING, SELECTION, GecConfig
from raycl.data.gec import load_examples
from raycl.driver import Miners, MiningPlan, NBestRecords, Phase, RecipeBase, Run, RunPool, Shared
from raycl.errors import UserError
from raycl.miners.beam_search import GEC_BEAM, select_from_nbest, write_negatives_parquet
from raycl.miners.false_negatives import FalseNegativeCounts
from raycl.miners.records import MinedNegatives
from raycl.models.engines import choose_engine
from raycl.models.presets import build_model
from raycl.progress import say
from raycl.recipes.gec import inputs as gec_inputs
from raycl.recipes.gec.report import FN_FILE, REPORT
from raycl.recipes.gec.worker import GecTask
from raycl.records import atomic_write


class GecRecipe(RecipeBase):
    task = "gec"
    exports: tuple[str, ...] = ("negatives.parquet",)  # those the chosen trial trained on

    with_data = staticmethod(gec_inputs.with_data)
    report = REPORT
    check_data = staticmethod(gec_inputs.check_data)

    def base_model(self, run: Run) -> Phase | None:
        """Step 1: the base model θ̂, trained on D_T with NLL — or ``model.checkpoint`` as given."""
        cfg = run.cfg
        if cfg.model.checkpoint:
            folder = run.base_model = Path(storage.fetch(cfg.model.checkpoint))  # a URI: fetched to this node
            if not (folder / "config.json").exists():
                raise UserError(f"model.checkpoint: {folder}: expected a Hugging Face model folder (config.json)")
            return None
        if (run.base_model / "config.json").exists():
            say(f"step 1: reusing the base model in {run.base_model}")
            return None
        init = _initial_model(cfg, run.run_dir / "init")
        workers = cfg.scaling.num_workers
        say(
            f"step 1: training the base model on D_T ({cfg.pretrain.epochs} epochs, {workers} Ray Train worker(s))"
        )
        return Phase("pretrain", "step 1: pretrain", GecTask(cfg, "pretrain"), init)

    def run_pool(self, run: Run, space: Space) -> RunPool | None:
        """Step 2 once for the whole run (version-0 negatives, ``mining.share``): the base model's n-best of D_F,
        mined by one miner pool while the first trials train; every trial selects its k and CL/CL⁻ from it."""
        cfg = run.cfg
        if not self.mining_plan(cfg, space).shared:
            if swept := sorted(key for key in space.search if key in DECODING_KEYS and mines_while_training(cfg)):
                say(f"per-trial mining: the sweep varies {', '.join(swept)}: trials' n-best lists differ")
            return None
        # mining.engine for the run's miners, said once, as each CPU miner chooses it (an impossible choice, such
        # as int8 without CTranslate2, fails before any trial starts); GPU miners choose `auto` on their device
        m = cfg.mining
        engine = choose_engine(
            m.engine, run.base_model, device="cpu", precision=m.precision, gpus_per_miner=m.gpus_per_miner
        )
        if (line := engine.line(m.precision)) is not None:
            say(line)
        examples = load_examples(cfg.data.finetune, annotator=cfg.data.annotator)
        return RunPool(GEC_BEAM, m.miner_options(nbest=True), m, examples, decoding_options(cfg))

    def phase(self, run: Run, cfg: GecConfig, out_dir: Path) -> Phase:
        """Steps 2–3 for one point: miners mine D_F with the base model (version 0) while the trainers consume
        it — the run's shared n-best when there is one, else this trial's own miner pool."""
        m, task, desc = cfg.mining, GecTask(cfg, "finetune"), "steps 2–3: mine ‖ fine-tune"
        if not mines_while_training(cfg):
            return Phase("finetune", desc, task, run.base_model, m.source())  # pre-mined or none
        keep, select = partial(_write_negatives, out_dir, cfg), partial(_write_selected, out_dir, cfg)
        shared = Shared(decoding_options(cfg), select) if shares_nbest(cfg) else None
        mined = Miners(GEC_BEAM, m.miner_options(), m, cfg.optim.seed, m.source, keep, "mining.json", shared)
        return Phase("finetune", desc, task, run.base_model, mined)

    def max_t(self, run: Run) -> int:
        return int(run.cfg.optim.epochs)

    def mining_plan(self, cfg: GecConfig, space: Space) -> MiningPlan:
        shared = shares_nbest(cfg) and not any(key in DECODING_KEYS for key in space.search)
        return MiningPlan(cfg.mining, shared) if mines_while_training(cfg) else MiningPlan()


def _initial_model(cfg: GecConfig, out: Path) -> Path:
    """The untrained starting point: a config preset with a BPE trained on D_T ∪ D_F, or ``model.name``."""
    if (out / "config.json").exists():
        return out
    overrides: dict[str, Any] = dict(cfg.model.overrides)
    if cfg.model.name:
        return build_model(cfg.model.preset, out_dir=out, checkpoint=cfg.model.name, **overrides)
    texts = [t for ex in load_examples(cfg.data.train + cfg.data.finetune) for t in (ex.source, ex.target)]
    if cfg.model.vocab_size:
        overrides["vocab_size"] = cfg.model.vocab_size
    return build_model(cfg.model.preset, out_dir=out, texts=texts, seed=cfg.model.seed, **overrides)


def mines_while_training(cfg: GecConfig) -> bool:
    """Step 2 runs in the miner pool, alongside fine-tuning, unless negatives are pre-mined or not needed."""
    return cfg.loss.trade_off > 0 and cfg.optim.epochs > 0 and not cfg.mining.negatives


def shares_nbest(cfg: GecConfig) -> bool:
    """Negatives from the base model only (the paper): one n-best per run serves every trial."""
    m = cfg.mining
    return m.share and m.sync_every == 0 and m.refresh_every == 0


DECODING_KEYS = (*(f"mining.{key}" for key in DECODING), "model.max_length")


def decoding_options(cfg: GecConfig) -> dict[str, Any]:
    """What makes an n-best list: a trial may use the run's n-best only when these are the run's."""
    return {**cfg.mining.decoding(), "max_length": cfg.model.max_length}


def _write_selected(out_dir: Path, cfg: GecConfig, records: NBestRecords) -> None:
    """A trial's negatives, selected from the run's n-best with its k and CL/CL⁻ (version 0), written as those
    its own miners would have delivered, each with its selection's false-negative counts."""
    rule, items = {key: getattr(cfg.mining, key) for key in SELECTION}, []
    for ex in load_examples(cfg.data.finetune, annotator=cfg.data.annotator):
        if ex.id in records:
            chosen = select_from_nbest(*records[ex.id], ex, **rule, counts=(counts := FalseNegativeCounts()))
            items.append(MinedNegatives(ex.id, chosen.negatives, chosen.scores, tuple(counts.flat()), miner_id=0))
    _write_negatives(out_dir, cfg, items)


def _write_negatives(out_dir: Path, cfg: GecConfig, items: list[MinedNegatives]) -> None:
    """The negatives a run trained on (the newest mined for each example), as ``raycl.mine`` writes them, and
    their selections' false-negative counts before any drop (the report's rates; a beam miner's selection
    carries its own, other miners count none)."""
    by_id = {it.id: it for it in items}
    examples = [ex for ex in load_examples(cfg.data.finetune, annotator=cfg.data.annotator) if ex.id in by_id]
    mined: list[Any] = [by_id[ex.id] for ex in examples]  # the writer reads their id, negatives and scores
    versions = [it.model_version for it in mined]
    write_negatives_parquet(out_dir / "negatives.parquet", examples, mined, model_version=versions)
    if all(it.false_negatives for it in mined):
        counts = FalseNegativeCounts()
        for it in mined:
            counts.merge(FalseNegativeCounts.of_flat(it.false_negatives))
        atomic_write(out_dir / FN_FILE, json.dumps({"mode": cfg.mining.false_negatives, **counts.as_dict()}))
