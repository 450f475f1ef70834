"""A run whose trials failed says so on stderr; one where every trial failed ends with exit status 1 and one line
after its report is written (``raycl.cli.finish``, which ``raycl.tune`` and ``raycl.train`` end with)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from raycl.cli import finish
from raycl.errors import cli_entry


@cli_entry
def _main(argv: list[str], summary: dict[str, Any]) -> None:
    finish(summary, as_json="--json" in argv)


def _summary(tmp_path: Path, trials: int, failed: list[str]) -> dict[str, Any]:
    return {"run_dir": str(tmp_path), "trials": trials, "failed_trials": failed}


def test_no_failed_trial_says_only_where_the_report_is(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    _main([], _summary(tmp_path, 3, []))
    out, err = capsys.readouterr()
    assert out == f"report: {tmp_path}/report.md\n" and err == ""


def test_some_failed_trials_are_named_and_the_run_succeeds(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    _main([], _summary(tmp_path, 3, ["a_00001"]))
    out, err = capsys.readouterr()
    assert out == f"report: {tmp_path}/report.md\n"
    assert err == f"raycl: 1 of 3 trials failed (a_00001): their errors are in {tmp_path}/results.csv\n"


@pytest.mark.parametrize("as_json", [False, True])
def test_every_trial_failed_is_exit_status_1_after_the_summary(tmp_path: Path, capsys, as_json: bool) -> None:  # noqa: ANN001
    summary = _summary(tmp_path, 2, ["a_00000", "a_00001"])
    with pytest.raises(SystemExit) as ended:
        _main(["--json"] if as_json else [], summary)
    assert ended.value.code == 1
    out, err = capsys.readouterr()
    if as_json:
        assert json.loads(out) == summary  # stdout: the summary alone
    else:
        assert out == f"report: {tmp_path}/report.md\n"
    assert err.splitlines()[-1] == (
        f"raycl: error: 2 of 2 trials failed (a_00000, a_00001): their errors are in {tmp_path}/results.csv"
    )
