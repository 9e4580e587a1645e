"""CSV trace formats: their columns, auto-detection and loading.

=========  ==========================  ====================  =====================
format     time column (unit)          prompt column         output column
=========  ==========================  ====================  =====================
azure      TIMESTAMP (ISO wall clock)  ContextTokens         GeneratedTokens
splitwise  arrived_at (s)              num_prefill_tokens    num_decode_tokens
lengths    none (needs ``arrival``)    num_prefill_tokens    num_decode_tokens
burstgpt   Timestamp (s)               Request tokens        Response tokens
=========  ==========================  ====================  =====================

Sources: Azure/AzurePublicDataset (2023, 2024), microsoft/vidur
``data/processed_traces``, HPMLL/BurstGPT. See ``docs/traces.md``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np

import traces.csvread as csvread
import traces.fastcsv as fastcsv
from traces.canonical import MAX_ARRIVAL_TEXT, build_table, late_arrivals
from traces.errors import TraceError, TraceWarning, fail

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class CsvFormat:
    """Column names and time unit of one CSV trace format.

    Attributes:
        name: The ``fmt=`` name.
        time_column: Arrival column, or None for length-only files.
        time_kind: ``"iso"`` (wall-clock strings) or ``"seconds"``.
        prompt_column: Prompt-token column.
        output_column: Output-token column.
    """

    name: str
    time_column: str | None
    time_kind: str
    prompt_column: str
    output_column: str

    @property
    def required(self) -> list[str]:
        """Columns that must be in the header, time column first."""
        cols = [self.prompt_column, self.output_column]
        return ([self.time_column] if self.time_column else []) + cols


CSV_FORMATS = {
    "azure": CsvFormat("azure", "TIMESTAMP", "iso", "ContextTokens", "GeneratedTokens"),
    "splitwise": CsvFormat("splitwise", "arrived_at", "seconds",
                           "num_prefill_tokens", "num_decode_tokens"),
    "lengths": CsvFormat("lengths", None, "none", "num_prefill_tokens", "num_decode_tokens"),
    "burstgpt": CsvFormat("burstgpt", "Timestamp", "seconds",
                          "Request tokens", "Response tokens"),
}
_BURSTGPT_EXTRA = {"Model": "model", "Session ID": "session_id",
                   "Elapsed time": "elapsed_s", "Log Type": "log_type"}


def detect_csv(path: Path, header: list[str]) -> CsvFormat:
    """Chooses the CSV format whose required columns best match the header.

    A format with all its columns present wins (the one with most columns, so
    ``splitwise`` beats ``lengths``); otherwise the partial match with the largest
    fraction of its columns present is returned
    and :func:`check_columns` reports what is missing.

    Raises:
        TraceError: If no known column is in the header.
    """
    def score(spec: CsvFormat) -> tuple[bool, float, int]:
        hits = sum(c in header for c in spec.required)
        return hits == len(spec.required), hits / len(spec.required), hits

    best = max(CSV_FORMATS.values(), key=score)
    if score(best)[2] == 0:
        known = "; ".join(f"{s.name}: {','.join(s.required)}" for s in CSV_FORMATS.values())
        raise fail(path, f"unrecognised CSV header; known formats are {known}", 1,
                   value=",".join(header))
    return best


def _folded(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def check_near_misses(path: Path, header: list[str]) -> None:
    """Raises on a header field that is a known column spelt another way (case, spaces, underscores:
    ``Arrived_At`` for ``arrived_at``) while the known spelling is absent: column names are matched exactly, so
    such a file would otherwise load as another format (a timed trace as a length-only one)."""
    known = {c for spec in CSV_FORMATS.values() for c in spec.required}
    for position, field in enumerate(header, 1):
        if field in known:
            continue
        match = sorted(c for c in known if _folded(c) == _folded(field) and c not in header)
        if match:
            users = [s.name for s in CSV_FORMATS.values() if match[0] in s.required]
            raise fail(path, f"column {field!r} (field {position}) is not a known column, but {match[0]!r} of the "
                       f"{'/'.join(users)} format is (column names are case-sensitive); rename it", 1,
                       value=",".join(header))


def check_columns(path: Path, header: list[str], spec: CsvFormat) -> None:
    """Raises naming the first required column absent from the header (line 1)."""
    for column in spec.required:
        if column not in header:
            raise fail(path, f"missing column (format '{spec.name}' needs "
                       f"{', '.join(spec.required)})", 1, column, ",".join(header))


def load_csv(path: Path, spec: CsvFormat | None, arrival: str | None,
             seed: int, light: bool = False) -> pd.DataFrame:
    """Loads a CSV trace into the canonical table.

    Args:
        path: The CSV file.
        spec: Format, or None to detect it from the header.
        arrival: Arrival process (``"poisson:RATE"``, ``"gamma:RATE,CV"``); required for
            ``lengths`` files and, for timed files, replaces the file's timestamps.
        seed: Seed of the arrival process.
        light: return a :class:`traces.canonical.TraceColumns` where :mod:`traces.fastcsv` read the file
            (no pandas imported); otherwise the DataFrame.

    Returns:
        The canonical table (BurstGPT: plus ``model`` and, where present,
        ``session_id`` and ``elapsed_s``).

    Raises:
        TraceError: Unrecognised header, a missing column, a known column spelt another way
            (:func:`check_near_misses`), a line whose field count is not
            the header's, an empty, non-integer, zero or negative token count, a time that
            is not a number, NaN or infinite, an arrival more than ``MAX_ARRIVAL_S``
            after the earliest, or no rows; one line naming file, line, column and value.
    """
    header = csvread.header_fields(path, csvread.read_head(path))
    check_near_misses(path, header)
    spec = spec or detect_csv(path, header)
    check_columns(path, header, spec)
    if spec.time_column is None and arrival is None:
        raise fail(path, "length-only trace has no arrival times; pass "
                   "arrival='poisson:RATE' or 'gamma:RATE,CV' (--arrival)")
    csvread.check_field_counts(path, len(header))
    # plain files of the formats without float times are read without pandas; any other file, and any value
    # that is not plainly valid, takes pandas' reader, whose checks name what is wrong
    columns = fastcsv.read_columns(path, spec, header)
    if columns is None:
        light = False
        parts = [_convert(path, chunk, spec, len(header)) for chunk in _chunks(path, spec)]
        columns = _concat_columns(parts)
    if not columns or len(columns["prompt_tokens"]) == 0:
        failed = int(columns["failed"].sum()) if columns and "failed" in columns else 0
        if failed:
            raise fail(path, f"all {failed:,} rows are failed requests ({spec.output_column} == 0, which BurstGPT "
                       "logs for a request that failed); no request is left to simulate")
        raise fail(path, "empty file: a header but no requests")
    if spec.name == "burstgpt":
        _warn_failed(path, columns.pop("failed"))
    prompt, output = columns.pop("prompt_tokens"), columns.pop("output_tokens")
    time = columns.pop("time", None)
    if arrival is None:
        if spec.time_kind == "seconds":
            _check_not_negative(path, spec, time)
        _check_span(path, spec, time)
    arrival_s = _arrival_s(time, len(prompt), arrival, seed)
    return build_table(arrival_s, prompt, output, str(path), extra=columns,
                       sort_key=time if arrival is None else None, light=light)


def _concat_columns(parts: list[dict]) -> dict:
    """Concatenates per-chunk columns, freeing each column's chunks as it goes."""
    columns = {}
    for key in list(parts[0]) if parts else []:
        columns[key] = _concat([p.pop(key) for p in parts])
    return columns


def _concat(arrays: list):
    import pandas as pd

    if isinstance(arrays[0], pd.Series):
        return pd.concat(arrays, ignore_index=True)
    return np.concatenate(arrays)


def _chunks(path: Path, spec: CsvFormat):
    dtype = {spec.time_column: str} if spec.time_kind == "iso" else None
    if spec.name == "burstgpt":
        dtype = {"Model": "category", "Log Type": "category"}
    return csvread.iter_chunks(path, dtype=dtype)


def _convert(path: Path, chunk: pd.DataFrame, spec: CsvFormat, n_fields: int) -> dict:
    import traces.fields as fields

    failed = 0
    if spec.name == "burstgpt":
        chunk, failed = _drop_failed(chunk, spec.output_column)
    csvread.check_present(path, chunk, spec.required, n_fields)
    from traces.errors import earliest_error

    checks = [lambda: fields.tokens(path, chunk, spec.prompt_column),
              lambda: fields.tokens(path, chunk, spec.output_column)]
    if spec.time_kind == "iso":
        checks.append(lambda: fields.timestamps_ns(path, chunk, spec.time_column))
    elif spec.time_kind == "seconds":
        checks.append(lambda: fields.seconds(path, chunk, spec.time_column))
    values = earliest_error(checks)             # several bad rows: the first one is named, in any column
    out = {"prompt_tokens": values[0], "output_tokens": values[1]}
    if spec.time_kind in ("iso", "seconds"):
        out["time"] = values[2]
    if spec.name == "burstgpt":
        out["failed"] = np.array([failed])
        out.update({new: chunk[old].reset_index(drop=True)
                    for old, new in _BURSTGPT_EXTRA.items()
                    if old in chunk.columns and new != "log_type"})
    return out


def _check_not_negative(path: Path, spec: CsvFormat, time: np.ndarray) -> None:
    """Raises on the first negative time of a format whose times are seconds since the trace's start
    (splitwise's ``arrived_at``, BurstGPT's ``Timestamp``: ``docs/traces.md``), naming its line: such a time is
    not of the format, and sorting it first would shift every other arrival silently."""
    negative = time < 0
    if negative.any():
        row = int(np.argmax(negative))
        line, value = _locate(path, spec, {row})[row]
        raise fail(path, f"negative time: {spec.time_column} counts seconds from the trace's start (>= 0)", line,
                   spec.time_column, value)


def _check_span(path: Path, spec: CsvFormat, time: np.ndarray) -> None:
    """Raises on the first arrival beyond the simulator clock's exact range (see
    :data:`traces.canonical.MAX_ARRIVAL_S`), naming its line and the earliest one's."""
    per_s = 1e9 if time.dtype.kind == "i" else 1.0   # int64 ns (ISO) or float seconds
    late = late_arrivals(time, per_s)
    if not late.any():
        return
    row, first = int(np.argmax(late)), int(np.argmin(time))
    found = _locate(path, spec, {row, first})
    after_s = float(time[row] - time[first]) / per_s
    raise fail(path, f"arrival {after_s:.6g} s after the earliest request (line "
               f"{found[first][0]}) is beyond {MAX_ARRIVAL_TEXT}", found[row][0],
               spec.time_column, found[row][1])


def _locate(path: Path, spec: CsvFormat, rows: set[int]) -> dict[int, tuple[int, object]]:
    """File line and raw time value of loaded rows (positions after blank lines and, for
    BurstGPT, failed requests are dropped). Reads the file again: error path only."""
    found, seen = {}, 0
    for chunk in _chunks(path, spec):
        if spec.name == "burstgpt":
            chunk, _ = _drop_failed(chunk, spec.output_column)
        for row in rows:
            if seen <= row < seen + len(chunk):
                found[row] = (csvread.line_of(chunk.index[row - seen]),
                              chunk[spec.time_column].iloc[row - seen])
        seen += len(chunk)
    return found


def _drop_failed(chunk: pd.DataFrame, column: str) -> tuple[pd.DataFrame, int]:
    import pandas as pd

    failed = pd.to_numeric(chunk[column], errors="coerce").eq(0).to_numpy()
    return chunk[~failed], int(failed.sum())


def _warn_failed(path: Path, failed: np.ndarray) -> None:
    n_failed = int(failed.sum())
    if n_failed:
        warnings.warn(f"{path}: {n_failed} failed requests (Response tokens == 0) "
                      "were dropped", TraceWarning, stacklevel=4)


def _arrival_s(time: np.ndarray | None, n: int, arrival: str | None,
               seed: int) -> np.ndarray:
    if arrival is not None:
        from traces.generators import arrivals_from_spec
        return arrivals_from_spec(arrival, n, np.random.default_rng(seed))
    if time.dtype.kind == "i":  # int64 ns from wall-clock timestamps (exact difference)
        return (time - time.min()) / 1e9
    return time                 # float seconds: build_table sorts, then shifts
