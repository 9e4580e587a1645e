"""``load_trace``: one entry point for every supported trace format."""

from __future__ import annotations

import warnings
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np

import traces.csvread as csvread
from traces.canonical import (CANONICAL_COLUMNS, check_canonical, count_out_of_order,
                               renumber)
from traces.errors import TraceError, TraceWarning, fail, not_a_file
from traces.formats import CSV_FORMATS, load_csv
from traces.names import FORMAT_NAMES  # noqa: E402  (re-exported)

if TYPE_CHECKING:
    import pandas as pd


def detect_format(path: str | Path) -> str:
    """Names the format of a file from its first bytes and header.

    Returns:
        One of :data:`FORMAT_NAMES`.

    Raises:
        TraceError: Missing, empty, binary, wrongly delimited or unrecognised file, or a JSON array
            (Mooncake traces are JSON Lines).
    """
    path = Path(path)
    if path.is_file() and path.stat().st_size >= 4:
        with open(path, "rb") as fh:
            if fh.read(4) == b"PAR1":
                return "parquet"
    if path.suffix.lower() == ".parquet" and path.is_file():
        raise TraceError(f"{path}: named .parquet but not a Parquet file (it does not start with the PAR1 magic "
                         "bytes); pass --format for a text trace, or name the file after its content")
    head = csvread.read_head(path)
    start = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if start.startswith(b"{"):
        return "mooncake"
    if start.startswith(b"["):
        raise TraceError(f"{path}: a JSON array, not JSON Lines: a Mooncake trace holds one JSON object per line "
                         "({\"timestamp\": ..., \"input_length\": ..., \"output_length\": ...}), not a list of them; "
                         "write one object per line (e.g. jq -c '.[]' FILE)")
    from traces.formats import detect_csv
    return detect_csv(path, csvread.header_fields(path, head)).name


def load_trace(path: str | Path, fmt: str | None = None, arrival: str | None = None,
               seed: int = 0, light: bool = False) -> pd.DataFrame:
    """Loads a trace file into the canonical request table.

    Args:
        path: Trace file (CSV, JSONL or Parquet).
        fmt: One of ``azure``, ``splitwise``, ``lengths``, ``mooncake``, ``burstgpt``,
            ``parquet``; None auto-detects from the header / content.
        arrival: ``"poisson:RATE"`` or ``"gamma:RATE,CV"`` (RATE in req/s). Required for
            length-only files; for timed files it replaces the file's arrival times.
        seed: Seed of the arrival generator.
        light: where the file allows it (a CSV trace read by :mod:`traces.fastcsv`: Azure or length-only, no
            extra columns kept), return the table as a :class:`traces.canonical.TraceColumns` without importing
            pandas (``kvsim simulate``); otherwise, and by default, the DataFrame.

    Returns:
        DataFrame with ``request_id``, ``arrival_s`` (s since the first request),
        ``prompt_tokens``, ``output_tokens`` (+ format extras, e.g. ``hash_ids``);
        ``attrs["source"]`` is the path, followed with ``arrival`` by how the times were drawn
        (:func:`traces.generators.arrival_note`: ``"PATH | arrivals poisson:16, seed 0"``).

    Raises:
        TraceError: Any malformed input; one message naming file, line and column.
    """
    path = Path(path)
    fmt = fmt.lower() if fmt else detect_format(path)
    if fmt in CSV_FORMATS:
        df = load_csv(path, CSV_FORMATS[fmt], arrival, seed, light)
    elif fmt not in FORMAT_NAMES:
        raise TraceError(f"{path}: unknown format {fmt!r}; choose one of "
                         f"{', '.join(FORMAT_NAMES)}")
    else:
        if fmt == "mooncake":
            from traces.jsonl import load_mooncake
            df = load_mooncake(path)
        else:
            df = read_parquet(path)
        if arrival is not None:     # the drawn times pass the clock-range check (renumber) as a file's do
            from traces.generators import arrivals_from_spec
            df = renumber(df.assign(arrival_s=arrivals_from_spec(arrival, len(df), np.random.default_rng(seed))))
    if arrival is not None:
        from traces.generators import arrival_note
        df.attrs["source"] = f"{df.attrs.get('source', path)} | {arrival_note(arrival, seed)}"
    return df


def read_parquet(path: Path) -> pd.DataFrame:
    """Reads a canonical Parquet trace (as written by :func:`write_parquet`) and checks it.

    Rows out of time order are sorted with a :class:`TraceWarning` counting them (as the
    CSV and JSONL loaders do); token columns become int64 and ``arrival_s`` float64.

    Args:
        path: The ``.parquet`` file.

    Returns:
        The canonical table (extra columns such as ``hash_ids`` kept).

    Raises:
        TraceError: Unreadable file, no rows, or any fault :func:`check_canonical`
            names (row, column and value).
    """
    import pandas as pd

    if not path.is_file():
        raise TraceError(f"{path}: {not_a_file(path)}")
    try:
        df = pd.read_parquet(path)
    except Exception as err:  # pyarrow raises several unrelated types
        raise fail(path, f"unreadable Parquet file: {str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
    if len(df) == 0:
        raise fail(path, "empty file (no requests)")
    check_canonical(df, str(path))
    df = df.reset_index(drop=True).assign(
        arrival_s=df["arrival_s"].to_numpy(dtype=np.float64),
        prompt_tokens=df["prompt_tokens"].to_numpy(dtype=np.int64),
        output_tokens=df["output_tokens"].to_numpy(dtype=np.int64))
    n_out = count_out_of_order(df["arrival_s"].to_numpy())
    if n_out:
        warnings.warn(f"{path}: {n_out} rows out of time order were sorted", TraceWarning,
                      stacklevel=3)
    return renumber(df, source=str(path))


def write_parquet(df: pd.DataFrame, path: str | Path) -> Path:
    """Writes a canonical table to Parquet (canonical columns first, extras kept).

    Args:
        df: Canonical table.
        path: Output file; overwritten if it exists (the CLI guards against that).

    Returns:
        The path written.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    cols = list(CANONICAL_COLUMNS) + [c for c in df.columns if c not in CANONICAL_COLUMNS]
    table = pa.Table.from_pandas(df[cols], preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **TRACE_FILE_MARK})
    pq.write_table(table, path)
    return path


TRACE_FILE_MARK = {b"kvsim.written_by": b"kvsim traces convert"}
"""Schema metadata of every Parquet trace :func:`write_parquet` writes: ``traces convert --force`` replaces only a
file that carries it (:func:`is_trace_file`), never a user's own file of the same name."""


def is_trace_file(path: str | Path) -> bool:
    """Whether ``path`` is a Parquet trace that :func:`write_parquet` wrote (:data:`TRACE_FILE_MARK` in its schema
    metadata); False for any other file, Parquet or not."""
    import pyarrow.parquet as pq
    try:
        metadata = pq.read_schema(path).metadata or {}
    except Exception:        # not Parquet, unreadable: not ours  # noqa: BLE001
        return False
    key, value = next(iter(TRACE_FILE_MARK.items()))
    return metadata.get(key) == value
