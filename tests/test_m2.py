"""M2 reader, data specs and GEC example loading: strict errors with file:line, slices like Python's."""

from __future__ import annotations

from pathlib import Path

import pytest

from raycl.data.gec import GecExample, load_examples, load_references, read_parallel, write_parallel
from raycl.data.m2 import Edit, M2Sentence, iter_lines, read_m2, write_m2
from raycl.data.specs import Spec, parse_spec
from raycl.errors import UserError

A_DET = "A 0 1|||R:DET|||The|||REQUIRED|||-NONE-|||0"
GOOD = (
    f"S A cat sleep .\n{A_DET}\nA 2 3|||R:VERB:SVA|||sleeps|||REQUIRED|||-NONE-|||0\n\nS Fine .\n"
    "A -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||0\n\n"
)


def _write(tmp_path: Path, content: str | bytes, name: str = "x.m2") -> Path:
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8", newline="")
    else:
        path.write_bytes(content)
    return path


def test_reads_blocks_edits_and_noops(tmp_path: Path) -> None:
    sents = read_m2(_write(tmp_path, GOOD))
    assert [s.source for s in sents] == ["A cat sleep .", "Fine ."]
    assert sents[0].edits == (Edit(0, 1, "R:DET", "The", 0), Edit(2, 3, "R:VERB:SVA", "sleeps", 0))
    assert sents[0].target() == "The cat sleeps ."
    assert sents[1].edits_of(0) == [] and sents[1].target() == "Fine ."


def test_crlf_and_missing_trailing_blank_line_parse_the_same(tmp_path: Path) -> None:
    expected = read_m2(_write(tmp_path, GOOD))
    assert read_m2(_write(tmp_path, GOOD.replace("\n", "\r\n"), "crlf.m2")) == expected
    assert read_m2(_write(tmp_path, GOOD.rstrip("\n"), "notrail.m2")) == expected
    assert read_m2(_write(tmp_path, "\ufeff" + GOOD, "bom.m2")) == expected


def test_none_correction_on_a_real_edit_is_a_deletion(tmp_path: Path) -> None:
    (sent,) = read_m2(_write(tmp_path, "S a the cat\nA 1 2|||U:DET|||-NONE-|||REQUIRED|||-NONE-|||0\n"))
    # kept verbatim (errant_compare compares the raw strings), applied as a deletion
    assert sent.edits[0].correction == "-NONE-" and sent.target() == "a cat"


def test_write_read_round_trip(tmp_path: Path) -> None:
    edits = (Edit(1, 2, "R:VERB:SVA", "goes", 0), Edit(4, 5, "U:DET", "", 0), Edit(1, 2, "R:VERB", "went", 1))
    noop = (Edit(-1, -1, "noop", "-NONE-", 0),)
    sents = [M2Sentence("He go to the the school .", edits), M2Sentence("Ok .", noop)]
    write_m2(tmp_path / "rt.m2", sents)
    assert read_m2(tmp_path / "rt.m2") == sents
    assert not list(tmp_path.glob(".*.tmp"))


S = "S a b\n"
MALFORMED = [
    ("a.m2", "", None, "empty M2 file, expected 'S ' lines"),
    ("b.m2", "\n\n", None, "empty M2 file, expected 'S ' lines"),
    ("c.m2", A_DET + "\n", 1, "expected an 'S ' line first"),
    ("d.m2", S + "\n" + A_DET + "\n", 3, "expected an 'S ' line first"),
    ("e.m2", S + "A 0 1|||R:DET|||the|||REQUIRED|||0\n", 2, "5 '|||'-separated fields, expected 6"),
    ("f.m2", S + "A 0 x|||R:DET|||the|||REQUIRED|||-NONE-|||0\n", 2, "expected two integers"),
    ("g.m2", S + "A 0|||R:DET|||the|||REQUIRED|||-NONE-|||0\n", 2, "expected two integers"),
    ("h.m2", S + "A 0 3|||R:DET|||the|||REQUIRED|||-NONE-|||0\n", 2, "expected 0 <= start <= end <= 2"),
    ("i.m2", S + "A 2 1|||R:DET|||the|||REQUIRED|||-NONE-|||0\n", 2, "out of range"),
    ("j.m2", S + "A -1 1|||R:DET|||the|||REQUIRED|||-NONE-|||0\n", 2, "out of range"),
    ("k.m2", S + "A 0 1|||R:DET|||the|||REQUIRED|||-NONE-|||one\n", 2, "annotator id 'one', expected an integer"),
    ("l.m2", S + "S c d\n", 2, "second 'S' line"),
    ("m.m2", S + "B 0 1\n", 2, "expected 'S ', 'A ' or a blank line"),
    ("n.m2", b"S a b\n\nS c\x00d\n", 3, "NUL byte"),
    ("o.m2", b"S a b\n\nS caf\xe9\n", 3, "not UTF-8"),
]


@pytest.mark.parametrize(("name", "content", "line", "expected"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_m2_names_file_line_and_expectation(
    tmp_path: Path, name: str, content: str | bytes, line: int | None, expected: str
) -> None:
    path = _write(tmp_path, content, name)
    with pytest.raises(UserError) as err:
        read_m2(path)
    where = f"{path}:{line}: " if line is not None else f"{path}: "
    assert str(err.value).startswith(where), str(err.value)
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cannot read"):
        read_m2(tmp_path / "nope.m2")


@pytest.mark.parametrize("chunk", [1, 4, 7, 64])
def test_iter_lines_across_chunk_boundaries(tmp_path: Path, chunk: int) -> None:
    text = "première ligne\r\nzweite Zeile – lang\n\nlast line without newline ünïcödé"
    path = _write(tmp_path, text.encode("utf-8"), "t.txt")
    assert list(iter_lines(path, chunk_bytes=chunk)) == list(enumerate(text.splitlines(), 1))
    bad = _write(tmp_path, ("ok\n" * 6 + "bad\x00\n").encode(), "nul.txt")
    with pytest.raises(UserError, match=r"nul\.txt:7: NUL byte"):
        list(iter_lines(bad, chunk_bytes=chunk))


# --- specs ----------------------------------------------------------------------------------------------
def _m2_of(tmp_path: Path, n: int, name: str = "c.m2") -> Path:
    write_m2(tmp_path / name, [M2Sentence(f"s{i} x", (Edit(1, 2, "R:NOUN", f"y{i}", 0),)) for i in range(n)])
    return tmp_path / name


@pytest.mark.parametrize(
    "text",
    [
        "c.m2",
        "c.m2[1000:]",
        "c.m2[:1000]",
        "c.m2[-5:]",
        "c.m2[3:-2]",
        "a.txt|b.txt",
        "a.txt|b.txt[10:20]",
        "d.tsv[:-1]",
    ],
)
def test_spec_str_round_trips(text: str) -> None:
    spec = parse_spec(text, must_exist=False)
    assert str(spec) == text and parse_spec(str(spec), must_exist=False) == spec


def test_spec_formats() -> None:
    assert parse_spec("x/CWEB-S.dev.m2[1000:]", must_exist=False) == Spec(Path("x/CWEB-S.dev.m2"), 1000, None)
    assert parse_spec("a.tsv", must_exist=False).format == "tsv"
    pair = parse_spec("a.src|a.tgt[:5]", must_exist=False)
    assert (pair.format, pair.path, pair.target_path, pair.stop) == ("pair", Path("a.src"), Path("a.tgt"), 5)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("x.m2[1:a]", "data spec 'x.m2[1:a]': expected PATH or PATH[START:STOP] with integer bounds"),
        ("x.m2[5]", "expected PATH or PATH[START:STOP]"),
        ("x.m2[::2]", "expected PATH or PATH[START:STOP]"),
        ("x.m2[1.5:]", "expected PATH or PATH[START:STOP]"),
        ("x.txt", "unknown format, expected an M2 file (first line 'S ...'), a .tsv file or SRC|TGT"),
        ("a|b|c", "expected PATH, or SRC|TGT"),
    ],
)
def test_bad_specs(text: str, expected: str) -> None:
    with pytest.raises(UserError) as err:
        parse_spec(text, must_exist=False)
    assert expected in str(err.value)


def test_format_is_sniffed_when_the_name_does_not_say(tmp_path: Path) -> None:
    """CWEB ships an M2 file named ``CWEB-G.test.norm.tok.ann1``: read it by content."""
    noop = "A -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||1"
    m2 = _write(tmp_path, f"S a cat\n{noop}\n", "CWEB-G.test.norm.tok.ann1")
    tsv = _write(tmp_path, "a cat\tthe cat\n", "pairs.txt")
    prose = _write(tmp_path, "just text\n", "notes.txt")
    assert parse_spec(f"{m2}[:1]").format == "m2" and parse_spec(str(tsv)).format == "tsv"
    with pytest.raises(UserError, match="unknown format"):
        parse_spec(str(prose))


def test_missing_spec_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such file"):
        parse_spec(str(tmp_path / "gone.m2") + "[:10]")


@pytest.mark.parametrize(
    "bounds",
    [
        (1000, None),
        (None, 1000),
        (-5, None),
        (3, -2),
        (-7, -3),
        (None, -1),
        (2000, None),
        (0, 0),
        (None, None),
        (-3000, 10),
    ],
)
def test_select_slices_like_python(bounds: tuple[int | None, int | None]) -> None:
    start, stop = bounds
    items = [f"sent{i}" for i in range(1500)]
    got = Spec(Path("c.m2"), start, stop).select(iter(items))
    assert got == list(enumerate(items))[start:stop]


# --- examples and references ----------------------------------------------------------------------------
def test_load_examples_slices_with_file_indices(tmp_path: Path) -> None:
    path = _m2_of(tmp_path, 12)
    dev = load_examples([f"{path}[:10]"])
    rest = load_examples([f"{path}[10:]"])
    assert [e.id for e in rest] == ["c.m2:10", "c.m2:11"]
    assert rest[0] == GecExample("c.m2:10", "s10 x", "s10 y10", ("s10 y10",))  # one annotator: its correction
    assert len(dev) == 10 and {e.id for e in dev}.isdisjoint(e.id for e in rest)
    assert load_examples([f"{path}[-2:]"]) == rest


def test_overlapping_specs_are_rejected(tmp_path: Path) -> None:
    path = _m2_of(tmp_path, 5)
    with pytest.raises(UserError, match="also comes from"):
        load_examples([f"{path}[:3]", f"{path}[2:]"])


def test_annotator_choice_falls_back_to_lowest_present(tmp_path: Path) -> None:
    sents = [
        M2Sentence("a b", (Edit(0, 1, "R:X", "A", 0), Edit(1, 2, "R:X", "B", 1))),
        M2Sentence("c d", (Edit(0, 1, "R:X", "C", 2),)),
        M2Sentence("e f", (Edit(-1, -1, "noop", "-NONE-", 0),)),
    ]
    write_m2(tmp_path / "ann.m2", sents)
    targets = [e.target for e in load_examples([str(tmp_path / "ann.m2")], annotator=1)]
    assert targets == ["a B", "C d", "e f"]
    assert [e.target for e in load_examples([str(tmp_path / "ann.m2")])] == ["A b", "C d", "e f"]


def test_parallel_pair_and_tsv(tmp_path: Path) -> None:
    write_parallel(tmp_path / "p.src", ["a b", "c d", "e"])
    write_parallel(tmp_path / "p.tgt", ["A b", "c D", "E"])
    _write(tmp_path, "a b\tA b\r\nc d\tc D\ne\tE", "p.tsv")
    pair = load_examples([f"{tmp_path / 'p.src'}|{tmp_path / 'p.tgt'}[1:]"])
    assert pair == [GecExample("p.src:1", "c d", "c D", ("c D",)), GecExample("p.src:2", "e", "E", ("E",))]
    assert [(e.source, e.target) for e in load_examples([str(tmp_path / "p.tsv")])] == read_parallel(
        parse_spec(f"{tmp_path / 'p.src'}|{tmp_path / 'p.tgt'}")
    )


def test_parallel_errors(tmp_path: Path) -> None:
    write_parallel(tmp_path / "s.txt", ["a", "b", "c"])
    write_parallel(tmp_path / "t.txt", ["A", "B"])
    with pytest.raises(UserError) as err:
        load_examples([f"{tmp_path / 's.txt'}|{tmp_path / 't.txt'}"])
    assert "s.txt has 3 lines" in str(err.value) and "t.txt has 2" in str(err.value)
    _write(tmp_path, "a\tA\nb B\n", "bad.tsv")
    with pytest.raises(UserError, match=r"bad\.tsv:2: 1 tab-separated fields, expected 'source<TAB>target'"):
        load_examples([str(tmp_path / "bad.tsv")])


def test_references_must_be_m2(tmp_path: Path) -> None:
    path = _m2_of(tmp_path, 8)
    refs = load_references([f"{path}[:3]", f"{path}[-2:]"])
    assert [r.source for r in refs] == ["s0 x", "s1 x", "s2 x", "s6 x", "s7 x"]
    _write(tmp_path, "a\tb\n", "d.tsv")
    with pytest.raises(UserError, match="references must be M2"):
        load_references([str(tmp_path / "d.tsv")])


def test_write_parallel_is_atomic_and_rejects_newlines(tmp_path: Path) -> None:
    write_parallel(tmp_path / "out" / "h.txt", ["one", "two"])
    assert (tmp_path / "out" / "h.txt").read_text() == "one\ntwo\n"
    with pytest.raises(ValueError, match="newline"):
        write_parallel(tmp_path / "out" / "h.txt", ["ok", "bad\nline"])
    assert (tmp_path / "out" / "h.txt").read_text() == "one\ntwo\n"
    assert not list((tmp_path / "out").glob(".*.tmp"))


def test_per_annotator_files_of_one_set_merge_and_different_sets_concatenate(tmp_path: Path) -> None:
    """CWEB ships each test annotator as its own file (annotator id 0 in both): same S lines → one set."""
    from raycl.data.gec import load_references

    a0 = _write(tmp_path, "S a cat sat\nA 0 1|||R:DET|||the|||REQUIRED|||-NONE-|||0\n\nS ok\n", "t.ann0.m2")
    a1 = _write(
        tmp_path,
        "S a cat sat\nA -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||0\n\nS ok\n"
        "A 0 1|||R:OTHER|||fine|||REQUIRED|||-NONE-|||0\n",
        "t.ann1.m2",
    )
    merged = load_references([str(a0), str(a1)])
    assert [s.source for s in merged] == ["a cat sat", "ok"]
    assert [s.annotators() for s in merged] == [[0, 1], [0, 1]]
    assert (merged[0].target(0), merged[0].target(1)) == ("the cat sat", "a cat sat")
    assert (merged[1].target(0), merged[1].target(1)) == ("ok", "fine")
    other = _write(tmp_path, "S another one\n", "other.m2")
    assert [s.source for s in load_references([str(a0), str(other)])] == ["a cat sat", "ok", "another one"]
