"""GEC evaluation, shared by the worker (dev and test after every epoch) and the report: decode every source of a
split with the model and score it with ERRANT (P / R / F0.5 per annotator, their average — the paper's figure —
the combined score, and the over-correction / ignored-edit ratios)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from raycl.config.tasks.gec import GecConfig
from raycl.data.gec import load_references, write_parallel
from raycl.models.seq2seq import Seq2SeqScorer
from raycl.scoring.gec_metrics import evaluate_gec

HYPS_DIR = "test_hyps"  # in a training's folder: its best epoch's test hypotheses, one file per test set


def references(cfg: GecConfig) -> dict[str, dict[str, Any]]:
    """``{"dev": {set: refs}, "test": {set: refs}}`` of the config's M2 files."""
    return {
        split: {name: load_references(specs) for name, specs in sets.items()}
        for split, sets in (("dev", cfg.data.dev), ("test", cfg.data.test))
    }


def evaluate_split(
    cfg: GecConfig, scorer: Seq2SeqScorer, sets: dict[str, Any], *, prefix: str, hyps_dir: Path | None = None
) -> dict[str, float]:
    """Decode every set of a split and score it with ERRANT: ``{prefix}_f05`` (mean over sets of the
    annotator-averaged F0.5, the paper's figure) and ``{prefix}/{set}/{p,r,f05,oe,ie,...}``. ``hyps_dir``: each
    set's hypotheses kept there as ``{set}.txt`` (what the report's sign test between two rows reads)."""
    out: dict[str, float] = {}
    f_values = []
    for name, refs in sets.items():
        hyps = decode(cfg, scorer, [r.source for r in refs])
        if hyps_dir is not None:
            write_parallel(hyps_dir / f"{name}.txt", hyps)
        result = evaluate_gec(hyps, {name: refs})["refs"][name]
        avg = result["average"]
        for key in ("p", "r", "f0.5", "oe", "ie"):
            out[f"{prefix}/{name}/{key.replace('0.5', '05')}"] = float(avg[key])
        for ann, row in result["annotators"].items():
            for key in ("p", "r", "f0.5"):
                out[f"{prefix}/{name}/ann{ann}/{key.replace('0.5', '05')}"] = float(row[key])
        out[f"{prefix}/{name}/combined_f05"] = float(result["combined"]["f0.5"])
        f_values.append(float(avg["f0.5"]))
    out[f"{prefix}_f05"] = sum(f_values) / max(len(f_values), 1)
    return out


def decode(cfg: GecConfig, scorer: Seq2SeqScorer, sources: list[str]) -> list[str]:
    """The model's correction of each source (beam ``eval.beam``; 1 = greedy, GEC-BART's test setting)."""
    scorer.eval()
    with torch.no_grad():
        outs = scorer.generate(
            sources,
            num_beams=cfg.eval.beam,
            num_return_sequences=1,
            max_new_tokens=cfg.eval.max_new_tokens,
            batch_size=cfg.eval.batch_size,
        )
    return [o[0][0] if o else "" for o in outs]


def sign_tests(a: Path, b: Path, test: dict[str, list[str]]) -> dict[str, dict[str, float | int]]:
    """The paper's bootstrap sign test (as ``raycl.eval gec --compare``) of training ``a`` against ``b`` on every
    test set both kept hypotheses of (``HYPS_DIR`` in each training's folder)."""
    from raycl.data.m2 import iter_lines
    from raycl.scoring.gec_metrics import HypothesisEdits, bootstrap_sign_test

    out = {}
    for name, specs in test.items():
        files = [d / HYPS_DIR / f"{name}.txt" for d in (a, b)]
        if all(f.exists() for f in files):
            refs = load_references(specs)
            x, y = (HypothesisEdits([line for _, line in iter_lines(f)], name=str(f)) for f in files)
            out[name] = bootstrap_sign_test(x.for_ref(name, refs), y.for_ref(name, refs), refs)
    return out
