"""GEC with contrastive learning in low error density domains (Cao, Yang, Ng; Findings of EMNLP 2021).

Algorithm 1, as the driver (``raycl.driver``) runs it with this recipe::

    1. θ̂    ← train the base model on D_T (label-smoothed NLL)          base_model()  (or model.checkpoint)
    2. D_F̃  ← beam-search negatives of θ̂ on D_F, by the miner pool  ┐   train_one()   (model version 0)
    3. θ̂_CL ← fine-tune on D_F̃ with Eq. 5, as soon as batches arrive ┘   one Tune trial per (γ, k) point
    4. select on dev F0.5 (annotator-averaged), report test              the driver's baselines + report.py

Steps 2 and 3 overlap: each trial's miner actors stream negatives (top-k distinct beam outputs ≠ target, plus
the source for CL) into a bounded buffer that its Ray Train workers consume, instead of mining everything
first as the paper's released code did. As in the paper all negatives come from the base model (version 0) and
are mined once; ``mining.refresh_every`` / ``sync_every`` re-mine with newer weights. The baselines of Table 2 —
DI (base model, no fine-tuning), NLL (λ = 0) and CL⁻ (no source negative) — run at the best CL point.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from raycl import storage
from raycl.config import Space
from raycl.configs.gec import DECODING, GecConfig
from raycl.data.gec import load_examples
from raycl.distributed.miner_pool import MinerFactory
from raycl.distributed.mining_service import trial_resources
from raycl.distributed.nbest import SharedNBest, nbest_records, shared_nbest
from raycl.distributed.resources import MiningPlan, waiting_line
from raycl.driver import RecipeBase, Run, TrainPoint, fit_job, miners
from raycl.errors import UserError
from raycl.miners.beam_search import GEC_BEAM, select_from_nbest, write_negatives_parquet
from raycl.miners.false_negatives import FalseNegativeCounts
from raycl.models.engines import choose_engine
from raycl.models.presets import build_model
from raycl.progress import follow, say
from raycl.recipes.gec import inputs as gec_inputs
from raycl.recipes.gec import report
from raycl.recipes.gec.report import FN_FILE
from raycl.recipes.gec.worker import GecTask
from raycl.records import TrialOutcome, atomic_write
from raycl.report import copy_atomic
from raycl.training.task import Job


class GecRecipe(RecipeBase):
    task = "gec"

    with_data = staticmethod(gec_inputs.with_data)
    check_data = staticmethod(gec_inputs.check_data)

    # ------------------------------------------------------------------------------------------ step 1
    def base_model(self, run: Run) -> None:
        """Step 1: the base model θ̂, trained on D_T with NLL — or ``model.checkpoint`` as given."""
        cfg = run.cfg
        if cfg.model.checkpoint:
            run.base_model = Path(storage.fetch(cfg.model.checkpoint))  # a URI: fetched to this node's cache
            if not (run.base_model / "config.json").exists():
                raise UserError(f"model.checkpoint: {run.base_model}: expected a Hugging Face model folder "
                                "(config.json)")  # fmt: skip
            return
        if (run.base_model / "config.json").exists():
            say(f"step 1: reusing the base model in {run.base_model}")
            return
        init = _initial_model(cfg, run.run_dir / "init")
        say(f"step 1: training the base model on D_T ({cfg.pretrain.epochs} epochs, "
            f"{cfg.scaling.num_workers} Ray Train worker(s))")  # fmt: skip
        work = run.run_dir / "pretrain"
        with follow(work, desc="step 1: pretrain", waiting=waiting_line(cfg.scaling)):
            result = fit_job(run, cfg, Job(GecTask(cfg, "pretrain"), str(init), str(work)), name="pretrain",
                             in_tune=False)  # fmt: skip
        if result.error is not None or not (work / "model" / "config.json").exists():
            raise RuntimeError(f"pretraining did not produce a model: {result.error}")
        (work / "model").replace(run.base_model)

    # ------------------------------------------------------------------------------------------ steps 2–3
    def train_points(self, run: Run) -> list[TrainPoint]:
        return [TrainPoint("train", {}, "steps 2–3: mine ‖ fine-tune")]

    @contextmanager
    def shared(self, run: Run, space: Space) -> Iterator[None]:
        """Step 2 once for the whole run (version-0 negatives, ``mining.share``): the base model's n-best of D_F,
        mined by one miner pool while the first trials train; every trial selects its k and CL/CL⁻ from it."""
        cfg = run.cfg
        swept = {key for key in space.search if key in DECODING_KEYS}
        if not (mines_while_training(cfg) and shares_nbest(cfg)) or swept:
            if swept and mines_while_training(cfg):
                say(f"per-trial mining: the sweep varies {', '.join(sorted(swept))}: trials' n-best lists differ")
            yield
            return
        options = decoding_options(cfg)
        factory = MinerFactory(GEC_BEAM, str(run.base_model), cfg.mining.miner_options(nbest=True))
        examples = load_examples(cfg.data.finetune, annotator=cfg.data.annotator)
        say_miners_engine(cfg, run.base_model)  # said once; shared_nbest resolves it for its miners and meta.json
        with shared_nbest(factory, cfg.mining, examples, run.run_dir / "nbest", options=options,
                          model_dir=run.base_model, say=say) as stream:  # fmt: skip
            run.nbest = SharedNBest(stream, options)
            try:
                yield
            finally:
                run.nbest = None  # the miners' own time is in nbest/meta.json and the report

    def train_one(self, run: Run, cfg: GecConfig, out_dir: Path, *, name: str, in_tune: bool) -> Any:
        """Steps 2–3 for one point: miners mine D_F with the base model (version 0) while the trainers consume
        it — the run's shared n-best when there is one, else this trial's own miner pool."""
        job = Job(GecTask(cfg, "finetune"), str(run.base_model), str(out_dir),
                  negatives=cfg.mining.source())  # pre-mined or none; miners' negatives replace it below
        if not mines_while_training(cfg):
            return fit_job(run, cfg, job, name=name, in_tune=in_tune)
        shared = run.nbest
        if shared is not None and shares_nbest(cfg) and shared.decoding == decoding_options(cfg):
            job = dataclasses.replace(job, negatives=cfg.mining.source(nbest=shared.stream))
            result = fit_job(run, cfg, job, name=name, in_tune=in_tune)
            _write_selected(out_dir, cfg, nbest_records(shared.stream))
            return result
        factory = MinerFactory(GEC_BEAM, str(run.base_model), cfg.mining.miner_options())
        with miners(factory, cfg.mining, world_size=cfg.scaling.num_workers, seed=cfg.optim.seed) as service:
            job = dataclasses.replace(job, negatives=cfg.mining.source(stream=service.stream, store=service.store))
            result = fit_job(run, cfg, job, name=name, in_tune=in_tune)
            _write_negatives(out_dir, cfg, service.negatives())
            atomic_write(out_dir / "mining.json", json.dumps(service.stats()))
        return result

    def max_t(self, run: Run) -> int:
        return int(run.cfg.optim.epochs)

    def trial_resources(self, run: Run) -> Any:
        own_miners = mines_while_training(run.cfg) and run.nbest is None
        return trial_resources(run.cfg.tune.driver_cpus, run.cfg.mining if own_miners else None)

    def mining_plan(self, cfg: GecConfig, space: Space) -> MiningPlan:
        if not mines_while_training(cfg):
            return MiningPlan()
        return MiningPlan(cfg.mining, shares_nbest(cfg) and not any(key in DECODING_KEYS for key in space.search))

    # ------------------------------------------------------------------------------------------ step 4
    def export(self, run: Run, best: dict[Any, TrialOutcome]) -> None:
        """``negatives.parquet`` of the run: those the chosen trial trained on."""
        if None in best and (src := run.run_dir / "trials" / best[None].trial_id / "negatives.parquet").exists():
            copy_atomic(src, run.run_dir / "negatives.parquet")

    def write_report(self, run: Run, space: Space, trials: list[TrialOutcome], extra: list[TrialOutcome]
                     ) -> dict[str, Any]:  # fmt: skip
        return report.write_all(run, space, trials, extra)


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


def say_miners_engine(cfg: GecConfig, model_dir: Path) -> None:
    """What ``mining.engine`` is for the run's miners, said once (:func:`raycl.models.engines.choose_engine`, as
    each CPU miner chooses; an impossible choice, such as int8 without CTranslate2, fails before any trial
    starts); GPU miners choose ``auto`` on their own device."""
    m = cfg.mining
    line = choose_engine(m.engine, model_dir, device="cpu", precision=m.precision,
                         gpus_per_miner=m.gpus_per_miner).line(m.precision)  # fmt: skip
    if line is not None:
        say(line)


DECODING_KEYS = (*(f"mining.{key}" for key in DECODING), "model.max_length")


def decoding_options(cfg: GecConfig) -> dict[str, Any]:
    """What makes an n-best list: a trial may use the run's n-best only when these are the run's."""
    return {**cfg.mining.decoding(), "max_length": cfg.model.max_length}


def _write_selected(out_dir: Path, cfg: GecConfig, records: dict[str, Any]) -> None:
    """A trial's negatives, selected from the run's n-best with its k and CL/CL⁻, as ``raycl.mine`` writes them,
    and the selection's false-negative counts (``false_negatives.json``, before any drop: the report's rates)."""
    m, counts = cfg.mining, FalseNegativeCounts()
    examples = [ex for ex in load_examples(cfg.data.finetune, annotator=cfg.data.annotator) if ex.id in records]
    mined = [select_from_nbest(records[ex.id][0], records[ex.id][1], ex, k=m.k, source_negative=m.source_negative,
                               refill=m.refill, false_negatives=m.false_negatives, counts=counts)
             for ex in examples]  # fmt: skip
    write_negatives_parquet(out_dir / "negatives.parquet", examples, mined, model_version=0)
    atomic_write(out_dir / FN_FILE, json.dumps({"mode": m.false_negatives, **counts.as_dict()}))


def _write_negatives(out_dir: Path, cfg: GecConfig, items: list[Any]) -> None:
    """The negatives a run trained on (the newest mined for each example), as ``raycl.mine`` writes them, and
    their selections' false-negative counts before any drop (each beam miner's selection carries its own)."""
    by_id = {it.id: it for it in items}
    examples = [ex for ex in load_examples(cfg.data.finetune, annotator=cfg.data.annotator) if ex.id in by_id]
    mined = [by_id[ex.id] for ex in examples]
    write_negatives_parquet(out_dir / "negatives.parquet", examples, mined,
                            model_version=[it.model_version for it in mined])  # fmt: skip
    if not all(it.false_negatives for it in mined):  # a miner that does not count them (not the beam miner)
        return
    counts = FalseNegativeCounts()
    for it in mined:
        counts.merge(FalseNegativeCounts.of_flat(it.false_negatives))
    atomic_write(out_dir / FN_FILE, json.dumps({"mode": cfg.mining.false_negatives, **counts.as_dict()}))
