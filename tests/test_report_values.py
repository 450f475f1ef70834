"""Issue 43 item 9: every number a recipe's ``report.md`` prints, compared with a naive computation in the test.

Each recipe's report is rendered from trials built here by hand (the histories a sweep would hand the driver),
without Ray or a model; the test then reads the Markdown back and recomputes every cell from the histories with
plain loops: the checkpoint a dev metric picks (highest value, earliest epoch on a tie), percentages with two
decimals, the mining-time shares, the data statistics of Table 1 from the M2 text itself, the sign test's binomial
tail both ways. Values are drawn at random (seeded) so a cell that reads the wrong key or row shows.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
from pathlib import Path
from typing import Any

import pytest
from report_tables import best_of, percent, tables

from raycl.config.tasks import load_space
from raycl.driver import Run
from raycl.records import TrialOutcome

# ---------------------------------------------------------------------------------------------------- GEC
M2_FILES = {  # name -> M2 text; annotator 0's edits give Table 1's err% and e/s, a noop is no edit
    "train.m2": "S a b c .\nA 0 1|||R:DET|||the|||REQUIRED|||-NONE-|||0\n"
    "A 2 3|||R:NOUN|||d|||REQUIRED|||-NONE-|||0\n\n"
    "S x y .\nA -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||0\n\n"
    "S p q r .\nA 1 2|||U:ADV||||||REQUIRED|||-NONE-|||0\n\n",
    "finetune.m2": "S one two .\n\nS three four .\nA 0 1|||R:OTHER|||five|||REQUIRED|||-NONE-|||0\n\n",
    "dev.m2": "S a b .\nA 0 1|||R:DET|||the|||REQUIRED|||-NONE-|||0\n"
    "A 0 1|||R:DET|||an|||REQUIRED|||-NONE-|||1\n\n"
    "S c d .\nA 1 1|||M:PUNCT|||,|||REQUIRED|||-NONE-|||1\n\n",
    "test-s.m2": "S The cat sat on mat .\nA 4 4|||M:DET|||the|||REQUIRED|||-NONE-|||0\n"
    "A 4 4|||M:DET|||a|||REQUIRED|||-NONE-|||1\n\n"
    "S He go home .\nA 1 2|||R:VERB:SVA|||goes|||REQUIRED|||-NONE-|||0\n"
    "A 3 4|||U:PUNCT||||||REQUIRED|||-NONE-|||0\nA -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||1\n\n"
    "S All good here .\nA -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||0\n\n"
    "S Fine .\n\n",
    "test-g.m2": "S We was late .\nA 1 2|||R:VERB:SVA|||were|||REQUIRED|||-NONE-|||0\n"
    "A 1 2|||R:VERB:SVA|||were|||REQUIRED|||-NONE-|||1\n\n"
    "S It rain .\nA 1 2|||R:VERB:SVA|||rains|||REQUIRED|||-NONE-|||1\n\n",
}
GEC_SETS = ("S", "G")
GEC_KEYS = ("p", "r", "f05", "ie", "oe")


def naive_m2_stats(text: str) -> tuple[int, float, float]:
    """(#sentences, % with an edit of annotator 0, such edits per such sentence) read off the M2 text."""
    sentences = [block for block in text.strip().split("\n\n") if block.startswith("S ")]
    edits = []
    for block in sentences:
        n = 0
        for line in block.splitlines()[1:]:
            fields = line[2:].split("|||")
            start = int(fields[0].split()[0])
            if fields[-1] == "0" and fields[1] != "noop" and start >= 0:
                n += 1
        edits.append(n)
    erroneous = sum(1 for n in edits if n > 0)
    return len(sentences), 100 * erroneous / len(sentences), sum(edits) / max(erroneous, 1)


def _gec_history(
    rng: random.Random,
    epochs: int,
    *,
    first_epoch: int = 1,
    tie: bool = False,
    mined: bool = False,
    skip: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    rows = []
    for e in range(first_epoch, first_epoch + epochs):
        row: dict[str, Any] = {
            "epoch": e,
            "loss": rng.uniform(0.5, 3.0),
            "dev_f05": round(rng.uniform(0.1, 0.6), 4),
        }
        row |= {f"test/{t}/{k}": round(rng.uniform(0.0, 1.0), 4) for t in GEC_SETS for k in GEC_KEYS}
        row["timing/step"] = round(rng.uniform(0.01, 0.2), 5)
        if mined:
            wait, first, wall = rng.uniform(0.5, 3.0), rng.uniform(0.0, 0.4), rng.uniform(10.0, 40.0)
            row |= {
                "stream/negatives": float(rng.randrange(1, 50)),
                "timing/mine_wait": wait,
                "timing/mine_wait_first": first,
                "timing/interval": wall,
                "stream/staleness_max": float(rng.randrange(0, 4)),
                "stream/refused": float(rng.randrange(0, 3)),
            }
        rows.append({k: v for k, v in row.items() if k not in skip})
    if tie:  # the same dev F0.5 twice: the earlier epoch is the one kept
        rows[-1]["dev_f05"] = max(r["dev_f05"] for r in rows)
    return rows


def _gec_run(tmp_path: Path) -> tuple[Run, Any, list[TrialOutcome], list[TrialOutcome]]:
    data = tmp_path / "data"
    data.mkdir()
    for name, text in M2_FILES.items():
        (data / name).write_text(text)
    space = load_space("gec_pd", preset="smoke")
    cfg = space.config
    cfg = dataclasses.replace(
        cfg,
        data=dataclasses.replace(
            cfg.data,
            train=[str(data / "train.m2")],
            finetune=[str(data / "finetune.m2")],
            dev={"d": [str(data / "dev.m2")]},
            test={"S": [str(data / "test-s.m2")], "G": [str(data / "test-g.m2")]},
        ),
    )
    run = Run(
        cfg=cfg,
        run_dir=tmp_path / "run",
        base_model=tmp_path / "run" / "base_model",
        builtin=[],
        counts={"train": 3, "finetune": 2},
        timings={"pretrain_s": 12.345, "tune_s": 678.91},
    )
    run.run_dir.mkdir()
    rng = random.Random(43)
    trials = [
        TrialOutcome("cl_a", {"loss.margin": 0.25, "mining.k": 2}, _gec_history(rng, 3, mined=True)),
        TrialOutcome("cl_b", {"loss.margin": 0.85, "mining.k": 2}, _gec_history(rng, 3, mined=True)),
        TrialOutcome("cl_c", {"loss.margin": 0.5, "mining.k": 4}, _gec_history(rng, 2)),
    ]
    for row, dev in zip(trials[0].history, (0.61, 0.7, 0.7), strict=True):  # the sweep's best, tied at epochs 2, 3
        row["dev_f05"] = dev
    extra = [
        TrialOutcome("di", {"baseline": "di"}, _gec_history(rng, 1, first_epoch=0, skip=("test/G/ie",))),
        TrialOutcome("nll", {"baseline": "nll"}, _gec_history(rng, 3, tie=True)),
        TrialOutcome("fn", {"baseline": "cl_fn_drop"}, _gec_history(rng, 3, mined=True)),
        TrialOutcome("clm", {"baseline": "cl_minus"}, _gec_history(rng, 2, mined=True)),
    ]
    return run, space, trials, extra


FN_COUNTS = {
    "cl_a": {"source": {"selected": 7, "refuted": 2}, "beam": {"selected": 9, "refuted": 0}, "mode": "keep"},
    "fn": {"source": {"selected": 7, "refuted": 2}, "beam": {"selected": 0, "refuted": 0}, "mode": "drop"},
}
NBEST_META = {
    "examples": 40,
    "beam_searched": 30,
    "resumed": 10,
    "mine_s": 12.345,
    "engine": "ctranslate2",
    "engine_requested": "auto",
    "options": {"beam": 4, "precision": "int8"},
}
CORRECTED = {"cl_a": {"S": {0}, "G": set()}, "fn": {"S": {1}, "G": {0}}}  # sentences each row's output corrects


@dataclasses.dataclass
class Rendered:
    run: Run
    trials: list[TrialOutcome]
    extra: list[TrialOutcome]
    text: str


@pytest.fixture(scope="module")
def gec(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    """One GEC report with every part: the shared n-best's meta, two trainings' false-negative counts and the
    kept test hypotheses of the row after CL and of CL (each corrects other sentences: CL is better on S, the
    other row on G, so both directions' p are tails of a real count)."""
    from raycl.data.m2 import read_m2
    from raycl.recipes.gec.report import REPORT

    run, space, trials, extra = _gec_run(tmp_path_factory.mktemp("gec"))
    (run.run_dir / "nbest").mkdir()
    (run.run_dir / "nbest" / "meta.json").write_text(json.dumps(NBEST_META))
    for tid, c in FN_COUNTS.items():
        (run.run_dir / "trials" / tid / "test_hyps").mkdir(parents=True)
        (run.run_dir / "trials" / tid / "false_negatives.json").write_text(json.dumps(c))
        for name in GEC_SETS:
            sents = read_m2(run.cfg.data.test[name][0])
            lines = [s.target(0) if i in CORRECTED[tid][name] else s.source for i, s in enumerate(sents)]
            (run.run_dir / "trials" / tid / "test_hyps" / f"{name}.txt").write_text("\n".join(lines) + "\n")
    REPORT.write_all(run, space, trials, extra)
    return Rendered(run, trials, extra, (run.run_dir / "report.md").read_text())


def test_gec_report_tables_2_and_3_and_the_sweep_are_the_dev_picked_epochs_values(gec: Rendered) -> None:
    trials, extra = gec.trials, gec.extra
    got = tables(gec.text)
    dev = {t.trial_id: best_of(t.history, "dev_f05")["dev_f05"] for t in trials}
    best_cl = max(trials, key=lambda t: dev[t.trial_id])
    assert best_cl.trial_id == "cl_a" and best_of(best_cl.history, "dev_f05")["epoch"] == 2  # the tie: epoch 2
    expected = [
        ("DI", extra[0]),
        ("NLL", extra[1]),
        ("CL⁻", extra[3]),
        ("CL (γ=0.25, k=2)", best_cl),
        ("CL (false negatives dropped)", extra[2]),
    ]
    table2, table3 = got["Method"], got["Method#2"]
    assert [r["Method"] for r in table2] == [m for m, _ in expected]
    assert [r["Method"] for r in table3] == [m.split(" (γ")[0] for m, _ in expected]
    for (_, trial), r2, r3 in zip(expected, table2, table3, strict=True):
        row = best_of(trial.history, "dev_f05")
        for t in GEC_SETS:
            for key, head in (("p", "P"), ("r", "R"), ("f05", "F0.5")):
                assert r2[f"{t} {head}"] == percent(row.get(f"test/{t}/{key}")), (trial.trial_id, t, key)
            for key in ("ie", "oe"):
                assert r3[f"{t} {key.upper()} ratio"] == percent(row.get(f"test/{t}/{key}")), (trial.trial_id, key)
        assert r2["dev F0.5"] == percent(row["dev_f05"])
    assert table3[0]["G IE ratio"] == "–"  # DI's missing value is a dash, not a number
    sweep = got["Point"]
    order = sorted(trials, key=lambda t: -dev[t.trial_id])
    assert [r["dev F0.5"] for r in sweep] == [percent(dev[t.trial_id]) for t in order]
    assert [r["epoch"] for r in sweep] == [str(best_of(t.history, "dev_f05")["epoch"]) for t in order]
    best = json.loads((gec.run.run_dir / "best.json").read_text())
    assert best["trial_id"] == "cl_a" and best["dev_f05"] == best_of(best_cl.history, "dev_f05")["dev_f05"]


def test_gec_report_data_table_is_counted_from_the_m2_text(gec: Rendered) -> None:
    rows = tables(gec.text)["Usage"]
    files = [
        ("Train (D_T)", "train.m2"),
        ("Fine-tune (D_F)", "finetune.m2"),
        ("Dev d", "dev.m2"),
        ("Test S", "test-s.m2"),
        ("Test G", "test-g.m2"),
    ]
    assert [r["Usage"] for r in rows] == [u for u, _ in files]
    for (_, name), row in zip(files, rows, strict=True):
        n, err, eps = naive_m2_stats(M2_FILES[name])
        assert (row["Files"], row["#sent"], row["err%"], row["e/s"]) == (name, str(n), f"{err:.1f}", f"{eps:.1f}")
    assert [r["err%"] for r in rows] == ["66.7", "50.0", "50.0", "50.0", "50.0"]  # the hand count of the files
    assert rows[3]["e/s"] == "1.5" and rows[4]["e/s"] == "1.0"


def _line(text: str, pattern: str) -> re.Match[str]:
    found = re.search(pattern, text)
    assert found is not None, pattern
    return found


def test_gec_report_timings_and_mining_lines(gec: Rendered) -> None:
    text, trials = gec.text, gec.trials
    assert "- pretrain: 12.3 s" in text and "- tune: 678.9 s" in text
    steps = [r["timing/step"] for t in trials for r in t.history]  # the sweep's trials, every report
    assert _line(text, r"mean fine-tuning step: ([\d.]+) ms").group(1) == f"{1000 * sum(steps) / len(steps):.1f}"
    mined = [r for t in trials for r in t.history if r.get("stream/negatives")]
    wait = sum(r["timing/mine_wait"] for r in mined)
    first = sum(r["timing/mine_wait_first"] for r in mined)
    wall = sum(r["timing/interval"] for r in mined)
    m = _line(
        text,
        r"mine_wait \(trainers waiting for negatives\): ([\d.]+) s of ([\d.]+) s of training "
        r"\(([\d.]+)%; steady state without each epoch's first batch: ([\d.]+)%\)",
    )
    assert m.groups() == (
        f"{wait:.1f}",
        f"{wall:.1f}",
        f"{100 * wait / wall:.1f}",
        f"{100 * (wait - first) / (wall - first):.1f}",
    )
    m = _line(text, r"staleness of the negatives used: max (\d+) versions; refused as too stale: (\d+)")
    assert m.groups() == (
        f"{max(r['stream/staleness_max'] for r in mined):.0f}",
        f"{sum(r['stream/refused'] for r in mined):.0f}",
    )
    m = _line(
        text,
        r"beam 4, engine ctranslate2 \(auto\), int8\): (\d+) sentences, (\d+) sentences beam-searched "
        r"in ([\d.]+) s of miner time, (\d+) reused",
    )
    assert m.groups() == ("40", "30", "12.3", "10")


def test_gec_report_without_mined_negatives_says_so(tmp_path: Path) -> None:
    """Degenerate case: no trial drew from a miner pool: no share is printed (not 0 % of 0 s)."""
    from raycl.recipes.gec.report import REPORT

    run, space, trials, extra = _gec_run(tmp_path)
    for t in trials:
        t.history = [{k: v for k, v in r.items() if not k.startswith("stream/")} for r in t.history]
    REPORT.write_all(run, space, trials, extra)
    text = (run.run_dir / "report.md").read_text()
    assert "- negatives: pre-mined or not needed" in text and "mine_wait (" not in text


def naive_tail(k: int, n: int) -> float:
    """P(X ≥ k) for X ~ Binomial(n, 1/2), summed term by term."""
    return sum(math.factorial(n) / (math.factorial(i) * math.factorial(n - i)) for i in range(k, n + 1)) / 2**n


def test_gec_report_false_negative_rates_and_sign_test(gec: Rendered) -> None:
    """The false-negative table's refuted/selected rates, and the sign test's p of each direction: the one-tailed
    binomial tail of the printed wins (losses) among the decisive samples, as a plain sum."""
    rows = {r["Training"]: r for r in tables(gec.text)["Training"]}
    for label, tid in (("CL", "cl_a"), ("CL (false negatives dropped)", "fn")):
        for kind in ("source", "beam"):
            sel, ref = FN_COUNTS[tid][kind]["selected"], FN_COUNTS[tid][kind]["refuted"]
            assert rows[label][kind] == (f"{ref}/{sel} ({100 * ref / sel:.1f}%)" if sel else "0/0 (–)")
        assert rows[label]["mining.false_negatives"] == FN_COUNTS[tid]["mode"]
    found = re.findall(
        r"(\w): wins (\d+), losses (\d+), ties (\d+), p = ([\d.e-]+) \(CL better: p = ([\d.e-]+)\)", gec.text
    )
    assert [f[0] for f in found] == list(GEC_SETS)
    for _, wins, losses, ties, p, p_other in found:
        w, lo = int(wins), int(losses)
        assert w + lo + int(ties) == 100
        assert float(p) == pytest.approx(naive_tail(w, w + lo), rel=5e-3, abs=0.0)  # p can be ~1e-19
        assert float(p_other) == pytest.approx(naive_tail(lo, w + lo), rel=5e-3, abs=0.0)
    assert int(found[0][2]) > 0 and int(found[1][1]) > 0  # CL wins samples of S, the other row samples of G


# ---------------------------------------------------------------------------------------------- coherence
COH_TESTS = ("permuted", "lmvlm")


def _coh_history(
    rng: random.Random, reports: int, *, mined: bool = False, tie: bool = False
) -> list[dict[str, Any]]:
    rows = []
    for i in range(reports):
        row: dict[str, Any] = {
            "step": 40 * (i + 1),
            "epoch": i // 2,
            "loss": rng.uniform(0.1, 1.0),
            "dev_acc": round(rng.uniform(0.4, 0.9), 4),
        }
        row |= {f"test/{t}/acc": round(rng.uniform(0.4, 0.9), 4) for t in COH_TESTS}
        row |= {
            "test/lmvlm/alpha": round(rng.uniform(-0.2, 0.8), 4),
            "test/lmvlm/human_alpha": round(rng.uniform(0.3, 0.7), 4),
        }
        if mined:
            row |= {
                "stream/version": float(i + 1),
                "timing/mine_wait": rng.uniform(0.0, 2.0),
                "timing/interval": rng.uniform(5.0, 20.0),
                "stream/staleness_max": float(rng.randrange(0, 5)),
                "stream/refused": float(rng.randrange(0, 4)),
            }
        rows.append(row)
    if tie:
        rows[-1]["dev_acc"] = max(r["dev_acc"] for r in rows)
    return rows


def _coh_run(tmp_path: Path) -> tuple[Run, Any, list[TrialOutcome], list[TrialOutcome]]:
    space = load_space("coherence", preset="smoke")
    cfg = space.config
    cfg = dataclasses.replace(
        cfg,
        data=dataclasses.replace(
            cfg.data, test={t: [f"{t}.pkl"] for t in COH_TESTS}, annotations={"lmvlm": "lmvlm_annotations.pkl"}
        ),
    )
    run = Run(
        cfg=cfg,
        run_dir=tmp_path / "run",
        base_model=tmp_path / "base",
        builtin=["train"],
        counts={"train": 120, "dev": 30},
        timings={"pretrain_s": 3.21, "tune_s": 98.76},
    )
    run.run_dir.mkdir()
    rng = random.Random(7)
    trials = [
        TrialOutcome("full_a", {"loss.margin": 0.1, "momentum.m": 0.99}, _coh_history(rng, 4, mined=True)),
        TrialOutcome("full_b", {"loss.margin": 0.3, "momentum.m": 0.9}, _coh_history(rng, 3, mined=True)),
        TrialOutcome("full_c", {"loss.margin": 0.3, "momentum.m": 0.99}, _coh_history(rng, 3, tie=True)),
    ]
    for row, dev in zip(trials[1].history, (0.91, 0.95, 0.95), strict=True):  # the best, tied at steps 80, 120
        row["dev_acc"] = dev
    extra = [
        TrialOutcome("pw", {"baseline": "pairwise"}, _coh_history(rng, 2)),
        TrialOutcome("con", {"baseline": "contrastive"}, _coh_history(rng, 3, tie=True)),
        TrialOutcome("hn", {"baseline": "contrastive_hn"}, _coh_history(rng, 3, mined=True)),
        TrialOutcome("nohn", {"baseline": "full_no_hn"}, _coh_history(rng, 2)),
    ]
    del extra[3].history[0]["test/lmvlm/alpha"], extra[3].history[1]["test/lmvlm/alpha"]
    return run, space, trials, extra


def test_coherence_report_table_1_sweep_and_mining_lines(tmp_path: Path) -> None:
    from raycl.recipes.coherence.report import REPORT

    run, space, trials, extra = _coh_run(tmp_path)
    REPORT.write_all(run, space, trials, extra)
    text = (run.run_dir / "report.md").read_text()
    got = tables(text)
    expected = [
        ("Pairwise", extra[0]),
        ("Contrastive", extra[1]),
        ("Full model", trials[1]),
        ("Contrastive + hard negatives", extra[2]),
        ("Full model − hard negatives", extra[3]),
    ]
    assert [r["Method"] for r in got["Method"]] == [m for m, _ in expected]
    for (_, trial), cells in zip(expected, got["Method"], strict=True):
        row = best_of(trial.history, "dev_acc", by="step")
        for t in COH_TESTS:
            assert cells[f"{t} acc"] == percent(row[f"test/{t}/acc"]), (trial.trial_id, t)
        alpha = row.get("test/lmvlm/alpha")
        assert cells["lmvlm α"] == ("–" if alpha is None else f"{alpha:.3f}"), trial.trial_id
        assert cells["dev acc"] == percent(row["dev_acc"])
    assert best_of(trials[1].history, "dev_acc", by="step")["step"] == 80
    humans = best_of(extra[0].history, "dev_acc", by="step")["test/lmvlm/human_alpha"]  # the first row's
    assert f"(annotators alone: {percent(humans)})" in text
    sweep = got["τ"]
    assert list(sweep[0]) == ["τ", "m", "dev acc", "permuted acc", "lmvlm acc"]  # the swept keys, sorted
    for t, cells in zip(trials, sweep, strict=True):
        row = best_of(t.history, "dev_acc", by="step")
        assert [cells["τ"], cells["m"]] == [str(t.params["loss.margin"]), str(t.params["momentum.m"])]
        assert [cells["dev acc"], cells["permuted acc"], cells["lmvlm acc"]] == [
            percent(row["dev_acc"]),
            percent(row["test/permuted/acc"]),
            percent(row["test/lmvlm/acc"]),
        ]
    mining = {r["trial"]: r for r in got["trial"]}
    names = {
        "full_a": "Full model τ=0.1, m=0.99",
        "full_b": "Full model τ=0.3, m=0.9",
        "hn": "Contrastive + hard negatives",
    }
    assert sorted(mining) == sorted(names.values())
    for t in [*trials, *extra]:
        mined = [r for r in t.history if "stream/version" in r]
        if not mined:
            continue
        share = 100 * sum(r["timing/mine_wait"] for r in mined) / sum(r["timing/interval"] for r in mined)
        cells = mining[names[t.trial_id]]
        assert cells["mine_wait (% of training time)"] == f"{share:.1f}"
        assert cells["max staleness"] == f"{max(r['stream/staleness_max'] for r in mined):.0f}"
        assert cells["refused (re-mined)"] == f"{max(r['stream/refused'] for r in mined):.0f}"
        assert cells["weight versions"] == f"{mined[-1]['stream/version']:.0f}"
    assert "pretrain 3.2 s, tune 98.8 s" in text and "Data: train 120, dev 30 (built-in: train)." in text
