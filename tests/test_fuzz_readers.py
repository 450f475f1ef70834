"""Fuzzing the readers: whatever bytes a user (or someone who shares their folders) hands raycl, each reader
returns a result or raises raycl's one-line :class:`~raycl.errors.UserError` — never another exception, never
past a memory bound — over M2 and parallel text, the SemEval CSVs, coherence JSONL, negatives and n-best Parquet,
tune-space YAML files and ``--set`` values (docs/security.md, "Bounded readers").

Hypothesis rather than atheris: it runs inside pytest on the project's Python with no compiled harness, shrinks a
failure to the smallest input that shows it (and prints it), and is bounded by ``max_examples`` and a per-example
``deadline``, so the whole module takes well under a minute in CI. The CI run is derandomized (the same examples
every run: a red CI is a regression, not luck); ``RAYCL_FUZZ_EXAMPLES=N`` runs N random examples per reader.
Generated inputs are small (kilobytes) and built to reach the limits that matter: nesting thousands deep,
integers of thousands of digits, slice bounds of 10^30, Parquet dictionaries whose values repeat into hundreds
of megabytes, corrupted Parquet bytes, YAML aliases and qrange steps of 1e-320.
"""

from __future__ import annotations

import math
import os
import resource
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raycl.errors import UserError

_RANDOM = os.environ.get("RAYCL_FUZZ_EXAMPLES")
FUZZ = settings(
    max_examples=int(_RANDOM or 60),
    deadline=timedelta(seconds=10),
    database=None,
    derandomize=_RANDOM is None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
GROWTH_MB = 256  # how far one test's examples may raise the process's peak RSS (the inputs are kilobytes)


def holds(read: Callable[[], Any]) -> Any:
    """The contract: ``read()`` returns, or raises a non-empty one-line UserError; anything else propagates."""
    try:
        return read()
    except UserError as err:
        text = str(err)
        if not text.strip() or "\n" in text:  # no assert: pytest's diff of a long text recurses deeply
            raise AssertionError(f"not a one-line error: {text[:400]!r}") from None
        return None


@contextmanager
def memory_bound() -> Iterator[None]:
    """The peak RSS of this process may rise by at most :data:`GROWTH_MB` while the examples run."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    yield
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    assert grown < GROWTH_MB, f"peak RSS grew by {grown:.0f} MB"


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="raycl-fuzz-") as tmp:
        yield Path(tmp)


def _file(folder: Path, name: str, data: bytes | str) -> Path:
    path = folder / name
    path.write_bytes(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    return path


# ------------------------------------------------------------------------------------------------ strategies
words = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
digits = st.integers(1, 6000).map(lambda n: "9" * n)
numberish = st.one_of(
    st.integers(-10, 10**6).map(str),
    digits,
    st.sampled_from(
        [
            "1e30",
            "-1e30",
            ".inf",
            "-.inf",
            ".nan",
            "nan",
            "1e-320",
            "1.0e-10",
            "0x10",
            "1_000",
            "+5",
            "",
            " ",
            "-0",
        ]
    ),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


def nested(depth: int, core: str = "1") -> str:
    return "[" * depth + core + "]" * depth


deep = st.integers(0, 5000).map(nested)


# ------------------------------------------------------------------------------------------------ M2 and text
m2_line = st.one_of(
    st.builds(lambda ws: "S " + " ".join(ws), st.lists(words, max_size=6)),
    st.builds(
        lambda a, b, t, c, n: f"A {a} {b}|||{t}|||{c}|||REQUIRED|||-NONE-|||{n}",
        numberish,
        numberish,
        st.sampled_from(["R:VERB", "noop", "M:DET", ""]),
        words,
        numberish,
    ),
    st.just(""),
    words,
    st.sampled_from(["\x00", "A", "S", "\ufeffS a", "A -1 -1|||noop|||-NONE-"]),
)


@FUZZ
@given(
    lines=st.lists(m2_line, max_size=12),
    newline=st.sampled_from(["\n", "\r\n"]),
    raw=st.binary(max_size=64),
    start=numberish,
    stop=numberish,
    kind=st.sampled_from(["m2", "tsv", "pair", "sniffed"]),
)
def test_m2_and_parallel_text_readers(
    scratch: Path, lines: list[str], newline: str, raw: bytes, start: str, stop: str, kind: str
) -> None:
    from raycl.data.gec import load_examples, load_references

    text = newline.join(lines).encode("utf-8", "surrogatepass") + raw
    names = {"m2": ["x.m2"], "tsv": ["x.tsv"], "pair": ["x.src", "x.tgt"], "sniffed": ["x.ann1"]}[kind]
    paths = [_file(scratch, n, text) for n in names]
    spec = "|".join(str(p) for p in paths)
    with memory_bound():
        for given_spec in (spec, f"{spec}[{start}:{stop}]"):
            holds(lambda s=given_spec: load_examples([s]))
            if kind == "m2":
                holds(lambda s=given_spec: load_references([s]))


# ------------------------------------------------------------------------------------------------ CSV
cell = st.one_of(words, numberish, st.sampled_from(['"', '""', '"a,b"', "a\nb", "\r", "\x00", "None", "1.5"]))


@FUZZ
@given(
    rows=st.lists(st.lists(cell, max_size=10), max_size=8),
    header_ok=st.booleans(),
    raw=st.binary(max_size=32),
    reader=st.sampled_from(
        ["idiom_train", "idiom_inputs", "idiom_gold", "sts_train", "sts_inputs", "sts_gold", "sts_pretrain"]
    ),
)
def test_semeval_csv_readers(
    scratch: Path, rows: list[list[str]], header_ok: bool, raw: bytes, reader: str
) -> None:
    from raycl.data import semeval

    header = {
        "idiom_train": semeval.A_TRAIN_HEADER,
        "idiom_inputs": semeval.A_INPUT_HEADER,
        "idiom_gold": semeval.A_GOLD_HEADER,
        "sts_train": semeval.B_TRAIN_HEADER,
        "sts_inputs": semeval.B_INPUT_HEADER,
        "sts_gold": semeval.B_GOLD_HEADER,
        "sts_pretrain": semeval.STS_PRETRAIN_HEADER,
    }[reader]
    lines = [",".join(header) if header_ok else ",".join(rows[0] if rows else [])]
    lines += [",".join(r) for r in rows]
    path = _file(scratch, f"{reader}.csv", ("\n".join(lines)).encode("utf-8", "surrogatepass") + raw)
    with memory_bound():
        holds(lambda: getattr(semeval, f"read_{reader}")(path))


# ------------------------------------------------------------------------------------------------ JSONL
def _quoted(word: str) -> str:
    return '"' + word.replace("\\", "").replace('"', "") + '"'


def _array(items: list[str]) -> str:
    return "[" + ", ".join(items) + "]"


json_scalar = st.one_of(
    st.sampled_from(["null", "true", "false", "NaN", "-Infinity"]), words.map(_quoted), numberish, digits
)
json_line = st.one_of(
    st.builds(
        lambda i, ss: f'{{"id": {i}, "sentences": {_array(ss)}}}', json_scalar, st.lists(json_scalar, max_size=4)
    ),
    st.builds(
        lambda p, n: f'{{"pos": {_array(p)}, "neg": {n}}}',
        st.lists(json_scalar, max_size=3),
        st.one_of(deep, st.lists(json_scalar, max_size=3).map(_array)),
    ),
    st.builds(lambda d: f'{{"id": "a", "sentences": ["s."], "n": {d}}}', st.one_of(deep, digits)),
    deep,
    words,
)


@FUZZ
@given(lines=st.lists(json_line, max_size=6), reader=st.sampled_from(["documents", "pairs", "annotations"]))
def test_coherence_jsonl_readers(scratch: Path, lines: list[str], reader: str) -> None:
    from raycl.data import coherence

    name = "annotations.json" if reader == "annotations" else f"{reader}.jsonl"
    path = _file(scratch, name, "\n".join(lines) if reader != "annotations" else "[" + ", ".join(lines) + "]")
    with memory_bound():
        holds(lambda: getattr(coherence, f"read_{reader}")(path))


# ------------------------------------------------------------------------------------------------ Parquet
@st.composite
def parquet_files(draw: st.DrawFn) -> bytes:
    """A negatives or n-best file: columns present or not, nulls, NaN, duplicate ids, a dictionary whose one
    value repeats into hundreds of megabytes, any codec; then perhaps corrupted or cut short."""
    n = draw(st.integers(0, 300))
    big = draw(st.sampled_from([0, 0, 1 << 10, 1 << 16, 1 << 18]))
    dictionary = draw(st.booleans())
    repeat = draw(st.integers(1, 4096)) if big else 0
    if big and not dictionary:  # written plain it is as large on disk as decoded: an honest big file, not a bomb
        repeat = min(repeat, (8 << 20) // big)
    ids = draw(st.lists(st.one_of(st.none(), words), min_size=n, max_size=n))
    columns: dict[str, Any] = {"id": pa.array(ids, pa.string())}
    if big:  # one value, referenced `repeat` times: tiny on disk, `big × repeat` bytes decoded
        once = pa.DictionaryArray.from_arrays(pa.array([0] * repeat, pa.int32()), pa.array(["y" * big]))
        columns = {
            "id": pa.array([f"i{k}" for k in range(repeat)]),
            "negatives": pa.ListArray.from_arrays(pa.array(range(repeat + 1), pa.int32()), once),
        }
        columns["scores"] = pa.array([[0.0]] * repeat)
        columns["model_version"] = pa.array([0] * repeat)
    else:
        columns["negatives"] = pa.array(
            draw(st.lists(st.one_of(st.none(), st.lists(words, max_size=3)), min_size=n, max_size=n)),
            pa.list_(pa.string()),
        )
        columns["scores"] = pa.array(
            draw(st.lists(st.one_of(st.none(), st.lists(st.floats(), max_size=3)), min_size=n, max_size=n)),
            pa.list_(pa.float64()),
        )
        columns["model_version"] = pa.array(
            draw(st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), min_size=n, max_size=n)),
            pa.int64(),
        )
    for name in draw(st.sets(st.sampled_from(list(columns)), max_size=1)):
        del columns[name]
    sink = pa.BufferOutputStream()
    pq.write_table(
        pa.table(columns),
        sink,
        compression=draw(st.sampled_from(["zstd", "snappy", "none", "gzip"])),
        use_dictionary=dictionary,
        store_schema=False,
        row_group_size=draw(st.integers(64, 5000)),
    )  # (1-row groups: linear, but slow)
    data = bytearray(sink.getvalue().to_pybytes())
    for at, byte in draw(
        st.lists(st.tuples(st.integers(0, max(len(data) - 1, 0)), st.integers(0, 255)), max_size=3)
    ):
        data[at] = byte
    cut = draw(st.one_of(st.none(), st.integers(0, len(data))))
    return bytes(data if cut is None else data[:cut])


@FUZZ
@given(
    data=parquet_files(), ids=st.one_of(st.none(), st.lists(st.sampled_from(["i1", "i7", "", "x"]), max_size=3))
)
def test_negatives_and_nbest_parquet_readers(scratch: Path, data: bytes, ids: list[str] | None) -> None:
    from raycl.distributed.nbest import read_nbest_shards
    from raycl.miners.shards import done_ids, read_negatives

    folder = scratch / "shards"
    folder.mkdir(exist_ok=True)
    path = _file(folder, "part-00000.parquet", data)
    pool = pa.proxy_memory_pool(pa.default_memory_pool())
    default = pa.default_memory_pool()
    pa.set_memory_pool(pool)
    try:
        with memory_bound():
            holds(lambda: read_negatives(path, ids=ids))
            holds(lambda: read_negatives(folder))
            holds(lambda: read_nbest_shards(folder))
            holds(lambda: done_ids(folder))
    finally:
        pa.set_memory_pool(default)
    assert pool.max_memory() < 300 << 20, pool.max_memory()  # a batch of at most MAX_BATCH_BYTES, decoded


# ------------------------------------------------------------------------------------------------ YAML and --set
SET_KEYS = [
    "scaling.cpus_per_worker",
    "scaling.start_timeout_s",
    "scaling.collective_timeout_s",
    "optim.epochs",
    "optim.lr",
    "optim.eps",
    "optim.betas",
    "optim.seed",
    "scaling.resources",
    "tune.num_samples",
    "data.train",
    "model.max_len",
    "optim.batch_size",
    "ema.decay",
    "no.such.key",
    "optim",
    "",
]
set_value = st.one_of(
    numberish,
    deep,
    words,
    st.sampled_from(["{a: .inf}", "{a: {b: 1}}", "[1, 2", "&a [*a]", "!!python/object:os.system", "x.m2[1e30:]"]),
)


def _bounded(config: Any) -> None:
    """What an accepted config holds: no infinite or NaN number anywhere."""
    import dataclasses

    stack = [config]
    while stack:
        node = stack.pop()
        if dataclasses.is_dataclass(node):
            stack += [getattr(node, f.name) for f in dataclasses.fields(node)]
        elif isinstance(node, dict):
            stack += list(node.values())
        elif isinstance(node, list | tuple):
            stack += list(node)
        elif isinstance(node, float):
            assert math.isfinite(node), config


@FUZZ
@given(key=st.sampled_from(SET_KEYS), value=set_value)
def test_set_values(key: str, value: str) -> None:
    from raycl.config.tasks import load_space

    with memory_bound():
        space = holds(lambda: load_space("idiom", preset="smoke", overrides=[f"{key}={value}"]))
    if space is not None:
        _bounded(space.config)


yaml_scalar = st.one_of(
    numberish, words.map(repr), st.sampled_from(["null", "true", "~", "*a", "&a x", "!!str 1"])
)
search_spec = st.builds(
    lambda kind, vals: f"{{{kind}: {_array(vals)}}}",
    st.sampled_from(["grid", "choice", "uniform", "loguniform", "qrange", "random"]),
    st.lists(numberish, max_size=4),
)
yaml_doc = st.one_of(
    st.builds(
        lambda task, sec, key, val: f"task: {task}\n{sec}:\n  {key}: {val}\n",
        st.sampled_from(["idiom", "gec", "sts", "coherence", "[x]", "nope"]),
        st.sampled_from(["optim", "scaling", "tune", "model", "data", "mining"]),
        st.sampled_from(
            [
                "epochs",
                "lr",
                "cpus_per_worker",
                "start_timeout_s",
                "num_samples",
                "seed",
                "train",
                "resources",
                "batch_size",
            ]
        ),
        st.one_of(yaml_scalar, deep),
    ),
    st.builds(
        lambda key, spec: f"task: idiom\nsearch:\n  {key}: {spec}\n",
        st.sampled_from(["optim.lr", "optim.warmup_ratio", "optim.epochs", "optim.batch_size", "x.y"]),
        search_spec,
    ),
    st.builds(
        lambda n: (
            "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
            + "".join(
                f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
                for i in range(n)
            )
        ),
        st.integers(0, 9),
    ),
    deep,
    words,
)


@FUZZ
@given(doc=yaml_doc, raw=st.binary(max_size=16))
def test_tune_space_yaml_files(scratch: Path, doc: str, raw: bytes) -> None:
    from raycl.config.tasks import load_space

    path = _file(scratch, "space.yaml", doc.encode("utf-8", "surrogatepass") + raw)
    with memory_bound():
        space = holds(lambda: load_space(str(path)))
    if space is not None:
        _bounded(space.config)
        from raycl.config import expand_values

        for spec in space.search.values():
            kind, values = next(iter(spec.items()))
            if kind in ("grid", "choice", "qrange"):
                assert len(expand_values(kind, values)) <= 1000
