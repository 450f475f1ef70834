"""The GEC run's outputs: ``results.csv``, ``best.json``, ``report.md`` (the paper's Tables 1–3) and plots."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raycl import report as rp
from raycl.data.gec import load_references
from raycl.data.gec_corpus import stats as corpus_stats
from raycl.data.specs import parse_spec
from raycl.miners.false_negatives import KINDS, rate_text
from raycl.records import TrialOutcome
from raycl.report import best_row, md_table, num

if TYPE_CHECKING:
    from raycl.driver import Run

PARAM_NAMES = {"loss.margin": "γ", "mining.k": "k", "loss.trade_off": "λ", "mining.source_negative": "source neg."}
FN_FILE = "false_negatives.json"  # a contrastive training's false-negative counts (raycl.miners.false_negatives)
FN_DROPPED = "CL (false negatives dropped)"
_LABELS = {"di": "DI", "nll": "NLL", "cl_minus": "CL⁻", "cl_fn_drop": FN_DROPPED}
_AFTER_CL = ("cl_fn_drop",)  # ladder rows listed after CL, the row they are compared with
_ORDER = ("di", "nll", "cl_minus", ..., None, *_AFTER_CL)  # Table 2's rows (None: CL, the sweep's best)
_params_text = partial(rp.point, symbols=PARAM_NAMES)
_DEV_AXES = {"xlabel": "epoch", "ylabel": "dev F0.5 (%)", "title": "Dev F0.5 during fine-tuning"}
_FN_HEAD = (
    "False negatives — selected negatives equal to another annotator's correction (the unchanged source "
    "where one made no edit), counted before any drop; refuted/selected (rate):"
)


class GecReport(rp.RecipeReport):
    names, default, order = _LABELS, "CL", _ORDER
    keep = ("epoch", "loss", "checkpoint_path"), ("dev", "test", "timing/", "stream/")

    def more(self, s: rp.Sweep) -> dict[str, Any]:
        """The sign tests of the rows after CL, and each training's false-negative counts (its ``FN_FILE``)."""
        paths = {t.trial_id: s.run.run_dir / "trials" / t.trial_id / FN_FILE for t in s.trials + s.extra}
        counts = {i: json.loads(p.read_text()) for i, p in paths.items() if p.exists()}
        return {"sign_tests": _sign_tests(s.run, s.best.get(None), s.extra), "false_negatives": counts}

    def csv_row(self, s: rp.Sweep, trial: TrialOutcome) -> dict[str, Any]:
        return {**self.row(s, trial), **_fn_columns(s.more["false_negatives"].get(trial.trial_id, {}))}

    def table(self, s: rp.Sweep) -> list[dict[str, Any]]:
        """Table 2's rows in the paper's order: DI, NLL, CL⁻, then other baselines, CL (the best CL trial by dev),
        then the rows compared with CL."""
        best = s.best.get(None)
        return [
            {"method": self.label(t), **({"params": _params_text(t.params)} if t is best else {})}
            | (best_row(t, s.metric, s.mode) or {})
            for t in self.ladder(s)
        ]

    def render(self, s: rp.Sweep, summary: dict[str, Any], plots: list[Path]) -> str:
        run, trials = s.run, s.trials
        cfg, tests, table = run.cfg, list(run.cfg.data.test), summary["table"]
        builtin = ", ".join(run.builtin) or "none"
        model = f"`{cfg.model.preset}`" + (f" ({cfg.model.name})" if cfg.model.name else "")
        prf = rp.grid("{0} {1}", "test/{0}/{1}", tests, [("P", "p"), ("R", "r"), ("F0.5", "f05")])
        ratios = rp.grid("{0} {1} ratio", "test/{0}/{1}", tests, [("IE", "ie"), ("OE", "oe")])
        name: rp.Column = ("Method", lambda r: r["method"] + (f" ({r['params']})" if r.get("params") else ""))
        table_2 = [name, *prf, rp.col("dev F0.5", "dev_f05")]
        epoch: rp.Column = ("epoch", lambda r: r.get("epoch", "–"))
        sweep = [rp.point_col("Point", PARAM_NAMES), rp.col("dev F0.5", "dev_f05"), epoch]
        best = rp.trial_rows(trials, partial(best_row, metric="dev_f05"))
        best.sort(key=lambda r: num(r.get("dev_f05")) or -1.0, reverse=True)
        intro = (
            "P / R / F0.5 in %, each the average over the test set's annotators (the paper's protocol); the CL "
            "row is the sweep's best point by dev F0.5, the other rows run at that point."
        )
        lines = [
            f"# raycl — {s.space.name}: GEC with contrastive learning (Cao, Yang, Ng 2021)",
            "",
            f"Run folder `{run.run_dir}`; model preset {model}; built-in data for: {builtin}.",
            *rp.section("Results on test (Table 2)", intro, "", *rp.columns(table, table_2)),
            *_sign_lines(summary.get("sign_tests", [])),
            *_fn_lines(summary.get("false_negatives", {}), [*trials, *s.extra]),
            *rp.section("Over-correction and ignored edits (Table 3)", *rp.columns(table, [rp.METHOD, *ratios])),
            *rp.section("Sweep (dev F0.5, %, best epoch of each trial)", *rp.columns(best, sweep)),
            *rp.section("Data (Table 1)", *md_table(["Usage", "Files", "#sent", "err%", "e/s"], _data_rows(cfg))),
            *rp.section("Timings", *(f"- {k.removesuffix('_s')}: {v:.1f} s" for k, v in run.timings.items())),
        ]
        steps = [v for t in trials for r in t.history if (v := num(r.get("timing/step"))) is not None]
        if steps:
            lines.append(f"- mean fine-tuning step: {1000 * sum(steps) / len(steps):.1f} ms")
        lines += _nbest_lines(run) + rp.stream_lines(trials)
        if plots:
            lines += rp.section("Plots", *(f"![{p.stem}]({p.name})" for p in plots))
        if summary["failed_trials"]:
            lines += ["", f"Failed trials: {', '.join(summary['failed_trials'])}"]
        return "\n".join(lines)

    def plots(self, s: rp.Sweep, run_dir: Path) -> list[Path]:
        out: list[Path] = []
        trials, metric = s.trials + s.extra, s.metric
        curves = [
            (f"{self.label(t)} {_params_text(t.params)}", rp.curve(t, metric, "epoch", False)) for t in trials
        ]
        rp.curves_png(run_dir / "dev_curves.png", out, curves, legend={"fontsize": 6, "loc": "best"}, **_DEV_AXES)
        if cl := [t for t in trials if "loss.margin" in t.params and "baseline" not in t.params]:
            with rp.figure(run_dir / "sweep.png", out) as ax:
                _sweep_plot(ax, cl, metric)
        return out


REPORT = GecReport()
_label = REPORT.label


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
        if t.params.get("baseline") in _AFTER_CL
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


def _sweep_plot(ax: Any, cl: list[TrialOutcome], metric: str) -> None:
    """The sweep's best dev F0.5 against γ, one line per k."""
    for k in sorted({t.params.get("mining.k") for t in cl}, key=str):
        got = [
            (float(t.params["loss.margin"]), rp.best_value(t, metric)) for t in cl if t.params.get("mining.k") == k
        ]
        pts = sorted((g, 100 * v) for g, v in got if v is not None)
        ax.plot([g for g, _ in pts], [v for _, v in pts], marker="o", label=f"k={k}")
    ax.set(xlabel="margin γ", ylabel="best dev F0.5 (%)", title="Sweep: dev F0.5 against γ and k")
    ax.legend()
