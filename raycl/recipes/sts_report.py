"""Scores and outputs of the Subtask B recipe.

The worker's side (:class:`Evaluator`): similarity predictions (the cross-attended cosine, or the plain cosine of
mean-pooled embeddings without cross-attention), the official Spearman of dev during training, and at the end the
official submissions of dev and eval for both settings, scored with ``evaluate_sts``, plus the alignment and
uniformity of the sentence embeddings (the paper's §5, Fig. 5).

The driver's side (:func:`write_all`): ``results.csv``, ``best.json``, ``report.md`` with the paper's Table 5 (rows
add one strategy each: MSE only → + cross-attention → + InfoNCE in-batch → + MoCo queue, the sweep's best point;
columns: Spearman ALL / Idiom / STS per setting) and the plots (Fig. 5, dev curves).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from raycl.data.semeval import (
    B_GOLD_HEADER,
    StsPair,
    fill_submission,
    read_rows,
    read_sts_inputs,
    read_sts_pretrain,
)
from raycl.evaluation.embedding_geometry import alignment, plot_alignment_uniformity, uniformity
from raycl.evaluation.semeval_metrics import SUBSETS, evaluate_sts, score_sts
from raycl.models.sentence_encoder import SentenceEncoder
from raycl.recipes.common import atomic_write, num, save_png, write_csv

if TYPE_CHECKING:
    from raycl.config import Space
    from raycl.configs.sts import StsConfig
    from raycl.distributed.sweep import TrialOutcome
    from raycl.recipes.sts import StsRun

SETTINGS = ("pre_train", "fine_tune")
LADDER = (("mse_only", "MSE only"), ("cross_attention", "+ cross-attention"),
          ("infonce", "+ InfoNCE (in-batch)"), (None, "+ MoCo queue"))  # fmt: skip
SYMBOLS = {"loss.lam": "λ", "loss.temperature": "τ", "moco.queue_size": "Q", "moco.m": "m", "loss.joint": "joint"}


# ---------------------------------------------------------------------------------------------- predictions
def pair_embeddings(enc: SentenceEncoder, a: list[str], b: list[str], *, cross: bool
                    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(B, H), (B, H): the cross-attended pair, or each side's mean-pooled encoder output (no cross-attention)."""
    return enc.pair_embeddings(a, b) if cross else (enc.encode(a), enc.encode(b))


@torch.no_grad()
def similarities(enc: SentenceEncoder, a: Sequence[str], b: Sequence[str], *, cross: bool, batch_size: int
                 ) -> list[float]:  # fmt: skip
    out: list[float] = []
    for i in range(0, len(a), batch_size):
        u, v = pair_embeddings(enc, list(a[i : i + batch_size]), list(b[i : i + batch_size]), cross=cross)
        out += torch.cosine_similarity(u, v, dim=-1).tolist()  # (b,)
    return out


def predict(enc: SentenceEncoder, pairs: Sequence[StsPair], *, cross: bool, batch_size: int,
            upstream_quirk: bool = True) -> dict[str, float]:  # fmt: skip
    """``{ID: similarity}`` of Subtask B pairs, with their MWEs as single tokens."""
    texts = [p.tokenised(upstream_quirk=upstream_quirk) for p in pairs]
    sims = similarities(enc, [t[0] for t in texts], [t[1] for t in texts], cross=cross, batch_size=batch_size)
    return {p.id: s for p, s in zip(pairs, sims, strict=True)}


@torch.no_grad()
def embed_all(enc: SentenceEncoder, texts: Sequence[str], *, batch_size: int) -> torch.Tensor:
    """Mean-pooled encoder outputs: N texts -> (N, H)."""
    return torch.cat([enc.encode(list(texts[i : i + batch_size])) for i in range(0, len(texts), batch_size)])


def spearman(gold: Sequence[float], pred: Sequence[float]) -> float | None:
    from scipy.stats import spearmanr

    if len(gold) < 2:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a constant column gives nan
        rho = float(spearmanr(gold, pred)[0])
    return None if math.isnan(rho) else rho


def _flatten(prefix: str, scores: dict[str, dict[str, dict[str, float | None]]]) -> dict[str, float | None]:
    """``{setting: {"EN,PT": {"ALL": ρ}}}`` -> ``{"dev/fine_tune/EN+PT/ALL": ρ}``."""
    return {f"{prefix}/{s}/{langs.replace(',', '+')}/{k}": v for s, by_lang in scores.items()
            for langs, row in by_lang.items() for k, v in row.items()}  # fmt: skip


class Evaluator:
    """Rank 0's dev and eval sets, read once."""

    def __init__(self, cfg: StsConfig) -> None:
        self.cfg, self.cross, self.bs = cfg, cfg.model.cross_attention, cfg.eval.batch_size
        held_out = [p for spec in cfg.data.sts_pretrain for p in read_sts_pretrain(spec) if p.split != "train"]
        self.sts_dev = [p for p in held_out if p.split == "dev"]
        self.has_sts_dev = len(self.sts_dev) >= 2
        self.geometry_pairs = held_out  # the STS dev and test pairs: alignment of score ≥ 4, uniformity of all
        self.dev_pairs = read_sts_inputs(cfg.data.dev)
        self.eval_pairs = read_sts_inputs(cfg.data.eval)
        self.dev_gold = list(read_rows(cfg.data.dev_gold, B_GOLD_HEADER))

    def dev(self, enc: SentenceEncoder, *, setting: str) -> dict[str, float | None]:
        """``sts_dev_spearman`` (STS dev split) and the official dev Spearman of ``setting`` (EN+PT)."""
        out: dict[str, float | None] = {}
        if self.has_sts_dev:
            d = self.sts_dev
            sims = similarities(enc, [p.sentence1 for p in d], [p.sentence2 for p in d], cross=self.cross,
                                batch_size=self.bs)  # fmt: skip
            out["sts_dev_spearman"] = spearman([p.score for p in d], sims)
        preds = predict(enc, self.dev_pairs, cross=self.cross, batch_size=self.bs,
                        upstream_quirk=self.cfg.data.upstream_quirk)  # fmt: skip
        rows = [(i + 2, [p.id, p.language, setting, repr(preds[p.id])]) for i, p in enumerate(self.dev_pairs)]
        scores = score_sts(rows, self.dev_gold, setting=setting, languages=("EN", "PT"),
                           names=(f"{setting} dev predictions", self.cfg.data.dev_gold))  # fmt: skip
        out.update({f"dev/{k}": v for k, v in scores.items()})
        out["dev_spearman"] = scores["ALL"]
        return out

    def final(self, models: dict[str, Path], out_dir: Path, *, device: Any) -> dict[str, float | None]:
        """Both settings' submissions of dev and eval (``fill_submission``), scored where gold exists."""
        preds: dict[str, dict[tuple[str, str], float | int | None]] = {"dev": {}, "eval": {}}
        out: dict[str, float | None] = {}
        for setting, path in models.items():
            enc = SentenceEncoder.from_pretrained(path, device=device).eval()
            for split, pairs in (("dev", self.dev_pairs), ("eval", self.eval_pairs)):
                got = predict(enc, pairs, cross=self.cross, batch_size=self.bs,
                              upstream_quirk=self.cfg.data.upstream_quirk)  # fmt: skip
                preds[split].update({(i, setting): v for i, v in got.items()})
            out.update(self.geometry(enc, setting))
        d = self.cfg.data
        dev_sub = fill_submission(d.dev_submission_format, preds["dev"], out_dir / "dev.submission.csv")
        eval_sub = fill_submission(d.eval_submission_format, preds["eval"], out_dir / "eval.submission.csv")
        out.update(_flatten("dev", evaluate_sts(dev_sub, d.dev_gold)))
        if d.eval_gold:
            out.update(_flatten("test", evaluate_sts(eval_sub, d.eval_gold)))
        out["dev_spearman"] = out.get(f"dev/{self.cfg.final_setting}/EN+PT/ALL")
        return out

    def geometry(self, enc: SentenceEncoder, setting: str) -> dict[str, float | None]:
        """ℓ_align over held-out STS pairs with score ≥ ``eval.align_min_score``, ℓ_uniform over all of them."""
        pairs = self.geometry_pairs
        if not pairs:
            return {}
        x = embed_all(enc, [p.sentence1 for p in pairs], batch_size=self.bs)  # (N, H)
        y = embed_all(enc, [p.sentence2 for p in pairs], batch_size=self.bs)  # (N, H)
        pos = torch.tensor([p.score >= self.cfg.eval.align_min_score for p in pairs])  # (N,)
        align = float(alignment(x[pos], y[pos], batch_size=self.bs)) if pos.any() else None
        return {f"align/{setting}": align, f"uniform/{setting}": float(uniformity(x, y, batch_size=self.bs))}


# ---------------------------------------------------------------------------------------------- the run's files
def final_row(trial: TrialOutcome) -> dict[str, Any] | None:
    """The trial's closing report (its official scores), or None when it did not finish."""
    return next((r for r in reversed(trial.history) if num(r.get("final")) == 1), None)


def best_trial(trials: list[TrialOutcome], *, metric: str, mode: str = "max") -> TrialOutcome | None:
    """The trial whose closing report has the best ``metric`` (dev Spearman of its final setting)."""
    sign = 1.0 if mode == "max" else -1.0
    values = [num((final_row(t) or {}).get(metric)) for t in trials]
    scored = [(sign * v, i) for i, v in enumerate(values) if v is not None]
    return trials[max(scored)[1]] if scored else None


def _label(trial: TrialOutcome) -> str:
    name = trial.params.get("baseline")
    return dict(LADDER).get(name, str(name)) if name is not None else dict(LADDER)[None]


def _row(trial: TrialOutcome) -> dict[str, Any]:
    row: dict[str, Any] = {"trial_id": trial.trial_id, "method": _label(trial), **trial.params}
    final = final_row(trial) or {}
    row.update({k: v for k, v in final.items()
                if k in ("step", "dev_spearman") or k.startswith(("dev/", "test/", "align/", "uniform/"))})
    if trial.error:
        row["error"] = trial.error
    return row


def write_all(run: StsRun, space: Space, trials: list[TrialOutcome], extra: list[TrialOutcome]) -> dict[str, Any]:
    metric, mode = run.cfg.tune.metric, run.cfg.tune.mode
    write_csv(run.run_dir / "results.csv", [_row(t) for t in trials + extra])
    best = best_trial(trials, metric=metric, mode=mode)
    by_name = {t.params.get("baseline"): t for t in extra}
    ladder = [t for t in [by_name.get(n) for n, _ in LADDER[:-1]] + [best] if t is not None]
    ladder += [t for n, t in by_name.items() if n not in dict(LADDER)]
    summary = {"space": space.name, "run_dir": str(run.run_dir), "best": _row(best) if best else None,
               "table": [_row(t) for t in ladder], "timings": run.timings, "builtin_data": run.builtin,
               "data": run.counts, "failed_trials": [t.trial_id for t in trials + extra if t.error]}  # fmt: skip
    atomic_write(run.run_dir / "best.json", json.dumps(summary["best"], indent=2, default=str))
    plots = _plots(run.run_dir, ladder)
    atomic_write(run.run_dir / "report.md", _render(run, space, summary, trials, plots))
    summary["plots"] = [str(p) for p in plots]
    return summary


def _pct(v: Any) -> str:
    f = num(v)
    return "–" if f is None else f"{100 * f:.2f}"


def _table(rows: list[dict[str, Any]], split: str) -> list[str]:
    head = ["Strategy", *[f"{s} {k}" for s in SETTINGS for k in SUBSETS]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [_pct(r.get(f"{split}/{s}/EN+PT/{k}")) for s in SETTINGS for k in SUBSETS]
        lines.append(f"| {r['method']} | " + " | ".join(cells) + " |")
    return lines


def _render(run: StsRun, space: Space, summary: dict[str, Any], trials: list[TrialOutcome],
            plots: list[Path]) -> str:  # fmt: skip
    rows, cfg = summary["table"], run.cfg
    lines = [f"# SemEval-2022 Task 2 Subtask B — {space.name}", "",
             "Table 5: Spearman ρ (%, EN+PT) of the official evaluator on dev, per setting (pre_train: the model "
             "kept on the STS dev split; fine_tune: the one kept on dev). Each row adds one strategy to the row "
             f"above; the last is the sweep's best point (joint loss: {cfg.loss.joint}).", "",
             *_table(rows, "dev"), ""]  # fmt: skip
    if any(k.startswith("test/") for r in rows for k in r):
        lines += ["The same on eval (the paper's test):", "", *_table(rows, "test"), ""]
    lines += ["Alignment and uniformity of the mean-pooled embeddings (lower is better, Fig. 5):", "",
              "| Strategy | " + " | ".join(f"{s} ℓ_align | {s} ℓ_uniform" for s in SETTINGS) + " |",
              "|" + "---|" * (1 + 2 * len(SETTINGS))]  # fmt: skip
    for r in rows:
        cells = [f"{v:.3f}" if (v := num(r.get(f"{k}/{s}"))) is not None else "–"
                 for s in SETTINGS for k in ("align", "uniform")]  # fmt: skip
        lines.append(f"| {r['method']} | " + " | ".join(cells) + " |")
    lines += ["", "## Sweep (dev Spearman of the final setting, %)", "", "| point | dev ρ |", "|---|---|"]
    for t in trials:
        point = ", ".join(f"{SYMBOLS.get(k, k)}={v}" for k, v in t.params.items()) or "default"
        lines.append(f"| {point} | {_pct((final_row(t) or {}).get('dev_spearman'))} |")
    lines += ["", f"Data: {', '.join(f'{k} {v}' for k, v in run.counts.items())}"
              + (f" (built-in: {', '.join(run.builtin)})" if run.builtin else "") + ".", "",
              "## Timings", "", ", ".join(f"{k} {v:.1f} s" for k, v in run.timings.items()), ""]  # fmt: skip
    if summary["failed_trials"]:
        lines += [f"Failed trials: {', '.join(summary['failed_trials'])}", ""]
    return "\n".join(lines + [f"![{p.stem}]({p.name})" for p in plots])


def _plots(run_dir: Path, ladder: list[TrialOutcome]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    points = {f"{_label(t)} ({s})": (a, u) for t in ladder for s in SETTINGS
              if (a := num((final_row(t) or {}).get(f"align/{s}"))) is not None
              and (u := num((final_row(t) or {}).get(f"uniform/{s}"))) is not None}  # fmt: skip
    if points:
        out.append(plot_alignment_uniformity(points, run_dir / "align_uniform.png",
                                             title="Fig. 5: ℓ_align vs ℓ_uniform"))  # fmt: skip
    fig, ax = plt.subplots(figsize=(6, 4))
    for t in ladder:
        pts = [(r["step"], 100 * v) for r in t.history if num(r.get("final")) != 1
               and (v := num(r.get("dev_spearman"))) is not None]  # fmt: skip
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=_label(t))
    ax.set(xlabel="step (pre-training, then fine-tuning)", ylabel="dev Spearman ALL (%)",
           title="Dev Spearman of the current setting")  # fmt: skip
    ax.legend(fontsize=7)
    fig.tight_layout()
    out.append(save_png(fig, run_dir / "dev_curves.png"))
    plt.close(fig)
    return out
