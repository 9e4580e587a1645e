"""Errors and warnings raised by the trace loaders.

Two tiers, following the project style:

* :class:`TraceError` (a ``ValueError``): the input file is wrong. The message names
  the file, the 1-based line (the header is line 1), the column and the bad value.
* :class:`TraceWarning` (a ``UserWarning``): the input was usable but was changed,
  e.g. rows out of time order were sorted or failed requests were dropped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


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
        if hasattr(value, "item"):          # numpy scalar: show 3, not np.int64(3)
            value = value.item()
        msg += f" (got {value!r})"
    return TraceError(msg)
