"""CTranslate2 conversions on a node (issue 19 §4): one conversion per folder however many miners start at once
(a file lock), a killed converter's temporary folders cleaned, versions older than the newest two pruned, and the
base model's digest taken from its bytes, not its files' modification times."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from raycl.data.gec import _target
from raycl.data.gec_corpus import generate_pairs
from raycl.models.ct2_engine import CONVERSIONS_LOG, CT2Seq2Seq, folder_digest
from raycl.models.presets import build_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    pairs = generate_pairs(60, error_rate=0.5, edits_per_error=1.0, seed=0)
    texts = [t for _, m in pairs for t in (m.source, _target(m, 0))]
    return build_model(
        "smoke",
        out_dir=out,
        texts=texts,
        vocab_size=300,
        d_model=32,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        encoder_layers=1,
        decoder_layers=1,
    )


def test_three_miners_on_one_node_convert_once(ray_local, tiny: Path, tmp_path: Path) -> None:  # noqa: ANN001
    ray = ray_local

    class _Miner:  # defined here: pickled by value, as the test module is not importable in workers
        """A miner-like actor whose CTranslate2 converter leaves a mark per conversion (and takes its time, so that
        miners started together would all convert without a lock)."""

        def __init__(self, marks: str) -> None:
            import time
            import uuid

            from ctranslate2.converters import TransformersConverter

            original = TransformersConverter.convert

            def convert(self: object, *args: object, **kwargs: object) -> object:
                Path(marks, uuid.uuid4().hex).touch()
                time.sleep(1.0)
                return original(self, *args, **kwargs)

            TransformersConverter.convert = convert  # type: ignore[method-assign]

        def ready(self) -> bool:
            return True

        def load(self, model: str, cache: str) -> int:
            return CT2Seq2Seq.from_pretrained(model, cache_dir=cache).version

    marks, cache = tmp_path / "marks", tmp_path / "cache"
    marks.mkdir()
    actor = ray.remote(num_cpus=0)(_Miner)
    miners = [actor.remote(str(marks)) for _ in range(3)]
    ray.get([m.ready.remote() for m in miners])  # all started: the loads below begin together
    assert ray.get([m.load.remote(str(tiny), str(cache)) for m in miners]) == [0, 0, 0]
    assert len(list(marks.iterdir())) == 1
    assert len((cache / CONVERSIONS_LOG).read_text().splitlines()) == 1  # what bench/mine.py counts per node
    for m in miners:
        ray.kill(m)


def test_a_killed_converters_temporary_folders_are_removed(tiny: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    name = f"v0-{folder_digest(tiny)}-float32"
    left = [cache / f".{name}.tmp-hf-dead1", cache / f".{name}.tmp-dead2", cache / ".v7-00ff-float32.tmp-dead3"]
    for d in left:
        d.mkdir(parents=True)
        (d / "model.bin").write_bytes(b"half written")
    CT2Seq2Seq.from_pretrained(tiny, cache_dir=cache)
    assert [d for d in left if d.exists()] == []
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == [CONVERSIONS_LOG, name]


def test_versions_older_than_the_newest_two_are_pruned_but_the_base_stays(tiny: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    ct2 = CT2Seq2Seq.from_pretrained(tiny, cache_dir=cache)
    state = {k: v.clone() for k, v in ct2_state(tiny).items()}
    for version in (1, 2, 3):
        ct2.load_state_dict(
            {k: v * (1 + version / 10) if v.is_floating_point() else v for k, v in state.items()}, version=version
        )
    kept = sorted(p.name.split("-")[0] for p in cache.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert kept == ["v0", "v2", "v3"]
    assert ct2.score_texts(["a b ."], ["a b ."])[0] < 0  # the loaded version still decodes


def ct2_state(model: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForSeq2SeqLM

    return dict(AutoModelForSeq2SeqLM.from_pretrained(str(model)).state_dict())


def test_the_base_models_digest_is_its_content(tiny: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(tiny, copy)
    digest = folder_digest(copy)
    weights = next(copy.glob("*.safetensors"))
    os.utime(weights, ns=(1, 1))  # touched (a copy, an rsync): the same weights, not converted again
    assert folder_digest(copy) == digest
    st = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # other weights of the same size, written within one mtime tick
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert folder_digest(copy) != digest
