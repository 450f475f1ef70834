"""A report's tables declared as data (``raycl.report.col``, ``grid``, ``trial_rows``, ``point_col`` and a
``RecipeReport``'s default table): each compared with the Markdown written out by hand."""

from __future__ import annotations

from typing import Any

from raycl import report as rp
from raycl.records import TrialOutcome


def test_a_grid_is_outer_by_inner_with_each_cell_formatted_and_a_missing_one_a_dash() -> None:
    row = {"method": "CL", "test/S/p": 0.5, "test/S/f05": 0.12345, "test/G/p": 1.0}  # test/G/f05 missing
    cols = rp.grid("{0} {1}", "test/{0}/{1}", ["S", "G"], [("P", "p"), ("F0.5", "f05")])
    assert rp.columns([row], [rp.METHOD, *cols]) == [
        "| Method | S P | S F0.5 | G P | G F0.5 |",
        "|---|---|---|---|---|",
        "| CL | 50.00 | 12.35 | 100.00 | – |",
    ]
    swapped = rp.grid("{0} {1}", "{1}/{0}", [("pre", "pre_train")], [("ℓ_align", "align")], rp.cell3)
    assert rp.columns([{"align/pre_train": -1.23456}], swapped) == ["| pre ℓ_align |", "|---|", "| -1.235 |"]


def test_a_sweep_tables_rows_hold_each_trials_report_and_point() -> None:
    trials = [
        TrialOutcome("a", {"loss.margin": 0.1, "mining.k": 4}, [{"dev": 0.5, "epoch": 2}]),
        TrialOutcome("b", {"baseline": "nll"}, []),  # no report: its cells are dashes, its point the default
    ]
    rows = rp.trial_rows(trials, lambda t: t.history[-1] if t.history else None)
    assert [r["trial"] for r in rows] == trials and rows[0]["epoch"] == 2
    cols = [rp.point_col("Point", {"loss.margin": "γ"}), rp.col("dev", "dev")]
    assert rp.columns(rows, cols)[2:] == ["| γ=0.1, mining.k=4 | 50.00 |", "| default | – |"]


class _Ladder(rp.RecipeReport):
    names, default, order = {"di": "DI"}, "CL", ("di", None, ...)

    def row(self, s: rp.Sweep, trial: TrialOutcome) -> dict[str, Any]:
        return {"method": self.label(trial)}


def test_the_default_table_is_each_ladder_trials_row_in_the_declared_order() -> None:
    best = TrialOutcome("best", {"loss.margin": 0.1}, [])
    extra = [TrialOutcome(n, {"baseline": n}, []) for n in ("x", "di")]
    s = rp.Sweep(run=None, space=None, trials=[best], extra=extra, best={None: best})
    assert [r["method"] for r in _Ladder().table(s)] == ["DI", "CL", "x"]
