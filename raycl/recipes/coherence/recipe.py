"""Coherence modelling with contrastive learning, a momentum queue and hard negatives (Jwalapuram, Joty, Lin;
ACL 2022), as the released code runs it.

The run, as the driver (``raycl.recipes.driver``) runs it with this recipe::

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
import json
import random
from pathlib import Path
from typing import Any

from raycl.config import Space
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
from raycl.distributed.mining_service import trial_resources
from raycl.distributed.sweep import TrialOutcome
from raycl.errors import UserError, at
from raycl.miners.permutation import COHERENCE_RANK
from raycl.models.coherence_presets import build_coherence_model
from raycl.recipes.coherence import report
from raycl.recipes.coherence.worker import CoherenceTask
from raycl.recipes.driver import RecipeBase, Run, TrainPoint, fit_job, miners
from raycl.train.loop import Job


class CoherenceRecipe(RecipeBase):
    task = "coherence"

    def with_data(self, cfg: CoherenceConfig, data_dir: Path) -> tuple[CoherenceConfig, list[str]]:
        return with_data(cfg, data_dir)

    def check_data(self, cfg: CoherenceConfig) -> dict[str, int]:
        counts = check_data(cfg)
        counts["train"] = len(training_items(cfg))
        return counts

    def base_model(self, run: Run) -> None:
        """The permuted training set, written in training order, and the starting scorer."""
        items = training_items(run.cfg)
        (run.run_dir / "data").mkdir(exist_ok=True)
        run.files["train_items"] = run.run_dir / "data" / "train_items.jsonl"
        write_pairs_jsonl(items, run.files["train_items"])
        base_model(run.cfg, run.run_dir, items)

    def train_points(self, run: Run) -> list[TrainPoint]:
        return [TrainPoint("train", {}, "train ‖ mine")]

    def train_one(self, run: Run, cfg: CoherenceConfig, out_dir: Path, *, name: str, in_tune: bool,
                  chaos: dict[str, Any] | None = None) -> Any:  # fmt: skip
        """One training run; with hard negatives, its own miners rank permutations meanwhile."""
        task = CoherenceTask(cfg, str(run.files["train_items"]))
        job = Job(task, str(run.base_model), str(out_dir), chaos=chaos)
        if not mines_while_training(cfg):
            return fit_job(run, cfg, job, name=name, in_tune=in_tune)
        m = cfg.mining
        # a task waits (up to its lease) for the version of its chunk instead of being ranked with older weights
        factory = MinerFactory(COHERENCE_RANK, str(run.base_model), {
            "num_rank": m.num_rank, "num_negs": m.num_negs, "batch_size": m.batch_size,
            "version_wait_s": m.lease_s, "precision": m.precision})  # fmt: skip
        with miners(factory, m, world_size=cfg.scaling.num_workers, seed=cfg.optim.seed) as service:
            return fit_job(run, cfg, dataclasses.replace(job, stream=service.stream, store=service.store),
                           name=name, in_tune=in_tune)  # fmt: skip

    def max_t(self, run: Run) -> int:
        return max(run.counts["train"] // run.cfg.optim.eval_every, 1)

    def trial_resources(self, run: Run) -> Any:
        return trial_resources(run.cfg.tune.driver_cpus, run.cfg.mining if run.cfg.mining.hard_negatives else None)

    def write_report(self, run: Run, space: Space, trials: list[TrialOutcome], extra: list[TrialOutcome]
                     ) -> dict[str, Any]:  # fmt: skip
        return report.write_all(run, space, trials, extra)


def mines_while_training(cfg: CoherenceConfig) -> bool:
    return cfg.mining.hard_negatives and cfg.optim.epochs > 0


# ---------------------------------------------------------------------------------------------- data
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


# ---------------------------------------------------------------------------------------------- model
def base_model(cfg: CoherenceConfig, run_dir: Path, items: list[CoherenceItem]) -> Path:
    """The starting scorer: the preset (a tiny XLNet's tokenizer trained on the training sentences, the offline
    MiniLM, or xlnet-base-cased), ``model.name`` (any encoder) or ``model.checkpoint`` (a trained scorer)."""
    out = run_dir / "base_model"
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
