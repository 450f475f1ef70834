"""Scores and outputs of the Subtask A recipe.

The worker's side (:class:`Evaluator`): label predictions of one setting's inputs (zero-shot: the text
"Previous Target Next"; one-shot: the pair (Target, MWE)), the official macro-F1 of dev after every epoch
(EN, PT, EN+PT; ``score_idiom`` on the rows in memory), and at the end the setting's submissions of dev and eval
in the official layout, scored with ``evaluate_idiom``.

The driver's side (:func:`write_all`): the run's submissions (each setting's rows from its chosen trial, so both
settings are filled), ``results.csv``, ``best.json``, ``report.md`` in the style of the paper's Tables 3–4 (rows
add one strategy each: baseline → + EMA → + FGM / PGD / FreeLB / SMART; columns: dev and test macro-F1 per
setting) and a PNG of dev F1 over epochs per strategy.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from raycl.data.semeval import (
    A_GOLD_HEADER,
    A_SETTINGS,
    A_SUBMISSION_HEADER,
    IdiomExample,
    Value,
    fill_submission,
    read_idiom_inputs,
    read_rows,
    write_submission_a,
)
from raycl.evaluation.semeval_metrics import LANGUAGE_SETS, evaluate_idiom, score_idiom
from raycl.models.classifier import encode_batch
from raycl.recipes.common import atomic_write, num, save_png, write_csv

if TYPE_CHECKING:
    from raycl.config import Space
    from raycl.configs.idiom import IdiomConfig
    from raycl.distributed.sweep import TrialOutcome
    from raycl.recipes.idiom import IdiomRun

ModelInput = str | tuple[str, str]
METHOD_NAMES = {"fgm": "FGM", "pgd": "PGD", "freelb": "FreeLB", "smart": "SMART"}
SETTING_NAMES = {"zero_shot": "zero-shot", "one_shot": "one-shot"}


# ---------------------------------------------------------------------------------------------- predictions
def model_input(example: IdiomExample, setting: str) -> ModelInput:
    """SPEC §3.1: zero-shot reads the context and target without the MWE; one-shot the (Target, MWE) pair."""
    return example.zero_shot_text() if setting == "zero_shot" else example.one_shot_pair()


@torch.no_grad()
def predict(model: Any, tokenizer: Any, inputs: Sequence[ModelInput], *, max_len: int, batch_size: int
            ) -> list[int]:  # fmt: skip
    """The argmax label of every input (0 idiomatic, 1 non-idiomatic); the caller sets eval mode."""
    device = next(model.parameters()).device
    out: list[int] = []
    for i in range(0, len(inputs), batch_size):
        batch = encode_batch(tokenizer, list(inputs[i : i + batch_size]), max_len=max_len)  # type: ignore[arg-type]
        logits = model(**{k: v.to(device) for k, v in batch.items()}).logits  # (b, 2)
        out += logits.argmax(dim=-1).tolist()
    return out


def _f1s(prefix: str, scores: dict[str, float | None]) -> dict[str, float | None]:
    """``{"EN": f, "PT": f, "EN,PT": f}`` -> ``{"dev_f1/EN": f, "dev_f1/PT": f, "dev_f1": f}``."""
    return {prefix if langs == "EN,PT" else f"{prefix}/{langs}": v for langs, v in scores.items()}


def write_submission(format_csv: str, examples: Sequence[IdiomExample],
                     preds: dict[tuple[str, str], Value], out: Path) -> Path:  # fmt: skip
    """The official submission: the format file filled (``fill_submission``), or, without one, the official
    layout in input order; cells without a prediction stay blank."""
    if format_csv:
        return fill_submission(format_csv, preds, out)
    rows = [(e.id, e.language, *(preds.get((e.id, s)) for s in A_SETTINGS)) for e in examples]
    return write_submission_a(out, rows)  # type: ignore[arg-type]


class Evaluator:
    """Rank 0's dev and eval sets of one setting, read once."""

    def __init__(self, cfg: IdiomConfig, setting: str) -> None:
        self.cfg, self.setting, d = cfg, setting, cfg.data
        self.dev = read_idiom_inputs(d.dev)
        self.eval = read_idiom_inputs(d.eval) if d.eval else []
        self.dev_gold = list(read_rows(d.dev_gold, A_GOLD_HEADER))

    def _predict(self, model: Any, tokenizer: Any, examples: Sequence[IdiomExample]) -> list[int]:
        inputs = [model_input(e, self.setting) for e in examples]
        return predict(model, tokenizer, inputs, max_len=self.cfg.model.max_len,
                       batch_size=self.cfg.eval.batch_size)  # fmt: skip

    def dev_scores(self, model: Any, tokenizer: Any) -> dict[str, float | None]:
        """Official dev macro-F1 of this setting: ``dev_f1`` (EN+PT), ``dev_f1/EN``, ``dev_f1/PT``."""
        labels = self._predict(model, tokenizer, self.dev)
        rows = [(i + 2, [e.id, e.language, self.setting, str(y)]) for i, (e, y) in enumerate(zip(self.dev, labels,
                                                                                                strict=True))]
        names = (f"{self.setting} dev predictions", self.cfg.data.dev_gold)
        return _f1s("dev_f1", {",".join(langs): score_idiom(rows, self.dev_gold, setting=self.setting,
                                                            languages=langs, names=names)
                               for langs in LANGUAGE_SETS})  # fmt: skip

    def final(self, model: Any, tokenizer: Any, out_dir: Path) -> dict[str, float | None]:
        """This setting's rows of ``dev.submission.csv`` and ``eval.submission.csv``, officially scored."""
        d, out = self.cfg.data, {}
        splits = (("dev", self.dev, d.dev_submission_format, d.dev_gold, "dev_f1"),
                  ("eval", self.eval, d.eval_submission_format, d.eval_gold, "test_f1"))  # fmt: skip
        for split, examples, fmt, gold, prefix in splits:
            if not examples:
                continue
            labels = self._predict(model, tokenizer, examples)
            preds: dict[tuple[str, str], Value] = {(e.id, self.setting): y for e, y in zip(examples, labels,
                                                                                          strict=True)}
            sub = write_submission(fmt, examples, preds, out_dir / f"{split}.submission.csv")
            if gold:
                out.update(_f1s(prefix, evaluate_idiom(sub, gold)[self.setting]))
        return out


# ---------------------------------------------------------------------------------------------- trials
def final_row(trial: TrialOutcome) -> dict[str, Any] | None:
    """The trial's closing report (its official scores), or None when it did not finish."""
    return next((r for r in reversed(trial.history) if num(r.get("final")) == 1), None)


def setting_of(trial: TrialOutcome) -> str | None:
    row = final_row(trial) or (trial.history[-1] if trial.history else {})
    value = row.get("setting", trial.params.get("data.setting"))
    return value if value in A_SETTINGS else None


def best_trials(trials: list[TrialOutcome], *, metric: str, mode: str = "max") -> dict[str, TrialOutcome]:
    """Per setting, the trial whose closing report has the best ``metric`` (dev F1 of the kept epoch)."""
    sign, out = (1.0 if mode == "max" else -1.0), {}
    for setting in A_SETTINGS:
        scored = [(sign * v, -i) for i, t in enumerate(trials)
                  if setting_of(t) == setting and (v := num((final_row(t) or {}).get(metric))) is not None]
        if scored:
            out[setting] = trials[-max(scored)[1]]
    return out


def strategy(cfg: IdiomConfig, over: dict[str, Any]) -> str:
    """A trial's row name from its effective EMA switch and adversarial method."""
    ema = over.get("ema.enabled", cfg.ema.enabled)
    method = over.get("adversarial.method", cfg.adversarial.method)
    return ("+ EMA" if ema else "baseline") + (f" + {METHOD_NAMES[method]}" if method in METHOD_NAMES else "")


def _scores(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k.startswith(("dev_f1", "test_f1"))}


def _overrides(trial: TrialOutcome, baselines: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {**trial.params, **baselines.get(trial.params.get("baseline", ""), {})}


def _row(run: IdiomRun, trial: TrialOutcome, baselines: dict[str, dict[str, Any]]) -> dict[str, Any]:
    final = final_row(trial) or {}
    row: dict[str, Any] = {"trial_id": trial.trial_id, "setting": setting_of(trial),
                           "strategy": strategy(run.cfg, _overrides(trial, baselines)), **trial.params,
                           "best_epoch": final.get("best_epoch"), **_scores(final)}  # fmt: skip
    if trial.error:
        row["error"] = trial.error
    return row


# ---------------------------------------------------------------------------------------------- the run's files
def export_submissions(run: IdiomRun, chosen: dict[str, TrialOutcome]) -> dict[str, Any]:
    """``dev.submission.csv`` and ``eval.submission.csv`` of the run: each setting's rows from its chosen
    trial; scored with ``evaluate_idiom`` where gold exists (``{split: {setting: {langs: F1}}}``)."""
    d, scores = run.cfg.data, {}
    for split, inputs, fmt, gold in (("dev", d.dev, d.dev_submission_format, d.dev_gold),
                                     ("eval", d.eval, d.eval_submission_format, d.eval_gold)):  # fmt: skip
        preds: dict[tuple[str, str], Value] = {}
        for setting, trial in chosen.items():
            path = run.run_dir / "trials" / trial.trial_id / f"{split}.submission.csv"
            if path.exists():
                preds.update({(r[0], setting): int(r[3]) for _, r in read_rows(path, A_SUBMISSION_HEADER)
                              if r[2] == setting and r[3] != ""})  # fmt: skip
        if not inputs or not preds:
            continue
        sub = write_submission(fmt, read_idiom_inputs(inputs), preds, run.run_dir / f"{split}.submission.csv")
        if gold:
            scores[split] = evaluate_idiom(sub, gold)
    return scores


def _ladder(run: IdiomRun, space: Space, trials: list[TrialOutcome], extra: list[TrialOutcome],
            best: dict[str, TrialOutcome]) -> list[dict[str, Any]]:  # fmt: skip
    """Table rows: the baselines in the space's order at each setting's best point, then the sweep's best; or,
    without baselines, one row per strategy trained."""
    groups: dict[str, dict[str, TrialOutcome]] = {}
    if extra:
        for name in (n for n in space.baselines if any(t.params.get("baseline") == n for t in extra)):
            groups[name] = {s: t for t in extra if t.params.get("baseline") == name and (s := setting_of(t))}
        groups["sweep best"] = best
    else:
        for t in trials:
            if (s := setting_of(t)) is not None:
                groups.setdefault(strategy(run.cfg, t.params), {})[s] = t
    rows = []
    for key, by_setting in groups.items():
        first = next(iter(by_setting.values()), None)
        label = strategy(run.cfg, _overrides(first, space.baselines)) if first and key != "sweep best" else key
        row: dict[str, Any] = {"method": label, **({"baseline": key} if extra and key in space.baselines else {})}
        for s, t in by_setting.items():
            row.update({f"{s}/{k}": v for k, v in _scores(final_row(t) or {}).items()})
            row[f"{s}/trial_id"] = t.trial_id
        rows.append(row)
    return rows


def write_all(run: IdiomRun, space: Space, trials: list[TrialOutcome], extra: list[TrialOutcome]
              ) -> dict[str, Any]:  # fmt: skip
    metric, mode = run.cfg.tune.metric, run.cfg.tune.mode
    write_csv(run.run_dir / "results.csv", [_row(run, t, space.baselines) for t in trials + extra])
    best = best_trials(trials, metric=metric, mode=mode)
    official = export_submissions(run, best)
    table = _ladder(run, space, trials, extra, best)
    summary = {"space": space.name, "run_dir": str(run.run_dir),
               "best": {s: _row(run, t, space.baselines) for s, t in best.items()} or None,
               "table": table, "official": official, "timings": run.timings, "builtin_data": run.builtin,
               "data": run.counts, "failed_trials": [t.trial_id for t in trials + extra if t.error]}  # fmt: skip
    atomic_write(run.run_dir / "best.json", json.dumps(summary["best"], indent=2, default=str))
    plots = [_plot(run.run_dir, _curves(table, trials + extra))]
    atomic_write(run.run_dir / "report.md", _render(run, space, summary, trials, plots))
    summary["plots"] = [str(p) for p in plots]
    return summary


def _curves(table: list[dict[str, Any]], trials: list[TrialOutcome]) -> list[tuple[str, TrialOutcome]]:
    """``(row name, trial)`` of every table row's trials."""
    by_id = {t.trial_id: t for t in trials}
    return [(r["method"], by_id[r[f"{s}/trial_id"]]) for r in table
            for s in A_SETTINGS if r.get(f"{s}/trial_id") in by_id]  # fmt: skip


def _pct(v: Any) -> str:
    f = num(v)
    return "–" if f is None else f"{100 * f:.2f}"


def _table(rows: list[dict[str, Any]], keys: Sequence[tuple[str, str]]) -> list[str]:
    head = ["Strategy", *[f"{SETTING_NAMES[s]} {name}" for s in A_SETTINGS for _, name in keys]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [_pct(r.get(f"{s}/{k}")) for s in A_SETTINGS for k, _ in keys]
        lines.append(f"| {r['method']} | " + " | ".join(cells) + " |")
    return lines


def _int(v: Any) -> str:
    f = num(v)
    return "–" if f is None else str(int(f))  # Tune's history holds numbers as floats


def _point(trial: TrialOutcome) -> str:
    return ", ".join(f"{k}={v}" for k, v in trial.params.items() if k != "data.setting") or "default"


def _point_of(row: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in row.items() if "." in k and k != "data.setting") or "default"


def _render(run: IdiomRun, space: Space, summary: dict[str, Any], trials: list[TrialOutcome],
            plots: list[Path]) -> str:  # fmt: skip
    rows, best = summary["table"], summary["best"] or {}
    points = "; ".join(f"{SETTING_NAMES[s]}: {r['strategy']} ({_point_of(r)})" for s, r in best.items())
    lines = [f"# SemEval-2022 Task 2 Subtask A — {space.name}", "",
             "Tables 3–4: macro-F1 (%, EN+PT) of the official evaluator; dev = the epoch kept on dev (with the "
             "EMA weights where EMA is on), test = the eval split scored with that model. Each row adds one "
             "strategy to the row above, run at the setting's best sweep point; the last row is that point.", "",
             *_table(rows, (("dev_f1", "dev"), ("test_f1", "test"))), "", "Per language (dev):", "",
             *_table(rows, (("dev_f1/EN", "EN"), ("dev_f1/PT", "PT"))), ""]  # fmt: skip
    if points:
        lines += [f"Best sweep point per setting: {points}.", ""]
    for split, scores in summary["official"].items():
        cells = [_pct(scores.get(s, {}).get(langs)) for s in A_SETTINGS for langs in ("EN", "PT", "EN,PT")]
        head = [f"{SETTING_NAMES[s]} {lang}" for s in A_SETTINGS for lang in ("EN", "PT", "EN+PT")]
        lines += [f"Official scores of `{split}.submission.csv` (both settings filled):", "",
                  "| " + " | ".join(head) + " |", "|" + "---|" * len(head), "| " + " | ".join(cells) + " |", ""]
    lines += ["## Sweep (macro-F1 EN+PT of the kept epoch, %)", "",
              "| setting | strategy | point | best epoch | dev | test |", "|---|---|---|---|---|---|"]
    for t in trials:
        f = final_row(t) or {}
        lines.append(f"| {setting_of(t)} | {strategy(run.cfg, t.params)} | {_point(t)} | "
                     f"{_int(f.get('best_epoch'))} | {_pct(f.get('dev_f1'))} | {_pct(f.get('test_f1'))} |")
    lines += ["", f"Data: {', '.join(f'{k} {v}' for k, v in run.counts.items())}"
              + (f" (built-in: {', '.join(run.builtin)})" if run.builtin else "") + ".", "",
              "## Timings", "", ", ".join(f"{k} {v:.1f} s" for k, v in run.timings.items()), ""]  # fmt: skip
    if summary["failed_trials"]:
        lines += [f"Failed trials: {', '.join(summary['failed_trials'])}", ""]
    return "\n".join(lines + [f"![{p.stem}]({p.name})" for p in plots])


def _plot(run_dir: Path, curves: list[tuple[str, TrialOutcome]]) -> Path:
    """Dev macro-F1 (EN+PT) after every epoch, one line per strategy, one panel per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(A_SETTINGS), figsize=(10, 4), squeeze=False)
    for ax, setting in zip(axes[0], A_SETTINGS, strict=True):
        for label, t in ((n, t) for n, t in curves if setting_of(t) == setting):
            pts = [(r["epoch"], 100 * v) for r in t.history if num(r.get("final")) != 1
                   and (v := num(r.get("dev_f1"))) is not None]  # fmt: skip
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=label)
        ax.set(xlabel="epoch", ylabel="dev macro-F1 EN+PT (%)", title=SETTING_NAMES[setting])
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    path = save_png(fig, run_dir / "dev_f1.png")
    plt.close(fig)
    return path
