"""MkDocs hook: the parts of the docs that are generated from the code at build time, so that they cannot drift.

A page asks for a generated part with an HTML comment on a line of its own:

- ``<!-- raycl:config -->``: the configuration reference — every key of every task's config dataclasses
  (``raycl/config/sections.py``, ``raycl/config/tasks/<task>.py``) with its type, its default, the value each space file of
  ``tune_spaces/`` gives it where that differs, and the comment written beside it in the code;
- ``<!-- raycl:spaces -->``: the tune spaces: task, presets, search block and baselines of each file;
- ``<!-- raycl:help VERB [SUBVERB] -->``: ``python -m raycl.VERB [SUBVERB] --help`` as the checkout prints it
  (``<!-- raycl:help -->``: ``raycl --help``, the verbs).

The code is imported from this checkout (the repository root is put first on ``sys.path`` and ``PYTHONPATH``),
never from an installed copy. A marker that cannot be filled fails the build.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import os
import re
import subprocess
import sys
import textwrap
import tokenize
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- raycl:(config|spaces|help)((?: [\w-]+)*) -->$", re.M)


def on_config(config: Any) -> Any:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def fill(match: re.Match[str]) -> str:
        kind, args = match[1], match[2].split()
        if kind == "config":
            return config_reference()
        if kind == "spaces":
            return spaces_table()
        return help_text(args)

    return MARKER.sub(fill, markdown)


ROLE = re.compile(r":(?:func|mod|class|meth|attr|data|obj):(?=<code>)")
CODE = re.compile(r"<code>(.*?)</code>", re.S)


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Two renderings mended in the HTML: docstrings cite code with Sphinx roles (``:func:`x` ``), whose text
    mkdocstrings leaves in front of the name; a ``|`` inside code in a table cell is written ``\\|`` (as GitHub
    wants it too), and Python-Markdown keeps the backslash inside code."""
    html = ROLE.sub("", html)
    return CODE.sub(lambda m: "<code>" + m[1].replace("\\|", "|") + "</code>", html)


# ---------------------------------------------------------------------------------------------- --help
def help_text(verb: list[str]) -> str:
    """``python -m raycl.VERB … --help`` of this checkout (no verb: ``raycl --help``), as a code block."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "COLUMNS": "110", "PYTHONPATH": path}
    cmd = [sys.executable, "-m", f"raycl.{verb[0]}" if verb else "raycl", *verb[1:], "--help"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr[-2000:]}")
    return f"```text\n{done.stdout.rstrip()}\n```"


# ---------------------------------------------------------------------------------------------- comments
def _comments(cls: type) -> dict[str, str]:
    """Field name → the comments written beside it in ``cls``'s own source: comment lines right above it (at the
    field's indentation), the comment on its line(s), and comment lines right below it indented further (a
    trailing comment continued)."""
    lines, first = inspect.getsourcelines(cls)
    source = textwrap.dedent("".join(lines))
    by_line: dict[int, tuple[int, str]] = {}  # 1-based line → (column, comment text) of its comment
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            by_line[tok.start[0]] = (tok.start[1], tok.string.lstrip("#").strip())
    src_lines = source.splitlines()
    code_lines = {i + 1 for i, text in enumerate(src_lines) if text.strip() and not text.strip().startswith("#")}
    out: dict[str, str] = {}
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        start, end, col = node.lineno, node.end_lineno or node.lineno, node.col_offset
        above: list[str] = []
        line = start - 1
        while line in by_line and line not in code_lines and by_line[line][0] == col:
            above.insert(0, by_line[line][1])
            line -= 1
        beside = [by_line[n][1] for n in range(start, end + 1) if n in by_line]
        line = end + 1
        while beside and line in by_line and line not in code_lines and by_line[line][0] > col:
            beside.append(by_line[line][1])
            line += 1
        out[node.target.id] = " ".join(above + beside)
    return out


def _owner(cls: type, name: str) -> type:
    """The most derived class of ``cls``'s MRO that declares the field ``name`` itself."""
    return next(k for k in cls.__mro__ if name in k.__dict__.get("__annotations__", {}))


# ---------------------------------------------------------------------------------------------- values
def _value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False) if v == "" else v
    if isinstance(v, (list, dict)):
        return json.dumps(v, ensure_ascii=False).replace('"', "")
    return str(v)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return f"`{_cell(text)}`"


# ---------------------------------------------------------------------------------------------- config
def _spaces_of(task: str) -> dict[str, Any]:
    """Space name → its config as the file writes it (no preset), for every space file of ``task``."""
    from raycl.config import safe_yaml, space_names, spaces_dir
    from raycl.config.tasks import load_space

    out = {}
    for name in space_names():
        raw = safe_yaml(spaces_dir().joinpath(f"{name}.yaml").read_text(encoding="utf-8")) or {}
        if raw.get("task", "gec") == task:
            out[name] = load_space(name).config
    return out


def _rows(cls: type, default: Any, spaces: dict[str, Any], prefix: str) -> list[str]:
    """Table rows of ``cls``'s fields (a nested section's keys as dotted sub-keys)."""
    from raycl.config import get_dotted

    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        key, value = f"{prefix}.{f.name}" if prefix else f.name, getattr(default, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            rows += _rows(hints[f.name], value, {n: get_dotted(c, f.name) for n, c in spaces.items()}, key)
            continue
        owner = _owner(cls, f.name)
        annotation = owner.__dict__["__annotations__"][f.name]
        given = [f"{name}: {_value(getattr(c, f.name))}" for name, c in spaces.items()
                 if getattr(c, f.name) != value]  # fmt: skip
        rows.append(f"| {_code(key)} | {_code(str(annotation))} | {_code(_value(value))} | "
                    f"{_cell('; '.join(given))} | {_cell(_comments(owner).get(f.name, ''))} |")  # fmt: skip
    return rows


def _doc(cls: type) -> str:
    doc = cls.__dict__.get("__doc__") or ""
    return "" if not doc or doc.startswith(f"{cls.__name__}(") else inspect.cleandoc(doc)


def _task_reference(task: str) -> list[str]:
    from raycl.config.tasks import task_config

    cls = task_config(task)
    assert cls is not None
    default, spaces = cls(), _spaces_of(task)
    hints = typing.get_type_hints(cls)
    names = ", ".join(f"`tune_spaces/{n}.yaml`" for n in spaces) or "none"
    out = [f"## `{task}`", "", f"`{cls.__module__}.{cls.__name__}`; space files: {names}.", ""]
    top = [f for f in dataclasses.fields(cls) if not dataclasses.is_dataclass(hints[f.name])]
    out += [f"Top-level keys: {', '.join(f'`{f.name}` (`{_value(getattr(default, f.name))}`)' for f in top)}.", ""]
    for f in dataclasses.fields(cls):
        section: type = hints[f.name]
        if not dataclasses.is_dataclass(section):
            continue
        out += [f"### `{task}`: `{f.name}`", "", f"`{section.__module__}.{section.__name__}`"]
        doc = " ".join(filter(None, (_doc(k) for k in reversed(section.__mro__) if dataclasses.is_dataclass(k))))
        out += ["", doc] if doc else []
        out += ["", "| key | type | default | in the space files | what it is |", "|---|---|---|---|---|"]
        out += _rows(section, getattr(default, f.name), {n: getattr(c, f.name) for n, c in spaces.items()}, f.name)
        out.append("")
    return out


def config_reference() -> str:
    from raycl.config.tasks import TASK_CONFIGS

    out: list[str] = []
    for task in TASK_CONFIGS:
        out += _task_reference(task)
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------- spaces
def spaces_table() -> str:
    from raycl.config import safe_yaml, space_names, spaces_dir

    out = ["| space file | task | presets | search | baselines |", "|---|---|---|---|---|"]
    for name in space_names():
        raw = safe_yaml(spaces_dir().joinpath(f"{name}.yaml").read_text(encoding="utf-8")) or {}
        search = "<br>".join(_code(f"{k}: {_value(v)}") for k, v in (raw.get("search") or {}).items())
        baselines = "<br>".join(_code(f"{k}: {_value(v)}") for k, v in (raw.get("baselines") or {}).items())
        presets = ", ".join(f"`{p}`" for p in raw.get("presets") or {})
        task = raw.get("task", "gec")
        out.append(f"| `tune_spaces/{name}.yaml` | `{task}` | {presets} | {search} | {baselines} |")
    return "\n".join(out)
