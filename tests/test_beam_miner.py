"""Beam-search negative mining (docs/mining.md): selection rule, miner invariants, Parquet I/O and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import ending
from torch import nn

from raycl.data.gec import GecExample
from raycl.data.m2 import Edit, M2Sentence, write_m2
from raycl.errors import UserError
from raycl.miners.base_miner import BaseMiner
from raycl.miners.beam_search import (
    BeamSearchMiner,
    read_negatives_parquet,
    select_negatives,
    write_negatives_parquet,
)
from raycl.miners.records import MinedNegatives
from raycl.models.decoding import Decoding
from raycl.models.presets import build_model
from raycl.models.seq2seq import Seq2SeqScorer

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = [
    GecExample("x:0", "He do n't like it .", "He does n't like it ."),
    GecExample("x:1", "This are a sentence .", "This is a sentence ."),
    GecExample("x:2", "Fine as it is .", "Fine as it is ."),  # s = t: never a source negative
    GecExample("x:3", "I has went to the school yesterday .", "I went to school yesterday ."),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    texts = [t for e in EXAMPLES for t in (e.source, e.target)] * 4
    tiny = dict(d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_layers=1, decoder_layers=1)
    out = tmp_path_factory.mktemp("model")
    return ending(build_model("smoke", out_dir=out, texts=texts, vocab_size=300, **tiny))


@pytest.fixture(scope="module")
def scorer(model_dir: Path) -> Seq2SeqScorer:
    return Seq2SeqScorer.from_pretrained(model_dir)


def test_select_negatives_on_hand_made_lists() -> None:
    """The paper's rule (§2.2.3): the top k of the n-best, the target dropped (k−1 when it is among them)."""
    nbest = ["a  b c", "the target .", "a b c", "", "x y", "src s .", "z", "w"]
    got = select_negatives(nbest, " the  target . ", "src s .", k=3, source_negative=True)
    assert got == ["a b c", "x y", "src s ."]  # target (any spacing), duplicate, empty dropped; source in top-k
    got = select_negatives(nbest, "the target .", "new src", k=2, source_negative=True)
    assert got == ["a b c", "new src"]  # the target was 2nd of the top 2: one beam negative, not refilled
    assert select_negatives(nbest, "the target .", "new src", k=2, source_negative=False) == ["a b c"]
    assert select_negatives(nbest, "same", "same", k=1, source_negative=True) == ["a b c"]  # s = t: no source
    assert select_negatives(nbest, "t", "s", k=0, source_negative=True) == ["s"]
    assert select_negatives(["t", "t"], "t", "s", k=3, source_negative=False) == []


def test_select_negatives_with_refill_takes_k_outputs_past_the_target() -> None:
    nbest = ["a  b c", "the target .", "a b c", "", "x y", "src s .", "z", "w"]
    got = select_negatives(nbest, "the target .", "new src", k=2, source_negative=True, refill=True)
    assert got == ["a b c", "x y", "new src"]
    assert select_negatives(nbest, "the target .", "new src", k=2, source_negative=False, refill=True) == [
        "a b c",
        "x y",
    ]
    got = select_negatives(nbest, " the  target . ", "src s .", k=3, source_negative=True, refill=True)
    assert got == ["a b c", "x y", "src s ."]


def test_beam_must_leave_room_for_the_target(scorer: Seq2SeqScorer) -> None:
    assert BeamSearchMiner(scorer, k=3).beam == 4
    with pytest.raises(ValueError, match="k\\+1"):
        BeamSearchMiner(scorer, k=3, beam=3)
    with pytest.raises(ValueError, match="k\\+1"):
        BeamSearchMiner(scorer, k=1, beam=5).select([], [], k=5)


def _check_invariants(ex: GecExample, m: MinedNegatives, *, k: int, with_source: bool, by_score: bool) -> None:
    norm = " ".join(ex.source.split())
    assert m.id == ex.id and len(m.negatives) == len(m.scores)
    assert ex.target not in m.negatives and "" not in m.negatives
    assert len(set(m.negatives)) == len(m.negatives)
    beam_part = m.negatives[:-1] if with_source and m.negatives and m.negatives[-1] == norm else m.negatives
    assert len(beam_part) <= k
    scores = list(m.scores[: len(beam_part)])
    assert not by_score or scores == sorted(scores, reverse=True)
    if not with_source or ex.source == ex.target:
        assert len(m.negatives) <= k
    else:
        assert norm in m.negatives


def test_mined_negatives_obey_the_rule_and_carry_model_scores(scorer: Seq2SeqScorer) -> None:
    scorer.train()
    for source_negative, rank_by in ((True, "beam"), (False, "beam"), (True, "sum_logprob")):
        miner = BeamSearchMiner(
            scorer, k=2, beam=4, source_negative=source_negative, max_len_b=10, rank_by=rank_by
        )
        mined = miner(EXAMPLES)
        assert scorer.training and all(p.grad is None for p in scorer.parameters())
        for ex, m in zip(EXAMPLES, mined, strict=True):
            _check_invariants(ex, m, k=2, with_source=source_negative, by_score=rank_by == "sum_logprob")
        assert mined == miner.mine(EXAMPLES)  # deterministic
    scorer.eval()
    # beam outputs carry the one-pass score of their decoded tokens (test_seq2seq checks it is S of those tokens);
    # the appended source is scored by teacher forcing
    for ex, m in zip(EXAMPLES, mined, strict=True):
        texts, scores, _, _ = scorer._beam([ex.source], Decoding(4, 4, max_len_b=10, drop_cut=True), 64)
        beam = dict(reversed(list(zip(texts, scores, strict=True))))  # the best-ranked copy of each text
        for neg, score in zip(m.negatives, m.scores, strict=True):
            if neg in beam:
                assert score == pytest.approx(beam[neg], rel=1e-6)
            else:
                assert neg == ex.source and score == pytest.approx(scorer.score_texts([neg], [neg])[0], rel=1e-5)


def test_a_beam_output_equal_to_the_target_is_dropped(scorer: Seq2SeqScorer) -> None:
    miner = BeamSearchMiner(scorer, k=2, beam=6, max_len_b=10)
    top = miner.nbest(EXAMPLES[:1])[0].negatives[0]
    ex = GecExample("y:0", EXAMPLES[0].source, top)  # the model's best output is now the gold target
    (m,) = miner.mine([ex])
    assert top not in m.negatives and len([n for n in m.negatives if n != ex.source]) == 1  # the paper: k−1
    (m,) = BeamSearchMiner(scorer, k=2, beam=6, max_len_b=10, refill=True).mine([ex])
    assert top not in m.negatives and len([n for n in m.negatives if n != ex.source]) == 2  # refilled to k


def test_the_nbest_keeps_the_beams_order_by_default(scorer: Seq2SeqScorer) -> None:
    """The paper takes the top k of the beam (its length-normalised order), not a re-ranking by summed log-prob."""
    beam = scorer.generate(
        [ex.source for ex in EXAMPLES],
        num_beams=4,
        num_return_sequences=4,
        max_new_tokens=10,
        drop_cut=True,
        rank_by="beam",
    )
    nbest = BeamSearchMiner(scorer, k=2, beam=4, max_len_b=10).nbest(EXAMPLES)
    by_score = BeamSearchMiner(scorer, k=2, beam=4, max_len_b=10, rank_by="sum_logprob").nbest(EXAMPLES)
    for hyps, nb, ns in zip(beam, nbest, by_score, strict=True):
        assert list(nb.negatives) == list(dict.fromkeys(t for t, _ in hyps if t))
        assert sorted(nb.negatives) == sorted(ns.negatives) and list(ns.scores) == sorted(ns.scores, reverse=True)


def test_reselecting_one_nbest_equals_mining_with_that_k(scorer: Seq2SeqScorer) -> None:
    nbest = BeamSearchMiner(scorer, k=3, beam=4, max_len_b=10).nbest(EXAMPLES)
    big = BeamSearchMiner(scorer, k=3, beam=4, max_len_b=10)
    for k in (1, 2, 3):
        direct = BeamSearchMiner(scorer, k=k, beam=4, source_negative=False, max_len_b=10).mine(EXAMPLES)
        assert big.select(nbest, EXAMPLES, k=k, source_negative=False) == direct


def test_base_miner_checks_ids_and_restores_mode() -> None:
    class Broken(BaseMiner[GecExample, MinedNegatives]):
        def _mine(self, examples):  # type: ignore[no-untyped-def]
            assert not torch.is_grad_enabled() and not self.module.training
            return [MinedNegatives("wrong", (), ()) for _ in examples]

    module = nn.Linear(2, 2).train()
    with pytest.raises(AssertionError, match="wrong"):
        Broken(module)(EXAMPLES[:1])
    assert module.training


def test_parquet_round_trip_and_errors(tmp_path: Path) -> None:
    mined = [MinedNegatives(ex.id, ("a b", "c"), (-1.5, -2.25)) for ex in EXAMPLES]
    path = write_negatives_parquet(tmp_path / "n.parquet", EXAMPLES, mined, model_version=3)
    assert read_negatives_parquet(path) == {m.id: m for m in mined}
    assert not list(tmp_path.glob(".*tmp"))
    table = pq.read_table(path)
    assert table.schema.field("negatives").type == pa.list_(pa.string())
    assert table.schema.field("scores").type == pa.list_(pa.float64())
    assert table.column("model_version").to_pylist() == [3] * 4
    with pytest.raises(UserError, match="missing.parquet"):
        read_negatives_parquet(tmp_path / "missing.parquet")
    pq.write_table(pa.table({"id": ["a"]}), tmp_path / "bad.parquet")
    with pytest.raises(UserError, match="bad.parquet: expected columns"):
        read_negatives_parquet(tmp_path / "bad.parquet")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "raycl.mine", *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120
    )


def test_cli_mines_an_m2_file_to_parquet(model_dir: Path, tmp_path: Path) -> None:
    m2 = tmp_path / "tiny.m2"  # two annotators: annotator 1 leaves the first sentence as it is
    edits = (Edit(1, 2, "R:VERB:SVA", "does"), Edit(-1, -1, "noop", "-NONE-", 1))
    write_m2(m2, [M2Sentence("He do n't like it .", edits), M2Sentence("Fine as it is .")])
    out = tmp_path / "neg.parquet"
    done = _cli(
        "gec",
        "--model",
        str(model_dir),
        "--data",
        str(m2),
        "--k",
        "2",
        "--out",
        str(out),
        "--max-len-b",
        "8",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["negatives_per_s"] > 0
    table = pq.read_table(out)
    assert table.column_names == ["id", "source", "target", "negatives", "scores", "model_version", "references"]
    rows = table.to_pylist()
    assert [r["target"] for r in rows] == ["He does n't like it .", "Fine as it is ."]
    assert rows[0]["references"] == ["He does n't like it .", "He do n't like it ."]
    assert rows[0]["negatives"][-1] == "He do n't like it ." and "Fine as it is ." not in rows[1]["negatives"]
    assert all(len(r["negatives"]) == len(r["scores"]) and r["model_version"] == 0 for r in rows)
    # the counts, recomputed from the rows: the source of sentence 0 is annotator 1's correction
    beam = [n for r in rows for n in r["negatives"] if n != r["source"]]
    refuted = sum(n in r["references"] for r in rows for n in r["negatives"] if n != r["source"])
    assert summary["false_negatives"] == {
        "source": {"selected": 1, "refuted": 1},
        "beam": {"selected": len(beam), "refuted": refuted},
    }


def test_cli_usage_errors_are_one_line_exit_2(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from raycl.mine import main

    for args, where in ((["--k", "3", "--beam", "2"], "--beam"), (["--k", "-1"], "--k")):
        with pytest.raises(SystemExit) as exc:
            main(["gec", "--model", str(model_dir), "--data", "x.m2", "--out", "o.parquet", *args])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.count("\n") == 1 and where in err
    with pytest.raises(SystemExit):
        main(["gec", "--model", "no/such/dir", "--data", "x.m2", "--out", "o.parquet"])
    assert "no/such/dir" in capsys.readouterr().err
