"""Resume through the real loop, for the recipes whose state has a schedule in ``st.schedulers`` (issue 23): a run
with dropout on, its real learning-rate schedule (linear warm-up and decay), several epochs of shuffled data, is
stopped after a checkpoint — mid-epoch where the recipe reports mid-epoch (STS) — and resumed from it; it ends with
the weights, optimizer state, learning rate, EMA / MoCo state of an uninterrupted run. A resume that forgot the
schedule's state or the RNG states (dropout masks) ends elsewhere.

In-process, with a local session (``raycl.testing.session.LocalSession``: its "crash" ends the run right after a
report): the restore path is the loop's own (``state.pt`` and this rank's ``rank0.pt``). Coherence's resume (SWALR
in its extras, the momentum model on 2 real workers killed mid-epoch) is ``test_equivalence.py``'s
``test_the_momentum_model_killed_mid_epoch_resumes_to_the_uninterrupted_end``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from test_equivalence import GEC, TOL, _cfg, _prepare, assert_same_training

from raycl.data.gec import load_examples
from raycl.miners.beam_search import write_negatives_parquet
from raycl.miners.records import MinedNegatives
from raycl.recipes.gec.worker import GecTask
from raycl.recipes.idiom.worker import IdiomTask
from raycl.recipes.sts.worker import StsTask
from raycl.testing.loop_hooks import StateProbe
from raycl.testing.session import LocalSession
from raycl.training import loop
from raycl.training.task import Job


def _run(run: Any, task: Any, out: Path, *, crash_after: int | None = None) -> dict[str, Any]:
    """The whole run (``crash_after``: stopped after that report, resumed from its checkpoint); the final state."""
    fake = LocalSession(out)
    job = Job(
        task,
        str(run.base_model),
        str(out),
        use_gpu=False,
        hooks=(StateProbe(str(out / "probe")),),
        session=fake,
    )
    if crash_after is not None:
        fake.crash_after = crash_after
        with pytest.raises(SystemExit):
            loop.run(job)
        assert fake.ckpt is not None
        fake.crash_after = None
    loop.run(job)  # from the checkpoint, if one was kept
    return torch.load(out / "probe" / "rank0.pt", weights_only=False)


def assert_the_total_was_counted_once(out: Path, state: dict[str, Any]) -> None:
    """The schedule's total, which the progress bar counts to, is the number of updates the run made."""
    total = json.loads((out / "progress.json").read_text())["total"]
    assert total == state["progress"]["step"], f"the bar's total {total}, updates made {state['progress']['step']}"


def _same_extras(a: dict[str, Any], b: dict[str, Any], name: str, key: str) -> None:
    x, y = a["extras"][name][key], b["extras"][name][key]
    x, y = (x, y) if isinstance(x, dict) else ({"": x}, {"": y})
    assert x.keys() == y.keys() and all(torch.allclose(x[k], y[k], atol=TOL) for k in x if torch.is_tensor(x[k]))


def test_idiom_resumes_with_its_schedule_dropout_and_ema(tmp_path: Path) -> None:
    run = _prepare(
        "idiom", ["optim.epochs=3", "data.setting=zero_shot", "adversarial.method=fgm"], tmp_path, dropout=True
    )
    task = IdiomTask(_cfg(run, ["optim.batch_size=16"]))
    whole = _run(run, task, tmp_path / "whole")
    assert_the_total_was_counted_once(tmp_path / "whole", whole)
    resumed = _run(run, task, tmp_path / "resumed", crash_after=1)  # stopped after epoch 1
    assert_same_training(whole, resumed, what="idiom: stopped after epoch 1 and resumed vs uninterrupted")
    _same_extras(whole, resumed, "ema", "shadow")


def test_gec_resumes_with_its_polynomial_schedule_and_dropout(tmp_path: Path) -> None:
    """GEC-BART's schedule (warm-up, linear decay), Eq. 5 with negatives mined before training (a deterministic
    batch order), dropout on, 3 epochs; stopped after epoch 1."""
    run = _prepare("gec_pd", [*GEC, "data.builtin.n_finetune=30"], tmp_path, dropout=True)
    examples = load_examples(run.cfg.data.finetune, annotator=run.cfg.data.annotator)
    mined = [MinedNegatives(ex.id, (ex.source,), (0.0,)) for ex in examples]
    negatives = write_negatives_parquet(tmp_path / "negatives.parquet", examples, mined, model_version=0)
    over = [
        "optim.epochs=3",
        "optim.batch_size=8",
        "optim.max_tokens=0",
        "optim.warmup_updates=3",
        "optim.scheduler=polynomial",
        f"mining.negatives={negatives}",
    ]
    task = GecTask(_cfg(run, over), "finetune")
    whole = _run(run, task, tmp_path / "whole")
    assert_the_total_was_counted_once(tmp_path / "whole", whole)
    resumed = _run(run, task, tmp_path / "resumed", crash_after=1)
    assert_same_training(whole, resumed, what="gec: stopped after epoch 1 and resumed vs uninterrupted")


def test_sts_resumes_mid_epoch_with_moco_and_dropout(tmp_path: Path) -> None:
    """Pre-training with MSE + InfoNCE and the MoCo queue, reports every 3 steps (mid-epoch), 2 epochs; stopped
    after the second report, inside epoch 1."""
    over = [
        "pretrain.epochs=2",
        "finetune.epochs=0",
        "pretrain.eval_every=3",
        "loss.lam=0.5",
        "loss.joint=sum",
        "moco.queue_size=12",
        "optim.batch_size=8",
    ]
    run = _prepare("sts", over, tmp_path, dropout=True)
    task = StsTask(_cfg(run, []))
    whole = _run(run, task, tmp_path / "whole")
    assert_the_total_was_counted_once(tmp_path / "whole", whole)
    resumed = _run(run, task, tmp_path / "resumed", crash_after=2)
    assert resumed["progress"]["step"] > 6
    assert_same_training(whole, resumed, what="sts: stopped mid-epoch and resumed vs uninterrupted")
    _same_extras(whole, resumed, "moco", "queue")
