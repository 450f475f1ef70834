"""Tune space files: found in this raycl (:func:`spaces_dir`), read with ``--preset`` merged in, and built into a
:class:`~raycl.config.sections.Space` of a task's config class, checked before anything runs."""

from __future__ import annotations

import importlib.resources
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

import yaml

from raycl.config.bounded_yaml import safe_yaml
from raycl.config.keys import build, merge, parse_set, set_dotted
from raycl.config.search import check_baselines, check_search
from raycl.config.sections import Space
from raycl.config.validation import validate
from raycl.errors import UserError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable


def read_space_yaml(path: Traversable) -> dict[str, Any]:
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
    return Path(__file__).resolve().parents[2] / "tune_spaces"  # raycl/config/spaces.py → the checkout


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
    raw = read_space_yaml(path)
    presets = raw.pop("presets", {}) or {}
    if preset is not None:
        if preset not in presets:
            raise UserError(f"{where}: unknown preset '{preset}' (this space has: {', '.join(presets) or 'none'})")
        chosen = dict(presets[preset] or {})
        if "search" in chosen:  # a preset's search replaces the base grid, it does not extend it
            raw["search"] = chosen.pop("search")
        raw = merge(raw, chosen)
    return path, raw, raw.pop("search", {}) or {}, raw.pop("baselines", {}) or {}


def build_space(
    path: Traversable,
    cls: type,
    raw: dict[str, Any],
    *,
    search: Any,
    baselines: Any,
    preset: str | None,
    overrides: list[str] | None,
) -> Space:
    """The space of a task's config class ``cls``: built from ``raw``, validated, ``--set`` overrides applied, its
    search and baselines checked against it (``raycl.config.tasks.load_space`` finds ``cls`` from the ``task:``
    key)."""
    where = str(path)
    config = build(cls, raw, "", where)
    validate(config, where=where)
    if overrides:
        config = set_dotted(config, parse_set(overrides), where="--set", raw=True)
    return Space(
        name=PurePath(path.name).stem,
        source=where,
        config=config,
        search=check_search(config, search, where),
        baselines=check_baselines(config, baselines, where),
        preset=preset,
    )
