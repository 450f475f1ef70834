"""``raycl.train`` (idiom, both settings) whose driver was killed (SIGKILL) once one setting ended and the other
reported a checkpoint, and the same command run again (through a pipe, as ``ray job logs`` would read it): the
setting that ended is kept, the interrupted one continues from its checkpoint. The killed driver joins the test
session's local Ray (``--address``), as on a cluster's head node. A file of its own beside
``test_resume_driver.py`` (the killed sweep, whose helpers it uses), so that ``make test``'s two workers (whole
files each) can run the two at once."""

from __future__ import annotations

from pathlib import Path

from test_resume_driver import _cli, _ended_and_checkpointed, _kill_when, _line, _rerun, _starts

from raycl.records import read_history


def test_a_train_run_whose_driver_was_killed_continues_where_it_was(ray_local, tmp_path: Path) -> None:
    """Idiom's two settings, one after the other: killed once zero-shot ended and one-shot reported a
    checkpoint."""
    address = ray_local.get_runtime_context().gcs_address
    out = tmp_path / "run"
    cmd = _cli("train", "idiom", out, ["optim.epochs=6", "scaling.cpus_per_worker=1"], address)
    _kill_when(cmd, _ended_and_checkpointed(out, lambda setting: f"train-{setting}"))
    stderr = _rerun(cmd)
    assert f"resumed run: {out}\n" in stderr
    assert _line(stderr, "[raycl] resumed trainings:") == (
        "[raycl] resumed trainings: 1 finished trainings kept, 1 interrupted trainings continued from their "
        "last checkpoint, 0 trainings still to run"
    )
    assert len(_starts(out / "trials" / "zero_shot")) == 1
    first, second = _starts(out / "trials" / "one_shot")
    assert not first["resumed"] and second["resumed"] and second["step"] > 0
    assert [h["epoch"] for h in read_history(out / "trials" / "one_shot")][:6] == [1, 2, 3, 4, 5, 6]
    assert (out / "report.md").exists() and (out / "eval.submission.csv").exists()
