"""Mining engines where CTranslate2 cannot run: ``mining.engine=auto`` decodes with HF and says why in one line,
``mining.engine=ctranslate2`` ends in one line naming what is missing. Two ways it fails in the field: the package
is not there (a partial install), or its CUDA build cannot open cuBLAS 12 when the model is loaded on the GPU (a
CUDA 13 machine) — after import and after listing compute types, which both work there."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from raycl.data.gec import GecExample
from raycl.errors import UserError
from raycl.miners.beam_search import build_beam_miner
from raycl.models import ct2_engine
from raycl.models.engines import choose_engine
from raycl.models.presets import build_model
from raycl.models.seq2seq import Seq2SeqScorer

CUBLAS_ERROR = "Library libcublas.so.12 is not found or cannot be loaded"  # CTranslate2 4.8.5's words


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    texts = ["the cat sat on the mat .", "a dog ran in the park .", "she go to school every day ."]
    return build_model(
        "smoke",
        out_dir=out,
        texts=texts * 20,
        vocab_size=120,
        d_model=16,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        encoder_layers=1,
        decoder_layers=1,
    )


@pytest.fixture
def no_ctranslate2(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import ctranslate2`` raises ModuleNotFoundError, as where it is not installed."""
    for name in [m for m in sys.modules if m == "ctranslate2" or m.startswith("ctranslate2.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # type: ignore[arg-type]


@pytest.fixture
def cuda13(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU machine with CUDA 13's libraries only: CTranslate2 imports and lists its CUDA compute types, and
    fails to open libcublas.so.12 when a model is loaded on the GPU."""
    patch_cuda13(monkeypatch)


def patch_cuda13(monkeypatch: pytest.MonkeyPatch) -> None:
    """:func:`cuda13`'s stand-ins, for other modules' fixtures (tests/test_beam_units.py)."""
    import ctranslate2

    real_types, real_translator = ctranslate2.get_supported_compute_types, ctranslate2.Translator

    def types(device: str, *args: object) -> set[str]:
        return {"float32", "float16", "bfloat16", "int8_float16"} if device == "cuda" else real_types(device)

    def translator(path: str, device: str = "cpu", **kwargs: object) -> object:
        if device == "cuda":
            raise RuntimeError(CUBLAS_ERROR)
        return real_translator(path, device=device, **kwargs)

    monkeypatch.setattr(ctranslate2, "get_supported_compute_types", types)
    monkeypatch.setattr(ctranslate2, "Translator", translator)


@pytest.fixture
def hf_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """HF's engine asked for a device is built on this machine's CPU; the devices asked are recorded."""
    asked: list[str] = []
    real = Seq2SeqScorer.from_pretrained.__func__  # type: ignore[attr-defined]

    def from_pretrained(cls: type, path: str, *, device: str = "cpu", **kwargs: object) -> Seq2SeqScorer:
        asked.append(device)
        return real(cls, path, device="cpu", **kwargs)

    monkeypatch.setattr(Seq2SeqScorer, "from_pretrained", classmethod(from_pretrained))
    return asked


def _mine(miner: object) -> None:
    got = miner.mine([GecExample("x:0", "she go to school .", "she goes to school .")])  # type: ignore[attr-defined]
    assert [r.id for r in got] == ["x:0"]


def test_auto_without_ctranslate2_mines_with_hf_and_says_why_in_one_line(
    tiny: Path, no_ctranslate2: None, capfd: pytest.CaptureFixture[str]
) -> None:
    got = choose_engine("auto", tiny, device="cpu", precision="fp32")
    engine, why = got.engine, got.why
    assert engine == "hf" and "ctranslate2 cannot be imported" in why and "pip install ctranslate2" in why
    miner = build_beam_miner(str(tiny), {"k": 1, "beam": 2, "engine": "auto"})
    assert isinstance(miner.scorer, Seq2SeqScorer)
    _mine(miner)
    said = [line for line in capfd.readouterr().err.splitlines() if "mining.engine" in line]
    assert len(said) == 1 and said[0].startswith("raycl miner: mining.engine=hf (auto: ctranslate2 cannot"), said


def test_ctranslate2_asked_without_it_is_one_line_naming_the_package(tiny: Path, no_ctranslate2: None) -> None:
    with pytest.raises(UserError) as err:
        build_beam_miner(str(tiny), {"k": 1, "beam": 2, "engine": "ctranslate2"})
    msg = str(err.value)
    assert msg.startswith("mining.engine=ctranslate2: ctranslate2 cannot be imported") and "\n" not in msg
    assert "pip install ctranslate2" in msg and "mining.engine=hf" in msg


def test_auto_on_a_gpu_without_cublas_12_falls_back_when_the_model_loads(
    tiny: Path,
    cuda13: None,
    hf_on_the_cpu: list[str],
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The library probe finds cuBLAS 12 (say, another process's), yet the engine's own load fails: HF decodes."""
    monkeypatch.setattr(ct2_engine, "_dlopen", lambda name: None)
    assert choose_engine("auto", tiny, device="cuda", precision="bf16").engine == "ctranslate2"  # as imported
    miner = build_beam_miner(str(tiny), {"k": 1, "beam": 2, "engine": "auto", "device": "cuda"})
    assert isinstance(miner.scorer, Seq2SeqScorer) and hf_on_the_cpu == ["cuda"]
    said = [line for line in capfd.readouterr().err.splitlines() if "mining.engine" in line]
    assert len(said) == 1 and "mining.engine=hf (auto: CTranslate2 cannot load libcublas.so.12 on cuda" in said[0]
    assert "pip install nvidia-cublas-cu12" in said[0]


def test_auto_on_a_gpu_without_cublas_12_is_known_before_the_model_loads(
    tiny: Path, cuda13: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the library cannot be opened by name, ``auto`` resolves to HF at once (the driver, a shard manifest
    and the miner agree on the engine)."""

    def absent(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(ct2_engine, "_dlopen", absent)
    got = choose_engine("auto", tiny, device="cuda", precision="bf16")
    engine, why = got.engine, got.why
    assert engine == "hf" and "libcublas.so.12" in why and "nvidia-cublas-cu12" in why
    assert choose_engine("auto", tiny, device="cpu", precision="fp32").engine == "ctranslate2"  # a CPU needs none
    with pytest.raises(UserError) as err:
        choose_engine("ctranslate2", tiny, device="cuda", precision="bf16")
    assert "cannot load libcublas.so.12" in str(err.value) and "\n" not in str(err.value)


def test_ctranslate2_asked_on_a_gpu_without_cublas_12_is_one_line(
    tiny: Path, cuda13: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ct2_engine, "_dlopen", lambda name: None)
    with pytest.raises(UserError) as err:
        build_beam_miner(
            str(tiny), {"k": 1, "beam": 2, "engine": "ctranslate2", "device": "cuda", "precision": "bf16"}
        )
    msg = str(err.value)
    assert msg.startswith("mining.engine=ctranslate2: CTranslate2 cannot load libcublas.so.12 on cuda")
    assert "pip install nvidia-cublas-cu12" in msg and "\n" not in msg


def test_another_load_error_is_not_taken_for_a_missing_library(
    tiny: Path, cuda13: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ctranslate2

    monkeypatch.setattr(ct2_engine, "_dlopen", lambda name: None)
    monkeypatch.setattr(ctranslate2, "Translator", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        build_beam_miner(str(tiny), {"k": 1, "beam": 2, "engine": "auto", "device": "cuda", "precision": "bf16"})
