"""A byte-level BPE tokenizer trained locally, with BART's special tokens (no download needed).

The ids of the special tokens are BART's (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3, ``<mask>`` 4), so
a model config with BART's defaults fits it, and every encoded sentence is ``<s> … </s>`` like BART's.
Decoding round-trips whitespace-tokenised (M2-style) text exactly: byte-level BPE is lossless and the HF
"clean up tokenization spaces" pass, which would glue ``do n't`` into ``don't``, is switched off.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")  # ids 0..4, as in BART


def train_bpe_tokenizer(
    texts: Iterable[str], out_dir: str | Path, *, vocab_size: int = 1000, model_max_length: int = 1024
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``texts``, save it to ``out_dir`` and return it (loadable by AutoTokenizer)."""
    backend = Tokenizer(models.BPE())
    # No prefix space: the first word is encoded without a leading "Ġ", exactly like BART's GPT-2 BPE.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte stays encodable: no <unk> at test time
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer)
    bos, eos = backend.token_to_id("<s>"), backend.token_to_id("</s>")
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", bos), ("</s>", eos)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        mask_token="<mask>",
        cls_token="<s>",
        sep_token="</s>",
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer
