"""``raycl.convert fairseq-transformer``: a tiny checkpoint written here in fairseq's on-disk format (a torch-saved
dict of ``args``/``cfg`` and ``model`` tensors, ``dict.*.txt``, subword-nmt codes) becomes a Hugging Face folder
whose summed log-probs equal an independent fairseq-transformer forward written here from the raw tensors, and
whose tokenizer reproduces the preprocessing (whitespace tokens, BPE with ``@@``, the dictionary's ids)."""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from raycl.models.fairseq_convert import convert_fairseq_transformer
from raycl.models.seq2seq import Seq2SeqScorer

D, HEADS, FFN, LAYERS, ROWS = 16, 2, 32, 2, 16  # 10 symbols, padded to 16 rows as fairseq does
DICT = "the 10\ncat@@ 5\ncat 5\ns 5\nsat 5\n. 10\n"  # ids: the 4, cat@@ 5, cat 6, s 7, sat 8, . 9
CODES = "#version: 0.2\nt h\nth e</w>\nc a\nca t</w>\ns a\nsa t</w>\nca t\n"


def _fairseq_state(seed: int, *, separate_output: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.3

    emb = rand(ROWS, D)
    sd: dict[str, torch.Tensor] = {
        "encoder.embed_tokens.weight": emb,
        "decoder.embed_tokens.weight": emb,
        "encoder.embed_positions._float_tensor": torch.zeros(1),
        "decoder.embed_positions._float_tensor": torch.zeros(1),
        "encoder.version": torch.tensor([3.0]),
        "decoder.version": torch.tensor([3.0]),
    }
    for side in ("encoder", "decoder"):
        for i in range(LAYERS):
            attns = ["self_attn", "encoder_attn"] if side == "decoder" else ["self_attn"]
            for att in attns:
                for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                    sd[f"{side}.layers.{i}.{att}.{proj}.weight"] = rand(D, D)
                    sd[f"{side}.layers.{i}.{att}.{proj}.bias"] = rand(D)
            for ln in (*(f"{a}_layer_norm" for a in attns), "final_layer_norm"):
                sd[f"{side}.layers.{i}.{ln}.weight"] = 1 + rand(D)
                sd[f"{side}.layers.{i}.{ln}.bias"] = rand(D)
            sd[f"{side}.layers.{i}.fc1.weight"], sd[f"{side}.layers.{i}.fc1.bias"] = rand(FFN, D), rand(FFN)
            sd[f"{side}.layers.{i}.fc2.weight"], sd[f"{side}.layers.{i}.fc2.bias"] = rand(D, FFN), rand(D)
    if separate_output:
        sd["decoder.output_projection.weight"] = rand(ROWS, D)
    return sd


ARGS = dict(
    arch="transformer_vaswani_wmt_en_de_big",
    encoder_attention_heads=HEADS,
    decoder_attention_heads=HEADS,
    encoder_embed_dim=D,
    decoder_embed_dim=D,
    share_all_embeddings=True,
    source_lang="src",
    target_lang="trg",
    dropout=0.3,
    attention_dropout=0.1,
    activation_fn="relu",
    max_source_positions=64,
    max_target_positions=64,
    encoder_normalize_before=False,
    decoder_normalize_before=False,
)


def _write(tmp: Path, *, cfg_style: bool = False, **over: object) -> tuple[Path, Path, Path]:
    state = _fairseq_state(0, separate_output=cfg_style)
    own_output = {"share_all_embeddings": False} if cfg_style else {}  # the cfg-style one: its own output matrix
    args = {**ARGS, **own_output, **over}
    ckpt = tmp / "checkpoint_best.pt"
    if cfg_style:  # fairseq ≥ 0.10: an omegaconf-like cfg with a model section
        torch.save({"cfg": {"model": args, "task": {"source_lang": "src"}}, "model": state}, ckpt)
    else:
        torch.save({"args": argparse.Namespace(**args), "model": state, "optimizer_history": []}, ckpt)
    dicts = tmp / "dicts"
    dicts.mkdir(exist_ok=True)
    for lang in ("src", "trg"):
        (dicts / f"dict.{lang}.txt").write_text(DICT)
    codes = tmp / "bpe.codes"
    codes.write_text(CODES)
    return ckpt, dicts, codes


# ---------------------------------------------------------------------------------------------- the reference
def _sinusoids(n: int, dim: int, padding_idx: int = 1) -> torch.Tensor:
    """fairseq's SinusoidalPositionalEmbedding.get_embedding: [sin ‖ cos], the padding row zero."""
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000) / (half - 1)))
    angles = torch.arange(n, dtype=torch.float).unsqueeze(1) * freq.unsqueeze(0)
    emb = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    emb[padding_idx] = 0
    return emb


def _attention(sd: dict, p: str, x: torch.Tensor, mem: torch.Tensor, *, causal: bool) -> torch.Tensor:
    hd = D // HEADS
    q = F.linear(x, sd[f"{p}.q_proj.weight"], sd[f"{p}.q_proj.bias"]) * hd**-0.5
    k = F.linear(mem, sd[f"{p}.k_proj.weight"], sd[f"{p}.k_proj.bias"])
    v = F.linear(mem, sd[f"{p}.v_proj.weight"], sd[f"{p}.v_proj.bias"])
    q, k, v = (t.view(t.size(0), HEADS, hd).transpose(0, 1) for t in (q, k, v))  # (H, T, hd)
    scores = q @ k.transpose(1, 2)  # (H, Tq, Tk)
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores[0]).triu(1).bool(), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(0, 1).reshape(x.size(0), D)
    return F.linear(out, sd[f"{p}.out_proj.weight"], sd[f"{p}.out_proj.bias"])


def _ln(sd: dict, p: str, x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (D,), sd[f"{p}.weight"], sd[f"{p}.bias"])


def _ffn(sd: dict, p: str, x: torch.Tensor) -> torch.Tensor:
    return F.linear(
        F.relu(F.linear(x, sd[f"{p}.fc1.weight"], sd[f"{p}.fc1.bias"])), sd[f"{p}.fc2.weight"], sd[f"{p}.fc2.bias"]
    )


def reference_score(sd: dict, src: list[int], tgt: list[int]) -> float:
    """Σ_t log p(tgt_t | tgt_<t, src) of fairseq's post-norm transformer; the decoder starts with </s> (2)."""
    pos = _sinusoids(64, D)

    def embed(ids: list[int]) -> torch.Tensor:  # positions from padding_idx + 1
        return math.sqrt(D) * sd["encoder.embed_tokens.weight"][ids] + pos[2 : 2 + len(ids)]

    x = embed(src)
    for i in range(LAYERS):
        p = f"encoder.layers.{i}"
        x = _ln(sd, f"{p}.self_attn_layer_norm", x + _attention(sd, f"{p}.self_attn", x, x, causal=False))
        x = _ln(sd, f"{p}.final_layer_norm", x + _ffn(sd, p, x))
    y = embed([2, *tgt[:-1]])
    for i in range(LAYERS):
        p = f"decoder.layers.{i}"
        y = _ln(sd, f"{p}.self_attn_layer_norm", y + _attention(sd, f"{p}.self_attn", y, y, causal=True))
        y = _ln(sd, f"{p}.encoder_attn_layer_norm", y + _attention(sd, f"{p}.encoder_attn", y, x, causal=False))
        y = _ln(sd, f"{p}.final_layer_norm", y + _ffn(sd, p, y))
    out_w = sd.get("decoder.output_projection.weight", sd["decoder.embed_tokens.weight"])
    lprobs = F.log_softmax(y @ out_w.t(), dim=-1)
    return float(sum(lprobs[t, tok] for t, tok in enumerate(tgt)))


# ---------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("cfg_style", [False, True])
def test_converted_log_probs_equal_the_fairseq_forward(tmp_path: Path, cfg_style: bool) -> None:
    ckpt, dicts, codes = _write(tmp_path, cfg_style=cfg_style)
    summary = convert_fairseq_transformer(ckpt, dict_dir=dicts, bpe_codes=codes, out=tmp_path / "hf")
    assert summary["layers"] == [LAYERS, LAYERS] and summary["vocab"] == ROWS
    scorer = Seq2SeqScorer.from_pretrained(tmp_path / "hf").eval()
    sd = torch.load(ckpt, weights_only=False)["model"]
    pairs = [("the cat sat .", "the cats sat ."), ("the cats sat .", "the cat sat ."), ("sat .", "the cat .")]
    got = scorer.score_texts([s for s, _ in pairs], [t for _, t in pairs])
    for (src, tgt), score in zip(pairs, got, strict=True):
        ids = [scorer.tokenizer(x)["input_ids"] for x in (src, tgt)]
        assert score == pytest.approx(reference_score(sd, ids[0], ids[1]), abs=1e-4)


def test_the_tokenizer_reproduces_subword_nmt_and_the_dictionary(tmp_path: Path) -> None:
    ckpt, dicts, codes = _write(tmp_path)
    convert_fairseq_transformer(ckpt, dict_dir=dicts, bpe_codes=codes, out=tmp_path / "hf")
    tok = Seq2SeqScorer.from_pretrained(tmp_path / "hf").tokenizer
    assert tok.tokenize("the cats sat .") == ["the", "cat@@", "s", "sat", "."]  # fairseq's BPE'd text
    assert tok("the cats sat .")["input_ids"] == [4, 5, 7, 8, 9, 2]  # the dictionary's ids, then </s>
    assert tok("dog")["input_ids"] == [3, 3, 3, 2]  # d@@ o@@ g: not in the dictionary
    assert tok.decode([4, 5, 7, 8, 9, 2], skip_special_tokens=True) == "the cats sat ."
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (1, 2, 3)


def test_a_converted_model_decodes_and_mines(tmp_path: Path) -> None:
    from raycl.data.gec import GecExample
    from raycl.miners.beam_search import BeamSearchMiner

    ckpt, dicts, codes = _write(tmp_path)
    convert_fairseq_transformer(ckpt, dict_dir=dicts, bpe_codes=codes, out=tmp_path / "hf")
    scorer = Seq2SeqScorer.from_pretrained(tmp_path / "hf")
    (mined,) = BeamSearchMiner(scorer, k=2, beam=3, max_len_b=6).mine(
        [GecExample("a", "the cat sat .", "the cats sat .")]
    )
    assert mined.id == "a" and len(mined.negatives) == len(mined.scores) >= 1


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raycl.convert", "fairseq-transformer", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The CLI's ``main`` in this process (the process's own exit is the first case's): exit status 2, one line."""
    from raycl import convert

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        convert.main(["fairseq-transformer", *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_bad_inputs_end_in_one_line_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt, dicts, codes = _write(tmp_path, encoder_normalize_before=True)
    res = _cli(str(ckpt), "--dict-dir", str(dicts), "--bpe-codes", str(codes), "--out", str(tmp_path / "o"))
    assert res.returncode == 2 and "encoder_normalize_before" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    ckpt, dicts, codes = _write(tmp_path)
    args = (str(ckpt), "--dict-dir", str(dicts), "--bpe-codes", str(codes), "--out", str(tmp_path / "o"))
    (dicts / "dict.trg.txt").unlink()
    (dicts / "dict.src.txt").rename(dicts / "dict.en.txt")
    (dicts / "dict.de.txt").write_text(DICT)
    err = _refused(capsys, *args)
    assert "dict.src.txt and dict.trg.txt" in err and not (tmp_path / "o").exists()
    (dicts / "dict.de.txt").unlink()
    (dicts / "dict.en.txt").write_text("the 10\nbroken\n")
    err = _refused(capsys, *args)
    assert "dict.en.txt:2" in err and "symbol count" in err


def test_out_that_is_not_an_earlier_conversion_is_kept(tmp_path: Path) -> None:
    """``--out`` is replaced whole: a folder of the user's (no raycl_conversion.json) is refused in one line and
    left as it was; an earlier conversion is replaced; ``--force`` replaces anything."""
    from raycl.errors import UserError

    ckpt, dicts, codes = _write(tmp_path)
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "chapter1.tex").write_text("years of work")
    with pytest.raises(UserError, match=r"thesis: exists and is not an earlier conversion \(no raycl_conversion"):
        convert_fairseq_transformer(ckpt, dict_dir=dicts, bpe_codes=codes, out=mine)
    assert (mine / "chapter1.tex").read_text() == "years of work"
    out = tmp_path / "hf"
    convert_fairseq_transformer(ckpt, dict_dir=dicts, bpe_codes=codes, out=out)
    convert_fairseq_transformer(ckpt, dict_dir=dicts, bpe_codes=codes, out=out)  # its own earlier output
    convert_fairseq_transformer(ckpt, dict_dir=dicts, bpe_codes=codes, out=mine, force=True)
    assert not (mine / "chapter1.tex").exists() and (mine / "raycl_conversion.json").is_file()
