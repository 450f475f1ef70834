"""GEC-CL loss (SPEC §1.2) against naive per-sentence loops on hand-made inputs and a tiny random BART."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import BartConfig, BartForConditionalGeneration

from raycl.data.gec import GecExample as Example
from raycl.losses.gec_margin import GecContrastiveLoss, margin_loss
from raycl.losses.label_smoothed_nll import label_smoothed_nll
from raycl.models.seq2seq import Seq2SeqScorer
from raycl.models.tokenizer import train_bpe_tokenizer
from raycl.train.gec_step import GecBatch, collate, gec_loss

EPS = 0.1
LAMBDA = 0.5


EXAMPLES = [
    Example("a", "He do n't like it .", "He does n't like it ."),
    Example("b", "This are a sentence , ok ?", "This is a sentence , OK ?"),
    Example("c", "Fine as it is .", "Fine as it is ."),
    Example("d", "I has went to school yesterday .", "I went to school yesterday ."),
]
NEGATIVES = [
    ["He do n't like it .", "He did n't like it ."],
    [],  # no negatives: contributes only CE
    ["Fine as it are ."],
    ["I has went to school yesterday .", "I have went to school yesterday .", "I go to school ."],
]


@pytest.fixture(scope="module")
def scorer(tmp_path_factory: pytest.TempPathFactory) -> Seq2SeqScorer:
    texts = [t for e in EXAMPLES for t in (e.source, e.target)] + [n for ns in NEGATIVES for n in ns]
    tokenizer = train_bpe_tokenizer(texts * 3, Path(tmp_path_factory.mktemp("tok")), vocab_size=300)
    torch.manual_seed(0)
    config = BartConfig(
        vocab_size=len(tokenizer), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
        dropout=0.1,
    )  # fmt: skip
    return Seq2SeqScorer(BartForConditionalGeneration(config).double(), tokenizer)


def _naive_sentence(scorer: Seq2SeqScorer, source: str, target: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(label-smoothed CE, S(t|s), tokens) of one unpadded sentence, with a Python loop over its tokens."""
    src = torch.tensor([scorer.tokenizer(source)["input_ids"]])
    tgt = scorer.tokenizer(target)["input_ids"]
    dec = torch.tensor([[scorer.model.config.decoder_start_token_id] + tgt[:-1]])
    lp = torch.log_softmax(scorer.model(input_ids=src, decoder_input_ids=dec).logits[0], dim=-1)  # (T, V)
    ce, score, V = lp.new_zeros(()), lp.new_zeros(()), lp.size(-1)
    for t, y in enumerate(tgt):
        ce = ce + (1 - EPS) * -lp[t, y] + (EPS / V) * -lp[t].sum()
        score = score + lp[t, y]
    return ce, score, len(tgt)


def _naive_loss(scorer: Seq2SeqScorer, margin: float, trade_off: float = LAMBDA) -> torch.Tensor:
    ce_sum, mml, ntokens = 0.0, 0.0, 0
    for ex, negs in zip(EXAMPLES, NEGATIVES, strict=True):
        ce, s_pos, n = _naive_sentence(scorer, ex.source, ex.target)
        ce_sum, ntokens = ce_sum + ce, ntokens + n
        for neg in negs:
            s_neg = _naive_sentence(scorer, ex.source, neg)[1]
            mml = mml + torch.clamp(margin - s_pos + s_neg, min=0.0) / len(negs)
    return ((1 - trade_off) * ce_sum + trade_off * mml) / ntokens


def _median_gap(scorer: Seq2SeqScorer) -> float:
    """A margin γ that makes some hinges active and some not, so both branches are exercised."""
    with torch.no_grad():
        gaps = [
            (_naive_sentence(scorer, ex.source, ex.target)[1] - _naive_sentence(scorer, ex.source, n)[1]).item()
            for ex, negs in zip(EXAMPLES, NEGATIVES, strict=True)
            for n in negs
        ]
    return statistics.median(gaps)


def _grads(scorer: Seq2SeqScorer, loss: torch.Tensor) -> list[torch.Tensor]:
    scorer.zero_grad()
    loss.backward()
    m = scorer.model.model
    params = [m.shared.weight, m.encoder.layers[0].fc1.weight, m.decoder.layers[0].encoder_attn.q_proj.weight]
    return [p.grad.clone() for p in params]  # type: ignore[union-attr]


def _batch(scorer: Seq2SeqScorer, num_slots: int | None = None):
    return collate(EXAMPLES, NEGATIVES, scorer.tokenizer, max_length=64, num_slots=num_slots)


def test_label_smoothed_nll_matches_naive_loop() -> None:
    torch.manual_seed(1)
    lprobs = torch.log_softmax(torch.randn(5, 7, dtype=torch.double), dim=-1)
    target = torch.tensor([3, 1, 6, 1, 0])  # 1 = pad
    nll, smoothed = label_smoothed_nll(lprobs, target, epsilon=0.2, ignore_index=1)
    want_nll = want_smoothed = 0.0
    for n in range(5):
        if target[n].item() == 1:
            continue
        y = int(target[n])
        want_nll += -lprobs[n, y].item()
        want_smoothed += 0.8 * -lprobs[n, y].item() + (0.2 / 7) * sum(-lprobs[n, v].item() for v in range(7))
    assert nll.item() == pytest.approx(want_nll, rel=1e-12)
    assert smoothed.item() == pytest.approx(want_smoothed, rel=1e-12)


def test_margin_loss_matches_naive_loop() -> None:
    s_pos = torch.tensor([-3.0, -10.0, -2.0, -5.0])
    s_neg = torch.tensor([[-3.5, -1.0, 99.0], [-20.0, -9.0, -9.5], [7.0, 7.0, 7.0], [-4.0, -6.0, -5.2]])
    n_neg = torch.tensor([2, 3, 0, 1])  # filler (99, the 7s, -6, -5.2) must be ignored
    got = margin_loss(s_pos, s_neg, n_neg, margin=0.75)
    for i in range(4):
        n = int(n_neg[i])
        hinges = [max(0.0, 0.75 - s_pos[i].item() + s_neg[i, j].item()) for j in range(n)]
        want = sum(hinges) / n if n else 0.0
        assert got[i].item() == pytest.approx(want, abs=1e-6)


def _decode(scorer: Seq2SeqScorer, ids: torch.Tensor) -> str:
    return scorer.tokenizer.decode(ids[ids.ne(scorer.pad_id)], skip_special_tokens=True)


def test_collate_lays_out_one_row_per_scored_pair(scorer: Seq2SeqScorer) -> None:
    batch = _batch(scorer, num_slots=4)
    # rows: the 4 positives, then slot 0 of sentences 0, 2, 3; slot 1 of 0, 3; slot 2 of 3 (filler never scored)
    want = [(i, -1, e.target) for i, e in enumerate(EXAMPLES)]
    want += [(i, j, NEGATIVES[i][j]) for j in range(4) for i in range(4) if j < len(NEGATIVES[i])]
    got = [(int(i), int(j), _decode(scorer, t))
           for i, j, t in zip(batch.row_sentence, batch.row_slot, batch.row_tgt, strict=True)]  # fmt: skip
    assert got == want and batch.num_slots == 4 and batch.n_neg.tolist() == [2, 0, 1, 3]
    for r, (i, _, _) in enumerate(want):  # each row holds its own copy of its sentence's source
        src = batch.row_src[r][batch.row_src_mask[r].bool()]
        assert _decode(scorer, src) == EXAMPLES[i].source
    lengths = [len(scorer.tokenizer(t)["input_ids"]) for _, _, t in want]
    assert batch.row_tgt.shape[1] == max(lengths) and batch.tgt_padded  # padded to the longest real row
    assert batch.ntokens == sum(lengths[:4]) and isinstance(batch.ntokens, int)
    assert batch.src_padded and [(s.start, s.stop) for s in batch.spans] == [(0, 4), (4, 7), (7, 9), (9, 10)]
    with pytest.raises(ValueError, match="num_slots"):
        _batch(scorer, num_slots=2)


def test_collate_pads_to_a_multiple_and_tensors_round_trip(scorer: Seq2SeqScorer) -> None:
    batch = collate(EXAMPLES, NEGATIVES, scorer.tokenizer, max_length=64, pad_to_multiple_of=8)
    assert batch.row_src.shape[1] % 8 == 0 and batch.row_tgt.shape[1] % 8 == 0
    assert all(s.src_len % 8 == 0 and s.tgt_len % 8 == 0 and s.src_padded for s in batch.spans)
    same = collate(EXAMPLES[2:3], [[EXAMPLES[2].target]], scorer.tokenizer, max_length=64)
    assert not same.src_padded and not same.tgt_padded  # one source, equal-length rows: no mask needed
    plain = _batch(scorer, num_slots=4)
    negs = torch.full((4, 4, plain.row_tgt.shape[1]), scorer.pad_id)
    for i, j in zip(plain.row_sentence[4:].tolist(), plain.row_slot[4:].tolist(), strict=True):
        row = plain.row_tgt[4:][(plain.row_sentence[4:] == i) & (plain.row_slot[4:] == j)][0]
        negs[i, j, : row.numel()] = row
    negs[1, 0, :3] = 7  # filler (n_1 = 0) is ignored whatever it holds
    again = GecBatch.from_tensors(plain.src_ids, plain.src_mask, plain.target_ids, negs, plain.n_neg,
                                  pad_id=scorer.pad_id, num_slots=4)  # fmt: skip
    for f in ("row_src", "row_src_mask", "row_tgt", "row_sentence", "row_slot", "n_neg"):
        assert torch.equal(getattr(again, f), getattr(plain, f)), f
    assert (again.ntokens, again.spans, again.src_padded) == (plain.ntokens, plain.spans, plain.src_padded)


@pytest.mark.parametrize("passes", ["joint", "per_slot"])
def test_gec_loss_and_grads_equal_naive_loop(scorer: Seq2SeqScorer, passes: str) -> None:
    scorer.eval()
    margin = _median_gap(scorer)
    loss_fn = GecContrastiveLoss(margin=margin, trade_off=LAMBDA, label_smoothing=EPS)
    out = gec_loss(scorer, _batch(scorer, num_slots=4), loss_fn, passes=passes)
    want = _naive_loss(scorer, margin)
    assert out.loss.item() == pytest.approx(want.item(), rel=1e-9)
    assert out.h[1].item() == 0.0
    assert out.ntokens == sum(len(scorer.tokenizer(e.target)["input_ids"]) for e in EXAMPLES)
    for got_g, want_g in zip(_grads(scorer, out.loss), _grads(scorer, want), strict=True):
        assert torch.allclose(got_g, want_g, rtol=1e-7, atol=1e-12)


def test_joint_equals_per_slot_and_passes_are_counted(scorer: Seq2SeqScorer) -> None:
    scorer.eval()
    loss_fn = GecContrastiveLoss(margin=_median_gap(scorer), trade_off=LAMBDA, label_smoothing=EPS)
    rows: list[int] = []
    hook = scorer.model.model.encoder.register_forward_hook(
        lambda m, a, kw, o: rows.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        per_slot = gec_loss(scorer, _batch(scorer, num_slots=4), loss_fn, passes="per_slot")
        n_per_slot = len(rows)
        joint = gec_loss(scorer, _batch(scorer, num_slots=4), loss_fn)  # the default
    finally:
        hook.remove()
    # per slot: positives + slots 0..2 (slot 3 has no real negative). Joint: one pass, its encoder sees every row
    # (4 positives + 6 negatives), each with its own copy of its source, not one encoder pass per sentence.
    assert rows == [4, 3, 2, 1, 10] and n_per_slot == 4
    assert joint.loss.item() == pytest.approx(per_slot.loss.item(), rel=1e-9)
    for a, b in zip(_grads(scorer, per_slot.loss), _grads(scorer, joint.loss), strict=True):
        assert torch.allclose(a, b, rtol=1e-7, atol=1e-12)
    with pytest.raises(ValueError, match="passes"):
        gec_loss(scorer, _batch(scorer), loss_fn, passes="stacked")


def test_trade_off_zero_is_label_smoothed_cross_entropy(scorer: Seq2SeqScorer) -> None:
    scorer.eval()
    batch = _batch(scorer)
    out = gec_loss(scorer, batch, GecContrastiveLoss(margin=100.0, trade_off=0.0, label_smoothing=EPS))
    prev = scorer.shift_right(batch.target_ids)
    logits = scorer.model(input_ids=batch.src_ids, attention_mask=batch.src_mask, decoder_input_ids=prev).logits
    # torch's label_smoothing spreads ε uniformly over V classes, the same formula as fairseq's.
    want = F.cross_entropy(
        logits.flatten(0, 1), batch.target_ids.flatten(), ignore_index=scorer.pad_id, label_smoothing=EPS
    )
    assert out.mml.item() > 0  # the margin term is live, yet weighted out
    assert out.loss.item() == pytest.approx(want.item(), rel=1e-9)


def test_sentence_without_negatives_contributes_only_ce(scorer: Seq2SeqScorer) -> None:
    scorer.eval()
    loss_fn = GecContrastiveLoss(margin=1e6, trade_off=LAMBDA, label_smoothing=EPS)
    batch = collate(EXAMPLES[1:2], NEGATIVES[1:2], scorer.tokenizer, max_length=64, num_slots=3)
    out = gec_loss(scorer, batch, loss_fn)
    ce, _, n = _naive_sentence(scorer, EXAMPLES[1].source, EXAMPLES[1].target)
    assert out.mml.item() == 0.0
    assert out.loss.item() == pytest.approx((1 - LAMBDA) * ce.item() / n, rel=1e-9)


def test_train_mode_draws_fresh_dropout(scorer: Seq2SeqScorer) -> None:
    # Gradients through the negatives are covered by the naive-loop gradient test; here: train mode is kept.
    scorer.train()
    try:
        batch, loss_fn = _batch(scorer), GecContrastiveLoss(margin=1e3, trade_off=1.0, label_smoothing=EPS)
        losses = []
        for seed in (3, 3, 4):
            torch.manual_seed(seed)
            losses.append(gec_loss(scorer, batch, loss_fn).loss.item())
        assert losses[0] == losses[1] != losses[2]
    finally:
        scorer.eval()
