"""A beam-search miner's batches and precision, as a GPU miner runs them, checked on the CPU: sources go to the
engine in batches of similar length (sorted, then cut: little padding in each ``generate`` call), and at bf16 a
GPU miner's weights are bf16 themselves — no autocast casting around every op of a search the host drives."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch

from raycl.data.gec import GecExample
from raycl.miners.beam_search import BeamSearchMiner, length_chunks
from raycl.models.engines import in_precision
from raycl.models.presets import build_model
from raycl.models.seq2seq import Seq2SeqScorer

WORDS = "the cat sat on a mat and then it ran to see what the dog did in the park all day long".split()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    return build_model(
        "smoke",
        out_dir=out,
        texts=[" ".join(WORDS)] * 30,
        vocab_size=120,
        d_model=16,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        encoder_layers=1,
        decoder_layers=1,
    )


def _examples(n: int) -> list[GecExample]:
    lengths = [(7 * i) % 19 + 2 for i in range(n)]  # mixed lengths, in no order
    return [GecExample(f"e:{i}", " ".join(WORDS[:k]), " ".join(WORDS[:k])) for i, k in enumerate(lengths)]


def _padding(batches: list[list[str]]) -> int:
    """Words of padding the batches carry: each sentence padded to its batch's longest."""
    return sum(max(len(s.split()) for s in b) * len(b) - sum(len(s.split()) for s in b) for b in batches)


def test_sources_reach_the_engine_in_batches_of_similar_length(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scorer = Seq2SeqScorer.from_pretrained(tiny)
    batches: list[list[str]] = []
    real = scorer.generate

    def generate(sources: list[str], **kwargs: Any) -> Any:
        batches.append(list(sources))
        return real(sources, **{**kwargs, "max_new_tokens": 4})

    monkeypatch.setattr(scorer, "generate", generate)
    examples = _examples(40)
    got = BeamSearchMiner(scorer, k=1, beam=2, batch_size=8).mine(examples)
    assert [r.id for r in got] == [ex.id for ex in examples]  # results in the examples' order
    assert [len(b) for b in batches] == [8] * 5
    lengths = [len(s.split()) for b in batches for s in b]
    assert lengths == sorted(lengths)  # shortest first, cut in order
    in_order = [[ex.source for ex in examples[i : i + 8]] for i in range(0, 40, 8)]
    assert _padding(batches) < _padding(in_order) / 4, (_padding(batches), _padding(in_order))
    assert [list(c) for c in length_chunks(["a b c", "a", "a b"], 2)] == [[1, 2], [0]]


def test_a_gpu_miners_weights_are_in_its_precision_and_nothing_is_autocast(tiny: Path) -> None:
    cpu = in_precision(Seq2SeqScorer.from_pretrained(tiny), "cpu", "bf16")  # a CPU miner: autocast, fp32 weights
    assert next(cpu.parameters()).dtype == torch.float32
    assert isinstance(BeamSearchMiner(cpu, k=1, beam=2, precision="bf16")._autocast(), torch.autocast)
    gpu = in_precision(Seq2SeqScorer.from_pretrained(tiny), "cuda", "bf16")  # cast as on a GPU (not moved here)
    assert {p.dtype for p in gpu.parameters()} == {torch.bfloat16}
    miner = BeamSearchMiner(gpu, k=1, beam=2, precision="bf16")
    assert isinstance(miner._autocast(), nullcontext)
    got = miner.mine(_examples(4))
    assert len(got) == 4 and all(all(isinstance(s, float) for s in r.scores) for r in got)
    assert next(in_precision(Seq2SeqScorer.from_pretrained(tiny), "cuda", "fp32").parameters()).dtype == (
        torch.float32
    )
