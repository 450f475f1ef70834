"""SemEval-2022 Task 2 CSV files, official layouts: readers, row types, the MWE token and submission writers.

Subtask A (idiomaticity detection) and Subtask B (idiomatic STS) ship as comma-separated files with a header
line, parsed with :mod:`csv` (fields may be quoted and span lines). Every reader here checks the header
exactly, the field count of every row and the label values, and reports a mistake as one line
``file:LINE: ...`` (LINE is where the row starts). Labels of Subtask A: 0 = idiomatic, 1 = non-idiomatic.

Model inputs (the organisers' baseline; docs/recipes/idiom.md): zero-shot = the single text
``"Previous Target Next"`` (no MWE); one-shot = the pair ``(Target, MWE)``; the one-shot model trains on
train_one_shot followed by train_zero_shot.

The organisers' Subtask B models see every MWE as one new token ``mwe_token(mwe)``, written into the
sentences by a case-insensitive regex replacement. Upstream quirk of ZhichunRoad's code, kept by default
(docs/recipes/sts.md): the MWE is used as a raw regex (not escaped), and sentence 2 is rewritten with MWE1's
*pattern* and MWE2's token (so only when MWE2 is not ``None``; in the released data it always is).
``upstream_quirk=False`` escapes the MWE and rewrites sentence 2 with MWE2's own pattern.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from raycl.data.bounded import MAX_CSV_LINE, bounded_lines
from raycl.errors import UserError, at
from raycl.files import atomic_file

A_TRAIN_HEADER = ("DataID", "Language", "MWE", "Setting", "Previous", "Target", "Next", "Label")
A_INPUT_HEADER = ("ID", "Language", "MWE", "Previous", "Target", "Next")
A_GOLD_HEADER = ("ID", "DataID", "Language", "Label")
A_SUBMISSION_HEADER = ("ID", "Language", "Setting", "Label")
B_TRAIN_HEADER = (
    "ID",
    "MWE1",
    "MWE2",
    "Language",
    "sentence_1",
    "sentence_2",
    "sim",
    "alternative_1",
    "alternative_2",
)
B_INPUT_HEADER = ("ID", "Language", "MWE1", "MWE2", "sentence1", "sentence2")
B_GOLD_HEADER = ("ID", "DataID", "Language", "sim", "otherID")
B_SUBMISSION_HEADER = ("ID", "Language", "Setting", "Sim")
STS_PRETRAIN_HEADER = ("split", "Language", "sentence1", "sentence2", "score")  # raycl's own STS file

A_SETTINGS = ("zero_shot", "one_shot")
B_SETTINGS = ("pre_train", "fine_tune")
IDIOMATIC, NON_IDIOMATIC = 0, 1
NONE = "None"  # how the files spell a missing MWE or train sim

Value = int | float | None  # a submission cell: a label, a similarity, or blank


# ---------------------------------------------------------------------------------------------- rows
@dataclass(frozen=True)
class IdiomExample:
    """One Subtask A row: a target sentence with its context and MWE; ``label`` None when unlabelled."""

    id: str  # ID (dev/eval/test inputs) or DataID (train files)
    language: str
    mwe: str
    previous: str
    target: str
    next: str
    label: int | None = None  # 0 idiomatic, 1 non-idiomatic
    setting: str | None = None  # train files only: zero_shot / one_shot

    def zero_shot_text(self) -> str:
        """The zero-shot input: context and target joined by spaces, without the MWE."""
        return " ".join((self.previous, self.target, self.next))

    def one_shot_pair(self) -> tuple[str, str]:
        """The one-shot input: the target sentence paired with the MWE, without context."""
        return self.target, self.mwe


@dataclass(frozen=True)
class IdiomGold:
    id: str
    data_id: str
    language: str
    label: int


@dataclass(frozen=True)
class StsPair:
    """A Subtask B sentence pair: a dev/eval input row, or a train row (``sim`` and alternatives set).

    Train ``sim`` is 1 (sentence_2 is the correct paraphrase) or None: then the target is the model's own
    similarity of ``(alternative_1, alternative_2)``, as in ZhichunRoad's fine-tuning.
    """

    id: str
    language: str
    mwe1: str | None
    mwe2: str | None
    sentence1: str
    sentence2: str
    sim: float | None = None
    alternative_1: str = ""
    alternative_2: str = ""

    def tokenised(self, *, upstream_quirk: bool = True) -> tuple[str, str]:
        """Both sentences with the MWEs replaced by their single tokens (see the module docstring)."""
        try:
            return tokenise_pair(
                self.sentence1, self.sentence2, self.mwe1, self.mwe2, upstream_quirk=upstream_quirk
            )
        except ValueError as err:
            raise UserError(f"ID {self.id}: {err}") from None


@dataclass(frozen=True)
class StsGold:
    """A Subtask B gold row; an empty ``sim`` means "the submission's own prediction for ``other_id``"."""

    id: str
    data_id: str
    language: str
    sim: float | None
    other_id: str | None

    @property
    def is_sts(self) -> bool:
        """A plain STS pair (no MWE): DataID field 3 is 'sts', as the official evaluator tests."""
        parts = self.data_id.split(".")
        return len(parts) > 2 and parts[2] == "sts"


@dataclass(frozen=True)
class ScoredPair:
    """A pre-training STS pair (raycl's own file); ``score`` in [0, 5] as STS-B and ASSIN2."""

    split: str  # train / dev / test
    language: str
    sentence1: str
    sentence2: str
    score: float


# ------------------------------------------------------------------------------------------ MWE token
def mwe_token(mwe: str) -> str:
    """The organisers' single token for an MWE: ``ID`` + lowercase MWE without spaces/hyphens + ``ID``.

    Their pattern is ``[\\s|-]``, so a ``|`` is dropped too.
    """
    return "ID" + re.sub(r"[\s|-]", "", mwe).lower() + "ID"


def replace_mwe(sentence: str, pattern: str, token: str, *, escape: bool = False) -> str:
    """``sentence`` with every case-insensitive match of ``pattern`` replaced by ``token``.

    Raises ``ValueError`` when nothing matches (upstream asserts that the sentence changed).
    """
    regex = re.escape(pattern) if escape else pattern
    out, n = re.subn(regex, lambda _: token, sentence, flags=re.IGNORECASE)
    if n == 0:
        raise ValueError(f"MWE {pattern!r} does not occur in {sentence!r}")
    return out


def tokenise_pair(
    sentence1: str, sentence2: str, mwe1: str | None, mwe2: str | None, *, upstream_quirk: bool = True
) -> tuple[str, str]:
    """Replace MWE1 in sentence 1 and MWE2 in sentence 2 by their tokens (the quirk: see module docstring)."""
    if mwe1 is not None:
        sentence1 = replace_mwe(sentence1, mwe1, mwe_token(mwe1), escape=not upstream_quirk)
    if mwe2 is not None:
        pattern = mwe1 if upstream_quirk and mwe1 is not None else mwe2
        sentence2 = replace_mwe(sentence2, pattern, mwe_token(mwe2), escape=not upstream_quirk)
    return sentence1, sentence2


# --------------------------------------------------------------------------------------------- reading
def read_rows(path: str | Path, header: Sequence[str]) -> Iterator[tuple[int, list[str]]]:
    """``(line, fields)`` of every data row of a CSV whose first line must be exactly ``header``.

    Blank lines are skipped; a row with another number of fields is a :class:`UserError` at its line.
    """
    try:
        f = open(path, encoding="utf-8-sig", newline="")
    except OSError as err:
        raise UserError(f"{at(path)}: cannot read ({err.strerror or err})") from None
    with f:
        reader = csv.reader(bounded_lines(f, path))
        try:
            first = next(reader, None)
            if first != list(header):
                got = "missing (empty file)" if first is None else str(first)
                raise UserError(f"{at(path, 1)}: header {got}, expected {list(header)}")
            start = reader.line_num + 1
            for row in reader:
                if row:
                    if len(row) != len(header):
                        raise UserError(
                            f"{at(path, start)}: {len(row)} fields, expected {len(header)} ({', '.join(header)})"
                        )
                    yield start, row
                start = reader.line_num + 1
        except csv.Error as err:
            raise UserError(f"{at(path, reader.line_num)}: bad CSV ({err})") from None
        except UnicodeDecodeError as err:
            raise UserError(f"{at(path)}: not UTF-8 text ({err.reason})") from None


def _first_line(path: str | Path) -> str:
    try:
        with open(path, encoding="utf-8-sig") as f:
            return f.readline(MAX_CSV_LINE)
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{at(path)}: cannot read ({getattr(err, 'strerror', None) or err})") from None


def _label(path: str | Path, line: int, value: str) -> int:
    if value not in ("0", "1"):
        raise UserError(f"{at(path, line)}: Label {value!r}, expected 0 (idiomatic) or 1 (non-idiomatic)")
    return int(value)


def _float(path: str | Path, line: int, name: str, value: str, *, high: float) -> float:
    try:
        x = float(value)
    except ValueError:
        x = float("nan")
    if not 0.0 <= x <= high:  # also rejects nan
        raise UserError(f"{at(path, line)}: {name} {value!r}, expected a number in [0, {high:g}]")
    return x


def _mwe(value: str) -> str | None:
    return None if value == NONE else value


def read_idiom_train(path: str | Path) -> list[IdiomExample]:
    """A train file (train_zero_shot.csv / train_one_shot.csv): labelled rows with their Setting."""
    out = []
    for line, (data_id, lang, mwe, setting, prev, target, nxt, label) in read_rows(path, A_TRAIN_HEADER):
        if setting not in A_SETTINGS:
            raise UserError(f"{at(path, line)}: Setting {setting!r}, expected one of {', '.join(A_SETTINGS)}")
        out.append(IdiomExample(data_id, lang, mwe, prev, target, nxt, _label(path, line, label), setting))
    return out


def read_idiom_inputs(path: str | Path) -> list[IdiomExample]:
    """A dev/eval/test input file of Subtask A (no labels)."""
    return [
        IdiomExample(i, lang, mwe, prev, target, nxt)
        for _, (i, lang, mwe, prev, target, nxt) in read_rows(path, A_INPUT_HEADER)
    ]


def read_idiom_gold(path: str | Path) -> list[IdiomGold]:
    return [
        IdiomGold(i, d, lang, _label(path, line, label))
        for line, (i, d, lang, label) in read_rows(path, A_GOLD_HEADER)
    ]


def with_gold(
    examples: Sequence[IdiomExample], gold: Sequence[IdiomGold], *, name: str = "gold"
) -> list[IdiomExample]:
    """``examples`` labelled from ``gold``, which must list the same IDs in the same order (as upstream)."""
    if [e.id for e in examples] != [g.id for g in gold]:
        k = next(
            (i for i, (e, g) in enumerate(zip(examples, gold, strict=False)) if e.id != g.id),
            min(len(examples), len(gold)),
        )
        raise UserError(
            f"{name}: IDs differ from the inputs' at row {k + 1} ({len(gold)} gold rows, "
            f"{len(examples)} inputs); expected the same IDs in the same order"
        )
    return [replace(e, label=g.label) for e, g in zip(examples, gold, strict=True)]


def read_sts_train(path: str | Path) -> list[StsPair]:
    """Subtask B train_data.csv: sim '1' (or a number in [0, 1]) or 'None' with both alternatives."""
    out = []
    for line, (i, m1, m2, lang, s1, s2, sim, alt1, alt2) in read_rows(path, B_TRAIN_HEADER):
        value = None if sim == NONE else _float(path, line, "sim", sim, high=1.0)
        if value is None and not (alt1 and alt2):
            raise UserError(f"{at(path, line)}: sim is None, expected alternative_1 and alternative_2")
        out.append(StsPair(i, lang, _mwe(m1), _mwe(m2), s1, s2, value, alt1, alt2))
    return out


def read_sts_inputs(path: str | Path) -> list[StsPair]:
    """A Subtask B dev/eval/test input file."""
    return [
        StsPair(i, lang, _mwe(m1), _mwe(m2), s1, s2)
        for _, (i, lang, m1, m2, s1, s2) in read_rows(path, B_INPUT_HEADER)
    ]


def read_sts_gold(path: str | Path) -> list[StsGold]:
    """dev.gold.csv of Subtask B: a sim in [0, 1], or an empty sim and the otherID it borrows from."""
    out = []
    for line, (i, data_id, lang, sim, other) in read_rows(path, B_GOLD_HEADER):
        if sim == "" and other == "":
            raise UserError(f"{at(path, line)}: empty sim and empty otherID, expected one of them")
        value = None if sim == "" else _float(path, line, "sim", sim, high=1.0)
        out.append(StsGold(i, data_id, lang, value, other or None))
    return out


def read_sts_pretrain(path: str | Path) -> list[ScoredPair]:
    """raycl's STS pre-training CSV (``split, Language, sentence1, sentence2, score``; score in [0, 5])."""
    out = []
    for line, (split, lang, s1, s2, score) in read_rows(path, STS_PRETRAIN_HEADER):
        if split not in ("train", "dev", "test"):
            raise UserError(f"{at(path, line)}: split {split!r}, expected train, dev or test")
        out.append(ScoredPair(split, lang, s1, s2, _float(path, line, "score", score, high=5.0)))
    return out


# --------------------------------------------------------------------------------------------- writing
def write_csv(path: str | Path, header: Sequence[str], rows: Iterable[Sequence[object]]) -> Path:
    """Write a header and rows with :mod:`csv` (as upstream: minimal quoting, ``\\r\\n``), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _cell(value: Value) -> str:
    """A CSV cell: blank for None, ``1`` for a whole number, else the shortest exact float text."""
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def write_idiom_train(path: str | Path, examples: Iterable[IdiomExample]) -> Path:
    return write_csv(
        path,
        A_TRAIN_HEADER,
        ((e.id, e.language, e.mwe, e.setting, e.previous, e.target, e.next, _cell(e.label)) for e in examples),
    )


def write_idiom_inputs(path: str | Path, examples: Iterable[IdiomExample]) -> Path:
    return write_csv(
        path, A_INPUT_HEADER, ((e.id, e.language, e.mwe, e.previous, e.target, e.next) for e in examples)
    )


def write_idiom_gold(path: str | Path, gold: Iterable[IdiomGold]) -> Path:
    return write_csv(path, A_GOLD_HEADER, ((g.id, g.data_id, g.language, g.label) for g in gold))


def _none(mwe: str | None) -> str:
    return NONE if mwe is None else mwe


def write_sts_train(path: str | Path, pairs: Iterable[StsPair]) -> Path:
    rows = (
        (
            p.id,
            _none(p.mwe1),
            _none(p.mwe2),
            p.language,
            p.sentence1,
            p.sentence2,
            NONE if p.sim is None else _cell(p.sim),
            p.alternative_1,
            p.alternative_2,
        )
        for p in pairs
    )
    return write_csv(path, B_TRAIN_HEADER, rows)


def write_sts_inputs(path: str | Path, pairs: Iterable[StsPair]) -> Path:
    return write_csv(
        path,
        B_INPUT_HEADER,
        ((p.id, p.language, _none(p.mwe1), _none(p.mwe2), p.sentence1, p.sentence2) for p in pairs),
    )


def write_sts_gold(path: str | Path, gold: Iterable[StsGold]) -> Path:
    return write_csv(
        path, B_GOLD_HEADER, ((g.id, g.data_id, g.language, _cell(g.sim), g.other_id or "") for g in gold)
    )


def write_sts_pretrain(path: str | Path, pairs: Iterable[ScoredPair]) -> Path:
    return write_csv(
        path, STS_PRETRAIN_HEADER, ((p.split, p.language, p.sentence1, p.sentence2, _cell(p.score)) for p in pairs)
    )


SubmissionRow = tuple[str, str, Value, Value]  # (ID, Language, first setting's value, second setting's value)


def _write_submission(
    path: str | Path, header: Sequence[str], settings: Sequence[str], rows: Sequence[SubmissionRow]
) -> Path:
    # The official layout: every ID in input order under the first setting, then again under the second.
    out = [(i, lang, setting, _cell(values[k])) for k, setting in enumerate(settings) for i, lang, *values in rows]
    return write_csv(path, header, out)


def write_submission_a(path: str | Path, rows: Sequence[SubmissionRow]) -> Path:
    """Subtask A submission: rows ``(ID, Language, zero_shot label, one_shot label)`` in input order."""
    return _write_submission(path, A_SUBMISSION_HEADER, A_SETTINGS, rows)


def write_submission_b(path: str | Path, rows: Sequence[SubmissionRow]) -> Path:
    """Subtask B submission: rows ``(ID, Language, pre_train sim, fine_tune sim)`` in input order."""
    return _write_submission(path, B_SUBMISSION_HEADER, B_SETTINGS, rows)


def fill_submission(format_csv: str | Path, predictions: Mapping[tuple[str, str], Value], out: str | Path) -> Path:
    """Fill an official ``*_submission_format.csv`` from ``{(ID, Setting): value}``, keeping its row order.

    Rows without a prediction keep their cell (blank in the format files); a prediction whose (ID, Setting)
    is not in the format file is a :class:`UserError` (wrong split or setting).
    """
    header = B_SUBMISSION_HEADER if _first_line(format_csv).rstrip().endswith("Sim") else A_SUBMISSION_HEADER
    rows, seen = [], set()
    for _, (i, lang, setting, value) in read_rows(format_csv, header):
        seen.add((i, setting))
        rows.append((i, lang, setting, _cell(predictions[(i, setting)]) if (i, setting) in predictions else value))
    unknown = [key for key in predictions if key not in seen]
    if unknown:
        raise UserError(
            f"{at(format_csv)}: {len(unknown)} predictions have no row here, e.g. ID {unknown[0][0]} "
            f"setting {unknown[0][1]}; expected the IDs of this split"
        )
    return write_csv(out, header, rows)
