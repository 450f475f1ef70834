"""User-facing errors: one line, naming the file and line (or the config key) and what was expected.

A :class:`UserError` is a mistake in what the user gave us (a file, a key, a value); the CLI entry points
print its message on one line and exit with status 2 (1 for :class:`RangesFailed`), without a traceback.
Internal bugs raise anything else.
"""

from __future__ import annotations

import functools
import os
import re
import reprlib
import sys
from collections.abc import Callable
from typing import TextIO, TypeVar

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
    """``path:line`` (or just ``path``) — the location prefix every file error starts with (a URI's password
    hidden)."""
    return redact(f"{path}:{line}" if line is not None else str(path))


_SHOWN = reprlib.Repr()  # keyword arguments only from Python 3.12
_SHOWN.maxstring = _SHOWN.maxother = 60
_SHOWN.maxlist = _SHOWN.maxdict = _SHOWN.maxtuple = _SHOWN.maxset = 4
_SHOWN.maxlevel = 3


def shown(value: object) -> str:
    """A user's value in a message: its ``repr`` cut to a few hundred characters (``reprlib``: a value built by
    YAML aliases may be gigabytes long), credentials hidden (:func:`redact`)."""
    return redact(_SHOWN.repr(value))


_URI_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):([^/\s@]+)@")
# environment variables that hold credentials (their values are hidden wherever raycl writes text)
SECRET_ENV = re.compile(r"^AWS_(SECRET_ACCESS_KEY|SESSION_TOKEN|ACCESS_KEY_ID)$|TOKEN|SECRET|PASSWORD|PASSWD"
                        r"|API_KEY|CREDENTIAL|PRIVATE_KEY", re.IGNORECASE)  # fmt: skip


def environ_items() -> list[tuple[str, str]]:
    """``os.environ``'s items, safe while another thread sets or deletes a variable (MLflow's telemetry thread
    does): ``os.environ.items()`` raises KeyError for a variable deleted while it iterates."""
    return [(k, v) for k in list(os.environ) if (v := os.environ.get(k)) is not None]


def redact(text: str) -> str:
    """``text`` with a URI's password (``scheme://user:password@host`` → ``scheme://user:***@host``) and the value
    of every credential variable of the environment (:data:`SECRET_ENV`, 6 characters or more) replaced by
    ``***``."""
    text = _URI_PASSWORD.sub(r"\1:***@", text)
    for name, value in environ_items():
        if len(value) >= 6 and SECRET_ENV.search(name) and value in text:
            text = text.replace(value, "***")
    return text


_SUMMARY_OUT: list[TextIO] = []


def summary_out() -> TextIO:
    """Where a verb's ``--json`` summary goes: the stdout the command started with. While a ``--json`` command
    runs, whatever else is written to stdout — Ray's messages of its workers and raylet (``(raylet) WARNING: …``),
    a library's print — goes to stderr, so that stdout holds the JSON only."""
    return _SUMMARY_OUT[-1] if _SUMMARY_OUT else sys.stdout


def cli_entry(func: F) -> F:
    """Wrap a CLI ``main``: a :class:`UserError` becomes one line on stderr and exit status 2; with ``--json``
    stdout is the summary's alone (:func:`summary_out`)."""

    @functools.wraps(func)
    def wrapper(*args: object, **kwargs: object) -> object:
        argv = kwargs.get("argv", args[0] if args else None)
        as_json = "--json" in (sys.argv[1:] if argv is None else list(argv))  # type: ignore[call-overload]
        stdout = sys.stdout
        if as_json:
            _SUMMARY_OUT.append(stdout)
            sys.stdout = sys.stderr
        try:
            return func(*args, **kwargs)
        except UserError as err:
            print(f"raycl: error: {err}", file=sys.stderr)
            sys.exit(err.exit_status)
        except KeyboardInterrupt:
            print("raycl: interrupted", file=sys.stderr)
            sys.exit(130)
        finally:
            if as_json:
                sys.stdout = stdout
                _SUMMARY_OUT.pop()

    return wrapper  # type: ignore[return-value]
