"""Versioned weights: the flat buffer round-trips exactly, one ``ray.put`` per publication, the store never goes
back to an older version, and a miner that pulled version v only ever sees newer ones."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from transformers import BartConfig, BartForConditionalGeneration

from raycl.distributed import weights as W
from raycl.distributed.messages import MineTask
from raycl.distributed.miner_pool import MinerActor, MinerFactory
from raycl.testing.miners import ECHO


def _state_dict() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    shared = torch.randn(5, 3)
    return {
        "f32": torch.randn(4, 3),
        "f16": torch.randn(7).half(),
        "bf16": torch.randn(2, 5).to(torch.bfloat16),
        "f64": torch.randn(3, 1, 2, dtype=torch.float64),
        "i64": torch.arange(-3, 6).reshape(3, 3),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "transposed": torch.randn(3, 4).t(),  # not contiguous
        "tied_a": shared,
        "tied_b": shared,  # the same storage: written once
        "odd": torch.randn(1, dtype=torch.float16),  # 2 bytes: the next entry must still be aligned
        "after_odd": torch.randn(2, 2, dtype=torch.float64),
    }


def test_flatten_round_trip_is_exact_with_zero_copy_views() -> None:
    sd = _state_dict()
    buf, manifest = W.flatten_state_dict(sd)
    assert buf.dtype == np.uint8 and buf.ndim == 1
    out = W.unflatten(buf, manifest)
    assert list(out) == list(sd)
    for name, t in sd.items():
        assert out[name].dtype == t.dtype and out[name].shape == t.shape, name
        assert torch.equal(out[name], t), name
    lo = buf.ctypes.data
    assert all(lo <= out[n].data_ptr() < lo + len(buf) for n in sd if sd[n].numel())  # views, not copies
    spec = {s.name: s for s in manifest}
    assert spec["tied_a"].offset == spec["tied_b"].offset
    assert all(s.offset % W.ALIGN == 0 for s in manifest)
    unique_bytes = sum(t.numel() * t.element_size() for n, t in sd.items() if n != "tied_b")
    assert unique_bytes <= len(buf) < unique_bytes + W.ALIGN * len(sd)


def test_a_model_loads_its_flattened_weights() -> None:
    config = BartConfig(
        vocab_size=50,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=32,
    )
    torch.manual_seed(1)
    src, dst = BartForConditionalGeneration(config), BartForConditionalGeneration(config)
    buf, manifest = W.flatten_state_dict(src.state_dict())
    dst.load_state_dict(W.unflatten(buf, manifest))
    for (n, a), b in zip(src.state_dict().items(), dst.state_dict().values(), strict=True):
        assert torch.equal(a, b), n


@dataclass
class _Ref:
    tag: str


def test_weight_store_keeps_only_newer_versions() -> None:
    store = W.WeightStore()
    assert store.version() == -1 and store.pull_if_newer(-1) is None
    assert store.publish(0, [_Ref("v0")], ())
    assert store.pull_if_newer(-1).refs == [_Ref("v0")] and store.pull_if_newer(0) is None  # type: ignore[union-attr]
    assert store.publish(3, [_Ref("v3")], ())
    assert not store.publish(3, [_Ref("again")], ()) and not store.publish(2, [_Ref("old")], ())
    got = store.pull_if_newer(0)
    assert got is not None and got.version == 3 and got.refs == [_Ref("v3")]
    assert store.pull_if_newer(5) is None  # never an older version than the caller holds


def test_publication_is_one_put_kept_alive_by_the_store(ray_local, monkeypatch: pytest.MonkeyPatch) -> None:
    ray = ray_local
    store = W.start_weight_store()
    puts = []
    real_put = ray.put
    monkeypatch.setattr(W.ray, "put", lambda value, **kw: puts.append(value) or real_put(value, **kw))
    sd = _state_dict()
    assert W.publish_weights(store, 1, sd)
    assert len(puts) == 1 and isinstance(puts[0], np.ndarray)
    assert not W.publish_weights(store, 1, sd) and len(puts) == 2  # refused: the store keeps version 1

    @ray.remote(num_cpus=0)
    def fetch_in_another_process(store) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
        weights = ray.get(store.pull_if_newer.remote(0))
        return {k: v.clone() for k, v in W.fetch_weights(weights).items()}

    # publish_weights kept no reference of its own: the store's keeps the buffer alive
    got = ray.get(fetch_in_another_process.remote(store))
    assert all(torch.equal(got[k], v) for k, v in sd.items())
    ray.kill(store)


def test_a_miner_only_moves_to_newer_weights(ray_local) -> None:
    store = W.start_weight_store()
    miner = MinerActor(0, MinerFactory(ECHO, options={"k": 1, "version_wait_s": 5.0}), store)
    task = MineTask(0, 0, 0, (_Item("a"),))
    assert miner.mine(task).model_version == 0 and miner.version() == 0  # the factory's weights are version 0
    W.publish_weights(store, 2, {"w": torch.tensor([1.0, 2.0])})
    batch = miner.mine(task)
    assert batch.model_version == 2 and [r.scores for r in batch.records] == [
        (3.0,)
    ]  # the echo miner scores with Σw
    assert not W.publish_weights(store, 1, {"w": torch.tensor([100.0])})
    assert miner.mine(task).model_version == 2
    W.publish_weights(store, 5, {"w": torch.tensor([10.0])})
    assert miner.mine(MineTask(0, 1, 0, (_Item("b"),), min_version=4)).records[0].scores == (10.0,)
    # a task needing a version not published yet waits for it (the trainer publishes it shortly)
    later = threading.Timer(0.3, lambda: W.publish_weights(store, 7, {"w": torch.tensor([-1.0])}))
    later.start()
    start = time.monotonic()
    batch = miner.mine(MineTask(0, 2, 0, (_Item("c"),), min_version=7))
    assert batch.model_version == 7 and batch.records[0].scores == (-1.0,) and time.monotonic() - start >= 0.25
    later.join()
    ray_local.kill(store)


@dataclass(frozen=True)
class _Item:
    id: str


def test_gec_miners_load_the_scorers_the_ddp_copys_or_the_inner_models_weights() -> None:
    from types import SimpleNamespace

    from torch import nn

    from raycl.miners.beam_search import GEC_BEAM

    class Scorer(nn.Module):  # the shape of Seq2SeqScorer: the HF model under `.model`
        def __init__(self) -> None:
            super().__init__()
            self.model = nn.Linear(2, 3)

    src = Scorer()
    forms = [src.state_dict(), {f"module.{k}": v for k, v in src.state_dict().items()}, src.model.state_dict()]
    for sd in forms:
        miner = SimpleNamespace(module=Scorer())
        GEC_BEAM.load(miner, sd)
        assert all(
            torch.equal(a, b)
            for a, b in zip(miner.module.state_dict().values(), src.state_dict().values(), strict=True)
        )
    with pytest.raises(RuntimeError):
        GEC_BEAM.load(SimpleNamespace(module=Scorer()), {"weight": torch.zeros(3, 3)})


def test_the_driver_side_actors_import_no_torch() -> None:
    """The weight store, the negative stream and the run's n-best stream are actors of their own: each process
    imports the module its class is in, and torch there cost about 1 CPU-second a process (bench/trial_cost.py)
    for a class that only holds references. A fresh interpreter imports the three modules without it."""
    import subprocess
    import sys

    code = (
        "import sys; import raycl.distributed.weights, raycl.distributed.stream, raycl.distributed.nbest; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout
