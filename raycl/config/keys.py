"""Configs as typed dataclasses: built from mappings with every key checked against the annotations, dotted
keys read and replaced (``--set loss.margin=0.3``, a Tune trial's point), converted to and from plain dicts (how a
config crosses into Ray workers) and written as YAML."""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from raycl.config.bounded_yaml import MAX_YAML_INT, safe_yaml
from raycl.config.validation import validate
from raycl.errors import UserError, redact, shown
from raycl.files import write_atomic


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


def coerce(value: Any, tp: Any, key: str, where: str) -> Any:
    """Check ``value`` against the annotation ``tp`` (ints are accepted for floats; a lone str for list[str])."""
    bad = UserError(f"{where}: config key '{key}': expected {_describe(tp)}, got {shown(value)}")
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return coerce(value, args[0], key, where)
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, str) and item is str:
            value = [value]
        if not isinstance(value, list):
            raise bad
        return [coerce(v, item, key, where) for v in value]
    if origin is dict:
        _, item = typing.get_args(tp)
        if not isinstance(value, dict):
            raise bad
        return {str(k): coerce(v, item, f"{key}.{k}", where) for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad
        return build(tp, value, key, where)
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


def build(cls: type, data: dict[str, Any], prefix: str, where: str) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in known:
            full = f"{prefix}.{key}" if prefix else key
            raise UserError(f"{where}: unknown config key '{full}' (known here: {', '.join(sorted(known))})")
    kwargs = {k: coerce(v, hints[k], f"{prefix}.{k}" if prefix else k, where) for k, v in data.items()}
    return cls(**kwargs)


def field_type(cls: type, dotted: str, where: str) -> Any:
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
def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
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
        tp = field_type(cls, key, where)
        if raw:
            dotted[key] = _parse_raw(value, tp)
    data = merge(dataclasses.asdict(config), _nest(dotted))
    new = build(cls, data, "", where)
    validate(new, where=where)
    return new


def get_dotted(config: Any, key: str) -> Any:
    node = config
    for part in key.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Rebuild a config from :func:`to_dict` output (how a config crosses into Ray workers)."""
    return build(cls, data, "", "config")


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def dump_yaml(config: Any, path: Path) -> None:
    """Write the resolved config atomically, credentials hidden (a URI's password, a secret's value)."""
    write_atomic(path, redact(yaml.safe_dump(to_dict(config), sort_keys=False)))
