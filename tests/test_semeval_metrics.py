"""Official SemEval-2022 Task 2 scores against naive references, and alignment/uniformity.

The references are written here from the evaluators' rules with plain loops: macro-F1 from per-class counts,
Spearman as the Pearson correlation of average ranks. Files are random submissions with ties and GL rows.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch

from raycl.data.semeval import write_csv
from raycl.errors import UserError
from raycl.scoring.embedding_geometry import alignment, plot_alignment_uniformity, uniformity
from raycl.scoring.semeval_eval import add_idiom_parser, add_sts_parser
from raycl.scoring.semeval_metrics import evaluate_idiom, evaluate_sts

A_SUB = ["ID", "Language", "Setting", "Label"]
A_GOLD = ["ID", "DataID", "Language", "Label"]
B_SUB = ["ID", "Language", "Setting", "Sim"]
B_GOLD = ["ID", "DataID", "Language", "sim", "otherID"]
LANGS = {"EN": ["EN"], "PT": ["PT"], "EN,PT": ["EN", "PT"]}


# ------------------------------------------------------------------------------------ naive references
def naive_class_f1(y_true: Sequence[int], y_pred: Sequence[int], c: int) -> float:
    """F1 of label ``c`` (0 when it has no true positive)."""
    tp = fp = fn = 0
    for t, p in zip(y_true, y_pred, strict=True):
        tp += t == c and p == c
        fp += t != c and p == c
        fn += t == c and p != c
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def naive_macro_f1(y_true: Sequence[int], y_pred: Sequence[int]) -> float:
    labels = sorted(set(y_true) | set(y_pred))
    return sum(naive_class_f1(y_true, y_pred, c) for c in labels) / len(labels)


def naive_f1(y_true: Sequence[int], y_pred: Sequence[int], average: str) -> float:
    """macro as above; weighted: per-label F1 weighted by its gold count; micro: accuracy (one label per row);
    binary: F1 of label 1."""
    if average == "macro":
        return naive_macro_f1(y_true, y_pred)
    if average == "micro":
        return sum(t == p for t, p in zip(y_true, y_pred, strict=True)) / len(y_true)
    if average == "binary":
        return naive_class_f1(y_true, y_pred, 1)
    labels = set(y_true) | set(y_pred)
    return sum(naive_class_f1(y_true, y_pred, c) * y_true.count(c) for c in labels) / len(y_true)


def naive_ranks(xs: Sequence[float]) -> list[float]:
    """1-based ranks; tied values share the average of their positions."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def naive_spearman(x: Sequence[float], y: Sequence[float]) -> float:
    rx, ry = naive_ranks(x), naive_ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return cov / math.sqrt(vx * vy)


def naive_idiom(
    sub: list[list[str]], gold: list[list[str]], average: str = "macro"
) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for setting in ("zero_shot", "one_shot"):
        if not any(r[2] == setting for r in sub):
            continue
        out[setting] = {}
        for key, langs in LANGS.items():
            rows = [r for r in sub if r[1] in langs and r[2] == setting]
            ids = [int(r[0]) for r in rows]
            g = [r for r in gold if int(r[0]) in ids]
            assert [int(r[0]) for r in g] == ids
            blank = not rows or any(r[3] == "" for r in rows)
            y_true, y_pred = [int(r[3]) for r in g], [int(r[3]) for r in rows]
            out[setting][key] = None if blank else naive_f1(y_true, y_pred, average)
    return out


def naive_sts(sub: list[list[str]], gold: list[list[str]]) -> dict[str, dict[str, dict[str, float | None]]]:
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for setting in ("pre_train", "fine_tune"):
        if not any(r[2] == setting for r in sub):
            continue
        out[setting] = {}
        for key, langs in LANGS.items():
            rows = [r for r in sub if r[1] in langs and r[2] == setting]
            pred = {r[0]: r[3] for r in rows}
            cols: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in ("ALL", "Idiom", "STS")}
            for gid, data_id, lang, sim, other in gold:
                if lang in langs:
                    target = float(sim if sim != "" else pred[other])
                    for k in ("ALL", "STS" if data_id.split(".")[2] == "sts" else "Idiom"):
                        cols[k][0].append(target)
                        cols[k][1].append(float(pred[gid]))
            blank = any(r[3] == "" for r in rows)
            out[setting][key] = {k: None if blank else naive_spearman(*v) for k, v in cols.items()}
    return out


# ------------------------------------------------------------------------------------------ fixtures
def _csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[str]]) -> Path:
    return write_csv(path, header, rows)


def _idiom_files(tmp: Path, rng: random.Random) -> tuple[Path, Path, list[list[str]], list[list[str]]]:
    n = rng.randrange(8, 40)
    ids = rng.sample(range(1, 100_000), n)
    gold = [
        [str(i), f"dev.{lang}.1.{k}", lang, str(rng.randrange(2))]
        for k, i in enumerate(ids)
        for lang in [rng.choice(["EN", "EN", "PT", "GL"])]
    ]
    sub = [[g[0], g[2], s, str(rng.randrange(2))] for s in ("zero_shot", "one_shot") for g in gold]
    return _csv(tmp / "sub.csv", A_SUB, sub), _csv(tmp / "gold.csv", A_GOLD, gold), sub, gold


def _sts_files(tmp: Path, rng: random.Random) -> tuple[Path, Path, list[list[str]], list[list[str]]]:
    ids = iter(rng.sample(range(1, 100_000), 200))
    gold: list[list[str]] = []
    extra: list[tuple[str, str]] = []  # MWE-free (correct, wrong) rows: inputs only, not gold
    for lang in ("EN", "PT", "GL"):
        for k in range(rng.randrange(4, 12)):
            i1, i2, i3 = str(next(ids)), str(next(ids)), str(next(ids))
            gold += [[i1, f"dev.{lang}.{k}.1", lang, "1", ""], [i2, f"dev.{lang}.{k}.2", lang, "", i3]]
            extra.append((i3, lang))
        gold += [
            [str(next(ids)), f"dev.{lang}.sts.{k}", lang, f"{rng.randrange(6) / 5:g}", ""]
            for k in range(rng.randrange(4, 12))
        ]
    inputs = [(g[0], g[2]) for g in gold] + extra
    rng.shuffle(inputs)
    sub = [[i, lang, s, f"{rng.randrange(10) / 10:g}"] for s in ("pre_train", "fine_tune") for i, lang in inputs]
    return _csv(tmp / "sub.csv", B_SUB, sub), _csv(tmp / "gold.csv", B_GOLD, gold), sub, gold


def _close(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if a is None or b is None:
        return a is b
    assert isinstance(a, float) and isinstance(b, float)
    return abs(a - b) < 1e-9


# ----------------------------------------------------------------------------------------- Subtask A
@pytest.mark.parametrize("seed", range(12))
def test_idiom_matches_naive_reference(tmp_path: Path, seed: int) -> None:
    sub_path, gold_path, sub, gold = _idiom_files(tmp_path, random.Random(seed))
    got = evaluate_idiom(sub_path, gold_path)
    assert list(got) == ["zero_shot", "one_shot"] and list(got["zero_shot"]) == ["EN", "PT", "EN,PT"]
    assert _close(got, naive_idiom(sub, gold))


@pytest.mark.parametrize("average", ["weighted", "micro", "binary"])
def test_idiom_other_averages_match_naive_reference(tmp_path: Path, average: str) -> None:
    """The released SubTask1Evaluator.py prints weighted, micro and binary F1: same selection, other averages."""
    differs = False
    for seed in range(4):
        sub_path, gold_path, sub, gold = _idiom_files(tmp_path, random.Random(100 + seed))
        got = evaluate_idiom(sub_path, gold_path, average=average)
        assert _close(got, naive_idiom(sub, gold, average)), seed
        differs |= not _close(got, evaluate_idiom(sub_path, gold_path))
    assert differs  # the average really is passed through, not macro under another name


def test_naive_macro_f1_on_a_hand_example() -> None:
    # class 0: tp 1, fp 1, fn 1 -> 0.5; class 1: tp 1, fp 1, fn 1 -> 0.5; class 2: tp 0 -> 0
    assert naive_macro_f1([0, 0, 1, 1, 2], [0, 1, 1, 0, 1]) == pytest.approx((0.5 + 0.4 + 0) / 3)


def test_idiom_blank_label_gives_none_only_where_it_is(tmp_path: Path) -> None:
    gold = [["1", "d.EN.1.1", "EN", "0"], ["2", "d.EN.1.2", "EN", "1"], ["3", "d.PT.1.1", "PT", "1"]]
    sub = [["1", "EN", "zero_shot", "0"], ["2", "EN", "zero_shot", "1"], ["3", "PT", "zero_shot", ""]]
    got = evaluate_idiom(_csv(tmp_path / "s.csv", A_SUB, sub), _csv(tmp_path / "g.csv", A_GOLD, gold))
    assert got == {"zero_shot": {"EN": 1.0, "PT": None, "EN,PT": None}}  # one_shot absent: skipped


def test_idiom_order_and_header_errors(tmp_path: Path) -> None:
    gold = _csv(tmp_path / "g.csv", A_GOLD, [["1", "d.EN.1.1", "EN", "0"], ["2", "d.EN.1.2", "EN", "1"]])
    swapped = _csv(tmp_path / "s.csv", A_SUB, [["2", "EN", "one_shot", "1"], ["1", "EN", "one_shot", "0"]])
    pattern = rf"^{swapped}:2: one_shot EN IDs do not match .*found ID 2, expected ID 1 "
    with pytest.raises(UserError, match=pattern):
        evaluate_idiom(swapped, gold)
    unknown = _csv(tmp_path / "u.csv", A_SUB, [["1", "EN", "one_shot", "0"], ["7", "EN", "one_shot", "0"]])
    with pytest.raises(UserError, match="found ID 7, expected no more rows"):
        evaluate_idiom(unknown, gold)
    bad = _csv(tmp_path / "h.csv", ["ID", "Language", "Setting", "Sim"], [["1", "EN", "one_shot", "0"]])
    with pytest.raises(UserError, match=rf"^{bad}:1: header"):
        evaluate_idiom(bad, gold)
    typo = _csv(tmp_path / "t.csv", A_SUB, [["1", "EN", "one-shot", "0"]])
    with pytest.raises(UserError, match=rf"^{typo}:2: Setting 'one-shot'"):
        evaluate_idiom(typo, gold)


# ----------------------------------------------------------------------------------------- Subtask B
@pytest.mark.parametrize("seed", range(12))
def test_sts_matches_naive_reference(tmp_path: Path, seed: int) -> None:
    sub_path, gold_path, sub, gold = _sts_files(tmp_path, random.Random(seed))
    got = evaluate_sts(sub_path, gold_path)
    assert list(got["pre_train"]["EN,PT"]) == ["ALL", "Idiom", "STS"]
    assert _close(got, naive_sts(sub, gold))


def test_naive_spearman_on_a_hand_example() -> None:
    assert naive_ranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]
    assert naive_spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert naive_spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)


def test_sts_consistency_target_uses_own_prediction(tmp_path: Path) -> None:
    # Row 11 has no gold sim: its target is the submission's prediction for row 12.
    gold = [
        ["10", "d.EN.1.1", "EN", "1", ""],
        ["11", "d.EN.1.2", "EN", "", "12"],
        ["20", "d.EN.sts.1", "EN", "0.2", ""],
        ["21", "d.EN.sts.2", "EN", "0.8", ""],
    ]
    sub = [
        ["10", "EN", "fine_tune", "0.9"],
        ["11", "EN", "fine_tune", "0.3"],
        ["12", "EN", "fine_tune", "0.3"],
        ["20", "EN", "fine_tune", "0.1"],
        ["21", "EN", "fine_tune", "0.7"],
    ]
    got = evaluate_sts(_csv(tmp_path / "s.csv", B_SUB, sub), _csv(tmp_path / "g.csv", B_GOLD, gold))
    assert got["fine_tune"]["EN"] == {
        "ALL": pytest.approx(1.0),
        "Idiom": pytest.approx(1.0),
        "STS": pytest.approx(1.0),
    }
    assert got["fine_tune"]["PT"] == {"ALL": None, "Idiom": None, "STS": None}  # no PT rows
    blank = [r if r[0] != "20" else ["20", "EN", "fine_tune", ""] for r in sub]
    got = evaluate_sts(_csv(tmp_path / "b.csv", B_SUB, blank), tmp_path / "g.csv")
    assert got["fine_tune"]["EN"] == {"ALL": None, "Idiom": None, "STS": None} and "pre_train" not in got


def test_sts_id_errors(tmp_path: Path) -> None:
    rows = [["10", "d.EN.1.1", "EN", "1", ""], ["11", "d.EN.1.2", "EN", "", "12"]]
    gold = _csv(tmp_path / "g.csv", B_GOLD, rows)
    stray = _csv(tmp_path / "s.csv", B_SUB, [["10", "EN", "pre_train", "1"], ["99", "EN", "pre_train", "1"]])
    with pytest.raises(UserError, match=rf"^{stray}:3: ID 99 is not in"):
        evaluate_sts(stray, gold)
    missing = _csv(tmp_path / "m.csv", B_SUB, [["10", "EN", "pre_train", "1"], ["11", "EN", "pre_train", "1"]])
    with pytest.raises(UserError, match=r"no pre_train prediction for ID 12 \(needed by .*g\.csv:3\)"):
        evaluate_sts(missing, gold)


# ------------------------------------------------------------------------------------------------- CLI
def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="task", required=True)
    add_idiom_parser(sub)
    add_sts_parser(sub)
    return parser.parse_args(argv)


def test_cli_json_and_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sub_path, gold_path, _, _ = _idiom_files(tmp_path, random.Random(5))
    args = _parse(["idiom", "--submission", str(sub_path), "--gold", str(gold_path), "--json"])
    assert args.run(args) == 0
    assert _close(json.loads(capsys.readouterr().out), evaluate_idiom(sub_path, gold_path))
    args = _parse(["idiom", "--submission", str(sub_path), "--gold", str(gold_path)])
    args.run(args)
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["setting", "EN", "PT", "EN,PT"] and table[1].startswith("zero_shot")
    sub_b, gold_b, _, _ = _sts_files(tmp_path, random.Random(5))
    args = _parse(["sts", "--submission", str(sub_b), "--gold", str(gold_b), "--json"])
    args.run(args)
    assert _close(json.loads(capsys.readouterr().out), evaluate_sts(sub_b, gold_b))
    args = _parse(["sts", "--submission", str(sub_b), "--gold", str(gold_b)])
    args.run(args)
    assert len(capsys.readouterr().out.splitlines()) == 1 + 6


def test_builtin_perfect_submission(tmp_path: Path) -> None:
    from raycl.data.semeval import fill_submission, read_idiom_gold, read_sts_gold
    from raycl.data.semeval_corpus import write_builtin_semeval

    files = write_builtin_semeval(tmp_path / "data", seed=1)
    labels = {(g.id, s): g.label for g in read_idiom_gold(files["a.dev_gold"]) for s in ("zero_shot", "one_shot")}
    sub = fill_submission(files["a.dev_submission_format"], labels, tmp_path / "a.csv")
    assert all(v == 1.0 for row in evaluate_idiom(sub, files["a.dev_gold"]).values() for v in row.values())
    rng = random.Random(0)
    preds: dict[tuple[str, str], float | int | None] = {}
    for g in read_sts_gold(files["b.dev_gold"]):  # a borrowed row and its otherID get the same value
        value = g.sim if g.sim is not None else rng.random()
        preds[(g.id, "fine_tune")] = value
        if g.other_id:
            preds[(g.other_id, "fine_tune")] = value
    sub = fill_submission(files["b.dev_submission_format"], preds, tmp_path / "b.csv")
    scores = evaluate_sts(sub, files["b.dev_gold"])
    assert all(v is None for cell in scores["pre_train"].values() for v in cell.values())  # blank cells
    assert all(v == pytest.approx(1.0) for cell in scores["fine_tune"].values() for v in cell.values())


# -------------------------------------------------------------------------------- alignment/uniformity
def _unit(v: Sequence[float]) -> list[float]:
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v]


def naive_alignment(x: list[list[float]], y: list[list[float]], alpha: float = 2.0) -> float:
    total = 0.0
    for a, b in zip(x, y, strict=True):
        a, b = _unit(a), _unit(b)
        total += math.sqrt(sum((p - q) ** 2 for p, q in zip(a, b, strict=True))) ** alpha
    return total / len(x)


def naive_uniformity(x: list[list[float]], t: float = 2.0) -> float:
    u = [_unit(v) for v in x]
    terms = [
        math.exp(-t * sum((p - q) ** 2 for p, q in zip(u[i], u[j], strict=True)))
        for i in range(len(u))
        for j in range(i + 1, len(u))
    ]
    return math.log(sum(terms) / len(terms))


def test_alignment_uniformity_vs_naive_loops() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(11, 5, generator=g, dtype=torch.float64)
    y = torch.randn(11, 5, generator=g, dtype=torch.float64)
    xl, yl = x.tolist(), y.tolist()
    assert alignment(x, y).item() == pytest.approx(naive_alignment(xl, yl), abs=1e-12)
    assert alignment(x, y, alpha=1.0).item() == pytest.approx(naive_alignment(xl, yl, 1.0), abs=1e-12)
    assert uniformity(x).item() == pytest.approx(naive_uniformity(xl), abs=1e-12)
    assert uniformity(x, t=0.5).item() == pytest.approx(naive_uniformity(xl, 0.5), abs=1e-12)
    # The paper's script: means over batches (the last one short), uniformity over both sides of a batch.
    batches = [(0, 4), (4, 8), (8, 11)]
    align_b = sum(naive_alignment(xl[a:b], yl[a:b]) for a, b in batches) / 3
    unif_b = sum(naive_uniformity(xl[a:b] + yl[a:b]) for a, b in batches) / 3
    assert alignment(x, y, batch_size=4).item() == pytest.approx(align_b, abs=1e-12)
    assert uniformity(x, y, batch_size=4).item() == pytest.approx(unif_b, abs=1e-12)


def test_alignment_uniformity_degenerate_cases() -> None:
    x = torch.randn(6, 4, dtype=torch.float64)
    assert alignment(x, 3 * x).item() == pytest.approx(0.0, abs=1e-12)  # same direction after normalising
    assert uniformity(x[:1].repeat(5, 1)).item() == pytest.approx(0.0, abs=1e-12)
    antipodal = torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=torch.float64)
    assert uniformity(antipodal).item() == pytest.approx(-8.0)  # ‖x−y‖² = 4, t = 2


def test_plot_writes_png(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The figure as drawn: ℓ_uniform on x, ℓ_align on y, one marker and one label per model; a 5×4 in, 120 dpi
    PNG written atomically into a directory made on demand (and reused); no figure left open."""
    import matplotlib.pyplot as plt

    drawn, open_before = [], plt.get_fignums()
    subplots = plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda *a, **k: drawn.append(subplots(*a, **k)) or drawn[-1])
    points = {"mBERT": (0.08, -0.44), "joint": (0.16, -2.9)}
    out = plot_alignment_uniformity(points, tmp_path / "fig" / "sub" / "au.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) == (600, 480)  # IHDR w, h
    assert not list(out.parent.glob(".*.tmp")) and plt.get_fignums() == open_before
    fig, ax = drawn[0]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == (
        r"$\ell_{uniform}$",
        r"$\ell_{align}$",
        "alignment vs uniformity",
    )
    markers = [(c.get_offsets().tolist(), c.get_sizes().tolist()) for c in ax.collections]
    assert markers == [([[u, a]], [40.0]) for a, u in points.values()]
    labels = [(t.get_text(), t.xy, t.xyann, t.anncoords, t.get_fontsize()) for t in ax.texts]
    assert labels == [(k, (u, a), (5, 5), "offset points", 8.0) for k, (a, u) in points.items()]
    assert {line.get_alpha() for line in ax.xaxis.get_gridlines() + ax.yaxis.get_gridlines()} == {0.3}
    # the directory exists by now; a PNG even where the user's matplotlibrc saves another format by default
    with plt.rc_context({"savefig.format": "svg"}):
        again = plot_alignment_uniformity({"x": (0.1, -1.0)}, out, title="run 2")
    assert again == out and drawn[1][1].get_title() == "run 2" and plt.get_fignums() == open_before
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_csv_helper_roundtrip(tmp_path: Path) -> None:
    p = _csv(tmp_path / "x.csv", A_SUB, [["1", "EN", "zero_shot", ""]])
    with open(p, encoding="utf-8", newline="") as f:
        assert list(csv.reader(f)) == [A_SUB, ["1", "EN", "zero_shot", ""]]


# ------------------------------------------------------------------------ error messages and edge rows
def _ab(tmp: Path, name: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> Path:
    return _csv(tmp / name, header, rows)


def _each_refused(
    tmp_path: Path,
    cases: list[tuple[list[list[str]], list[list[str]] | None, str]],
    gold: Path,
    headers: tuple[Sequence[str], Sequence[str]],
    evaluate: Callable[[Path, Path], object],
) -> None:
    """Each case — (submission rows, gold rows or None for ``gold``, the whole message with {s} and {g}) —
    refused by ``evaluate`` with exactly its message."""
    for k, (sub_rows, g_rows, message) in enumerate(cases):
        s = _ab(tmp_path, f"s{k}.csv", headers[0], sub_rows)
        g = gold if g_rows is None else _ab(tmp_path, f"g{k}.csv", headers[1], g_rows)
        with pytest.raises(UserError) as err:
            evaluate(s, g)
        assert str(err.value) == message.format(s=s, g=g), k


def test_idiom_bad_values_name_their_file_and_line(tmp_path: Path) -> None:
    gold_rows = [["1", "d.EN.1.1", "EN", "0"], ["2", "d.EN.1.2", "EN", "1"]]
    gold = _ab(tmp_path, "g.csv", A_GOLD, gold_rows)
    good = [["1", "EN", "zero_shot", "0"], ["2", "EN", "zero_shot", "1"]]
    cases = [  # (submission rows, gold rows or None for the good gold, the whole message)
        ([good[0], ["x2", "EN", "zero_shot", "1"]], None, "{s}:3: ID 'x2', expected an integer"),
        (good, [gold_rows[0], ["2b", "d.EN.1.2", "EN", "1"]], "{g}:3: ID '2b', expected an integer"),
        ([good[0], ["2", "EN", "zero_shot", "yes"]], None, "{s}:3: Label 'yes', expected an integer (0 or 1)"),
        (good, [gold_rows[0], ["2", "d.EN.1.2", "EN", "one"]], "{g}:3: Label 'one', expected an integer (0 or 1)"),
        (
            [good[0], ["2", "EN", "zero-shot", "1"]],
            None,
            "{s}:3: Setting 'zero-shot', expected one of zero_shot, one_shot",
        ),
        ([], None, "{s}: no rows, expected Setting zero_shot or one_shot"),
    ]
    _each_refused(tmp_path, cases, gold, (A_SUB, A_GOLD), evaluate_idiom)


def test_idiom_id_mismatch_messages(tmp_path: Path) -> None:
    """The first differing position, its submission line (the last row when the submission runs out first),
    the languages of the cell joined by a comma."""
    gold = _ab(
        tmp_path,
        "g.csv",
        A_GOLD,
        [
            ["1", "d.EN.1.1", "EN", "0"],
            ["2", "d.EN.1.2", "EN", "1"],
            ["3", "d.EN.1.3", "EN", "0"],
            ["3", "d.EN.1.3", "EN", "0"],
        ],
    )
    sub = _ab(
        tmp_path,
        "s.csv",
        A_SUB,
        [["1", "EN", "one_shot", "0"], ["2", "EN", "one_shot", "1"], ["3", "EN", "one_shot", "0"]],
    )
    tail = "(the gold file's IDs, in its order, each once)"
    with pytest.raises(UserError) as err:  # gold repeats ID 3: the submission ends first, at its line 4
        evaluate_idiom(sub, gold)
    assert str(err.value) == f"{sub}:4: one_shot EN IDs do not match {gold}: found ID none, expected ID 3 {tail}"
    gold2 = _ab(tmp_path, "g2.csv", A_GOLD, [["2", "d.PT.1.1", "PT", "0"], ["1", "d.EN.1.1", "EN", "1"]])
    sub2 = _ab(tmp_path, "s2.csv", A_SUB, [["1", "EN", "one_shot", "1"], ["2", "PT", "one_shot", "0"]])
    with pytest.raises(UserError) as err:  # EN alone and PT alone agree; the pooled cell's order does not
        evaluate_idiom(sub2, gold2)
    assert str(err.value) == f"{sub2}:2: one_shot EN,PT IDs do not match {gold2}: found ID 1, expected ID 2 {tail}"


def test_score_idiom_default_average_is_macro_and_others_are_refused(tmp_path: Path) -> None:
    from raycl.scoring.semeval_metrics import idiom_f1s, score_idiom

    gold = [(k + 2, [str(k), f"d.EN.1.{k}", "EN", t]) for k, t in enumerate("0001112")]
    sub = [(k + 2, [str(k), "EN", "zero_shot", p]) for k, p in enumerate("0110122")]
    y_true, y_pred = [int(r[3]) for _, r in gold], [int(r[3]) for _, r in sub]
    scores = {a: naive_f1(y_true, y_pred, a) for a in ("macro", "weighted", "micro")}
    assert len(set(scores.values())) == 3  # the averages differ here, so the default shows
    got = score_idiom(sub, gold, setting="zero_shot", languages=["EN"])
    assert got == pytest.approx(scores["macro"])
    # the idiom recipe's dev scoring calls idiom_f1s without an average: macro there too
    f1s = idiom_f1s(sub, gold, setting="zero_shot", names=("submission", "gold"))
    assert f1s["EN"] == pytest.approx(scores["macro"])
    with pytest.raises(UserError) as err:
        score_idiom(sub, gold, setting="zero_shot", languages=["EN"], average="samples")
    assert str(err.value) == "average 'samples', expected one of macro, weighted, micro, binary"


def test_sts_bad_values_name_their_file_and_line(tmp_path: Path) -> None:
    gold_rows = [
        ["10", "d.EN.1.1", "EN", "1", ""],
        ["11", "d.EN.1.2", "EN", "", "12"],
        ["20", "d.EN.sts.1", "EN", "0.4", ""],
    ]
    gold = _ab(tmp_path, "g.csv", B_GOLD, gold_rows)
    good = [
        ["10", "EN", "pre_train", "0.9"],
        ["11", "EN", "pre_train", "0.2"],
        ["12", "EN", "pre_train", "0.3"],
        ["20", "EN", "pre_train", "0.5"],
    ]
    cases = [  # (submission rows, gold rows or None, the whole message)
        ([*good[:3], ["20", "EN", "pre_train", "high"]], None, "{s}:5: similarity 'high', expected a number"),
        (
            good,
            [*gold_rows[:2], ["20", "d.EN.sts.1", "EN", "0,4", ""]],
            "{g}:4: similarity '0,4', expected a number",
        ),
        (
            good[:3],
            None,
            "{s}: no pre_train prediction for ID 20 (needed by {g}:4); expected a row for every ID of the split",
        ),
        ([*good, ["", "EN", "pre_train", "0.1"]], None, "{s}:6: ID '', expected an integer"),
        (
            [*good, ["13", "EN", "pre_train", "0.1"]],
            None,
            "{s}:6: ID 13 is not in {g} (a submission for another split?); expected the IDs of the gold file",
        ),
        (
            [good[0], ["11", "EN", "pretrain", "0.1"]],
            None,
            "{s}:3: Setting 'pretrain', expected one of pre_train, fine_tune",
        ),
        ([], None, "{s}: no rows, expected Setting pre_train or fine_tune"),
    ]
    _each_refused(tmp_path, cases, gold, (B_SUB, B_GOLD), evaluate_sts)


def test_sts_ids_compare_as_integers_or_as_written(tmp_path: Path) -> None:
    """A submission ID is known if the gold file has it as written (a non-integer ID too) or as the same
    integer (sign included); the scores are those of the rows the gold file looks up."""
    gold_rows = [
        ["-3", "d.EN.1.1", "EN", "0.2", ""],
        ["X7", "d.EN.1.2", "EN", "", "8"],
        ["5", "d.EN.1.3", "EN", "0.9", ""],
        ["6", "d.EN.1.4", "EN", "0.5", ""],
    ]
    sub_rows = [
        ["-3", "EN", "fine_tune", "0.1"],
        ["X7", "EN", "fine_tune", "0.6"],
        ["8", "EN", "fine_tune", "0.7"],
        ["5", "EN", "fine_tune", "0.8"],
        ["6", "EN", "fine_tune", "0.95"],
        ["-03", "EN", "fine_tune", "0.0"],
    ]  # the integer −3 again: known, never looked up
    got = evaluate_sts(_ab(tmp_path, "s.csv", B_SUB, sub_rows), _ab(tmp_path, "g.csv", B_GOLD, gold_rows))
    rho = naive_spearman([0.2, 0.7, 0.9, 0.5], [0.1, 0.6, 0.8, 0.95])  # X7's target: the prediction for 8
    assert rho == pytest.approx(0.4)  # 1 − 6·Σd²/(n(n²−1)) with rank differences 0, 1, 1, −2
    en = {"ALL": rho, "Idiom": rho, "STS": None}
    assert _close(got, {"fine_tune": {"EN": en, "PT": dict.fromkeys(["ALL", "Idiom", "STS"]), "EN,PT": en}})


def test_sts_subsets_by_the_third_dataid_field_only(tmp_path: Path) -> None:
    """STS rows are those whose DataID has a third field equal to 'sts' (however many fields follow); shorter
    DataIDs are Idiom rows. Constant columns give None, not NaN."""
    gold_rows = [
        ["1", "a.sts", "EN", "0.1", ""],
        ["2", "b.EN", "EN", "0.5", ""],
        ["3", "x.EN.sts", "EN", "0.3", ""],
        ["4", "y.EN.sts.9.9", "EN", "0.8", ""],
        ["5", "z.EN.sts", "EN", "0.6", ""],
    ]
    sub_rows = [
        ["1", "EN", "pre_train", "0.2"],
        ["2", "EN", "pre_train", "0.1"],
        ["3", "EN", "pre_train", "0.9"],
        ["4", "EN", "pre_train", "0.4"],
        ["5", "EN", "pre_train", "0.95"],
    ]
    sub, gold = _ab(tmp_path, "s.csv", B_SUB, sub_rows), _ab(tmp_path, "g.csv", B_GOLD, gold_rows)
    got = evaluate_sts(sub, gold)["pre_train"]
    gold_sim, pred = [float(r[3]) for r in gold_rows], [float(r[3]) for r in sub_rows]
    expected = {
        "ALL": naive_spearman(gold_sim, pred),
        "Idiom": naive_spearman(gold_sim[:2], pred[:2]),
        "STS": naive_spearman(gold_sim[2:], pred[2:]),
    }
    assert len(set(expected.values())) == 3 and _close(got["EN"], expected)
    flat = [r[:3] + ["0.5"] for r in sub_rows]  # every prediction equal: ρ undefined
    got = evaluate_sts(_ab(tmp_path, "f.csv", B_SUB, flat), gold)["pre_train"]
    assert got["EN"] == {"ALL": None, "Idiom": None, "STS": None}
