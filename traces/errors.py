"""Errors and warnings raised by the trace loaders.

Two tiers, following the project style:

* :class:`TraceError` (a ``ValueError``): the input file is wrong. The message names
  the file, the 1-based line (the header is line 1), the column and the bad value.
* :class:`TraceWarning` (a ``UserWarning``): the input was usable but was changed,
  e.g. rows out of time order were sorted or failed requests were dropped.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

MAX_VALUE_CHARS = 80   # longer values are cut in messages (a whole line or list is rarely needed)


class TraceError(ValueError):
    """A trace file (or trace argument) is malformed; the message says where."""


class TraceWarning(UserWarning):
    """A trace was loaded but altered (sorted, rows dropped); the message counts it."""


def where(path: str | Path, line: int | None = None, column: str | None = None) -> str:
    """Formats the location prefix of an error message.

    Args:
        path: The trace file.
        line: 1-based line number (header = line 1), or None.
        column: Column (field) name, or None.

    Returns:
        E.g. ``"trace.csv: line 5, column 'ContextTokens'"``.
    """
    text = f"{path}"
    parts = []
    if line is not None:
        parts.append(f"line {line}")
    if column is not None:
        parts.append(f"column '{column}'")
    return text + (": " + ", ".join(parts) if parts else "")


def fail(path: str | Path, what: str, line: int | None = None,
         column: str | None = None, value: Any = None) -> TraceError:
    """Builds a :class:`TraceError` with one message naming file, line, column and value.

    Args:
        path: The trace file.
        what: What is wrong, e.g. ``"token count must be >= 1"``.
        line: 1-based line number (header = line 1), or None.
        column: Column name, or None.
        value: The offending value; omitted from the message when None.

    Returns:
        The exception (the caller raises it, so tracebacks point at the caller).
    """
    msg = f"{where(path, line, column)}: {what}"
    if value is not None:
        msg += f" (got {plain(value)})"
    error = TraceError(msg)
    error.line = line         # several columns' errors: the caller reports the earliest line (earliest_error)
    return error


def earliest_error(checks) -> list:
    """Run each of ``checks`` (callables); return their results in order, or raise the :class:`TraceError` of the
    earliest line among those that failed (a file with several bad rows names its first one, whatever column
    it is in; an error without a line counts as last).

    Raises:
        TraceError: as above.
    """
    results, errors = [], []
    for check in checks:
        try:
            results.append(check())
        except TraceError as exc:
            errors.append(exc)
    if errors:
        raise min(errors, key=lambda exc: getattr(exc, "line", None) or float("inf"))
    return results


def _python(value: Any) -> Any:
    """numpy scalars and arrays (also inside lists) as the Python values they hold. numpy is not imported
    here: a numpy value can exist only once numpy is loaded (so the CLI's parser stays free of it)."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.generic):
        return value.item()
    if np is not None and isinstance(value, np.ndarray):
        return [_python(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return type(value)(_python(v) for v in value)
    if isinstance(value, dict):
        return {_python(k): _python(v) for k, v in value.items()}
    return value


def plain(value: Any) -> str:
    """Shows a value in a message as the file wrote it: ``-200`` (not ``np.int64(-200)``),
    ``nan``, ``[0, 1]`` (not ``array([0, 1])``), text in quotes; cut after
    :data:`MAX_VALUE_CHARS` characters.

    Args:
        value: Any value (Python or numpy scalar, array, list, string).

    Returns:
        One line of text (newlines are shown escaped, as ``repr`` does).
    """
    text = repr(_python(value))
    if len(text) > MAX_VALUE_CHARS:
        text = text[:MAX_VALUE_CHARS - 3] + "..."
    return text


class JsonShown:
    """A value read from a JSON line, shown in a message as JSON writes it (``true``, ``null``, ``"12"``), not as
    Python's repr (``True``, ``None``): :func:`plain` calls ``repr``."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        import json
        try:
            return json.dumps(self.value, allow_nan=True)
        except (TypeError, ValueError):
            return repr(self.value)


def not_a_file(path: Path) -> str:
    """Why ``path``, not a regular file, cannot be a trace: missing, a directory, or something else (a device
    such as ``/dev/null``, a pipe, a socket)."""
    if path.is_dir():
        return "is a directory, not a trace file"
    return "is not a regular file (a device, pipe or socket), not a trace file" if path.exists() else "no such file"
