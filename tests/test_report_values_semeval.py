"""Issue 43 item 9 for the SemEval-2022 Task 2 recipes: every number the idiom (Tables 3–4, the run's official
scores, the sweep) and STS (Table 5, alignment/uniformity, the sweep) reports print, recomputed in the test.

As in ``test_report_values.py``: trials built by hand, the report rendered without Ray or a model, each cell
compared with a plain-loop recomputation — the trial a setting keeps (best closing dev score, the earliest trial
on a tie), percentages with two decimals, ℓ_align/ℓ_uniform with three, and the official macro-F1 of the run's
merged submission computed from per-class counts on the gold CSV read here with ``csv``.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path
from typing import Any

from report_tables import macro_f1, percent, tables

from raycl.config.tasks import load_space
from raycl.driver import Run
from raycl.recipes import recipe_for
from raycl.records import TrialOutcome

# ------------------------------------------------------------------------------------------------ idiom
SETTINGS_A = ("zero_shot", "one_shot")
NAMES_A = {"zero_shot": "zero-shot", "one_shot": "one-shot"}


def _ids(path: str) -> list[tuple[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return [(r["ID"], r["Language"]) for r in csv.DictReader(f)]


def _idiom_trial(
    tid: str,
    params: dict[str, Any],
    rng: random.Random,
    run: Run,
    dev_f1: float,
    inputs: dict[str, list[tuple[str, str]]],
) -> tuple[TrialOutcome, dict[str, dict[str, int]]]:
    """A finished trial: two epoch reports, its closing report, and its submission files (random labels)."""
    setting = params["data.setting"]
    final: dict[str, Any] = {
        "final": 1,
        "setting": setting,
        "best_epoch": float(rng.randrange(1, 4)),
        "dev_f1": dev_f1,
    }
    final |= {
        f"{p}/{lang}": round(rng.uniform(0.3, 0.9), 4) for p in ("dev_f1", "test_f1") for lang in ("EN", "PT")
    }
    final["test_f1"] = round(rng.uniform(0.3, 0.9), 4)
    history = [{"epoch": e, "dev_f1": round(rng.uniform(0.3, 0.9), 4)} for e in (1, 2)] + [final]
    labels: dict[str, dict[str, int]] = {}
    folder = run.run_dir / "trials" / tid
    folder.mkdir(parents=True)
    for split, rows in inputs.items():
        labels[split] = {i: rng.randrange(2) for i, _ in rows}
        with open(folder / f"{split}.submission.csv", "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["ID", "Language", "Setting", "Label"])
            w.writerows([i, lang, setting, labels[split][i]] for i, lang in rows)
    return TrialOutcome(tid, params, history), labels


def _idiom_run(tmp_path: Path) -> tuple[Run, Any, list[TrialOutcome], list[TrialOutcome], dict[str, Any]]:
    space = load_space("idiom", preset="smoke")
    cfg, _ = recipe_for("idiom").with_data(space.config, tmp_path / "data")
    run = Run(
        cfg=cfg,
        run_dir=tmp_path / "run",
        base_model=tmp_path / "base",
        builtin=["dev"],
        counts={"dev": 10},
        timings={"tune_s": 4.56},
    )
    run.run_dir.mkdir()
    inputs = {"dev": _ids(cfg.data.dev), "eval": _ids(cfg.data.eval)}
    rng = random.Random(11)
    for gold in (cfg.data.dev_gold, cfg.data.eval_gold):  # unbalanced labels: macro-F1 ≠ weighted or micro F1
        with open(gold, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        with open(gold, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows({**r, "Label": int(rng.random() < 0.3)} for r in rows)
    labels: dict[str, Any] = {}
    trials, extra = [], []
    sweep = [
        ("z1", "zero_shot", 2e-5, 0.7),
        ("z2", "zero_shot", 3e-5, 0.7),
        ("z3", "zero_shot", 5e-5, 0.6),
        ("o1", "one_shot", 2e-5, 0.5),
        ("o2", "one_shot", 3e-5, 0.8),
    ]  # z1, z2 tie: z1 is kept
    for tid, setting, lr, dev in sweep:
        t, labels[tid] = _idiom_trial(tid, {"data.setting": setting, "optim.lr": lr}, rng, run, dev, inputs)
        trials.append(t)
    for name in ("fgm", "baseline"):  # listed in the space's order (baseline first), whatever order they ran
        for setting in SETTINGS_A:
            tid = f"{name}_{setting}"
            t, labels[tid] = _idiom_trial(
                tid, {"baseline": name, "data.setting": setting}, rng, run, round(rng.uniform(0.3, 0.6), 4), inputs
            )
            extra.append(t)
    return run, space, trials, extra, labels


def _final(t: TrialOutcome) -> dict[str, Any]:
    return [r for r in t.history if r.get("final") == 1][-1]


def _kept(trials: list[TrialOutcome], setting: str) -> TrialOutcome:
    """The setting's trial with the best closing dev F1; the first one on a tie."""
    best = None
    for t in trials:
        if _final(t)["setting"] == setting and (best is None or _final(t)["dev_f1"] > _final(best)["dev_f1"]):
            best = t
    assert best is not None
    return best


def test_idiom_report_tables_3_4_and_the_sweep(tmp_path: Path) -> None:
    from raycl.recipes.idiom.report import REPORT

    run, space, trials, extra, _ = _idiom_run(tmp_path)
    REPORT.write_all(run, space, trials, extra)
    got = tables((run.run_dir / "report.md").read_text())
    kept = {s: _kept(trials, s) for s in SETTINGS_A}
    assert kept["zero_shot"].trial_id == "z1"
    ladder = [
        ("baseline", {s: next(t for t in extra if t.trial_id == f"baseline_{s}") for s in SETTINGS_A}),
        ("+ EMA + FGM", {s: next(t for t in extra if t.trial_id == f"fgm_{s}") for s in SETTINGS_A}),
        ("sweep best", kept),
    ]
    main, per_language = got["Strategy"], got["Strategy#2"]
    assert [r["Strategy"] for r in main] == [r["Strategy"] for r in per_language] == [n for n, _ in ladder]
    for (_, by_setting), cells, lang_cells in zip(ladder, main, per_language, strict=True):
        for s, t in by_setting.items():
            f = _final(t)
            assert cells[f"{NAMES_A[s]} dev"] == percent(f["dev_f1"]), t.trial_id
            assert cells[f"{NAMES_A[s]} test"] == percent(f["test_f1"]), t.trial_id
            for lang in ("EN", "PT"):
                assert lang_cells[f"{NAMES_A[s]} {lang}"] == percent(f[f"dev_f1/{lang}"]), (t.trial_id, lang)
    sweep = got["setting"]
    assert [r["setting"] for r in sweep] == [_final(t)["setting"] for t in trials]
    for t, cells in zip(trials, sweep, strict=True):
        f = _final(t)
        assert cells["point"] == f"optim.lr={t.params['optim.lr']}"
        assert cells["best epoch"] == str(int(f["best_epoch"]))
        assert (cells["dev"], cells["test"]) == (percent(f["dev_f1"]), percent(f["test_f1"]))


def test_idiom_report_official_scores_of_the_merged_submission(tmp_path: Path) -> None:
    """The run's dev/eval submissions take each setting's rows from its kept trial; their official macro-F1 per
    setting and language set is recomputed from the trials' labels and the gold CSV."""
    from raycl.recipes.idiom.report import REPORT

    run, space, trials, extra, labels = _idiom_run(tmp_path)
    REPORT.write_all(run, space, trials, extra)
    got = tables((run.run_dir / "report.md").read_text())
    kept = {s: _kept(trials, s).trial_id for s in SETTINGS_A}
    for split, table, gold_path in (
        ("dev", "zero-shot EN", run.cfg.data.dev_gold),
        ("eval", "zero-shot EN#2", run.cfg.data.eval_gold),
    ):
        with open(gold_path, newline="", encoding="utf-8") as f:
            gold = [(r["ID"], r["Language"], int(r["Label"])) for r in csv.DictReader(f)]
        [cells] = got[table]
        for s in SETTINGS_A:
            pred = labels[kept[s]][split]
            for langs, head in ((("EN",), "EN"), (("PT",), "PT"), (("EN", "PT"), "EN+PT")):
                rows = [(y, pred[i]) for i, lang, y in gold if lang in langs]
                want = macro_f1([y for y, _ in rows], [p for _, p in rows])
                assert cells[f"{NAMES_A[s]} {head}"] == percent(want), (split, s, head)


# -------------------------------------------------------------------------------------------------- STS
SETTINGS_B = ("pre_train", "fine_tune")
SUBSETS = ("ALL", "Idiom", "STS")


def _sts_trial(tid: str, params: dict[str, Any], rng: random.Random, dev: float | None = None) -> TrialOutcome:
    final: dict[str, Any] = {"final": 1, "step": 30}
    final |= {
        f"{split}/{s}/EN+PT/{k}": round(rng.uniform(-0.2, 0.9), 4)
        for split in ("dev", "test")
        for s in SETTINGS_B
        for k in SUBSETS
    }
    final |= {f"{k}/{s}": rng.uniform(-3.0, 1.5) for k in ("align", "uniform") for s in SETTINGS_B}
    final["dev_spearman"] = final["dev/fine_tune/EN+PT/ALL"] if dev is None else dev
    history = [{"step": 10 * i, "dev_spearman": round(rng.uniform(0.0, 0.9), 4)} for i in (1, 2)] + [final]
    return TrialOutcome(tid, params, history)


def test_sts_report_table_5_geometry_and_sweep(tmp_path: Path) -> None:
    from raycl.recipes.sts.report import REPORT

    space = load_space("sts", preset="smoke")
    run = Run(
        cfg=space.config,
        run_dir=tmp_path / "run",
        base_model=tmp_path / "base",
        builtin=[],
        counts={"train": 8},
        timings={"tune_s": 1.0},
    )
    run.run_dir.mkdir()
    rng = random.Random(5)
    trials = [
        _sts_trial("a", {"moco.queue_size": 8, "loss.lam": 0.5}, rng, 0.4),
        _sts_trial("b", {"moco.queue_size": 16, "loss.lam": 0.5}, rng, 0.75),
        _sts_trial("c", {"moco.queue_size": 32, "loss.lam": 0.9}, rng, 0.6),
    ]
    del trials[2].history[-1]["align/pre_train"]
    extra = [_sts_trial(n, {"baseline": n}, rng) for n in ("infonce", "mse_only", "cross_attention")]
    REPORT.write_all(run, space, trials, extra)
    got = tables((run.run_dir / "report.md").read_text())
    ladder = [
        ("MSE only", extra[1]),
        ("+ cross-attention", extra[2]),
        ("+ InfoNCE (in-batch)", extra[0]),
        ("+ MoCo queue", trials[1]),
    ]  # Table 5's order; the last row is the best closing dev ρ
    for name, split in (("Strategy", "dev"), ("Strategy#2", "test")):
        assert [r["Strategy"] for r in got[name]] == [m for m, _ in ladder]
        for (_, t), cells in zip(ladder, got[name], strict=True):
            f = t.history[-1]
            for s in SETTINGS_B:
                for k in SUBSETS:
                    assert cells[f"{s} {k}"] == percent(f[f"{split}/{s}/EN+PT/{k}"]), (t.trial_id, split, s, k)
    geometry = got["Strategy#3"]
    assert [r["Strategy"] for r in geometry] == [m for m, _ in ladder]
    for (_, t), cells in zip(ladder, geometry, strict=True):
        f = t.history[-1]
        for s in SETTINGS_B:
            assert (
                cells[f"{s} ℓ_align"] == f"{f[f'align/{s}']:.3f}"
                and cells[f"{s} ℓ_uniform"] == f"{f[f'uniform/{s}']:.3f}"
            ), (t.trial_id, s)
    sweep = got["point"]
    assert [r["point"] for r in sweep] == ["Q=8, λ=0.5", "Q=16, λ=0.5", "Q=32, λ=0.9"]
    assert [r["dev ρ"] for r in sweep] == [percent(t.history[-1]["dev_spearman"]) for t in trials]


def test_sts_report_a_missing_geometry_value_is_a_dash(tmp_path: Path) -> None:
    """Degenerate case: no held-out pair scored ≥ the alignment threshold gives no ℓ_align: a dash, never 0."""
    from raycl.recipes.sts.report import REPORT

    space = load_space("sts", preset="smoke")
    run = Run(cfg=space.config, run_dir=tmp_path / "run", base_model=tmp_path / "base", builtin=[], counts={})
    run.run_dir.mkdir()
    trial = _sts_trial("only", {"moco.queue_size": 8}, random.Random(2))
    del trial.history[-1]["align/fine_tune"]
    REPORT.write_all(run, space, [trial], [])
    [cells] = tables((run.run_dir / "report.md").read_text())["Strategy#3"]
    assert (
        cells["fine_tune ℓ_align"] == "–"
        and cells["fine_tune ℓ_uniform"] == f"{trial.history[-1]['uniform/fine_tune']:.3f}"
    )
