"""Helpers of the report-value tests: a recipe report's Markdown tables read back as cells, and the naive
selection and formatting rules the reports are checked against, written here from their documented meaning (not
imported from ``raycl.report``)."""

from __future__ import annotations

import math
from typing import Any


def tables(text: str) -> dict[str, list[dict[str, str]]]:
    """Every Markdown table of ``text`` by its first header cell: a list of ``{header: cell}`` rows.

    A report holds several tables with the same first header ("Method", "Strategy"); they come back as
    ``name``, ``name#2``, ``name#3`` in the order they appear."""
    out: dict[str, list[dict[str, str]]] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            head = _cells(lines[i])
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                cells = _cells(lines[i])
                assert len(cells) == len(head), (head, cells)
                rows.append(dict(zip(head, cells, strict=True)))
                i += 1
            name, k = head[0], 2
            while name in out:
                name, k = f"{head[0]}#{k}", k + 1
            out[name] = rows
        else:
            i += 1
    return out


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def percent(v: Any) -> str:
    """A fraction printed as a percentage with two decimals; a missing value as an en dash."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{100 * float(v):.2f}"


def best_of(history: list[dict[str, Any]], metric: str, *, by: str = "epoch") -> dict[str, Any]:
    """The report with the highest ``metric`` (the one a dev set picks), the earliest ``by`` on a tie: a loop."""
    best: dict[str, Any] | None = None
    for row in history:
        if row.get(metric) is None:
            continue
        if best is None or row[metric] > best[metric] or (row[metric] == best[metric] and row[by] < best[by]):
            best = row
    assert best is not None
    return best


def macro_f1(y_true: list[int], y_pred: list[int]) -> float:
    """Mean over the labels present (gold or predicted) of 2·TP / (2·TP + FP + FN), from counts."""
    labels = sorted(set(y_true) | set(y_pred))
    f1s = []
    for c in labels:
        tp = sum(1 for t, p in zip(y_true, y_pred, strict=True) if t == c and p == c)
        fp = sum(1 for t, p in zip(y_true, y_pred, strict=True) if t != c and p == c)
        fn = sum(1 for t, p in zip(y_true, y_pred, strict=True) if t == c and p != c)
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return sum(f1s) / len(f1s)
