"""JSON and CSV read within stated bounds: a hostile file ends in one line naming it, never in a traceback.

Python's own readers have limits that end in the wrong exception: ``json.loads`` recurses once per level of
nesting (a 5,000-deep line raises ``RecursionError``) and builds ``int`` from any number of digits (Python ≥ 3.11
raises ``ValueError`` past 4,300 digits, and below that the conversion is quadratic); ``csv.reader`` reads a whole
line before it looks at its fields, however long. Here a JSON value may nest :data:`MAX_JSON_DEPTH` levels and an
integer have :data:`MAX_INT_DIGITS` digits; a CSV line may have ``max_line`` characters (fields keep
``csv.field_size_limit``'s 131,072), each refused with the file and line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from raycl.errors import UserError, at

MAX_JSON_DEPTH = 64  # nesting levels (a coherence item has 3)
MAX_INT_DIGITS = 20  # digits of a JSON integer (an int64 has 19)
MAX_JSON_BYTES = 1 << 28  # a whole .json file read at once (annotations: a few hundred kilobytes)
MAX_CSV_LINE = 1 << 20  # characters of one CSV line (a SemEval row is a few hundred)


def json_value(where: str, text: str, expected: str) -> Any:
    """``text`` as JSON, within the bounds above; else one line: ``where: invalid JSON (why), expected …``."""

    def integer(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_INT_DIGITS:
            raise UserError(
                f"{where}: an integer of {len(digits.lstrip('-')):,} digits, expected at most {MAX_INT_DIGITS}"
            )
        return int(digits)

    try:
        value = json.loads(text, parse_int=integer)
    except json.JSONDecodeError as err:
        raise UserError(f"{where}: invalid JSON ({err.msg}), {expected}") from None
    except RecursionError:
        raise UserError(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels, {expected}") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise UserError(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels, {expected}")
    return value


def _depth(value: Any) -> int:
    """Levels of nesting of a parsed JSON value, without recursion (a scalar is 0)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, level = stack.pop()
        kids = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if kids is not None:
            deepest = max(deepest, level + 1)
            if deepest > MAX_JSON_DEPTH:
                return deepest
            stack += [(k, level + 1) for k in kids]
    return deepest


def read_json_file(path: str | Path, expected: str) -> Any:
    """A whole ``.json`` file (at most :data:`MAX_JSON_BYTES`) read by :func:`json_value`."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise UserError(f"{at(path)}: {size:,} bytes, expected a JSON file of at most {MAX_JSON_BYTES:,}")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{at(path)}: cannot read as JSON ({err}), {expected}") from None
    return json_value(at(path), text, expected)


def bounded_lines(
    f: IO[str], path: str | Path, max_line: int = MAX_CSV_LINE, *, expected: str = "one CSV row per line"
) -> Iterator[str]:
    """The lines of the text file ``f`` (newlines kept, as ``csv.reader`` wants them), none longer than
    ``max_line`` characters: a longer one is refused when ``max_line + 1`` of its characters are read; bytes that
    are not UTF-8 are one line too."""
    lineno = 0
    while True:
        try:
            line = f.readline(max_line + 1)
        except UnicodeDecodeError as err:
            raise UserError(f"{at(path, lineno + 1)}: not UTF-8 ({err.reason}), expected {expected}") from None
        if not line:
            return
        lineno += 1
        if len(line.rstrip("\r\n")) > max_line:
            raise UserError(f"{at(path, lineno)}: a line longer than {max_line:,} characters, expected {expected}")
        yield line
