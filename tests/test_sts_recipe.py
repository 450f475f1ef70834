"""The Subtask B recipe end to end, tiny: an in-process run whose submissions the official scorer reads, the
fine-tuning labels of 'None' rows, the epoch's batches, a Tune sweep with Table 5's ladder, and a malformed CSV
that ends in one line before anything runs."""

from __future__ import annotations

import csv
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from raycl import driver
from raycl.configs import load_space
from raycl.data.semeval import read_sts_train
from raycl.evaluation.semeval_metrics import evaluate_sts
from raycl.models.sentence_encoder import SentenceEncoder, build_sentence_encoder
from raycl.recipes import recipe_for
from raycl.recipes.sts.worker import epoch_batches, finetune_pairs
from raycl.report import read_history

sts = recipe_for("sts")

TINY = ["pretrain.epochs=1", "finetune.epochs=1", "pretrain.eval_every=4", "finetune.eval_every=4",
        "moco.queue_size=16"]  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _rows(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_run_train_writes_submissions_the_official_scorer_reads(tmp_path: Path) -> None:
    space = load_space("sts", preset="smoke", overrides=[*TINY, "scaling.num_workers=0"])
    summary = driver.run_train(sts, space, tmp_path)
    data = tmp_path / "data" / "SubTaskB"
    for split in ("dev", "eval"):
        sub, fmt = _rows(tmp_path / f"{split}.submission.csv"), _rows(data / f"{split}.submission_format.csv")
        assert [r[:3] for r in sub] == [r[:3] for r in fmt]  # the format file's rows, in its order
        assert all(-1.0 <= float(r[3]) <= 1.0 for r in sub[1:])  # every cell filled with a cosine
        scores = evaluate_sts(tmp_path / f"{split}.submission.csv", data / f"{split}.gold.csv")
        assert set(scores) == {"pre_train", "fine_tune"}
        prefix = "dev" if split == "dev" else "test"
        for setting, by_lang in scores.items():
            for subset, rho in by_lang["EN,PT"].items():
                assert rho is not None
                assert summary["best"][f"{prefix}/{setting}/EN+PT/{subset}"] == pytest.approx(rho)
    best = summary["best"]
    assert best["dev_spearman"] == pytest.approx(best["dev/fine_tune/EN+PT/ALL"])  # the final setting's ALL
    assert {"align/pre_train", "uniform/pre_train", "align/fine_tune", "uniform/fine_tune"} <= set(best)
    history = read_history(tmp_path / "trials" / "train")
    settings = [h["setting"] for h in history[:-1]]
    n_pre, n_fine = settings.count("pre_train"), settings.count("fine_tune")
    assert n_pre > 0 and n_fine > 0 and settings == ["pre_train"] * n_pre + ["fine_tune"] * n_fine
    assert history[-1]["final"] == 1 and [h["report"] for h in history] == list(range(1, len(history) + 1))
    for name in ("report.md", "results.csv", "best.json", "config.yaml", "align_uniform.png", "dev_curves.png"):
        assert (tmp_path / name).exists(), name
    assert "Table 5" in (tmp_path / "report.md").read_text()


def test_none_rows_are_labelled_by_the_pretrained_models_cosine(tmp_path: Path) -> None:
    space = load_space("sts", preset="smoke", overrides=["scaling.num_workers=0"])
    cfg, _ = sts.with_data(space.config, tmp_path / "data")
    rows = read_sts_train(cfg.data.train_data)
    texts = [s for r in rows for s in (r.sentence1, r.sentence2)]
    enc = SentenceEncoder.from_pretrained(build_sentence_encoder("smoke", tmp_path / "m", texts=texts, seed=3))
    enc.eval()
    pairs = finetune_pairs(cfg, enc)
    assert len(pairs) == len(rows)
    with torch.no_grad():
        for row, (a, b, label) in zip(rows, pairs, strict=True):
            assert (a, b) == row.tokenised()
            if row.sim is not None:
                assert label == row.sim
                continue
            u, v = enc.pair_embeddings([row.alternative_1], [row.alternative_2])  # one pair at a time
            dot = sum(x * y for x, y in zip(u[0].tolist(), v[0].tolist(), strict=True))
            norm = (sum(x * x for x in u[0].tolist()) * sum(y * y for y in v[0].tolist())) ** 0.5
            assert label == pytest.approx(dot / norm, abs=1e-4)
    assert any(r.sim is None for r in rows)


def test_epoch_batches_give_every_rank_the_same_steps_and_end_with_the_shorter_loader() -> None:
    pairs = [(f"a{i}", f"b{i}", 0.5) for i in range(23)]
    sentences = [f"s{i}" for i in range(9)]
    shards = [epoch_batches(pairs, sentences, batch_size=4, seed=1, rank=r, world_size=2) for r in range(2)]
    assert [len(s) for s in shards] == [1, 1]  # 4 sentences per rank: one contrastive batch, so one step
    assert not {p for b, _ in shards[0] for p in b} & {p for b, _ in shards[1] for p in b}  # disjoint shards
    mse_only = epoch_batches(pairs, [], batch_size=4, seed=1, rank=0, world_size=2)
    assert [len(b) for b, s in mse_only] == [4, 4, 4] and all(s == [] for _, s in mse_only)  # 12 of 23 pairs
    other = epoch_batches(pairs, [], batch_size=4, seed=1, rank=1, world_size=2)
    one = epoch_batches(pairs, [], batch_size=8, seed=1, rank=0, world_size=1)  # one worker, twice the batch
    assert [a + b for (a, _), (b, _) in zip(mse_only, other, strict=True)] != []
    assert [set(a) | set(b) for (a, _), (b, _) in zip(mse_only, other, strict=True)] == [set(b) for b, _ in one]


def test_tune_sweep_runs_table_5s_ladder(ray_local, tmp_path: Path) -> None:
    over = [*TINY, "scaling.cpus_per_worker=0.5", "tune.driver_cpus=0.1", "finetune.epochs=0"]
    space = load_space("sts", preset="smoke", overrides=over)
    space.search = {"moco.queue_size": {"grid": [8]}}
    del space.baselines["cross_attention"]  # three trials keep the file near its time budget; the demo runs all
    summary = driver.run_tune(sts, space, tmp_path)
    assert not summary["failed_trials"]
    assert [r["method"] for r in summary["table"]] == ["MSE only", "+ InfoNCE (in-batch)", "+ MoCo queue"]
    for row in summary["table"]:  # no fine-tuning: the final setting is pre_train
        assert row["dev_spearman"] == pytest.approx(row["dev/pre_train/EN+PT/ALL"])
    report = (tmp_path / "report.md").read_text()
    assert "| MSE only |" in report and "| + MoCo queue |" in report
    assert (tmp_path / "dev.submission.csv").exists() and (tmp_path / "align_uniform.png").exists()


def test_a_malformed_csv_ends_in_one_line_before_anything_runs(tmp_path: Path) -> None:
    space = load_space("sts", preset="smoke")
    cfg, _ = sts.with_data(space.config, tmp_path / "data")
    lines = Path(cfg.data.train_data).read_text(encoding="utf-8").splitlines()
    bad = tmp_path / "bad_train.csv"
    bad.write_text("\n".join([*lines[:3], "train.en.99.1,big fish,None,EN,only five fields"]) + "\n")
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "raycl.train", "sts", "--preset", "smoke", "--out", str(out),
                           "--set", f"data.train_data={bad}"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAY_ADDRESS": ""})  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().count("\n") == 0
    assert f"{bad}:4: 5 fields, expected 9" in done.stderr  # header, two rows, then the bad one
    assert not (out / "ray").exists() and not (out / "base_model").exists()


def test_the_paper_preset_is_the_released_schedule() -> None:
    """alternate (an AdamW per objective), 29 one-epoch fine-tuning fits, the released warm-up rule."""
    from raycl.errors import UserError

    cfg = load_space("sts").config
    assert (cfg.loss.joint, cfg.finetune.epochs, cfg.optim.warmup) == ("alternate", 29, "released")
    with pytest.raises(UserError, match="optim.update_freq"):
        load_space("sts", overrides=["optim.update_freq=2"])
    assert load_space("sts", overrides=["optim.update_freq=2", "loss.joint=sum"]).config.optim.update_freq == 2


def test_released_warmup_and_the_contrastive_pool() -> None:
    from raycl.config import set_dotted
    from raycl.recipes.sts.worker import Fit, pair_sentences, warmup_steps

    pairs = [("a x", "b", 1.0), ("a x", "c", 0.5), ("d", "b", 0.2)]
    assert pair_sentences(pairs) == ["a x", "b", "a x", "c", "d", "b"]  # both of every pair, repeats kept
    cfg = load_space("sts").config
    # pre-training: 10% of the contrastive loader (twice the pair loader that ends the epoch) × epochs = 20%
    pre = Fit("pre_train", 30, 250, 4)
    assert warmup_steps(cfg, pre, steps=100 * 30, pair_batches=100, sentence_batches=200) == 600
    # the k-th one-epoch fine-tuning fit: 10% × k of its pair loader, past the fit's length from k = 10 on
    for k, want in ((1, 10), (5, 50), (12, 120)):
        assert warmup_steps(cfg, Fit("fine_tune", 1, 250, 1, k), steps=100, pair_batches=100,
                            sentence_batches=200) == want  # fmt: skip
    raycl_rule = set_dotted(cfg, {"optim.warmup": "steps"}, where="test")
    assert warmup_steps(raycl_rule, pre, steps=3000, pair_batches=100, sentence_batches=200) == 300


def test_a_rank_that_cannot_see_the_pre_trained_model_stops_naming_the_path(tmp_path: Path) -> None:
    """Fine-tuning starts from the model pre-training kept in the run folder; a rank on a node that does not share
    that folder used to start silently from the initial model. It stops, naming the path (issue 18 f)."""
    from raycl.configs.sts import StsConfig
    from raycl.recipes.sts.worker import StsTask
    from raycl.training.loop import Job, Worker
    from raycl.training.precision import Precision

    cpu = torch.device("cpu")
    w = Worker(1, 2, cpu, Precision("fp32", cpu), tmp_path / "run", Job(None, str(tmp_path / "init"), ""))
    task = StsTask(StsConfig())
    assert task.cfg.pretrain.epochs > 0
    with pytest.raises(RuntimeError, match=r"pre_train_model: the model that pre_train kept is not there on rank"):
        task._kept(w, "pre_train")
    (tmp_path / "run" / "pre_train_model").mkdir(parents=True)
    (tmp_path / "run" / "pre_train_model" / "config.json").write_text("{}")
    assert task._kept(w, "pre_train") == tmp_path / "run" / "pre_train_model"
    no_pretraining = StsTask(dataclasses.replace(StsConfig(), pretrain=dataclasses.replace(StsConfig().pretrain,
                                                                                           epochs=0)))  # fmt: skip
    assert no_pretraining._kept(Worker(1, 2, cpu, Precision("fp32", cpu), tmp_path / "other", w.job),
                                "pre_train") == tmp_path / "init"  # no pre-training: the initial model
