"""GEC with contrastive learning in low error density domains (Cao, Yang, Ng; Findings of EMNLP 2021).

Algorithm 1, as this module runs it (each step is one function below, read top to bottom)::

    1. θ̂    ← train the base model on D_T (label-smoothed NLL)          pretrain()   (or model.checkpoint)
    2. D_F̃  ← beam-search negatives of θ̂ on D_F, by the miner pool  ┐   finetune()   (model version 0)
    3. θ̂_CL ← fine-tune on D_F̃ with Eq. 5, as soon as batches arrive ┘   one Tune trial per (γ, k) point
    4. select on dev F0.5 (annotator-averaged), report test              baselines() + gec_report

Steps 2 and 3 overlap: each trial's miner actors stream negatives (top-k distinct beam outputs ≠ target, plus
the source for CL) into a bounded buffer that its Ray Train workers consume, instead of mining everything
first as the paper's code did. As in the paper all negatives come from the base model (version 0) and are
mined once; ``mining.refresh_every`` / ``sync_every`` re-mine with newer weights. The baselines of Table 2 —
DI (base model, no fine-tuning), NLL (λ = 0) and CL⁻ (no source negative) — run at the best CL point.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raycl.config import Space, dump_yaml, set_dotted, to_dict
from raycl.configs.gec import GecConfig
from raycl.data.gec import load_examples, load_references
from raycl.data.gec_corpus import write_builtin_corpus
from raycl.distributed.miner_pool import MinerFactory
from raycl.distributed.mining_service import MiningService, trial_resources
from raycl.distributed.sweep import TrialOutcome, grid, run_sweep, to_param_space, trial_run_name
from raycl.distributed.trainer import fit
from raycl.errors import UserError
from raycl.miners.beam_search import write_negatives_parquet
from raycl.models.presets import build_model
from raycl.recipes import gec_report
from raycl.recipes.common import read_history, say
from raycl.recipes.gec_worker import train_worker
from raycl.train.progress import follow

BASE_MODEL = "base_model"


@dataclass
class GecRun:
    """The artefacts every trial of a run shares."""

    cfg: GecConfig
    run_dir: Path
    base_model: Path
    builtin: list[str]  # the splits filled with the built-in corpus
    timings: dict[str, float]


# ---------------------------------------------------------------------------------------------- data
def with_data(cfg: GecConfig, data_dir: Path) -> tuple[GecConfig, list[str]]:
    """Fill every empty split with the built-in corpus (written as M2 under ``data_dir``), check the rest."""
    d = cfg.data
    empty = [k for k in ("train", "finetune", "dev", "test") if not getattr(d, k)]
    if "train" in empty and cfg.model.checkpoint:
        empty.remove("train")  # step 1 is skipped: D_T is not needed
    if not empty:
        return cfg, []
    b = d.builtin
    files = write_builtin_corpus(data_dir, n_train=b.n_train, n_finetune=b.n_finetune, n_dev=b.n_dev,
                                 n_test=b.n_test, seed=b.seed)  # fmt: skip
    fill: dict[str, Any] = {
        "train": [str(files["train"])],
        "finetune": [str(files["finetune"])],
        "dev": {"builtin": [str(files["dev"])]},
        "test": {"S": [str(files["test-s"])], "G": [str(files["test-g"])]},
    }
    new = dataclasses.replace(d, **{k: fill[k] for k in empty})
    return dataclasses.replace(cfg, data=new), empty


def check_data(cfg: GecConfig) -> dict[str, int]:
    """Read every data file once in the driver, so a malformed file fails here (one line, exit 2) and not
    inside a Ray worker after minutes of training. Returns sentence counts per split."""
    counts = {"train": len(load_examples(cfg.data.train)), "finetune": len(load_examples(cfg.data.finetune))}
    for split, sets in (("dev", cfg.data.dev), ("test", cfg.data.test)):
        for name, specs in sets.items():
            refs = load_references(specs)
            if not refs:
                raise UserError(f"data.{split}.{name}: {', '.join(specs)} holds no sentences, expected some")
            counts[f"{split}/{name}"] = len(refs)
    if counts["finetune"] == 0:
        raise UserError(f"data.finetune: {', '.join(cfg.data.finetune)} holds no sentences, expected D_F")
    return counts


def check_inputs(space: Space, run_dir: Path) -> None:
    """Before Ray starts (``raycl.cli``): every data file of the run is read once."""
    cfg, _ = with_data(space.config, run_dir / "data")
    check_data(cfg)


# ---------------------------------------------------------------------------------------------- step 1
def pretrain(cfg: GecConfig, run_dir: Path) -> Path:
    """Step 1: the base model θ̂, trained on D_T with NLL — or ``model.checkpoint`` as given."""
    if cfg.model.checkpoint:
        path = Path(cfg.model.checkpoint)
        if not (path / "config.json").exists():
            raise UserError(f"model.checkpoint: {path}: expected a Hugging Face model folder (config.json)")
        return path
    out = run_dir / BASE_MODEL
    if (out / "config.json").exists():
        say(f"step 1: reusing the base model in {out}")
        return out
    init = _initial_model(cfg, run_dir / "init")
    say(f"step 1: training the base model on D_T ({cfg.pretrain.epochs} epochs, "
        f"{cfg.scaling.num_workers} Ray Train worker(s))")  # fmt: skip
    work = run_dir / "pretrain"
    with follow(work, desc="step 1: pretrain"):
        result = fit(train_worker, {"config": to_dict(cfg), "phase": "pretrain", "init_model": str(init),
                                    "out_dir": str(work)}, scaling=cfg.scaling, name="pretrain",
                     storage_path=run_dir / "ray")  # fmt: skip
    if result.error is not None or not (work / "model" / "config.json").exists():
        raise RuntimeError(f"pretraining did not produce a model: {result.error}")
    (work / "model").replace(out)
    return out


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


# ---------------------------------------------------------------------------------------------- steps 2–3
def prepare(space: Space, run_dir: Path) -> GecRun:
    """Step 1 plus the run folder: resolved data, ``config.yaml``, the base model."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg, builtin = with_data(space.config, run_dir / "data")
    if builtin:
        say(f"built-in corpus for {', '.join(builtin)} (written to {run_dir / 'data'})")
    counts = check_data(cfg)
    say("data: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    dump_yaml(cfg, run_dir / "config.yaml")
    t0 = time.perf_counter()
    base = pretrain(cfg, run_dir)
    return GecRun(cfg, run_dir, base, builtin, {"pretrain_s": time.perf_counter() - t0})


def mines_while_training(cfg: GecConfig) -> bool:
    """Step 2 runs in the miner pool, alongside fine-tuning, unless negatives are pre-mined or not needed."""
    return cfg.loss.trade_off > 0 and cfg.optim.epochs > 0 and not cfg.mining.negatives


def finetune(run: GecRun, cfg: GecConfig, out_dir: Path, *, name: str, in_tune: bool,
             chaos: dict[str, Any] | None = None) -> Any:  # fmt: skip
    """Steps 2–3 for one point: miners mine D_F with the base model (version 0) while the trainers consume it.
    ``chaos``: a trainer crash switch for tests and benchmarks (``raycl.train.chaos``)."""
    loop_config: dict[str, Any] = {"config": to_dict(cfg), "phase": "finetune", "init_model": str(run.base_model),
                                   "out_dir": str(out_dir), "chaos": chaos}  # fmt: skip
    if not mines_while_training(cfg):
        return fit(train_worker, loop_config, scaling=cfg.scaling, name=name, storage_path=run.run_dir / "ray",
                   in_tune=in_tune)  # fmt: skip
    factory = MinerFactory("gec_beam", str(run.base_model), {
        "k": cfg.mining.k, "beam": cfg.mining.beam, "source_negative": cfg.mining.source_negative,
        "batch_size": cfg.mining.batch_size, "max_new_tokens": cfg.eval.max_new_tokens})  # fmt: skip
    service = MiningService.start(factory, cfg.mining, world_size=max(cfg.scaling.num_workers, 1),
                                  seed=cfg.optim.seed)  # fmt: skip
    try:
        loop_config.update(stream=service.stream, store=service.store)
        result = fit(train_worker, loop_config, scaling=cfg.scaling, name=name, storage_path=run.run_dir / "ray",
                     in_tune=in_tune)  # fmt: skip
        _write_negatives(out_dir / "negatives.parquet", cfg, service.negatives())
        return result
    finally:
        service.close()


def _write_negatives(path: Path, cfg: GecConfig, items: list[Any]) -> None:
    """The negatives a run trained on (the newest mined for each example), as ``raycl.mine`` writes them."""
    by_id = {it.id: it for it in items}
    examples = [ex for ex in load_examples(cfg.data.finetune, annotator=cfg.data.annotator) if ex.id in by_id]
    mined = [by_id[ex.id] for ex in examples]
    write_negatives_parquet(path, examples, mined, model_version=[it.model_version for it in mined])


def gec_trial(params: dict[str, Any], *, run: GecRun, baselines: dict[str, dict[str, Any]]) -> None:
    """One Tune trial: the space's point (plus a named baseline's overrides) fine-tuned in a TorchTrainer,
    with its own miners in the trial's placement group."""
    over = dict(params)
    name = over.pop("baseline", None)
    if name is not None:
        over.update(baselines[name])
    cfg = set_dotted(run.cfg, over, where="trial")
    name = trial_run_name()
    finetune(run, cfg, run.run_dir / "trials" / name.split("=", 1)[-1], name=name, in_tune=True)


def _sweep(run: GecRun, space: Space, param_space: dict[str, Any], *, name: str, fifo: bool = False) -> Any:
    tune_cfg = dataclasses.replace(run.cfg.tune, scheduler="fifo") if fifo else run.cfg.tune
    mining = run.cfg.mining if mines_while_training(run.cfg) else None
    return run_sweep(gec_trial, param_space, trial_kwargs={"run": run, "baselines": space.baselines},
                     tune_cfg=tune_cfg, name=name, storage_path=run.run_dir / "ray", max_t=run.cfg.optim.epochs,
                     resources=trial_resources(tune_cfg.driver_cpus, mining))  # fmt: skip


def sweep(run: GecRun, space: Space) -> list[TrialOutcome]:
    """Step 3 over the ``search:`` block: one trial per point of the paper's grid (or the preset's)."""
    param_space = to_param_space(space.search)
    say(f"steps 2–3: mining ‖ fine-tuning, sweep over {', '.join(param_space) or 'the default point'}")
    return _sweep(run, space, param_space, name="sweep")


def baselines(run: GecRun, space: Space, best_params: dict[str, Any]) -> list[TrialOutcome]:
    """Table 2's other rows at the best CL point: DI, NLL, CL⁻ (the space's ``baselines:``)."""
    if not space.baselines:
        return []
    say(f"baselines at the best point: {', '.join(space.baselines)}")
    return _sweep(run, space, {**best_params, "baseline": grid(list(space.baselines))}, name="baselines",
                  fifo=True)


# ---------------------------------------------------------------------------------------------- drivers
def run_tune(space: Space, run_dir: Path) -> dict[str, Any]:
    """``python -m raycl.tune``: steps 1–4, then ``results.csv``, ``best.json``, ``report.md`` and plots."""
    run = prepare(space, run_dir)
    t0 = time.perf_counter()
    trials = sweep(run, space)
    run.timings["sweep_s"] = time.perf_counter() - t0
    best = gec_report.best_trial(trials, metric=run.cfg.tune.metric, mode=run.cfg.tune.mode)
    t0 = time.perf_counter()
    extra = baselines(run, space, best.params) if best is not None else []
    run.timings["baselines_s"] = time.perf_counter() - t0
    if best is not None:
        _export_negatives(run, best)
    return gec_report.write_all(run, space, trials, extra)


def run_train(space: Space, run_dir: Path) -> dict[str, Any]:
    """``python -m raycl.train``: steps 1–3 at the space's default point, no sweep."""
    run = prepare(space, run_dir)
    t0 = time.perf_counter()
    out_dir = run.run_dir / "trials" / "train"
    with follow(out_dir, desc="steps 2–3: mine ‖ fine-tune"):
        result = finetune(run, run.cfg, out_dir, name="train", in_tune=False)
    run.timings["finetune_s"] = time.perf_counter() - t0
    if result.error is not None:
        raise result.error
    trial = TrialOutcome("train", {}, read_history(out_dir))
    _export_negatives(run, trial)
    return gec_report.write_all(run, space, [trial], [])


def _export_negatives(run: GecRun, trial: TrialOutcome) -> None:
    """``negatives.parquet`` of the run: those the chosen trial trained on."""
    src = run.run_dir / "trials" / trial.trial_id / "negatives.parquet"
    if src.exists():
        shutil.copyfile(src, run.run_dir / ".negatives.parquet.tmp")
        (run.run_dir / ".negatives.parquet.tmp").replace(run.run_dir / "negatives.parquet")
