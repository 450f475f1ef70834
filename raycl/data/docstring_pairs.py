"""Real text pairs built offline: the docstrings of Python's standard library, each object's summary line (the
anchor) → the rest of its docstring (the positive). Used by the dense-mining tests, benchmark and docs: real
English with real near neighbours (``os.path`` helpers, ``str`` methods, …), no download.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from typing import Any

MODULES = (
    "argparse",
    "ast",
    "asyncio",
    "base64",
    "bisect",
    "calendar",
    "collections",
    "configparser",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "dis",
    "doctest",
    "email.message",
    "enum",
    "fnmatch",
    "fractions",
    "ftplib",
    "functools",
    "gettext",
    "glob",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html.parser",
    "http.client",
    "imaplib",
    "inspect",
    "io",
    "itertools",
    "json",
    "locale",
    "logging",
    "lzma",
    "mimetypes",
    "operator",
    "os",
    "pathlib",
    "pickle",
    "platform",
    "poplib",
    "pprint",
    "queue",
    "random",
    "re",
    "sched",
    "secrets",
    "selectors",
    "shlex",
    "shutil",
    "smtplib",
    "socket",
    "sqlite3",
    "statistics",
    "string",
    "struct",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "time",
    "timeit",
    "tokenize",
    "traceback",
    "types",
    "typing",
    "unittest",
    "urllib.parse",
    "urllib.request",
    "uuid",
    "warnings",
    "weakref",
    "xml.etree.ElementTree",
    "zipfile",
)


def docstring_pairs(limit: int | None = None, *, max_chars: int = 600) -> list[dict[str, str]]:
    """``{"anchor": summary line, "positive": the rest}`` of the standard library's documented objects, in a
    fixed order, each anchor and positive once, positives cut at ``max_chars``."""
    rows: list[dict[str, str]] = []
    anchors: set[str] = set()
    texts: set[str] = set()
    for doc in _docstrings():
        head, _, rest = doc.strip().partition("\n")
        head, rest = head.strip(), " ".join(rest.split())[:max_chars]
        if len(head) > 15 and len(rest) > 40 and head not in anchors and rest not in texts:
            anchors.add(head)
            texts.add(rest)
            rows.append({"anchor": head, "positive": rest})
            if limit is not None and len(rows) >= limit:
                break
    return rows


def _docstrings() -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in MODULES:
            try:
                mod = importlib.import_module(name)
            except ImportError:
                continue
            for obj in [mod, *(getattr(mod, a) for a in sorted(dir(mod)) if not a.startswith("_"))]:
                doc = _doc(obj)
                if doc and doc not in seen:
                    seen.add(doc)
                    out.append(doc)
    return out


def _doc(obj: Any) -> str | None:
    try:
        return inspect.getdoc(obj)
    except Exception:  # an object whose __doc__ raises
        return None
