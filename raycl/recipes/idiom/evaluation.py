"""Subtask A's evaluation, used by the worker (dev macro-F1 after every epoch, the closing submissions) and the
report: label predictions of one setting's inputs (zero-shot: the text "Previous Target Next"; one-shot: the pair
(Target, MWE)), the official macro-F1 of dev (EN, PT, EN+PT; ``score_idiom`` on the rows in memory), and the
setting's submissions of dev and eval in the official layout, scored with ``evaluate_idiom``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from raycl.data.semeval import (
    A_GOLD_HEADER,
    A_SETTINGS,
    IdiomExample,
    Value,
    fill_submission,
    read_idiom_inputs,
    read_rows,
    write_submission_a,
)
from raycl.models.classifier import encode_batch
from raycl.scoring.semeval_metrics import evaluate_idiom, idiom_f1s

if TYPE_CHECKING:
    from raycl.config.tasks.idiom import IdiomConfig

ModelInput = str | tuple[str, str]


def model_input(example: IdiomExample, setting: str) -> ModelInput:
    """As the organisers' baseline: zero-shot reads context and target without the MWE; one-shot (Target, MWE)."""
    return example.zero_shot_text() if setting == "zero_shot" else example.one_shot_pair()


@torch.no_grad()
def predict(
    model: Any, tokenizer: Any, inputs: Sequence[ModelInput], *, max_len: int, batch_size: int
) -> list[int]:
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


def write_submission(
    format_csv: str, examples: Sequence[IdiomExample], preds: dict[tuple[str, str], Value], out: Path
) -> Path:
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
        return predict(
            model, tokenizer, inputs, max_len=self.cfg.model.max_len, batch_size=self.cfg.eval.batch_size
        )

    def dev_scores(self, model: Any, tokenizer: Any) -> dict[str, float | None]:
        """Official dev macro-F1 of this setting: ``dev_f1`` (EN+PT), ``dev_f1/EN``, ``dev_f1/PT``."""
        labels = self._predict(model, tokenizer, self.dev)
        rows = [
            (i + 2, [e.id, e.language, self.setting, str(y)])
            for i, (e, y) in enumerate(zip(self.dev, labels, strict=True))
        ]
        names = (f"{self.setting} dev predictions", self.cfg.data.dev_gold)
        return _f1s("dev_f1", idiom_f1s(rows, self.dev_gold, setting=self.setting, names=names))

    def final(self, model: Any, tokenizer: Any, out_dir: Path) -> dict[str, float | None]:
        """This setting's rows of ``dev.submission.csv`` and ``eval.submission.csv``, officially scored."""
        d, out = self.cfg.data, {}
        splits = (
            ("dev", self.dev, d.dev_submission_format, d.dev_gold, "dev_f1"),
            ("eval", self.eval, d.eval_submission_format, d.eval_gold, "test_f1"),
        )
        for split, examples, fmt, gold, prefix in splits:
            if not examples:
                continue
            labels = self._predict(model, tokenizer, examples)
            preds: dict[tuple[str, str], Value] = {
                (e.id, self.setting): y for e, y in zip(examples, labels, strict=True)
            }
            sub = write_submission(fmt, examples, preds, out_dir / f"{split}.submission.csv")
            if gold:
                out.update(_f1s(prefix, evaluate_idiom(sub, gold)[self.setting]))
        return out
