"""Coherence data: strict readers, the paper's permuted sets, safe pickles, the built-in corpus."""

from __future__ import annotations

import json
import math
import os
import pickle
import random
import re
from itertools import permutations
from pathlib import Path

import pytest

from raycl.data.coherence import (
    CoherenceItem,
    Document,
    build_permuted_set,
    is_documents,
    read_annotations,
    read_documents,
    read_pairs,
    read_training_set,
    sample_permutations,
    write_documents,
    write_pairs_jsonl,
    write_pairs_pickle,
)
from raycl.data.coherence_corpus import generate_documents, write_builtin_corpus
from raycl.errors import UserError


def _write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8", newline="")
    else:
        path.write_bytes(content)
    return path


def _doc(doc_id: str, n: int) -> Document:
    return Document(doc_id, tuple(f"{doc_id} sentence {i}." for i in range(n)))


# ---------------------------------------------------------------- documents


def test_text_documents_split_on_blank_lines(tmp_path: Path) -> None:
    path = _write(tmp_path / "news.txt", "A b.\nC d.\n\n\n  \nE f.\r\nG h.\nI j.\n")
    expected = [Document("news:0", ("A b.", "C d.")), Document("news:1", ("E f.", "G h.", "I j."))]
    assert read_documents(path) == expected


def test_jsonl_documents_and_round_trips(tmp_path: Path) -> None:
    docs = [Document("wsj_0001", ("One.", "Two.")), Document("wsj_0002", ("Three.", "Four.", "Five."))]
    path = _write(
        tmp_path / "d.jsonl",
        "".join(json.dumps({"id": d.id, "sentences": list(d.sentences)}) + "\n\n" for d in docs),
    )
    assert read_documents(path) == docs
    write_documents(docs, tmp_path / "out.jsonl")
    assert read_documents(tmp_path / "out.jsonl") == docs
    write_documents(docs, tmp_path / "out.txt")
    assert [d.sentences for d in read_documents(tmp_path / "out.txt")] == [d.sentences for d in docs]


@pytest.mark.parametrize(
    ("name", "content", "where", "expected"),
    [
        ("a.jsonl", '{"id": "x", "sentences": ["ok."]}\n{"id": "y", "sentences": [\n', 2, "invalid JSON"),
        ("a.jsonl", '{"id": "x"}\n', 1, '"sentences"'),
        ("a.jsonl", '{"id": 3, "sentences": ["a."]}\n', 1, '"id" is int'),
        ("a.jsonl", '\n{"id": "x", "sentences": ["a.", 7]}\n', 2, "sentence is int"),
        ("a.jsonl", '{"id": "x", "sentences": ["a.\\nb."]}\n', 1, "newline"),
        ("a.jsonl", '{"id": "x", "sentences": ["a\\u0000b."]}\n', 1, "NUL byte"),
        ("a.jsonl", '{"id": "x", "sentences": []}\n', 1, "non-empty list"),
        ("a.jsonl", '{"id": "x", "sentences": ["a."]}\n{"id": "x", "sentences": ["b."]}\n', 2, "duplicate id"),
        ("a.txt", b"One.\nTw\0o.\n", 2, "NUL byte"),
        ("a.txt", b"One.\n\xff\n", 2, "not UTF-8"),
        ("a.txt", "\n\n  \n", None, "empty file"),
        ("a.jsonl", "", None, "empty file"),
    ],
)
def test_document_errors_name_file_and_line(
    tmp_path: Path, name: str, content: str | bytes, where: int | None, expected: str
) -> None:
    path = _write(tmp_path / name, content)
    with pytest.raises(UserError, match=expected) as err:
        read_documents(path)
    prefix = f"{path}:{where}:" if where is not None else f"{path}:"
    assert str(err.value).startswith(prefix) and "\n" not in str(err.value)


# ---------------------------------------------------------------- permutations and permuted sets


@pytest.mark.parametrize(("n", "count"), [(0, 3), (1, 3), (2, 5), (3, 3), (3, 100), (4, 23), (6, 50), (10, 200)])
def test_sample_permutations_are_distinct_and_never_the_identity(n: int, count: int) -> None:
    perms = sample_permutations(n, count, rng=random.Random(7))
    assert len(perms) == min(count, math.factorial(n) - 1)
    assert len(set(perms)) == len(perms)
    assert all(sorted(p) == list(range(n)) and p != tuple(range(n)) for p in perms)
    assert perms == sample_permutations(n, count, rng=random.Random(7))


def test_sample_permutations_cover_all_orderings_at_the_cap() -> None:
    perms = sample_permutations(4, 1000, rng=random.Random(0))
    assert set(perms) == set(permutations(range(4))) - {(0, 1, 2, 3)}


def _blocks(n: int) -> list[int]:
    """Naive: the sizes of the paper's positives made from an n-sentence document (blocks of 10 from 20)."""
    sizes = [n] if n < 20 else [min(10, n - s) for s in range(0, n, 10)]
    return [s for s in sizes if s >= 4]


def test_permuted_set_follows_the_paper() -> None:
    docs = [
        _doc("short", 3),
        _doc("four", 4),
        _doc("mid", 12),
        _doc("nineteen", 19),
        _doc("long", 25),
        _doc("tail", 22),
    ]
    items = build_permuted_set(docs, num_negs=5, copies=20, seed=3)
    for doc in docs:
        mine = [it for it in items if it.id.startswith(doc.id + "#")]
        blocks = sorted({it.id.split("/")[0] for it in mine})
        assert [len(next(it for it in mine if it.id.startswith(b + "/")).pos) for b in blocks] == _blocks(
            len(doc.sentences)
        )
        for block in blocks:
            copies = [it for it in mine if it.id.startswith(block + "/")]
            pos = copies[0].pos
            assert all(it.pos == pos for it in copies)
            assert " ".join(pos) in " ".join(doc.sentences)  # a contiguous block, in the original order
            negs = [n for it in copies for n in it.negs]
            assert len(negs) == min(100, math.factorial(len(pos)) - 1)  # 5 x 20 unique, or every ordering
            assert len(set(negs)) == len(negs) and pos not in negs
            assert all(sorted(n) == sorted(pos) for n in negs)
            assert [len(it.negs) for it in copies[:-1]] == [5] * (len(copies) - 1)
            assert 1 <= len(copies[-1].negs) <= 5
            assert [it.id for it in copies] == [f"{block}/{c}" for c in range(len(copies))]
    assert not any(it.id.startswith("short#") for it in items)
    four = [it for it in items if it.id.startswith("four#")]
    assert [len(it.negs) for it in four] == [5, 5, 5, 5, 3]  # 23 orderings: 4 full copies and the remainder


def test_permuted_set_is_deterministic_and_independent_of_other_documents() -> None:
    docs = [_doc("a", 8), _doc("b", 6)]
    first = build_permuted_set(docs, num_negs=2, copies=3, seed=1)
    assert first == build_permuted_set(docs, num_negs=2, copies=3, seed=1)
    alone = build_permuted_set(docs[1:], num_negs=2, copies=3, seed=1)
    assert alone == [it for it in first if it.id.startswith("b#")]
    assert build_permuted_set(docs, num_negs=2, copies=3, seed=2) != first


def test_repeated_sentences_never_give_a_negative_equal_to_the_positive() -> None:
    doc = Document("rep", ("Same.", "Same.", "Other.", "Last."))
    items = build_permuted_set([doc], num_negs=4, copies=10, seed=0)
    negs = [n for it in items for n in it.negs]
    assert len(negs) == 11 and len(set(negs)) == 11 and doc.sentences not in negs  # 4!/2! - 1 readings
    assert build_permuted_set([Document("x", ("A.",) * 5)], num_negs=1, copies=5, seed=0) == []


# ---------------------------------------------------------------- pairs files


ITEMS = [
    CoherenceItem("d1#0/0", ("A.", "B.", "C."), (("B.", "A.", "C."),)),
    CoherenceItem("d2#0/0", ("D.", "E."), (("E.", "D."),)),
]
TRAIN_ITEMS = [CoherenceItem("d3#0/0", ("A.", "B.", "C."), (("B.", "A.", "C."), ("C.", "B.", "A.")))]


def test_pairs_round_trip_in_the_repo_layouts(tmp_path: Path) -> None:
    write_pairs_pickle(ITEMS, tmp_path / "test.pkl")
    raw = pickle.loads((tmp_path / "test.pkl").read_bytes())
    assert raw[0] == {
        "pos": ["A.", "B.", "C."],
        "neg": ["B.", "A.", "C."],
        "doc_id": "d1#0/0",
        "filename": "d1",
        "reference_file": "d1",
    }
    assert read_pairs(tmp_path / "test.pkl") == ITEMS
    write_pairs_pickle(TRAIN_ITEMS, tmp_path / "train.pickle")
    assert set(pickle.loads((tmp_path / "train.pickle").read_bytes())[0]) == {"pos", "negs", "doc_id"}
    assert read_pairs(tmp_path / "train.pickle") == TRAIN_ITEMS
    write_pairs_jsonl(ITEMS + TRAIN_ITEMS, tmp_path / "all.jsonl")
    assert read_pairs(tmp_path / "all.jsonl") == ITEMS + TRAIN_ITEMS
    # the shipped test sets have no suffix: sniffed by the protocol byte; ids default to <stem>:<index>
    _write(tmp_path / "INSteD_test", pickle.dumps([{"pos": ["x."], "neg": ["y."]}], protocol=3))
    assert read_pairs(tmp_path / "INSteD_test") == [CoherenceItem("INSteD_test:0", ("x.",), (("y.",),))]
    assert not list(tmp_path.glob(".*tmp"))  # atomic writes leave no temp files


class _Shell:
    """Unpickling this runs a shell command with a plain Unpickler."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (self.command,)


class _Eval:
    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return eval, (self.code,)


@pytest.mark.parametrize("name", ["evil.pkl", "evil"])
def test_malicious_pickles_run_nothing(tmp_path: Path, name: str) -> None:
    marker = tmp_path / "MARKER"
    payloads = [
        _Shell(f"touch {marker}"),
        [{"pos": ["a."], "neg": _Shell(f"touch {marker}")}],  # nested deep inside valid-looking data
        _Eval(f"__import__('os').system('touch {marker}')"),
    ]
    for payload, qualname in zip(payloads, [os.system.__module__, os.system.__module__, "builtins"], strict=True):
        path = _write(tmp_path / name, pickle.dumps(payload, protocol=3))
        for reader in (read_pairs, read_annotations):
            with pytest.raises(UserError) as err:
                reader(path)
            assert str(err.value).startswith(f"{path}: pickle refers to '{qualname}.")
            assert str(err.value).endswith("; only builtin containers and strings are allowed")
            assert not marker.exists()
    pickle.loads(pickle.dumps(_Shell(f"touch {marker}")))  # the payload is real: a plain load runs it
    assert marker.exists()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"pos": ["a."]}, "pickle holds dict, expected a list"),
        ([{"pos": ["a."], "neg": ["b."]}, "text"], "item 1: expected a dict with 'pos'"),
        ([{"pos": ["a."]}], "item 0: expected a dict with 'pos' and 'neg'"),
        ([{"pos": "a. b.", "neg": ["b."]}], "item 0: 'pos' must be a non-empty list"),
        ([{"pos": ["a."], "neg": ["b.", 3]}], "item 0: 'neg' must be a non-empty list"),
        ([{"pos": ["a."], "negs": [["b."], []]}], "item 0: negs\\[1\\]: 'negs' must be"),
        ([], "no pairs"),
    ],
)
def test_pair_structure_errors_name_the_item(tmp_path: Path, data: object, expected: str) -> None:
    path = _write(tmp_path / "p.pkl", pickle.dumps(data, protocol=3))
    with pytest.raises(UserError, match=expected) as err:
        read_pairs(path)
    assert str(err.value).startswith(f"{path}: ")


def test_bad_pair_files(tmp_path: Path) -> None:
    cases = [
        (_write(tmp_path / "x.pkl", b"\x80\x03]q\x00"), "x.pkl: not a valid pickle"),
        (_write(tmp_path / "plain", "pos neg\n"), "plain: not a pickle"),
        (_write(tmp_path / "p.jsonl", '{"pos": ["a."], "neg": ["b."]}\n{"pos": ["a."]\n'), "p.jsonl:2: invalid"),
        (
            _write(tmp_path / "q.jsonl", '{"pos": ["a."], "neg": ["b."]}\n\n{"pos": [1], "neg": ["b."]}\n'),
            "q.jsonl:3: 'pos' must be",
        ),
    ]
    for path, expected in cases:
        with pytest.raises(UserError) as err:
            read_pairs(path)
        assert str(err.value).startswith(str(tmp_path / expected))


def test_documents_and_pairs_files_are_told_apart_by_their_content(tmp_path: Path) -> None:
    docs, pairs = [_doc("d", 3)], [CoherenceItem("p", ("a.", "b."), (("b.", "a."),))]
    write_documents(docs, tmp_path / "docs.txt")
    write_documents(docs, tmp_path / "docs.jsonl")
    write_pairs_jsonl(pairs, tmp_path / "pairs.jsonl")
    write_pairs_pickle(pairs, tmp_path / "pairs.pkl")
    os.replace(tmp_path / "pairs.pkl", tmp_path / "pairs")  # a pickle without its suffix: the 0x80 byte says so
    _write(tmp_path / "blank.jsonl", "\n\n" + (tmp_path / "docs.jsonl").read_text(encoding="utf-8"))
    _write(tmp_path / "bad.jsonl", "{not json\n")  # read_documents names the line
    told = {p.name: is_documents(p) for p in sorted(tmp_path.iterdir())}
    assert told == {
        "bad.jsonl": True,
        "blank.jsonl": True,
        "docs.jsonl": True,
        "docs.txt": True,
        "pairs": False,
        "pairs.jsonl": False,
    }
    assert read_pairs(tmp_path / "pairs") == pairs and read_documents(tmp_path / "blank.jsonl") == docs


def test_a_training_set_permutes_documents_keeps_pairs_and_refuses_a_missing_file_or_no_item(
    tmp_path: Path,
) -> None:
    docs, pairs = [_doc("d", 5), _doc("e", 4)], [CoherenceItem("p", ("a.", "b."), (("b.", "a."),))]
    write_documents(docs, tmp_path / "docs.jsonl")
    write_pairs_jsonl(pairs, tmp_path / "pairs.jsonl")
    permute = {"copies": 2, "seed": 7, "min_sentences": 4}
    got = read_training_set([str(tmp_path / "docs.jsonl"), str(tmp_path / "pairs.jsonl")], num_negs=3, **permute)
    assert got == build_permuted_set(docs, num_negs=3, **permute) + pairs  # each file in turn, in order
    with pytest.raises(UserError, match=r"missing\.txt: no such file \(data\.train\)$"):
        read_training_set([str(tmp_path / "pairs.jsonl"), str(tmp_path / "missing.txt")], num_negs=3)
    write_documents([_doc("short", 3)], tmp_path / "short.txt")  # every document under min_sentences
    with pytest.raises(
        UserError, match=r"^data\.train: .*short\.txt gives no training items \(documents need ≥ 4 "
    ):
        read_training_set([str(tmp_path / "short.txt")], num_negs=3, **permute)


def test_annotations_pickle_or_json_aligned(tmp_path: Path) -> None:
    coders = [["0", "1", "1"], ["0", "0", "1"], ["1", None, "1"]]
    _write(tmp_path / "LMvLM_Annotations", pickle.dumps(coders, protocol=3))
    assert read_annotations(tmp_path / "LMvLM_Annotations") == coders
    _write(tmp_path / "a.json", json.dumps([[0, 1], ["1", None]]))
    assert read_annotations(tmp_path / "a.json") == [["0", "1"], ["1", None]]
    bad = [
        ([["0", "1"], ["0"]], "expected equal lengths"),
        ([["0", "yes"]], "item 1: label 'yes'"),
        ({"a": ["0"]}, "expected a non-empty list"),
        ([], "expected a non-empty list"),
    ]
    for content, expected in bad:
        path = _write(tmp_path / "bad.json", json.dumps(content))
        with pytest.raises(UserError, match=expected) as err:
            read_annotations(path)
        assert str(err.value).startswith(f"{path}: ")


# ---------------------------------------------------------------- built-in corpus


def _order_violations(sentences: tuple[str, ...]) -> int:
    """Naive discourse checks: intro first, ending last, "The X" not before "a/an [adj] X" introduces X."""
    bad = int(not (" named " in sentences[0] or "a young" in sentences[0] or " who lived " in sentences[0]))
    bad += sum(s.startswith(("Finally,", "In the end,")) for s in sentences[:-1])
    for i, s in enumerate(sentences):
        words = s.rstrip(".").split()
        intro = re.compile(rf"\ban? ([\w-]+ )?{re.escape(words[1])}\b")
        introduced_at = [j for j, other in enumerate(sentences) if intro.search(other)]
        bad += words[0] == "The" and bool(introduced_at) and min(introduced_at) > i
    return bad


def test_generated_stories_are_coherent_only_in_order() -> None:
    docs = generate_documents(150, seed=5)
    assert docs == generate_documents(150, seed=5) and docs != generate_documents(150, seed=6)
    lengths = [len(d.sentences) for d in docs]
    assert min(lengths) == 4 and max(lengths) == 25 and len(set(lengths)) == 22
    assert len({d.sentences for d in docs}) == 150 and all(len(set(d.sentences)) == len(d.sentences) for d in docs)
    assert all(_order_violations(d.sentences) == 0 for d in docs)
    items = build_permuted_set(docs, num_negs=1, copies=3, seed=0)
    caught = sum(_order_violations(it.negs[0]) > 0 for it in items)
    assert caught / len(items) > 0.9  # a permutation almost always breaks a cue a model can learn


def test_builtin_corpus_files(tmp_path: Path) -> None:
    sizes = {"train": 30, "dev": 6, "test": 8, "intrusion": 10, "lmvlm": 12}
    paths = write_builtin_corpus(tmp_path / "a", seed=4, sizes=sizes)
    again = write_builtin_corpus(tmp_path / "b", seed=4, sizes=sizes)
    assert all(p.read_bytes() == again[k].read_bytes() for k, p in paths.items())
    train = read_documents(paths["train"])
    dev, test = read_pairs(paths["dev"]), read_pairs(paths["test"])
    assert len(train) == 30 and all(len(it.negs) == 5 for it in dev) and all(len(it.negs) == 1 for it in test)
    assert not {d.sentences for d in train} & {it.pos for it in dev + test}
    intrusion = read_pairs(paths["intrusion"])
    assert len(intrusion) == 10
    for it in intrusion:
        (neg,) = it.negs
        diff = [i for i, (a, b) in enumerate(zip(it.pos, neg, strict=True)) if a != b]
        assert len(diff) == 1 and diff[0] > 0 and neg[diff[0]] not in it.pos
    lmvlm, coders = read_pairs(paths["lmvlm"]), read_annotations(paths["lmvlm_annotations"])
    assert len(coders) == 3 and all(len(c) == len(lmvlm) == 12 for c in coders)
    agree, decided = 0, set()
    for u, it in enumerate(lmvlm):
        assert it.pos[:2] == it.negs[0][:2] and sorted(it.pos) == sorted(it.negs[0]) and it.pos != it.negs[0]
        bad_pos, bad_neg = _order_violations(it.pos), _order_violations(it.negs[0])
        if bad_pos != bad_neg:  # the side with fewer broken cues is the original continuation
            coherent = "0" if bad_pos < bad_neg else "1"
            decided.add(coherent)
            agree += [c[u] for c in coders].count(coherent) >= 2
    assert decided == {"0", "1"}  # the coherent side is sometimes pos, sometimes neg, as in LMvLM
    assert agree >= 0.8 * len(lmvlm)
