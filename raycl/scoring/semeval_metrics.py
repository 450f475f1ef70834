"""The official SemEval-2022 Task 2 scores, computed as the organisers' evaluators compute them.

Subtask A (``SubTask1Evaluator.py``): for each setting (zero_shot, one_shot) and languages EN, PT, EN+PT,
take the submission rows of that setting and languages, take the gold rows whose IDs (compared as integers)
are among them, in gold order, and require the two ID lists to be identical (same IDs, same order, no
repeats); the score is sklearn's macro-F1 on the integer labels (the task's metric; ``average`` picks
``weighted``, ``micro`` or ``binary``, the three columns the released script prints), or None if any predicted
label is blank. Rows of other languages (GL) are ignored.

Subtask B (``SubTask2Evaluator.py``): one setting at a time (pre_train, fine_tune); predictions are looked up
by ID within the setting and languages (a repeated ID keeps its last row). For each gold row of those
languages the target is its ``sim``, or, when that is empty, the submission's *own* prediction for
``otherID`` (a consistency target). Scores are scipy's Spearman ρ over all rows, over the non-STS ("Idiom")
rows and over the STS rows (DataID field 3 == 'sts'), in the official output order ALL, Idiom, STS; None if
any prediction of the setting and languages is blank. Every submission ID must appear in the gold file as
an ID or an otherID.

Where the official scripts would crash or print ``nan`` (an ID missing, no rows, a constant column) this
module raises a one-line :class:`UserError` or returns None. Settings absent from a submission are skipped;
an unknown Setting value is an error (the official scripts would silently ignore it).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from pathlib import Path

from raycl.data.semeval import (
    A_GOLD_HEADER,
    A_SETTINGS,
    A_SUBMISSION_HEADER,
    B_GOLD_HEADER,
    B_SETTINGS,
    B_SUBMISSION_HEADER,
    read_rows,
)
from raycl.errors import UserError, at

LANGUAGE_SETS = (("EN",), ("PT",), ("EN", "PT"))
SUBSETS = ("ALL", "Idiom", "STS")

Rows = Sequence[tuple[int, Sequence[str]]]  # (line, fields) as read_rows yields them
IdiomScores = dict[str, dict[str, float | None]]  # {setting: {"EN" | "PT" | "EN,PT": macro-F1}}
F1_AVERAGES = ("macro", "weighted", "micro", "binary")  # sklearn's ``average``; binary: F1 of label 1
StsScores = dict[str, dict[str, dict[str, float | None]]]  # {setting: {languages: {ALL|Idiom|STS: rho}}}


def _int_id(path: str | Path, line: int, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise UserError(f"{at(path, line)}: ID {value!r}, expected an integer") from None


def _settings(path: str | Path, rows: Rows, known: Sequence[str]) -> list[str]:
    """The known settings present in ``rows`` (column 2), in the official order; others are errors."""
    for line, row in rows:
        if row[2] not in known:
            raise UserError(f"{at(path, line)}: Setting {row[2]!r}, expected one of {', '.join(known)}")
    present = [s for s in known if any(row[2] == s for _, row in rows)]
    if not present:
        raise UserError(f"{at(path)}: no rows, expected Setting {' or '.join(known)}")
    return present


# ----------------------------------------------------------------------------------------- Subtask A
def score_idiom(
    submission: Rows,
    gold: Rows,
    *,
    setting: str,
    languages: Sequence[str],
    names: tuple[str | Path, str | Path] = ("submission", "gold"),
    average: str = "macro",
) -> float | None:
    """Macro-F1 (or ``average``) of one (setting, languages) cell; rows are ``(line, [ID, Language, Setting,
    Label])`` and ``(line, [ID, DataID, Language, Label])``. None if a label is blank or no row is selected."""
    from sklearn.metrics import f1_score

    if average not in F1_AVERAGES:
        raise UserError(f"average {average!r}, expected one of {', '.join(F1_AVERAGES)}")
    sub = [(line, row) for line, row in submission if row[1] in languages and row[2] == setting]
    sub_ids = [_int_id(names[0], line, row[0]) for line, row in sub]
    wanted = set(sub_ids)
    gold_sel = [(line, row) for line, row in gold if _int_id(names[1], line, row[0]) in wanted]
    gold_ids = [int(row[0]) for _, row in gold_sel]
    if sub_ids != gold_ids:
        _id_mismatch(names, setting, languages, sub, sub_ids, gold_ids)
    if not sub or any(row[3] == "" for _, row in sub):
        return None
    y_pred = [_int_label(names[0], line, row[3]) for line, row in sub]
    y_true = [_int_label(names[1], line, row[3]) for line, row in gold_sel]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn warns on labels absent from y_true; the value is official
        return float(f1_score(y_true, y_pred, average=average))


def _int_label(path: str | Path, line: int, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise UserError(f"{at(path, line)}: Label {value!r}, expected an integer (0 or 1)") from None


def _id_mismatch(
    names: tuple[str | Path, str | Path],
    setting: str,
    languages: Sequence[str],
    sub: Rows,
    sub_ids: list[int],
    gold_ids: list[int],
) -> None:
    k = next(
        (i for i, (a, b) in enumerate(zip(sub_ids, gold_ids, strict=False)) if a != b),
        min(len(sub_ids), len(gold_ids)),
    )
    line = sub[k][0] if k < len(sub) else sub[-1][0]
    expected = f"ID {gold_ids[k]}" if k < len(gold_ids) else "no more rows"
    raise UserError(
        f"{at(names[0], line)}: {setting} {','.join(languages)} IDs do not match {names[1]}: "
        f"found ID {sub_ids[k] if k < len(sub_ids) else 'none'}, expected {expected} "
        f"(the gold file's IDs, in its order, each once)"
    )


def evaluate_idiom(submission: str | Path, gold: str | Path, average: str = "macro") -> IdiomScores:
    """``{setting: {"EN": f1, "PT": f1, "EN,PT": f1}}`` for the settings in the submission file."""
    sub = list(read_rows(submission, A_SUBMISSION_HEADER))
    gold_rows = list(read_rows(gold, A_GOLD_HEADER))
    names = (submission, gold)
    return {
        s: idiom_f1s(sub, gold_rows, setting=s, names=names, average=average)
        for s in _settings(submission, sub, A_SETTINGS)
    }


def idiom_f1s(
    submission: Rows, gold: Rows, *, setting: str, names: tuple[str | Path, str | Path], average: str = "macro"
) -> dict[str, float | None]:
    """``{"EN": f1, "PT": f1, "EN,PT": f1}`` of one setting's rows (:func:`score_idiom` per language set)."""
    return {
        ",".join(langs): score_idiom(
            submission, gold, setting=setting, languages=langs, names=names, average=average
        )
        for langs in LANGUAGE_SETS
    }


# ----------------------------------------------------------------------------------------- Subtask B
def score_sts(
    submission: Rows,
    gold: Rows,
    *,
    setting: str,
    languages: Sequence[str],
    names: tuple[str | Path, str | Path] = ("submission", "gold"),
) -> dict[str, float | None]:
    """Spearman ρ over ALL, Idiom and STS gold rows of one (setting, languages) cell; rows are
    ``(line, [ID, Language, Setting, Sim])`` and ``(line, [ID, DataID, Language, sim, otherID])``."""
    sub = [(line, row) for line, row in submission if row[1] in languages and row[2] == setting]
    if any(row[3] == "" for _, row in sub):
        return dict.fromkeys(SUBSETS)
    predicted = {row[0]: (line, row[3]) for line, row in sub}  # later rows win, as the official dict
    cols: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in SUBSETS}
    for line, (gid, data_id, lang, sim, other) in gold:
        if lang not in languages:
            continue
        target = _sim(names, predicted, other, setting, line) if sim == "" else _number(names[1], line, sim)
        pred = _sim(names, predicted, gid, setting, line)
        parts = data_id.split(".")
        for key in ("ALL", "STS" if len(parts) > 2 and parts[2] == "sts" else "Idiom"):
            cols[key][0].append(target)
            cols[key][1].append(pred)
    return {key: spearman(*cols[key]) for key in SUBSETS}


def _number(path: str | Path, line: int, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise UserError(f"{at(path, line)}: similarity {value!r}, expected a number") from None


def _sim(
    names: tuple[str | Path, str | Path],
    predicted: dict[str, tuple[int, str]],
    key: str,
    setting: str,
    gold_line: int,
) -> float:
    if key not in predicted:
        raise UserError(
            f"{at(names[0])}: no {setting} prediction for ID {key} (needed by "
            f"{at(names[1], gold_line)}); expected a row for every ID of the split"
        )
    line, value = predicted[key]
    return _number(names[0], line, value)


def spearman(gold: Sequence[float], pred: Sequence[float]) -> float | None:
    """Spearman's ρ, or None where it is undefined (fewer than two pairs, a constant column)."""
    from scipy.stats import spearmanr

    if len(gold) < 2:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a constant column: scipy warns and returns nan
        rho = float(spearmanr(gold, pred)[0])
    return None if math.isnan(rho) else rho


def evaluate_sts(submission: str | Path, gold: str | Path) -> StsScores:
    """``{setting: {"EN" | "PT" | "EN,PT": {"ALL": ρ, "Idiom": ρ, "STS": ρ}}}`` for the settings present."""
    sub = list(read_rows(submission, B_SUBMISSION_HEADER))
    gold_rows = list(read_rows(gold, B_GOLD_HEADER))
    known = {row[0] for _, row in gold_rows} | {row[4] for _, row in gold_rows if row[4] != ""}
    known_int = {int(x) for x in known if x.lstrip("-").isdigit()}
    for line, row in sub:
        if row[0] not in known and _int_id(submission, line, row[0]) not in known_int:
            raise UserError(
                f"{at(submission, line)}: ID {row[0]} is not in {gold} (a submission for another "
                f"split?); expected the IDs of the gold file"
            )
    return {
        setting: {
            ",".join(langs): score_sts(sub, gold_rows, setting=setting, languages=langs, names=(submission, gold))
            for langs in LANGUAGE_SETS
        }
        for setting in _settings(submission, sub, B_SETTINGS)
    }
