"""Vectorised, checked conversion of one CSV column to tokens, seconds or timestamps.

Each function takes a chunk whose index is the data-row position (see
:func:`traces.csvread.line_of`) and raises one :class:`TraceError` naming the file,
line, column and value of the first bad entry.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from traces.csvread import line_of
from traces.errors import fail

MAX_TOKENS = 100_000_000   # 100 M tokens: far above any context window, far below int64 overflow


def _first_bad(path: Path, chunk: pd.DataFrame, column: str, bad: np.ndarray,
               what: str):
    row = int(np.argmax(bad))
    raise fail(path, what, line_of(chunk.index[row]), column, chunk[column].iloc[row])


def tokens(path: Path, chunk: pd.DataFrame, column: str) -> np.ndarray:
    """Converts a token-count column; every value must be an integer >= 1.

    Args:
        path: The file (for messages).
        chunk: Rows with ``column`` present (no NaN; see ``check_present``).
        column: Column name.

    Returns:
        int64 array of token counts.

    Raises:
        TraceError: Non-integer, zero or negative value.
    """
    values = chunk[column]
    if pd.api.types.is_bool_dtype(values):   # "True"/"False" are not token counts
        _first_bad(path, chunk, column, np.ones(len(values), dtype=bool),
                   "token count is not an integer")
    if not pd.api.types.is_numeric_dtype(values):
        numeric = pd.to_numeric(values, errors="coerce")
        bad = numeric.isna().to_numpy()
        if bad.any():
            _first_bad(path, chunk, column, bad, "token count is not an integer")
        values = numeric
    array = values.to_numpy()
    if array.dtype.kind == "f":
        bad = ~np.isfinite(array) | (array != np.floor(array))
        if bad.any():
            _first_bad(path, chunk, column, bad, "token count is not an integer")
    if array.dtype == object:            # integers beyond int64 (pandas keeps them as Python ints)
        array = np.array([float(v) for v in array])
    bad = array < 1
    if bad.any():
        _first_bad(path, chunk, column, bad, "token count must be >= 1")
    bad = array > MAX_TOKENS
    if bad.any():
        _first_bad(path, chunk, column, bad, f"token count above {MAX_TOKENS:,} (no model has such a context)")
    return array.astype(np.int64)


def seconds(path: Path, chunk: pd.DataFrame, column: str, scale: float = 1.0) -> np.ndarray:
    """Converts a numeric time column to float64 seconds.

    Args:
        path: The file (for messages).
        chunk: Rows with ``column`` present.
        column: Column name.
        scale: Seconds per file unit (1.0 for seconds, 1e-3 for milliseconds).

    Returns:
        float64 array of times in seconds (file origin; the caller shifts it).

    Raises:
        TraceError: A value that is not a number ("time is not a number"), NaN ("time
            is NaN") or infinite ("time is infinite"), naming line and value.
    """
    values = chunk[column]
    if pd.api.types.is_bool_dtype(values):   # "True"/"False" are not times
        _first_bad(path, chunk, column, np.ones(len(values), dtype=bool),
                   "time is not a number")
    if not pd.api.types.is_numeric_dtype(values):
        values = pd.to_numeric(values, errors="coerce")
    array = values.to_numpy(dtype=np.float64)
    bad = ~np.isfinite(array)
    if bad.any():
        raw = chunk[column].iloc[int(np.argmax(bad))]
        _first_bad(path, chunk, column, bad, f"time is {_what_number(raw)}")
    return array * scale


def _what_number(raw) -> str:
    """``"NaN (not a number)"``, ``"infinite"`` or ``"not a number"`` for a bad time."""
    try:
        value = float(raw.strip() if isinstance(raw, str) else raw)
    except (TypeError, ValueError):
        return "not a number"
    if value != value:
        return "NaN (not a number)"
    return "infinite" if value in (float("inf"), float("-inf")) else "not a number"


_OFFSET_AT_END = r"\d:\d\d(?::\d\d(?:\.\d+)?)?\s*(?:Z|[+-]\d\d(?::?\d\d)?)$"
"""A time of day followed by a UTC offset (``Z``, ``+05:00``, ``-0800``) at the end of an ISO timestamp."""


def timestamps_ns(path: Path, chunk: pd.DataFrame, column: str) -> np.ndarray:
    """Parses ISO wall-clock timestamps (Azure ``YYYY-MM-DD HH:MM:SS.fffffff[+00:00]``).

    Naive timestamps are taken as UTC; an offset, where present, is applied. A chunk (up to
    :data:`traces.csvread.CHUNK_ROWS` rows) that mixes naive and offset timestamps is refused: the naive ones'
    zone is unknown, and reading them as UTC would move them by the offset silently.

    Returns:
        int64 nanoseconds since the Unix epoch.

    Raises:
        TraceError: An unparseable timestamp; naive and offset timestamps in one file (naming the first row of
            the kind the first row is not).
    """
    values = chunk[column].astype(str)
    zoned = values.str.strip().str.contains(_OFFSET_AT_END, regex=True).to_numpy()
    if zoned.any() and not zoned.all():
        other = zoned != zoned[0]
        _first_bad(path, chunk, column, other,
                   "timestamps with and without a UTC offset in one file (the first row's "
                   f"{'has one' if zoned[0] else 'has none'}): give every row an offset, or none")
    parsed = pd.to_datetime(values, format="ISO8601", errors="coerce", utc=True)
    bad = parsed.isna().to_numpy()
    if bad.any():
        _first_bad(path, chunk, column, bad,
                   "unparseable timestamp, expected YYYY-MM-DD HH:MM:SS.fffffff[+00:00]")
    naive = parsed.dt.tz_localize(None).dt.as_unit("ns")
    return naive.to_numpy().view(np.int64)
