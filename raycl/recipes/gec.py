"""GEC with contrastive learning in low error density domains (Cao, Yang, Ng; Findings of EMNLP 2021).

Algorithm 1, as this module runs it (each step is one function below, read top to bottom)::

    1. θ̂    ← train the base model on D_T (label-smoothed NLL)        pretrain()     (or model.checkpoint)
    2. D_F̃  ← beam-search n-best of θ̂ on D_F                          mine_nbest()   (model version 0)
    3. θ̂_CL ← fine-tune on D_F̃ with Eq. 5, one Tune trial per point     sweep()        (γ, k from the space)
    4. select on dev F0.5 (annotator-averaged), report test            baselines() + write_report()

Every trial keeps the top-k distinct n-best outputs ≠ target (+ the source for CL) from the same n-best list, so
one mining pass serves the whole (γ, k) grid. The baselines of Table 2 — DI (base model, no fine-tuning), NLL
(λ = 0) and CL⁻ (no source negative) — run at the best CL point.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raycl.config import GecConfig, Space, dump_yaml, set_dotted, to_dict
from raycl.data.gec import load_examples, load_references
from raycl.data.gec_corpus import write_builtin_corpus
from raycl.distributed.sweep import TrialOutcome, grid, run_sweep, to_param_space, trial_run_name
from raycl.distributed.trainer import fit
from raycl.errors import UserError
from raycl.miners.beam_search import BeamSearchMiner, read_negatives_parquet, write_negatives_parquet
from raycl.models.presets import build_model
from raycl.models.seq2seq import Seq2SeqScorer
from raycl.recipes import gec_report
from raycl.recipes.gec_worker import read_history, train_worker
from raycl.train.progress import follow

BASE_MODEL = "base_model"
NBEST = "nbest.parquet"


@dataclass
class GecRun:
    """The artefacts every trial of a run shares."""

    cfg: GecConfig
    run_dir: Path
    base_model: Path
    nbest: Path | None
    builtin: list[str]  # the splits filled with the built-in corpus
    timings: dict[str, float]


def say(msg: str) -> None:
    print(f"[raycl] {msg}", file=sys.stderr, flush=True)


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


# ---------------------------------------------------------------------------------------------- step 2
def mine_nbest(cfg: GecConfig, base_model: Path, run_dir: Path) -> Path | None:
    """Step 2: the base model's beam-search n-best on D_F (beam ``mining.beam``), written once as Parquet."""
    if cfg.mining.negatives:
        return None  # pre-mined negatives are used as given
    out = run_dir / NBEST
    if out.exists():
        say(f"step 2: reusing the n-best lists in {out}")
        return out
    examples = load_examples(cfg.data.finetune, annotator=cfg.data.annotator)
    say(f"step 2: mining {len(examples)} sentences of D_F with beam {cfg.mining.beam}")
    scorer = Seq2SeqScorer.from_pretrained(base_model)
    miner = BeamSearchMiner(scorer, k=cfg.mining.beam - 1, beam=cfg.mining.beam, source_negative=False,
                            batch_size=cfg.mining.batch_size, max_new_tokens=cfg.eval.max_new_tokens)  # fmt: skip
    nbest = miner.nbest(examples, progress=True)
    write_negatives_parquet(out, examples, nbest, model_version=0)
    return out


# ---------------------------------------------------------------------------------------------- step 3
def prepare(space: Space, run_dir: Path) -> GecRun:
    """Steps 1–2 plus the run folder: resolved data, ``config.yaml``, base model, n-best lists."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg, builtin = with_data(space.config, run_dir / "data")
    if builtin:
        say(f"built-in corpus for {', '.join(builtin)} (written to {run_dir / 'data'})")
    counts = check_data(cfg)
    say("data: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    dump_yaml(cfg, run_dir / "config.yaml")
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    base = pretrain(cfg, run_dir)
    timings["pretrain_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    nbest = mine_nbest(cfg, base, run_dir)
    timings["mine_s"] = time.perf_counter() - t0
    return GecRun(cfg, run_dir, base, nbest, builtin, timings)


def _loop_config(run: GecRun, cfg: GecConfig, out_dir: Path) -> dict[str, Any]:
    return {"config": to_dict(cfg), "phase": "finetune", "init_model": str(run.base_model),
            "nbest": str(run.nbest) if run.nbest else None, "out_dir": str(out_dir)}  # fmt: skip


def gec_trial(params: dict[str, Any], *, run: GecRun, baselines: dict[str, dict[str, Any]]) -> None:
    """One Tune trial: the space's point (plus a named baseline's overrides) fine-tuned in a TorchTrainer."""
    over = dict(params)
    name = over.pop("baseline", None)
    if name is not None:
        over.update(baselines[name])
    cfg = set_dotted(run.cfg, over, where="trial")
    name = trial_run_name()
    out_dir = run.run_dir / "trials" / name.split("=", 1)[-1]
    fit(train_worker, _loop_config(run, cfg, out_dir), scaling=cfg.scaling, name=name,
        storage_path=run.run_dir / "ray", in_tune=True)  # fmt: skip


def sweep(run: GecRun, space: Space) -> list[TrialOutcome]:
    """Step 3 over the ``search:`` block: one trial per point of the paper's grid (or the preset's)."""
    param_space = to_param_space(space.search)
    say(f"step 3: fine-tuning sweep over {', '.join(param_space) or 'the default point'}")
    return run_sweep(gec_trial, param_space, trial_kwargs={"run": run, "baselines": space.baselines},
                     tune_cfg=run.cfg.tune, name="sweep", storage_path=run.run_dir / "ray",
                     max_t=run.cfg.optim.epochs)  # fmt: skip


def baselines(run: GecRun, space: Space, best_params: dict[str, Any]) -> list[TrialOutcome]:
    """Table 2's other rows at the best CL point: DI, NLL, CL⁻ (the space's ``baselines:``)."""
    if not space.baselines:
        return []
    say(f"baselines at the best point: {', '.join(space.baselines)}")
    param_space = {**best_params, "baseline": grid(list(space.baselines))}
    cfg = dataclasses.replace(run.cfg, tune=dataclasses.replace(run.cfg.tune, scheduler="fifo"))
    return run_sweep(gec_trial, param_space, trial_kwargs={"run": run, "baselines": space.baselines},
                     tune_cfg=cfg.tune, name="baselines", storage_path=run.run_dir / "ray",
                     max_t=cfg.optim.epochs)  # fmt: skip


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
        _export_negatives(run, best.params)
    return gec_report.write_all(run, space, trials, extra)


def run_train(space: Space, run_dir: Path) -> dict[str, Any]:
    """``python -m raycl.train``: steps 1–3 at the space's default point, no sweep."""
    run = prepare(space, run_dir)
    t0 = time.perf_counter()
    out_dir = run.run_dir / "trials" / "train"
    with follow(out_dir, desc="step 3: fine-tune"):
        result = fit(train_worker, _loop_config(run, run.cfg, out_dir), scaling=run.cfg.scaling, name="train",
                     storage_path=run.run_dir / "ray")  # fmt: skip
    run.timings["finetune_s"] = time.perf_counter() - t0
    if result.error is not None:
        raise result.error
    trial = TrialOutcome("train", {}, read_history(out_dir))
    _export_negatives(run, {})
    return gec_report.write_all(run, space, [trial], [])


def _export_negatives(run: GecRun, params: dict[str, Any]) -> None:
    """``negatives.parquet``: the negatives the chosen point trained on (its k, CL or CL⁻), with scores."""
    if run.nbest is None:
        return
    cfg = set_dotted(run.cfg, params, where="best point")
    examples = load_examples(cfg.data.finetune, annotator=cfg.data.annotator)
    nbest = read_negatives_parquet(run.nbest)
    scorer = Seq2SeqScorer.from_pretrained(run.base_model)
    miner = BeamSearchMiner(scorer, k=cfg.mining.k, beam=cfg.mining.beam,
                            source_negative=cfg.mining.source_negative, batch_size=cfg.mining.batch_size)
    mined = miner.select([nbest[ex.id] for ex in examples], examples)
    write_negatives_parquet(run.run_dir / "negatives.parquet", examples, mined, model_version=0)
