"""The one best-trial picker every recipe's report declares (``raycl.report.RecipeReport.best``) and the paper's
row order of its tables (``raycl.report.ladder``), each compared with a plain-loop recomputation on
random histories.

A trial is scored either by its best report of the metric (GEC, coherence: the checkpoint dev picks) or by its
closing report (idiom, STS: ``final: 1``); ties go to the first trial (GEC, coherence, idiom) or the last (STS);
groups (idiom's settings) are picked apart. Values are drawn from a few levels so that ties happen.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from raycl import report as rp
from raycl.records import TrialOutcome

GROUPS = ("zero_shot", "one_shot")


def _trial(rng: random.Random, i: int) -> TrialOutcome:
    rows: list[dict[str, Any]] = []
    for step in range(1, rng.randrange(1, 5)):
        row: dict[str, Any] = {"step": step}
        if rng.random() < 0.8:  # some reports lack the metric
            row["dev"] = rng.choice([0.1, 0.4, 0.4, 0.7, float("nan")])
        rows.append(row)
    if rng.random() < 0.7:  # a closing report, not always: an unfinished trial has none
        rows.append({"final": 1, "dev": rng.choice([0.2, 0.5, 0.5, 0.9]), "setting": rng.choice(GROUPS)})
    return TrialOutcome(f"t{i}", {"data.setting": rng.choice(GROUPS)}, rows)


def _naive_score(t: TrialOutcome, final: bool, mode: str) -> float | None:
    """The closing report's metric, or the best of every report's (the closing one's too); NaN counts as none."""
    if final:
        closing = [r for r in t.history if r.get("final") == 1]
        v = closing[-1].get("dev") if closing else None
        return None if v is None or v != v else v
    values = [r["dev"] for r in t.history if r.get("dev") is not None and r["dev"] == r["dev"]]
    if not values:
        return None
    return max(values) if mode == "max" else min(values)


def _naive_best(trials: list[TrialOutcome], final: bool, last: bool, mode: str) -> TrialOutcome | None:
    best, best_v = None, None
    for t in trials:
        v = _naive_score(t, final, mode)
        if v is None:
            continue
        better = best_v is None or (v > best_v if mode == "max" else v < best_v)
        if better or (last and v == best_v):
            best, best_v = t, v
    return best


class _Grouped(rp.RecipeReport):
    groups = GROUPS

    def group(self, trial: TrialOutcome) -> Any:
        return trial.params["data.setting"]


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("final", [False, True])
@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("mode", ["max", "min"])
def test_the_best_trial_of_each_group_is_the_naive_pick(seed: int, final: bool, last: bool, mode: str) -> None:
    rng = random.Random(seed)
    trials = [_trial(rng, i) for i in range(rng.randrange(1, 7))]
    one, grouped = rp.RecipeReport(), _Grouped()
    for r in (one, grouped):
        r.final, r.last = final, last
    expected = _naive_best(trials, final, last, mode)
    assert one.best(trials, "dev", mode) == ({None: expected} if expected is not None else {})
    for g in GROUPS:
        got = grouped.best(trials, "dev", mode).get(g)
        assert got is _naive_best([t for t in trials if t.params["data.setting"] == g], final, last, mode)


def test_a_tables_rows_follow_the_papers_order_with_the_others_where_it_says() -> None:
    """Baselines named in the order, the sweep's best at None, the unnamed ones (in the order they ran) at ``...``;
    a named baseline that did not run leaves no row."""
    extra = [TrialOutcome(n, {"baseline": n}, []) for n in ("x", "nll", "y", "fn", "di")]
    best = TrialOutcome("best", {"loss.margin": 0.1}, [])
    order = ("di", "nll", "cl_minus", ..., None, "fn")
    got = [t.trial_id for t in rp.ladder(extra, best, order)]
    assert got == ["di", "nll", "x", "y", "best", "fn"]
    assert [t.trial_id for t in rp.ladder(extra, None, order)] == ["di", "nll", "x", "y", "fn"]
    assert [t.trial_id for t in rp.ladder(extra, best, ("nll", None))] == ["nll", "best"]
