"""User-facing errors: one line, naming the file and line (or the config key) and what was expected.

A :class:`UserError` is a mistake in what the user gave us (a file, a key, a value); the CLI entry points
print its message on one line and exit with status 2 (1 for :class:`RangesFailed` and :class:`TrialsFailed`),
without a traceback.
Internal bugs raise anything else.
"""

from __future__ import annotations

import functools
import os
import re
import reprlib
import sys
import traceback
from collections.abc import Callable
from types import TracebackType
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


class TrialsFailed(UserError):
    """Every trial of a run failed (their errors are in its ``results.csv``, its report is written). Not a usage
    error: exit status 1."""

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
# a query parameter that carries a credential: presigned URLs (X-Amz-Signature, X-Amz-Credential,
# X-Amz-Security-Token, X-Goog-Signature, Signature, AWSAccessKeyId), SAS tokens (sig), pyarrow's S3 options
# (access_key, secret_key, session_token), token=, password=, api_key=, auth=
_QUERY_SECRET = re.compile(
    r"([?&;][\w.%-]*?(?:sig|token|credential|secret|passw|pwd|key|auth)[\w.%-]*=)"
    r"((?:(?!:\s)[^&#\s'\"<>])+)",
    re.IGNORECASE,
)
# environment variables that hold credentials (their values are hidden wherever raycl writes text)
SECRET_ENV = re.compile(
    r"^AWS_(SECRET_ACCESS_KEY|SESSION_TOKEN|ACCESS_KEY_ID)$|TOKEN|SECRET|PASSWORD|PASSWD"
    r"|API_KEY|CREDENTIAL|PRIVATE_KEY",
    re.IGNORECASE,
)


def environ_items() -> list[tuple[str, str]]:
    """``os.environ``'s items, safe while another thread sets or deletes a variable (MLflow's telemetry thread
    does): ``os.environ.items()`` raises KeyError for a variable deleted while it iterates."""
    return [(k, v) for k in list(os.environ) if (v := os.environ.get(k)) is not None]


OBJECT_STORES = ("s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "oss", "r2")  # user@ is a key there


def redact_uri(text: str) -> str:
    """``text`` with every URI's password (``scheme://user:password@host`` → ``scheme://user:***@host``) and the
    value of every credential query parameter (``?X-Amz-Signature=***``, ``&sig=***``, ``?token=***`` …) hidden."""
    return _QUERY_SECRET.sub(r"\1***", _URI_PASSWORD.sub(r"\1:***@", text))


def uri_credentials(uri: str) -> bool:
    """Whether ``uri`` carries a credential: a password (``user:password@``), any user part of an object store
    URI (``s3://KEY_ID@bucket``: pyarrow reads it as the access key), or a credential query parameter."""
    head = uri.split("://", 1)
    if len(head) != 2:
        return False
    authority = head[1].split("/", 1)[0]
    store = head[0].lower() in OBJECT_STORES and not azure_container(uri)
    return ("@" in authority and (store or ":" in authority.rsplit("@", 1)[0])) or redact_uri(uri) != uri


# adlfs' CONTAINER@ACCOUNT.dfs.core.windows.net (or .blob., or a sovereign cloud's core.<domain>): Azure's rules
# for a container's name (3-63 lowercase letters, digits, dashes) and an account's (3-24 letters, digits)
_AZURE = re.compile(
    r"^(abfss?|az)://[a-z0-9](?:[a-z0-9-]{1,61}[a-z0-9])@[a-z0-9]{3,24}"
    r"\.(dfs|blob)\.core\.[a-z0-9.-]+(/|$)",
    re.IGNORECASE,
)


def azure_container(uri: str) -> bool:
    """Whether ``uri`` names an Azure container in adlfs' form, ``abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/…``:
    its user part is the container (a name, never a key: no ``:``, lowercase letters, digits and dashes)."""
    return bool(_AZURE.match(uri))


def redact(text: str) -> str:
    """``text`` with a URI's password (``scheme://user:password@host`` → ``scheme://user:***@host``), every
    credential query parameter (:func:`redact_uri`) and the value of every credential variable of the environment
    (:data:`SECRET_ENV`, 6 characters or more) replaced by ``***``."""
    text = redact_uri(text)
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


def _redacted_traceback(kind: type[BaseException], err: BaseException, tb: TracebackType | None) -> None:
    """``sys.excepthook`` of the CLIs: Python's traceback, credentials hidden (:func:`redact`) — a library's
    exception may quote a URI or a key it was given."""
    print(redact("".join(traceback.format_exception(kind, err, tb))), end="", file=sys.stderr)


def cli_entry(func: F) -> F:
    """Wrap a CLI ``main``: a :class:`UserError` becomes one line on stderr and exit status 2; with ``--json``
    stdout is the summary's alone (:func:`summary_out`). Every error is printed here, credentials hidden
    (:func:`redact`): the one line, and an internal error's traceback (``sys.excepthook``)."""

    @functools.wraps(func)
    def wrapper(*args: object, **kwargs: object) -> object:
        argv = kwargs.get("argv", args[0] if args else None)
        as_json = "--json" in (sys.argv[1:] if argv is None else list(argv))  # type: ignore[call-overload]
        stdout = sys.stdout
        if as_json:
            _SUMMARY_OUT.append(stdout)
            sys.stdout = sys.stderr
        sys.excepthook = _redacted_traceback  # an internal error's traceback, printed as Python exits
        try:
            return func(*args, **kwargs)
        except UserError as err:
            print(f"raycl: error: {redact(str(err))}", file=sys.stderr)
            sys.exit(err.exit_status)
        except KeyboardInterrupt:
            print("raycl: interrupted", file=sys.stderr)
            sys.exit(130)
        finally:
            if as_json:
                sys.stdout = stdout
                _SUMMARY_OUT.pop()

    return wrapper  # type: ignore[return-value]
