"""Coherence metrics against naive references, and ``raycl.eval coherence`` with a fake scorer."""

from __future__ import annotations

import argparse
import json
import math
import pickle
import random
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from raycl.data.coherence import CoherenceItem, write_pairs_jsonl, write_pairs_pickle
from raycl.errors import UserError, cli_entry
from raycl.scoring.coherence_eval import add_coherence_parser
from raycl.scoring.coherence_metrics import (
    alpha_with_model,
    krippendorff_alpha_nominal,
    model_labels,
    pairwise_accuracy,
)

Cap = pytest.CaptureFixture[str]


# ---------------------------------------------------------------- naive references


def naive_accuracy(pos: Sequence[float], negs: Sequence[Sequence[float]]) -> float:
    right = 0
    for p, ns in zip(pos, negs, strict=True):
        beaten = False
        for n in ns:
            if not p > n:
                beaten = True
        right += not beaten
    return right / len(pos)


def alpha_coincidence(coders: Sequence[Sequence[str | None]]) -> float:
    """Krippendorff (2011) §A: the coincidence matrix o_ck, marginals n_c, α = 1 − (n−1)·Σ o_ck / Σ n_c n_k."""
    values = sorted({float(v) for c in coders for v in c if v is not None})
    o = {(c, k): 0.0 for c in values for k in values}
    for u in range(len(coders[0])):
        unit = [float(c[u]) for c in coders if c[u] is not None]  # type: ignore[arg-type]
        m = len(unit)
        for i in range(m):
            for j in range(m):
                if i != j:
                    o[(unit[i], unit[j])] += 1 / (m - 1)
    n_c = {c: sum(o[(c, k)] for k in values) for c in values}
    n = sum(n_c.values())
    observed = sum(o[(c, k)] for c in values for k in values if c != k)
    expected = sum(n_c[c] * n_c[k] for c in values for k in values if c != k)
    return 1 - (n - 1) * observed / expected


# ---------------------------------------------------------------- accuracy and labels


def test_pairwise_accuracy_matches_a_loop_and_ties_are_wrong() -> None:
    rng = random.Random(0)
    for _ in range(20):
        pos = [rng.choice([0.0, 0.5, 1.0]) for _ in range(30)]
        negs = [[rng.choice([0.0, 0.5, 1.0]) for _ in range(rng.randint(1, 5))] for _ in range(30)]
        assert pairwise_accuracy(pos, negs) == pytest.approx(naive_accuracy(pos, negs))
    assert pairwise_accuracy([1.0, 2.0], [[1.0], [1.0, 3.0]]) == 0.0
    assert pairwise_accuracy([1.0, 2.0, 0.0], [0.5, 2.0, math.nan]) == pytest.approx(1 / 3)  # scalar negatives
    assert pairwise_accuracy(torch.tensor([1.0, 2.0]).tolist(), torch.tensor([[0.0], [3.0]])) == 0.5
    assert math.isnan(pairwise_accuracy([], []))
    with pytest.raises(ValueError, match=r"^1 positive scores but 2 negative-score entries$"):
        pairwise_accuracy([1.0], [[0.0], [0.0]])
    with pytest.raises(ValueError, match=r"^item 1 has no negative scores$"):  # names the item at fault
        pairwise_accuracy([1.0, 1.0], [[0.0], []])


def test_model_labels() -> None:
    assert model_labels([2.0, 1.0, 1.5], [1.0, 2.0, 1.5]) == ["0", "1", None]
    with pytest.raises(ValueError, match=r"^2 positive scores but 1 negative scores$"):
        model_labels([2.0, 1.0], [1.0])


# ---------------------------------------------------------------- Krippendorff's alpha

# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", §C: 4 observers, 12 units, missing data.
TEXTBOOK = [
    ["1", "2", "3", "3", "2", "1", "4", "1", "2", None, None, None],
    ["1", "2", "3", "3", "2", "2", "4", "1", "2", "5", None, "3"],
    [None, "3", "3", "3", "2", "3", "4", "2", "2", "5", "1", None],
    ["1", "2", "3", "3", "2", "4", "4", "1", "2", "5", "1", None],
]


def test_textbook_example() -> None:
    assert round(krippendorff_alpha_nominal(TEXTBOOK), 3) == 0.743
    assert krippendorff_alpha_nominal(TEXTBOOK) == pytest.approx(alpha_coincidence(TEXTBOOK))


@pytest.mark.parametrize("seed", range(8))
def test_alpha_matches_the_coincidence_matrix(seed: int) -> None:
    rng = random.Random(seed)
    n_coders, n_units, n_values = rng.randint(2, 5), rng.randint(5, 40), rng.randint(2, 4)
    truth = [str(rng.randrange(n_values)) for _ in range(n_units)]
    coders = [
        [None if rng.random() < 0.2 else t if rng.random() < 0.7 else str(rng.randrange(n_values)) for t in truth]
        for _ in range(n_coders)
    ]
    assert krippendorff_alpha_nominal(coders) == pytest.approx(alpha_coincidence(coders))


def test_alpha_degenerate_cases() -> None:
    assert krippendorff_alpha_nominal([["0", "1", "1"], ["0", "1", "1"], ["0", None, "1"]]) == 1.0
    assert krippendorff_alpha_nominal([["1", "1", "1"], ["1", "1", "1"]]) == 1.0  # one value: D_o = D_e = 0
    assert math.isnan(krippendorff_alpha_nominal([["0", None], [None, "1"]]))  # nothing pairable
    assert math.isnan(krippendorff_alpha_nominal([]))
    # two coders of different lengths are refused, however few distinct lengths there are
    with pytest.raises(ValueError, match=r"^coders label different numbers of units: \[2, 1\]$"):
        krippendorff_alpha_nominal([["0", "1"], ["0"]])
    # values are compared as floats, and a unit with a single value does not count
    assert krippendorff_alpha_nominal([["0", "1", "0"], ["0.0", "1", "1"]]) == pytest.approx(
        krippendorff_alpha_nominal([["0", "1", "0", "1"], ["0", "1", "1", None]])
    )
    opposite = [["0", "1", "0", "1"], ["1", "0", "1", "0"]]
    assert (
        krippendorff_alpha_nominal(opposite) == pytest.approx(alpha_coincidence(opposite))
        and krippendorff_alpha_nominal(opposite) < 0
    )


@pytest.mark.parametrize("seed", range(4))
def test_the_model_joins_the_coders_as_one_more_with_its_ties_missing(seed: int) -> None:
    rng = random.Random(seed)
    humans = [[rng.choice(["0", "1", None]) for _ in range(30)] for _ in range(3)]
    pos = [float(rng.randrange(4)) for _ in range(30)]
    negs = [[float(rng.randrange(4))] for _ in range(30)]  # one negative per annotated pair
    labels: list[str | None] = []
    for p, (n,) in zip(pos, negs, strict=True):  # the model prefers pos ('0'), the negative ('1'), or neither
        labels.append("0" if p > n else "1" if n > p else None)
    assert None in labels and alpha_with_model(humans, pos, negs) == pytest.approx(
        alpha_coincidence([*humans, labels])
    )


def test_a_constant_coder_lowers_agreement() -> None:
    rng = random.Random(3)
    humans = [[t if rng.random() < 0.95 else "10"[int(t)] for t in "0110100110" * 10] for _ in range(3)]
    with_constant = [*humans, ["0"] * 100]
    assert krippendorff_alpha_nominal(with_constant) == pytest.approx(alpha_coincidence(with_constant))
    assert krippendorff_alpha_nominal(with_constant) < krippendorff_alpha_nominal(humans)


# ---------------------------------------------------------------- raycl.eval coherence


def _inversions(doc: Sequence[str]) -> int:
    order = [int(s.split()[-1].rstrip(".")) for s in doc]
    return sum(order[i] > order[j] for i in range(len(order)) for j in range(i + 1, len(order)))


class FakeScorer:
    """Scores a document of "Sentence <i>." lines by −(inversions of i): the original order scores highest."""

    calls: list[int] = []

    @classmethod
    def from_pretrained(cls, path: str) -> FakeScorer:
        assert Path(path).is_dir()
        return cls()

    def score_documents(self, docs: Sequence[Sequence[str]], *, batch_size: int) -> torch.Tensor:
        FakeScorer.calls.append(batch_size)
        return torch.tensor([-float(_inversions(d)) for d in docs])  # (N,)


@pytest.fixture()
def fake_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    module = types.ModuleType("raycl.models.coherence")
    module.CoherenceScorer = FakeScorer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "raycl.models.coherence", module)
    FakeScorer.calls = []
    (tmp_path / "model").mkdir()
    return str(tmp_path / "model")


def _s(*order: int) -> tuple[str, ...]:
    return tuple(f"Sentence {i}." for i in order)


PAIRS = [
    CoherenceItem("a", _s(0, 1, 2, 3), (_s(1, 0, 2, 3),)),
    CoherenceItem("b", _s(0, 1, 2, 3), (_s(0, 1, 2, 3),)),  # pos == neg: a tie, never correct
    CoherenceItem("c", _s(1, 0, 2, 3), (_s(0, 1, 2, 3),)),  # "pos" is the shuffled side
    CoherenceItem("d", _s(0, 1, 2), (_s(2, 1, 0),)),
]
TRAIN = [  # training layout: only the first --num-negs negatives count
    CoherenceItem("t1", _s(0, 1, 2), (_s(1, 0, 2), _s(0, 2, 1), _s(2, 1, 0))),
    CoherenceItem("t2", _s(0, 2, 1), (_s(2, 1, 0), _s(2, 0, 1), _s(0, 1, 2))),  # beaten only by negs[2]
]
HUMANS = [["0", "0", "1", "0"], ["0", "1", "1", "0"], ["0", None, "0", "0"]]


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m raycl.eval")
    sub = parser.add_subparsers(dest="task", required=True)
    add_coherence_parser(sub)
    args = parser.parse_args(argv)
    return int(args.run(args))


def _json(capsys: Cap, argv: list[str]) -> dict[str, Any]:
    assert _main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _naive_labels(items: Sequence[CoherenceItem]) -> list[str | None]:
    labels: list[str | None] = []
    for it in items:
        p, n = -_inversions(it.pos), -_inversions(it.negs[0])
        labels.append("0" if p > n else "1" if n > p else None)
    return labels


def test_eval_accuracy_and_alpha(tmp_path: Path, fake_model: str, capsys: Cap) -> None:
    write_pairs_pickle(PAIRS, tmp_path / "pairs.pkl")
    write_pairs_jsonl(TRAIN, tmp_path / "train.jsonl")
    (tmp_path / "ann.pkl").write_bytes(pickle.dumps(HUMANS, protocol=3))
    pairs, train = str(tmp_path / "pairs.pkl"), str(tmp_path / "train.jsonl")
    out = _json(
        capsys,
        [
            "coherence",
            "--model",
            fake_model,
            "--pairs",
            pairs,
            "--pairs",
            train,
            "--batch-size",
            "3",
            "--num-negs",
            "2",
            "--json",
        ],
    )
    pos = [-_inversions(it.pos) for it in PAIRS + TRAIN]
    negs = [[-_inversions(n) for n in it.negs[:2]] for it in PAIRS + TRAIN]
    assert out == {
        "files": {
            pairs: {"n": 4, "accuracy": naive_accuracy(pos[:4], negs[:4])},
            train: {"n": 2, "accuracy": naive_accuracy(pos[4:], negs[4:])},
        }
    }
    assert out["files"][train]["accuracy"] == 1.0 and FakeScorer.calls == [3, 3]
    assert (
        _json(capsys, ["coherence", "--model", fake_model, "--pairs", train, "--json"])["files"][train]["accuracy"]
        == 0.5
    )  # default: the first 5 negatives, so t2's third one counts
    out = _json(
        capsys,
        [
            "coherence",
            "--model",
            fake_model,
            "--pairs",
            pairs,
            "--annotations",
            str(tmp_path / "ann.pkl"),
            "--json",
        ],
    )
    assert out["alpha"] == pytest.approx(alpha_coincidence([*HUMANS, _naive_labels(PAIRS)]))
    assert out["human_alpha"] == pytest.approx(alpha_coincidence(HUMANS))
    assert _json(capsys, ["coherence", "--annotations", str(tmp_path / "ann.pkl"), "--json"]) == {
        "human_alpha": pytest.approx(alpha_coincidence(HUMANS))
    }
    ann = str(tmp_path / "ann.pkl")
    assert _main(["coherence", "--model", fake_model, "--pairs", pairs, "--annotations", ann]) == 0
    table = capsys.readouterr().out
    accuracy = f"{100 * naive_accuracy(pos[:4], [n[:1] for n in negs[:4]]):.2f}"
    assert pairs in table and accuracy in table and "humans + model" in table


def test_eval_user_errors_exit_2(tmp_path: Path, fake_model: str, capsys: Cap) -> None:
    write_pairs_pickle(PAIRS, tmp_path / "pairs.pkl")
    write_pairs_pickle(TRAIN, tmp_path / "train.pkl")
    (tmp_path / "short.json").write_text(json.dumps([["0", "1"], ["0", "1"]]))
    (tmp_path / "ann.json").write_text(json.dumps([["0"] * 2, ["1"] * 2]))
    pairs, train = str(tmp_path / "pairs.pkl"), str(tmp_path / "train.pkl")
    short, missing = str(tmp_path / "short.json"), str(tmp_path / "missing.pkl")
    cases = [
        ([], "--model: missing"),
        (["--pairs", pairs], "--pairs: scoring pairs needs --model"),
        (["--model", fake_model], "--pairs: missing"),
        (
            ["--model", fake_model, "--pairs", pairs, "--pairs", pairs, "--annotations", short],
            "--annotations: given with 2 --pairs files",
        ),
        (["--model", fake_model, "--pairs", pairs, "--annotations", short], f"{pairs}: 4 pairs but 2 labels"),
        (
            ["--model", fake_model, "--pairs", train, "--annotations", str(tmp_path / "ann.json")],
            f"{train}: items with several negatives",
        ),
        (["--model", str(tmp_path / "nope"), "--pairs", pairs], f"{tmp_path / 'nope'}: not a directory"),
        (["--model", fake_model, "--pairs", missing], f"{missing}: cannot read"),
        (["--model", fake_model, "--pairs", pairs, "--batch-size", "0"], "--batch-size/--num-negs"),
    ]
    main = cli_entry(_main)
    for extra, expected in cases:
        with pytest.raises(SystemExit) as exit_:
            main(["coherence", *extra])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.startswith(f"raycl: error: {expected}") and err.count("\n") == 1


def test_run_coherence_raises_user_error_directly(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--model: missing"):
        _main(["coherence"])
