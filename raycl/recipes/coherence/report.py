"""The coherence run's outputs: ``results.csv``, ``best.json``, ``report.md`` (the paper's Table 1) and the plots
of Fig. 2: dev accuracy over steps with and without hard negatives (a), accuracy against the swept values (b–d)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from raycl import report as rp
from raycl.records import TrialOutcome
from raycl.report import best_row, num, pct

LABELS = {
    "pairwise": "Pairwise",
    "contrastive": "Contrastive",
    "contrastive_hn": "Contrastive + hard negatives",
    "full_no_hn": "Full model − hard negatives",
}
TABLE_1 = ("pairwise", "contrastive", None, ...)  # None: the sweep's best point, the full model
SYMBOLS = {
    "loss.margin": "τ",
    "mining.num_rank": "P (ranked)",
    "momentum.queue_size": "queue",
    "momentum.m": "m",
    "loss.lam": "λ",
    "mining.max_staleness": "staleness",
    "mining.num_negs": "N",
}
SWEPT = ("mining.num_rank", "momentum.m", "momentum.queue_size", "loss.margin", "loss.lam", "mining.max_staleness")


class CoherenceReport(rp.RecipeReport):
    """Table 1's rows (pairwise, contrastive, full model), then the other baselines (Fig. 2a's runs)."""

    names, default, order = LABELS, "Full model", TABLE_1
    keep = ("step", "epoch", "loss"), ("dev", "test/", "timing/", "stream/")

    def render(self, s: rp.Sweep, summary: dict[str, Any], plots: list[Path]) -> str:
        run = s.run
        tests, alphas = list(run.cfg.data.test), list(run.cfg.data.annotations)
        humans = ", ".join(pct(_alpha(summary, a, "human_alpha")) for a in alphas) or "–"
        cols = [
            rp.METHOD,
            *(rp.col(f"{t} acc", f"test/{t}/acc") for t in tests),
            *(rp.col(f"{a} α", f"test/{a}/alpha", rp.cell3) for a in alphas),  # no α: –, not 0.000
            rp.col("dev acc", "dev_acc"),
        ]
        intro = (
            "Table 1: pairwise accuracy (%, ties wrong) on the held-out permuted test and each independent set; "
            "Krippendorff's α (nominal) with the model as one more coder where annotations are given "
            f"(annotators alone: {humans})."
        )
        lines = [f"# Coherence — {s.space.name}", "", *rp.para(intro, *rp.columns(summary["table"], cols))]
        lines += [rp.data_line(run.counts, run.builtin), ""]
        lines += _sweep_lines(s.trials, tests) + rp.stream_table(s.trials + s.extra, self._mined_name)
        lines += ["## Timings", "", rp.timing_line(run.timings), ""]
        return "\n".join(lines + [f"![{p.stem}]({p.name})" for p in plots])

    def _mined_name(self, t: TrialOutcome) -> str:
        return f"{self.label(t)} {rp.point(t.params, SYMBOLS, empty='')}".strip()

    def plots(self, s: rp.Sweep, run_dir: Path) -> list[Path]:
        """Fig. 2a: dev accuracy over steps of the contrastive baselines and the full model; Fig. 2b–d."""
        out: list[Path] = []
        curves = [t for t in s.extra if t.params.get("baseline") in ("contrastive", "contrastive_hn")]
        if curves := curves + ([s.best[None]] if None in s.best else []):
            rp.curves_png(
                run_dir / "dev_curves.png",
                out,
                [(self.label(t), rp.curve(t, s.metric, skip_final=False)) for t in curves],
                xlabel="training steps (items)",
                ylabel="dev accuracy (%)",
                title="Fig. 2a: dev accuracy",
                legend={},
            )
        if swept := [k for k in SWEPT if len({str(t.params.get(k)) for t in s.trials}) > 1]:
            with rp.figure(run_dir / "sweep.png", out, ncols=len(swept), size=(4.5, 3.6)) as axes:
                for ax, key in zip(axes if len(swept) > 1 else [axes], swept, strict=True):
                    _sweep_panel(ax, s.trials, key, s.metric)
        return out


REPORT = CoherenceReport()


def _alpha(summary: dict[str, Any], name: str, key: str) -> Any:
    return next(
        (r[f"test/{name}/{key}"] for r in summary["table"] if r.get(f"test/{name}/{key}") is not None), None
    )


def _sweep_lines(trials: list[TrialOutcome], tests: list[str]) -> list[str]:
    keys = sorted({k for t in trials for k in t.params})
    if not keys:
        return []
    cols: list[rp.Column] = [
        *((SYMBOLS.get(k, k), lambda r, k=k: str(r["trial"].params.get(k))) for k in keys),
        *(rp.col(h, k) for h, k in [("dev acc", "dev_acc"), *((f"{n} acc", f"test/{n}/acc") for n in tests)]),
    ]
    rows = rp.trial_rows(trials, partial(best_row, metric="dev_acc"))
    return ["## Sweep (full model)", "", *rp.columns(rows, cols), ""]


def _sweep_panel(ax: Any, trials: list[TrialOutcome], key: str, metric: str) -> None:
    """Fig. 2b–d: the best accuracy reached at each value of ``key`` (over the other swept keys)."""
    rows = [(t.params.get(key), best_row(t, metric) or {}) for t in trials]
    values = sorted({v for v, _ in rows if v is not None}, key=float)
    series = [metric] + sorted({k for _, r in rows for k in r if k.startswith("test/") and k.endswith("/acc")})
    for s in series:
        ys = [max((100 * (num(r.get(s)) or 0.0) for v, r in rows if v == x), default=0.0) for x in values]
        ax.plot([str(v) for v in values], ys, marker="o", label=s.replace("test/", "").replace("/acc", ""))
    ax.set(xlabel=SYMBOLS.get(key, key), ylabel="accuracy (%)")
    ax.legend(fontsize=7)
