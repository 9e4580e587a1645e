"""The canonical request table every loader and generator returns.

Columns (one row per request, sorted by arrival, stable)::

    request_id     int64    0..n-1 in arrival order
    arrival_s      float64  seconds since the first request (first row = 0.0)
    prompt_tokens  int64    >= 1
    output_tokens  int64    >= 1
    (extra columns allowed, e.g. ``hash_ids`` for Mooncake traces)

``df.attrs["source"]`` is a short human description of where the rows came from.

The table is a pandas DataFrame, or on ``kvsim simulate``'s path (issue 32: no pandas before the run has
results) a :class:`TraceColumns` of the same columns as numpy arrays (:func:`as_frame` turns it into the
DataFrame, equal to the one the loaders build).

Limits every loader enforces:

* ``arrival_s`` is finite and at most :data:`MAX_ARRIVAL_S` (about 900.7 million s,
  28.5 years) after the first request. The simulator quantises arrivals to 100 ns ticks
  (``sim.core.engine.ARRIVAL_TICKS_PER_S``) and keeps time as float64 microseconds; a tick
  count is an exact float64 integer only up to 2**53, so later arrivals would be rounded
  (at 1e300 s every latency of the request comes out as 0).
* ``hash_ids`` (Mooncake prefix-block ids), where present, is per request either empty
  (no prefix information) or a list of ``ceil(prompt_tokens / 512)`` integers in
  [0, 2**63 - 1]: one id per 512-token block (:data:`MOONCAKE_BLOCK_TOKENS`).
"""

from __future__ import annotations

import warnings
from typing import Mapping

from typing import TYPE_CHECKING

import numpy as np

from sim.results.columns import ColumnTable as TraceColumns
from traces.errors import TraceError, TraceWarning, plain

if TYPE_CHECKING:
    import pandas as pd

CANONICAL_COLUMNS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens")
ARRIVAL_TICKS_PER_S = 10_000_000   # as sim.core.engine: arrivals quantised to 100 ns
MAX_ARRIVAL_S = 2**53 / ARRIVAL_TICKS_PER_S   # 900,719,925.47 s: tick counts stay exact
MAX_ARRIVAL_TEXT = (f"{MAX_ARRIVAL_S:,.0f} s (2**53 ticks of 100 ns: the simulator's "
                    "clock holds later arrivals only approximately)")
MOONCAKE_BLOCK_TOKENS = 512        # tokens per Mooncake prefix block (one hash id each)
MAX_BLOCK_ID = 2**63 - 1           # block ids must fit int64 (Parquet, numpy)


# TraceColumns: the canonical table as numpy columns (sim.results.columns.ColumnTable), what ``kvsim simulate``
# reads a CSV trace into and hands to the engine (sim.core.engine.Simulator takes either form)


def as_frame(table) -> pd.DataFrame:
    """``table`` as a DataFrame: a :class:`TraceColumns` converted (:meth:`TraceColumns.to_frame`), a
    DataFrame as it is."""
    return table.to_frame() if isinstance(table, TraceColumns) else table


def late_arrivals(time: np.ndarray, per_s: float = 1.0) -> np.ndarray:
    """Marks arrivals more than :data:`MAX_ARRIVAL_S` after the earliest one.

    Args:
        time: Finite arrival times in file order, in units of ``1 / per_s`` seconds.
        per_s: File time units per second (1 for seconds, 1e3 for ms, 1e9 for ns).

    Returns:
        Boolean array, True where ``time - time.min() > MAX_ARRIVAL_S * per_s``.
    """
    if len(time) == 0:
        return np.zeros(0, dtype=bool)
    return (time - time.min()) > MAX_ARRIVAL_S * per_s


def hash_ids_problem(ids, prompt_tokens: int) -> str | None:
    """Checks one request's Mooncake ``hash_ids`` against its prompt length.

    Args:
        ids: A list (JSON) or 1-D array (Parquet) of block ids; None or empty means the
            request has no prefix information.
        prompt_tokens: The request's prompt length in tokens (>= 1).

    Returns:
        None when the ids are usable, else what is wrong, as a phrase for a message
        (e.g. ``"element 1 is a list, not an integer block id"`` or ``"10 block ids for
        1000 prompt tokens; 512-token blocks need ceil(1000 / 512) = 2"``).
    """
    if ids is None:
        return None
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1:
            return f"must be a flat list of integer block ids, not a {ids.ndim}-D array"
        if ids.dtype.kind in "iu" and len(ids):
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or high > MAX_BLOCK_ID:
                return f"block ids must be in [0, 2**63 - 1] (got {low if low < 0 else high})"
        elif len(ids):
            ids = ids.tolist()
    elif not isinstance(ids, (list, tuple)):
        return f"must be a list of integer block ids, not {_kind(ids)}"
    if len(ids) == 0:
        return None
    if not isinstance(ids, np.ndarray):
        if set(map(type, ids)) != {int}:
            i = next(i for i, x in enumerate(ids) if type(x) is not int)
            return f"element {i + 1} is {_kind(ids[i])}, not an integer block id"
        low, high = min(ids), max(ids)
        if low < 0 or high > MAX_BLOCK_ID:
            return f"block ids must be in [0, 2**63 - 1] (got {low if low < 0 else high})"
    need = prefix_block_count(prompt_tokens)
    if len(ids) != need:
        return (f"{len(ids)} block ids for {int(prompt_tokens)} prompt tokens; "
                f"{MOONCAKE_BLOCK_TOKENS}-token blocks need ceil({int(prompt_tokens)} / "
                f"{MOONCAKE_BLOCK_TOKENS}) = {need}")
    return None


def prefix_block_count(prompt_tokens: int) -> int:
    """Prefix-block ids a request of ``prompt_tokens`` carries: ``ceil(prompt / 512)``
    (:data:`MOONCAKE_BLOCK_TOKENS`-token blocks, the last one partial)."""
    return -(-int(prompt_tokens) // MOONCAKE_BLOCK_TOKENS)


def _kind(value) -> str:
    """``"a list"``, ``"a float"``, ``"null"``... for messages about a wrong type."""
    if value is None:
        return "null"
    if isinstance(value, (bool, np.bool_)):
        return "a boolean"
    if isinstance(value, (list, tuple, np.ndarray)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (float, np.floating)):
        return "a float"
    if isinstance(value, (int, np.integer)):
        return "an integer"
    return f"a value of type {type(value).__name__}"


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
                extra: Mapping[str, object] | None = None,
                sort_key: np.ndarray | None = None, light: bool = False) -> pd.DataFrame | TraceColumns:
    """Builds the canonical table, sorting rows out of time order with a warning.

    Rows are ordered by ``sort_key`` (default ``arrival_s``), stably; then the first
    arrival is subtracted. Sorting on the file's own values (before any shift or unit
    change) keeps two times that differ by less than the rounding of the shift in their
    true order.

    Args:
        arrival_s: Arrival times in seconds, any origin, file order; float64, finite.
        prompt_tokens: Prompt lengths in tokens (already validated >= 1).
        output_tokens: Output lengths in tokens (already validated >= 1).
        source: Human description for ``df.attrs["source"]``.
        extra: Extra columns (same length), e.g. ``{"hash_ids": [...]}``.
        sort_key: The file's times (e.g. int64 ns, float ms), in file order, ordered as
            ``arrival_s`` is (non-strictly); None to sort by ``arrival_s``.
        light: return a :class:`TraceColumns` (no pandas) when there are no ``extra`` columns.

    Returns:
        The canonical DataFrame (see module docstring), or its :class:`TraceColumns` with ``light``.

    Raises:
        TraceError: No rows, a non-finite arrival, or an arrival more than
            :data:`MAX_ARRIVAL_S` after the first (the loaders check these first, naming
            the line; this is the safety net for generators).
    """
    arrival_s = np.asarray(arrival_s, dtype=np.float64)
    if len(arrival_s) == 0:
        raise TraceError(f"{source}: no requests")
    _check_arrivals(source, arrival_s, "request")
    columns = {"arrival_s": arrival_s,
               "prompt_tokens": np.asarray(prompt_tokens, dtype=np.int64),
               "output_tokens": np.asarray(output_tokens, dtype=np.int64)}
    if extra:
        import pandas as pd
        light = False
        for name, values in extra.items():
            columns[name] = values if isinstance(values, pd.Series) else pd.Series(values)
    key = arrival_s if sort_key is None else np.asarray(sort_key)
    n_out = count_out_of_order(key)
    if n_out:
        warnings.warn(f"{source}: {n_out} rows out of time order were sorted",
                      TraceWarning, stacklevel=3)
        order = np.argsort(key, kind="stable")
        columns = {k: _take(v, order) for k, v in columns.items()}
    return _assemble(columns, source, light)


def _check_arrivals(source: str, arrival_s: np.ndarray, row_word: str) -> None:
    """Raises on the first non-finite arrival, then on the first beyond the clock's range.

    Args:
        source: File or description for messages.
        arrival_s: Arrival times in seconds, in input order.
        row_word: ``"row"`` (Parquet) or ``"request"`` (generated tables) for messages.
    """
    bad = ~np.isfinite(arrival_s)
    if bad.any():
        i = int(np.argmax(bad))
        raise TraceError(f"{source}: {row_word} {i + 1}, column 'arrival_s': arrival time is "
                         f"{_non_finite(arrival_s[i])} (got {plain(arrival_s[i])})")
    late = late_arrivals(arrival_s)
    if late.any():
        i, first = int(np.argmax(late)), int(np.argmin(arrival_s))
        raise TraceError(f"{source}: {row_word} {i + 1}, column 'arrival_s': arrival "
                         f"{arrival_s[i] - arrival_s[first]:.6g} s after the first request "
                         f"({row_word} {first + 1}) is beyond {MAX_ARRIVAL_TEXT} "
                         f"(got {plain(arrival_s[i])})")


def _non_finite(value: float) -> str:
    """``"NaN (not a number)"`` or ``"infinite"``."""
    return "NaN (not a number)" if value != value else "infinite"


def _take(values, order: np.ndarray):
    if isinstance(values, np.ndarray):
        return values[order]
    import pandas as pd
    if isinstance(values, pd.Series):
        return values.iloc[order].reset_index(drop=True)
    return np.asarray(values)[order]


def _assemble(columns: dict, source: str, light: bool = False) -> pd.DataFrame | TraceColumns:
    arrival_s = columns.pop("arrival_s")
    arrival_s = arrival_s - arrival_s[0]
    data = {"request_id": np.arange(len(arrival_s), dtype=np.int64),
            "arrival_s": arrival_s}
    if light:
        data.update(columns)
        return TraceColumns(data, {"source": source})
    import pandas as pd
    data.update({k: (v.to_numpy() if isinstance(v, pd.Series) and v.dtype != object else v)
                 for k, v in columns.items()})
    df = pd.DataFrame(data, copy=False)
    df.attrs["source"] = source
    return df


def renumber(df: pd.DataFrame | TraceColumns, source: str | None = None) -> pd.DataFrame | TraceColumns:
    """Re-sorts by arrival (stable), shifts the first arrival to 0 and renumbers ids.

    Used by the transformations, which may drop or reorder rows, or move arrivals (a rate scale, fresh
    arrival times): every arrival time they make passes the check that trace files get.

    Args:
        df: A table with at least the canonical columns (a DataFrame or a :class:`TraceColumns`).
        source: New ``attrs["source"]``; defaults to the old one.

    Returns:
        A new canonical table of the input's kind (the input is not modified).

    Raises:
        TraceError: A non-finite arrival, or one more than :data:`MAX_ARRIVAL_S` after the first (the
            request counted in arrival order).
    """
    if isinstance(df, TraceColumns):
        return _renumber_columns(df, source)
    out = df.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    _check_arrivals(source or df.attrs.get("source", "trace"), out["arrival_s"].to_numpy(dtype=np.float64),
                    "request")
    if len(out):
        out["arrival_s"] = out["arrival_s"] - out["arrival_s"].iloc[0]
    out["request_id"] = np.arange(len(out), dtype=np.int64)
    out.attrs = dict(df.attrs)
    if source is not None:
        out.attrs["source"] = source
    return out


def _renumber_columns(table: TraceColumns, source: str | None) -> TraceColumns:
    """:func:`renumber` of a :class:`TraceColumns`: the DataFrame's values (numpy's stable sort orders floats
    as pandas' stable ``sort_values`` does, NaN last)."""
    arrival_s = np.asarray(table["arrival_s"], dtype=np.float64)
    order = np.argsort(arrival_s, kind="stable")
    if not (order[1:] > order[:-1]).all():
        table = table.take(order)
        arrival_s = arrival_s[order]
    _check_arrivals(source or table.attrs.get("source", "trace"), arrival_s, "request")
    if len(arrival_s):
        arrival_s = arrival_s - arrival_s[0]
    out = table.with_columns(arrival_s=arrival_s, request_id=np.arange(len(arrival_s), dtype=np.int64))
    if source is not None:
        out.attrs["source"] = source
    return out


def check_canonical(df: pd.DataFrame, source: str) -> None:
    """Validates a table claimed to be canonical (e.g. read from Parquet).

    Args:
        df: The table to check, rows in file order.
        source: File name for messages.

    Raises:
        TraceError: Missing column; ``arrival_s`` not numeric, null, NaN, infinite or
            more than :data:`MAX_ARRIVAL_S` after the first; token counts null (a null of an integer
            column reads as a float NaN), not whole, not integer, < 1 or > ``MAX_TOKENS``; ``hash_ids`` not empty and not
            ``ceil(prompt_tokens / 512)`` integer block ids. The message names the row
            (1-based, file order) and column.
    """
    from traces.fields import MAX_TOKENS
    import pandas as pd
    for col in ("arrival_s", "prompt_tokens", "output_tokens"):
        if col not in df.columns:
            raise TraceError(f"{source}: missing column '{col}' "
                             f"(canonical columns: {', '.join(CANONICAL_COLUMNS)})")
    if getattr(df["arrival_s"].dtype, "kind", "O") not in "iuf":
        raise TraceError(f"{source}: column 'arrival_s': must be numeric (seconds), "
                         f"not {df['arrival_s'].dtype}")
    _raise_first(source, "arrival_s", _nulls(df["arrival_s"]), df, "missing value (null)")
    _check_arrivals(source, df["arrival_s"].to_numpy(dtype=np.float64, na_value=np.nan), "row")
    for col in ("prompt_tokens", "output_tokens"):
        if getattr(df[col].dtype, "kind", "O") == "f":     # an integer column with nulls reads as float64
            values = df[col].to_numpy(dtype=np.float64)
            _raise_first(source, col, np.isnan(values), df, "missing value (null)")
            _raise_first(source, col, values != np.round(values), df, "token count must be a whole number")
        if getattr(df[col].dtype, "kind", "O") not in "iu":
            raise TraceError(f"{source}: column '{col}': must be integer, not {df[col].dtype}")
        _raise_first(source, col, _nulls(df[col]), df, "missing value (null)")
        values = df[col].to_numpy(dtype=np.float64)
        _raise_first(source, col, values < 1, df, "token count must be >= 1")
        _raise_first(source, col, values > MAX_TOKENS, df,
                     f"token count above {MAX_TOKENS:,} (no model has such a context)")
    if "hash_ids" in df.columns:
        for i, (ids, prompt) in enumerate(zip(df["hash_ids"], df["prompt_tokens"])):
            problem = hash_ids_problem(ids, prompt)
            if problem:
                raise TraceError(f"{source}: row {i + 1}, column 'hash_ids': {problem} "
                                 f"(got {plain(ids)})")


def _nulls(column: pd.Series) -> np.ndarray:
    """Missing values of a nullable (extension) column; a numpy float NaN is not one."""
    import pandas as pd
    if isinstance(column.dtype, pd.api.extensions.ExtensionDtype):
        return column.isna().to_numpy(dtype=bool)
    return np.zeros(len(column), dtype=bool)


def _raise_first(source: str, col: str, bad: np.ndarray, df: pd.DataFrame, what: str):
    if bad.any():
        i = int(np.argmax(bad))
        raise TraceError(f"{source}: row {i + 1}, column '{col}': {what} "
                         f"(got {plain(df[col].iloc[i])})")
