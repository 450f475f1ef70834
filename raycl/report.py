"""What every recipe's report shares: picking the best report of a sweep and the report helpers (percentages,
Markdown tables, timings, plots); the run's files are :mod:`raycl.records`, its lines :mod:`raycl.progress`."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
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


def best_trial(trials: list[TrialOutcome], *, metric: str, mode: str = "max") -> TrialOutcome | None:
    scored = [(t, best_row(t, metric, mode)) for t in trials]
    scored = [(t, r) for t, r in scored if r is not None]
    if not scored:
        return None
    sign = 1.0 if mode == "max" else -1.0
    return max(scored, key=lambda tr: sign * float((tr[1] or {})[metric]))[0]


def failed(trials: list[TrialOutcome]) -> list[str]:
    return [t.trial_id for t in trials if t.error]


# ---------------------------------------------------------------------------------------------- report text
def pct(v: Any) -> str:
    """A score in [0, 1] as a percentage with two decimals, or an en dash when it is missing."""
    f = num(v)
    return "–" if f is None else f"{100 * f:.2f}"


def md_table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A Markdown table's lines."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(str(c) for c in r) + " |" for r in rows)]  # fmt: skip


def timing_line(timings: dict[str, float]) -> str:
    return ", ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in timings.items())


def data_line(counts: dict[str, int], builtin: list[str]) -> str:
    return (f"Data: {', '.join(f'{k} {v}' for k, v in counts.items())}"
            + (f" (built-in: {', '.join(builtin)})" if builtin else "") + ".")  # fmt: skip


def closing_lines(run: Any, summary: dict[str, Any], plots: list[Path]) -> list[str]:
    """A report's end: the data, the timings, the failed trials and the plots."""
    lines = ["", data_line(run.counts, run.builtin), "", "## Timings", "", timing_line(run.timings), ""]
    if summary["failed_trials"]:
        lines += [f"Failed trials: {', '.join(summary['failed_trials'])}", ""]
    return lines + [f"![{p.stem}]({p.name})" for p in plots]


def write_run_files(run: Any, space: Any, *, rows: list[dict[str, Any]], best: Any, table: Any,
                    plots: Callable[[Path], list[Path]], render: Callable[[dict[str, Any], list[Path]], str],
                    **more: Any) -> dict[str, Any]:  # fmt: skip
    """A run's outputs: ``results.csv`` (``rows``), ``best.json``, the plots, ``report.md`` (``render``);
    returns the summary every ``raycl.tune``/``raycl.train`` prints with ``--json``."""
    import json

    write_csv(run.run_dir / "results.csv", rows)
    summary = {"space": space.name, "run_dir": str(run.run_dir), "best": best, "table": table,
               "timings": run.timings, "builtin_data": run.builtin, "data": run.counts, **more}  # fmt: skip
    atomic_write(run.run_dir / "best.json", json.dumps(best, indent=2, default=str))
    paths = plots(run.run_dir)
    atomic_write(run.run_dir / "report.md", render(summary, paths))
    summary["plots"] = [str(p) for p in paths]
    return summary


# ---------------------------------------------------------------------------------------------- plots
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
