"""What every recipe's report shares: picking the best report of a sweep and the report helpers (percentages,
Markdown tables, timings, plots); the run's files are :mod:`raycl.records`, its lines :mod:`raycl.progress`."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from raycl.progress import say  # noqa: F401  (what a recipe's driver says)
from raycl.records import (  # noqa: F401  (the recipes' reports write through these)
    TrialOutcome,
    append_history,
    atomic_write,
    copy_atomic,
    read_history,
    save_png,
    write_csv,
)


# ---------------------------------------------------------------------------------------------- selection
def num(v: Any) -> float | None:
    """``v`` as a finite float, or None (missing, NaN, not a number)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def best_row(trial: TrialOutcome, metric: str, mode: str = "max") -> dict[str, Any] | None:
    """The report of ``trial`` with the best ``metric`` (the checkpoint picked on dev; earliest on ties)."""
    rows = [r for r in trial.history if num(r.get(metric)) is not None]
    if not rows:
        return None
    sign = 1.0 if mode == "max" else -1.0
    return max(rows, key=lambda r: (sign * float(r[metric]), -float(r.get("step", r.get("epoch", 0)))))


def final_row(trial: TrialOutcome) -> dict[str, Any] | None:
    """The trial's closing report (``final: 1``, its official scores), or None when it did not finish."""
    return next((r for r in reversed(trial.history) if num(r.get("final")) == 1), None)


def pick(
    trials: Sequence[TrialOutcome],
    score: Callable[[TrialOutcome], float | None],
    mode: str = "max",
    *,
    last: bool = False,
) -> TrialOutcome | None:
    """The trial with the best ``score`` (None: not scored); the first on ties, or the last with ``last``."""
    sign = 1.0 if mode == "max" else -1.0
    scored = [(sign * v, i if last else -i) for i, t in enumerate(trials) if (v := score(t)) is not None]
    return trials[abs(max(scored)[1])] if scored else None


def best_value(trial: TrialOutcome, metric: str, mode: str = "max") -> float | None:
    """``metric`` of the trial's best report (:func:`best_row`), or None when no report has it."""
    return num((best_row(trial, metric, mode) or {}).get(metric))


def best_trial(trials: list[TrialOutcome], *, metric: str, mode: str = "max") -> TrialOutcome | None:
    """The trial whose best report (:func:`best_row`) has the best ``metric``."""
    return pick(trials, lambda t: best_value(t, metric, mode), mode)


def failed(trials: list[TrialOutcome]) -> list[str]:
    return [t.trial_id for t in trials if t.error]


# ---------------------------------------------------------------------------------------------- report text
def pct(v: Any) -> str:
    """A score in [0, 1] as a percentage with two decimals, or an en dash when it is missing."""
    f = num(v)
    return "–" if f is None else f"{100 * f:.2f}"


def md_table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A Markdown table's lines."""
    return [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(str(c) for c in r) + " |" for r in rows),
    ]


def cell3(v: Any) -> str:
    """A number with three decimals (α, ℓ_align), or an en dash when it is missing (not 0.000)."""
    f = num(v)
    return "–" if f is None else f"{f:.3f}"


def label(trial: TrialOutcome | None, names: dict[Any, str], default: str) -> str:
    """A trial's row name: its baseline's name in ``names`` (the baseline itself if unnamed), ``default``
    for a sweep trial."""
    name = None if trial is None else trial.params.get("baseline")
    return default if name is None else names.get(name, str(name))


def point(
    params: dict[str, Any],
    symbols: dict[str, str] | None = None,
    *,
    skip: Sequence[str] = ("baseline",),
    empty: str = "default",
) -> str:
    """A sweep point as ``γ=0.1, k=4`` (the paper's symbols where known); ``empty`` when nothing is set."""
    names = symbols or {}
    return ", ".join(f"{names.get(k, k)}={v}" for k, v in params.items() if k not in skip) or empty


def trial_row(
    trial: TrialOutcome,
    head: dict[str, Any],
    row: dict[str, Any],
    keys: Sequence[str] = (),
    prefixes: tuple[str, ...] = (),
) -> dict[str, Any]:
    """``results.csv``'s row of a trial: its id, ``head``, its parameters, the kept columns of ``row`` (``keys``,
    or names starting with one of ``prefixes``) and its error, if any."""
    out: dict[str, Any] = {"trial_id": trial.trial_id, **head, **trial.params}
    out.update({k: v for k, v in row.items() if k in keys or k.startswith(prefixes)})
    return {**out, "error": trial.error} if trial.error else out


Column = tuple[str, Callable[[Any], Any]]  # a table's header and the cell of a row


def columns(items: Sequence[Any], cols: Sequence[Column]) -> list[str]:
    """A Markdown table declared by its columns: ``(header, cell of an item)``."""
    return md_table([h for h, _ in cols], [[f(x) for _, f in cols] for x in items])


def pct_columns(keys: Iterable[tuple[str, str]]) -> list[Column]:
    """:func:`columns` of ``(header, key)``: each cell the row's ``key`` as a percentage."""
    return [(head, partial(_pct_of, key=key)) for head, key in keys]


def _pct_of(row: dict[str, Any], key: str) -> str:
    return pct(row.get(key))


def stream_totals(
    rows: list[dict[str, Any]], refused: Callable[[list[float]], float] = sum
) -> tuple[float, float, float, float]:
    """Mining ‖ training over ``rows``: seconds waited for negatives, seconds trained, the largest staleness and
    the negatives refused as too stale (``refused`` of the rows' counts: summed, or ``max`` of per-epoch ones)."""
    wait = sum(num(r.get("timing/mine_wait")) or 0.0 for r in rows)
    wall = sum(num(r.get("timing/interval")) or 0.0 for r in rows)
    stale = max(num(r.get("stream/staleness_max")) or 0.0 for r in rows)
    return wait, wall, stale, refused([num(r.get("stream/refused")) or 0.0 for r in rows])


def section(title: str, *body: str) -> list[str]:
    """A report's section: a blank line, its ``## title`` heading, a blank line and ``body``."""
    return ["", f"## {title}", "", *body]


def timing_line(timings: dict[str, float]) -> str:
    return ", ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in timings.items())


def data_line(counts: dict[str, int], builtin: list[str]) -> str:
    return (
        f"Data: {', '.join(f'{k} {v}' for k, v in counts.items())}"
        + (f" (built-in: {', '.join(builtin)})" if builtin else "")
        + "."
    )


def closing_lines(run: Any, summary: dict[str, Any], plots: list[Path]) -> list[str]:
    """A report's end: the data, the timings, the failed trials and the plots."""
    lines = ["", data_line(run.counts, run.builtin), "", "## Timings", "", timing_line(run.timings), ""]
    if summary["failed_trials"]:
        lines += [f"Failed trials: {', '.join(summary['failed_trials'])}", ""]
    return lines + [f"![{p.stem}]({p.name})" for p in plots]


def write_run_files(
    run: Any,
    space: Any,
    trials: list[TrialOutcome],
    *,
    row: Callable[[TrialOutcome], dict[str, Any]],
    best: Any,
    table: Any,
    plots: Callable[[Path], list[Path]],
    render: Callable[[dict[str, Any], list[Path]], str],
    **more: Any,
) -> dict[str, Any]:
    """A run's outputs: ``results.csv`` (a ``row`` for each of the run's ``trials``, sweep and baselines),
    ``best.json``, the plots, ``report.md`` (``render``); returns the summary every ``raycl.tune``/``raycl.train``
    prints with ``--json`` (with the failed trials and ``more``)."""
    import json

    write_csv(run.run_dir / "results.csv", [row(t) for t in trials])
    summary = {
        "space": space.name,
        "run_dir": str(run.run_dir),
        "best": best,
        "table": table,
        "timings": run.timings,
        "builtin_data": run.builtin,
        "data": run.counts,
        "failed_trials": failed(trials),
        **more,
    }
    atomic_write(run.run_dir / "best.json", json.dumps(best, indent=2, default=str))
    paths = plots(run.run_dir)
    atomic_write(run.run_dir / "report.md", render(summary, paths))
    summary["plots"] = [str(p) for p in paths]
    return summary


# ---------------------------------------------------------------------------------------------- plots
def curve(trial: TrialOutcome, metric: str, x: str = "step", skip_final: bool = True) -> list[tuple[Any, float]]:
    """``(x, metric in %)`` of the trial's reports that carry ``metric`` (the closing one left out)."""
    return [
        (r.get(x, 0), 100 * v)
        for r in trial.history
        if not (skip_final and num(r.get("final")) == 1) and (v := num(r.get(metric))) is not None
    ]


def plot_curves(
    ax: Any,
    curves: Sequence[tuple[str, list[tuple[Any, float]]]],
    legend: dict[str, Any] | None = None,
    **labels: Any,
) -> None:
    """One line per non-empty ``(label, points)``; ``labels`` set the axes (``xlabel``, ``ylabel``, ``title``),
    ``legend`` the legend's options (no legend without it)."""
    for name, pts in curves:
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=name)
    ax.set(**labels)
    if legend is not None:
        ax.legend(**legend)


@contextmanager
def figure(path: Path, out: list[Path], *, ncols: int = 1, size: tuple[float, float] = (6, 4)) -> Iterator[Any]:
    """A matplotlib figure (Agg) whose axes the caller draws on; saved atomically to ``path`` (appended to
    ``out``) and closed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(size[0] * ncols, size[1]), squeeze=False)
    try:
        yield axes[0] if ncols > 1 else axes[0][0]
        fig.tight_layout()
        out.append(save_png(fig, path))
    finally:
        plt.close(fig)
