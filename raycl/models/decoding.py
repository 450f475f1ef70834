"""How the GEC engines decode, in one place for both (HF ``generate`` and CTranslate2's ``translate_batch``).

Both engines find the same n-best lists only when every rule of the search is the same; each engine's defaults
differ (and HF's come partly from the model's ``generation_config``: BART-large ships ``no_repeat_ngram_size 3``,
forced ``<s>``/``</s>``, a beam of 4), so every setting that shapes the search is written here, for both:

- beam search of ``num_beams``, ``num_return`` hypotheses, stopped when ``num_beams`` hypotheses have ended (HF
  ``early_stopping=True``, CTranslate2 ``patience=1``), ranked by the summed log-prob over the length (length
  penalty 1); no sampling, no n-gram blocking, no repetition or coverage penalty, no suppressed or banned tokens,
  no prefix bias, no forced ``</s>``;
- the first decoded token is ``<s>`` when the tokenizer starts its sentences with it (BART), forced; the end token
  is not allowed at the first free step after it (an empty correction is never a negative);
- length: fairseq's bound, ``max_len_a · source tokens + max_len_b`` tokens decoded after the decoder's start
  token (``<s>`` and ``</s>`` included), capped by the model's positions; a hypothesis that has not ended within
  its bound is *cut*, and ``drop_cut`` leaves it out (a miner never takes a truncated sentence as a negative);
- S(t|s), each hypothesis's score, is the sum of its tokens' log-probs, the forced ``<s>``'s included, as teacher
  forcing (``score_texts``) counts it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

MAX_LEN_A, MAX_LEN_B = 0.0, 200  # fairseq's defaults (``--max-len-a 0 --max-len-b 200``)
# what runs a beam search (``mining.engine``); the rule that picks one: raycl.models.engines.choose_engine
ENGINES = ("auto", "hf", "ctranslate2")


@dataclass(frozen=True)
class Decoding:
    """One beam search's settings (the rest is fixed, above)."""

    num_beams: int
    num_return: int = 1
    max_len_a: float = MAX_LEN_A
    max_len_b: int = MAX_LEN_B
    drop_cut: bool = False  # leave out hypotheses cut at the length bound (mining); kept for evaluation

    def limit(self, source_tokens: int, max_positions: int) -> int:
        """Tokens a hypothesis of a source of ``source_tokens`` tokens may take, ``</s>`` included."""
        return max(1, min(int(self.max_len_a * source_tokens + self.max_len_b), max_positions - 1))


def hf_generation_config(
    d: Decoding, *, steps: int, start_id: int, eos_id: int | None, pad_id: int, bos_id: int | None
) -> Any:
    """The whole ``GenerationConfig`` of HF's search (used *instead of* the model's: nothing inherited); ``<s>``
    is forced and ``</s>`` banned at the first free step by raycl's own logits processor."""
    from transformers import GenerationConfig

    return GenerationConfig(
        num_beams=d.num_beams,
        num_return_sequences=d.num_return,
        max_new_tokens=steps,
        min_length=0,
        do_sample=False,
        early_stopping=d.num_beams > 1,
        length_penalty=1.0,
        no_repeat_ngram_size=0,
        encoder_no_repeat_ngram_size=0,
        repetition_penalty=1.0,
        encoder_repetition_penalty=1.0,
        bad_words_ids=None,
        suppress_tokens=None,
        begin_suppress_tokens=None,
        forced_bos_token_id=None,
        forced_eos_token_id=None,
        exponential_decay_length_penalty=None,
        sequence_bias=None,
        renormalize_logits=False,
        remove_invalid_values=False,
        decoder_start_token_id=start_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        use_cache=True,
        return_dict_in_generate=True,
    )


@contextmanager
def only_config(model: Any, config: Any) -> Iterator[None]:
    """``model.generation_config`` is ``config`` for the duration: HF fills what a ``generate`` call leaves unset
    from the model's own config, so the model's is swapped out rather than overridden key by key."""
    saved = model.generation_config
    model.generation_config = config
    try:
        yield
    finally:
        model.generation_config = saved


def ct2_options(d: Decoding, *, steps: int, prefix_tokens: int, batch_size: int) -> dict[str, Any]:
    """``translate_batch``'s keyword arguments for the same search (its limits count the prefix, as HF's do)."""
    return dict(
        max_batch_size=batch_size,
        beam_size=d.num_beams,
        num_hypotheses=d.num_return,
        patience=1.0,
        length_penalty=1.0,
        coverage_penalty=0.0,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        disable_unk=False,
        suppress_sequences=None,
        prefix_bias_beta=0.0,
        max_input_length=0,
        max_decoding_length=steps,
        min_decoding_length=prefix_tokens + 1,
        sampling_topk=1,
        sampling_temperature=1.0,
        use_vmap=False,
        return_scores=True,
        return_end_token=True,
    )


def keep(tokens: list[Any], *, eos: Any, limit: int, drop_cut: bool) -> bool:
    """Whether a hypothesis (its tokens after the start token) is returned: it ended within ``limit``, or cut
    ones are kept."""
    return not drop_cut or (bool(tokens) and tokens[-1] == eos and len(tokens) <= limit)
