"""The canonical request table every loader and generator returns.

Columns (one row per request, sorted by arrival, stable)::

    request_id     int64    0..n-1 in arrival order
    arrival_s      float64  seconds since the first request (first row = 0.0)
    prompt_tokens  int64    >= 1
    output_tokens  int64    >= 1
    (extra columns allowed, e.g. ``hash_ids`` for Mooncake traces)

``df.attrs["source"]`` is a short human description of where the rows came from.
"""

from __future__ import annotations

import warnings
from typing import Mapping

import numpy as np
import pandas as pd

from traces.errors import TraceError, TraceWarning

CANONICAL_COLUMNS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens")


def count_out_of_order(arrival_s: np.ndarray) -> int:
    """Counts rows that arrive earlier than some row before them.

    Args:
        arrival_s: Arrival times in file order (any unit).

    Returns:
        Number of rows i with ``arrival_s[i] < max(arrival_s[:i])``.
    """
    if len(arrival_s) < 2:
        return 0
    running_max = np.maximum.accumulate(arrival_s)
    return int(np.count_nonzero(arrival_s[1:] < running_max[:-1]))


def build_table(arrival_s: np.ndarray, prompt_tokens: np.ndarray,
                output_tokens: np.ndarray, source: str,
                extra: Mapping[str, object] | None = None) -> pd.DataFrame:
    """Builds the canonical table, sorting rows out of time order with a warning.

    Args:
        arrival_s: Arrival times in seconds, any origin, file order; float64, finite.
        prompt_tokens: Prompt lengths in tokens (already validated >= 1).
        output_tokens: Output lengths in tokens (already validated >= 1).
        source: Human description for ``df.attrs["source"]``.
        extra: Extra columns (same length), e.g. ``{"hash_ids": [...]}``.

    Returns:
        The canonical DataFrame (see module docstring).

    Raises:
        TraceError: If there are no rows.
    """
    arrival_s = np.asarray(arrival_s, dtype=np.float64)
    if len(arrival_s) == 0:
        raise TraceError(f"{source}: no requests")
    columns = {"arrival_s": arrival_s,
               "prompt_tokens": np.asarray(prompt_tokens, dtype=np.int64),
               "output_tokens": np.asarray(output_tokens, dtype=np.int64)}
    for name, values in (extra or {}).items():
        columns[name] = values if isinstance(values, pd.Series) else pd.Series(values)
    n_out = count_out_of_order(arrival_s)
    if n_out:
        warnings.warn(f"{source}: {n_out} rows out of time order were sorted",
                      TraceWarning, stacklevel=3)
        order = np.argsort(arrival_s, kind="stable")
        columns = {k: _take(v, order) for k, v in columns.items()}
    return _assemble(columns, source)


def _take(values, order: np.ndarray):
    if isinstance(values, pd.Series):
        return values.iloc[order].reset_index(drop=True)
    return np.asarray(values)[order]


def _assemble(columns: dict, source: str) -> pd.DataFrame:
    arrival_s = columns.pop("arrival_s")
    arrival_s = arrival_s - arrival_s[0]
    data = {"request_id": np.arange(len(arrival_s), dtype=np.int64),
            "arrival_s": arrival_s}
    data.update({k: (v.to_numpy() if isinstance(v, pd.Series) and v.dtype != object else v)
                 for k, v in columns.items()})
    df = pd.DataFrame(data, copy=False)
    df.attrs["source"] = source
    return df


def renumber(df: pd.DataFrame, source: str | None = None) -> pd.DataFrame:
    """Re-sorts by arrival (stable), shifts the first arrival to 0 and renumbers ids.

    Used by the transformations, which may drop or reorder rows.

    Args:
        df: A table with at least the canonical columns.
        source: New ``attrs["source"]``; defaults to the old one.

    Returns:
        A new canonical DataFrame (the input is not modified).
    """
    out = df.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    if len(out):
        out["arrival_s"] = out["arrival_s"] - out["arrival_s"].iloc[0]
    out["request_id"] = np.arange(len(out), dtype=np.int64)
    out.attrs = dict(df.attrs)
    if source is not None:
        out.attrs["source"] = source
    return out


def check_canonical(df: pd.DataFrame, source: str) -> None:
    """Validates a table claimed to be canonical (e.g. read from Parquet).

    Args:
        df: The table to check.
        source: File name for messages.

    Raises:
        TraceError: Missing column, wrong dtype, tokens < 1 or non-finite arrivals;
            the message names the row (1-based) and column.
    """
    for col in ("arrival_s", "prompt_tokens", "output_tokens"):
        if col not in df.columns:
            raise TraceError(f"{source}: missing column '{col}' "
                             f"(canonical columns: {', '.join(CANONICAL_COLUMNS)})")
    bad = ~np.isfinite(df["arrival_s"].to_numpy(dtype=np.float64))
    _raise_first(source, "arrival_s", bad, df, "arrival time must be a finite number")
    for col in ("prompt_tokens", "output_tokens"):
        if not pd.api.types.is_integer_dtype(df[col]):
            raise TraceError(f"{source}: column '{col}': must be integer, not {df[col].dtype}")
        _raise_first(source, col, df[col].to_numpy() < 1, df, "token count must be >= 1")


def _raise_first(source: str, col: str, bad: np.ndarray, df: pd.DataFrame, what: str):
    if bad.any():
        i = int(np.argmax(bad))
        raise TraceError(f"{source}: row {i + 1}, column '{col}': {what} "
                         f"(got {df[col].iloc[i]!r})")
