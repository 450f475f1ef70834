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
    write_submission_a,
)
from raycl.models.classifier import encode_batch
from raycl.scoring.semeval_metrics import evaluate_idiom, idiom_f1s
from raycl.scoring.semeval_splits import OfficialEvaluator, Predictions, Split, batched, submit

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

    def labels(batch: list[ModelInput]) -> list[int]:
        encoded = encode_batch(tokenizer, batch, max_len=max_len)  # type: ignore[arg-type]
        # evaluation, not a training step: the labels go to the official scorer on the host, one copy a batch
        return model(**{k: v.to(device) for k, v in encoded.items()}).logits.argmax(dim=-1).tolist()  # (b, 2)

    return batched(labels, inputs, batch_size)


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


class Evaluator(OfficialEvaluator[IdiomExample]):
    """Rank 0's dev and eval sets of one setting (default: the config's ``data.setting``), read once."""

    def __init__(self, cfg: IdiomConfig, setting: str = "") -> None:
        super().__init__(cfg.data, read_idiom_inputs, A_GOLD_HEADER)
        self.cfg, self.setting = cfg, setting or cfg.data.setting

    def _predict(self, model: Any, tokenizer: Any, examples: Sequence[IdiomExample]) -> Predictions:
        inputs = [model_input(e, self.setting) for e in examples]
        c = self.cfg
        labels = predict(model, tokenizer, inputs, max_len=c.model.max_len, batch_size=c.eval.batch_size)
        return {(e.id, self.setting): y for e, y in zip(examples, labels, strict=True)}

    def dev_scores(self, model: Any, tokenizer: Any) -> dict[str, float | None]:
        """Official dev macro-F1 of this setting: ``dev_f1`` (EN+PT), ``dev_f1/EN``, ``dev_f1/PT``."""
        preds = self._predict(model, tokenizer, self.dev_examples)
        return _f1s("dev_f1", self.score_dev(idiom_f1s, preds, self.setting))

    def final(self, model: Any, tokenizer: Any, out_dir: Path) -> dict[str, float | None]:
        """This setting's rows of ``dev.submission.csv`` and ``eval.submission.csv``, officially scored."""
        splits = [s for s in self.splits if s.examples]
        preds = {s.name: self._predict(model, tokenizer, s.examples) for s in splits}
        scores = submit(splits, preds, out_dir, lambda sub, gold: evaluate_idiom(sub, gold)[self.setting], _write)
        return {k: v for s, f1s in scores.items() for k, v in _f1s(f"{s}_f1", f1s).items()}


def _write(split: Split[IdiomExample], preds: Predictions, out: Path) -> Path:
    return write_submission(split.submission_format, split.examples, preds, out)
