"""A sequence scorer over any HF encoder-decoder: S(t|s) = Σ_t log p(t_t | t_<t, s), summed, not averaged.

This is the score of Cao et al. (2021) as their fairseq criterion computes it: raw token
log-probs of the target (no label smoothing), **summed** over the target tokens, pads zeroed, EOS included.
Targets are the tokenizer's ids (for BART: ``<s> … </s>``); the decoder input is the target shifted right
with the model's ``decoder_start_token_id`` (teacher forcing), the convention HF BART is fine-tuned with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raycl.losses.token_log_probs import TokenLogProbs, token_log_probs
from raycl.models.decoding import Decoding, hf_generation_config, keep, only_config
from raycl.models.masks import attention_mask

if TYPE_CHECKING:  # transformers where used: a Tune trial's actor imports this module and needs none of it
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


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
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        from raycl.models.fairseq_tokenizer import FairseqBPETokenizer, is_fairseq_folder

        # a fairseq model converted by raycl.convert carries its own BPE (subword-nmt over whitespace tokens)
        tokenizer = (
            FairseqBPETokenizer.from_folder(name_or_path)
            if is_fairseq_folder(name_or_path)
            else AutoTokenizer.from_pretrained(str(name_or_path))
        )
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

    @property
    def layerdrop(self) -> float:
        """The model's LayerDrop probability (0 for BART as released): one draw per layer and forward, shared by
        every row of that forward."""
        c = self.model.config
        return float(max(getattr(c, "encoder_layerdrop", 0.0) or 0.0, getattr(c, "decoder_layerdrop", 0.0) or 0.0))

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
        positions under causal attention, so passing it or not gives the same values there. Training scores
        tokens with :meth:`token_log_probs` instead, which keeps no (B, T, V) fp32 tensor for the backward.
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

    def logits(
        self, src_ids: Tensor, src_mask: Tensor | None, prev_output_ids: Tensor, *, src_padded: bool | None = None
    ) -> Tensor:
        """Teacher-forced logits: (R, S), (R, S), (R, T) -> (R, T, V), without a host-device sync of raycl's.

        ``src_padded`` says whether any source row holds padding, known on the CPU when the batch was collated:
        ``False`` passes no source mask (the model's mask helpers then skip it without reading it), ``True``
        passes the mask already expanded to the attention's 4-D form (the helpers take it as given, where they
        would read a 2-D mask on the device to decide whether it can be skipped: a sync), ``None`` passes the
        2-D ``src_mask`` as it is (the model decides). No decoder mask: targets are right-padded and the decoder
        is causal, so a real position never attends to a later pad; the pads' own outputs are never scored.
        Under autocast the logits are returned in the autocast dtype (a bias add may promote the half-precision
        head's output to fp32; for BART its bias is a zero buffer, so the values are the head's own).
        """
        mask = src_mask if src_padded is None else self._attention_mask(src_mask) if src_padded else None
        out = self.model(
            input_ids=src_ids, attention_mask=mask, decoder_input_ids=prev_output_ids, use_cache=False
        )
        logits = out.logits  # (R, T, V)
        kind = logits.device.type
        autocast = torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind)
        if autocast and logits.dtype == torch.float32:
            logits = logits.to(torch.get_autocast_dtype(kind))  # (R, T, V) kept for the backward in half
        return logits

    def _attention_mask(self, src_mask: Tensor | None) -> Tensor | None:
        """The source padding mask as the attention reads it (:func:`raycl.models.masks.attention_mask`): one
        (R, 1, 1, S) tensor serves the encoder's self-attention and the decoder's cross-attention."""
        return None if src_mask is None else attention_mask(src_mask, self.model)

    def token_log_probs(
        self,
        src_ids: Tensor,
        src_mask: Tensor | None,
        prev_output_ids: Tensor,
        target_ids: Tensor,
        *,
        src_padded: bool | None = None,
    ) -> TokenLogProbs:
        """Per target token, fp32 ``log p_y`` and ``Σ_v log p_v`` (pads not zeroed): (R, T) each.

        Memory-lean: what the backward keeps of the output layer is the logits in their own dtype and an (R, T)
        log-normaliser (:func:`raycl.losses.token_log_probs.token_log_probs`), no (R, T, V) log-softmax.
        """
        logits = self.logits(src_ids, src_mask, prev_output_ids, src_padded=src_padded)  # (R, T, V)
        return token_log_probs(logits, target_ids)

    def sequence_scores(
        self,
        src_ids: Tensor,
        src_mask: Tensor,
        prev_output_ids: Tensor,
        target_ids: Tensor,
        *,
        src_padded: bool | None = None,
    ) -> Tensor:
        """S(t|s): summed target-token log-probs, pads zeroed, EOS included, as the released criterion -> (B,)."""
        tok = self.token_log_probs(src_ids, src_mask, prev_output_ids, target_ids, src_padded=src_padded)
        return tok.target.masked_fill(target_ids.eq(self.pad_id), 0.0).sum(-1)  # (B,)

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
        max_len_a: float = 0.0,
        drop_cut: bool = False,
        batch_size: int = 32,
        max_length: int | None = None,
        rank_by: str = "sum_logprob",
    ) -> list[list[tuple[str, float]]]:
        """Beam search: per source, up to ``num_return_sequences`` ``(text, S(text|source))``, best first.

        The search is :mod:`raycl.models.decoding`'s (the model's ``generation_config`` is not used): hypotheses
        of at most ``max_len_a · source tokens + max_new_tokens`` tokens; ``drop_cut`` leaves out those that did
        not end within it. One decoding pass: each hypothesis's score is summed from the log-probs the beam search
        itself computed (:class:`_StepLogProbs`), the raw model log-probs of its tokens, EOS included, the forced
        ``<s>`` included — the S(t|s) of teacher forcing (``score_texts``) up to float rounding, with no second
        forward. HF ranks beams by a length-normalised score (``rank_by="beam"`` keeps that order); ``rank_by=
        "sum_logprob"`` orders by S. Runs in eval mode (restoring the previous mode) and batches sources of
        similar length together; memory per batch: the beam's own, plus ``(steps, rows, 3·beam)`` floats.
        """
        max_length = max_length or self.max_positions
        d = Decoding(num_beams, num_return_sequences, max_len_a, max_new_tokens, drop_cut)
        order = sorted(range(len(sources)), key=lambda i: len(sources[i].split()))  # length buckets
        results: list[list[tuple[str, float]]] = [[] for _ in sources]
        was_training = self.training
        self.eval()
        try:
            for lo in range(0, len(order), batch_size):
                idx = order[lo : lo + batch_size]
                texts, scores, ids, limits = self._beam([sources[i] for i in idx], d, max_length)
                eos = self.tokenizer.eos_token_id
                for n, i in enumerate(idx):
                    rows = range(n * num_return_sequences, (n + 1) * num_return_sequences)
                    mine = [
                        (texts[r], scores[r])
                        for r in rows
                        if keep(ids[r], eos=eos, limit=limits[n], drop_cut=drop_cut)
                    ]
                    results[i] = mine if rank_by == "beam" else sorted(mine, key=lambda h: -h[1])
        finally:
            self.train(was_training)
        return results

    @torch.no_grad()
    def _beam(
        self, sources: list[str], d: Decoding, max_length: int
    ) -> tuple[list[str], list[float], list[list[int]], list[int]]:
        """Texts, summed log-probs and token ids (``<s> … </s>``) of ``len(sources) × num_return`` hypotheses, in
        HF's order, and each source's length bound. The score is that of the ids; the text re-tokenised usually
        gives the same ids again."""
        import transformers
        from transformers import LogitsProcessorList

        x = self.tokenize(sources, max_length=max_length)
        bos, eos = self.tokenizer.bos_token_id, self.tokenizer.eos_token_id
        # Targets start with <s> when the tokenizer adds one (BART); force it so hypotheses look like targets.
        adds_bos = bos is not None and self.tokenizer("a")["input_ids"][0] == bos
        limits = [d.limit(int(n), self.max_positions) for n in x.src_mask.sum(1).tolist()]
        steps = max(limits)
        record = _StepLogProbs(
            keep=3 * d.num_beams,
            force_first=bos if adds_bos else None,
            ban_first_free=eos,
            logits=d.num_beams == 1,
        )  # greedy search hands processors logits, beam log-probs
        config = hf_generation_config(
            d, steps=steps, start_id=self.decoder_start_id, eos_id=eos, pad_id=self.pad_id, bos_id=bos
        )
        with only_config(self.model, config):
            out = self.model.generate(  # type: ignore[operator]
                input_ids=x.src_ids,
                attention_mask=x.src_mask,
                generation_config=config,
                logits_processor=LogitsProcessorList([record]),
            )
        seqs = out.sequences  # (N, 1 + steps): the start token, then the generated ones
        if d.num_beams > 1 and getattr(out, "beam_indices", None) is None:
            raise RuntimeError(
                f"transformers {transformers.__version__} returns no beam_indices without "
                "output_scores: one-pass scores need transformers >= 4.50 (vectorised beam search)"
            )
        scores = record.sequence_scores(
            seqs[:, 1:], getattr(out, "beam_indices", None), eos_id=eos, pad_id=self.pad_id
        )
        texts = [" ".join(t.split()) for t in self.tokenizer.batch_decode(seqs, skip_special_tokens=True)]
        ids = [_until_eos([t for t in row if t != self.pad_id], eos) for row in seqs[:, 1:].tolist()]
        return texts, scores.tolist(), ids, limits


def _until_eos(ids: list[int], eos: int | None) -> list[int]:
    return ids[: ids.index(eos) + 1] if eos in ids else ids


class _StepLogProbs:
    """A logits processor that keeps, per decoding step and beam row, the ``keep`` best raw log-probs.

    HF's beam search log-softmaxes the logits, runs the processors, then picks the top ``2·beam`` (+ one beam
    per EOS id) continuations over all rows: a token chosen from a row is among that row's top ``keep = 3·beam``,
    so the kept values hold every chosen token's log-prob and ``beam_indices`` say which row it came from.
    ``force_first``: the token forced at the first step (BART's ``<s>``); its raw log-prob is kept before it is
    forced, as teacher forcing scores it. (HF's own processor would run first and hide it.) ``ban_first_free``: the
    end token, not allowed at the first step after the forced one (:mod:`raycl.models.decoding`).
    ``logits``: the scores are raw logits (greedy search), log-softmaxed here before they are kept.
    """

    def __init__(
        self, *, keep: int, force_first: int | None, ban_first_free: int | None = None, logits: bool = False
    ) -> None:
        self.keep, self.force_first, self.ban_first_free, self.logits = keep, force_first, ban_first_free, logits
        self.values: list[Tensor] = []  # per step: (rows, keep)
        self.indices: list[Tensor] = []  # per step: (rows, keep)

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        lp = F.log_softmax(scores.float(), dim=-1) if self.logits else scores  # (rows, V)
        values, indices = lp.topk(min(self.keep, lp.shape[-1]), dim=-1)  # (rows, keep)
        step = len(self.values)
        first_free = 0 if self.force_first is None else 1
        if step == 0 and self.force_first is not None:  # keep the forced token's raw log-prob, then force it
            indices = torch.full_like(indices, -1)  # the forced token only (it may be among the top ones too)
            values[:, 0], indices[:, 0] = lp[:, self.force_first], self.force_first
            scores = torch.full_like(scores, -math.inf)
            scores[:, self.force_first] = 0.0
        elif step == first_free and self.ban_first_free is not None:  # no empty hypothesis (CTranslate2's rule)
            scores = scores.clone()
            scores[:, self.ban_first_free] = -math.inf
        self.values.append(values if values.dtype == torch.float64 else values.float())
        self.indices.append(indices)
        return scores

    def sequence_scores(
        self, tokens: Tensor, beam_indices: Tensor | None, *, eos_id: int | None, pad_id: int
    ) -> Tensor:
        """Σ over each hypothesis's generated tokens of their kept log-prob: (N, T) tokens -> (N,).

        ``beam_indices`` (N, ≤ T): the row each token was chosen from, −1 past the end (beam search); None for
        greedy search, where row n is hypothesis n up to its first EOS (then padding)."""
        steps = min(tokens.shape[1], len(self.values))
        tokens = tokens[:, :steps]  # (N, T)
        if beam_indices is None:
            n = torch.arange(tokens.shape[0], device=tokens.device)
            rows = n[:, None].expand(-1, steps)  # (N, T)
            ended = tokens.eq(eos_id if eos_id is not None else -1).long().cumsum(1)  # (N, T)
            valid = (ended - tokens.eq(eos_id if eos_id is not None else -1).long()).eq(0) & tokens.ne(pad_id)
        else:
            rows = beam_indices[:, :steps]  # (N, T)
            valid = rows.ge(0)
            rows = rows.clamp(min=0)
        values = torch.stack(self.values[:steps], 1)  # (R, T, keep)
        indices = torch.stack(self.indices[:steps], 1)  # (R, T, keep)
        t = torch.arange(steps, device=tokens.device)[None, :].expand_as(rows)  # (N, T)
        v, i = values[rows, t], indices[rows, t]  # (N, T, keep)
        hit = i.eq(tokens.unsqueeze(-1))  # (N, T, keep)
        token_lp = torch.where(hit, v, torch.zeros_like(v)).sum(-1)  # (N, T)
        token_lp = torch.where(hit.any(-1), token_lp, torch.full_like(token_lp, math.nan))  # never: see above
        return token_lp.masked_fill(~valid, 0.0).sum(-1)  # (N,)
