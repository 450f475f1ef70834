"""Nested dataclass config: loaded from ``tune_spaces/<SPACE>.yaml``, typed ``--set`` overrides, validated once.

The spaces are package data: a wheel carries them in ``raycl/tune_spaces/`` and a checkout (on ``PYTHONPATH``,
or installed editable) has them in its top-level ``tune_spaces/`` — one folder in the repository, mapped into the
package when it is built (``package_dir`` in ``setup.py``); :func:`spaces_dir` finds whichever this raycl has.

A space file has the sections of its task's config (``model``, ``data``, ``loss`` ...), a ``search:`` block
over dotted keys, optional ``baselines:`` (named dotted overrides, run after the sweep at the best point) and
``presets:`` (named partial configs merged over the base by ``--preset``). Every key is checked against the
dataclasses before anything runs: a mistake ends in one line naming the file or ``--set`` and the key.

This package's modules, one concern each (this file names what the rest of raycl uses):

- :mod:`~raycl.config.sections`: the sections every task shares, and :class:`Space`;
- :mod:`~raycl.config.keys`: typed building from mappings, dotted keys (``--set``, Tune), dicts and YAML out;
- :mod:`~raycl.config.validation`: bounds and consistency checks;
- :mod:`~raycl.config.bounded_yaml`: YAML read within bounds;
- :mod:`~raycl.config.search`: a space's ``search:`` and ``baselines:`` checked;
- :mod:`~raycl.config.spaces`: space files found, read and built.
"""

from __future__ import annotations

from raycl.config.bounded_yaml import safe_yaml
from raycl.config.keys import dump_yaml, from_dict, get_dotted, parse_set, set_dotted, to_dict
from raycl.config.search import MAX_SEARCH_VALUES, MAX_TRIALS, SEARCH_KINDS, expand_values, search_count
from raycl.config.sections import (
    PRECISIONS,
    LoopOptions,
    MiningSection,
    OptimSection,
    ScalingSection,
    Space,
    TuneSection,
)
from raycl.config.spaces import build_space, read_space, resolve_space_path, space_names, spaces_dir
from raycl.config.validation import number_bound, require, validate
from raycl.models.decoding import ENGINES

__all__ = [
    "ENGINES",
    "MAX_SEARCH_VALUES",
    "MAX_TRIALS",
    "PRECISIONS",
    "SEARCH_KINDS",
    "LoopOptions",
    "MiningSection",
    "OptimSection",
    "ScalingSection",
    "Space",
    "TuneSection",
    "build_space",
    "dump_yaml",
    "expand_values",
    "from_dict",
    "get_dotted",
    "number_bound",
    "parse_set",
    "read_space",
    "require",
    "resolve_space_path",
    "safe_yaml",
    "search_count",
    "set_dotted",
    "space_names",
    "spaces_dir",
    "to_dict",
    "validate",
]
