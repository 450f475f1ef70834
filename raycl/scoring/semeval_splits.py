"""What both SemEval-2022 Task 2 evaluators share (Subtask A's idiom labels, Subtask B's similarities): a model's
predictions of the official dev set as the rows the official scorers read, in memory, and its predictions of dev
and eval written as the official submissions, scored where gold exists."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from raycl.data.semeval import Value, fill_submission, read_rows

R = TypeVar("R")  # a split's official scores, a prediction
T = TypeVar("T")
Predictions = dict[tuple[str, str], Value]  # {(ID, Setting): label or similarity}


class Example(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def language(self) -> str: ...


E = TypeVar("E", bound=Example)


@dataclass(frozen=True)
class Split(Generic[E]):
    """One official split: its inputs, its ``*_submission_format.csv`` and its gold file ("": none)."""

    name: str  # dev | eval: the submission is ``<name>.submission.csv``
    examples: Sequence[E]
    submission_format: str
    gold: str

    @property
    def scores(self) -> str:
        """What its scores are called: the eval split's are the test scores."""
        return "test" if self.name == "eval" else self.name


def official_splits(d: Any, read: Callable[[str], Sequence[E]]) -> list[Split[E]]:
    """A data section's (``dev``, ``eval``, their ``*_submission_format`` and ``*_gold``) dev split and, where
    given, its eval split, the inputs read with ``read``."""
    out = [Split("dev", read(d.dev), d.dev_submission_format, d.dev_gold)]
    if d.eval:
        out.append(Split("eval", read(d.eval), d.eval_submission_format, d.eval_gold))
    return out


class OfficialEvaluator(Generic[E]):
    """Rank 0's official splits of a data section (:func:`official_splits`: dev and, where given, eval), read
    once, with dev's gold rows; a recipe's evaluator adds its model's predictions of a setting."""

    def __init__(self, d: Any, read: Callable[[str], Sequence[E]], gold_header: Sequence[str]) -> None:
        self.splits = official_splits(d, read)
        self.dev_examples, self.dev_gold_file = self.splits[0].examples, d.dev_gold
        self.dev_gold = list(read_rows(d.dev_gold, gold_header))

    def score_dev(self, score: Callable[..., R], preds: Predictions, setting: str, **how: Any) -> R:
        """The official scorer's ``score`` of one setting's dev predictions, as rows in memory."""
        rows = prediction_rows(self.dev_examples, preds, setting)
        names = (f"{setting} dev predictions", self.dev_gold_file)
        return score(rows, self.dev_gold, setting=setting, names=names, **how)


def prediction_rows(examples: Sequence[Example], preds: Predictions, setting: str) -> list[tuple[int, list[str]]]:
    """One setting's predictions of ``examples`` as a submission file's rows ``(line, [ID, Language, Setting,
    value])`` (the header is line 1): what the official scorers read, so that a dev score needs no file."""
    return [(i + 2, [e.id, e.language, setting, str(preds[e.id, setting])]) for i, e in enumerate(examples)]


def submit(
    splits: Sequence[Split[E]],
    predictions: Mapping[str, Predictions],
    out_dir: Path,
    score: Callable[[Path, str], R],
    write: Callable[[Split[E], Predictions, Path], Path] | None = None,
) -> dict[str, R]:
    """Each split's ``<out_dir>/<split>.submission.csv`` from ``predictions[split]`` (``write``; by default the
    split's format file filled, cells without a prediction left blank) and, of the splits that have gold,
    ``{split.scores: score(submission, gold)}`` (``dev``, ``test``)."""
    out: dict[str, R] = {}
    for split in splits:
        where = out_dir / f"{split.name}.submission.csv"
        if write is None:
            sub = fill_submission(split.submission_format, predictions[split.name], where)
        else:
            sub = write(split, predictions[split.name], where)
        if split.gold:
            out[split.scores] = score(sub, split.gold)
    return out


def batched(predict: Callable[[list[T]], Sequence[R]], items: Sequence[T], batch_size: int) -> list[R]:
    """``predict`` over ``items`` ``batch_size`` at a time, in order (the caller turns off gradients)."""
    out: list[R] = []
    for i in range(0, len(items), batch_size):
        out += predict(list(items[i : i + batch_size]))
    return out
