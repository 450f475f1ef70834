"""Nested dataclass config: loaded from ``tune_spaces/<SPACE>.yaml``, typed ``--set`` overrides, validated once.

The spaces are package data: a wheel carries them in ``raycl/tune_spaces/`` and a checkout (on ``PYTHONPATH``,
or installed editable) has them in its top-level ``tune_spaces/`` — one folder in the repository, mapped into the
package when it is built (``package_dir`` in ``setup.py``); :func:`spaces_dir` finds whichever this raycl has.

A space file has the sections of its task's config (``model``, ``data``, ``loss`` ...), a ``search:`` block
over dotted keys, optional ``baselines:`` (named dotted overrides, run after the sweep at the best point) and
``presets:`` (named partial configs merged over the base by ``--preset``). Every key is checked against the
dataclasses before anything runs: a mistake ends in one line naming the file or ``--set`` and the key.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.resources
import math
import types
import typing
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

import yaml

from raycl.errors import UserError, redact, shown
from raycl.files import write_atomic

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

SEARCH_KINDS = ("grid", "choice", "uniform", "loguniform", "qrange")
MAX_SEARCH_VALUES = 1_000  # values one search key expands to (grid, choice, qrange)
MAX_TRIALS = 10_000  # trials a search expands to: the grid's points × tune.num_samples


# ---------------------------------------------------------------------------------------------- sections
@dataclass
class ScalingSection:
    num_workers: int = 1  # Ray Train workers per trial; 0 = local mode (no Ray, for tests and debugging)
    use_gpu: bool = False
    # with use_gpu: GPUs per worker; a fraction shares a GPU (with miners, other trials), each process capped to
    # its share of the memory; two workers of one run never share one (NCCL refuses it): > 0.5 with 2 or more
    gpus_per_worker: float = 1.0
    cpus_per_worker: float = 1.0
    resources: dict[str, float] = field(default_factory=dict)  # custom resources per worker, e.g. {trainer: 1}
    max_failures: int = 2  # worker-group restarts from the last checkpoint (Ray Train FailureConfig); -1 = forever
    collective_timeout_s: int = 1800  # a collective that waits longer ends the run with an error (TorchConfig)
    # a worker group that cannot start (its resources taken, an autoscaler that does not deliver) ends the run
    # after this long, in Ray Train's attempts of RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S (60 s); 0 = wait for ever
    start_timeout_s: float = 600.0


@dataclass
class TuneSection:
    num_samples: int = 1
    max_concurrent_trials: int = 2
    scheduler: str = "fifo"  # fifo | asha
    metric: str = "dev_f05"
    mode: str = "max"
    driver_cpus: float = 0.25  # Tune trial driver bundle; {"CPU": 0} is rejected by Tune
    grace_period: int = 1  # ASHA: epochs before a trial may be stopped


PRECISIONS = ("fp32", "bf16", "fp16")
ENGINES = ("auto", "hf", "ctranslate2")  # beam search: raycl.models.ct2_engine.resolve_engine


@dataclass
class LoopOptions:
    """What the one training loop (``raycl/training/loop.py``) takes from every recipe's ``optim`` section."""

    precision: str = "fp32"  # fp32 | bf16 | fp16: autocast (fp16 with a gradient scaler), training and evaluation
    update_freq: int = 1  # batches whose gradients are summed into one update (fairseq's --update-freq)
    tf32: bool = True  # TF32 matmuls for what stays fp32, on GPUs that have them (Ampere and newer)
    prefetch: int = 2  # batches read, sized and collated ahead in a background thread (0: in the step's thread)
    compile: bool = False  # torch.compile the model's forward (lengths bucketed so that shapes repeat)
    compile_mode: str = "default"  # default | reduce-overhead (CUDA graphs) | max-autotune (inductor's modes)
    compile_backend: str = "inductor"  # torch.compile's backend; aot_eager traces without generating code


@dataclass
class OptimSection(LoopOptions):
    lr: float = 3e-5
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-8
    weight_decay: float = 0.0
    scheduler: str = "fixed"  # fixed | polynomial
    warmup_updates: int = 0
    total_updates: int = 0  # polynomial decay horizon; 0 = epochs × steps per epoch
    clip_norm: float = 1.0
    batch_size: int = 32  # sentences per batch; with max_tokens, the pool (sorted by length) cut into batches
    max_tokens: int = 0  # fairseq's --max-tokens: sentences × longest num_tokens ≤ this a batch (0: by sentences)
    epochs: int = 3
    seed: int = 1


@dataclass
class MiningSection:
    """The miner pool and the negative stream (every mining recipe); recipes add their miner's own keys."""

    batch_size: int = 64  # examples per miner forward (a beam-search call, a scoring batch)
    negatives: str | None = None  # pre-mined Parquet: train on it instead of mining
    num_miners: int = 1
    cpus_per_miner: float = 1.0
    gpus_per_miner: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)  # custom resources per miner, e.g. {miner: 1}
    sync_every: int = 0  # steps between weight publications; 0 = never (GEC: base-model negatives)
    max_staleness: int = 0
    refresh_every: int = 0  # epochs between re-mining with newer weights; 0 = never (the paper)
    queue_size: int = 256  # examples mined-and-undelivered plus being mined, at most (miners wait beyond it)
    task_size: int = 32  # examples per miner task
    lease_s: float = 60.0  # a task not returned within this many seconds is mined again by another miner
    precision: str = "fp32"  # the miners' forward passes: fp32 | bf16 | fp16 (autocast); int8 with ctranslate2




@dataclass
class Space:
    """A resolved tune space: the config at its default point, the search block and the baselines."""

    name: str
    source: str  # the YAML file it came from, for messages
    config: Any
    search: dict[str, dict[str, list[Any]]]
    baselines: dict[str, dict[str, Any]]
    preset: str | None = None


# ---------------------------------------------------------------------------------------------- typing
def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp) if a is not type(None)) + " (or null)"
    if origin is list:
        return f"a list of {_describe(typing.get_args(tp)[0])}"
    if origin is dict:
        return f"a mapping of name -> {_describe(typing.get_args(tp)[1])}"
    names = {bool: "true/false", int: "an integer", float: "a number", str: "a string"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _coerce(value: Any, tp: Any, key: str, where: str) -> Any:
    """Check ``value`` against the annotation ``tp`` (ints are accepted for floats; a lone str for list[str])."""
    bad = UserError(f"{where}: config key '{key}': expected {_describe(tp)}, got {shown(value)}")
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], key, where)
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, str) and item is str:
            value = [value]
        if not isinstance(value, list):
            raise bad
        return [_coerce(v, item, key, where) for v in value]
    if origin is dict:
        _, item = typing.get_args(tp)
        if not isinstance(value, dict):
            raise bad
        return {str(k): _coerce(v, item, f"{key}.{k}", where) for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad
        return _build(tp, value, key, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise bad
        return str(value)
    return value


def _build(cls: type, data: dict[str, Any], prefix: str, where: str) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in known:
            full = f"{prefix}.{key}" if prefix else key
            raise UserError(f"{where}: unknown config key '{full}' (known here: {', '.join(sorted(known))})")
    kwargs = {k: _coerce(v, hints[k], f"{prefix}.{k}" if prefix else k, where) for k, v in data.items()}
    return cls(**kwargs)


def _field_type(cls: type, dotted: str, where: str) -> Any:
    """The annotation of a dotted key (``loss.margin`` → float); unknown keys are a UserError."""
    tp: Any = cls
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
            continue
        if not dataclasses.is_dataclass(tp):
            raise UserError(f"{where}: unknown config key '{dotted}'")
        hints = typing.get_type_hints(tp)
        if part not in hints:
            known = ", ".join(sorted(hints))
            raise UserError(f"{where}: unknown config key '{'.'.join(parts[: i + 1])}' (known here: {known})")
        tp = hints[part]
    return tp


# ---------------------------------------------------------------------------------------------- dict ops
def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _nest(dotted: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def parse_set(items: list[str]) -> dict[str, str]:
    """``["loss.margin=0.3"]`` → ``{"loss.margin": "0.3"}``; values are typed later, by the key's annotation."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set {shown(item)}: expected KEY=VALUE with a dotted key, e.g. loss.margin=0.3")
        out[key.strip()] = raw.strip()
    return out


def _split_top(raw: str) -> list[str]:
    """``"[a.m2[1000:], b.m2]"`` → ``["a.m2[1000:]", "b.m2"]``: commas split only outside brackets."""
    if raw.startswith("[") and raw.endswith("]"):
        raw = raw[1:-1]
    parts, depth, cur = [], 0, ""
    for ch in raw:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return [p.strip("'\"") for p in parts if p.strip()]


def _parse_raw(raw: str, tp: Any) -> Any:
    """Read a command-line value as the annotation ``tp`` wants it (file specs contain ``[`` and ``:``)."""
    union = typing.get_origin(tp) in (typing.Union, types.UnionType)
    bare = [a for a in typing.get_args(tp) if a is not type(None)] if union else [tp]
    if raw.lower() in ("null", "none", "~") and union:
        return None
    if bare[0] is str:
        return raw
    if typing.get_origin(bare[0]) is list and typing.get_args(bare[0])[0] is str:
        return _split_top(raw)
    try:
        value = safe_yaml(raw) if raw else None
    except yaml.YAMLError:
        return raw
    return _number(raw, bare[0]) if isinstance(value, str) and bare[0] in (int, float) else value


def _number(raw: str, tp: type) -> Any:
    """``1e-5`` for a number key (YAML 1.1 reads it as a string): the number, an integral one as an integer for an
    integer key (``1e15`` epochs is then refused by its bound, not as a string); anything else stays the string."""
    try:
        number = float(raw) if len(raw) <= MAX_YAML_INT else None
    except ValueError:
        return raw
    if number is None:
        return raw
    return int(number) if tp is int and math.isfinite(number) and number.is_integer() else number


def set_dotted(config: Any, dotted: dict[str, Any], *, where: str, raw: bool = False) -> Any:
    """A copy of ``config`` with dotted keys replaced (typed and validated); used by ``--set`` and Tune.

    ``raw=True``: the values are command-line strings, read according to each key's annotation.
    """
    cls = type(config)
    for key, value in list(dotted.items()):
        tp = _field_type(cls, key, where)
        if raw:
            dotted[key] = _parse_raw(value, tp)
    data = _merge(dataclasses.asdict(config), _nest(dotted))
    new = _build(cls, data, "", where)
    validate(new, where=where)
    return new


def get_dotted(config: Any, key: str) -> Any:
    node = config
    for part in key.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


# ---------------------------------------------------------------------------------------------- loading
MAX_YAML_DEPTH = 64  # nesting levels (a tune space has 4); Python's recursion would end much deeper in a traceback
MAX_YAML_NODES = 10_000  # nodes once aliases are expanded (a tune space has a few hundred): no "billion laughs"
MAX_YAML_INT = 40  # characters of a YAML integer (int() of 4,300 digits raises ValueError, not a YAML error)


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses nesting deeper than :data:`MAX_YAML_DEPTH` and a document whose aliases
    expand beyond :data:`MAX_YAML_NODES` nodes, with the line, in bounded time and memory."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels",
                                                  self.peek_event().start_mark)  # fmt: skip
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: Any) -> Any:
        _measure(node, 1, {}, set())
        return super().construct_document(node)

    def construct_yaml_int(self, node: Any) -> Any:
        if len(node.value) > MAX_YAML_INT:
            too_long = f"an integer of {len(node.value):,} characters, expected at most {MAX_YAML_INT}"
            raise yaml.constructor.ConstructorError(None, None, too_long, node.start_mark)
        return super().construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def _measure(n: Any, depth: int, done: dict[int, tuple[int, int]], open_: set[int]) -> tuple[int, int]:
    """(nodes, height) of the tree that ``n``'s aliases make (a node reached twice counts twice), refused past
    :data:`MAX_YAML_NODES` nodes or :data:`MAX_YAML_DEPTH` levels — aliases of aliases nest deeper than the text
    does — or when an alias refers to a node that holds it (``&a [*a]``: a tree without end). Recurses at most
    :data:`MAX_YAML_DEPTH` deep."""
    if id(n) not in done:
        if id(n) in open_:
            raise yaml.composer.ComposerError(None, None, "an alias refers to a node that holds it", n.start_mark)
        if depth > MAX_YAML_DEPTH:
            raise yaml.composer.ComposerError(None, None, f"aliases nest deeper than {MAX_YAML_DEPTH} levels",
                                              n.start_mark)  # fmt: skip
        kids = [c for pair in n.value for c in pair] if isinstance(n, yaml.MappingNode) else (
            n.value if isinstance(n, yaml.SequenceNode) else [])  # fmt: skip
        open_.add(id(n))
        parts = [_measure(c, depth + 1, done, open_) for c in kids]
        open_.discard(id(n))
        done[id(n)] = (1 + sum(p[0] for p in parts), 1 + max((p[1] for p in parts), default=0))
    nodes, height = done[id(n)]
    if nodes > MAX_YAML_NODES:
        raise yaml.composer.ComposerError(None, None, f"aliases expand to more than {MAX_YAML_NODES} nodes",
                                          n.start_mark)  # fmt: skip
    if depth + height - 1 > MAX_YAML_DEPTH:
        raise yaml.composer.ComposerError(None, None, f"aliases nest deeper than {MAX_YAML_DEPTH} levels",
                                          n.start_mark)  # fmt: skip
    return nodes, height


def safe_yaml(text: str) -> Any:
    """``yaml.safe_load`` bounded in depth and alias expansion (:class:`_BoundedLoader`)."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _read_yaml(path: Traversable) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: cannot read tune space ({err.__class__.__name__})") from None
    try:
        data = safe_yaml(text) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        why = " ".join(str(getattr(err, "problem", None) or err).split())  # a reader error spans two lines
        raise UserError(f"{path}{line}: invalid YAML ({why})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of config sections at the top level")
    return data


def spaces_dir() -> Traversable:
    """The tune spaces of this raycl: ``tune_spaces/`` inside the installed package (where a wheel puts them),
    else the checkout's top-level ``tune_spaces/`` beside the package (a clone on ``PYTHONPATH``, an editable
    install: the repository's one copy, read as it is edited). Found from this module's own package, never by
    importing ``raycl.tune_spaces``: an editable install does not make that name importable, and where one did, it
    could be another checkout's."""
    packaged = importlib.resources.files("raycl").joinpath("tune_spaces")
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "tune_spaces"


def space_names() -> list[str]:
    """The names of the tune spaces this raycl has (``coherence``, ``gec_pd``, …), sorted."""
    root = spaces_dir()
    if not root.is_dir():
        return []
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml") and p.is_file())


def resolve_space_path(space: str) -> Traversable:
    """A space's file: a path to a ``.yaml``/``.yml`` file as given, else the space of that name of this raycl."""
    path = Path(space)
    if path.suffix in (".yaml", ".yml"):
        if not path.exists():
            raise UserError(f"{path}: no such tune space file")
        return path
    found = spaces_dir().joinpath(f"{space}.yaml")
    if Path(space).name != space or not found.is_file():  # a name, not a path out of the folder
        known = ", ".join(space_names()) or "none"
        raise UserError(f"unknown tune space '{space}' (known: {known}; or give a path to a .yaml file)")
    return found


def read_space(space: str, *, preset: str | None = None) -> tuple[Traversable, dict[str, Any], Any, Any]:
    """A space file's path and its config keys with ``--preset`` merged in, its ``search`` and ``baselines``."""
    path = resolve_space_path(space)
    where = str(path)
    raw = _read_yaml(path)
    presets = raw.pop("presets", {}) or {}
    if preset is not None:
        if preset not in presets:
            raise UserError(f"{where}: unknown preset '{preset}' (this space has: {', '.join(presets) or 'none'})")
        chosen = dict(presets[preset] or {})
        if "search" in chosen:  # a preset's search replaces the base grid, it does not extend it
            raw["search"] = chosen.pop("search")
        raw = _merge(raw, chosen)
    return path, raw, raw.pop("search", {}) or {}, raw.pop("baselines", {}) or {}


def build_space(path: Traversable, cls: type, raw: dict[str, Any], *, search: Any, baselines: Any,
                preset: str | None, overrides: list[str] | None) -> Space:  # fmt: skip
    """The space of a task's config class ``cls``: built from ``raw``, validated, ``--set`` overrides applied, its
    search and baselines checked against it (``raycl.configs.load_space`` finds ``cls`` from the ``task:`` key)."""
    where = str(path)
    config = _build(cls, raw, "", where)
    validate(config, where=where)
    if overrides:
        config = set_dotted(config, parse_set(overrides), where="--set", raw=True)
    return Space(name=PurePath(path.name).stem, source=where, config=config,
                 search=_check_search(config, search, where), baselines=_check_baselines(config, baselines, where),
                 preset=preset)  # fmt: skip


def _check_search(config: Any, search: Any, where: str) -> dict[str, dict[str, list[Any]]]:
    if not isinstance(search, dict):
        raise UserError(f"{where}: 'search' must map dotted config keys to {{kind: values}}")
    out: dict[str, dict[str, list[Any]]] = {}
    points = 1  # grid points: Tune runs every combination of the grid and qrange keys, num_samples times each
    for key, spec in search.items():
        tp = _field_type(type(config), key, f"{where}: search")
        if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in SEARCH_KINDS:
            raise UserError(
                f"{where}: search key '{key}': expected one of {{{', '.join(SEARCH_KINDS)}: [...]}}, "
                f"got {shown(spec)}"
            )
        kind, values = next(iter(spec.items()))
        values = _check_search_values(kind, values, key, where)
        points *= int(search_count(kind, values)) if kind in ("grid", "qrange") else 1  # each ≤ the cap now
        for v in expand_values(kind, values) if kind in ("grid", "choice", "qrange") else values:
            _coerce(v, tp, key, f"{where}: search")
            set_dotted(config, {key: v}, where=f"{where}: search value for '{key}'")
        out[key] = {kind: values}
    trials = points * config.tune.num_samples
    if trials > MAX_TRIALS:
        raise UserError(f"{where}: 'search' expands to {trials:,} trials ({points:,} grid points × "
                        f"tune.num_samples = {config.tune.num_samples}), expected at most {MAX_TRIALS:,}")
    return out


def _check_search_values(kind: str, values: Any, key: str, where: str) -> list[Any]:
    if not isinstance(values, list) or not values:
        raise UserError(f"{where}: search key '{key}': '{kind}' expects a non-empty list, got {shown(values)}")
    if kind in ("uniform", "loguniform") and (len(values) != 2 or not all(_is_num(v) for v in values)):
        raise UserError(f"{where}: search key '{key}': '{kind}' expects [low, high], got {shown(values)}")
    if kind == "loguniform" and min(values) <= 0:
        raise UserError(f"{where}: search key '{key}': 'loguniform' bounds must be > 0, got {shown(values)}")
    if kind == "qrange":
        if len(values) != 3 or not all(_is_num(v) and math.isfinite(v) for v in values) or values[2] <= 0 \
                or values[1] < values[0]:
            raise UserError(f"{where}: search key '{key}': 'qrange' expects [start, stop, step>0] of finite "
                            f"numbers, got {shown(values)}")  # fmt: skip
    count = search_count(kind, values)
    if count > MAX_SEARCH_VALUES:
        raise UserError(f"{where}: search key '{key}': '{kind}' {shown(values)} expands to {count:,} values, "
                        f"expected at most {MAX_SEARCH_VALUES:,}")  # fmt: skip
    return values


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def search_count(kind: str, values: list[Any]) -> float:
    """How many values a checked spec expands to (a qrange's counted, not built; uniform and loguniform: 1)."""
    if kind == "qrange":
        start, stop, step = values
        n = (stop - start) / step  # finite numbers, step > 0: at worst inf, never an error
        return math.inf if not math.isfinite(n) else int(round(n)) + 1
    return len(values) if kind in ("grid", "choice") else 1


def expand_values(kind: str, values: list[Any]) -> list[Any]:
    """The discrete values of a ``grid``/``choice``/``qrange`` spec (qrange is inclusive, rounded to the step)."""
    if kind != "qrange":
        return list(values)
    start, stop, step = values
    n = int(search_count(kind, values))
    decimals = _decimals(step)
    vals = [round(start + i * step, decimals) for i in range(n)]
    return [int(v) for v in vals] if all(isinstance(x, int) for x in values) else vals


def _decimals(step: float) -> int:
    """Decimal places of ``step`` as written (``0.05`` → 2, ``1e-10`` → 10, ``5`` → 0)."""
    try:
        exponent = Decimal(repr(float(step))).normalize().as_tuple().exponent
    except InvalidOperation:
        return 0
    return max(0, -exponent) if isinstance(exponent, int) else 0


def _check_baselines(config: Any, baselines: Any, where: str) -> dict[str, dict[str, Any]]:
    if not isinstance(baselines, dict):
        raise UserError(f"{where}: 'baselines' must map a name to dotted overrides")
    for name, over in baselines.items():
        if not isinstance(over, dict):
            raise UserError(f"{where}: baseline '{name}': expected a mapping of dotted keys to values")
        set_dotted(config, over, where=f"{where}: baseline '{name}'")
    return baselines


# ---------------------------------------------------------------------------------------------- validation
def require(ok: bool, where: str, key: str, expected: str, value: Any) -> None:
    if not ok:
        raise UserError(f"{where}: config key '{key}': expected {expected}, got {shown(value)}")


# upper bounds of every number, by the kind of key (the lower bounds are the sections' own checks below)
MAX_SECONDS = 7 * 24 * 3600  # a key in seconds (*_s): a week; a wait longer than that is a stuck run
MAX_RESOURCES = 1024  # CPUs, GPUs or custom resource units that one worker, miner or trial driver asks for
MAX_EPOCHS = 100_000  # any *epochs key
MAX_SEED = 2**32 - 1  # a seed: what numpy's generators take
MAX_INT = 2**31 - 1  # every other integer (sizes, counts, steps): what torch's and Arrow's int32 indices hold
MAX_FLOAT = 1e6  # every other number (rates, margins, weights, ratios), in magnitude


def number_bound(key: str, value: int | float) -> tuple[float, str]:
    """The upper bound of the number at the dotted ``key`` and what the refusal says is expected."""
    leaf = key.rsplit(".", 2)
    if leaf[-1].endswith("_s"):
        return MAX_SECONDS, f"a finite number of seconds ≤ {MAX_SECONDS:,} (7 days)"
    if leaf[-1].startswith(("cpus_", "gpus_")) or leaf[-1] == "driver_cpus" or "resources" in leaf[:-1]:
        return MAX_RESOURCES, f"a finite amount ≤ {MAX_RESOURCES:,}"
    if leaf[-1].endswith("epochs"):
        return MAX_EPOCHS, f"an integer ≤ {MAX_EPOCHS:,}"
    if leaf[-1] == "seed":
        return MAX_SEED, f"an integer ≤ {MAX_SEED:,}"
    if isinstance(value, int):
        return MAX_INT, f"an integer of magnitude ≤ {MAX_INT:,}"
    return MAX_FLOAT, f"a finite number of magnitude ≤ {MAX_FLOAT:,.0f}"


def _check_numbers(node: Any, key: str, where: str) -> None:
    """Every number of the config ``node`` finite and within :func:`number_bound` (what Ray, torch and the clock
    would otherwise refuse after Ray starts, in a traceback, or never)."""
    if dataclasses.is_dataclass(node):
        for f in dataclasses.fields(node):
            _check_numbers(getattr(node, f.name), f"{key}.{f.name}" if key else f.name, where)
    elif isinstance(node, dict):
        for k, v in node.items():
            _check_numbers(v, f"{key}.{k}", where)
    elif isinstance(node, list | tuple):
        for v in node:
            _check_numbers(v, key, where)
    elif isinstance(node, int | float) and not isinstance(node, bool):
        bound, expected = number_bound(key, node)
        require(math.isfinite(node) and abs(node) <= bound, where, key, expected, node)


def validate(config: Any, *, where: str) -> None:
    """Range and consistency checks that types alone cannot express."""
    _check_numbers(config, "", where)
    _validate_common(config, where)
    check = getattr(config, "validate", None)
    if check is not None:  # the task's own checks (raycl/configs/<task>.py)
        check(where)


def _validate_common(c: Any, where: str) -> None:
    require(c.scaling.num_workers >= 0, where, "scaling.num_workers", "an integer ≥ 0", c.scaling.num_workers)
    require(c.scaling.collective_timeout_s > 0, where, "scaling.collective_timeout_s", "a number of seconds > 0",
            c.scaling.collective_timeout_s)
    require(c.scaling.cpus_per_worker > 0, where, "scaling.cpus_per_worker", "> 0", c.scaling.cpus_per_worker)
    require(c.scaling.max_failures >= -1, where, "scaling.max_failures", "an integer ≥ -1 (-1: retry forever)",
             c.scaling.max_failures)
    require(c.scaling.start_timeout_s >= 0, where, "scaling.start_timeout_s", "seconds ≥ 0 (0: wait for ever)",
            c.scaling.start_timeout_s)
    _validate_gpus(c.scaling, where)
    require(c.tune.scheduler in ("fifo", "asha"), where, "tune.scheduler", "fifo or asha", c.tune.scheduler)
    require(c.tune.mode in ("max", "min"), where, "tune.mode", "max or min", c.tune.mode)
    require(c.tune.num_samples >= 1, where, "tune.num_samples", "an integer ≥ 1", c.tune.num_samples)
    require(c.tune.max_concurrent_trials >= 1, where, "tune.max_concurrent_trials", "≥ 1",
             c.tune.max_concurrent_trials)
    require(c.tune.driver_cpus > 0, where, "tune.driver_cpus", "> 0 (Tune rejects 0)", c.tune.driver_cpus)
    if isinstance(c.optim, LoopOptions):
        require(c.optim.precision in PRECISIONS, where, "optim.precision", " | ".join(PRECISIONS),
                c.optim.precision)
        require(c.optim.update_freq >= 1, where, "optim.update_freq", "an integer ≥ 1", c.optim.update_freq)
        require(c.optim.prefetch >= 0, where, "optim.prefetch", "an integer ≥ 0 (0: no background thread)",
                c.optim.prefetch)
        modes = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
        require(c.optim.compile_mode in modes, where, "optim.compile_mode", " | ".join(modes),
                c.optim.compile_mode)
    if isinstance(c.optim, OptimSection):
        _validate_optim(c.optim, where)
    if isinstance(getattr(c, "mining", None), MiningSection):
        _validate_mining(c.mining, where)


def _gpu_amount(value: float) -> bool:
    """What Ray takes as a GPU request: a fraction of one GPU, or whole GPUs."""
    return 0 <= value <= 1 or float(value).is_integer()


def _validate_gpus(s: ScalingSection, where: str) -> None:
    require(s.gpus_per_worker > 0 and _gpu_amount(s.gpus_per_worker), where, "scaling.gpus_per_worker",
            "a fraction in (0, 1] or whole GPUs", s.gpus_per_worker)
    if s.use_gpu and s.num_workers >= 2 and s.gpus_per_worker <= 0.5:  # two ranks could get one GPU
        raise UserError(f"{where}: config key 'scaling.gpus_per_worker': expected > 0.5 with scaling.num_workers="
                        f"{s.num_workers} GPU workers (Ray may put two workers of {s.gpus_per_worker:g} GPU on "
                        "one GPU, and NCCL refuses two ranks of one run on one GPU), got "
                        f"{s.gpus_per_worker:g}; share a GPU with one worker, or give each worker a GPU")


def _validate_optim(o: OptimSection, where: str) -> None:
    require(o.lr > 0, where, "optim.lr", "> 0", o.lr)
    require(len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas), where, "optim.betas",
             "two numbers in [0, 1)", o.betas)
    require(o.scheduler in ("fixed", "polynomial"), where, "optim.scheduler", "fixed or polynomial", o.scheduler)
    require(o.batch_size >= 1, where, "optim.batch_size", "an integer ≥ 1", o.batch_size)
    require(o.max_tokens >= 0, where, "optim.max_tokens", "an integer ≥ 0 (0 = batches by sentences)",
            o.max_tokens)
    require(o.epochs >= 0, where, "optim.epochs", "an integer ≥ 0", o.epochs)
    require(o.clip_norm >= 0, where, "optim.clip_norm", "≥ 0 (0 = no clipping)", o.clip_norm)


def _validate_mining(m: MiningSection, where: str) -> None:
    require(m.num_miners >= 1, where, "mining.num_miners", "an integer ≥ 1", m.num_miners)
    require(m.cpus_per_miner >= 0 and m.gpus_per_miner >= 0, where, "mining.cpus_per_miner",
             "non-negative resources", (m.cpus_per_miner, m.gpus_per_miner))
    require(_gpu_amount(m.gpus_per_miner), where, "mining.gpus_per_miner", "a fraction in [0, 1] or whole GPUs",
            m.gpus_per_miner)
    require(m.max_staleness >= 0, where, "mining.max_staleness", "an integer ≥ 0", m.max_staleness)
    require(m.sync_every >= 0, where, "mining.sync_every", "an integer ≥ 0", m.sync_every)
    require(m.refresh_every >= 0, where, "mining.refresh_every", "an integer ≥ 0", m.refresh_every)
    require(m.task_size >= 1, where, "mining.task_size", "an integer ≥ 1", m.task_size)
    require(m.queue_size >= m.task_size, where, "mining.queue_size", f"≥ mining.task_size = {m.task_size}",
             m.queue_size)
    require(m.lease_s > 0, where, "mining.lease_s", "> 0 seconds", m.lease_s)
    engine = getattr(m, "engine", "hf")  # beam-search miners choose a decoding engine (GecMiningSection)
    require(engine in ENGINES, where, "mining.engine", " | ".join(ENGINES), engine)
    allowed = PRECISIONS + ("int8",) if engine != "hf" else PRECISIONS
    require(m.precision in allowed, where, "mining.precision", " | ".join(allowed) + (
        "" if engine != "hf" else " (int8 with mining.engine=ctranslate2 or auto)"), m.precision)


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Rebuild a config from :func:`to_dict` output (how a config crosses into Ray workers)."""
    return _build(cls, data, "", "config")


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def dump_yaml(config: Any, path: Path) -> None:
    """Write the resolved config atomically, credentials hidden (a URI's password, a secret's value)."""
    write_atomic(path, redact(yaml.safe_dump(to_dict(config), sort_keys=False)))
