"""Every recipe's real step as the loop runs it — the task's ``collate`` on the CPU, the batch moved to the
worker's device, the task's ``step`` and its update hooks there — held to what a GPU needs of it:

- **no host–device sync**: counted by a dispatch mode (:mod:`raycl.training.counting`) around the step, the
  gradient averaging and the task's update hooks (EMA, momentum encoder, MoCo keys): none of raycl's own in any
  recipe, none at all in the encoder recipes (masks go to the models in their attention's form), and in GEC's only
  Hugging Face's check of BART's causal decoder mask (≤ 2). A ``.item()`` planted back in a step fails here.
- **nothing left on the CPU**: the same step with the worker's device set to ``meta`` (a device that holds shapes
  only): a tensor a step builds on the CPU and mixes with the model's fails with "not on the expected device", and
  a read of a device value fails too. Hugging Face's own two "can the mask be skipped?" checks read the device and
  are turned off for it (they build the mask instead), as they are not raycl's.

The runs are the recipes' smallest (tests/conftest.py's tiny GEC, the smoke presets), built once per module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_equivalence import COHERENCE, GEC, _cfg, _prepare

from raycl.collectives import average_gradients
from raycl.data.gec import load_examples
from raycl.miners.beam_search import write_negatives_parquet
from raycl.miners.records import MinedNegatives
from raycl.recipes.coherence.recipe import train_items
from raycl.recipes.coherence.worker import CoherenceTask
from raycl.recipes.gec.worker import GecTask
from raycl.recipes.idiom.worker import IdiomTask
from raycl.recipes.sts.worker import StsTask
from raycl.testing.session import LocalSession
from raycl.training import loop
from raycl.training.counting import count_ops
from raycl.training.precision import Precision
from raycl.training.prefetch import to_device
from raycl.training.task import Batch, Job, StepContext, Worker

RECIPES = ("gec", "idiom", "sts", "coherence")


def _gec(tmp: Path) -> tuple[Any, Any]:
    run = _prepare("gec_pd", [*GEC, "data.builtin.n_finetune=24"], tmp, dropout=True)
    examples = load_examples(run.cfg.data.finetune, annotator=run.cfg.data.annotator)
    mined = [
        MinedNegatives(ex.id, (ex.source, f"{ex.target} .", f"{ex.source} !"), (0.0, 0.0, 0.0)) for ex in examples
    ]
    negatives = write_negatives_parquet(tmp / "negatives.parquet", examples, mined, model_version=0)
    over = ["optim.batch_size=8", "optim.max_tokens=0", f"mining.negatives={negatives}"]
    return run, GecTask(_cfg(run, over), "finetune")


def _idiom(tmp: Path) -> tuple[Any, Any]:
    run = _prepare("idiom", ["data.setting=zero_shot", "adversarial.method=fgm"], tmp, dropout=True)
    return run, IdiomTask(_cfg(run, ["optim.batch_size=8"]))


def _sts(tmp: Path) -> tuple[Any, Any]:
    over = [
        "pretrain.epochs=1",
        "finetune.epochs=0",
        "loss.lam=0.5",
        "loss.joint=sum",
        "moco.queue_size=12",
        "optim.batch_size=8",
    ]
    run = _prepare("sts", over, tmp, dropout=True)
    return run, StsTask(_cfg(run, []))


def _coherence(tmp: Path) -> tuple[Any, Any]:
    over = [*COHERENCE, "loss.kind=momentum", "mining.hard_negatives=false", "optim.batch_size=2"]
    run = _prepare("coherence", over, tmp, dropout=True)
    return run, CoherenceTask(_cfg(run, []), str(train_items(run)))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Any]]:
    made = {"gec": _gec, "idiom": _idiom, "sts": _sts, "coherence": _coherence}
    return {name: make(tmp_path_factory.mktemp(name)) for name, make in made.items()}


@dataclasses.dataclass
class Stepper:
    """One recipe's state on ``device`` and its batches, collated and moved as the loop's prefetcher does."""

    task: Any
    st: Any
    device: torch.device
    batches: Iterator[Any]

    def next_batch(self) -> Any:
        batch = next(b for b in self.batches if isinstance(b, Batch))
        return to_device(self.task.collate(self.st, batch.data), self.device)

    def step(self, data: Any) -> dict[str, Any]:
        """The step, the update's gradient averaging and the task's hooks around the optimizer (not its step)."""
        ctx = StepContext(self.st.model, self.device, None)
        out = self.task.step(self.st, data, ctx)
        params = [p for g in self.st.optimizers[0].param_groups for p in g["params"]]
        average_gradients(params, ctx.weight)
        self.task.before_update(self.st)
        self.task.after_update(self.st)
        for opt in self.st.optimizers:
            opt.zero_grad(set_to_none=True)
        return out


def _stepper(run: Any, task: Any, device: torch.device, tmp: Path) -> Stepper:
    """The task's state as a worker builds it (its evaluators apart: ``start`` is not run)."""
    w = Worker(
        0,
        1,
        device,
        Precision("fp32", device),
        tmp,
        Job(task, str(run.base_model), str(tmp), session=LocalSession()),
    )
    model = task.load_model(Path(run.base_model)).to(device)
    st = task.build(model, w, None)
    loop.Loop(task, st, w)  # the loop's own keys of the state's progress (its step, …)
    st.train(True)
    return Stepper(task, st, device, iter(task.epoch(st, w, 0, 0).batches))


def _raycls(c: Any) -> list[str]:
    return [f"{s.kind} at {s.site}" for s in c.sync_events if not s.site.startswith("transformers/")]


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_steady_step_waits_for_no_device_value(recipe: str, prepared: dict[str, Any], tmp_path: Path) -> None:
    run, task = prepared[recipe]
    s = _stepper(run, task, torch.device("cpu"), tmp_path)
    s.step(s.next_batch())  # the first step: the queue fills, the optimizer's state is made
    data = s.next_batch()
    with count_ops() as c:
        out = s.step(data)
    assert _raycls(c) == [], f"{recipe}: syncs of raycl's own in its step"
    every = [f"{e.kind} at {e.site}" for e in c.sync_events]  # Hugging Face's: the decoder's causal-mask check
    assert len(every) <= (2 if recipe == "gec" else 0), f"{recipe}: Hugging Face's syncs {every}"
    assert all(isinstance(v, (torch.Tensor, float)) for v in out.values())  # numbers stay where they are made
    assert c.ops > 0


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_step_on_another_device_leaves_nothing_on_the_cpu(
    recipe: str, prepared: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers.masking_utils as masks

    monkeypatch.setattr(masks, "_ignore_causal_mask_sdpa", lambda *a, **k: False)
    monkeypatch.setattr(masks, "_ignore_bidirectional_mask_sdpa", lambda *a, **k: False)
    run, task = prepared[recipe]
    meta = torch.device("meta")
    s = _stepper(run, task, meta, tmp_path)
    for _ in range(2):  # the second step: a queue holds the first's keys
        data = s.next_batch()
        assert all(t.device == meta for t in _tensors(data)), f"{recipe}: the batch is not on the device"
        out = s.step(data)
        assert all(v.device == meta for v in out.values() if isinstance(v, torch.Tensor))


def _tensors(obj: Any) -> list[torch.Tensor]:
    from raycl.training.prefetch import move

    found: list[torch.Tensor] = []
    move(obj, lambda t: found.append(t) or t)
    return found


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_compiled_step_traces_whole_graphs(recipe: str, prepared: dict[str, Any], tmp_path: Path) -> None:
    """``optim.compile``: the modules a recipe compiles (``Task.compiled_modules``) trace, in its real step with
    dropout on, into whole graphs without a graph break (dynamo's own backend: traced, not code-generated). Under
    ``compile_mode: reduce-overhead`` each graph is replayed as one CUDA graph; a break (a host read, a call dynamo
    cannot trace) would leave its pieces launched op by op from Python."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    run, task = prepared[recipe]
    s = _stepper(run, task, torch.device("cpu"), tmp_path)
    torch._dynamo.reset()
    counters.clear()
    modules = task.compiled_modules(s.st)  # coherence's momentum loss: the scorer and the momentum encoder
    for module in modules:
        module.compile(backend="eager")
    for _ in range(2):
        s.step(s.next_batch())
    assert len(modules) == (2 if recipe == "coherence" else 1)
    assert counters["stats"]["unique_graphs"] >= len(modules), f"{recipe}: a module's forward was not compiled"
    assert not counters["graph_break"], f"{recipe}: {dict(counters['graph_break'])}"
