"""A task's stages (``TaskBase.stages``, ``build_stages``, ``enter_stage``): the loop runs every stage's epochs one
after the other; each stage starts at its first epoch — its seed, then the task's ``start_stage`` with fresh
optimizers — and a run killed inside a stage starts that stage again as resumed (its optimizer's state restored
by the loop), ending where an uninterrupted run does. And ``kept_or_initial``: the kept model, or the initial
one."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from test_loop import Linear, X, Y
from torch import nn

from raycl.testing.session import LocalSession
from raycl.training import loop
from raycl.training.precision import Precision
from raycl.training.task import (
    Batch,
    Epoch,
    Job,
    LoopSettings,
    Stage,
    StepContext,
    TaskBase,
    TrainState,
    Worker,
)

STARTS: list[tuple[int, bool, float]] = []  # (stage, resumed, the first draw after the stage's start)


@dataclasses.dataclass(frozen=True)
class StagedTask(TaskBase):
    """Least squares in two stages: "a" (2 epochs, seed 5, lr 0.1), then "b" (1 epoch, seed 7, lr 0.01), each with
    a fresh Adam; a report after every epoch."""

    settings: LoopSettings = LoopSettings()

    def stages(self) -> list[Stage]:
        return [Stage("a", 2, seed=5), Stage("b", 1, seed=7)]

    def load_model(self, path: Path) -> nn.Module:
        torch.manual_seed(0)
        model = Linear(3, 1)
        if (path / "w.pt").exists():
            model.load_state_dict(torch.load(path / "w.pt"))
        return model

    def build(self, model: nn.Module, w: Worker, progress: dict[str, Any] | None) -> TrainState:
        st = TrainState(model, [], [], dict(progress or {}), total_updates=12)
        self.build_stages(st, w)
        return st

    def start_stage(self, st: TrainState, w: Worker, k: int, *, resumed: bool) -> None:
        STARTS.append((k, resumed, float(torch.rand(()))))
        st.optimizers = [torch.optim.Adam(st.model.parameters(), lr=(0.1, 0.01)[k])]
        st.schedulers = [None]

    def epoch(self, st: TrainState, w: Worker, epoch: int, start: int) -> Epoch:
        stage, _ = self.enter_stage(st, w, epoch)
        rows = [slice(i, i + 2) for i in range(0, len(X), 2)]
        return Epoch([Batch(r) for r in rows[start:]], info={"stage": stage.name})

    def collate(self, st: TrainState, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        return X[rows], Y[rows]

    def step(self, st: TrainState, data: tuple[torch.Tensor, torch.Tensor], ctx: StepContext) -> dict[str, Any]:
        x, y = data
        loss = ((ctx.module(x).squeeze(-1) - y) ** 2).mean()
        ctx.backward(loss, weight=float(len(y)))
        return {"loss": loss.detach()}

    def evaluate(self, st: TrainState, rep: Any, w: Worker) -> dict[str, Any]:
        return {"w": [float(v) for v in st.model.weight.flatten()], "stage": rep.info["stage"]}


def _draw(seed: int) -> float:
    torch.manual_seed(seed)
    return float(torch.rand(()))


def test_stages_run_one_after_the_other_each_seeded_and_started_once(tmp_path: Path) -> None:
    fake = LocalSession(tmp_path)
    STARTS.clear()
    loop.run(Job(StagedTask(), init_model=str(tmp_path / "none"), out_dir=str(tmp_path / "whole"), session=fake))
    assert STARTS == [(0, False, _draw(5)), (1, False, _draw(7))]  # each seeded as it starts, never again
    assert [r["stage"] for r in fake.reports] == ["a", "a", "b"]  # 2 + 1 epochs, a report after each
    assert [r["step"] for r in fake.reports] == [4, 8, 12]
    whole = fake.reports[-1]["w"]

    killed = LocalSession(tmp_path / "killed")
    killed.crash_after = 1  # inside stage "a": after its first epoch
    STARTS.clear()
    with pytest.raises(SystemExit):
        loop.run(
            Job(StagedTask(), init_model=str(tmp_path / "none"), out_dir=str(tmp_path / "killed"), session=killed)
        )
    killed.crash_after = None
    loop.run(
        Job(StagedTask(), init_model=str(tmp_path / "none"), out_dir=str(tmp_path / "killed"), session=killed)
    )
    # the first life starts "a"; the second starts it again as resumed (the loop restores its Adam), then "b"
    assert [(k, resumed) for k, resumed, _ in STARTS] == [(0, False), (0, True), (1, False)]
    assert killed.reports[-1]["stage"] == "b" and killed.reports[-1]["step"] == 12
    assert killed.reports[-1]["w"] == pytest.approx(whole, abs=1e-6)  # where the uninterrupted run ends


def test_the_kept_model_or_the_initial_one(tmp_path: Path) -> None:
    cpu = torch.device("cpu")
    w = Worker(1, 2, cpu, Precision("fp32", cpu), tmp_path / "run", Job(None, str(tmp_path / "init"), ""))
    task = StagedTask()
    assert task.kept_or_initial(w, "best_model", trained=False) == tmp_path / "init"  # nothing trained to keep
    with pytest.raises(RuntimeError, match=r"best_model: the model that training kept is not there on rank 1"):
        task.kept_or_initial(w, "best_model", trained=True)
    (tmp_path / "run" / "best_model").mkdir(parents=True)
    (tmp_path / "run" / "best_model" / "config.json").write_text("{}")
    assert task.kept_or_initial(w, "best_model", trained=True) == tmp_path / "run" / "best_model"


def test_a_checkpoint_from_before_stages_resumes_its_fit_as_the_stage(tmp_path: Path) -> None:
    """STS's checkpoints named the position ``progress["fit"]`` before stages: such a checkpoint starts that stage
    again as resumed, as one written since does (``progress["stage"]``)."""
    cpu = torch.device("cpu")
    w = Worker(0, 1, cpu, Precision("fp32", cpu), tmp_path, Job(None, "", ""))
    for progress in ({"fit": 1, "started": True}, {"stage": 1, "started": True}):
        STARTS.clear()
        st = StagedTask().build(StagedTask().load_model(tmp_path), w, dict(progress))
        assert [(k, resumed) for k, resumed, _ in STARTS] == [(1, True)]
        assert st.progress["stage"] == 1 and "fit" not in st.progress and st.epochs == 3
