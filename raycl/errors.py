"""User-facing errors: one line, naming the file and line (or the config key) and what was expected.

A :class:`UserError` is a mistake in what the user gave us (a file, a key, a value); the CLI entry points
print its message on one line and exit with status 2 (1 for :class:`RangesFailed`), without a traceback.
Internal bugs raise anything else.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TypeVar

EXIT_USAGE = 2

F = TypeVar("F", bound=Callable[..., object])


class UserError(Exception):
    """A mistake in the user's input; ``str(err)`` is the whole one-line message."""

    exit_status = EXIT_USAGE


class RangesFailed(UserError):
    """Some ranges of a corpus could not be mined (listed in the message and ``_failures.json``); the others
    were. Not a usage error: exit status 1."""

    exit_status = 1


def at(path: object, line: int | None = None) -> str:
    """``path:line`` (or just ``path``) — the location prefix every file error starts with."""
    return f"{path}:{line}" if line is not None else str(path)


def cli_entry(func: F) -> F:
    """Wrap a CLI ``main``: a :class:`UserError` becomes one line on stderr and exit status 2."""

    @functools.wraps(func)
    def wrapper(*args: object, **kwargs: object) -> object:
        try:
            return func(*args, **kwargs)
        except UserError as err:
            print(f"raycl: error: {err}", file=sys.stderr)
            sys.exit(err.exit_status)
        except KeyboardInterrupt:
            print("raycl: interrupted", file=sys.stderr)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]
