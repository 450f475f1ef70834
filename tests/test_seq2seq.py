"""Local BPE tokenizer, model presets and the summed-log-prob sequence scorer (Cao et al. 2021, Eq. 4)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from raycl.errors import UserError
from raycl.models.decoding import Decoding
from raycl.models.presets import PRESETS, build_model, preset_config
from raycl.models.seq2seq import Seq2SeqScorer
from raycl.models.tokenizer import train_bpe_tokenizer

WORDS = (
    "He She do does n't 's 're like it the a school went go to yesterday . , ? ! ; : \" ' ( ) - -- "
    "e-mail 3.5 1990 café naïve I 'm O'Neil U.S. don can't ... % $ & cannot they their There"
).split()


def _sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 14))) for _ in range(n)]


SENTENCES = ["He do n't like it .", "This are a sentence .", "I has went to school ."] + _sentences(40, 1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("smoke")
    return build_model(
        "smoke",
        out_dir=out,
        texts=SENTENCES,
        vocab_size=400,
        d_model=32,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        encoder_layers=1,
        decoder_layers=1,
    )


@pytest.fixture(scope="module")
def scorer(model_dir: Path) -> Seq2SeqScorer:
    s = Seq2SeqScorer.from_pretrained(model_dir)
    s.model.double()
    return s.eval()


def _naive_score(scorer: Seq2SeqScorer, source: str, target: str) -> float:
    return _naive_ids_score(scorer, source, scorer.tokenizer(target)["input_ids"])


def test_tokenizer_round_trips_m2_text_and_has_bart_specials(tmp_path: Path) -> None:
    sentences = SENTENCES[:3] + _sentences(197, 2)  # 200; half the words are seen only at test time
    train_bpe_tokenizer(_sentences(100, 3), tmp_path, vocab_size=400)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert [tok.convert_ids_to_tokens(i) for i in range(5)] == ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    assert (tok.bos_token_id, tok.pad_token_id, tok.eos_token_id) == (0, 1, 2)
    for s in sentences:
        ids = tok(s)["input_ids"]
        assert ids[0] == 0 and ids[-1] == 2 and tok.unk_token_id not in ids
        assert tok.decode(ids, skip_special_tokens=True) == s
    assert "n't" in " ".join(sentences) and '"' in " ".join(sentences)


def test_smoke_preset_builds_the_specified_bart(tmp_path: Path) -> None:
    path = build_model("smoke", out_dir=tmp_path, texts=SENTENCES, vocab_size=300)
    scorer = Seq2SeqScorer.from_pretrained(path)
    c = scorer.model.config
    got = (
        c.d_model,
        c.encoder_layers,
        c.decoder_layers,
        c.encoder_attention_heads,
        c.decoder_attention_heads,
        c.encoder_ffn_dim,
        c.decoder_ffn_dim,
        c.dropout,
        c.max_position_embeddings,
    )
    assert got == (128, 2, 2, 4, 4, 256, 256, 0.1, 128)
    assert c.vocab_size == len(scorer.tokenizer)


def test_paper_presets_are_configs_without_download() -> None:
    assert {"smoke", "gec_pd", "gec_bart"} <= set(PRESETS)
    c = preset_config("gec_pd", vocab_size=8000)
    got = (c.d_model, c.encoder_layers, c.decoder_layers, c.encoder_attention_heads, c.encoder_ffn_dim, c.dropout)
    assert got == (1024, 6, 6, 16, 4096, 0.3) and c.activation_function == "relu"
    assert PRESETS["gec_bart"].pretrained == "facebook/bart-large"
    with pytest.raises(UserError, match="model.preset"):
        build_model("tiny", out_dir="unused")
    with pytest.raises(UserError, match="training sentences"):
        build_model("smoke", out_dir="unused")
    with pytest.raises(UserError, match="d_mode"):
        preset_config("smoke", vocab_size=10, d_mode=3)


def test_sequence_scores_are_summed_token_log_probs(scorer: Seq2SeqScorer) -> None:
    sources, targets = SENTENCES[:4], ["He does n't like it .", "This is a sentence .", "I went .", SENTENCES[3]]
    x = scorer.tokenize(sources, targets, max_length=64)
    assert x.target_ids is not None and x.prev_output_ids is not None
    assert bool((x.prev_output_ids[:, 0] == scorer.model.config.decoder_start_token_id).all())
    assert torch.equal(x.prev_output_ids[:, 1:], x.target_ids[:, :-1])
    with torch.no_grad():
        got = scorer.sequence_scores(x.src_ids, x.src_mask, x.prev_output_ids, x.target_ids)
        unmasked = scorer.log_probs(x.src_ids, x.src_mask, x.prev_output_ids)  # no decoder padding mask
        masked = scorer.log_probs(x.src_ids, x.src_mask, x.prev_output_ids, x.target_ids)
    for i, (s, t) in enumerate(zip(sources, targets, strict=True)):
        assert got[i].item() == pytest.approx(_naive_score(scorer, s, t), rel=1e-9)
    real = x.target_ids.ne(scorer.pad_id)
    assert torch.allclose(unmasked[real], masked[real], atol=1e-9)
    assert scorer.score_texts(sources, targets, batch_size=3) == pytest.approx(got.tolist(), rel=1e-9)


def test_save_and_reload_keep_scores(scorer: Seq2SeqScorer, tmp_path: Path) -> None:
    scorer.save_pretrained(tmp_path)
    again = Seq2SeqScorer.from_pretrained(tmp_path).eval()
    again.model.double()
    a = scorer.score_texts(SENTENCES[:3], SENTENCES[1:4])
    assert again.score_texts(SENTENCES[:3], SENTENCES[1:4]) == pytest.approx(a, rel=1e-9)


def _naive_ids_score(scorer: Seq2SeqScorer, source: str, target_ids: list[int]) -> float:
    src = scorer.tokenizer(source)["input_ids"]
    dec = [scorer.model.config.decoder_start_token_id] + target_ids[:-1]
    with torch.no_grad():
        logits = scorer.model(input_ids=torch.tensor([src]), decoder_input_ids=torch.tensor([dec])).logits[0]
    lp = torch.log_softmax(logits, dim=-1)
    return sum(lp[t, y].item() for t, y in enumerate(target_ids))


@pytest.mark.parametrize("beam", [4, 1])
def test_one_pass_scores_are_teacher_forced_scores_of_the_decoded_tokens(scorer: Seq2SeqScorer, beam: int) -> None:
    # hypotheses long enough to hit the length limit: cut there, without a forced </s>, and scored as they are
    sources = [SENTENCES[5], SENTENCES[0], SENTENCES[9]]
    for max_new in (6, 30):
        texts, scores, ids, _ = scorer._beam(sources, Decoding(beam, beam, max_len_b=max_new), 64)
        assert len(texts) == len(scores) == len(ids) == 3 * beam
        bos, eos = scorer.tokenizer.bos_token_id, scorer.tokenizer.eos_token_id
        for n, (score, tokens) in enumerate(zip(scores, ids, strict=True)):
            assert tokens[0] == bos and (tokens[-1] == eos or len(tokens) == max_new) and len(tokens) <= max_new
            # HF's search keeps log-probs in fp32 (the naive reference runs this fp64 model in fp64)
            assert score == pytest.approx(_naive_ids_score(scorer, sources[n // beam], tokens), rel=1e-6)


def test_generate_scores_are_summed_log_probs_in_input_order(scorer: Seq2SeqScorer, monkeypatch) -> None:
    sources = [SENTENCES[5], SENTENCES[0], SENTENCES[9], SENTENCES[2]]  # mixed lengths: bucketed, then restored

    def second_pass(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("generate must not score its hypotheses with a second forward")

    bias = scorer.model.final_logits_bias  # (1, V): an untrained model that ends its hypotheses before the bound,
    saved = bias.clone()  # so that texts re-tokenise to their tokens
    with torch.no_grad():
        bias[0, scorer.tokenizer.eos_token_id] += 4.0
    try:
        _check_generate_scores(scorer, sources, second_pass, monkeypatch)
    finally:
        with torch.no_grad():
            bias.copy_(saved)


def _check_generate_scores(scorer: Seq2SeqScorer, sources: list[str], second_pass: object, monkeypatch) -> None:  # noqa: ANN001
    scorer.train()
    with monkeypatch.context() as m:
        m.setattr(scorer, "log_probs", second_pass)
        out = scorer.generate(sources, num_beams=4, num_return_sequences=3, max_new_tokens=12, batch_size=2)
    assert scorer.training  # the previous mode comes back
    scorer.eval()
    assert [len(o) for o in out] == [3, 3, 3, 3]
    checked = 0
    for src, hyps in zip(sources, out, strict=True):
        scores = [s for _, s in hyps]
        assert scores == sorted(scores, reverse=True)
        texts, beam_scores, ids, _ = scorer._beam([src], Decoding(4, 3, max_len_b=12), 64)
        assert sorted(beam_scores, reverse=True) == pytest.approx(scores, rel=1e-9)
        for text, score, tokens in zip(texts, beam_scores, ids, strict=True):
            if scorer.tokenizer(text)["input_ids"] == tokens:  # the text re-tokenises to the decoded tokens
                assert score == pytest.approx(_naive_score(scorer, src, text), rel=1e-6)
                checked += 1
    assert checked >= 4
    one_by_one = [scorer.generate([s], num_beams=4, num_return_sequences=3, max_new_tokens=12)[0] for s in sources]
    assert [[t for t, _ in o] for o in out] == [[t for t, _ in o] for o in one_by_one]


def test_a_transformers_without_beam_indices_is_refused(scorer: Seq2SeqScorer, monkeypatch) -> None:  # noqa: ANN001
    """Before its vectorised beam search (4.50), HF returned ``beam_indices`` only with ``output_scores``: the
    one-pass scores would be summed along the wrong rows, silently."""
    generate = scorer.model.generate

    def old_generate(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = generate(*args, **kwargs)
        out.beam_indices = None
        return out

    monkeypatch.setattr(scorer.model, "generate", old_generate)
    with pytest.raises(RuntimeError, match="beam_indices"):
        scorer.generate(SENTENCES[:2], num_beams=3, num_return_sequences=2, max_new_tokens=6)


def test_the_models_generation_config_changes_nothing(scorer: Seq2SeqScorer, monkeypatch) -> None:  # noqa: ANN001
    """Every search setting is raycl's (raycl.models.decoding): a checkpoint's generation_config (BART-large ships
    n-gram blocking, forced tokens, a beam of 4; others a repetition penalty, a minimum length, banned tokens) does
    not reach the search, so HF finds what CTranslate2 finds."""
    from transformers import GenerationConfig

    sources = SENTENCES[:4]
    clean = scorer.generate(sources, num_beams=3, num_return_sequences=3, max_new_tokens=10)
    eos = scorer.tokenizer.eos_token_id
    busy = GenerationConfig(
        **{
            **scorer.model.generation_config.to_dict(),
            "repetition_penalty": 3.0,
            "no_repeat_ngram_size": 1,
            "min_length": 8,
            "min_new_tokens": 8,
            "num_beams": 4,
            "bad_words_ids": [[5], [6]],
            "suppress_tokens": [7, 8],
            "begin_suppress_tokens": [9],
            "forced_bos_token_id": 10,
            "forced_eos_token_id": eos,
            "length_penalty": 2.0,
            "encoder_repetition_penalty": 2.0,
        }
    )
    monkeypatch.setattr(scorer.model, "generation_config", busy)
    assert scorer.generate(sources, num_beams=3, num_return_sequences=3, max_new_tokens=10) == clean
    assert scorer.model.generation_config is busy  # put back


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_training_logits_equal_the_models_own_masking(scorer: Seq2SeqScorer, attention: str) -> None:
    """The prepared 4-D source mask (no read-back to decide whether to skip it) and no decoder mask give the
    logits of the model's own masking at every real target position, for SDPA and eager attention."""
    sources, targets = SENTENCES[:4], ["He does n't like it .", "I went .", SENTENCES[2], SENTENCES[3]]
    x = scorer.tokenize(sources, targets, max_length=64)  # padded sources and targets
    assert x.prev_output_ids is not None and x.target_ids is not None
    scorer.model.set_attn_implementation(attention)
    try:
        with torch.no_grad():
            dec_mask = x.target_ids.ne(scorer.pad_id).long()  # HF's own decoder padding mask
            want = scorer.model(
                input_ids=x.src_ids,
                attention_mask=x.src_mask,
                decoder_input_ids=x.prev_output_ids,
                decoder_attention_mask=dec_mask,
            ).logits
            prepared = scorer.logits(x.src_ids, x.src_mask, x.prev_output_ids, src_padded=True)  # a 4-D mask
            n = int(x.src_mask[0].sum())  # sentence 0 alone, trimmed: no padding, no mask at all
            one = scorer.logits(x.src_ids[:1, :n], None, x.prev_output_ids[:1], src_padded=False)
            alone = scorer.model(input_ids=x.src_ids[:1, :n], decoder_input_ids=x.prev_output_ids[:1]).logits
    finally:
        scorer.model.set_attn_implementation("sdpa")
    real = x.target_ids.ne(scorer.pad_id)  # (B, T) pads' outputs are never scored
    torch.testing.assert_close(prepared[real], want[real], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(one[:, real[0]], alone[:, real[0]], rtol=1e-9, atol=1e-9)
    assert bool(x.src_mask.eq(0).any())  # the batch did hold padding
