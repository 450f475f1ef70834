"""Coherence modelling with contrastive learning, a momentum queue and hard negatives (Jwalapuram, Joty, Lin;
ACL 2022), as SPEC §2 runs it.

The run, read top to bottom::

    1. data      documents → the permuted set (blocks of 10, copies with distinct permutations)   prepare()
    2. model     the preset's encoder + a linear scorer (XLNet: <cls> last)                       base_model()
    3. train     one pass, batch 1: pairwise | contrastive | momentum (λ·L_c + (1−λ)·L_m, queue)  train_one()
                 ‖ miners rank num_rank permutations per item with the freshest published weights
    4. select    dev pairwise accuracy; the test sets (held-out permuted, independent) on the best
    5. report    Table 1 (pairwise / contrastive / full model), Fig. 2a–d                       coherence_report

Hard negatives: the paper's code stops training every 200 items to rank the next 200 items' 50 permutations.
Here the ranking runs in the miner pool while the trainer trains; ``mining.max_staleness = 0`` keeps the paper's
schedule exactly (a chunk is ranked by the weights published at its start), 1 lets the miners rank the next chunk
during this one. The sweep's best point is the full model; the space's ``baselines:`` give Table 1's other rows
and the runs of Fig. 2a (contrastive with and without hard negatives).
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raycl.config import Space, dump_yaml, set_dotted, to_dict
from raycl.configs.coherence import CoherenceConfig
from raycl.data.coherence import (
    CoherenceItem,
    build_permuted_set,
    read_annotations,
    read_documents,
    read_pairs,
    write_pairs_jsonl,
)  # fmt: skip
from raycl.data.coherence_corpus import write_builtin_corpus
from raycl.distributed.miner_pool import MinerFactory
from raycl.distributed.mining_service import MiningService, trial_resources
from raycl.distributed.sweep import TrialOutcome, grid, run_sweep, to_param_space, trial_run_name
from raycl.distributed.trainer import fit
from raycl.errors import UserError, at
from raycl.models.coherence_presets import build_coherence_model
from raycl.recipes import coherence_report
from raycl.recipes.coherence_worker import train_worker
from raycl.recipes.common import best_trial, read_history, say
from raycl.train.progress import follow

BASE_MODEL = "base_model"


@dataclass
class CoherenceRun:
    """What every trial of a run shares."""

    cfg: CoherenceConfig
    run_dir: Path
    base_model: Path
    train_items: Path  # the permuted training set (JSONL), in training order
    builtin: list[str]
    counts: dict[str, int]
    timings: dict[str, float]


# ---------------------------------------------------------------------------------------------- 1. data
def with_data(cfg: CoherenceConfig, data_dir: Path) -> tuple[CoherenceConfig, list[str]]:
    """Fill every empty ``data`` split with the built-in corpus (written once into ``data_dir``)."""
    d = cfg.data
    empty = [k for k in ("train", "dev", "test") if not getattr(d, k)]
    if not empty:
        return cfg, []
    b = d.builtin
    files = write_builtin_corpus(data_dir, seed=b.seed, sizes={"train": b.train, "dev": b.dev, "test": b.test,
                                                               "intrusion": b.intrusion, "lmvlm": b.lmvlm})
    fill: dict[str, Any] = {
        "train": [str(files["train"])], "dev": [str(files["dev"])],
        "test": {"permuted": [str(files["test"])], "intrusion": [str(files["intrusion"])],
                 "lmvlm": [str(files["lmvlm"])]},
    }  # fmt: skip
    new = dataclasses.replace(d, **{k: fill[k] for k in empty})
    if "test" in empty and not d.annotations:
        new = dataclasses.replace(new, annotations={"lmvlm": str(files["lmvlm_annotations"])})
    return dataclasses.replace(cfg, data=new), empty


def _is_documents(path: Path) -> bool:
    """Documents (text, or JSONL with ``sentences``) rather than a pairs file (pickle, or JSONL with ``pos``)."""
    if path.suffix in (".pkl", ".pickle"):
        return False
    if path.suffix != ".jsonl":
        with open(path, "rb") as f:
            return f.read(1) != b"\x80"
    with open(path, encoding="utf-8", errors="replace") as f:
        first = next((line for line in f if line.strip()), "{}")
    try:
        return "sentences" in json.loads(first)
    except json.JSONDecodeError:
        return True  # read_documents names the line


def training_items(cfg: CoherenceConfig) -> list[CoherenceItem]:
    """The training set: documents are permuted as the paper does (each item gets ``max(num_rank, num_negs)``
    distinct candidate negatives, never repeated across the copies of a positive); pairs files are used as
    given. Shuffled once with ``optim.seed`` when ``optim.shuffle`` (the momentum model's ``random.seed(100)``)."""
    p, m = cfg.data.permute, cfg.mining
    items: list[CoherenceItem] = []
    for spec in cfg.data.train:
        path = Path(spec)
        if not path.exists():
            raise UserError(f"{at(path)}: no such file (data.train)")
        if _is_documents(path):
            items += build_permuted_set(read_documents(path), num_negs=max(m.num_rank, m.num_negs),
                                        copies=p.copies, seed=p.seed, min_sentences=p.min_sentences,
                                        block_size=p.block_size, split_over=p.split_over)  # fmt: skip
        else:
            items += read_pairs(path)
    if not items:
        raise UserError(f"data.train: {', '.join(cfg.data.train)} gives no training items (documents need "
                        f"≥ {p.min_sentences} sentences)")
    if cfg.optim.shuffle:
        random.Random(cfg.optim.seed).shuffle(items)
    return items


def check_data(cfg: CoherenceConfig) -> dict[str, int]:
    """Read every evaluation file in the driver: a malformed one fails here (one line, exit 2), not in a worker."""
    counts = {"dev": sum(len(read_pairs(s)) for s in cfg.data.dev)}
    for name, specs in cfg.data.test.items():
        counts[f"test/{name}"] = sum(len(read_pairs(s)) for s in specs)
    for name, path in cfg.data.annotations.items():
        if name not in cfg.data.test:
            raise UserError(f"data.annotations.{name}: no test set named {name!r} (data.test has "
                            f"{', '.join(cfg.data.test) or 'none'})")
        coders = read_annotations(path)
        if len(coders[0]) != counts[f"test/{name}"]:
            raise UserError(f"{at(path)}: {len(coders[0])} labels per coder for {counts[f'test/{name}']} pairs "
                            f"in data.test.{name}, expected one label per pair")
    return counts


def check_inputs(space: Space, run_dir: Path) -> None:
    """Before Ray starts (``raycl.cli``): every data file of the run is read once."""
    cfg, _ = with_data(space.config, run_dir / "data")
    check_data(cfg)
    training_items(cfg)


# ---------------------------------------------------------------------------------------------- 2. model
def base_model(cfg: CoherenceConfig, run_dir: Path, items: list[CoherenceItem]) -> Path:
    """The starting scorer: the preset (a tiny XLNet's tokenizer trained on the training sentences, the offline
    MiniLM, or xlnet-base-cased), ``model.name`` (any encoder) or ``model.checkpoint`` (a trained scorer)."""
    out = run_dir / BASE_MODEL
    if (out / "config.json").exists():
        return out
    from raycl.models.coherence import CoherenceScorer

    source = cfg.model.checkpoint or cfg.model.name
    texts = None if source else sorted({s for it in items for s in it.pos})
    build_coherence_model(cfg.model.preset, out, texts=texts, checkpoint=source, seed=cfg.model.seed)
    scorer = CoherenceScorer.from_pretrained(out, max_len=cfg.model.max_len or None,
                                             mask_padding=cfg.model.mask_padding)  # fmt: skip
    scorer.tokenizer.model_max_length = scorer.max_len + 2  # the text budget plus <sep><cls> (or [CLS] [SEP])
    scorer.save_pretrained(out)
    return out


def prepare(space: Space, run_dir: Path) -> CoherenceRun:
    """Steps 1–2 and the run folder: resolved data, ``config.yaml``, the training items, the base model."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg, builtin = with_data(space.config, run_dir / "data")
    counts = check_data(cfg)  # every file is read before anything is said or run: a bad one ends here
    items = training_items(cfg)
    if builtin:
        say(f"built-in corpus for {', '.join(builtin)} (written to {run_dir / 'data'})")
    counts["train"] = len(items)
    say("data: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    (run_dir / "data").mkdir(exist_ok=True)
    train_items = run_dir / "data" / "train_items.jsonl"
    write_pairs_jsonl(items, train_items)
    dump_yaml(cfg, run_dir / "config.yaml")
    t0 = time.perf_counter()
    model = base_model(cfg, run_dir, items)
    return CoherenceRun(cfg, run_dir, model, train_items, builtin, counts, {"prepare_s": time.perf_counter() - t0})


# ---------------------------------------------------------------------------------------------- 3. train
def mines_while_training(cfg: CoherenceConfig) -> bool:
    return cfg.mining.hard_negatives and cfg.optim.epochs > 0


def train_one(run: CoherenceRun, cfg: CoherenceConfig, out_dir: Path, *, name: str, in_tune: bool,
              chaos: dict[str, Any] | None = None) -> Any:  # fmt: skip
    """One training run in a TorchTrainer; with hard negatives, its own miners rank permutations meanwhile."""
    loop_config: dict[str, Any] = {"config": to_dict(cfg), "init_model": str(run.base_model), "chaos": chaos,
                                   "train_items": str(run.train_items), "out_dir": str(out_dir)}  # fmt: skip
    if not mines_while_training(cfg):
        return fit(train_worker, loop_config, scaling=cfg.scaling, name=name, storage_path=run.run_dir / "ray",
                   in_tune=in_tune)  # fmt: skip
    m = cfg.mining
    # a task waits (up to its lease) for the version of its chunk instead of being ranked with older weights
    factory = MinerFactory("coherence_rank", str(run.base_model), {
        "num_rank": m.num_rank, "num_negs": m.num_negs, "batch_size": m.batch_size, "version_wait_s": m.lease_s})
    service = MiningService.start(factory, m, world_size=max(cfg.scaling.num_workers, 1), seed=cfg.optim.seed)
    try:
        loop_config.update(stream=service.stream, store=service.store)
        return fit(train_worker, loop_config, scaling=cfg.scaling, name=name, storage_path=run.run_dir / "ray",
                   in_tune=in_tune)  # fmt: skip
    finally:
        service.close()


def coherence_trial(params: dict[str, Any], *, run: CoherenceRun, baselines: dict[str, dict[str, Any]]) -> None:
    """One Tune trial: the space's point (plus a named baseline's overrides) trained in a TorchTrainer."""
    over = dict(params)
    name = over.pop("baseline", None)
    if name is not None:
        over.update(baselines[name])
    cfg = set_dotted(run.cfg, over, where="trial")
    name = trial_run_name()
    train_one(run, cfg, run.run_dir / "trials" / name.split("=", 1)[-1], name=name, in_tune=True)


def _sweep(run: CoherenceRun, space: Space, param_space: dict[str, Any], *, name: str) -> list[TrialOutcome]:
    mining = run.cfg.mining if run.cfg.mining.hard_negatives else None
    return run_sweep(coherence_trial, param_space, trial_kwargs={"run": run, "baselines": space.baselines},
                     tune_cfg=run.cfg.tune, name=name, storage_path=run.run_dir / "ray",
                     max_t=max(run.counts["train"] // run.cfg.optim.eval_every, 1),
                     resources=trial_resources(run.cfg.tune.driver_cpus, mining))  # fmt: skip


# ---------------------------------------------------------------------------------------------- drivers
def run_tune(space: Space, run_dir: Path) -> dict[str, Any]:
    """``python -m raycl.tune coherence``: the sweep (the full model), baselines at its best point, the report."""
    run = prepare(space, run_dir)
    say(f"sweep over {', '.join(space.search) or 'the default point'} (trainers ‖ permutation miners)")
    t0 = time.perf_counter()
    trials = _sweep(run, space, to_param_space(space.search), name="sweep")
    run.timings["sweep_s"] = time.perf_counter() - t0
    best = best_trial(trials, metric=run.cfg.tune.metric, mode=run.cfg.tune.mode)
    extra: list[TrialOutcome] = []
    if best is not None and space.baselines:
        say(f"baselines at the best point: {', '.join(space.baselines)}")
        t0 = time.perf_counter()
        fifo = dataclasses.replace(run.cfg.tune, scheduler="fifo")
        run_fifo = dataclasses.replace(run, cfg=dataclasses.replace(run.cfg, tune=fifo))
        extra = _sweep(run_fifo, space, {**best.params, "baseline": grid(list(space.baselines))}, name="baselines")
        run.timings["baselines_s"] = time.perf_counter() - t0
    return coherence_report.write_all(run, space, trials, extra)


def run_train(space: Space, run_dir: Path) -> dict[str, Any]:
    """``python -m raycl.train coherence``: one run at the space's default point, then the report."""
    run = prepare(space, run_dir)
    out_dir = run.run_dir / "trials" / "train"
    t0 = time.perf_counter()
    with follow(out_dir, desc="train ‖ mine"):
        result = train_one(run, run.cfg, out_dir, name="train", in_tune=False)
    run.timings["train_s"] = time.perf_counter() - t0
    if result.error is not None:
        raise result.error
    return coherence_report.write_all(run, space, [TrialOutcome("train", {}, read_history(out_dir))], [])
