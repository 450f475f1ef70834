"""A space's ``search:`` block (``grid``, ``choice``, ``uniform``, ``loguniform``, ``qrange`` over dotted keys)
and its ``baselines:``, checked against the config: every value typed and valid, the grid bounded."""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from typing import Any

from raycl.config.keys import coerce, field_type, set_dotted
from raycl.errors import UserError, shown

SEARCH_KINDS = ("grid", "choice", "uniform", "loguniform", "qrange")
MAX_SEARCH_VALUES = 1_000  # values one search key expands to (grid, choice, qrange)
MAX_TRIALS = 10_000  # trials a search expands to: the grid's points × tune.num_samples
ON_STEP = 1e-9  # a qrange's stop this close to a step (in steps) is on it: (1.0 - 0.1) / 0.05 is 17.999...96


def check_search(config: Any, search: Any, where: str) -> dict[str, dict[str, list[Any]]]:
    if not isinstance(search, dict):
        raise UserError(f"{where}: 'search' must map dotted config keys to {{kind: values}}")
    out: dict[str, dict[str, list[Any]]] = {}
    points = 1  # grid points: Tune runs every combination of the grid and qrange keys, num_samples times each
    for key, spec in search.items():
        tp = field_type(type(config), key, f"{where}: search")
        if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in SEARCH_KINDS:
            raise UserError(
                f"{where}: search key '{key}': expected one of {{{', '.join(SEARCH_KINDS)}: [...]}}, "
                f"got {shown(spec)}"
            )
        kind, values = next(iter(spec.items()))
        values = _check_search_values(kind, values, key, where)
        points *= int(search_count(kind, values)) if kind in ("grid", "qrange") else 1  # each ≤ the cap now
        for v in expand_values(kind, values) if kind in ("grid", "choice", "qrange") else values:
            coerce(v, tp, key, f"{where}: search")
            set_dotted(config, {key: v}, where=f"{where}: search value for '{key}'")
        out[key] = {kind: values}
    trials = points * config.tune.num_samples
    if trials > MAX_TRIALS:
        raise UserError(
            f"{where}: 'search' expands to {trials:,} trials ({points:,} grid points × "
            f"tune.num_samples = {config.tune.num_samples}), expected at most {MAX_TRIALS:,}"
        )
    return out


def _check_search_values(kind: str, values: Any, key: str, where: str) -> list[Any]:
    if not isinstance(values, list) or not values:
        raise UserError(f"{where}: search key '{key}': '{kind}' expects a non-empty list, got {shown(values)}")
    if kind in ("uniform", "loguniform") and (len(values) != 2 or not all(_is_num(v) for v in values)):
        raise UserError(f"{where}: search key '{key}': '{kind}' expects [low, high], got {shown(values)}")
    if kind == "loguniform" and min(values) <= 0:
        raise UserError(f"{where}: search key '{key}': 'loguniform' bounds must be > 0, got {shown(values)}")
    if kind == "qrange":
        if (
            len(values) != 3
            or not all(_is_num(v) and math.isfinite(v) for v in values)
            or values[2] <= 0
            or values[1] < values[0]
        ):
            raise UserError(
                f"{where}: search key '{key}': 'qrange' expects [start, stop, step>0] of finite "
                f"numbers, got {shown(values)}"
            )
    count = search_count(kind, values)
    if count > MAX_SEARCH_VALUES:
        raise UserError(
            f"{where}: search key '{key}': '{kind}' {shown(values)} expands to {count:,} values, "
            f"expected at most {MAX_SEARCH_VALUES:,}"
        )
    return values


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def search_count(kind: str, values: list[Any]) -> float:
    """How many values a checked spec expands to (a qrange's counted, not built: start, start + step, ... up to
    stop, stop included when it is on the step; uniform and loguniform: 1)."""
    if kind == "qrange":
        start, stop, step = values
        n = (stop - start) / step  # finite numbers, step > 0: at worst inf, never an error
        return math.inf if not math.isfinite(n) else math.floor(n + ON_STEP) + 1
    return len(values) if kind in ("grid", "choice") else 1


def expand_values(kind: str, values: list[Any]) -> list[Any]:
    """The discrete values of a ``grid``/``choice``/``qrange`` spec (a qrange's from start by step up to stop,
    stop included when it is on the step, each rounded to the decimal places of its start and step)."""
    if kind != "qrange":
        return list(values)
    start, stop, step = values
    n = int(search_count(kind, values))
    decimals = max(_decimals(start), _decimals(step))  # 0.15 + 0.1·i has two places: 0.15, 0.25, 0.35
    vals = [round(start + i * step, decimals) for i in range(n)]
    return [int(v) for v in vals] if all(isinstance(x, int) for x in values) else vals


def _decimals(step: float) -> int:
    """Decimal places of ``step`` as written (``0.05`` → 2, ``1e-10`` → 10, ``5`` → 0)."""
    try:
        exponent = Decimal(repr(float(step))).normalize().as_tuple().exponent
    except InvalidOperation:
        return 0
    return max(0, -exponent) if isinstance(exponent, int) else 0


def check_baselines(config: Any, baselines: Any, where: str) -> dict[str, dict[str, Any]]:
    if not isinstance(baselines, dict):
        raise UserError(f"{where}: 'baselines' must map a name to dotted overrides")
    for name, over in baselines.items():
        if not isinstance(over, dict):
            raise UserError(f"{where}: baseline '{name}': expected a mapping of dotted keys to values")
        set_dotted(config, over, where=f"{where}: baseline '{name}'")
    return baselines
