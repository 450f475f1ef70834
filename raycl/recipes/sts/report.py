"""Subtask B's outputs: ``results.csv``, ``best.json``, ``report.md`` with the paper's Table 5 (rows add one
strategy each: MSE only → + cross-attention → + InfoNCE in-batch → + MoCo queue, the sweep's best point; columns:
Spearman ALL / Idiom / STS per setting) and the plots (Fig. 5, dev curves)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raycl import report as rp
from raycl.report import final_row, num, pct
from raycl.scoring.embedding_geometry import plot_alignment_uniformity
from raycl.scoring.semeval_metrics import SUBSETS

SETTINGS = ("pre_train", "fine_tune")
LADDER = (
    ("mse_only", "MSE only"),
    ("cross_attention", "+ cross-attention"),
    ("infonce", "+ InfoNCE (in-batch)"),
    (None, "+ MoCo queue"),
)
DENSE = ("dense_negatives", "+ InfoNCE (in-batch) + dense negatives")  # below the ladder: vs its in-batch row
REFRESHED = ("dense_refreshed", "+ InfoNCE (in-batch) + refreshed dense negatives")  # miners while training
SYMBOLS = {
    "loss.lam": "λ",
    "loss.temperature": "τ",
    "moco.queue_size": "Q",
    "moco.m": "m",
    "loss.joint": "joint",
    "mining.num_negatives": "K",
    "mining.relative_margin": "r",
    "mining.absolute_margin": "m_abs",
}
_GEOMETRY_HEAD = "Alignment and uniformity of the mean-pooled embeddings (lower is better, Fig. 5):"
_GEOMETRY = rp.grid("{0} {1}", "{1}/{0}", SETTINGS, [("ℓ_align", "align"), ("ℓ_uniform", "uniform")], rp.cell3)


class StsReport(rp.RecipeReport):
    """A trial is scored by its closing report (dev Spearman of its final setting; the last trial on ties); Table
    5's ladder: each baseline of it, the sweep's best (+ MoCo queue), then the other baselines."""

    names, default = dict([*LADDER, DENSE, REFRESHED]), dict(LADDER)[None]
    keep, final, last = (("step", "dev_spearman"), ("dev/", "test/", "align/", "uniform/")), True, True
    order = (*(n for n, _ in LADDER), ...)

    def plots(self, s: rp.Sweep, run_dir: Path) -> list[Path]:
        """Fig. 5 (ℓ_align against ℓ_uniform of each ladder row and setting) and the dev curves."""
        out, ladder = [], self.ladder(s)
        points = {
            f"{self.label(t)} ({g})": (a, u)
            for t in ladder
            for g in SETTINGS
            if (a := num((final_row(t) or {}).get(f"align/{g}"))) is not None
            and (u := num((final_row(t) or {}).get(f"uniform/{g}"))) is not None
        }
        if points:
            title = "Fig. 5: ℓ_align vs ℓ_uniform"
            out.append(plot_alignment_uniformity(points, run_dir / "align_uniform.png", title=title))
        rp.curves_png(
            run_dir / "dev_curves.png",
            out,
            [(self.label(t), rp.curve(t, "dev_spearman")) for t in ladder],
            xlabel="step (pre-training, then fine-tuning)",
            ylabel="dev Spearman ALL (%)",
            title="Dev Spearman of the current setting",
            legend={"fontsize": 7},
        )
        return out

    def render(self, s: rp.Sweep, summary: dict[str, Any], plots: list[Path]) -> str:
        rows, cfg = summary["table"], s.run.cfg
        intro = (
            "Table 5: Spearman ρ (%, EN+PT) of the official evaluator on dev, per setting (pre_train: the model "
            "kept on the STS dev split; fine_tune: the one kept on dev). Each row adds one strategy to the row "
            f"above; the last is the sweep's best point (joint loss: {cfg.loss.joint})."
        )
        lines = [f"# SemEval-2022 Task 2 Subtask B — {s.space.name}", "", *rp.para(intro, *_table(rows, "dev"))]
        lines += _dense_lines(rows, cfg)
        if any(k.startswith("test/") for r in rows for k in r):
            lines += rp.para("The same on eval (the paper's test):", *_table(rows, "test"))
        sweep = [rp.point_col("point", SYMBOLS, skip=()), rp.col("dev ρ", "dev_spearman")]
        lines += [
            *rp.para(_GEOMETRY_HEAD, *rp.columns(rows, [rp.STRATEGY, *_GEOMETRY])),
            "## Sweep (dev Spearman of the final setting, %)",
            "",
            *rp.columns(rp.trial_rows(s.trials, final_row), sweep),
        ]
        return "\n".join(lines + rp.closing_lines(s.run, summary, plots))


REPORT = StsReport()


def _table(rows: list[dict[str, Any]], split: str) -> list[str]:
    return rp.columns(rows, [rp.STRATEGY, *rp.grid("{0} {1}", split + "/{0}/EN+PT/{1}", SETTINGS, SUBSETS)])


def _dense_lines(rows: list[dict[str, Any]], cfg: Any) -> list[str]:
    """The dense-negative rows against the in-batch row they extend (all at the best point, no queue): pre-mined
    (the pool, version 0) and refreshed while training (``mining.refresh``), each where the ladder has it."""
    by = {r["method"]: r for r in rows}
    plain = by.get(dict(LADDER)["infonce"])
    found = [
        (what, r)
        for what, name in (("pre-mined", DENSE[1]), ("refreshed", REFRESHED[1]))
        if (r := by.get(name)) is not None
    ]
    if plain is None or not found:
        return []
    m, a = cfg.mining, num(plain.get("dev_spearman"))
    cells = [f"in-batch only {pct(a)}"]
    for what, r in found:
        b = num(r.get("dev_spearman"))
        delta = f" ({100 * (b - a):+.2f})" if a is not None and b is not None else ""
        cells.append(f"{what} dense negatives {pct(b)}{delta}")
    keys = ("num_negatives", "relative_margin", "absolute_margin")
    point = {k: found[0][1].get(f"mining.{k}", getattr(m, k)) for k in keys}
    settings = ", ".join(f"{k} {v}" for k, v in point.items() if v is not None)
    source = m.negatives or f"a pool of {m.pool} per anchor mined with the base encoder"
    refreshed = (
        f"; refreshed: every {m.refresh_every} steps, max_staleness {m.max_staleness}, "
        f"{m.num_miners} miner{'s' * (m.num_miners > 1)}"
        if len(found) > 1 or found[0][0] == "refreshed"
        else ""
    )
    return [
        f"Dense hard negatives (the last rows: {settings}; {source}{refreshed}): dev Spearman of the final "
        f"setting, {' → '.join(cells)}.",
        "",
    ]
