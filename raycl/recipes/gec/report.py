"""The GEC run's outputs: ``results.csv``, ``best.json``, ``report.md`` (the paper's Tables 1–3) and plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raycl.data.gec import load_references
from raycl.data.gec_corpus import stats as corpus_stats
from raycl.data.specs import parse_spec
from raycl.distributed.sweep import TrialOutcome
from raycl.recipes.common import atomic_write, best_row, best_trial, failed, figure, num, pct, write_csv

if TYPE_CHECKING:
    from raycl.config import Space
    from raycl.recipes.driver import Run

PARAM_NAMES = {"loss.margin": "γ", "mining.k": "k", "loss.trade_off": "λ", "mining.source_negative": "source neg."}


def _label(trial: TrialOutcome) -> str:
    name = trial.params.get("baseline")
    if name is not None:
        return {"di": "DI", "nll": "NLL", "cl_minus": "CL⁻"}.get(str(name), str(name))
    return "CL"


def _params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{PARAM_NAMES.get(k, k)}={v}" for k, v in params.items() if k != "baseline") or "default"


# ---------------------------------------------------------------------------------------------- files
def write_all(
    run: Run, space: Space, trials: list[TrialOutcome], extra: list[TrialOutcome]
) -> dict[str, Any]:
    metric, mode = run.cfg.tune.metric, run.cfg.tune.mode
    rows = [_result_row(t, metric, mode) for t in trials + extra]
    write_csv(run.run_dir / "results.csv", rows)
    best = best_trial(trials, metric=metric, mode=mode)
    summary = {
        "space": space.name,
        "run_dir": str(run.run_dir),
        "best": _result_row(best, metric, mode) if best else None,
        "table": _table_rows(trials, extra, metric, mode),
        "timings": run.timings,
        "builtin_data": run.builtin,
        "failed_trials": failed(trials + extra),
    }
    atomic_write(run.run_dir / "best.json", json.dumps(summary["best"], indent=2, default=str))
    plots = _plots(run.run_dir, trials + extra, metric)
    atomic_write(run.run_dir / "report.md", render_report(run, space, summary, trials, plots))
    summary["plots"] = [str(p) for p in plots]
    return summary


def _result_row(trial: TrialOutcome, metric: str, mode: str) -> dict[str, Any]:
    row = best_row(trial, metric, mode) or (trial.history[-1] if trial.history else {})
    out: dict[str, Any] = {"trial_id": trial.trial_id, "method": _label(trial)}
    out.update({k: v for k, v in trial.params.items()})
    keep = ("epoch", "loss", "checkpoint_path")
    out.update({k: v for k, v in row.items() if k in keep or k.startswith(("dev", "test", "timing/", "stream/"))})
    if trial.error:
        out["error"] = trial.error
    return out


def _table_rows(
    trials: list[TrialOutcome], extra: list[TrialOutcome], metric: str, mode: str
) -> list[dict[str, Any]]:
    """Table 2's rows in the paper's order: DI, NLL, CL⁻, CL (the best CL trial by dev)."""
    rows = []
    by_label = {_label(t): t for t in extra}
    best = best_trial(trials, metric=metric, mode=mode)
    for label in ("DI", "NLL", "CL⁻"):
        if label in by_label:
            rows.append({"method": label, **(best_row(by_label[label], metric, mode) or {})})
    for t in extra:
        if _label(t) not in ("DI", "NLL", "CL⁻"):
            rows.append({"method": _label(t), **(best_row(t, metric, mode) or {})})
    if best is not None:
        rows.append({"method": "CL", "params": _params_text(best.params), **(best_row(best, metric, mode) or {})})
    return rows


def render_report(
    run: Run, space: Space, summary: dict[str, Any], trials: list[TrialOutcome], plots: list[Path]
) -> str:
    cfg = run.cfg
    tests = list(cfg.data.test)
    lines = [f"# raycl — {space.name}: GEC with contrastive learning (Cao, Yang, Ng 2021)", ""]
    lines += [f"Run folder `{run.run_dir}`; model preset `{cfg.model.preset}`"
              f"{' (' + cfg.model.name + ')' if cfg.model.name else ''}; "
              f"built-in data for: {', '.join(run.builtin) or 'none'}.", ""]  # fmt: skip
    lines += ["## Results on test (Table 2)", "",
              "P / R / F0.5 in %, each the average over the test set's annotators (the paper's protocol); "
              "the CL row is the sweep's best point by dev F0.5, the other rows run at that point.", ""]
    head = "| Method | " + " | ".join(f"{t} P | {t} R | {t} F0.5" for t in tests) + " | dev F0.5 |"
    lines += [head, "|" + "---|" * (1 + 3 * len(tests) + 1)]
    for row in summary["table"]:
        cells = [pct(row.get(f"test/{t}/{k}")) for t in tests for k in ("p", "r", "f05")]
        name = row["method"] + (f" ({row['params']})" if row.get("params") else "")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {pct(row.get('dev_f05'))} |")
    lines += ["", "## Over-correction and ignored edits (Table 3)", "",
              "| Method | " + " | ".join(f"{t} IE ratio | {t} OE ratio" for t in tests) + " |",
              "|" + "---|" * (1 + 2 * len(tests))]  # fmt: skip
    for row in summary["table"]:
        cells = [pct(row.get(f"test/{t}/{k}")) for t in tests for k in ("ie", "oe")]
        lines.append(f"| {row['method']} | " + " | ".join(cells) + " |")
    lines += ["", "## Sweep (dev F0.5, %, best epoch of each trial)", "",
              "| Point | dev F0.5 | epoch |", "|---|---|---|"]  # fmt: skip
    def dev_of(t: TrialOutcome) -> float:
        return num((best_row(t, "dev_f05") or {}).get("dev_f05")) or -1.0

    for t in sorted(trials, key=dev_of, reverse=True):
        r = best_row(t, "dev_f05") or {}
        lines.append(f"| {_params_text(t.params)} | {pct(r.get('dev_f05'))} | {r.get('epoch', '–')} |")
    lines += ["", "## Data (Table 1)", "", "| Usage | Files | #sent | err% | e/s |", "|---|---|---|---|---|"]
    lines += _data_rows(cfg)
    lines += ["", "## Timings", ""]
    lines += [f"- {k.replace('_s', '')}: {v:.1f} s" for k, v in run.timings.items()]
    steps = [v for t in trials for r in t.history if (v := num(r.get("timing/step"))) is not None]
    if steps:
        lines.append(f"- mean fine-tuning step: {1000 * sum(steps) / len(steps):.1f} ms")
    lines += _stream_lines(trials)
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    if summary["failed_trials"]:
        lines += ["", f"Failed trials: {', '.join(summary['failed_trials'])}"]
    return "\n".join(lines)


def _stream_lines(trials: list[TrialOutcome]) -> list[str]:
    """Mining ‖ training: how long trainers waited for negatives and how stale the negatives were."""
    rows = [r for t in trials for r in t.history if num(r.get("stream/negatives"))]
    if not rows:
        return ["- negatives: pre-mined or not needed (no miner pool in these trials)"]
    wait = sum(num(r.get("timing/mine_wait")) or 0.0 for r in rows)
    first = sum(num(r.get("timing/mine_wait_first")) or 0.0 for r in rows)
    wall = sum(num(r.get("timing/epoch")) or 0.0 for r in rows)
    stale = max(num(r.get("stream/staleness_max")) or 0.0 for r in rows)
    refused = sum(num(r.get("stream/refused")) or 0.0 for r in rows)
    return [f"- mine_wait (trainers waiting for negatives): {wait:.1f} s of {wall:.1f} s of training "
            f"({100 * wait / max(wall, 1e-9):.1f}%; steady state without each epoch's first batch: "
            f"{100 * (wait - first) / max(wall - first, 1e-9):.1f}%)",
            f"- staleness of the negatives used: max {stale:.0f} versions; refused as too stale: {refused:.0f}"]


def _data_rows(cfg: Any) -> list[str]:
    splits = [("Train (D_T)", cfg.data.train), ("Fine-tune (D_F)", cfg.data.finetune)]
    splits += [(f"Dev {n}", s) for n, s in cfg.data.dev.items()]
    splits += [(f"Test {n}", s) for n, s in cfg.data.test.items()]
    out = []
    for usage, specs in splits:
        m2 = [s for s in specs if parse_spec(s).format == "m2"]
        sents = load_references(m2) if m2 else []
        if not sents:
            out.append(f"| {usage} | {', '.join(specs)} | – | – | – |")
            continue
        st = corpus_stats(sents)
        out.append(f"| {usage} | {', '.join(Path(s).name for s in specs)} | {len(sents)} | "
                   f"{100 * st['err_rate']:.1f} | {st['edits_per_error']:.1f} |")  # fmt: skip
    return out


# ---------------------------------------------------------------------------------------------- plots
def _curve(trial: TrialOutcome, metric: str) -> tuple[list[float], list[float]]:
    """(epochs, metric in %) of the reports that carry ``metric``."""
    pts = [(float(r.get("epoch", 0)), num(r.get(metric))) for r in trial.history]
    kept = [(e, v) for e, v in pts if v is not None]
    return [e for e, _ in kept], [100 * v for _, v in kept]


def _plots(run_dir: Path, trials: list[TrialOutcome], metric: str) -> list[Path]:
    out: list[Path] = []
    with figure(run_dir / "dev_curves.png", out) as ax:
        for t in trials:
            xs, ys = _curve(t, metric)
            if xs:
                ax.plot(xs, ys, marker="o", label=f"{_label(t)} {_params_text(t.params)}")
        ax.set(xlabel="epoch", ylabel="dev F0.5 (%)", title="Dev F0.5 during fine-tuning")
        ax.legend(fontsize=6, loc="best")
    cl = [t for t in trials if "loss.margin" in t.params and "baseline" not in t.params]
    if cl:
        with figure(run_dir / "sweep.png", out) as ax:
            for k in sorted({t.params.get("mining.k") for t in cl}, key=str):
                pts = [(float(t.params["loss.margin"]), num((best_row(t, metric) or {}).get(metric)))
                       for t in cl if t.params.get("mining.k") == k]  # fmt: skip
                kept = sorted((g, 100 * v) for g, v in pts if v is not None)
                ax.plot([g for g, _ in kept], [v for _, v in kept], marker="o", label=f"k={k}")
            ax.set(xlabel="margin γ", ylabel="best dev F0.5 (%)", title="Sweep: dev F0.5 against γ and k")
            ax.legend()
    return out
