"""The GEC run's outputs: ``results.csv``, ``best.json``, ``report.md`` (the paper's Tables 1–3) and plots."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raycl import report as rp
from raycl.data.gec import load_references
from raycl.data.gec_corpus import stats as corpus_stats
from raycl.data.specs import parse_spec
from raycl.miners.false_negatives import KINDS, rate_text
from raycl.records import TrialOutcome
from raycl.report import best_row, md_table, num, pct

if TYPE_CHECKING:
    from raycl.config import Space
    from raycl.driver import Run

PARAM_NAMES = {"loss.margin": "γ", "mining.k": "k", "loss.trade_off": "λ", "mining.source_negative": "source neg."}
FN_FILE = "false_negatives.json"  # a contrastive training's false-negative counts (raycl.miners.false_negatives)
FN_DROPPED = "CL (false negatives dropped)"
_LABELS = {"di": "DI", "nll": "NLL", "cl_minus": "CL⁻", "cl_fn_drop": FN_DROPPED}
_AFTER_CL = (FN_DROPPED,)  # ladder rows listed after CL, the row they are compared with
_ORDER = {"DI": 0, "NLL": 1, "CL⁻": 2, "CL": 4, **dict.fromkeys(_AFTER_CL, 5)}  # other baselines: 3
_label = partial(rp.label, names=_LABELS, default="CL")
_params_text = partial(rp.point, symbols=PARAM_NAMES)
_DEV_AXES = {"xlabel": "epoch", "ylabel": "dev F0.5 (%)", "title": "Dev F0.5 during fine-tuning"}
_FN_HEAD = (
    "False negatives — selected negatives equal to another annotator's correction (the unchanged source "
    "where one made no edit), counted before any drop; refuted/selected (rate):"
)


# ---------------------------------------------------------------------------------------------- files
def write_all(run: Run, space: Space, trials: list[TrialOutcome], extra: list[TrialOutcome]) -> dict[str, Any]:
    metric, mode = run.cfg.tune.metric, run.cfg.tune.mode
    best = rp.best_trial(trials, metric=metric, mode=mode)
    paths = {t.trial_id: run.run_dir / "trials" / t.trial_id / FN_FILE for t in trials + extra}
    counts = {i: json.loads(p.read_text()) for i, p in paths.items() if p.exists()}
    return rp.write_run_files(
        run,
        space,
        trials + extra,
        row=lambda t: {**_result_row(t, metric, mode), **_fn_columns(counts.get(t.trial_id, {}))},
        best=_result_row(best, metric, mode) if best else None,
        table=_table_rows(trials, extra, metric, mode),
        plots=lambda d: _plots(d, trials + extra, metric),
        render=partial(render_report, run, space, trials=trials, extra=extra),
        sign_tests=_sign_tests(run, best, extra),
        false_negatives=counts,
    )


def _result_row(trial: TrialOutcome, metric: str, mode: str) -> dict[str, Any]:
    row = best_row(trial, metric, mode) or (trial.history[-1] if trial.history else {})
    keep = ("epoch", "loss", "checkpoint_path"), ("dev", "test", "timing/", "stream/")
    return rp.trial_row(trial, {"method": _label(trial)}, row, *keep)


def _table_rows(trials: list[TrialOutcome], extra: list[TrialOutcome], metric: str, mode: str) -> list[dict]:
    """Table 2's rows in the paper's order: DI, NLL, CL⁻, then other baselines, CL (the best CL trial by dev), then
    the rows compared with CL."""
    rows = [{"method": _label(t), **(best_row(t, metric, mode) or {})} for t in extra]
    if best := rp.best_trial(trials, metric=metric, mode=mode):
        rows.append({"method": "CL", "params": _params_text(best.params), **(best_row(best, metric, mode) or {})})
    return sorted(rows, key=lambda r: _ORDER.get(r["method"], 3))


def render_report(
    run: Run,
    space: Space,
    summary: dict[str, Any],
    plots: list[Path],
    *,
    trials: list[TrialOutcome],
    extra: Sequence[TrialOutcome] = (),
) -> str:
    cfg, tests, table = run.cfg, list(run.cfg.data.test), summary["table"]
    builtin = ", ".join(run.builtin) or "none"
    model = f"`{cfg.model.preset}`" + (f" ({cfg.model.name})" if cfg.model.name else "")
    prf = rp.pct_columns(
        (f"{t} {k}", f"test/{t}/{k.lower().replace('.', '')}") for t in tests for k in ("P", "R", "F0.5")
    )
    ratios = rp.pct_columns((f"{t} {k} ratio", f"test/{t}/{k.lower()}") for t in tests for k in ("IE", "OE"))
    method: rp.Column = ("Method", lambda r: r["method"])
    name: rp.Column = ("Method", lambda r: r["method"] + (f" ({r['params']})" if r.get("params") else ""))
    dev: rp.Column = ("dev F0.5", lambda r: pct(r.get("dev_f05")))
    best = sorted(
        ((best_row(t, "dev_f05") or {}, t) for t in trials),
        key=lambda rt: num(rt[0].get("dev_f05")) or -1.0,
        reverse=True,
    )
    intro = (
        "P / R / F0.5 in %, each the average over the test set's annotators (the paper's protocol); the CL "
        "row is the sweep's best point by dev F0.5, the other rows run at that point."
    )
    sweep = [[_params_text(t.params), pct(r.get("dev_f05")), r.get("epoch", "–")] for r, t in best]
    lines = [
        f"# raycl — {space.name}: GEC with contrastive learning (Cao, Yang, Ng 2021)",
        "",
        f"Run folder `{run.run_dir}`; model preset {model}; built-in data for: {builtin}.",
        *rp.section("Results on test (Table 2)", intro, "", *rp.columns(table, [name, *prf, dev])),
        *_sign_lines(summary.get("sign_tests", [])),
        *_fn_lines(summary.get("false_negatives", {}), [*trials, *extra]),
        *rp.section("Over-correction and ignored edits (Table 3)", *rp.columns(table, [method, *ratios])),
        *rp.section(
            "Sweep (dev F0.5, %, best epoch of each trial)", *md_table(["Point", "dev F0.5", "epoch"], sweep)
        ),
        *rp.section("Data (Table 1)", *md_table(["Usage", "Files", "#sent", "err%", "e/s"], _data_rows(cfg))),
        *rp.section("Timings", *(f"- {k.removesuffix('_s')}: {v:.1f} s" for k, v in run.timings.items())),
    ]
    steps = [v for t in trials for r in t.history if (v := num(r.get("timing/step"))) is not None]
    if steps:
        lines.append(f"- mean fine-tuning step: {1000 * sum(steps) / len(steps):.1f} ms")
    lines += _nbest_lines(run) + _stream_lines(trials)
    if plots:
        lines += rp.section("Plots", *(f"![{p.stem}]({p.name})" for p in plots))
    if summary["failed_trials"]:
        lines += ["", f"Failed trials: {', '.join(summary['failed_trials'])}"]
    return "\n".join(lines)


def _nbest_lines(run: Run) -> list[str]:
    """The run's shared n-best (version-0 negatives mined once for every trial), when there is one."""
    meta_path = run.run_dir / "nbest" / "meta.json"
    if not meta_path.exists():
        return []
    meta = json.loads(meta_path.read_text())
    o, resumed = meta.get("options", {}), meta.get("resumed")
    how = f"reused from an earlier run ({meta.get('resumed', 0)} lists)"
    if searched := meta.get("beam_searched"):
        how = f"{searched} sentences beam-searched in {meta.get('mine_s', 0.0):.1f} s of miner time"
        how += f", {resumed} reused" if resumed else ""
    engine = str(meta.get("engine") or o.get("engine")) + (" (auto)" * (meta.get("engine_requested") == "auto"))
    return [
        f"- n-best lists of D_F mined once for the whole run (`nbest/`, beam {o.get('beam')}, engine "
        f"{engine}, {o.get('precision')}): {meta['examples']} sentences, {how}; every trial selected its k "
        "and CL/CL⁻ from them"
    ]


def _stream_lines(trials: list[TrialOutcome]) -> list[str]:
    """Mining ‖ training: how long trainers waited for negatives and how stale the negatives were."""
    rows = [r for t in trials for r in t.history if num(r.get("stream/negatives"))]
    if not rows:
        return ["- negatives: pre-mined or not needed (no miner pool in these trials)"]
    wait, wall, stale, refused = rp.stream_totals(rows)
    first = sum(num(r.get("timing/mine_wait_first")) or 0.0 for r in rows)
    return [
        f"- mine_wait (trainers waiting for negatives): {wait:.1f} s of {wall:.1f} s of training "
        f"({100 * wait / max(wall, 1e-9):.1f}%; steady state without each epoch's first batch: "
        f"{100 * (wait - first) / max(wall - first, 1e-9):.1f}%)",
        f"- staleness of the negatives used: max {stale:.0f} versions; refused as too stale: {refused:.0f}",
    ]


def _data_rows(cfg: Any) -> list[list[Any]]:
    """Table 1: each split's files, sentences, erroneous sentences (%) and edits per erroneous sentence."""
    d, out = cfg.data, []
    for usage, specs in [
        ("Train (D_T)", d.train),
        ("Fine-tune (D_F)", d.finetune),
        *((f"Dev {n}", s) for n, s in d.dev.items()),
        *((f"Test {n}", s) for n, s in d.test.items()),
    ]:
        sents = load_references(m2) if (m2 := [s for s in specs if parse_spec(s).format == "m2"]) else []
        st = corpus_stats(sents) if sents else None
        stats = [len(sents), f"{100 * st['err_rate']:.1f}", f"{st['edits_per_error']:.1f}"] if st else ["–"] * 3
        out.append([usage, ", ".join(Path(s).name for s in specs) if st else ", ".join(specs), *stats])
    return out


# ---------------------------------------------------------------------------------------------- false negatives
def _fn_columns(counts: dict[str, Any]) -> dict[str, Any]:
    """results.csv's columns of a trial's false-negative counts (``fn/source_selected``, ...), if it has some."""
    return {f"fn/{k}_{what}": counts[k][what] for k in KINDS for what in ("selected", "refuted") if counts}


def _fn_lines(counts: dict[str, dict[str, Any]], trials: list[TrialOutcome]) -> list[str]:
    """Each contrastive training's negatives that another annotator's correction equals, counted before a drop."""
    head = ["Training", "Point", "mining.false_negatives", "source", "beam"]
    fn = [(t, counts[t.trial_id]) for t in trials if t.trial_id in counts]
    rows = [
        [_label(t), _params_text(t.params), c.get("mode", "keep"), *(rate_text(c, k) for k in KINDS)]
        for t, c in fn
    ]
    return ["", _FN_HEAD, "", *md_table(head, rows)] if counts else []


def _sign_tests(run: Run, best: TrialOutcome | None, extra: list[TrialOutcome]) -> list[dict[str, Any]]:
    """Each row after CL against CL (the paper's bootstrap sign test on every test set)."""
    from raycl.recipes.gec.evaluation import sign_tests

    if best is None:
        return []
    trials = run.run_dir / "trials"
    return [
        {
            "method": _label(t),
            "against": "CL",
            "tests": sign_tests(trials / t.trial_id, trials / best.trial_id, run.cfg.data.test),
        }
        for t in extra
        if _label(t) in _AFTER_CL
    ]


def _sign_lines(signs: list[dict[str, Any]]) -> list[str]:
    """One line a compared row: wins/losses/ties of the bootstrap samples, p one way and (the same samples) the
    other."""
    from raycl.scoring.gec_metrics import sign_test_p

    lines = []
    for s in signs:
        how = f"{s['method']} better than {s['against']} (one-tailed, 100 bootstrap samples of each test set, as"
        got = [
            f"{n}: wins {t['wins']}, losses {t['losses']}, ties {t['ties']}, p = {t['p_value']:.3g} "
            f"({s['against']} better: p = {sign_test_p(t['losses'], t['wins']):.3g})"
            for n, t in s["tests"].items()
        ]
        lines += [
            "",
            f"Sign test, {how} `raycl.eval gec --compare`): {'; '.join(got) or 'no test hypotheses kept'}.",
        ]
    return lines


# ---------------------------------------------------------------------------------------------- plots
def _plots(run_dir: Path, trials: list[TrialOutcome], metric: str) -> list[Path]:
    out: list[Path] = []
    with rp.figure(run_dir / "dev_curves.png", out) as ax:
        curves = [(f"{_label(t)} {_params_text(t.params)}", rp.curve(t, metric, "epoch", False)) for t in trials]
        rp.plot_curves(ax, curves, legend={"fontsize": 6, "loc": "best"}, **_DEV_AXES)
    cl = [t for t in trials if "loss.margin" in t.params and "baseline" not in t.params]
    if cl:
        with rp.figure(run_dir / "sweep.png", out) as ax:
            for k in sorted({t.params.get("mining.k") for t in cl}, key=str):
                ts = [t for t in cl if t.params.get("mining.k") == k]
                got = [(float(t.params["loss.margin"]), rp.best_value(t, metric)) for t in ts]
                pts = sorted((g, 100 * v) for g, v in got if v is not None)
                ax.plot([g for g, _ in pts], [v for _, v in pts], marker="o", label=f"k={k}")
            ax.set(xlabel="margin γ", ylabel="best dev F0.5 (%)", title="Sweep: dev F0.5 against γ and k")
            ax.legend()
    return out
