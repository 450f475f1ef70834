"""What every recipe's report shares: the skeleton a recipe's report declares (:class:`RecipeReport`: the best
trial of each group, the run's files), picking the best report of a sweep and the report helpers (percentages,
Markdown tables, timings, mining ‖ training, plots); the run's files are :mod:`raycl.records`, its lines
:mod:`raycl.progress`."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import EllipsisType
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


def ladder(
    extra: Sequence[TrialOutcome], best: TrialOutcome | None, order: Sequence[str | None | EllipsisType]
) -> list[TrialOutcome]:
    """A table's trials in the paper's order: each baseline ``order`` names that ran, the sweep's ``best`` where
    it says None, the baselines it does not name (as they ran) where it says ``...``."""
    named, out = {n for n in order if isinstance(n, str)}, []
    for n in order:
        if n is ...:
            out += [t for t in extra if t.params.get("baseline") not in named]
        else:
            out += [t for t in extra if t.params.get("baseline") == n] if n else [best] if best else []
    return out


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
Part = str | tuple[str, str]  # a part of a grid's columns: its header's text and its key's (a string: both)


def columns(items: Sequence[Any], cols: Sequence[Column]) -> list[str]:
    """A Markdown table declared by its columns: ``(header, cell of an item)``."""
    return md_table([h for h, _ in cols], [[f(x) for _, f in cols] for x in items])


def col(head: str, key: str, fmt: Callable[[Any], str] = pct) -> Column:
    """A :func:`columns` column of each row's ``key``, formatted by ``fmt`` (a percentage by default)."""
    return head, partial(_cell, key=key, fmt=fmt)


def grid(
    head: str, key: str, outer: Iterable[Part], inner: Sequence[Part], fmt: Callable[[Any], str] = pct
) -> list[Column]:
    """A :func:`col` for each part of ``outer`` and of ``inner`` (outer first: a test set's P, R, F0.5):
    ``head`` and ``key`` are format strings of the two parts' texts (``"{0} {1}"``, ``"test/{0}/{1}"``)."""
    parts = [(_part(o), _part(i)) for o in outer for i in inner]
    return [col(head.format(o[0], i[0]), key.format(o[1], i[1]), fmt) for o, i in parts]


def _part(part: Part) -> tuple[str, str]:
    return (part, part) if isinstance(part, str) else part


def _cell(row: dict[str, Any], key: str, fmt: Callable[[Any], str]) -> str:
    return fmt(row.get(key))


def trial_rows(
    trials: Sequence[TrialOutcome], report: Callable[[TrialOutcome], dict[str, Any] | None]
) -> list[dict[str, Any]]:
    """A sweep table's rows: each trial's ``report`` (its best or closing one; none: empty) and the trial itself
    (``trial``), for columns of either (:func:`col`, :func:`point_col`)."""
    return [{**(report(t) or {}), "trial": t} for t in trials]


def point_col(head: str = "point", symbols: dict[str, str] | None = None, **how: Any) -> Column:
    """A column of :func:`trial_rows`: each trial's sweep point (:func:`point`; ``how``: ``skip``, ``empty``)."""
    return head, lambda r: point(r["trial"].params, symbols, **how)


METHOD: Column = ("Method", lambda r: r["method"])  # a table's row names (a recipe's table rows' ``method``)
STRATEGY: Column = ("Strategy", METHOD[1])  # the same where the paper's rows add one strategy each


def stream_totals(
    rows: list[dict[str, Any]], refused: Callable[[list[float]], float] = sum
) -> tuple[float, float, float, float]:
    """Mining ‖ training over ``rows``: seconds waited for negatives, seconds trained, the largest staleness and
    the negatives refused as too stale (``refused`` of the rows' counts: summed, or ``max`` of per-epoch ones)."""
    wait = sum(num(r.get("timing/mine_wait")) or 0.0 for r in rows)
    wall = sum(num(r.get("timing/interval")) or 0.0 for r in rows)
    stale = max(num(r.get("stream/staleness_max")) or 0.0 for r in rows)
    return wait, wall, stale, refused([num(r.get("stream/refused")) or 0.0 for r in rows])


def stream_lines(trials: list[TrialOutcome]) -> list[str]:
    """Mining ‖ training over every trial, as bullets: how long trainers waited for negatives (also without each
    epoch's first batch, which waits for the miners to start) and how stale the negatives were."""
    rows = [r for t in trials for r in t.history if num(r.get("stream/negatives"))]
    if not rows:
        return ["- negatives: pre-mined or not needed (no miner pool in these trials)"]
    wait, wall, stale, refused = stream_totals(rows)
    first = sum(num(r.get("timing/mine_wait_first")) or 0.0 for r in rows)
    return [
        f"- mine_wait (trainers waiting for negatives): {wait:.1f} s of {wall:.1f} s of training "
        f"({100 * wait / max(wall, 1e-9):.1f}%; steady state without each epoch's first batch: "
        f"{100 * (wait - first) / max(wall - first, 1e-9):.1f}%)",
        f"- staleness of the negatives used: max {stale:.0f} versions; refused as too stale: {refused:.0f}",
    ]


_STREAM_HEAD = [
    "trial",
    "mine_wait (% of training time)",
    "max staleness",
    "refused (re-mined)",
    "weight versions",
]


def stream_table(trials: list[TrialOutcome], name: Callable[[TrialOutcome], str]) -> list[str]:
    """Mining ‖ training per trial that mined (``name``: its row's name), as a section: the share of its training
    time its trainers waited for negatives, their largest staleness, the negatives refused as too stale (the
    largest per-epoch count) and the weight versions published."""
    rows = []
    for t in trials:
        if mined := [h for h in t.history if num(h.get("stream/version")) is not None]:
            wait, wall, stale, refused = stream_totals(mined, max)
            versions = f"{mined[-1].get('stream/version', 0):.0f}"
            rows.append(
                [name(t), f"{100 * wait / max(wall, 1e-9):.1f}", f"{stale:.0f}", f"{refused:.0f}", versions]
            )
    return ["## Hard-negative mining ‖ training", "", *md_table(_STREAM_HEAD, rows), ""] if rows else []


def section(title: str, *body: str) -> list[str]:
    """A report's section: a blank line, its ``## title`` heading, a blank line and ``body``."""
    return ["", f"## {title}", "", *body]


def para(text: str, *body: str) -> list[str]:
    """A paragraph and what it introduces (a table), each followed by a blank line."""
    return [text, "", *body, ""]


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
        "trials": len(trials),
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


def curves_png(
    path: Path, out: list[Path], curves: Sequence[tuple[str, list[tuple[Any, float]]]], **how: Any
) -> None:
    """One panel of :func:`plot_curves` (``how``: its axes' labels and ``legend``), saved to ``path``."""
    with figure(path, out) as ax:
        plot_curves(ax, curves, **how)


# ---------------------------------------------------------------------------------------------- a recipe's report
@dataclass
class Sweep:
    """What a report is written from: the run, its space, the sweep's trials and the baselines' (``extra``), the
    best trial of each group; then the table's rows and the summary's other entries (``more``)."""

    run: Any
    space: Any
    trials: list[TrialOutcome]
    extra: list[TrialOutcome]
    best: dict[Any, TrialOutcome]
    table: list[dict[str, Any]] = field(default_factory=list)
    more: dict[str, Any] = field(default_factory=dict)

    @property
    def metric(self) -> str:
        return str(self.run.cfg.tune.metric)

    @property
    def mode(self) -> str:
        return str(self.run.cfg.tune.mode)


class RecipeReport:
    """A recipe's report, declared: its rows' names, which report of a trial is scored and what ``results.csv``
    keeps of it, the groups compared apart; a recipe adds its table's rows, its text and its plots (and the
    summary's other entries), and :meth:`write_all` writes the run's files (:func:`write_run_files`)."""

    names: dict[Any, str] = {}  # a baseline's row name (the baseline itself if unnamed)
    default = ""  # a sweep trial's row name
    keep: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # results.csv: the scored report's keys and prefixes
    final = False  # a trial is scored by its closing report (else by its best report of the run's metric)
    last = False  # ties: the last trial is picked (else the first)
    groups: tuple[Any, ...] = (None,)  # values of ``group`` compared apart (None: one group)
    order: Sequence[str | None | EllipsisType] = (None, ...)  # the table's rows (:func:`ladder`)

    def label(self, trial: TrialOutcome | None) -> str:
        return label(trial, self.names, self.default)

    def ladder(self, s: Sweep) -> list[TrialOutcome]:
        """The table's trials in the paper's ``order``: the baselines and the sweep's best (:func:`ladder`)."""
        return ladder(s.extra, s.best.get(None), self.order)

    def group(self, trial: TrialOutcome) -> Any:
        return None

    def score(self, trial: TrialOutcome, metric: str, mode: str = "max") -> float | None:
        return num((final_row(trial) or {}).get(metric)) if self.final else best_value(trial, metric, mode)

    def best(self, trials: list[TrialOutcome], metric: str, mode: str = "max") -> dict[Any, TrialOutcome]:
        """The best trial of each group (:meth:`score`)."""
        score = partial(self.score, metric=metric, mode=mode)
        picked = {
            g: pick([t for t in trials if self.group(t) == g], score, mode, last=self.last) for g in self.groups
        }
        return {g: t for g, t in picked.items() if t is not None}

    def scored(self, s: Sweep, trial: TrialOutcome) -> dict[str, Any]:
        """The trial's report its row shows: its closing one, or its best (its last when none has the metric)."""
        if self.final:
            return final_row(trial) or {}
        return best_row(trial, s.metric, s.mode) or (trial.history[-1] if trial.history else {})

    def row(self, s: Sweep, trial: TrialOutcome) -> dict[str, Any]:
        """A trial's row in ``best.json`` (a group's best) and ``results.csv``."""
        return trial_row(trial, {"method": self.label(trial)}, self.scored(s, trial), *self.keep)

    def csv_row(self, s: Sweep, trial: TrialOutcome) -> dict[str, Any]:
        """A trial's row in ``results.csv``: its :meth:`row` and any columns of its own files."""
        return self.row(s, trial)

    def table(self, s: Sweep) -> list[dict[str, Any]]:
        """The rows of the report's main table, in the paper's order (the summary's ``table``): each trial of
        :meth:`ladder`, its :meth:`row`."""
        return [self.row(s, t) for t in self.ladder(s)]

    def more(self, s: Sweep) -> dict[str, Any]:
        """The summary's entries of this recipe (before its table: its rows may read them)."""
        return {}

    def plots(self, s: Sweep, run_dir: Path) -> list[Path]:
        return []

    def render(self, s: Sweep, summary: dict[str, Any], plots: list[Path]) -> str:
        """``report.md``'s text."""
        raise NotImplementedError

    def write_all(
        self, run: Any, space: Any, trials: list[TrialOutcome], extra: list[TrialOutcome]
    ) -> dict[str, Any]:
        """The run's files (``results.csv``, ``best.json``, the plots, ``report.md``); the ``--json`` summary."""
        s = Sweep(run, space, trials, extra, self.best(trials, run.cfg.tune.metric, run.cfg.tune.mode))
        s.more = self.more(s)
        best, s.table = {g: self.row(s, t) for g, t in s.best.items()}, self.table(s)
        return write_run_files(
            run,
            space,
            trials + extra,
            row=partial(self.csv_row, s),
            best=(best.get(None) if self.groups == (None,) else best) or None,
            table=s.table,
            plots=partial(self.plots, s),
            render=partial(self.render, s),
            **s.more,
        )
