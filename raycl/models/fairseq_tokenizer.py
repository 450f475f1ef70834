"""The preprocessing of a fairseq GEC model, as a Hugging Face tokenizer: whitespace-tokenised text, subword-nmt
BPE (``@@`` continuations), the fairseq dictionary's ids (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3, then the
file's symbols; anything else is ``<unk>``), ``</s>`` after every sentence.

subword-nmt applies its merges to each word with ``</w>`` on its last character, lowest rank first, whatever the
dictionary holds; a piece the dictionary lacks becomes ``<unk>``, as in ``fairseq-preprocess``. (A ``tokenizers``
BPE cannot express this: it needs every merge's pieces in its vocabulary.) Written by ``raycl.convert`` as
``dict.txt`` + ``bpe.codes`` beside the model; :meth:`raycl.models.seq2seq.Seq2SeqScorer.from_pretrained` loads it.
"""

from __future__ import annotations

import json
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizer

DICT_FILE, CODES_FILE, MARKER = "dict.txt", "bpe.codes", "fairseq_tokenizer.json"
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")


def is_fairseq_folder(path: str | Path) -> bool:
    return (Path(path) / MARKER).is_file()


class FairseqBPETokenizer(PreTrainedTokenizer):
    """subword-nmt BPE over whitespace tokens with a fairseq dictionary."""

    vocab_files_names = {"dict_file": DICT_FILE, "codes_file": CODES_FILE}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, dict_file: str, codes_file: str, **kwargs: Any) -> None:
        symbols = list(SPECIALS) + [
            ln.split(" ")[0]
            for ln in Path(dict_file).read_text("utf-8").splitlines()
            if ln.split(" ")[0] not in SPECIALS
        ]
        self.symbols = symbols
        self.ids = {s: i for i, s in enumerate(symbols)}
        lines = Path(codes_file).read_text("utf-8").splitlines()
        merges = [tuple(ln.split()[:2]) for ln in lines if ln and not ln.startswith("#version")]
        self.ranks = {m: i for i, m in enumerate(merges)}
        self.dict_file, self.codes_file = dict_file, codes_file
        self._bpe = lru_cache(maxsize=100_000)(self._bpe_word)
        kwargs = {"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>", **kwargs}
        super().__init__(**kwargs)

    @property
    def vocab_size(self) -> int:
        return len(self.symbols)

    def get_vocab(self) -> dict[str, int]:
        return dict(self.ids)

    def _bpe_word(self, word: str) -> tuple[str, ...]:
        """subword-nmt's ``encode``: merge the lowest-ranked adjacent pair until none applies."""
        parts = [*word[:-1], word[-1] + "</w>"]
        while len(parts) > 1:
            none = len(self.ranks)
            adjacent = zip(parts, parts[1:], strict=False)
            pairs = [(self.ranks.get((a, b), none), i) for i, (a, b) in enumerate(adjacent)]
            rank, i = min(pairs)
            if rank == none:
                break
            a, b = parts[i], parts[i + 1]
            merged, j = [], 0
            while j < len(parts):  # every occurrence of the pair, left to right
                if j + 1 < len(parts) and parts[j] == a and parts[j + 1] == b:
                    merged.append(a + b)
                    j += 2
                else:
                    merged.append(parts[j])
                    j += 1
            parts = merged
        # fairseq's form: continued pieces carry "@@", the word's last piece does not
        return tuple(p[:-4] if p.endswith("</w>") else p + "@@" for p in parts)

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        return [piece for word in text.split() for piece in self._bpe(word)]

    def _convert_token_to_id(self, token: str) -> int:
        return self.ids.get(token, 3)

    def _convert_id_to_token(self, index: int) -> str:
        return self.symbols[index] if 0 <= index < len(self.symbols) else "<unk>"

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return " ".join(tokens).replace("@@ ", "").removesuffix("@@").strip()

    def build_inputs_with_special_tokens(
        self, token_ids_0: list[int], token_ids_1: list[int] | None = None
    ) -> list[int]:
        out = token_ids_0 + [self.eos_token_id]
        return out if token_ids_1 is None else out + token_ids_1 + [self.eos_token_id]

    def get_special_tokens_mask(
        self,
        token_ids_0: list[int],
        token_ids_1: list[int] | None = None,
        already_has_special_tokens: bool = False,
    ) -> list[int]:
        if already_has_special_tokens:
            return [int(i in (0, 1, 2, 3)) for i in token_ids_0]
        mask = [0] * len(token_ids_0) + [1]
        return mask if token_ids_1 is None else mask + [0] * len(token_ids_1) + [1]

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, str]:
        out = Path(save_directory)
        for src, name in ((self.dict_file, DICT_FILE), (self.codes_file, CODES_FILE)):
            if Path(src).resolve() != (out / name).resolve():
                shutil.copyfile(src, out / name)
        (out / MARKER).write_text(
            json.dumps({"tokenizer": "FairseqBPETokenizer", "dict": DICT_FILE, "codes": CODES_FILE}) + "\n"
        )
        return str(out / DICT_FILE), str(out / CODES_FILE)

    @classmethod
    def from_folder(cls, path: str | Path, **kwargs: Any) -> FairseqBPETokenizer:
        folder = Path(path)
        return cls(str(folder / DICT_FILE), str(folder / CODES_FILE), **kwargs)
