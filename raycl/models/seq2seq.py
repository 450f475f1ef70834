"""A sequence scorer over any HF encoder-decoder: S(t|s) = Σ_t log p(t_t | t_<t, s), summed, not averaged.

This is the score of Cao et al. (2021) as their fairseq criterion computes it (SPEC §1.2): raw token
log-probs of the target (no label smoothing), **summed** over the target tokens, pads zeroed, EOS included.
Targets are the tokenizer's ids (for BART: ``<s> … </s>``); the decoder input is the target shifted right
with the model's ``decoder_start_token_id`` (teacher forcing), the convention HF BART is fine-tuned with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True)
class Seq2SeqInputs:
    """Tokenised, right-padded sources and (optionally) targets."""

    src_ids: Tensor  # (B, S)
    src_mask: Tensor  # (B, S) 1 = real token
    target_ids: Tensor | None = None  # (B, T) pad-filled
    prev_output_ids: Tensor | None = None  # (B, T) target shifted right


def sum_target_log_probs(lprobs: Tensor, target_ids: Tensor, *, pad_id: int) -> Tensor:
    """S = Σ_t lprobs[b, t, target[b, t]] over non-pad t: (B, T, V), (B, T) -> (B,)."""
    token_lp = lprobs.gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)  # (B, T)
    return token_lp.masked_fill(target_ids.eq(pad_id), 0.0).sum(-1)  # (B,)


class Seq2SeqScorer(nn.Module):
    """Wraps ``model`` (any ``AutoModelForSeq2SeqLM``) and its tokenizer: teacher-forced scores + beam search."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer needs a pad token")
        self.pad_id: int = int(tokenizer.pad_token_id)
        start = model.config.decoder_start_token_id
        self.decoder_start_id: int = int(start if start is not None else tokenizer.eos_token_id)

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, *, device: str | torch.device = "cpu") -> Seq2SeqScorer:
        from raycl.models.fairseq_tokenizer import FairseqBPETokenizer, is_fairseq_folder

        # a fairseq model converted by raycl.convert carries its own BPE (subword-nmt over whitespace tokens)
        tokenizer = (FairseqBPETokenizer.from_folder(name_or_path) if is_fairseq_folder(name_or_path)
                     else AutoTokenizer.from_pretrained(str(name_or_path)))  # fmt: skip
        model = AutoModelForSeq2SeqLM.from_pretrained(str(name_or_path))
        return cls(model, tokenizer).to(device)

    def save_pretrained(self, out_dir: str | Path) -> Path:
        self.model.save_pretrained(str(out_dir))
        self.tokenizer.save_pretrained(str(out_dir))
        return Path(out_dir)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def max_positions(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", None) or 1024)

    def shift_right(self, target_ids: Tensor) -> Tensor:
        """Decoder input for teacher forcing: ``[start, t_0, …, t_{T-2}]`` (B, T) -> (B, T)."""
        prev = target_ids.new_full(target_ids.shape, self.pad_id)  # (B, T)
        prev[..., 1:] = target_ids[..., :-1]
        prev[..., 0] = self.decoder_start_id
        return prev

    def encode_texts(self, texts: list[str], *, max_length: int) -> Tensor:
        """Right-padded token ids of ``texts`` with the tokenizer's special tokens: (N, L)."""
        enc = self.tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        return enc["input_ids"].to(self.device)

    def tokenize(self, sources: list[str], targets: list[str] | None = None, *, max_length: int) -> Seq2SeqInputs:
        enc = self.tokenizer(sources, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        src_ids, src_mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
        if targets is None:
            return Seq2SeqInputs(src_ids, src_mask)
        target_ids = self.encode_texts(targets, max_length=max_length)  # (B, T)
        return Seq2SeqInputs(src_ids, src_mask, target_ids, self.shift_right(target_ids))

    def log_probs(
        self, src_ids: Tensor, src_mask: Tensor, prev_output_ids: Tensor, target_ids: Tensor | None = None
    ) -> Tensor:
        """Teacher-forced log-softmax over the vocabulary: (B, S), (B, S), (B, T) -> (B, T, V).

        ``target_ids`` only marks the padded decoder positions; right padding cannot change the real
        positions under causal attention, so passing it or not gives the same values there.
        """
        dec_mask = None
        if target_ids is not None:
            dec_mask = torch.ones_like(target_ids)  # (B, T) decoder position t holds target t-1
            dec_mask[..., 1:] = target_ids[..., :-1].ne(self.pad_id)
        out = self.model(
            input_ids=src_ids,
            attention_mask=src_mask,
            decoder_input_ids=prev_output_ids,
            decoder_attention_mask=dec_mask,
            use_cache=False,
        )
        logits = out.logits  # (B, T, V)
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()  # sums over many tokens need fp32 log-probs
        return F.log_softmax(logits, dim=-1)  # (B, T, V)

    def sequence_scores(
        self, src_ids: Tensor, src_mask: Tensor, prev_output_ids: Tensor, target_ids: Tensor
    ) -> Tensor:
        """S(t|s): summed target-token log-probs, pads zeroed, EOS included (SPEC §1.2) -> (B,)."""
        lprobs = self.log_probs(src_ids, src_mask, prev_output_ids, target_ids)  # (B, T, V)
        return sum_target_log_probs(lprobs, target_ids, pad_id=self.pad_id)  # (B,)

    @torch.no_grad()
    def score_texts(
        self, sources: list[str], targets: list[str], *, max_length: int | None = None, batch_size: int = 32
    ) -> list[float]:
        """S(target_i | source_i) for each pair, in the current train/eval mode, without gradients."""
        max_length = max_length or self.max_positions
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]) + len(targets[i]))  # length buckets
        scores = [0.0] * len(sources)
        for lo in range(0, len(order), batch_size):
            idx = order[lo : lo + batch_size]
            x = self.tokenize([sources[i] for i in idx], [targets[i] for i in idx], max_length=max_length)
            assert x.prev_output_ids is not None and x.target_ids is not None
            batch_scores = self.sequence_scores(x.src_ids, x.src_mask, x.prev_output_ids, x.target_ids)  # (b,)
            for i, s in zip(idx, batch_scores.tolist(), strict=True):
                scores[i] = s
        return scores

    def generate(
        self,
        sources: list[str],
        *,
        num_beams: int,
        num_return_sequences: int = 1,
        max_new_tokens: int = 128,
        batch_size: int = 32,
        max_length: int | None = None,
        rank_by: str = "sum_logprob",
    ) -> list[list[tuple[str, float]]]:
        """Beam search: per source, ``num_return_sequences`` ``(text, S(text|source))``, best first.

        HF ranks beams by a length-normalised score (``rank_by="beam"`` keeps that order); the returned score is
        recomputed as the summed log-prob of the decoded text re-tokenised, so it is exactly the S(t|s) the loss
        sees for it (``rank_by="sum_logprob"`` orders by it).
        Runs in eval mode (restoring the previous mode) and batches sources of similar length together.
        """
        max_length = max_length or self.max_positions
        order = sorted(range(len(sources)), key=lambda i: len(sources[i].split()))  # length buckets
        results: list[list[tuple[str, float]]] = [[] for _ in sources]
        was_training = self.training
        self.eval()
        try:
            for lo in range(0, len(order), batch_size):
                idx = order[lo : lo + batch_size]
                batch = [sources[i] for i in idx]
                texts = self._beam_texts(batch, num_beams, num_return_sequences, max_new_tokens, max_length)
                repeated = [s for s in batch for _ in range(num_return_sequences)]
                scores = self.score_texts(repeated, texts, max_length=max_length, batch_size=len(texts))
                hyps = list(zip(texts, scores, strict=True))
                for n, i in enumerate(idx):
                    mine = hyps[n * num_return_sequences : (n + 1) * num_return_sequences]
                    results[i] = mine if rank_by == "beam" else sorted(mine, key=lambda h: -h[1])
        finally:
            self.train(was_training)
        return results

    @torch.no_grad()
    def _beam_texts(
        self, sources: list[str], num_beams: int, num_return: int, max_new_tokens: int, max_length: int
    ) -> list[str]:
        x = self.tokenize(sources, max_length=max_length)
        bos = self.tokenizer.bos_token_id
        # Targets start with <s> when the tokenizer adds one (BART); force it so hypotheses look like targets.
        adds_bos = bos is not None and self.tokenizer("a")["input_ids"][0] == bos
        seqs = self.model.generate(  # type: ignore[operator]
            input_ids=x.src_ids,
            attention_mask=x.src_mask,
            num_beams=num_beams,
            num_return_sequences=num_return,
            max_new_tokens=min(max_new_tokens, self.max_positions - 1),
            do_sample=False,
            early_stopping=num_beams > 1,  # a beam flag; greedy decoding warns about it
            length_penalty=1.0,
            no_repeat_ngram_size=0,  # facebook/bart-large ships 3; fairseq's GEC decoding uses none
            forced_bos_token_id=bos if adds_bos else None,
            decoder_start_token_id=self.decoder_start_id,
        )  # (B * num_return, L)
        return [" ".join(t.split()) for t in self.tokenizer.batch_decode(seqs, skip_special_tokens=True)]
