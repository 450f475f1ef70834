"""The coherence run's outputs: ``results.csv``, ``best.json``, ``report.md`` (the paper's Table 1) and the plots
of Fig. 2: dev accuracy over steps with and without hard negatives (a), accuracy against the swept values (b–d)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raycl import report as rp
from raycl.records import TrialOutcome
from raycl.report import best_row, num, pct

if TYPE_CHECKING:
    from raycl.config import Space
    from raycl.driver import Run

LABELS = {
    "pairwise": "Pairwise",
    "contrastive": "Contrastive",
    "contrastive_hn": "Contrastive + hard negatives",
    "full_no_hn": "Full model − hard negatives",
}
TABLE_1 = ("pairwise", "contrastive", None)  # None: the sweep's best point, the full model
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
_label = partial(rp.label, names=LABELS, default="Full model")
_STREAM_HEAD = [
    "trial",
    "mine_wait (% of training time)",
    "max staleness",
    "refused (re-mined)",
    "weight versions",
]


def _row(trial: TrialOutcome, metric: str, mode: str) -> dict[str, Any]:
    row = best_row(trial, metric, mode) or (trial.history[-1] if trial.history else {})
    keep = ("step", "epoch", "loss"), ("dev", "test/", "timing/", "stream/")
    return rp.trial_row(trial, {"method": _label(trial)}, row, *keep)


def write_all(run: Run, space: Space, trials: list[TrialOutcome], extra: list[TrialOutcome]) -> dict[str, Any]:
    metric, mode = run.cfg.tune.metric, run.cfg.tune.mode
    best = rp.best_trial(trials, metric=metric, mode=mode)
    return rp.write_run_files(
        run,
        space,
        trials + extra,
        row=partial(_row, metric=metric, mode=mode),
        best=_row(best, metric, mode) if best else None,
        table=_table(best, extra, metric, mode),
        plots=lambda d: _plots(d, trials, extra, best, metric),
        render=partial(_render, run, space, trials=trials, extra=extra),
    )


def _table(best: TrialOutcome | None, extra: list[TrialOutcome], metric: str, mode: str) -> list[dict[str, Any]]:
    """Table 1's rows (pairwise, contrastive, full model), then the other baselines (Fig. 2a's runs)."""
    by_name = {str(t.params.get("baseline")): t for t in extra}
    order = [by_name.get(n) if n else best for n in TABLE_1] + [t for n, t in by_name.items() if n not in TABLE_1]
    return [_row(t, metric, mode) for t in order if t is not None]


def _render(
    run: Run,
    space: Space,
    summary: dict[str, Any],
    plots: list[Path],
    *,
    trials: list[TrialOutcome],
    extra: list[TrialOutcome],
) -> str:
    tests, alphas = list(run.cfg.data.test), list(run.cfg.data.annotations)
    humans = ", ".join(pct(_alpha(summary, a, "human_alpha")) for a in alphas) or "–"
    cols: list[rp.Column] = [
        ("Method", lambda r: r["method"]),
        *rp.pct_columns((f"{t} acc", f"test/{t}/acc") for t in tests),
        *((f"{a} α", lambda r, k=f"test/{a}/alpha": rp.cell3(r.get(k))) for a in alphas),  # no α: –, not 0.000
        ("dev acc", lambda r: pct(r.get("dev_acc"))),
    ]
    lines = [
        f"# Coherence — {space.name}",
        "",
        "Table 1: pairwise accuracy (%, ties wrong) on the held-out permuted test and each independent set; "
        "Krippendorff's α (nominal) with the model as one more coder where annotations are given "
        f"(annotators alone: {humans}).",
        "",
        *rp.columns(summary["table"], cols),
        "",
        rp.data_line(run.counts, run.builtin),
        "",
    ]
    lines += _sweep_lines(trials, tests) + _stream_lines(trials + extra)
    lines += ["## Timings", "", rp.timing_line(run.timings), ""]
    return "\n".join(lines + [f"![{p.stem}]({p.name})" for p in plots])


def _alpha(summary: dict[str, Any], name: str, key: str) -> Any:
    return next(
        (r[f"test/{name}/{key}"] for r in summary["table"] if r.get(f"test/{name}/{key}") is not None), None
    )


def _sweep_lines(trials: list[TrialOutcome], tests: list[str]) -> list[str]:
    keys = sorted({k for t in trials for k in t.params})
    if not keys:
        return []
    head = [SYMBOLS.get(k, k) for k in keys] + ["dev acc", *[f"{t} acc" for t in tests]]
    best = [(t, best_row(t, "dev_acc") or {}) for t in trials]
    rows = [
        [
            *(str(t.params.get(k)) for k in keys),
            *(pct(r.get(c)) for c in ["dev_acc", *(f"test/{n}/acc" for n in tests)]),
        ]
        for t, r in best
    ]
    return ["## Sweep (full model)", "", *rp.md_table(head, rows), ""]


def _stream_lines(trials: list[TrialOutcome]) -> list[str]:
    """Mining ‖ training: the trainers' waiting time and the negatives' staleness, per trial."""
    rows = []
    for t in trials:
        mined = [h for h in t.history if num(h.get("stream/version")) is not None]
        if mined:
            wait, wall, stale, refused = rp.stream_totals(mined, max)  # refused: counted per epoch
            name = f"{_label(t)} {rp.point(t.params, SYMBOLS, empty='')}".strip()
            rows.append(
                [
                    name,
                    f"{100 * wait / max(wall, 1e-9):.1f}",
                    f"{stale:.0f}",
                    f"{refused:.0f}",
                    f"{mined[-1].get('stream/version', 0):.0f}",
                ]
            )
    return ["## Hard-negative mining ‖ training", "", *rp.md_table(_STREAM_HEAD, rows), ""] if rows else []


def _plots(
    run_dir: Path, trials: list[TrialOutcome], extra: list[TrialOutcome], best: TrialOutcome | None, metric: str
) -> list[Path]:
    out: list[Path] = []
    curves = [t for t in extra if t.params.get("baseline") in ("contrastive", "contrastive_hn")]
    curves += [best] if best is not None else []
    if curves:
        with rp.figure(run_dir / "dev_curves.png", out) as ax:
            rp.plot_curves(
                ax,
                [(_label(t), rp.curve(t, metric, skip_final=False)) for t in curves],
                xlabel="training steps (items)",
                ylabel="dev accuracy (%)",
                title="Fig. 2a: dev accuracy",
                legend={},
            )
    swept = [k for k in SWEPT if len({str(t.params.get(k)) for t in trials}) > 1]
    if swept:
        with rp.figure(run_dir / "sweep.png", out, ncols=len(swept), size=(4.5, 3.6)) as axes:
            for ax, key in zip(axes if len(swept) > 1 else [axes], swept, strict=True):
                _sweep_panel(ax, trials, key, metric)
    return out


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
