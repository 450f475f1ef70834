"""GEC-CL loss (the released criterion of Cao et al. 2021) against naive per-sentence loops on hand-made inputs
and a tiny random BART; the joint pass's dropout, its host syncs and what it keeps for the backward."""

from __future__ import annotations

import copy
import os
import statistics
import traceback
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import BartConfig, BartForConditionalGeneration

import raycl
from raycl.data.gec import GecExample as Example
from raycl.losses.gec_margin import GecContrastiveLoss, margin_loss
from raycl.losses.label_smoothed_nll import label_smoothed_nll
from raycl.models.seq2seq import Seq2SeqScorer
from raycl.models.tokenizer import train_bpe_tokenizer
from raycl.recipes.gec.step import GecBatch, collate, gec_loss
from raycl.testing.gec_batches import batch_from_tensors, positives
from raycl.training.prefetch import move

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
        vocab_size=len(tokenizer),
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        dropout=0.1,
    )
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
    got = [
        (int(i), int(j), _decode(scorer, t))
        for i, j, t in zip(batch.row_sentence, batch.row_slot, batch.row_tgt, strict=True)
    ]
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
    again = batch_from_tensors(*positives(plain), negs, plain.n_neg, pad_id=scorer.pad_id, num_slots=4)
    for f in ("row_src", "row_src_mask", "row_tgt", "row_sentence", "row_slot", "n_neg"):
        assert torch.equal(getattr(again, f), getattr(plain, f)), f
    assert (again.ntokens, again.spans, again.src_padded) == (plain.ntokens, plain.spans, plain.src_padded)
    moved = move(plain, lambda t: t.to("cpu", non_blocking=True))  # the prefetcher's copy (pinning needs a GPU)
    assert torch.equal(moved.row_tgt, plain.row_tgt) and moved.spans == plain.spans


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
    src_ids, src_mask, target_ids = positives(batch)
    prev = scorer.shift_right(target_ids)
    logits = scorer.model(input_ids=src_ids, attention_mask=src_mask, decoder_input_ids=prev).logits
    # torch's label_smoothing spreads ε uniformly over V classes, the same formula as fairseq's.
    want = F.cross_entropy(
        logits.flatten(0, 1), target_ids.flatten(), ignore_index=scorer.pad_id, label_smoothing=EPS
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


# --- one joint pass: every row its own dropout masks (the per-slot passes' distribution) -------------------------

TWINS = [EXAMPLES[0], Example("a2", EXAMPLES[0].source, EXAMPLES[0].target)]  # two identical sentences
# slot 0 of both is the gold target itself: rows 0, 1 (positives) and the two slot-0 negatives are 4 identical
# (source, target) pairs; a shared encoder pass would tie sentence 0's positive to its negative
TWIN_NEGATIVES = [[EXAMPLES[0].target, NEGATIVES[0][1]], [EXAMPLES[0].target]]


def _dropout_scorer(scorer: Seq2SeqScorer, *, attention_dropout: float, only: str | None = None) -> Seq2SeqScorer:
    """A tiny BART with dropout 0.3 (GEC-BART's), in train mode; ``only``: keep dropout in that part alone."""
    torch.manual_seed(5)
    config = BartConfig(
        vocab_size=len(scorer.tokenizer),
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        dropout=0.3,
        activation_dropout=0.3,
        attention_dropout=attention_dropout,
    )
    model = BartForConditionalGeneration(config).double()
    if only is not None:
        off = model.model.decoder if only == "encoder" else model.model.encoder
        for module in off.modules():  # BART keeps its dropout rates as float attributes
            for name in ("dropout", "activation_dropout"):
                if isinstance(getattr(module, name, None), float):
                    setattr(module, name, 0.0)
    return Seq2SeqScorer(model, scorer.tokenizer).train()


def _twin_scores(out) -> list[float]:  # type: ignore[no-untyped-def]
    return [out.s_pos[0].item(), out.s_pos[1].item(), out.s_neg[0, 0].item(), out.s_neg[1, 0].item()]


@pytest.mark.parametrize("part", ["encoder", "decoder"])
def test_identical_rows_of_a_joint_pass_draw_their_own_dropout(scorer: Seq2SeqScorer, part: str) -> None:
    model = _dropout_scorer(scorer, attention_dropout=0.0, only=part)
    batch = collate(TWINS, TWIN_NEGATIVES, scorer.tokenizer, max_length=64)
    loss_fn = GecContrastiveLoss(margin=1.0)
    model.eval()
    same = _twin_scores(gec_loss(model, batch, loss_fn))
    assert max(same) - min(same) < 1e-12  # the four rows are one (source, target) pair
    model.train()
    torch.manual_seed(0)
    drawn = _twin_scores(gec_loss(model, batch, loss_fn))
    # dropout in the encoder alone (or the decoder alone) still makes every row differ: no mask, no encoder pass
    # is shared between rows, as between the released code's separate passes
    assert min(abs(a - b) for i, a in enumerate(drawn) for b in drawn[i + 1 :]) > 1e-6


def _moments(xs: list[float]) -> tuple[float, float, float, float]:
    """Mean, variance and their standard errors (the variance's from the fourth central moment)."""
    n = len(xs)
    m = sum(xs) / n
    v = sum((x - m) ** 2 for x in xs) / (n - 1)
    m4 = sum((x - m) ** 4 for x in xs) / n
    return m, v, (v / n) ** 0.5, (max(m4 - v * v, 0.0) / n) ** 0.5


def _draws(model: Seq2SeqScorer, batch, loss_fn: GecContrastiveLoss, passes: str, n: int):  # type: ignore[no-untyped-def]
    losses, pos, neg = [], [], []
    with torch.no_grad():
        for seed in range(n):
            torch.manual_seed(seed)
            out = gec_loss(model, batch, loss_fn, passes=passes)
            losses.append(out.loss.item())
            pos.append(out.s_pos[0].item())
            neg.append(out.s_neg[0, 0].item())
    return losses, pos, neg


def test_joint_loss_has_the_per_slot_distribution(scorer: Seq2SeqScorer) -> None:
    """Over N = 160 seeds, dropout 0.3 everywhere (attention too): the loss's mean and variance of the joint pass
    and of the released per-slot passes agree within 4 standard errors (a normal approximation, two-sided
    p ≈ 6e-5 for a correct pass; the seeds are fixed, so the check is deterministic, yet not tuned to pass), and
    two identical rows of one joint pass are uncorrelated (|r| < 4/√N), as two separate passes are."""
    model = _dropout_scorer(scorer, attention_dropout=0.3)
    batch = collate(TWINS, TWIN_NEGATIVES, scorer.tokenizer, max_length=64)
    loss_fn = GecContrastiveLoss(margin=0.5, trade_off=LAMBDA, label_smoothing=EPS)
    n, threads = 160, torch.get_num_threads()
    torch.set_num_threads(1)  # 640 forwards of a 16-wide model: a thread pool only adds its overhead
    try:
        joint, pos, neg = _draws(model, batch, loss_fn, "joint", n)
        per_slot = _draws(model, batch, loss_fn, "per_slot", n)[0]
    finally:
        torch.set_num_threads(threads)
    (m1, v1, sm1, sv1), (m2, v2, sm2, sv2) = _moments(joint), _moments(per_slot)
    assert v1 > 0 and v2 > 0  # dropout is live in both
    assert abs(m1 - m2) < 4 * (sm1**2 + sm2**2) ** 0.5
    assert abs(v1 - v2) < 4 * (sv1**2 + sv2**2) ** 0.5
    mp, mn = sum(pos) / n, sum(neg) / n
    cov = sum((a - mp) * (b - mn) for a, b in zip(pos, neg, strict=True))
    r = cov / (sum((a - mp) ** 2 for a in pos) * sum((b - mn) ** 2 for b in neg)) ** 0.5
    assert abs(r) < 4 / n**0.5


def test_layerdrop_refuses_a_joint_pass(scorer: Seq2SeqScorer) -> None:
    model = _dropout_scorer(scorer, attention_dropout=0.0)
    model.model.config.encoder_layerdrop = 0.1
    with pytest.raises(ValueError, match="loss.passes=per_slot"):
        gec_loss(model, _batch(model), GecContrastiveLoss(margin=1.0))


# --- no host-device sync of raycl's, no (rows, T, V) fp32 tensor kept for the backward -------------------------

SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "equal"}


# the packages' own folders, not folder names: a checkout may be called raycl, or lie in a folder named torch
_HOME = {
    name: str(Path(module.__file__).parent) + os.sep
    for name, module in (("torch", torch), ("transformers", transformers), ("raycl", raycl))
}


def _origin() -> str:
    """Who asked: the innermost frame outside torch and this file ('transformers', 'raycl' or a path)."""
    for frame in reversed(traceback.extract_stack()):
        path = frame.filename
        if path.startswith(_HOME["torch"]) or path == __file__:
            continue
        return next((name for name in ("transformers", "raycl") if path.startswith(_HOME[name])), path)
    return "?"


class _Syncs(TorchDispatchMode):
    """Ops that make the host wait for the device (a value read back, or a data-dependent shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.origins: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func.overloadpacket.__name__ in SYNC_OPS:
            self.origins.append(_origin())
        return func(*args, **(kwargs or {}))


class _HostReads(TorchFunctionMode):
    """Tensor → Python reads that do not dispatch an aten op on a CPU tensor (``tolist``, ``cpu``, ``numpy``)."""

    def __init__(self) -> None:
        super().__init__()
        self.origins: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if getattr(func, "__name__", "") in ("tolist", "cpu", "numpy"):
            self.origins.append(_origin())
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("passes", ["joint", "per_slot"])
def test_the_step_reads_nothing_back_from_the_device(scorer: Seq2SeqScorer, passes: str) -> None:
    scorer.train()
    try:
        batch = _batch(scorer, num_slots=4)  # padded sources and targets: the masks are in play
        assert batch.src_padded and batch.tgt_padded
        loss_fn = GecContrastiveLoss(margin=1.0, trade_off=LAMBDA, label_smoothing=EPS)
        syncs, reads = _Syncs(), _HostReads()
        with syncs, reads:
            out = gec_loss(scorer, batch, loss_fn, passes=passes)
            out.loss.backward()
    finally:
        scorer.zero_grad()
        scorer.eval()
    assert [o for o in syncs.origins + reads.origins if o != "transformers"] == []
    # what Hugging Face's mask helpers still read: the decoder's all-ones mask, once a forward
    assert len(syncs.origins) <= {"joint": 2, "per_slot": len(batch.spans)}[passes]
    assert isinstance(out.ntokens, int) and out.loss.requires_grad


def _saved_full_vocabulary(model: Seq2SeqScorer, batch: GecBatch, precision: str) -> list[torch.dtype]:
    """dtypes of the (rows·T·V)-element tensors the step keeps for its backward (one entry per storage)."""
    full = batch.row_tgt.numel() * model.model.config.vocab_size
    kept: dict[int, torch.dtype] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.numel() == full:
            kept[t.untyped_storage().data_ptr()] = t.dtype
        return t

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        gec_loss(model, batch, GecContrastiveLoss(margin=1.0))
    return list(kept.values())


def test_no_full_vocabulary_fp32_tensor_is_kept_for_the_backward(scorer: Seq2SeqScorer) -> None:
    model = Seq2SeqScorer(copy.deepcopy(scorer.model).float(), scorer.tokenizer).train()
    batch = _batch(model, num_slots=4)
    # bf16: the logits, in bf16, and nothing else of (rows, T, V): no fp32 log-softmax, no fp32 logits
    assert _saved_full_vocabulary(model, batch, "bf16") == [torch.bfloat16]
    # fp32: the logits alone (the softmax is recomputed in the backward)
    assert _saved_full_vocabulary(model, batch, "fp32") == [torch.float32]


def test_every_preset_runs_the_joint_pass_and_a_bad_value_is_one_line() -> None:
    from raycl.config.tasks import load_space
    from raycl.config.tasks.gec import GecConfig
    from raycl.errors import UserError

    assert GecConfig().loss.passes == "joint"
    for name in ("gec_pd", "gec_bart"):
        for preset in ("paper", "small", "smoke"):
            assert load_space(name, preset=preset).config.loss.passes == "joint", (name, preset)
    chosen = load_space("gec_pd", preset="smoke", overrides=["loss.passes=per_slot"]).config
    assert chosen.loss.passes == "per_slot"
    with pytest.raises(UserError, match=r"loss\.passes.*joint \| per_slot") as err:
        load_space("gec_pd", preset="smoke", overrides=["loss.passes=stacked"])
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="loss.stack_negatives"):  # the old key is gone, not silently ignored
        load_space("gec_pd", preset="smoke", overrides=["loss.stack_negatives=true"])


def _token_scores(B: int = 2, T: int = 3, V: int = 5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    lprobs = torch.log_softmax(torch.randn(B, T, V, generator=g, dtype=torch.double), dim=-1)  # (B, T, V)
    target = torch.randint(0, V, (B, T), generator=g)  # (B, T)
    keep = torch.tensor([[True, True, True], [True, True, False]])  # (B, T) one pad
    return lprobs, target, keep


def test_gec_loss_defaults_and_every_output_field_equal_a_naive_loop() -> None:
    from raycl.losses.token_log_probs import TokenLogProbs

    lprobs, target, keep = _token_scores()
    s_neg, n_neg = torch.tensor([[-9.0, -1.0], [-4.0, 0.0]], dtype=torch.double), torch.tensor([2, 1])
    pos, loss_fn = TokenLogProbs.from_log_probs(lprobs, target), GecContrastiveLoss(margin=0.5)
    out = loss_fn(pos, keep, s_neg, n_neg, ntokens=5)
    nll = ce = 0.0
    s_pos = [0.0, 0.0]
    for b in range(2):
        for t in range(3):
            if keep[b, t]:
                lp = lprobs[b, t, int(target[b, t])].item()
                nll, s_pos[b] = nll - lp, s_pos[b] + lp
                ce += 0.9 * -lp + (0.1 / 5) * -lprobs[b, t].sum().item()  # ε = 0.1 by default
    hinges = [[max(0.0, 0.5 - s_pos[b] + s_neg[b, j].item()) for j in range(int(n_neg[b]))] for b in range(2)]
    h = [sum(row) / len(row) for row in hinges]
    assert out.nll.item() == pytest.approx(nll, rel=1e-12) and out.ce.item() == pytest.approx(ce, rel=1e-12)
    assert out.s_pos.tolist() == pytest.approx(s_pos, rel=1e-12) and out.h.tolist() == pytest.approx(h, rel=1e-12)
    assert out.mml.item() == pytest.approx(sum(h), rel=1e-12)
    assert out.loss.item() == pytest.approx((0.5 * ce + 0.5 * sum(h)) / 5, rel=1e-12)  # λ = 0.5 by default
    empty = loss_fn(pos, keep, s_neg, n_neg, ntokens=0)
    assert empty.loss.item() == pytest.approx(0.5 * ce + 0.5 * sum(h), rel=1e-12)  # ntokens = 0 divides by 1


def test_gec_loss_refuses_a_trade_off_outside_the_unit_interval() -> None:
    GecContrastiveLoss(margin=0.5, trade_off=1.0)
    for bad in (1.5, -0.1):
        with pytest.raises(ValueError, match=rf"^trade_off λ must be in \[0, 1\], got {bad}$"):
            GecContrastiveLoss(margin=0.5, trade_off=bad)


def test_margin_loss_stays_on_its_inputs_device() -> None:
    # the meta device stands in for an accelerator: slots made on the CPU would not compare with meta counts
    s_pos, s_neg = torch.zeros(3, device="meta"), torch.zeros(3, 4, device="meta")
    h = margin_loss(s_pos, s_neg, torch.zeros(3, dtype=torch.long, device="meta"), margin=0.5)
    assert h.device.type == "meta" and h.shape == (3,) and h.dtype == torch.float32
