"""Subtask A's outputs: the run's submissions (each setting's rows from its chosen trial, so both settings are
filled), ``results.csv``, ``best.json``, ``report.md`` in the style of the paper's Tables 3–4 (rows add one
strategy each: baseline → + EMA → + FGM / PGD / FreeLB / SMART; columns: dev and test macro-F1 per setting) and a
PNG of dev F1 over epochs per strategy."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raycl import report as rp
from raycl.data.semeval import A_SETTINGS, A_SUBMISSION_HEADER, Value, read_idiom_inputs, read_rows
from raycl.recipes.idiom.evaluation import write_submission
from raycl.report import final_row, num
from raycl.scoring.semeval_metrics import evaluate_idiom

if TYPE_CHECKING:
    from raycl.config.tasks.idiom import IdiomConfig
    from raycl.driver import Run
    from raycl.records import TrialOutcome

METHOD_NAMES = {"fgm": "FGM", "pgd": "PGD", "freelb": "FreeLB", "smart": "SMART"}
SETTING_NAMES = {"zero_shot": "zero-shot", "one_shot": "one-shot"}
_SCORES = ("dev_f1", "test_f1")  # a closing report's official scores
_SETTINGS = [(SETTING_NAMES[s], s) for s in A_SETTINGS]  # the tables' settings: (header, key)
_INTRO = (
    "Tables 3–4: macro-F1 (%, EN+PT) of the official evaluator; dev = the epoch kept on dev (with the EMA weights "
    "where EMA is on), test = the eval split scored with that model. Each row adds one strategy to the row above, "
    "run at the setting's best sweep point; the last row is that point."
)


def setting_of(trial: TrialOutcome) -> str | None:
    row = final_row(trial) or (trial.history[-1] if trial.history else {})
    value = row.get("setting", trial.params.get("data.setting"))
    return value if value in A_SETTINGS else None


def strategy(cfg: IdiomConfig, over: dict[str, Any]) -> str:
    """A trial's row name from its effective EMA switch and adversarial method."""
    ema = over.get("ema.enabled", cfg.ema.enabled)
    method = over.get("adversarial.method", cfg.adversarial.method)
    return ("+ EMA" if ema else "baseline") + (f" + {METHOD_NAMES[method]}" if method in METHOD_NAMES else "")


def _scores(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k.startswith(_SCORES)}


def _overrides(trial: TrialOutcome, baselines: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {**trial.params, **baselines.get(trial.params.get("baseline", ""), {})}


# ---------------------------------------------------------------------------------------------- the run's files
def export_submissions(run: Run, chosen: dict[str, TrialOutcome]) -> dict[str, Any]:
    """``dev.submission.csv`` and ``eval.submission.csv`` of the run: each setting's rows from its chosen
    trial; scored with ``evaluate_idiom`` where gold exists (``{split: {setting: {langs: F1}}}``)."""
    d, scores = run.cfg.data, {}
    for split, inputs, fmt, gold in (
        ("dev", d.dev, d.dev_submission_format, d.dev_gold),
        ("eval", d.eval, d.eval_submission_format, d.eval_gold),
    ):
        preds: dict[tuple[str, str], Value] = {}
        for setting, trial in chosen.items():
            path = run.run_dir / "trials" / trial.trial_id / f"{split}.submission.csv"
            rows = read_rows(path, A_SUBMISSION_HEADER) if path.exists() else []
            preds.update({(r[0], setting): int(r[3]) for _, r in rows if r[2] == setting and r[3] != ""})
        if not inputs or not preds:
            continue
        sub = write_submission(fmt, read_idiom_inputs(inputs), preds, run.run_dir / f"{split}.submission.csv")
        if gold:
            scores[split] = evaluate_idiom(sub, gold)
    return scores


class IdiomReport(rp.RecipeReport):
    """Each setting compared apart: a trial is scored by its closing report (dev F1 of the kept epoch)."""

    final, groups = True, A_SETTINGS

    def group(self, trial: TrialOutcome) -> str | None:
        return setting_of(trial)

    def row(self, s: rp.Sweep, trial: TrialOutcome) -> dict[str, Any]:
        final, over = final_row(trial) or {}, _overrides(trial, s.space.baselines)
        head = {"setting": setting_of(trial), "strategy": strategy(s.run.cfg, over)}
        return rp.trial_row(trial, head, {"best_epoch": final.get("best_epoch"), **final}, ["best_epoch"], _SCORES)

    def more(self, s: rp.Sweep) -> dict[str, Any]:
        return {"official": export_submissions(s.run, s.best)}

    def table(self, s: rp.Sweep) -> list[dict[str, Any]]:
        """Table rows: the baselines in the space's order at each setting's best point, then the sweep's best; or,
        without baselines, one row per strategy trained."""
        run, space, extra = s.run, s.space, s.extra
        groups: dict[str, dict[str, TrialOutcome]] = {}
        if extra:
            for name in (n for n in space.baselines if any(t.params.get("baseline") == n for t in extra)):
                groups[name] = {g: t for t in extra if t.params.get("baseline") == name and (g := setting_of(t))}
            groups["sweep best"] = s.best
        else:
            for t in s.trials:
                if (g := setting_of(t)) is not None:
                    groups.setdefault(strategy(run.cfg, t.params), {})[g] = t
        rows = []
        for key, by_setting in groups.items():
            first = next(iter(by_setting.values()), None)
            label = strategy(run.cfg, _overrides(first, space.baselines)) if first and key != "sweep best" else key
            named = {"baseline": key} if extra and key in space.baselines else {}
            row: dict[str, Any] = {"method": label, **named}
            for setting, t in by_setting.items():
                row.update({f"{setting}/{k}": v for k, v in _scores(final_row(t) or {}).items()})
                row[f"{setting}/trial_id"] = t.trial_id
            rows.append(row)
        return rows

    def plots(self, s: rp.Sweep, run_dir: Path) -> list[Path]:
        return [_plot(run_dir, _curves(s.table, s.trials + s.extra))]

    def render(self, s: rp.Sweep, summary: dict[str, Any], plots: list[Path]) -> str:
        run, space, trials = s.run, s.space, s.trials
        rows, best = summary["table"], summary["best"] or {}
        point = {
            g: rp.point({k: v for k, v in r.items() if "." in k}, skip=("data.setting",)) for g, r in best.items()
        }
        points = "; ".join(f"{SETTING_NAMES[g]}: {r['strategy']} ({point[g]})" for g, r in best.items())
        lines = [
            f"# SemEval-2022 Task 2 Subtask A — {space.name}",
            "",
            *rp.para(_INTRO, *_table(rows, (("dev", "dev_f1"), ("test", "test_f1")))),
            *rp.para("Per language (dev):", *_table(rows, (("EN", "dev_f1/EN"), ("PT", "dev_f1/PT")))),
        ]
        if points:
            lines += [f"Best sweep point per setting: {points}.", ""]
        for split, scores in summary["official"].items():
            title = f"Official scores of `{split}.submission.csv` (both settings filled):"
            flat = {f"{g}/{k}": v for g, by_langs in scores.items() for k, v in by_langs.items()}
            langs = (("EN", "EN"), ("PT", "PT"), ("EN+PT", "EN,PT"))
            lines += rp.para(title, *rp.columns([flat], rp.grid("{0} {1}", "{0}/{1}", _SETTINGS, langs)))
        sweep: list[rp.Column] = [
            ("setting", lambda r: setting_of(r["trial"])),
            ("strategy", lambda r: strategy(run.cfg, r["trial"].params)),
            rp.point_col(skip=("data.setting",)),
            rp.col("best epoch", "best_epoch", _int),
            rp.col("dev", "dev_f1"),
            rp.col("test", "test_f1"),
        ]
        rows = rp.trial_rows(trials, final_row)
        lines += ["## Sweep (macro-F1 EN+PT of the kept epoch, %)", "", *rp.columns(rows, sweep)]
        return "\n".join(lines + rp.closing_lines(run, summary, plots))


REPORT = IdiomReport()


def _curves(table: list[dict[str, Any]], trials: list[TrialOutcome]) -> list[tuple[str, TrialOutcome]]:
    """``(row name, trial)`` of every table row's trials."""
    by_id = {t.trial_id: t for t in trials}
    return [
        (r["method"], by_id[r[f"{s}/trial_id"]])
        for r in table
        for s in A_SETTINGS
        if r.get(f"{s}/trial_id") in by_id
    ]


def _table(rows: list[dict[str, Any]], keys: Sequence[rp.Part]) -> list[str]:
    return rp.columns(rows, [rp.STRATEGY, *rp.grid("{0} {1}", "{0}/{1}", _SETTINGS, keys)])


def _int(v: Any) -> str:
    f = num(v)
    return "–" if f is None else str(int(f))  # Tune's history holds numbers as floats


def _plot(run_dir: Path, curves: list[tuple[str, TrialOutcome]]) -> Path:
    """Dev macro-F1 (EN+PT) after every epoch, one line per strategy, one panel per setting."""
    out: list[Path] = []
    with rp.figure(run_dir / "dev_f1.png", out, ncols=len(A_SETTINGS), size=(5, 4)) as axes:
        for ax, setting in zip(axes, A_SETTINGS, strict=True):
            lines = [(n, rp.curve(t, "dev_f1", "epoch")) for n, t in curves if setting_of(t) == setting]
            rp.plot_curves(
                ax, lines, xlabel="epoch", ylabel="dev macro-F1 EN+PT (%)", title=SETTING_NAMES[setting]
            )
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    return out[0]
