"""Issue 43 item 9, the evaluators' side: the numbers the recipes' evaluators hand to the reports, compared with
naive computations written here.

- STS (``raycl.recipes.sts.evaluation``): ℓ_align and ℓ_uniform of a trained encoder as the report prints them
  (Wang & Isola, ICML 2020: E‖f(x) − f(y)‖² over the held-out STS pairs scored ≥ ``eval.align_min_score``,
  log E exp(−2‖f(x) − f(y)‖²) over every sentence of those pairs, both averaged over the paper script's batches),
  and the STS dev Spearman (Pearson correlation of average ranks) of the model's cosine similarities. The
  embeddings are taken one sentence at a time with a real (tiny, locally built) encoder and the formulas are loops.
- Idiom (``raycl.recipes.idiom.evaluation``): the dev macro-F1 per language set of a real tiny classifier, from
  per-class counts of its predictions (each example classified alone here) against the gold CSV.
- Coherence (``raycl.recipes.coherence.evaluation``): pairwise accuracy (ties wrong) on each test set and
  Krippendorff's α (nominal, from the coincidence matrix) with the model as one more coder, of a real tiny
  coherence model scoring each document alone.
- The negative stream's per-epoch counters (``StreamStats``): staleness mean and max, refusals, negatives.
- Dense mining (``raycl.miners.dense``): the report's candidates, per-filter drops, negatives, short queries and
  score histograms summed over blocks, against a loop over every candidate applying sentence-transformers' rules.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from raycl.config.tasks import load_space
from raycl.recipes import recipe_for

MWE = "IDbigfishID"
SENTENCES = [
    "He kicked the bucket last week .",
    "The big fish swims in the sea .",
    "She spilled the beans .",
    "A cat sat on the mat .",
    "They were on cloud nine .",
    "The dog barked all night .",
    "We went home early .",
    "It rained on Sunday .",
    "The market fell sharply .",
    "Birds sing at dawn .",
]


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------- naive references
def _unit(v: Sequence[float]) -> list[float]:
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v]


def _sq_dist(a: Sequence[float], b: Sequence[float]) -> float:
    return sum((p - q) ** 2 for p, q in zip(a, b, strict=True))


def naive_align(x: list[list[float]], y: list[list[float]], batch: int) -> float:
    """Mean over batches of the mean ‖x̂ − ŷ‖² of each batch's pairs (x̂: x / ‖x‖)."""
    means = []
    for s in range(0, len(x), batch):
        d = [_sq_dist(_unit(a), _unit(b)) for a, b in zip(x[s : s + batch], y[s : s + batch], strict=True)]
        means.append(sum(d) / len(d))
    return sum(means) / len(means)


def naive_uniform(x: list[list[float]], y: list[list[float]], batch: int) -> float:
    """Mean over batches of log mean_{i<j} exp(−2‖ẑ_i − ẑ_j‖²), z the batch's x rows then its y rows."""
    values = []
    for s in range(0, len(x), batch):
        z = [_unit(v) for v in x[s : s + batch] + y[s : s + batch]]
        terms = [math.exp(-2.0 * _sq_dist(z[i], z[j])) for i in range(len(z)) for j in range(i + 1, len(z))]
        values.append(math.log(sum(terms) / len(terms)))
    return sum(values) / len(values)


def naive_spearman(a: Sequence[float], b: Sequence[float]) -> float:
    def ranks(xs: Sequence[float]) -> list[float]:  # 1-based; ties share their mean position
        return [sum(1 for y in xs if y < x) + (sum(1 for y in xs if y == x) + 1) / 2 for x in xs]

    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((p - ma) * (q - mb) for p, q in zip(ra, rb, strict=True))
    return cov / math.sqrt(sum((p - ma) ** 2 for p in ra) * sum((q - mb) ** 2 for q in rb))


# ---------------------------------------------------------------------------------------------- STS evaluator
@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from raycl.models.sentence_encoder import build_sentence_encoder

    out = tmp_path_factory.mktemp("enc") / "m"
    return build_sentence_encoder("smoke", out, texts=SENTENCES * 4, extra_tokens=[MWE])


HELD_OUT = [  # (split, s1, s2, score): dev and test rows are the geometry's pairs; train rows are not
    ("train", 0, 1, 5.0),
    ("dev", 0, 1, 4.5),
    ("dev", 2, 3, 1.0),
    ("dev", 4, 5, 4.0),
    ("dev", 6, 7, 3.99),
    ("test", 8, 9, 5.0),
    ("test", 1, 2, 2.5),
    ("test", 3, 4, 4.2),
    ("test", 5, 0, 0.0),
    ("dev", 7, 8, 4.8),
]


def _evaluator(tmp_path: Path, rows: Sequence[tuple[str, int, int, float]], *, batch: int, cross: bool):  # type: ignore[no-untyped-def]
    from raycl.recipes.sts.evaluation import Evaluator

    csv_path = tmp_path / "sts.csv"
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["split", "Language", "sentence1", "sentence2", "score"])
        w.writerows([split, "EN", SENTENCES[a], SENTENCES[b], score] for split, a, b, score in rows)
    space = load_space(
        "sts",
        preset="smoke",
        overrides=[
            f"eval.batch_size={batch}",
            "eval.align_min_score=4.0",
            f"model.cross_attention={str(cross).lower()}",
        ],
    )
    cfg, _ = recipe_for("sts").with_data(space.config, tmp_path / "data")
    cfg.data.sts_pretrain = [str(csv_path)]
    return Evaluator(cfg)


def _embed(enc, text: str) -> list[float]:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        return enc.encode([text])[0].tolist()  # one sentence at a time: no padding, no batch


@pytest.mark.parametrize("batch", [3, 64])
def test_sts_alignment_and_uniformity_as_reported(encoder_dir: Path, tmp_path: Path, batch: int) -> None:
    from raycl.models.sentence_encoder import SentenceEncoder

    enc = SentenceEncoder.from_pretrained(encoder_dir).double().eval()
    got = _evaluator(tmp_path, HELD_OUT, batch=batch, cross=True).geometry(enc, "fine_tune")
    held = [r for r in HELD_OUT if r[0] != "train"]  # the evaluator keeps the file's order
    x = [_embed(enc, SENTENCES[a]) for _, a, _, _ in held]
    y = [_embed(enc, SENTENCES[b]) for _, _, b, _ in held]
    pos = [i for i, r in enumerate(held) if r[3] >= 4.0]
    assert len(pos) == 5  # 4.5, 4.0, 5.0, 4.2, 4.8: 3.99 is below the threshold, the train row not held out
    want_align = naive_align([x[i] for i in pos], [y[i] for i in pos], batch)
    assert set(got) == {"align/fine_tune", "uniform/fine_tune"}
    assert got["align/fine_tune"] == pytest.approx(want_align, rel=1e-6)
    assert got["uniform/fine_tune"] == pytest.approx(naive_uniform(x, y, batch), rel=1e-6)
    assert got["align/fine_tune"] > 0.0 and got["uniform/fine_tune"] < 0.0


def test_sts_geometry_degenerate_cases(encoder_dir: Path, tmp_path: Path) -> None:
    """Identical sentences in every pair: ℓ_align = 0; no pair at the threshold: no ℓ_align (not 0); one sentence
    throughout: ℓ_uniform = 0, its maximum."""
    from raycl.models.sentence_encoder import SentenceEncoder

    enc = SentenceEncoder.from_pretrained(encoder_dir).double().eval()
    same = [("dev", i, i, 5.0) for i in range(4)]
    assert _evaluator(tmp_path, same, batch=2, cross=False).geometry(enc, "pre_train")[
        "align/pre_train"
    ] == pytest.approx(0.0, abs=1e-12)
    low = [("dev", 0, 1, 3.0), ("test", 2, 3, 1.0)]
    assert _evaluator(tmp_path, low, batch=2, cross=False).geometry(enc, "pre_train")["align/pre_train"] is None
    one = [("dev", 3, 3, 4.0), ("test", 3, 3, 0.5)]
    assert _evaluator(tmp_path, one, batch=4, cross=False).geometry(enc, "x")["uniform/x"] == pytest.approx(
        0.0, abs=1e-12
    )


@pytest.mark.parametrize("cross", [True, False])
def test_sts_dev_spearman_of_the_models_cosines(encoder_dir: Path, tmp_path: Path, cross: bool) -> None:
    """``sts_dev_spearman``: ρ of the STS dev split's gold scores and the model's cosine of each pair (the
    cross-attended pair, or each side's mean-pooled embedding), each pair scored alone here."""
    from raycl.models.sentence_encoder import SentenceEncoder

    enc = SentenceEncoder.from_pretrained(encoder_dir).double().eval()
    ev = _evaluator(tmp_path, HELD_OUT, batch=2, cross=cross)
    got = ev.dev(enc, setting="pre_train")
    dev = [r for r in HELD_OUT if r[0] == "dev"]
    sims = []
    for _, a, b, _ in dev:
        with torch.no_grad():
            if cross:
                u, v = (t[0].tolist() for t in enc.pair_embeddings([SENTENCES[a]], [SENTENCES[b]]))
            else:
                u, v = _embed(enc, SENTENCES[a]), _embed(enc, SENTENCES[b])
        sims.append(sum(p * q for p, q in zip(_unit(u), _unit(v), strict=True)))
    assert got["sts_dev_spearman"] == pytest.approx(naive_spearman([r[3] for r in dev], sims), abs=1e-9)


def _pair_cosine(enc, a: str, b: str, *, cross: bool) -> float:  # type: ignore[no-untyped-def]
    """One pair's similarity as the model predicts it, the pair alone (no batch, no padding)."""
    with torch.no_grad():
        if cross:
            u, v = (t[0].tolist() for t in enc.pair_embeddings([a], [b]))
        else:
            u, v = _embed(enc, a), _embed(enc, b)
    return sum(p * q for p, q in zip(_unit(u), _unit(v), strict=True))


def naive_sts_scores(gold_csv: str, sim: dict[str, float], langs: Sequence[str]) -> dict[str, float]:
    """The official Subtask B rule, written out: over the gold rows of ``langs``, ρ(target, prediction), the target
    the gold sim or — blank — the prediction of the row's otherID; rows split by DataID's third field."""
    with open(gold_csv, newline="", encoding="utf-8") as f:
        gold = [r for r in csv.DictReader(f) if r["Language"] in langs]
    cols: dict[str, tuple[list[float], list[float]]] = {"ALL": ([], []), "Idiom": ([], []), "STS": ([], [])}
    for r in gold:
        target = float(r["sim"]) if r["sim"] else sim[r["otherID"]]
        parts = r["DataID"].split(".")
        for key in ("ALL", "STS" if len(parts) > 2 and parts[2] == "sts" else "Idiom"):
            cols[key][0].append(target)
            cols[key][1].append(sim[r["ID"]])
    return {k: naive_spearman(*v) for k, v in cols.items()}


def _sims_alone(enc, pairs, *, cross: bool) -> dict[str, float]:  # type: ignore[no-untyped-def]
    return {p.id: _pair_cosine(enc, *p.tokenised(), cross=cross) for p in pairs}


@pytest.mark.parametrize("cross", [True, False])
def test_sts_official_dev_spearman_of_the_models_similarities(
    encoder_dir: Path, tmp_path: Path, cross: bool
) -> None:
    """``dev_spearman`` and ``dev/{ALL,Idiom,STS}``: the official Spearman of the model's similarity of every
    Subtask B dev pair (its MWEs as single tokens), against the gold file read here, EN and PT together."""
    from raycl.models.sentence_encoder import SentenceEncoder

    enc = SentenceEncoder.from_pretrained(encoder_dir).double().eval()
    ev = _evaluator(tmp_path, HELD_OUT, batch=3, cross=cross)
    got = ev.dev(enc, setting="fine_tune")
    want = naive_sts_scores(ev.cfg.data.dev_gold, _sims_alone(enc, ev.dev_examples, cross=cross), ("EN", "PT"))
    assert {k: got[f"dev/{k}"] for k in want} == pytest.approx(want, abs=1e-9)
    assert got["dev_spearman"] == got["dev/ALL"] and got["dev/ALL"] is not None


def test_sts_final_submissions_are_the_models_predictions_officially_scored(
    encoder_dir: Path, tmp_path: Path
) -> None:
    """``final``: both settings' rows of ``dev.submission.csv`` and ``eval.submission.csv`` are each model's
    similarities, and ``dev/<setting>/<langs>/<subset>`` and ``test/…`` are their official Spearman per language
    set (EN, PT, EN+PT), recomputed here from the files' gold."""
    from raycl.models.sentence_encoder import SentenceEncoder

    ev = _evaluator(tmp_path, HELD_OUT, batch=3, cross=True)
    enc = SentenceEncoder.from_pretrained(encoder_dir).eval()
    other = tmp_path / "other"
    with torch.no_grad():  # a second model: the settings' rows must not mix
        torch.manual_seed(3)
        for p in enc.encoder.parameters():
            p.add_(0.3 * torch.randn_like(p) * p.std().nan_to_num(0.02))
    enc.save_pretrained(other)
    models = {"pre_train": encoder_dir, "fine_tune": other}
    got = ev.final(models, tmp_path / "out", device="cpu")
    d = ev.cfg.data
    for split, prefix, gold in (("dev", "dev", d.dev_gold), ("eval", "test", d.eval_gold)):
        pairs = next(s.examples for s in ev.splits if s.name == split)
        with open(tmp_path / "out" / f"{split}.submission.csv", newline="", encoding="utf-8") as f:
            rows = {(r["ID"], r["Setting"]): float(r["Sim"]) for r in csv.DictReader(f)}
        for setting, path in models.items():
            enc = SentenceEncoder.from_pretrained(path).double().eval()
            sims = _sims_alone(enc, pairs, cross=True)
            assert {i: rows[i, setting] for i in sims} == pytest.approx(sims, abs=1e-5)
            for langs in (("EN",), ("PT",), ("EN", "PT")):
                want = naive_sts_scores(gold, {i: rows[i, setting] for i in sims}, langs)
                cells = {k: got[f"{prefix}/{setting}/{'+'.join(langs)}/{k}"] for k in want}
                assert cells == pytest.approx(want, abs=1e-9), (split, setting, langs)
    assert got["dev_spearman"] == got["dev/fine_tune/EN+PT/ALL"]


def test_sts_spearman_degenerate_cases() -> None:
    from raycl.scoring.semeval_metrics import spearman

    gold = [0.5, 1.0, 3.0, 3.0, 4.5]
    assert spearman(gold, [1, 2, 3, 3, 9]) == pytest.approx(1.0)  # a perfect ranking, ties included
    assert spearman(gold, [9, 8, 7, 7, 1]) == pytest.approx(-1.0)
    assert spearman(gold, [7.0] * 5) is None and spearman([1.0], [2.0]) is None  # no ranking to correlate
    rng = random.Random(3)
    for _ in range(5):
        a, b = [rng.randrange(6) for _ in range(12)], [rng.random() for _ in range(12)]
        assert spearman(a, b) == pytest.approx(naive_spearman(a, b), abs=1e-12)


# ---------------------------------------------------------------------------------------------- dense mining
def naive_dense(
    scores: list[list[float]],
    texts: list[list[str]],
    positives: list[list[str]],
    pos_scores: list[list[float]],
    *,
    num_negatives: int,
    range_min: int,
    range_max: int,
    absolute_margin: float | None,
    relative_margin: float | None,
    max_score: float | None,
    min_score: float | None,
) -> tuple[dict[str, int], list[list[str]], int, int]:
    """Per candidate, the first of sentence-transformers' rules that drops it (positives, then the margins
    against the hardest positive p, then the score bounds); the survivors by descending score, ranks
    range_min … range_max−1, the first num_negatives. Returns (drops per rule, chosen texts, candidates,
    short queries). Scores are float32 (as the embeddings' cosines, here and in sentence-transformers), so each
    rule is evaluated in float32: a bound of −0.2 is the float32 −0.2."""
    f32 = np.float32
    dropped = dict.fromkeys(("positives", "absolute_margin", "relative_margin", "max_score", "min_score"), 0)
    chosen, candidates = [], 0
    for row, names, pos, ps in zip(scores, texts, positives, pos_scores, strict=True):
        p = f32(min(ps))
        alive = []
        for s, t in zip(map(f32, row), names, strict=True):
            if s == -math.inf:
                continue
            candidates += 1
            if t in pos:
                dropped["positives"] += 1
            elif absolute_margin is not None and s + f32(absolute_margin) > p:
                dropped["absolute_margin"] += 1
            elif relative_margin is not None and s > p - abs(p) * f32(relative_margin):
                dropped["relative_margin"] += 1
            elif max_score is not None and s > f32(max_score):
                dropped["max_score"] += 1
            elif min_score is not None and s < f32(min_score):
                dropped["min_score"] += 1
            else:
                alive.append((float(s), t))
        alive.sort(key=lambda st: -st[0])
        chosen.append([t for _, t in alive[range_min:range_max][:num_negatives]])
    return dropped, chosen, candidates, sum(1 for c in chosen if len(c) < num_negatives)


@pytest.mark.parametrize("seed", range(6))
def test_dense_report_counts_equal_a_loop_over_every_candidate(seed: int) -> None:
    from raycl.miners.dense import BINS, Candidates, Stats, dense_options, keys_of, select

    rng = np.random.default_rng(seed)
    n, width = 9, 12
    vocab = [f"t{i}" for i in range(40)]
    texts = [list(rng.choice(vocab, size=width, replace=False)) for _ in range(n)]
    scores = np.round(rng.uniform(-0.6, 0.95, size=(n, width)), 3).astype(np.float32)
    scores[rng.uniform(size=(n, width)) < 0.1] = -np.inf  # an exhausted shard's padding
    positives = [
        [texts[i][j] for j in rng.choice(width, size=rng.integers(1, 3), replace=False)] for i in range(n)
    ]
    pos_scores = [[float(x) for x in rng.uniform(-0.3, 0.9, size=len(p)).astype(np.float32)] for p in positives]
    kw = {
        "num_negatives": int(rng.integers(2, 5)),
        "range_min": int(rng.integers(0, 2)),
        "absolute_margin": [None, 0.05][seed % 2],
        "relative_margin": [None, 0.1, 0.3][seed % 3],
        "max_score": [None, 0.7][seed // 3 % 2],
        "min_score": [None, -0.2][seed // 2 % 2],
    }
    opts = dense_options(max_positives=2, range_max=10, **kw)  # type: ignore[arg-type]
    stats = Stats()
    chosen_all = []
    for lo, hi in ((0, 4), (4, n)):  # two blocks, merged as the driver merges the miners' stats
        part = Stats()
        keys = np.stack([keys_of(t) for t in texts[lo:hi]])
        cands = Candidates(scores[lo:hi], keys, np.array(texts[lo:hi], object))
        chosen = select(cands, [keys_of(p) for p in positives[lo:hi]], pos_scores[lo:hi], opts, lo, part)
        chosen_all += [[cands.texts[i, c] for c in cols] for i, cols in enumerate(chosen)]
        stats.merge(part.as_dict())
    want = naive_dense(scores.astype(np.float64).tolist(), texts, positives, pos_scores, range_max=10, **kw)  # type: ignore[arg-type]
    dropped, naive_chosen, candidates, short = want
    assert stats.dropped == dropped and stats.candidates == candidates and stats.short == short
    assert [list(c) for c in chosen_all] == naive_chosen
    assert stats.queries == n and stats.negatives == sum(len(c) for c in naive_chosen)
    assert sum(stats.hist["kept"]) == stats.negatives
    assert sum(stats.hist["dropped"]) == sum(v for k, v in dropped.items() if k != "positives")
    assert sum(stats.hist["positive"]) == sum(len(p) for p in positives)
    kept_scores = [
        float(s) for i, c in enumerate(naive_chosen) for s, t in zip(scores[i], texts[i], strict=True) if t in c
    ]  # Python floats: a float32 compared with a Python float rounds the edge to float32
    edges = BINS.tolist()
    naive_hist = [0] * (len(edges) - 1)
    for s in kept_scores:
        k = next(j for j in range(len(edges) - 1) if s < edges[j + 1] or j == len(edges) - 2)
        naive_hist[k] += 1
    assert stats.hist["kept"] == naive_hist


# ---------------------------------------------------------------------------------------------- idiom evaluator
def _macro_f1(y_true: Sequence[int], y_pred: Sequence[int]) -> float:
    labels = sorted(set(y_true) | set(y_pred))
    f1s = []
    for c in labels:
        tp = sum(1 for t, p in zip(y_true, y_pred, strict=True) if t == c == p)
        wrong = sum(1 for t, p in zip(y_true, y_pred, strict=True) if (t == c) != (p == c))
        f1s.append(2 * tp / (2 * tp + wrong) if tp else 0.0)
    return sum(f1s) / len(f1s)


@pytest.mark.parametrize("setting", ["zero_shot", "one_shot"])
def test_idiom_dev_and_test_macro_f1_per_language_set(tmp_path: Path, setting: str) -> None:
    """``dev_f1`` (during training, rows in memory) and the closing ``dev_f1``/``test_f1`` (from the written
    submissions), per language set, against per-class counts of each example classified alone."""
    from raycl.models.classifier import build_classifier, encode_batch, load_classifier
    from raycl.recipes.idiom.evaluation import Evaluator, model_input

    space = load_space("idiom", preset="smoke", overrides=["eval.batch_size=3"])
    cfg, _ = recipe_for("idiom").with_data(space.config, tmp_path / "data")
    rng = random.Random(1)
    golds: dict[str, list[dict[str, str]]] = {}
    for split, path in (("dev", cfg.data.dev_gold), ("eval", cfg.data.eval_gold)):
        with open(path, newline="", encoding="utf-8") as f:
            gold = list(csv.DictReader(f))
        with open(path, "w", newline="", encoding="utf-8") as f:  # unbalanced: macro ≠ micro ≠ weighted
            w = csv.DictWriter(f, fieldnames=list(gold[0]))
            w.writeheader()
            golds[split] = [{**r, "Label": str(int(rng.random() < 0.35))} for r in gold]
            w.writerows(golds[split])
    ev = Evaluator(cfg, setting)
    model, tok = load_classifier(build_classifier("smoke", tmp_path / "clf", texts=SENTENCES * 3))
    model.eval()
    examples = {s.name: s.examples for s in ev.splits}
    assert set(examples) == {"dev", "eval"}

    def margins(split: str) -> dict[str, float]:  # logit 1 − logit 0 of each example, classified alone
        with torch.no_grad():
            return {
                e.id: float(logits[1] - logits[0])
                for e in examples[split]
                for logits in model(
                    **encode_batch(tok, [model_input(e, setting)], max_len=cfg.model.max_len)
                ).logits
            }

    with torch.no_grad():  # an untrained head says one label for all: amplify it, split at the widest middle gap
        model.classifier.out_proj.weight.mul_(100.0)
        m = sorted(margins("dev").values())
        i = max(range(len(m) // 4, 3 * len(m) // 4), key=lambda j: m[j + 1] - m[j])
        model.classifier.out_proj.bias[1] -= (m[i] + m[i + 1]) / 2  # far from every margin: batching moves none

    def want(split: str, langs: tuple[str, ...]) -> float:
        pred = {i: int(d > 0) for i, d in margins(split).items()}
        assert 0 < sum(pred.values()) < len(pred)  # both labels predicted: no class's F1 is 0 by default
        rows = [(int(g["Label"]), pred[g["ID"]]) for g in golds[split] if g["Language"] in langs]
        return _macro_f1([t for t, _ in rows], [p for _, p in rows])

    got = ev.dev_scores(model, tok)
    final = ev.final(model, tok, tmp_path / "out")
    for key, langs in (("/EN", ("EN",)), ("/PT", ("PT",)), ("", ("EN", "PT"))):
        assert got[f"dev_f1{key}"] == pytest.approx(want("dev", langs), abs=1e-12), key
        assert final[f"dev_f1{key}"] == got[f"dev_f1{key}"], key
        assert final[f"test_f1{key}"] == pytest.approx(want("eval", langs), abs=1e-12), key


# ------------------------------------------------------------------------------------------- coherence evaluator
def naive_alpha(coders: Sequence[Sequence[str | None]]) -> float:
    """Krippendorff's nominal α from the coincidence matrix: units with ≥ 2 values; o_ck = Σ_u (pairs c,k in u) /
    (m_u − 1); α = 1 − (n − 1) Σ_{c≠k} o_ck / Σ_{c≠k} n_c n_k."""
    units = [[c[u] for c in coders if c[u] is not None] for u in range(len(coders[0]))]
    o: dict[tuple[str, str], float] = {}
    for values in (v for v in units if len(v) >= 2):
        for i, a in enumerate(values):
            for j, b in enumerate(values):
                if i != j:
                    o[(a, b)] = o.get((a, b), 0.0) + 1.0 / (len(values) - 1)
    n_c: dict[str, float] = {}
    for (a, _), v in o.items():
        n_c[a] = n_c.get(a, 0.0) + v
    n = sum(n_c.values())
    observed = sum(v for (a, b), v in o.items() if a != b)
    expected = sum(n_c[a] * n_c[b] for a in n_c for b in n_c if a != b)
    return 1.0 - (n - 1) * observed / expected


def test_coherence_test_accuracy_and_alpha_with_the_model_as_a_coder(tmp_path: Path) -> None:
    from raycl.data.coherence import read_pairs
    from raycl.models.coherence import CoherenceScorer
    from raycl.models.coherence_presets import build_coherence_model
    from raycl.recipes.coherence.evaluation import Evaluator

    small = [
        "data.builtin.train=20",
        "data.builtin.dev=4",
        "data.builtin.test=16",
        "data.builtin.intrusion=16",
        "data.builtin.lmvlm=16",
    ]
    space = load_space("coherence", preset="smoke", overrides=["eval.batch_size=3", "eval.num_negs=2", *small])
    cfg, _ = recipe_for("coherence").with_data(space.config, tmp_path / "data")
    ev = Evaluator(cfg)
    scorer = CoherenceScorer.from_pretrained(build_coherence_model("smoke", tmp_path / "m", texts=SENTENCES * 5))
    got = ev.test(scorer)

    for name, specs in cfg.data.test.items():
        items = [it for spec in specs for it in read_pairs(spec)]
        # The documents scored in the evaluator's batches (3, in this order): the tiny model's scores of a pos and
        # its intrusion differ by ~1e-7 or not at all (truncated to the same tokens), so a document scored in
        # another batch could move by float32 noise across a tie; the rule applied to them is the naive part.
        docs = [d for it in items for d in (it.pos, *it.negs[:2])]
        flat = scorer.score_documents(docs, batch_size=3).tolist()
        pos, negs, k = [], [], 0
        for it in items:
            pos.append(flat[k])
            negs.append(flat[k + 1 : k + 1 + len(it.negs[:2])])
            k += 1 + len(it.negs[:2])
        right = sum(1 for p, ns in zip(pos, negs, strict=True) if all(p > x for x in ns))
        assert got[f"test/{name}/acc"] == pytest.approx(right / len(items), abs=1e-12), name
        if name in ev.coders:
            humans = ev.coders[name]
            labels = ["0" if p > ns[0] else "1" if ns[0] > p else None for p, ns in zip(pos, negs, strict=True)]
            assert got[f"test/{name}/alpha"] == pytest.approx(naive_alpha([*humans, labels]), abs=1e-9)
            assert got[f"test/{name}/human_alpha"] == pytest.approx(naive_alpha(humans), abs=1e-9)
    assert "test/lmvlm/alpha" in got  # the built-in data has an annotated set


# ---------------------------------------------------------------------------------------------- stream counters
def test_stream_counters_as_the_reports_read_them() -> None:
    from raycl.distributed.consumer import StreamStats

    stats = StreamStats(mine_wait=1.5, first_wait=0.25, refused=3, negatives=17, staleness=[0, 2, 1, 2, 0])
    m = stats.metrics()
    assert m["stream/staleness_max"] == 2.0 and m["stream/staleness_mean"] == pytest.approx(5 / 5)
    assert (m["stream/refused"], m["stream/negatives"]) == (3.0, 17.0)
    assert (m["timing/mine_wait"], m["timing/mine_wait_first"]) == (1.5, 0.25)
    empty = StreamStats().metrics()  # no item used this epoch: zeros, not an error
    assert empty["stream/staleness_max"] == 0.0 and empty["stream/staleness_mean"] == 0.0


def test_dense_summary_line_prints_the_reports_counts() -> None:
    """``raycl.mine dense``'s closing line: each count of the summary (thousands separated) and the seconds."""
    from raycl.distributed.dense_api import summary_line

    s = {
        "queries": 1234,
        "negatives": 3456,
        "rows": 3400,
        "candidates": 98765,
        "short": 7,
        "num_negatives": 3,
        "seconds": 12.345,
        "dropped": {
            "positives": 1200,
            "absolute_margin": 0,
            "relative_margin": 45678,
            "max_score": 5,
            "min_score": 1,
        },
    }
    line = summary_line(s)
    assert line == (
        "mined 1,234 queries: 3,456 negatives in 3,400 rows; of 98,765 candidates dropped: "
        "positives 1,200, absolute_margin 0, relative_margin 45,678, max_score 5, min_score 1; "
        "7 queries short of 3; 12.3 s"
    )
