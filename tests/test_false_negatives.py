"""False negatives (issue 24): negatives that another annotator's correction equals, counted and dropped."""

from __future__ import annotations

import itertools
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raycl.data.gec import GecExample, load_examples
from raycl.data.m2 import Edit, M2Sentence, write_m2
from raycl.miners.beam_search import select_negatives, write_negatives_parquet
from raycl.miners.false_negatives import FalseNegativeCounts, rate_text, refuted_set

# Hand-made: each sentence one case of the issue's list. The n-best of each is written by hand below.
SENTS = [
    # annotator 0 fixes the verb, annotator 1 leaves it (noop): the source is a false negative
    M2Sentence("He go home .", (Edit(1, 2, "R:VERB:SVA", "goes", 0), Edit(-1, -1, "noop", "-NONE-", 1))),
    # annotator 1 prefers another fix: a beam output equal to it is a false negative
    M2Sentence("I live on Paris .", (Edit(2, 3, "R:PREP", "in", 0), Edit(2, 3, "R:PREP", "at", 1))),
    # both annotators agree: a beam output equal to the target is dropped by the rule, never counted
    M2Sentence("She like tea .", (Edit(1, 2, "R:VERB:SVA", "likes", 0), Edit(1, 2, "R:VERB:SVA", "likes", 1))),
    # one annotator only: nothing can be refuted
    M2Sentence("They is here .", (Edit(1, 2, "R:VERB:SVA", "are", 0),)),
    # annotator 0 makes no edit (noop), annotator 1 does: s = t, so no source negative; 1's fix refutes a beam one
    M2Sentence("It rains a lot .", (Edit(-1, -1, "noop", "-NONE-", 0), Edit(2, 3, "R:DET", "much", 1))),
]
NBEST = [
    ["He goes home .", "He go  home .", "He went home ."],  # the source comes back from the beam too
    ["I live at Paris .", "I live in Paris .", "I live to Paris ."],
    ["She likes tea .", "She liked tea .", "She like tea ."],
    ["They are here .", "They was here .", "They is here ."],
    ["It rains much lot .", "It rains a lot .", "It rain a lot ."],
]


RULES = list(itertools.product([1, 2, 3], [True, False], [False, True]))


def _norm(t: str) -> str:
    return " ".join(t.split())


def _naive(
    examples: list[GecExample], *, k: int, source_negative: bool, refill: bool
) -> dict[str, dict[str, int]]:
    """The counts recomputed independently: what the paper's rule selects, then which of it equal a correction of
    an annotator other than the target's (its own edits applied by hand here)."""
    other_fixes = [{"He go home ."}, {"I live at Paris ."}, {"She likes tea ."}, set(), {"It rains much lot ."}]
    out = {"source": {"selected": 0, "refuted": 0}, "beam": {"selected": 0, "refuted": 0}}
    for ex, nbest, others in zip(examples, NBEST, other_fixes, strict=True):
        seen: list[str] = []
        for h in map(_norm, nbest):
            if h and h not in seen:
                seen.append(h)
        pool = [h for h in seen if h != ex.target][:k] if refill else [h for h in seen[:k] if h != ex.target]
        if source_negative and ex.source != ex.target and ex.source not in pool:
            pool.append(ex.source)
        for neg in pool:
            kind = "source" if neg == ex.source else "beam"
            out[kind]["selected"] += 1
            out[kind]["refuted"] += neg in others and neg != ex.target
    return out


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> list[GecExample]:
    path = tmp_path_factory.mktemp("fn") / "two.m2"
    write_m2(path, SENTS)
    return load_examples([str(path)])


def test_references_are_every_annotators_correction(examples: list[GecExample]) -> None:
    assert examples[0].references == ("He goes home .", "He go home .")  # annotator 1's noop: the source
    assert examples[3].references == ("They are here .",)
    assert examples[4].target == "It rains a lot ." and examples[4].references == (
        "It rains a lot .",
        "It rains much lot .",
    )


@pytest.mark.parametrize("k,source_negative,refill", RULES)
def test_counts_on_a_hand_made_m2_equal_a_naive_count(
    examples: list[GecExample], k: int, source_negative: bool, refill: bool
) -> None:
    counts = FalseNegativeCounts()
    for ex, nbest in zip(examples, NBEST, strict=True):
        kept = select_negatives(
            nbest,
            ex.target,
            ex.source,
            k=k,
            source_negative=source_negative,
            refill=refill,
            references=ex.references,
            counts=counts,
        )
        assert kept == select_negatives(
            nbest, ex.target, ex.source, k=k, source_negative=source_negative, refill=refill
        )  # keep: exactly today's selection
    assert counts.as_dict() == _naive(examples, k=k, source_negative=source_negative, refill=refill)


def test_each_case_is_counted_as_the_issue_says(examples: list[GecExample]) -> None:
    per = []
    for ex, nbest in zip(examples, NBEST, strict=True):
        c = FalseNegativeCounts()
        select_negatives(
            nbest, ex.target, ex.source, k=3, source_negative=True, references=ex.references, counts=c
        )
        per.append(c.as_dict())
    assert per[0]["source"] == {"selected": 1, "refuted": 1}  # annotator 1's noop: the source is correct
    assert per[1]["beam"] == {"selected": 2, "refuted": 1}  # "at" is annotator 1's fix, "to" is not
    assert per[2]["beam"]["refuted"] == 0 and per[2]["beam"]["selected"] == 1  # = target: dropped, not counted
    assert per[3]["source"]["refuted"] == per[3]["beam"]["refuted"] == 0  # one annotator: 0 refuted
    assert per[4]["source"]["selected"] == 0 and per[4]["beam"] == {"selected": 2, "refuted": 1}


@pytest.mark.parametrize("k,source_negative,refill", RULES)
def test_drop_never_selects_a_refuted_negative(
    examples: list[GecExample], k: int, source_negative: bool, refill: bool
) -> None:
    counted, total = FalseNegativeCounts(), FalseNegativeCounts()
    for ex, nbest in zip(examples, NBEST, strict=True):
        keep = select_negatives(
            nbest,
            ex.target,
            ex.source,
            k=k,
            source_negative=source_negative,
            refill=refill,
            references=ex.references,
            counts=total,
        )
        drop = select_negatives(
            nbest,
            ex.target,
            ex.source,
            k=k,
            source_negative=source_negative,
            refill=refill,
            references=ex.references,
            false_negatives="drop",
            counts=counted,
        )
        wrong = {_norm(r) for r in ex.references} - {ex.target}
        assert not wrong & set(drop)
        if not refill:  # the paper's selection less the refuted ones
            assert drop == [n for n in keep if n not in wrong]
        else:  # the n-best's next outputs take the dropped ones' places: k of them when it has them
            room = [h for h in dict.fromkeys(map(_norm, nbest)) if h and h != ex.target and h not in wrong]
            assert drop[: min(k, len(room))] == room[:k]
    assert counted.as_dict() == total.as_dict()  # counted before filtering


def test_parquet_keeps_the_references(examples: list[GecExample], tmp_path: Path) -> None:
    from raycl.miners.records import MinedNegatives

    mined = [MinedNegatives(ex.id, (), ()) for ex in examples]
    path = write_negatives_parquet(tmp_path / "n.parquet", examples, mined, model_version=0)
    table = pq.read_table(path)
    assert table.schema.field("references").type == pa.list_(pa.string())
    assert table.column("references").to_pylist()[0] == ["He goes home .", "He go home ."]


def test_config_keeps_them_in_every_paper_preset_and_refuses_a_bad_value() -> None:
    from raycl.config.tasks import load_space
    from raycl.errors import UserError

    for name in ("gec_pd", "gec_bart"):
        assert load_space(name, preset="paper").config.mining.false_negatives == "keep"
    with pytest.raises(UserError, match=r"mining\.false_negatives.*keep \| drop") as err:
        load_space("gec_pd", preset="smoke", overrides=["mining.false_negatives=maybe"])
    assert "\n" not in str(err.value)


def test_drop_on_a_file_without_references_is_refused_and_refilters_one_with_them(
    examples: list[GecExample], tmp_path: Path
) -> None:
    from raycl.errors import UserError
    from raycl.miners.records import MinedNegatives
    from raycl.miners.shards import check_references, read_negatives, without_false_negatives

    negs = {
        "two.m2:0": ("He went home .", "He go home ."),
        "two.m2:1": ("I live at Paris .", "I live to Paris ."),
        "two.m2:3": ("They is here .",),
    }
    mined = [MinedNegatives(ex.id, negs.get(ex.id, ()), (0.0,) * len(negs.get(ex.id, ()))) for ex in examples]
    path = write_negatives_parquet(tmp_path / "n.parquet", examples, mined, model_version=0)
    got = without_false_negatives(path, {i: list(m.negatives) for i, m in read_negatives(path).items()})
    assert got == {
        "two.m2:0": ["He went home ."],
        "two.m2:1": ["I live to Paris ."],
        "two.m2:2": [],
        "two.m2:3": ["They is here ."],
        "two.m2:4": [],
    }  # one annotator: the source stays a negative
    old = tmp_path / "old.parquet"
    pq.write_table(pq.read_table(path).drop_columns(["references"]), old)
    with pytest.raises(UserError, match=r"old\.parquet: no 'references' column") as err:
        check_references(old)
    assert "\n" not in str(err.value)


class _Scorer:
    """A decoding engine that scores every text 0: select() needs only the sources' scores from it."""

    training = False

    def score_texts(self, sources: list[str], targets: list[str], **_: object) -> list[float]:
        return [0.0] * len(targets)


@pytest.mark.parametrize("mode", ["keep", "drop"])
def test_a_miner_pools_selections_carry_their_counts_to_the_trials_file(tmp_path: Path, mode: str) -> None:
    """A trial with its own miner pool (online mining): each miner's selection carries its counts before the
    drop through the stream (the records themselves, in a MinedBatch), and the trial's false_negatives.json sums
    them — with ``drop`` too, where the negatives it trained on no longer hold the refuted ones."""
    import json

    from raycl.config.tasks import load_space
    from raycl.distributed.messages import MinedBatch, MineTask
    from raycl.miners.beam_search import BeamSearchMiner
    from raycl.miners.records import MinedNegatives
    from raycl.recipes.gec.recipe import FN_FILE, _write_negatives

    path = tmp_path / "two.m2"
    write_m2(path, SENTS)
    examples = load_examples([str(path)])
    cfg = load_space(
        "gec_pd", preset="smoke", overrides=[f"data.finetune=[{path}]", f"mining.false_negatives={mode}"]
    ).config
    miner = BeamSearchMiner(_Scorer(), k=2, beam=3, false_negatives=mode)  # type: ignore[arg-type]
    nbests = [MinedNegatives(ex.id, tuple(nb), (0.0,) * len(nb)) for ex, nb in zip(examples, NBEST, strict=True)]
    records = miner.select(nbests, examples)
    batch = MinedBatch.of(MineTask(0, 0, 0, tuple(examples)), records, model_version=1, miner_id=0)
    _write_negatives(tmp_path, cfg, list(batch.records))
    written = json.loads((tmp_path / FN_FILE).read_text())
    assert written == {"mode": mode, **_naive(examples, k=2, source_negative=True, refill=False)}
    assert written["source"]["refuted"] == 1 and written["beam"]["refuted"] == 2  # the two cases of the M2


def test_the_refuted_set_leaves_out_the_targets_own_text_after_normalising() -> None:
    refs = ["He goes  home .", "He went home .", " He goes home . ", "He  is home ."]
    assert refuted_set(refs, "He goes home .") == {"He went home .", "He is home ."}
    assert refuted_set(["A b ."], " A  b . ") == frozenset()  # one annotator: nothing refuted


def test_counts_merge_another_or_their_printed_form_and_print_rates() -> None:
    a = FalseNegativeCounts()
    a.add(["s", "x", "y"], source=" s ", refuted=frozenset({"s", "y"}))
    assert a.as_dict() == {"source": {"selected": 1, "refuted": 1}, "beam": {"selected": 2, "refuted": 1}}
    b = FalseNegativeCounts.of_flat([2, 0, 5, 3])
    merged = FalseNegativeCounts().merge(a).merge(b.as_dict())  # a counts object, then its JSON form
    assert merged.flat() == [3, 1, 7, 4]
    assert rate_text(merged.as_dict(), "beam") == "4/7 (57.1%)"
    assert rate_text(merged.as_dict(), "source") == "1/3 (33.3%)"
    assert rate_text(FalseNegativeCounts().as_dict(), "beam") == "0/0 (–)"
