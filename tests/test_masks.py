"""Padding masks handed to Hugging Face encoders in their attention's own form (``raycl.models.masks``): the same
outputs as the 2-D mask the model would expand itself (SDPA and eager attention, BERT and RoBERTa/XLM-R), none at
all where a batch has no padding — and nothing read back from the device, where the 2-D mask costs a sync."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertModel, RobertaConfig, RobertaForSequenceClassification

from raycl.models.masks import attention_mask, prepared
from raycl.training.counting import count_ops

SMALL = dict(
    vocab_size=50,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=40,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


def _models(attn: str) -> list[torch.nn.Module]:
    torch.manual_seed(0)
    bert = BertModel(BertConfig(**SMALL, attn_implementation=attn), add_pooling_layer=False).eval()
    roberta = RobertaForSequenceClassification(RobertaConfig(**SMALL, pad_token_id=1, attn_implementation=attn))
    return [bert, roberta.eval()]


def _out(model: torch.nn.Module, **inputs: torch.Tensor) -> torch.Tensor:
    out = model(**inputs)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_prepared_mask_gives_the_models_own_masked_outputs(attn: str) -> None:
    ids = torch.randint(3, 50, (3, 7))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[0, 4:], mask[2, 6:] = 0, 0
    ids[mask == 0] = 1
    for model in _models(attn):
        expected = _out(model, input_ids=ids, attention_mask=mask)
        got = _out(model, **prepared({"input_ids": ids, "attention_mask": mask}, model))
        real = mask.bool() if got.dim() == 3 else torch.ones(3, dtype=torch.bool)
        torch.testing.assert_close(got[real], expected[real], rtol=1e-5, atol=1e-6)
        assert attention_mask(mask, model).shape == (3, 1, 1, 7)


def test_no_padding_no_mask_and_nothing_read_back() -> None:
    ids = torch.randint(3, 50, (2, 5))
    full = {"input_ids": ids, "attention_mask": torch.ones(2, 5, dtype=torch.long)}
    for model in _models("sdpa"):
        assert "attention_mask" not in prepared(full, model)
        torch.testing.assert_close(_out(model, **prepared(full, model)), _out(model, **full))
        mask = full["attention_mask"].clone()
        mask[0, 3:] = 0
        with count_ops() as given:  # the model reads a 2-D mask back to decide whether it can skip it
            _out(model, input_ids=ids, attention_mask=mask)
        ready = prepared({"input_ids": ids, "attention_mask": mask}, model)
        with count_ops() as c:
            _out(model, **ready)
        assert given.syncs >= 1 and c.syncs == 0, (given.sync_sites, c.sync_sites)
