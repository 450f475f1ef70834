"""``python -m raycl.eval gec``: JSON and table output, several references, slices, errors with exit 2."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from raycl.data.m2 import Edit, M2Sentence, read_m2, write_m2
from raycl.eval import main
from raycl.scoring import errant_scorer
from raycl.scoring.gec_metrics import evaluate_gec

REPO = Path(__file__).resolve().parents[1]
Cap = pytest.CaptureFixture[str]


def _e(start: int, end: int, kind: str, cor: str, annotator: int) -> Edit:
    return Edit(start, end, kind, cor, annotator)


REFS = [
    M2Sentence("He go to school .", (_e(1, 2, "R:VERB:SVA", "goes", 0), _e(1, 2, "R:VERB:TENSE", "went", 1))),
    M2Sentence("I like apple .", (_e(2, 3, "R:NOUN:NUM", "apples", 0), _e(2, 2, "M:DET", "an", 1))),
    M2Sentence("This are good .", (_e(1, 2, "R:VERB:SVA", "is", 0), _e(1, 2, "R:VERB:SVA", "is", 1))),
    M2Sentence("Thank you .", (_e(-1, -1, "noop", "-NONE-", 0), _e(-1, -1, "noop", "-NONE-", 1))),
    M2Sentence(
        "She have a cats .",
        (
            _e(1, 2, "R:VERB:SVA", "has", 0),
            _e(3, 4, "R:NOUN:NUM", "cat", 0),
            _e(1, 2, "R:VERB:SVA", "has", 1),
            _e(2, 3, "U:DET", "", 1),
        ),
    ),
]
HYPS = ["He goes to school .", "I like the apple .", "This are good .", "Thank you very much .", "She has cats ."]


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, str]:
    write_m2(tmp_path / "ref.m2", REFS)
    for a in (0, 1):  # CWEB style: one file per annotator
        write_m2(
            tmp_path / f"ann{a}.m2",
            [M2Sentence(s.source, tuple(e for e in s.edits if e.annotator == a)) for s in REFS],
        )
    (tmp_path / "hyp.txt").write_text("\n".join(HYPS) + "\n")
    (tmp_path / "src.txt").write_text("".join(s.source + "\n" for s in REFS))
    return {
        k: str(tmp_path / f)
        for k, f in {
            "ref": "ref.m2",
            "ann0": "ann0.m2",
            "ann1": "ann1.m2",
            "hyp": "hyp.txt",
            "src": "src.txt",
        }.items()
    }


def run_json(capsys: Cap, *argv: str) -> dict[str, Any]:
    assert main(["gec", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def run_error(capsys: Cap, *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main(["gec", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line, no traceback
    return err


def test_json_has_every_annotator_and_matches_the_api(files: dict[str, str], capsys: Cap) -> None:
    out = run_json(capsys, "--hyp", files["hyp"], "--ref", files["ref"])
    ref = out["refs"][files["ref"]]
    assert set(ref["annotators"]) == {"0", "1"}
    for row in ref["annotators"].values():
        assert set(row) == {"tp", "fp", "fn", "p", "r", "f0.5", "oe", "ie"}
    expected = evaluate_gec(HYPS, {files["ref"]: read_m2(files["ref"])})
    assert out["refs"] == expected["refs"] and out["average"] == expected["average"]
    # by hand: annotator 0 gets goes and has; annotator 1 gets has and the deleted "a"
    assert (ref["annotators"]["0"]["tp"], ref["annotators"]["1"]["tp"]) == (2, 2)
    assert out["hyp"] == files["hyp"]


def test_table_shows_rows_in_percent(files: dict[str, str], capsys: Cap) -> None:
    assert main(["gec", "--hyp", files["hyp"], "--ref", files["ref"]]) == 0
    text = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.startswith("  ")}
    assert {"0", "1", "average", "combined", "all"} <= set(rows)
    combined = evaluate_gec(HYPS, {"r": read_m2(files["ref"])})["refs"]["r"]["combined"]
    assert rows["combined"][1:4] == [str(combined[k]) for k in ("tp", "fp", "fn")]
    assert float(rows["combined"][6]) == pytest.approx(100 * combined["f0.5"], abs=0.005)
    assert f"ref: {files['ref']}" in text


def test_per_annotator_files_are_averaged(files: dict[str, str], capsys: Cap) -> None:
    out = run_json(capsys, "--hyp", files["hyp"], "--ref", files["ann0"], "--ref", files["ann1"])
    f0 = out["refs"][files["ann0"]]["annotators"]["0"]["f0.5"]
    f1 = out["refs"][files["ann1"]]["annotators"]["1"]["f0.5"]
    assert out["average"]["f0.5"] == pytest.approx((f0 + f1) / 2)
    both = run_json(capsys, "--hyp", files["hyp"], "--ref", files["ref"])["refs"][files["ref"]]["annotators"]
    assert (f0, f1) == (both["0"]["f0.5"], both["1"]["f0.5"])


def test_annotator_flag_and_slice(files: dict[str, str], capsys: Cap, tmp_path: Path) -> None:
    out = run_json(capsys, "--hyp", files["hyp"], "--ref", files["ref"], "--annotator", "1")
    assert list(out["refs"][files["ref"]]["annotators"]) == ["1"]
    (tmp_path / "head.txt").write_text("\n".join(HYPS[:3]) + "\n")
    spec = files["ref"] + "[:3]"
    sliced = run_json(capsys, "--hyp", str(tmp_path / "head.txt"), "--ref", spec)["refs"][spec]
    assert sliced == evaluate_gec(HYPS[:3], {"r": REFS[:3]})["refs"]["r"]


def test_compare_adds_the_sign_test(files: dict[str, str], capsys: Cap) -> None:
    ref = ["--hyp", files["hyp"], "--ref", files["ref"]]
    out = run_json(capsys, *ref, "--compare", files["hyp"], "--samples", "30")
    assert out["compare"]["refs"][files["ref"]] == {"wins": 0, "losses": 0, "ties": 30, "p_value": 1.0}
    better = run_json(capsys, "--hyp", files["hyp"], "--ref", files["ref"], "--compare", files["src"])
    assert better["compare"]["refs"][files["ref"]]["wins"] > 50
    assert main(["gec", "--hyp", files["hyp"], "--ref", files["ref"], "--compare", files["src"]]) == 0
    assert "sign test:" in capsys.readouterr().out


def test_errors_are_one_line_with_exit_2(files: dict[str, str], capsys: Cap, tmp_path: Path) -> None:
    assert "nope.txt" in run_error(capsys, "--hyp", str(tmp_path / "nope.txt"), "--ref", files["ref"])
    assert "nope.m2" in run_error(capsys, "--hyp", files["hyp"], "--ref", str(tmp_path / "nope.m2"))
    (tmp_path / "short.txt").write_text("\n".join(HYPS[:2]) + "\n")
    err = run_error(capsys, "--hyp", str(tmp_path / "short.txt"), "--ref", files["ref"])
    assert "short.txt" in err and "2 hypothesis lines" in err and f"{len(REFS)} sentences" in err
    bad = tmp_path / "bad.m2"
    bad.write_text("S a b c\nA 0 1|||R:X|||x\n")
    assert f"{bad}:2:" in run_error(capsys, "--hyp", files["hyp"], "--ref", str(bad))
    assert "no annotator 5" in run_error(capsys, "--hyp", files["hyp"], "--ref", files["ref"], "--annotator", "5")
    with pytest.raises(SystemExit) as exc:  # argparse: no task
        main([])
    assert exc.value.code == 2


def test_progress_bar_only_on_a_tty_for_long_files(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    lines = [f"sentence {i} ." for i in range(errant_scorer.PROGRESS_MIN + 1)]
    for stream, shown in ((Tty(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stream)
        assert errant_scorer.annotate_hypotheses(lines, lines) == [()] * len(lines)  # unchanged: no parsing
        assert ("errant" in stream.getvalue()) is shown
    monkeypatch.setattr(sys, "stderr", Tty())
    errant_scorer.annotate_hypotheses(lines[:-1], lines[:-1])
    assert sys.stderr.getvalue() == ""


def test_module_entry_point_prints_only_json(files: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "raycl.eval", "gec", "--hyp", files["hyp"], "--ref", files["ref"], "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["refs"][files["ref"]]["combined"]["tp"] >= 3


def test_a_json_commands_stdout_is_its_summary_alone(capfd: pytest.CaptureFixture[str]) -> None:
    """With ``--json`` whatever else a command writes to stdout while it runs — Ray prints its raylet's and
    workers' messages there (``(raylet) WARNING: 8 PYTHON worker processes …``) — goes to stderr; the summary
    alone reaches stdout, so that ``… --json | jq`` reads it. Without ``--json`` stdout is left alone."""
    import json
    import sys

    from raycl.errors import cli_entry, summary_out

    @cli_entry
    def main(argv: list[str] | None = None) -> None:
        print("(raylet) WARNING: a message Ray prints on the driver's stdout")
        sys.stdout.flush()
        print(json.dumps({"ok": 1}) if "--json" in (argv or []) else "a table", file=summary_out())

    main(["--json"])
    out, err = capfd.readouterr()
    assert json.loads(out) == {"ok": 1} and "(raylet) WARNING" in err
    main([])
    out, _ = capfd.readouterr()
    assert out.splitlines() == ["(raylet) WARNING: a message Ray prints on the driver's stdout", "a table"]
