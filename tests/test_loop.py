"""The one training loop (``raycl.training.loop``), in-process with a local session (``raycl.testing.session``):
the order of things (device before optimizer), gradient accumulation (N batches of B = one of N·B, GEC's token
normalisation exact), precision (bf16 and fp32 losses agree; the losses that must stay fp32 do), checkpoint and
resume (a run killed at a report ends where an uninterrupted one does), and the GPU bugs' CPU-visible halves:
collective tensors on the backend's device, miners on a GPU only when Ray reserved one."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from test_data_parallel import EXAMPLES, NEGATIVES
from torch import nn

import raycl
from raycl.collectives import collective_device
from raycl.config.tasks.gec import GecConfig
from raycl.losses.gec_margin import GecContrastiveLoss
from raycl.losses.infonce_queue import InfoNCEQueueLoss
from raycl.models.seq2seq import Seq2SeqScorer
from raycl.models.tokenizer import train_bpe_tokenizer
from raycl.recipes.gec.step import collate, gec_loss
from raycl.recipes.gec.worker import GecState, GecTask
from raycl.records import read_history
from raycl.testing.gec_batches import positives
from raycl.testing.session import LocalSession
from raycl.training import loop
from raycl.training.precision import Precision
from raycl.training.state import restore_rng, rng_state
from raycl.training.task import (
    Batch,
    Epoch,
    Job,
    Keep,
    LoopSettings,
    Report,
    StepContext,
    TaskBase,
    TrainState,
    Worker,
    updates_in,
)
from raycl.training.timing import Window


# ---------------------------------------------------------------------------------------------- a toy task
class Linear(nn.Linear):
    def save_pretrained(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), folder / "w.pt")


LOG: list[str] = []
X = torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
Y = X @ torch.tensor([1.0, -2.0, 0.5]) + 0.3


@dataclasses.dataclass(frozen=True)
class ToyTask(TaskBase):
    """Least squares over 8 rows in batches of ``batch``; a report (and checkpoint) after every epoch."""

    settings: LoopSettings = LoopSettings()
    batch: int = 2
    epochs: int = 2

    def load_model(self, path: Path) -> nn.Module:
        torch.manual_seed(0)
        model = Linear(3, 1)
        if (path / "w.pt").exists():
            model.load_state_dict(torch.load(path / "w.pt"))
        real_to = model.to

        def to(*args: Any, **kwargs: Any) -> Any:
            LOG.append("to")
            return real_to(*args, **kwargs)

        model.to = to  # type: ignore[method-assign]
        return model

    def build(self, model: nn.Module, w: Worker, progress: dict[str, Any] | None) -> TrainState:
        LOG.append("build")
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        total = updates_in([len(X) // self.batch] * self.epochs, self.settings.update_freq)
        return TrainState(model, [opt], [None], dict(progress or {}), total_updates=total, epochs=self.epochs)

    def epoch(self, st: TrainState, w: Worker, epoch: int, start: int) -> Epoch:
        rows = [slice(i, i + self.batch) for i in range(0, len(X), self.batch)]
        return Epoch([Batch(r) for r in rows[start:]])

    def collate(self, st: TrainState, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        return X[rows], Y[rows]  # on the CPU: the loop puts them on the worker's device

    def step(self, st: TrainState, data: tuple[torch.Tensor, torch.Tensor], ctx: StepContext) -> dict[str, Any]:
        x, y = data
        pred = ctx.module(x).squeeze(-1)  # (b,)
        loss = ((pred - y) ** 2).mean()
        ctx.backward(loss, weight=float(len(y)))
        return {"loss": loss.detach()}

    def metrics(self, st: TrainState, window: Window, rep: Report, w: Worker) -> dict[str, Any]:
        return {"loss": window.means().get("loss"), "epoch": st.progress["epoch"]}

    def evaluate(self, st: TrainState, rep: Report, w: Worker) -> dict[str, Any]:
        x, y = X.to(w.device), Y.to(w.device)
        return {"dev": -float(((st.model(x).squeeze(-1) - y) ** 2).mean())}

    def keep(self, rep: Report, metrics: dict[str, Any]) -> Keep | None:
        return Keep("dev", "best_model")


def _run(task: Any, out: Path, fake: LocalSession) -> None:
    loop.run(Job(task, init_model=str(out / "none"), out_dir=str(out), session=fake))


def test_the_model_is_on_its_device_before_the_optimizer_is_built(tmp_path: Path) -> None:
    fake = LocalSession(tmp_path)
    LOG.clear()
    _run(ToyTask(epochs=1), tmp_path / "a", fake)
    assert LOG[:2] == ["to", "build"]
    fake.crash_after = None
    LOG.clear()
    _run(ToyTask(epochs=2), tmp_path / "a", fake)  # a restart: from the checkpoint, the same order
    assert LOG[:2] == ["to", "build"]


def test_a_run_killed_after_a_report_resumes_to_the_same_end(tmp_path: Path) -> None:
    whole = LocalSession(tmp_path / "w")
    _run(ToyTask(epochs=3), tmp_path / "whole", whole)
    broken = LocalSession(tmp_path / "b")
    broken.crash_after = 2
    with pytest.raises(SystemExit):
        _run(ToyTask(epochs=3), tmp_path / "broken", broken)
    broken.crash_after = None
    _run(ToyTask(epochs=3), tmp_path / "broken", broken)  # resumes from the report-2 checkpoint
    assert [h["report"] for h in read_history(tmp_path / "broken")] == [1, 2, 3]
    assert [h["step"] for h in read_history(tmp_path / "broken")] == [4, 8, 12]
    a = torch.load(tmp_path / "whole" / "best_model" / "w.pt")
    b = torch.load(tmp_path / "broken" / "best_model" / "w.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)  # optimizer moments and RNG restored: the same weights


def test_a_process_first_report_says_what_its_start_cost(tmp_path: Path, monkeypatch) -> None:
    """``timing/start`` (``run``'s entry to the first step), ``timing/first_step`` and ``timing/worker_boot`` in
    each worker process's first report only — again after a restart, whose start-up is paid again — and the
    first step's time is the first step's, not the whole first interval's."""
    import time as clock

    fake = LocalSession(tmp_path)
    build = ToyTask.build

    def slow_build(self: Any, *a: Any, **k: Any) -> Any:
        clock.sleep(0.5)  # a start-up that costs something measurable
        return build(self, *a, **k)

    monkeypatch.setattr(ToyTask, "build", slow_build)
    fake.crash_after = 2
    with pytest.raises(SystemExit):
        _run(ToyTask(epochs=3), tmp_path / "r", fake)
    fake.crash_after = None
    _run(ToyTask(epochs=3), tmp_path / "r", fake)
    rows = read_history(tmp_path / "r")
    keys = ("timing/start", "timing/first_step", "timing/worker_boot")
    assert [h["report"] for h in rows] == [1, 2, 3]
    firsts = [h for h in rows if "timing/start" in h]
    assert [h["report"] for h in firsts] == [1, 3]  # the first process's first report, the restarted one's
    for h in firsts:
        assert all(k in h for k in keys), h
        assert h["timing/start"] >= 0.5 and 0 < h["timing/first_step"] < h["timing/start"]  # the build apart
        assert h["timing/worker_boot"] > 0
    assert not any(k in h for h in rows if h not in firsts for k in keys)


def test_accumulating_two_batches_is_one_batch_twice_the_size(tmp_path: Path) -> None:
    results = []
    for batch, freq in ((4, 1), (2, 2)):
        fake = LocalSession(tmp_path / f"{batch}")
        task = ToyTask(settings=LoopSettings(update_freq=freq), batch=batch, epochs=2)
        _run(task, tmp_path / f"run{batch}", fake)
        results.append(torch.load(tmp_path / f"run{batch}" / "best_model" / "w.pt"))
        assert [r["step"] for r in fake.reports] == [2, 4]
    for k in results[0]:
        torch.testing.assert_close(results[1][k], results[0][k], rtol=1e-6, atol=1e-7)


@dataclasses.dataclass(frozen=True)
class ScriptedDev(ToyTask):
    """The toy task whose dev score is a script, one value an epoch (None: undefined); each evaluated model's
    weights are recorded, so the kept one is known without relying on how a tiny model happens to score."""

    script: tuple[float | None, ...] = ()
    seen: list[dict[str, torch.Tensor]] = dataclasses.field(default_factory=list)

    def evaluate(self, st: TrainState, rep: Report, w: Worker) -> dict[str, Any]:
        self.seen.append({k: v.detach().clone() for k, v in st.model.state_dict().items()})
        return {"dev": self.script[len(self.seen) - 1]}


# the reports that keep their model: the first, then each that beats the best so far (an undefined score never
# does; ties keep the earlier), written out by hand
@pytest.mark.parametrize(
    ("script", "flags"),
    [
        ((0.1, 0.5, 0.5, 0.2), (1, 1, None, None)),
        ((None, 0.3, 0.2, 0.4), (1, 1, None, 1)),
        ((0.3, None, 0.2, 0.3), (1, None, None, None)),
        ((-1.0, -2.0, -0.5, -0.5), (1, None, 1, None)),
    ],
)
def test_the_best_epoch_is_the_first_with_the_highest_dev_score(
    tmp_path: Path, script: tuple, flags: tuple
) -> None:
    fake = LocalSession(tmp_path)
    task = ScriptedDev(epochs=4, script=script)
    _run(task, tmp_path / "run", fake)
    assert [r.get("kept") for r in fake.reports] == list(flags)
    weights = [seen["weight"] for seen in task.seen]
    assert len(weights) == 4 and all(not torch.equal(weights[i], weights[j]) for i in range(4) for j in range(i))
    kept = max(i for i, f in enumerate(flags) if f)
    best = torch.load(tmp_path / "run" / "best_model" / "w.pt")
    assert all(torch.equal(best[k], task.seen[kept][k]) for k in best), f"kept another epoch than {kept + 1}"


# ---------------------------------------------------------------------------------------------- GEC's step
def _scorer(tmp: Path) -> Seq2SeqScorer:
    from transformers import BartConfig, BartForConditionalGeneration

    texts = [t for e in EXAMPLES for t in (e.source, e.target)] + [n for ns in NEGATIVES for n in ns]
    tok = train_bpe_tokenizer(texts * 3, tmp / "tok", vocab_size=300)
    torch.manual_seed(0)
    config = BartConfig(
        vocab_size=len(tok),
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        dropout=0.0,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
    )
    return Seq2SeqScorer(BartForConditionalGeneration(config).eval(), tok)


def _gec_grads(tmp: Path, batches: list[list[int]], freq: int, **optim: Any) -> dict[str, torch.Tensor]:
    """The gradient the loop's update sees (after the division by the global token count) for ``batches``."""
    cfg = dataclasses.replace(
        GecConfig(), optim=dataclasses.replace(GecConfig().optim, update_freq=freq, clip_norm=0.0, **optim)
    )
    seen: dict[str, torch.Tensor] = {}

    class Capture(GecTask):
        def before_update(self, st: Any) -> None:
            seen.update({n: p.grad.clone() for n, p in st.model.named_parameters() if p.grad is not None})

        def after_update(self, st: Any) -> None:
            pass  # no feed here

    scorer = _scorer(tmp)
    opt = torch.optim.SGD(scorer.parameters(), lr=0.0)
    st = GecState(
        scorer, [opt], [None], {}, loss_fn=GecContrastiveLoss(margin=5.0, trade_off=0.5, label_smoothing=0.1)
    )
    w = Worker(0, 1, torch.device("cpu"), Precision("fp32", torch.device("cpu")), tmp, Job(None, "", ""))
    task = Capture(cfg, "finetune")
    runner = loop.Loop(task, st, w)
    runner.compile()  # optim.compile: what the loop does at an epoch's start
    for rows in batches:
        runner.micro_batch(Batch(task.collate(st, ([EXAMPLES[i] for i in rows], [NEGATIVES[i] for i in rows]))))
    runner.flush()
    return seen


def test_gec_update_freq_two_equals_one_batch_of_twice_the_size(tmp_path: Path) -> None:
    """fairseq's normalisation stays exact: the two halves hold different token counts."""
    whole = _gec_grads(tmp_path, [[0, 1, 2, 3]], freq=1)
    halves = _gec_grads(tmp_path, [[0, 1], [2, 3]], freq=2)
    assert whole.keys() == halves.keys() and len(whole) > 10
    for n, g in whole.items():
        torch.testing.assert_close(halves[n], g, rtol=1e-4, atol=1e-6, msg=n)


def test_a_compiled_step_equals_the_eager_one(tmp_path: Path) -> None:
    """``optim.compile``: the GEC step's model runs through torch.compile (graphs captured: the recording backend
    saw them) and the update's gradients equal eager ones. The backend traces (dynamo + AOT autograd) without
    generating code, which a CPU test can afford; inductor is the default on GPUs. The model's forward is one
    graph per shape, with no graph break: under ``compile_mode: reduce-overhead`` each graph is one CUDA graph
    replayed, while a break (a host read, an unsupported call) would leave the pieces launched from Python."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    graphs: list[Any] = []

    @torch._dynamo.register_backend(name="raycl_test_recording")  # type: ignore[misc]
    def recording(gm: Any, example_inputs: Any) -> Any:
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    eager = _gec_grads(tmp_path, [[0, 1, 2, 3], [1, 2]], freq=2)
    torch._dynamo.reset()
    counters.clear()
    compiled = _gec_grads(
        tmp_path, [[0, 1, 2, 3], [1, 2]], freq=2, compile=True, compile_backend="raycl_test_recording"
    )
    assert graphs, "nothing went through torch.compile"
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert len(graphs) <= 2, len(graphs)  # the two batches' shapes (lengths padded to multiples of 8), no more
    assert compiled.keys() == eager.keys() and len(eager) > 10  # the state dict keeps its names
    for n, g in eager.items():
        torch.testing.assert_close(compiled[n], g, rtol=1e-4, atol=1e-6, msg=n)


def test_bf16_and_fp32_gec_losses_agree_and_stay_fp32(tmp_path: Path) -> None:
    scorer = _scorer(tmp_path)
    batch = collate(EXAMPLES, NEGATIVES, scorer.tokenizer, max_length=32)
    loss_fn = GecContrastiveLoss(margin=1.0, trade_off=0.5, label_smoothing=0.1)
    fp32 = gec_loss(scorer, batch, loss_fn)
    with Precision("bf16", torch.device("cpu")).autocast():
        src_ids, src_mask, target_ids = positives(batch)
        lprobs = scorer.log_probs(src_ids, src_mask, scorer.shift_right(target_ids), target_ids)
        bf16 = gec_loss(scorer, batch, loss_fn)
    assert lprobs.dtype == torch.float32 and bf16.loss.dtype == torch.float32  # log-softmax sums in fp32
    torch.testing.assert_close(bf16.loss, fp32.loss, rtol=3e-2, atol=1e-2)
    assert not torch.equal(bf16.loss, fp32.loss)  # the autocast did run the matmuls in bf16


def test_infonce_logits_stay_fp32_under_autocast() -> None:
    h, h_pos, queue = torch.randn(4, 8), torch.randn(4, 8), torch.randn(5, 8)
    fp32 = InfoNCEQueueLoss(temperature=0.05)(h, h_pos, queue)
    with Precision("bf16", torch.device("cpu")).autocast():
        bf16 = InfoNCEQueueLoss(temperature=0.05)(h.bfloat16(), h_pos.bfloat16(), queue)
    assert bf16.logits.dtype == torch.float32
    torch.testing.assert_close(bf16.loss, fp32.loss, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_toy_run_trains_at_low_precision(tmp_path: Path, precision: str) -> None:
    losses = {}
    for p in ("fp32", precision):
        fake = LocalSession(tmp_path / p)
        _run(ToyTask(settings=LoopSettings(precision=p), epochs=3), tmp_path / f"run-{p}", fake)
        losses[p] = [r["loss"] for r in fake.reports]
    assert losses[precision][-1] < losses[precision][0]  # it learns
    if precision == "bf16":  # fp16's scaler skips its first steps (the initial scale 2^16 overflows)
        assert losses[precision] == pytest.approx(losses["fp32"], rel=0.1, abs=0.05)


# ---------------------------------------------------------------------------------------------- the GPU bugs
COLLECTIVES = {
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "all_gather_into_tensor",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "gather",
    "gather_object",
    "all_to_all",
    "send",
    "recv",
    "barrier",
}


def _collective_calls(tree: ast.AST) -> list[ast.Call]:
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    return [
        c
        for c in calls
        if isinstance(c.func, ast.Attribute)
        and c.func.attr in COLLECTIVES
        and ast.unparse(c.func.value) in ("dist", "torch.distributed")
    ]


def _on_backend_device(name: str, assigned: dict[str, str], seen: frozenset[str] = frozenset()) -> bool:
    """``name`` is built with ``device=`` (or ``.to(``) a name bound to ``collective_device(...)``, or as
    ``empty_like`` of such a tensor."""
    devices = [n for n, src in assigned.items() if src.startswith("collective_device(")]
    src = assigned.get(name, "")
    if "device=collective_device(" in src or any(f"device={d}" in src or f".to({d})" in src for d in devices):
        return True
    like = re.findall(r"empty_like\((\w+)\)", src)
    return bool(like) and all(n not in seen and _on_backend_device(n, assigned, seen | {name}) for n in like)


def test_collectives_use_the_backends_device() -> None:
    """NCCL accepts CUDA tensors only: a token count all-reduced under NCCL must be built on the GPU. On a CPU
    machine every tensor is on the CPU, so what runs cannot show a collective handed a CPU tensor under NCCL; what
    can be checked is the code: every collective raycl makes is in ``raycl/collectives.py``, and each tensor it
    hands one is built on ``collective_device(backend)`` (``device=device`` or ``.to(device)``), or is
    ``empty_like`` such a tensor. A collective anywhere else, or one handed a tensor built without that device,
    fails here."""
    assert collective_device("nccl").type == "cuda"
    assert collective_device("gloo") == torch.device("cpu")
    root = Path(raycl.__file__).parent
    home = root / "collectives.py"
    outside = [
        f"{path.relative_to(root)}:{c.lineno} {ast.unparse(c.func)}"
        for path in sorted(root.rglob("*.py"))
        if path != home
        for c in _collective_calls(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert outside == [], f"collectives outside raycl/collectives.py: {outside}"
    checked = 0
    for fn in (n for n in ast.walk(ast.parse(home.read_text(encoding="utf-8"))) if isinstance(n, ast.FunctionDef)):
        assigned = {
            t.id: ast.unparse(n.value)
            for n in ast.walk(fn)
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for call in _collective_calls(fn):
            for arg in call.args:
                assert isinstance(arg, ast.Name), f"{fn.name}: {ast.unparse(call)}"
                assert _on_backend_device(arg.id, assigned), f"{fn.name}: {arg.id} = {assigned.get(arg.id)}"
                checked += 1
    assert checked >= 5  # sum_gradients (2), all_reduce_sum, _all_reduced, broadcast_int, all_gather_floats


class _Devices:
    """The CUDA RNG API of a process that sees ``count`` devices, each with its own generator state (the CPU half
    of issue 18 b: the real thing is ``test_gpu_checkpoint_holds_this_workers_own_cuda_rng``)."""

    def __init__(self, count: int, seed: int) -> None:
        self.states = [torch.tensor([seed + i], dtype=torch.uint8) for i in range(count)]

    def _index(self, device: Any = "cuda") -> int:
        index = torch.device(device).index or 0 if not isinstance(device, int) else device
        if index >= len(self.states):
            raise RuntimeError(f"CUDA error: invalid device ordinal {index}")
        return index

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(self.states))
        monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": self.states[self._index(device)])
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: list(self.states))
        monkeypatch.setattr(
            torch.cuda,
            "set_rng_state",
            lambda state, device="cuda": self.states.__setitem__(self._index(device), state),
        )
        monkeypatch.setattr(
            torch.cuda,
            "set_rng_state_all",
            lambda states: [torch.cuda.set_rng_state(t, i) for i, t in enumerate(states)],
        )


def test_a_worker_restores_its_own_devices_rng_where_it_sees_fewer_devices(monkeypatch) -> None:
    """Rank 0 saw two devices and trained on cuda:1; after the restart its worker sees one device (cuda:0, Ray's
    CUDA_VISIBLE_DEVICES). The checkpoint must hold that device's state alone, and restore it on the new one."""
    before = _Devices(2, seed=10)
    before.install(monkeypatch)
    saved = rng_state(torch.device("cuda", 1))
    assert torch.equal(saved["cuda"], torch.tensor([11], dtype=torch.uint8))  # cuda:1's, not a list of both
    after = _Devices(1, seed=50)
    after.install(monkeypatch)
    restore_rng(saved, torch.device("cuda", 0))
    assert torch.equal(after.states[0], torch.tensor([11], dtype=torch.uint8))


def test_a_miner_without_a_gpu_share_stays_on_the_cpu(monkeypatch) -> None:
    """``mining.gpus_per_miner=0`` on a machine with a GPU: the miner must not take cuda:0 under a trainer."""
    from raycl.distributed.miner_pool import MinerFactory
    from raycl.miners.registry import miner_device, register_miner

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    kind = register_miner("record-options", build=lambda path, opts: dict(opts), load=lambda m, sd: None)
    assert MinerFactory(kind, "", {"k": 1}).build()["device"] == "cpu"  # no Ray GPU ids in this process
    assert miner_device([]) == "cpu" and miner_device(["0"]) == "cuda"


def test_unknown_settings_are_refused_with_the_key() -> None:
    from raycl.config.tasks import load_space
    from raycl.errors import UserError

    with pytest.raises(UserError, match="optim.precision"):
        load_space("gec_pd", preset="smoke", overrides=["optim.precision=fp8"])
    with pytest.raises(UserError, match="optim.update_freq"):
        load_space("gec_pd", preset="smoke", overrides=["optim.update_freq=0"])
    with pytest.raises(UserError, match="mining.precision"):
        load_space("gec_pd", preset="smoke", overrides=["mining.precision=int4"])


# ---------------------------------------------------------------------------------------------- on a GPU
def test_no_gpu_asked_stays_on_the_cpu_where_ray_would_hand_one_out(tmp_path: Path, monkeypatch) -> None:
    """``scaling.num_workers=0`` (Ray's local mode) with ``use_gpu=false`` on a machine with a GPU: Ray's device
    is the GPU, the run must stay on the CPU (a "meta" device stands in for the GPU here)."""
    from raycl import driver

    fake = LocalSession(tmp_path, torch.device("meta"))
    job = Job(ToyTask(epochs=1), init_model=str(tmp_path / "none"), out_dir=str(tmp_path / "a"), use_gpu=False)
    loop.run(dataclasses.replace(job, session=fake))
    assert fake.reports and fake.reports[-1]["loss"] == fake.reports[-1]["loss"]  # trained: a number, not NaN
    jobs: list[Job] = []
    monkeypatch.setattr(driver, "fit", lambda fn, **kw: jobs.append(fn.args[0]))
    cfg = dataclasses.replace(GecConfig(), scaling=dataclasses.replace(GecConfig().scaling, use_gpu=False))
    run = driver.Run(cfg, tmp_path, tmp_path / "base", [], {})
    driver.fit_job(run, cfg, Job(None, "", ""), name="n", in_tune=False)
    assert jobs[0].use_gpu is False  # the driver passes the config's choice into the job


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@gpu
def test_gpu_checkpoint_holds_this_workers_own_cuda_rng(tmp_path: Path) -> None:
    """A checkpoint holds the RNG state of the worker's own device (not every device rank 0 sees: a worker that
    sees fewer devices could not restore that list), and a restart continues that device's random stream."""
    fake = LocalSession(tmp_path, torch.device("cuda", 0))
    _run(ToyTask(epochs=1), tmp_path / "a", fake)
    assert fake.ckpt is not None
    state = torch.load(fake.ckpt / "state.pt", weights_only=False)
    assert isinstance(state["rng"]["cuda"], torch.Tensor)  # one device's state, not a list of every device's
    torch.cuda.set_rng_state(state["rng"]["cuda"], 0)
    expected = torch.rand(3, device="cuda:0")  # what the run would have drawn next
    _run(ToyTask(epochs=2), tmp_path / "a", fake)  # restores that state on this worker's device, trains one epoch
    torch.cuda.set_rng_state(state["rng"]["cuda"], 0)
    assert torch.equal(torch.rand(3, device="cuda:0"), expected)


@pytest.mark.gpu
@gpu
def test_gpu_restart_puts_the_optimizer_state_on_the_gpu(tmp_path: Path, monkeypatch) -> None:
    fake = LocalSession(tmp_path, torch.device("cuda"))
    _run(ToyTask(epochs=1), tmp_path / "a", fake)
    states: list[Any] = []
    real_build = ToyTask.build

    def build(self: Any, model: nn.Module, w: Worker, progress: Any) -> TrainState:
        st = real_build(self, model, w, progress)
        states.append(st)
        return st

    monkeypatch.setattr(ToyTask, "build", build)
    _run(ToyTask(epochs=2), tmp_path / "a", fake)  # resumed from the epoch-1 checkpoint: one more epoch on cuda
    moments = [t for s in states[0].optimizers[0].state.values() for t in s.values() if torch.is_tensor(t)]
    assert moments and all(t.device.type == "cuda" for t in moments if t.dim() > 0)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_gpu_low_precision_run(tmp_path: Path, precision: str) -> None:
    fake = LocalSession(tmp_path, torch.device("cuda"))
    _run(ToyTask(settings=LoopSettings(precision=precision), epochs=3), tmp_path / "a", fake)
    assert fake.reports[-1]["loss"] < fake.reports[0]["loss"]


def test_adamw_is_fused_only_where_every_parameter_is_on_a_gpu() -> None:
    from raycl.training.optim import adamw

    cpu = adamw([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    assert cpu.defaults["fused"] is None  # PyTorch's own choice: the per-tensor path on a CPU
    if torch.cuda.is_available():
        both = adamw([torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2, device="cuda"))], lr=1)
        assert both.defaults["fused"] is None


@pytest.mark.gpu
@gpu
def test_gpu_adamw_is_fused_and_steps_like_the_unfused_one() -> None:
    from raycl.training.optim import adamw

    torch.manual_seed(0)
    w = torch.randn(5, 3, device="cuda")
    a, b = torch.nn.Parameter(w.clone()), torch.nn.Parameter(w.clone())
    fused, plain = adamw([a], lr=0.1, weight_decay=0.01), torch.optim.AdamW([b], lr=0.1, weight_decay=0.01)
    assert fused.defaults["fused"] is True
    for _ in range(3):
        for p, opt in ((a, fused), (b, plain)):
            p.grad = torch.ones_like(p) * p.detach().sum()
            opt.step()
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@gpu
def test_gpu_nccl_all_reduce_of_a_count(tmp_path: Path) -> None:
    import os

    import torch.distributed as dist

    from raycl.collectives import all_reduce_sum

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29611")
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        assert all_reduce_sum(3.0) == 3.0
        t = torch.ones(2, device="cuda")
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0]
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@gpu
def test_gpu_miner_with_a_gpu_share_uses_it(monkeypatch) -> None:
    import ray

    from raycl.distributed.miner_pool import MinerFactory
    from raycl.miners.registry import register_miner

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: ["0"])
    kind = register_miner("record-options-gpu", build=lambda path, opts: dict(opts), load=lambda m, sd: None)
    assert MinerFactory(kind, "", {}).build()["device"] == "cuda"


# ---------------------------------------------------------------------------------------------- token budgets
def test_token_batches_keep_fairseqs_budget_over_the_whole_target_line(tmp_path: Path) -> None:
    import random

    from raycl.training.batching import token_batches

    scorer = _scorer(tmp_path)
    st = GecState(scorer, [], [], {})
    sizes = {ex.id: st.num_tokens(ex, negs) for ex, negs in zip(EXAMPLES, NEGATIVES, strict=True)}
    tok = scorer.tokenizer
    for ex, negs in zip(EXAMPLES, NEGATIVES, strict=True):  # max(source, target + every negative), in tokens
        line = sum(len(tok(t)["input_ids"]) for t in [ex.target, *negs])
        assert sizes[ex.id] == max(len(tok(ex.source)["input_ids"]), line)
    assert sizes["d"] > sizes["c"]  # two negatives weigh on the budget
    budget = 2 * max(sizes.values())
    batches = token_batches((EXAMPLES, NEGATIVES), max_tokens=budget, size=st.num_tokens, rng=random.Random(0))
    seen = [ex.id for b, _ in batches for ex in b]
    assert sorted(seen) == sorted(sizes) and len(batches) >= 2
    for b, negs in batches:
        assert len(b) == 1 or len(b) * max(sizes[ex.id] for ex in b) <= budget
        assert all(NEGATIVES[EXAMPLES.index(ex)] == n for ex, n in zip(b, negs, strict=True))
    one = token_batches((EXAMPLES, NEGATIVES), max_tokens=1, size=st.num_tokens, rng=random.Random(0))
    assert [len(b) for b, _ in one] == [1, 1, 1, 1]  # a sentence over the budget is a batch of its own


def test_the_paper_presets_batch_by_tokens() -> None:
    from raycl.config.tasks import load_space

    pd, bart = load_space("gec_pd").config, load_space("gec_bart").config
    assert (pd.optim.max_tokens, pd.optim.update_freq) == (4096, 1)
    assert (bart.optim.max_tokens, bart.optim.update_freq, bart.scaling.num_workers) == (1400, 4, 4)
    assert load_space("gec_pd", preset="smoke").config.optim.max_tokens == 0  # the demo keeps sentence batches


@dataclasses.dataclass(frozen=True)
class EveryThreeTask(ToyTask):
    """ToyTask with a report every 3 updates of each epoch (4 updates an epoch: 3 does not divide it)."""

    def epoch(self, st: TrainState, w: Worker, epoch: int, start: int) -> Epoch:
        return dataclasses.replace(super().epoch(st, w, epoch, start), eval_every=3)


def test_reports_fall_every_n_updates_of_each_epoch_and_at_its_end(tmp_path: Path) -> None:
    """``eval_every`` counts the epoch's own updates (the papers' code validates every N updates of an epoch):
    epochs of 4 updates report at 3 and 4, then at 4 + 3 = 7 and 8 — not at the 6th update, as a count over the
    whole run would."""
    fake = LocalSession(tmp_path / "s")
    _run(EveryThreeTask(epochs=2), tmp_path / "run", fake)
    assert [r["step"] for r in fake.reports] == [3, 4, 7, 8]


def test_an_intervals_sums_do_not_alias_a_steps_output() -> None:
    """Under CUDA graphs (``compile_mode: reduce-overhead``) a step's outputs live in buffers the next step's
    replay overwrites: the report interval keeps copies, so what it reads is what the steps returned."""
    window = Window()
    out = torch.tensor(2.0)
    window.add({"loss": out, "n": 1.0}, 0.0)
    out.fill_(100.0)  # the next replay writes the same memory
    window.add({"loss": torch.tensor(3.0), "n": 1.0}, 0.0)
    assert window.sums == {"loss": 5.0, "n": 2.0}


def test_an_intervals_ratios_divide_one_outputs_sum_by_anothers() -> None:
    """``TaskBase.ratios``: a loss per token is the interval's summed losses ÷ its tokens (not the mean of the
    batches' per-token losses); the plain means are per batch; no batch yet, no ratio."""
    window = Window()
    assert window.means({"loss": ("loss_sum", "ntokens")}) == {}
    window.add({"loss_sum": torch.tensor(6.0), "ntokens": 2.0}, 0.0)
    window.add({"loss_sum": torch.tensor(4.0), "ntokens": 8.0}, 0.0)
    assert window.means({"loss": ("loss_sum", "ntokens"), "per_batch": ("ntokens", "missing")}) == {
        "loss": 1.0,  # (6 + 4) / (2 + 8); the batches' own ratios, 3 and 0.5, would average 1.75
        "per_batch": 10.0,  # a missing denominator counts as 1
    }
    assert window.means() == {"loss_sum": 5.0, "ntokens": 5.0}


def test_a_micro_batch_under_cuda_graphs_marks_a_new_step(tmp_path: Path, monkeypatch) -> None:
    """``compile_mode: reduce-overhead`` on a CUDA device: each micro-batch tells CUDA graph trees that a new
    iteration begins (a step with several forwards — FGM's, the momentum encoder's — would otherwise leave it to
    their heuristic); nothing is marked on a CPU or in another mode. (The worker's device is only named here:
    the toy step runs on the CPU.)"""
    marks: list[str] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append("mark"))
    task = ToyTask()
    cpu = torch.device("cpu")
    cases = (("cpu", "reduce-overhead", 0), ("cuda", "default", 0), ("cuda", "reduce-overhead", 3))
    for device, mode, want in cases:
        st = task.build(task.load_model(tmp_path / "none"), None, None)  # type: ignore[arg-type]
        w = Worker(0, 1, torch.device(device), Precision("fp32", cpu), tmp_path, Job(None, "", ""))
        runner = loop.Loop(task, st, w)
        runner.s = dataclasses.replace(runner.s, compile=True, compile_mode=mode)
        marks.clear()
        for rows in (slice(0, 2), slice(2, 4), slice(4, 6)):
            runner.micro_batch(Batch(task.collate(st, rows)))
        assert len(marks) == want, (device, mode)
