"""The op/sync/cast counter (``raycl.training.counting``) on a CPU: each kind of host–device sync planted in a
small step is counted once, with the line that asked for it; arithmetic and its backward count none; autocast's
casts are counted, an integer cast is not; regions split the totals."""

from __future__ import annotations

import importlib.util
import inspect
import shutil
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from raycl.training import counting
from raycl.training.counting import count_ops

X = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def test_arithmetic_forward_and_backward_has_ops_and_no_sync() -> None:
    net = model()
    with count_ops() as c:
        with c.region("forward"):
            loss = nn.functional.cross_entropy(net(X), torch.tensor([0, 1, 2, 0, 1, 2]))
        with c.region("backward"):
            loss.backward()
    assert c.syncs == 0 and c.casts == 0
    fwd, bwd = c.regions["forward"], c.regions["backward"]
    assert fwd.ops >= 5 and bwd.ops >= 5  # addmm, relu, addmm, log_softmax, nll_loss …; their gradients
    assert fwd.ops + bwd.ops == c.ops
    assert c.by_op["addmm"] == 2 and c.by_op["mm"] >= 2  # two layers, and their weight gradients


def _line(fn) -> int:  # the line of the planted call inside ``fn`` (its one-line body)
    return inspect.getsourcelines(fn)[1]


PLANTED = {  # kind: a one-line step that asks the host for a device value once
    "item": lambda t: t.sum().item(),
    "int": lambda t: int(t.sum()),
    "float": lambda t: float(t.sum()),
    "bool": lambda t: bool(t.sum() > 0),
    "if": lambda t: 1 if t.max() > 0 else 0,
    "nonzero": lambda t: t.nonzero(),
    "mask": lambda t: t[t > 0],
    "masked_select": lambda t: t.masked_select(t > 0),
    "unique": lambda t: torch.unique(t.round()),
    "repeat_interleave": lambda t: torch.repeat_interleave(torch.tensor([1, 2])),
    "tolist": lambda t: t.tolist(),
    "numpy": lambda t: t.numpy(),
    "cpu": lambda t: t.cpu(),
    "to_cpu": lambda t: t.to("cpu"),
}
KIND = {"int": "item", "float": "item", "bool": "item", "if": "item", "mask": "index_bool", "to_cpu": "cpu"}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_each_planted_sync_is_counted_once_with_its_line(name: str) -> None:
    step = PLANTED[name]
    with count_ops() as c:
        step(X)
    assert c.syncs == 1, c.sync_kinds
    (event,) = c.sync_events
    assert event.kind == KIND.get(name, name)
    assert event.site.startswith(f"tests/test_counting.py:{_line(step)} in ")


@pytest.mark.parametrize(
    "checkout", ["raycl", "a folder with spaces/raycl", "a/b/c/d/e/f/g/raycl-main", "torch/raycl", "tests"]
)
def test_a_site_is_shown_from_the_checkout_whatever_its_folder_is_called(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checkout: str
) -> None:
    """The counter as a checkout in ``checkout`` holds it (a copy of the module, imported from there): a line of
    its tests and a file of its package are shown from the checkout's root — also when the checkout is called
    ``raycl`` (a path cut at its last ``/raycl/`` kept ``raycl/tests/…``) or lies in a folder named ``torch``
    (whose frames were skipped as torch's own)."""
    root = tmp_path / checkout
    copy = root / "raycl" / "training" / "counting.py"
    copy.parent.mkdir(parents=True)
    shutil.copy(counting.__file__, copy)
    spec = importlib.util.spec_from_file_location("_counting_in_a_checkout", copy)
    assert spec is not None and spec.loader is not None
    moved = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, moved)  # its dataclasses look their module up
    spec.loader.exec_module(moved)
    planted = root / "tests" / "test_planted.py"
    planted.parent.mkdir()
    planted.write_text(source := "def step(t):\n    return t.sum().item()\n", encoding="utf-8")
    scope: dict[str, object] = {}
    exec(compile(source, str(planted), "exec"), scope)
    with moved.count_ops() as c:
        scope["step"](X)  # type: ignore[operator]
    assert [e.site for e in c.sync_events] == ["tests/test_planted.py:2 in step"]
    assert moved._short(str(root / "raycl" / "training" / "loop.py")) == "raycl/training/loop.py"
    assert moved._short(torch.__file__) == "torch/__init__.py"  # the environment's site-packages


def test_moves_within_the_device_and_given_sizes_are_not_syncs() -> None:
    with count_ops() as c:
        X.to(X.device)  # library code moving a mask to its input's device: a no-op on every run
        X.to(torch.float64)
        torch.repeat_interleave(X, torch.tensor([1, 2, 1, 1, 1, 0]), dim=0, output_size=6)
        X.masked_fill(X > 0, 0.0)
        torch.where(X > 0, X, 0.0)
    assert c.syncs == 0, c.sync_kinds


def test_host_reads_count_only_where_the_cpu_stands_for_the_device() -> None:
    """On a GPU run a CPU tensor's ``tolist`` is host work, and the dispatcher sees every real device read."""
    with count_ops(cpu_as_device=False) as c:
        X.tolist()
        X.cpu()
    assert c.syncs == 0
    with count_ops(cpu_as_device=False) as c:
        X.sum().item()  # the dispatcher's _local_scalar_dense: counted on any run
    assert c.sync_kinds == {"item": 1}


def test_autocast_adds_casts_and_an_index_cast_is_not_one() -> None:
    net = model()
    with count_ops() as fp32:
        net(X).sum().backward()
        X.long()
    with count_ops() as bf16:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = net(X)
        out.float().sum().backward()
    assert fp32.casts == 0
    # forward: X, 2 weights, 2 biases, the hidden activation … to bf16; the output back to fp32
    assert bf16.casts >= 6
    assert bf16.total.cast_kinds["torch.float32->torch.bfloat16"] >= 5
    assert bf16.syncs == 0


def test_summary_is_plain_data_with_sites_and_regions() -> None:
    with count_ops() as c:
        with c.region("step"):
            X.sum().item()
    s = c.summary()
    assert s["syncs"] == 1 and s["sync_kinds"] == {"item": 1} and s["regions"]["step"]["syncs"] == 1
    (site,) = s["sync_sites"]
    assert site.startswith("item tests/test_counting.py:")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_copies_between_host_and_device_on_a_gpu() -> None:
    """A read back (``.cpu()``, ``.item()``) and a blocking upload are syncs; a non-blocking upload from pinned
    memory is not; on a GPU run the host reads of CPU tensors are host work."""
    host, pinned = torch.ones(4), torch.ones(4).pin_memory()
    with count_ops() as c:
        gpu = host.to("cuda")  # pageable, blocking
        pinned.to("cuda", non_blocking=True)
        gpu.cpu()
        gpu.sum().item()
        host.tolist()
    assert c.sync_kinds == {"h2d": 1, "d2h": 1, "item": 1}, c.sync_sites
