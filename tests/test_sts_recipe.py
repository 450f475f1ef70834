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
from typing import Any

import pytest
import torch

from raycl import driver
from raycl.config.tasks import load_space
from raycl.data.semeval import read_sts_train
from raycl.models.sentence_encoder import SentenceEncoder, build_sentence_encoder
from raycl.recipes import recipe_for
from raycl.recipes.sts.fits import finetune_pairs
from raycl.report import read_history
from raycl.scoring.semeval_metrics import evaluate_sts
from raycl.training.batching import BatchPlan, Loader

sts = recipe_for("sts")

TINY = [
    "pretrain.epochs=1",
    "finetune.epochs=1",
    "pretrain.eval_every=4",
    "finetune.eval_every=4",
    "moco.queue_size=16",
]


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


def epoch_batches(
    pairs: list[Any], sentences: list[str], *, batch_size: int, seed: int, rank: int, world_size: int
) -> list[tuple[list[Any], list[str]]]:
    """STS's epoch as its task draws it: the batch plan of the pairs and (if any) the sentences, two a rank."""
    loaders = [Loader(len(pairs)), *([Loader(len(sentences), min_rows=2 * world_size)] if sentences else [])]
    plan = BatchPlan(loaders, batch_size=batch_size, seed=seed, rank=rank, world_size=world_size)
    return [([pairs[i] for i in b[0]], [sentences[i] for i in b[1]] if sentences else []) for b in plan]


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
    over = [
        *TINY,
        "scaling.num_workers=0",
        "scaling.cpus_per_worker=0.5",
        "tune.driver_cpus=0.1",
        "finetune.epochs=0",
    ]
    space = load_space("sts", preset="smoke", overrides=over)
    space.search = {"moco.queue_size": {"grid": [8]}}
    del space.baselines["cross_attention"]  # three trials keep the file near its time budget; the demo runs all
    # the refreshed row trains on a Ray Train worker (its miner in the trial's placement group), the sweep's point
    # and the other rows in their trials' own processes (scaling.num_workers=0: no Ray Train processes)
    space.baselines["dense_refreshed"] = {**space.baselines["dense_refreshed"], "scaling.num_workers": 1}
    summary = driver.run_tune(sts, space, tmp_path)
    assert not summary["failed_trials"]
    dense = ["+ InfoNCE (in-batch) + dense negatives", "+ InfoNCE (in-batch) + refreshed dense negatives"]
    assert [r["method"] for r in summary["table"]] == ["MSE only", "+ InfoNCE (in-batch)", "+ MoCo queue", *dense]
    for row in summary["table"]:  # no fine-tuning: the final setting is pre_train
        assert row["dev_spearman"] == pytest.approx(row["dev/pre_train/EN+PT/ALL"])
    report = (tmp_path / "report.md").read_text()
    assert "| MSE only |" in report and "| + MoCo queue |" in report
    plain, mined, fresh = (100 * summary["table"][i]["dev_spearman"] for i in (1, 3, 4))
    assert (
        f"in-batch only {plain:.2f} → pre-mined dense negatives {mined:.2f} ({mined - plain:+.2f}) → "
        f"refreshed dense negatives {fresh:.2f} ({fresh - plain:+.2f})"
    ) in report
    assert [p.parent.name for p in (tmp_path / "mining").glob("*/_report.json")] == ["dense-pool16-score4"]
    # the refreshed row (a Ray Train worker, its miner in the trial's placement group): what its trainer read was
    # mined at most max_staleness (1) versions ago, mostly after version 0 (the pool), every 4 steps (the preset)
    trial = tmp_path / "trials" / summary["table"][4]["trial_id"]
    last = [h for h in read_history(trial) if "refresh/version" in h][-1]
    assert last["refresh/version"] == last["step"] // 4 and last["refresh/rounds_done"] >= 1
    assert 0 <= last["refresh/staleness_max"] <= 1 and last["refresh/duplicates"] == 0
    assert last["refresh/used_refreshed"] > 0 and last["refresh/skipped_stale"] == 0
    assert (trial / "refresh.json").is_file() and not list((trial / "refresh").glob("v*"))
    assert (tmp_path / "dev.submission.csv").exists() and (tmp_path / "align_uniform.png").exists()


def test_a_malformed_csv_ends_in_one_line_before_anything_runs(tmp_path: Path) -> None:
    space = load_space("sts", preset="smoke")
    cfg, _ = sts.with_data(space.config, tmp_path / "data")
    lines = Path(cfg.data.train_data).read_text(encoding="utf-8").splitlines()
    bad = tmp_path / "bad_train.csv"
    bad.write_text("\n".join([*lines[:3], "train.en.99.1,big fish,None,EN,only five fields"]) + "\n")
    out = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "raycl.train",
            "sts",
            "--preset",
            "smoke",
            "--out",
            str(out),
            "--set",
            f"data.train_data={bad}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAY_ADDRESS": ""},
    )
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
    from raycl.recipes.sts.fits import Fit, pair_sentences, warmup_steps

    pairs = [("a x", "b", 1.0), ("a x", "c", 0.5), ("d", "b", 0.2)]
    assert pair_sentences(pairs) == ["a x", "b", "a x", "c", "d", "b"]  # both of every pair, repeats kept
    cfg = load_space("sts").config
    # pre-training: 10% of the contrastive loader (twice the pair loader that ends the epoch) × epochs = 20%
    pre = Fit("pre_train", 30, 250, 4)
    assert warmup_steps(cfg, pre, steps=100 * 30, pair_batches=100, sentence_batches=200) == 600
    # the k-th one-epoch fine-tuning fit: 10% × k of its pair loader, past the fit's length from k = 10 on
    for k, want in ((1, 10), (5, 50), (12, 120)):
        assert (
            warmup_steps(cfg, Fit("fine_tune", 1, 250, 1, k), steps=100, pair_batches=100, sentence_batches=200)
            == want
        )
    raycl_rule = set_dotted(cfg, {"optim.warmup": "steps"}, where="test")
    assert warmup_steps(raycl_rule, pre, steps=3000, pair_batches=100, sentence_batches=200) == 300


def test_a_rank_that_cannot_see_the_pre_trained_model_stops_naming_the_path(tmp_path: Path) -> None:
    """Fine-tuning starts from the model pre-training kept in the run folder; a rank on a node that does not share
    that folder used to start silently from the initial model. It stops, naming the path (issue 18 f)."""
    from raycl.config.tasks.sts import StsConfig
    from raycl.recipes.sts.worker import StsTask
    from raycl.training.precision import Precision
    from raycl.training.task import Job, Worker

    cpu = torch.device("cpu")
    w = Worker(1, 2, cpu, Precision("fp32", cpu), tmp_path / "run", Job(None, str(tmp_path / "init"), ""))
    task = StsTask(StsConfig())
    assert task.cfg.pretrain.epochs > 0
    with pytest.raises(RuntimeError, match=r"pre_train_model: the model that pre_train kept is not there on rank"):
        task._kept(w, "pre_train")
    (tmp_path / "run" / "pre_train_model").mkdir(parents=True)
    (tmp_path / "run" / "pre_train_model" / "config.json").write_text("{}")
    assert task._kept(w, "pre_train") == tmp_path / "run" / "pre_train_model"
    no_pretraining = StsTask(
        dataclasses.replace(StsConfig(), pretrain=dataclasses.replace(StsConfig().pretrain, epochs=0))
    )
    assert (
        no_pretraining._kept(Worker(1, 2, cpu, Precision("fp32", cpu), tmp_path / "other", w.job), "pre_train")
        == tmp_path / "init"
    )  # no pre-training: the initial model


# ---------------------------------------------------------------------------------------------- dense negatives
def test_dense_negatives_are_mined_once_and_a_trials_selection_is_mining_with_its_margin(tmp_path: Path) -> None:
    """``mining.dense``: the training mines a pool with the base encoder into the run folder and trains on it;
    a trial's selection (K, relative margin) from the pool equals ``mine_dense_negatives`` with those settings."""
    from raycl import mine_dense_negatives
    from raycl.miners.dense_io import read_anchor_negatives as read_negatives
    from raycl.recipes.sts.negatives import checked_pairs

    space = load_space(
        "sts",
        preset="smoke",
        overrides=[*TINY, "scaling.num_workers=0", "finetune.epochs=0", "mining.dense=true", "mining.pool=8"],
    )
    summary = driver.run_train(sts, space, tmp_path)
    assert summary["best"]["dev_spearman"] is not None
    pool = read_negatives(tmp_path / "mining" / "dense-pool8-score4")
    cfg = space.config
    rows, corpus = checked_pairs(
        dataclasses.replace(
            cfg,
            data=dataclasses.replace(
                cfg.data, sts_pretrain=[str(p) for p in sorted((tmp_path / "data").rglob("*sts*.csv"))]
            ),
        )
    )
    assert rows and set(pool) <= {r["anchor"] for r in rows} and len(pool) > len(rows) // 2
    assert all(
        len(v.negatives) <= 8 and v.scores == tuple(sorted(v.scores or (), reverse=True)) for v in pool.values()
    )
    m = dataclasses.replace(cfg.mining, num_negatives=2, relative_margin=0.05)
    direct = mine_dense_negatives(
        rows,
        str(tmp_path / "base_model"),
        "anchor",
        "positive",
        corpus=corpus,
        num_negatives=2,
        relative_margin=0.05,
        range_max=8,
        output_format="triplet",
        verbose=False,
        num_miners=0,
    )
    want: dict[str, list[str]] = {}
    for r in direct:
        if r["negative"] not in want.setdefault(r["anchor"], []):
            want[r["anchor"]].append(r["negative"])
    got = {a: n for a, v in pool.items() if (n := v.select(m))}
    assert got == want and any(
        len(v.select(m)) < len(v.select(dataclasses.replace(m, relative_margin=None))) for v in pool.values()
    )  # the margin dropped some


def _negatives_file(path: Path, rows: list[dict[str, object]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_pre_mined_negatives_in_every_format_and_bad_ones_in_one_line(tmp_path: Path) -> None:
    from raycl.errors import UserError
    from raycl.miners.dense_io import read_anchor_negatives as read_negatives
    from raycl.training.negatives.dense import check_pool

    triplets = _negatives_file(
        tmp_path / "t.parquet",
        [
            {"anchor": "a", "positive": "p", "negative": "x", "scores": [0.8, 0.9]},
            {"anchor": "a", "positive": "p", "negative": "y", "scores": [0.8, 0.5]},
            {"anchor": "a", "positive": "q", "negative": "x", "scores": [0.6, 0.9]},  # a second, harder positive
            {"anchor": "b", "positive": "r", "negative": "z", "scores": [-0.2, -0.21]},
            {"anchor": "b", "positive": "r", "negative": "w", "scores": [-0.2, -0.4]},
        ],
    )
    got = read_negatives(triplets)
    assert got["a"].negatives == ("x", "y") and got["a"].positive_score == pytest.approx(0.6)
    cfg = load_space(
        "sts", overrides=["mining.dense=true", f"mining.negatives={triplets}", "mining.relative_margin=0.1"]
    ).config
    # a: p = 0.6 keeps s ≤ 0.54 (y only); b: p = −0.2 keeps s ≤ −0.22 (|p|, not p: −0.18 would keep z)
    assert got["a"].select(cfg.mining) == ["y"] and got["b"].select(cfg.mining) == ["w"]
    for m, a, b in ((0.05, ["y"], ["w"]), (0.15, [], ["w"]), (0.25, [], [])):  # keeps s ≤ p − m
        absolute = dataclasses.replace(cfg.mining, relative_margin=None, absolute_margin=m)
        assert (got["a"].select(absolute), got["b"].select(absolute)) == (a, b)
    assert check_pool(cfg.mining) == 2
    ntuple = _negatives_file(
        tmp_path / "n.parquet", [{"anchor": "a", "positive": "p", "negative_1": "x", "negative_2": "y"}]
    )
    listed = _negatives_file(
        tmp_path / "l.parquet", [{"anchor": "a", "positive": ["p", "x", "y"], "labels": [1, 0, 0]}]
    )
    for path in (ntuple, listed):
        assert read_negatives(path)["a"].negatives == ("x", "y") and read_negatives(path)["a"].scores is None
    with pytest.raises(UserError, match=r"n.parquet: no scores, expected them with mining.relative_margin"):
        check_pool(dataclasses.replace(cfg.mining, negatives=str(ntuple)))
    pairs = _negatives_file(tmp_path / "p.parquet", [{"anchor": "a", "text": "x", "label": 0}])
    with pytest.raises(UserError, match=r"p.parquet: columns anchor, text, label: expected a negative"):
        read_negatives(pairs)
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(UserError, match=r"bad.parquet: not a readable Parquet file"):
        read_negatives(tmp_path / "bad.parquet")
    with pytest.raises(UserError, match=r"mining.negatives: .*nowhere: expected a Parquet file or a folder"):
        read_negatives(tmp_path / "nowhere")


def test_the_step_adds_each_sentences_mined_negatives_to_its_denominator(tmp_path: Path) -> None:
    """Collate gives each contrastive sentence its own negatives (padded, each text once); the step's L_con is the
    loss with them (dropout off: the views are equal), strictly above the in-batch one."""
    from raycl.losses.infonce_queue import InfoNCEQueueLoss
    from raycl.recipes.sts.step import contrastive_loss
    from raycl.recipes.sts.worker import StsState, StsTask
    from raycl.training.negatives.dense import DensePool

    enc = SentenceEncoder.from_pretrained(
        build_sentence_encoder("smoke", tmp_path / "m", texts=["a b c", "d e f", "g h", "x y", "z w"] * 4, seed=0)
    ).eval()
    mined = {"a b c": ["x y", "z w"], "g h": ["x y"]}
    cfg = load_space("sts", preset="smoke", overrides=["moco.queue_size=0"]).config
    task, st = StsTask(cfg), StsState(enc, [], [], {}, source=DensePool(mined))  # the pool's selection
    sentences = ["a b c", "d e f", "g h"]
    batch = task.collate(st, ("con", [], sentences))
    assert batch.negatives is not None and batch.negatives.index.tolist() == [[0, 1], [-1, -1], [0, -1]]
    loss, _ = contrastive_loss(cfg, enc, st.moco, batch)
    with torch.no_grad():
        h, n = enc.encode(sentences), enc.encode(["x y", "z w"])
    negatives = torch.stack([n, n, n])  # (B, K, H), masked where index is −1
    want = InfoNCEQueueLoss(temperature=cfg.loss.temperature)(h, h, None, negatives, batch.negatives.index >= 0)
    assert loss.item() == pytest.approx(want.loss.item(), rel=1e-5)
    plain, _ = contrastive_loss(cfg, enc, None, task.collate(StsState(enc, [], [], {}), ("con", [], sentences)))
    assert loss.item() > plain.item()


def test_a_sweep_over_the_margin_and_the_count_is_checked_like_any_key(tmp_path: Path) -> None:
    from raycl.errors import UserError

    text = (Path(__file__).parents[1] / "tune_spaces" / "sts.yaml").read_text(encoding="utf-8")
    good = tmp_path / "good.yaml"
    good.write_text(
        text.replace(
            "search:",
            "search:\n  mining.relative_margin: {grid: [0.0, 0.05]}\n  mining.num_negatives: {grid: [1, 3]}",
            1,
        )
    )
    space = load_space(str(good), overrides=["mining.dense=true"])
    assert space.search["mining.num_negatives"] == {"grid": [1, 3]}
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("search:", "search:\n  mining.relative_margin: {grid: [0.05, 1.5]}", 1))
    with pytest.raises(UserError, match=r"relative_margin': expected a number in \[0, 1\] or null, got 1.5"):
        load_space(str(bad))
    with pytest.raises(UserError, match=r"mining.num_negatives': expected at most mining.pool \(16\)"):
        load_space("sts", overrides=["mining.num_negatives=17"])


def test_bad_pre_mined_negatives_end_in_one_line_before_anything_runs(tmp_path: Path) -> None:
    out, missing = tmp_path / "run", tmp_path / "no_negatives"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "raycl.train",
            "sts",
            "--preset",
            "smoke",
            "--out",
            str(out),
            "--set",
            "mining.dense=true",
            "--set",
            f"mining.negatives={missing}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAY_ADDRESS": ""},
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().count("\n") == 0
    assert f"mining.negatives: {missing}: expected a Parquet file or a folder of Parquet shards" in done.stderr
    assert not (out / "ray").exists() and not (out / "base_model").exists()
