"""Byte-level BPE tokenizers trained locally (no download needed), with the special tokens of BART or of XLNet.

:data:`BART`: the ids of the special tokens are BART's (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3, ``<mask>``
4), so a model config with BART's defaults fits it, and every encoded sentence is ``<s> … </s>`` like BART's.
:data:`XLNET`: XLNet's ids (``<unk>`` 0 … ``<cls>`` 3, ``<sep>`` 4, ``<pad>`` 5) and XLNet's ``text <sep> <cls>``
input, padded on the left. Decoding round-trips whitespace-tokenised (M2-style) text exactly: byte-level BPE is
lossless and the HF "clean up tokenization spaces" pass, which would glue ``do n't`` into ``don't``, is off.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

if TYPE_CHECKING:  # transformers where used: a Tune trial's actor imports this module and needs none of it
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast


@dataclass(frozen=True)
class Layout:
    """A model family's special tokens (in id order), its input template and which token plays which role."""

    specials: tuple[str, ...]
    single: str  # the template of one text, $A the text
    pair: str  # of two texts
    roles: dict[str, str] = field(default_factory=dict)  # bos_token, eos_token, … → a special token
    padding_side: str = "right"


BART = Layout(
    ("<s>", "<pad>", "</s>", "<unk>", "<mask>"),
    single="<s> $A </s>",
    pair="<s> $A </s> </s> $B </s>",
    roles=dict(
        bos_token="<s>",
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        mask_token="<mask>",
        cls_token="<s>",
        sep_token="</s>",
    ),
)
XLNET = Layout(
    ("<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>"),
    single="$A <sep> <cls>",
    pair="$A <sep> $B <sep> <cls>",
    padding_side="left",
    roles=dict(
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<cls>",
        sep_token="<sep>",
        pad_token="<pad>",
        mask_token="<mask>",
    ),
)
SPECIAL_TOKENS = BART.specials  # ids 0..4, as in BART


def train_bpe_tokenizer(
    texts: Iterable[str],
    out_dir: str | Path,
    *,
    vocab_size: int = 1000,
    model_max_length: int = 1024,
    layout: Layout = BART,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``texts`` with ``layout``'s special tokens, save it to ``out_dir`` and return it
    (loadable by AutoTokenizer)."""
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    # No prefix space: the first word is encoded without a leading "Ġ", exactly like BART's GPT-2 BPE.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(layout.specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte stays encodable: no <unk> at test time
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer)
    used = {t for t in layout.specials if t in f"{layout.single} {layout.pair}"}
    backend.post_processor = processors.TemplateProcessing(
        single=layout.single, pair=layout.pair, special_tokens=[(t, backend.token_to_id(t)) for t in sorted(used)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        **layout.roles,
        padding_side=layout.padding_side,
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer of a model folder (or hub name), as ``AutoTokenizer`` reads it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
