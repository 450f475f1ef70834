"""Subtask B's outputs: ``results.csv``, ``best.json``, ``report.md`` with the paper's Table 5 (rows add one
strategy each: MSE only → + cross-attention → + InfoNCE in-batch → + MoCo queue, the sweep's best point; columns:
Spearman ALL / Idiom / STS per setting) and the plots (Fig. 5, dev curves)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from raycl.evaluation.embedding_geometry import plot_alignment_uniformity
from raycl.evaluation.semeval_metrics import SUBSETS
from raycl.report import closing_lines, failed, figure, num, pct, write_run_files

if TYPE_CHECKING:
    from raycl.config import Space
    from raycl.driver import Run
    from raycl.records import TrialOutcome

SETTINGS = ("pre_train", "fine_tune")
LADDER = (("mse_only", "MSE only"), ("cross_attention", "+ cross-attention"),
          ("infonce", "+ InfoNCE (in-batch)"), (None, "+ MoCo queue"))  # fmt: skip
DENSE = ("dense_negatives", "+ InfoNCE (in-batch) + dense negatives")  # below the ladder: vs its in-batch row
REFRESHED = ("dense_refreshed", "+ InfoNCE (in-batch) + refreshed dense negatives")  # miners while training
SYMBOLS = {"loss.lam": "λ", "loss.temperature": "τ", "moco.queue_size": "Q", "moco.m": "m", "loss.joint": "joint",
           "mining.num_negatives": "K", "mining.relative_margin": "r", "mining.absolute_margin": "m_abs"}


def final_row(trial: TrialOutcome) -> dict[str, Any] | None:
    """The trial's closing report (its official scores), or None when it did not finish."""
    return next((r for r in reversed(trial.history) if num(r.get("final")) == 1), None)


def best_trial(trials: list[TrialOutcome], *, metric: str, mode: str = "max") -> TrialOutcome | None:
    """The trial whose closing report has the best ``metric`` (dev Spearman of its final setting)."""
    sign = 1.0 if mode == "max" else -1.0
    values = [num((final_row(t) or {}).get(metric)) for t in trials]
    scored = [(sign * v, i) for i, v in enumerate(values) if v is not None]
    return trials[max(scored)[1]] if scored else None


def _label(trial: TrialOutcome) -> str:
    name = trial.params.get("baseline")
    return dict([*LADDER, DENSE, REFRESHED]).get(name, str(name)) if name is not None else dict(LADDER)[None]


def _row(trial: TrialOutcome) -> dict[str, Any]:
    row: dict[str, Any] = {"trial_id": trial.trial_id, "method": _label(trial), **trial.params}
    final = final_row(trial) or {}
    row.update({k: v for k, v in final.items()
                if k in ("step", "dev_spearman") or k.startswith(("dev/", "test/", "align/", "uniform/"))})
    if trial.error:
        row["error"] = trial.error
    return row


def write_all(run: Run, space: Space, trials: list[TrialOutcome], extra: list[TrialOutcome]) -> dict[str, Any]:
    best = best_trial(trials, metric=run.cfg.tune.metric, mode=run.cfg.tune.mode)
    by_name = {t.params.get("baseline"): t for t in extra}
    ladder = [t for t in [by_name.get(n) for n, _ in LADDER[:-1]] + [best] if t is not None]
    ladder += [t for n, t in by_name.items() if n not in dict(LADDER)]
    return write_run_files(run, space, rows=[_row(t) for t in trials + extra], best=_row(best) if best else None,
                           table=[_row(t) for t in ladder], failed_trials=failed(trials + extra),
                           plots=lambda d: _plots(d, ladder),
                           render=lambda summary, plots: _render(run, space, summary, trials, plots))


def _table(rows: list[dict[str, Any]], split: str) -> list[str]:
    head = ["Strategy", *[f"{s} {k}" for s in SETTINGS for k in SUBSETS]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [pct(r.get(f"{split}/{s}/EN+PT/{k}")) for s in SETTINGS for k in SUBSETS]
        lines.append(f"| {r['method']} | " + " | ".join(cells) + " |")
    return lines


def _render(run: Run, space: Space, summary: dict[str, Any], trials: list[TrialOutcome],
            plots: list[Path]) -> str:  # fmt: skip
    rows, cfg = summary["table"], run.cfg
    lines = [f"# SemEval-2022 Task 2 Subtask B — {space.name}", "",
             "Table 5: Spearman ρ (%, EN+PT) of the official evaluator on dev, per setting (pre_train: the model "
             "kept on the STS dev split; fine_tune: the one kept on dev). Each row adds one strategy to the row "
             f"above; the last is the sweep's best point (joint loss: {cfg.loss.joint}).", "",
             *_table(rows, "dev"), ""]  # fmt: skip
    lines += _dense_lines(rows, cfg)
    if any(k.startswith("test/") for r in rows for k in r):
        lines += ["The same on eval (the paper's test):", "", *_table(rows, "test"), ""]
    lines += ["Alignment and uniformity of the mean-pooled embeddings (lower is better, Fig. 5):", "",
              "| Strategy | " + " | ".join(f"{s} ℓ_align | {s} ℓ_uniform" for s in SETTINGS) + " |",
              "|" + "---|" * (1 + 2 * len(SETTINGS))]  # fmt: skip
    for r in rows:
        cells = [f"{v:.3f}" if (v := num(r.get(f"{k}/{s}"))) is not None else "–"
                 for s in SETTINGS for k in ("align", "uniform")]  # fmt: skip
        lines.append(f"| {r['method']} | " + " | ".join(cells) + " |")
    lines += ["", "## Sweep (dev Spearman of the final setting, %)", "", "| point | dev ρ |", "|---|---|"]
    for t in trials:
        point = ", ".join(f"{SYMBOLS.get(k, k)}={v}" for k, v in t.params.items()) or "default"
        lines.append(f"| {point} | {pct((final_row(t) or {}).get('dev_spearman'))} |")
    return "\n".join(lines + closing_lines(run, summary, plots))


def _dense_lines(rows: list[dict[str, Any]], cfg: Any) -> list[str]:
    """The dense-negative rows against the in-batch row they extend (all at the best point, no queue): pre-mined
    (the pool, version 0) and refreshed while training (``mining.refresh``), each where the ladder has it."""
    by = {r["method"]: r for r in rows}
    plain = by.get(dict(LADDER)["infonce"])
    found = [(what, r) for what, name in (("pre-mined", DENSE[1]), ("refreshed", REFRESHED[1]))
             if (r := by.get(name)) is not None]  # fmt: skip
    if plain is None or not found:
        return []
    m, a = cfg.mining, num(plain.get("dev_spearman"))
    cells = [f"in-batch only {pct(a)}"]
    for what, r in found:
        b = num(r.get("dev_spearman"))
        delta = f" ({100 * (b - a):+.2f})" if a is not None and b is not None else ""
        cells.append(f"{what} dense negatives {pct(b)}{delta}")
    point = {k: found[0][1].get(f"mining.{k}", getattr(m, k)) for k in ("num_negatives", "relative_margin",
                                                                        "absolute_margin")}  # fmt: skip
    settings = ", ".join(f"{k} {v}" for k, v in point.items() if v is not None)
    source = m.negatives or f"a pool of {m.pool} per anchor mined with the base encoder"
    refreshed = (f"; refreshed: every {m.refresh_every} steps, max_staleness {m.max_staleness}, "
                 f"{m.num_miners} miner{'s' * (m.num_miners > 1)}" if len(found) > 1 or found[0][0] == "refreshed"
                 else "")  # fmt: skip
    return [f"Dense hard negatives (the last rows: {settings}; {source}{refreshed}): dev Spearman of the final "
            f"setting, {' → '.join(cells)}.", ""]


def _plots(run_dir: Path, ladder: list[TrialOutcome]) -> list[Path]:
    out = []
    points = {f"{_label(t)} ({s})": (a, u) for t in ladder for s in SETTINGS
              if (a := num((final_row(t) or {}).get(f"align/{s}"))) is not None
              and (u := num((final_row(t) or {}).get(f"uniform/{s}"))) is not None}  # fmt: skip
    if points:
        out.append(plot_alignment_uniformity(points, run_dir / "align_uniform.png",
                                             title="Fig. 5: ℓ_align vs ℓ_uniform"))  # fmt: skip
    with figure(run_dir / "dev_curves.png", out) as ax:
        for t in ladder:
            pts = [(r["step"], 100 * v) for r in t.history if num(r.get("final")) != 1
                   and (v := num(r.get("dev_spearman"))) is not None]  # fmt: skip
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=_label(t))
        ax.set(xlabel="step (pre-training, then fine-tuning)", ylabel="dev Spearman ALL (%)",
               title="Dev Spearman of the current setting")  # fmt: skip
        ax.legend(fontsize=7)
    return out
