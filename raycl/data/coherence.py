"""Coherence data (Jwalapuram, Joty, Lin, ACL 2022): documents, permuted sets, pairs files.

See docs/recipes/coherence.md.

* Documents: a text file with one sentence per line and a blank line between documents (ids
  ``"<stem>:<n>"``, n from 0), or JSONL with ``{"id": str, "sentences": [str, ...]}`` per line.
* Permuted sets (paper §2.1): an original document (or a 10-sentence block of one) is the positive, its
  sentence permutations the negatives. See :func:`build_permuted_set` for what ``copies`` means.
* Pairs files in the coherence repo's format: a pickled ``list`` of dicts, ``{"pos", "neg", "doc_id",
  "filename", "reference_file"}`` (test sets, one negative) or ``{"pos", "negs": [[...], ...]}`` (training).
  Pickles are read through an unpickler that refuses every global lookup, so a crafted file cannot run code.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import pickle
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from raycl.data.bounded import json_value, read_json_file
from raycl.data.m2 import iter_lines
from raycl.errors import UserError, at
from raycl.files import write_atomic

PICKLE_SUFFIXES = (".pkl", ".pickle")
MAX_DOCUMENT = 1 << 24  # characters of a JSONL line: one document, or one item with its negatives (WSJ: ~20 k)
_ENUMERATE_UP_TO = 5040  # 7!: listing every ordering is cheaper than rejection sampling near the cap


@dataclass(frozen=True)
class Document:
    """A coherent document: its sentences in the original order."""

    id: str
    sentences: tuple[str, ...]


@dataclass(frozen=True)
class CoherenceItem:
    """A coherent document and candidate incoherent versions of it (eval pairs have exactly one)."""

    id: str
    pos: tuple[str, ...]
    negs: tuple[tuple[str, ...], ...]


# ---------------------------------------------------------------- documents


def _check_sentence(where: str, sentence: object) -> str:
    if not isinstance(sentence, str):
        raise UserError(f"{where}: sentence is {type(sentence).__name__}, expected a string")
    for bad, name in (("\n", "a newline"), ("\r", "a carriage return"), ("\0", "a NUL byte")):
        if bad in sentence:
            raise UserError(f"{where}: sentence contains {name}, expected one line of text per sentence")
    if not sentence.strip():
        raise UserError(f"{where}: empty sentence, expected text")
    return sentence


def _document_from_json(path: Path, lineno: int, line: str) -> Document:
    where = at(path, lineno)
    obj = json_value(where, line, "expected one object per line")
    if not isinstance(obj, dict) or "id" not in obj or "sentences" not in obj:
        raise UserError(f'{where}: expected an object with keys "id" and "sentences"')
    if not isinstance(obj["id"], str):
        raise UserError(f'{where}: "id" is {type(obj["id"]).__name__}, expected a string')
    sentences = obj["sentences"]
    if not isinstance(sentences, list) or not sentences:
        raise UserError(f'{where}: "sentences" must be a non-empty list of strings')
    return Document(obj["id"], tuple(_check_sentence(where, s) for s in sentences))


def _read_text_documents(path: Path) -> list[Document]:
    docs: list[Document] = []
    current: list[str] = []
    for _, line in itertools.chain(iter_lines(path), [(0, "")]):  # the sentinel closes the last document
        if line.strip():
            current.append(line.strip())
        elif current:
            docs.append(Document(f"{path.stem}:{len(docs)}", tuple(current)))
            current = []
    return docs


def read_documents(path: str | Path) -> list[Document]:
    """All documents of a text (one sentence per line, blank line between documents) or ``.jsonl`` file.

    Strict: undecodable bytes, NUL bytes, bad JSON, missing keys, non-string or multi-line sentences,
    duplicate JSONL ids and empty files raise a :class:`UserError` starting with ``file:line``.
    """
    path = Path(path)
    if path.suffix != ".jsonl":
        docs = _read_text_documents(path)
    else:
        docs, seen = [], set()
        for lineno, line in iter_lines(path, max_line=MAX_DOCUMENT):
            if line.strip():
                doc = _document_from_json(path, lineno, line)
                if doc.id in seen:
                    raise UserError(f"{at(path, lineno)}: duplicate id {doc.id!r}, expected unique ids")
                seen.add(doc.id)
                docs.append(doc)
    if not docs:
        raise UserError(f"{at(path)}: empty file, expected documents (one sentence per line)")
    return docs


def write_documents(documents: Iterable[Document], path: str | Path) -> None:
    """Write documents atomically: JSONL for a ``.jsonl`` path (ids kept), else the text format."""
    path = Path(path)
    if path.suffix == ".jsonl":
        text = "".join(json.dumps({"id": d.id, "sentences": list(d.sentences)}) + "\n" for d in documents)
    else:
        text = "".join("".join(s + "\n" for s in d.sentences) + "\n" for d in documents)
    _atomic_write(path, text.encode("utf-8"))


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)


# ---------------------------------------------------------------- permuted sets


def sample_permutations(n: int, count: int, *, rng: random.Random) -> list[tuple[int, ...]]:
    """``count`` distinct permutations of ``range(n)``, never the identity, at most ``n! - 1`` of them.

    Enumerates all orderings when there are few of them (or ``count`` is close to the cap), else rejection-
    samples with ``rng.shuffle``. Deterministic given the state of ``rng``.
    """
    identity = tuple(range(n))
    total = math.factorial(n) - 1
    count = min(count, total)
    if count <= 0:
        return []
    if total + 1 <= max(_ENUMERATE_UP_TO, 2 * count):
        candidates = [p for p in itertools.permutations(identity) if p != identity]
        return rng.sample(candidates, count)
    seen: set[tuple[int, ...]] = {identity}
    out: list[tuple[int, ...]] = []
    order = list(identity)
    while len(out) < count:
        rng.shuffle(order)
        perm = tuple(order)
        if perm not in seen:
            seen.add(perm)
            out.append(perm)
    return out


def split_blocks(sentences: Sequence[str], *, block_size: int = 10, split_over: int = 20) -> list[tuple[str, ...]]:
    """The document whole, or (``split_over``+ sentences) its consecutive blocks of ``block_size``."""
    if len(sentences) < split_over:
        return [tuple(sentences)]
    return [tuple(sentences[i : i + block_size]) for i in range(0, len(sentences), block_size)]


def build_permuted_set(
    documents: Iterable[Document],
    *,
    num_negs: int,
    copies: int,
    seed: int,
    min_sentences: int = 4,
    block_size: int = 10,
    split_over: int = 20,
) -> list[CoherenceItem]:
    """The paper's permuted-document set (§2.1 and footnote 1), one item per (block, copy).

    Documents with ``split_over`` (20)+ sentences are cut into blocks of ``block_size`` (10); every block
    (or whole document) with fewer than ``min_sentences`` (4) sentences is dropped. ``copies`` is how many
    times each positive is repeated (20 in the WSJ data: the pairwise set pairs each document with 20
    permutations). Each block gets ``copies * num_negs`` *distinct* non-identity permutations, divided
    among its copies, so no negative repeats across an item's copies (the paper's 5 negatives x 20 copies =
    100 unique permutations). When a block has fewer orderings than that (4 sentences: 23), the copies
    that fit are full and the last one holds the remainder; blocks whose permutations all read the same as
    the original (repeated sentences) give no item. Ids: ``"<doc id>#<block>/<copy>"``. Deterministic: each
    block draws from its own ``Random`` seeded with ``seed`` and its id, so adding documents changes nothing
    for the others.
    """
    if num_negs < 1 or copies < 1:
        raise ValueError(f"num_negs and copies must be >= 1, got {num_negs} and {copies}")
    items: list[CoherenceItem] = []
    for doc in documents:
        for b, block in enumerate(split_blocks(doc.sentences, block_size=block_size, split_over=split_over)):
            if len(block) < min_sentences:
                continue
            rng = random.Random(f"{seed}:{doc.id}#{b}")
            perms = sample_permutations(len(block), num_negs * copies, rng=rng)
            texts = (tuple(block[i] for i in p) for p in perms)
            # repeated sentences can make a permutation read like the original or like another one
            negs = [t for t in dict.fromkeys(texts) if t != block]
            for c in range(0, len(negs), num_negs):
                items.append(CoherenceItem(f"{doc.id}#{b}/{c // num_negs}", block, tuple(negs[c : c + num_negs])))
    return items


# ---------------------------------------------------------------- pickles and pairs files


class _NoGlobalsUnpickler(pickle.Unpickler):
    """Builds only what pickle encodes without globals (list, dict, tuple, str, int, float, bool, None)."""

    def __init__(self, file: IO[bytes], *, path: Path) -> None:
        super().__init__(file)
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        raise UserError(
            f"{at(self._path)}: pickle refers to '{module}.{name}'; only builtin containers and "
            "strings are allowed"
        )


def load_builtins_pickle(path: str | Path) -> Any:
    """Unpickle ``path`` refusing every global lookup (``os.system``, ``builtins.eval``, classes, ...), and a
    pickle whose objects, read as a tree, hold more references than it has bytes (:func:`_bounded`)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return _bounded(path, _NoGlobalsUnpickler(f, path=path).load(), os.fstat(f.fileno()).st_size)
    except OSError as err:
        raise UserError(f"{at(path)}: cannot read ({err.strerror or err})") from None
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        KeyError,
        IndexError,
        TypeError,
        OverflowError,
        MemoryError,
    ) as err:
        raise UserError(f"{at(path)}: not a valid pickle ({type(err).__name__}: {err})") from None


def _bounded(path: Path, data: Any, size: int) -> Any:
    """``data`` if its tree of references (every container element, a shared one each time it is reached) is no
    larger than the file's ``size`` in bytes — each reference costs a pickle at least one byte, unless the memo
    shares a container: a 73 kB file whose items all hold one list would cost items × its length downstream."""
    count, stack = 0, [data]
    while stack:
        x = stack.pop()
        count += 1
        if count > size + 16:
            raise UserError(
                f"{at(path)}: its containers are shared through the pickle memo ({size} bytes hold "
                "more references than bytes), expected every item to hold its own lists"
            )
        if isinstance(x, dict):
            stack += [*x.keys(), *x.values()]
        elif isinstance(x, list | tuple):
            stack += x
    return data


def _is_pickle(path: Path) -> bool:
    if path.suffix in PICKLE_SUFFIXES:
        return True
    if path.suffix in (".jsonl", ".json"):
        return False
    try:
        with open(path, "rb") as f:
            return f.read(1) == b"\x80"  # PROTO opcode: every pickle of protocol 2 or later starts with it
    except OSError as err:
        raise UserError(f"{at(path)}: cannot read ({err.strerror or err})") from None


def is_documents(path: Path) -> bool:
    """Documents (text, or JSONL with ``sentences``: :func:`read_documents`) rather than a pairs file (a pickle,
    or JSONL with ``pos``: :func:`read_pairs`)."""
    if path.suffix != ".jsonl":
        return not _is_pickle(path)
    with open(path, encoding="utf-8", errors="replace") as f:
        first = next((line for line in iter(lambda: f.readline(MAX_DOCUMENT + 1), "") if line.strip()), "{}")
    try:
        value = json_value(str(path), first, "expected one object per line")
    except UserError:
        return True  # read_documents names the line
    return isinstance(value, dict) and "sentences" in value


def read_training_set(specs: Sequence[str], *, num_negs: int, **permute: Any) -> list[CoherenceItem]:
    """A training set (``data.train``'s files, in order): documents become the paper's permuted set
    (:func:`build_permuted_set` with ``num_negs`` and the ``permute`` options), pairs files are used as given; a
    missing file, or no item at all, is refused."""
    items: list[CoherenceItem] = []
    for spec in specs:
        path = Path(spec)
        if not path.exists():
            raise UserError(f"{at(path)}: no such file (data.train)")
        if is_documents(path):
            items += build_permuted_set(read_documents(path), num_negs=num_negs, **permute)
        else:
            items += read_pairs(path)
    if not items:
        raise UserError(
            f"data.train: {', '.join(specs)} gives no training items (documents need "
            f"≥ {permute.get('min_sentences', 4)} sentences)"
        )
    return items


def _sentences(where: str, key: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not value or not all(isinstance(s, str) for s in value):
        raise UserError(f"{where}: {key!r} must be a non-empty list of sentences (strings)")
    return tuple(value)


def _item(where: str, raw: object, default_id: str) -> CoherenceItem:
    if not isinstance(raw, dict) or "pos" not in raw or ("neg" not in raw and "negs" not in raw):
        raise UserError(f"{where}: expected a dict with 'pos' and 'neg' (test) or 'negs' (training)")
    pos = _sentences(where, "pos", raw["pos"])
    if "negs" in raw:
        if not isinstance(raw["negs"], list | tuple) or not raw["negs"]:
            raise UserError(f"{where}: 'negs' must be a non-empty list of documents (lists of strings)")
        negs = tuple(_sentences(f"{where}: negs[{j}]", "negs", n) for j, n in enumerate(raw["negs"]))
    else:
        negs = (_sentences(where, "neg", raw["neg"]),)
    ident = raw.get("id", raw.get("doc_id", default_id))
    return CoherenceItem(str(ident), pos, negs)


def read_pairs(path: str | Path) -> list[CoherenceItem]:
    """Items of a pairs file: a pickle (``.pkl``/``.pickle``, or any name starting with byte 0x80) or JSONL.

    Both hold the repo's dicts (``pos`` plus ``neg`` or ``negs``); ``id`` or ``doc_id`` becomes the item
    id (else ``"<stem>:<index>"``). Malformed items raise ``file: item N: ...`` (pickle, N from 0) or
    ``file:line: ...`` (JSONL).
    """
    path = Path(path)
    if _is_pickle(path):
        data = load_builtins_pickle(path)
        if not isinstance(data, list | tuple):
            raise UserError(f"{at(path)}: pickle holds {type(data).__name__}, expected a list of dicts")
        items = [_item(f"{at(path)}: item {i}", raw, f"{path.stem}:{i}") for i, raw in enumerate(data)]
    elif path.suffix == ".jsonl":
        items = []
        for lineno, line in iter_lines(path, max_line=MAX_DOCUMENT):
            if line.strip():
                raw = json_value(at(path, lineno), line, "expected one object per line")
                items.append(_item(at(path, lineno), raw, f"{path.stem}:{len(items)}"))
    else:
        raise UserError(f"{at(path)}: not a pickle (no 0x80 protocol byte) and not .jsonl, expected a pairs file")
    if not items:
        raise UserError(f"{at(path)}: no pairs, expected a non-empty list")
    return items


def _pair_dict(item: CoherenceItem) -> dict[str, Any]:
    source = item.id.split("#")[0]
    if len(item.negs) == 1:  # the repo's test-set layout
        return {
            "pos": list(item.pos),
            "neg": list(item.negs[0]),
            "doc_id": item.id,
            "filename": source,
            "reference_file": source,
        }
    return {"pos": list(item.pos), "negs": [list(n) for n in item.negs], "doc_id": item.id}


def write_pairs_pickle(items: Iterable[CoherenceItem], path: str | Path) -> None:
    """Pickle (protocol 3, builtins only) atomically: test layout when an item has one negative, else training."""
    _atomic_write(Path(path), pickle.dumps([_pair_dict(it) for it in items], protocol=3))


def write_pairs_jsonl(items: Iterable[CoherenceItem], path: str | Path) -> None:
    """The same dicts as :func:`write_pairs_pickle`, one JSON object per line, atomically."""
    _atomic_write(Path(path), "".join(json.dumps(_pair_dict(it)) + "\n" for it in items).encode("utf-8"))


def read_annotations(path: str | Path) -> list[list[str | None]]:
    """LMvLM_Annotations: coders' label lists (pickle or ``.json``), all of one length, labels numeric strings.

    Labels are ``'0'`` (``pos`` preferred) or ``'1'``; ``None`` is a missing judgement. Integer labels are
    read as their string.
    """
    path = Path(path)
    if _is_pickle(path):
        data = load_builtins_pickle(path)
    else:
        data = read_json_file(path, "expected a list of label lists")
    if not isinstance(data, list | tuple) or not data or not all(isinstance(c, list | tuple) for c in data):
        raise UserError(f"{at(path)}: expected a non-empty list of coders' label lists")
    coders = [[_label(path, i, j, v) for j, v in enumerate(c)] for i, c in enumerate(data)]
    if len({len(c) for c in coders}) != 1:
        raise UserError(f"{at(path)}: coders have {[len(c) for c in coders]} labels, expected equal lengths")
    return coders


def _label(path: Path, coder: int, unit: int, value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str):
        try:
            if math.isfinite(float(value)):
                return value
        except ValueError:
            pass
    raise UserError(f"{at(path)}: coder {coder}: item {unit}: label {value!r}, expected '0', '1' or None")
