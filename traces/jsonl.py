"""Mooncake JSON Lines traces (kvcache-ai/Mooncake ``FAST25-release/traces``).

One request per line::

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, ...]}

``timestamp`` is milliseconds since the trace start; ``hash_ids`` are ids of 512-token
prefix blocks (equal leading ids = shareable prefix KV cache). ``hash_ids`` is kept as a
list column of the canonical table.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from traces.canonical import (MAX_ARRIVAL_TEXT, MAX_BLOCK_ID, MOONCAKE_BLOCK_TOKENS,
                               build_table, hash_ids_problem, late_arrivals)
from traces.csvread import read_head
from traces.errors import JsonShown, fail
from traces.fields import MAX_TOKENS

_FIELDS = ("timestamp", "input_length", "output_length")
MAX_TIMESTAMP_MS = 2**53   # float64 holds every integer millisecond up to here


def load_mooncake(path: Path) -> pd.DataFrame:
    """Loads a Mooncake JSONL trace into the canonical table (plus ``hash_ids``).

    ``timestamp`` is in milliseconds (any origin; the earliest request arrives at 0 s).
    ``hash_ids`` absent, null or ``[]`` means the request has no prefix information
    (stored as ``[]``); otherwise it must hold ``ceil(input_length / 512)`` integer
    block ids in [0, 2**63 - 1].

    Args:
        path: The ``.jsonl`` file, one JSON object per line (blank lines skipped).

    Returns:
        The canonical table with a ``hash_ids`` column (a list per request).

    Raises:
        TraceError: Invalid JSON, a missing field, a token count that is not an integer
            in [1, ``MAX_TOKENS``], a timestamp that is not a number, NaN, infinite,
            beyond 2**53 ms, or more than ``MAX_ARRIVAL_S`` after the earliest, or bad
            ``hash_ids``; the message names the file, line and field.
    """
    read_head(path)  # missing, empty or binary file
    times, prompts, outputs, hashes, lines = [], [], [], [], []
    with open(path, "rb") as fh:
        for line, raw in enumerate(fh, start=1):
            if line == 1 and raw.startswith(b"\xef\xbb\xbf"):    # a UTF-8 byte-order mark, as the CSV readers
                raw = raw[3:]                                       # accept it
            text = _decode(path, line, raw).strip()
            if not text:
                continue
            rec = _parse(path, line, text)
            times.append(rec["timestamp"])
            prompts.append(rec["input_length"])
            outputs.append(rec["output_length"])
            hashes.append(rec.get("hash_ids") or [])
            lines.append(line)
    if not times:
        raise fail(path, "empty file (no requests)")
    time_ms = np.asarray(times, dtype=np.float64)
    late = late_arrivals(time_ms, per_s=1e3)
    if late.any():
        i, first = int(np.argmax(late)), int(np.argmin(time_ms))
        raise fail(path, f"arrival {(time_ms[i] - time_ms[first]) / 1e3:.6g} s after the "
                   f"earliest request (line {lines[first]}) is beyond {MAX_ARRIVAL_TEXT}",
                   lines[i], "timestamp", times[i])
    return build_table(time_ms / 1000.0, prompts, outputs, str(path),
                       extra={"hash_ids": pd.Series(hashes, dtype=object)}, sort_key=time_ms)


def _decode(path: Path, line: int, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise fail(path, f"binary or non-UTF-8 file: invalid byte 0x{raw[err.start]:02x}",
                   line) from None


def _repeated_field(text: str) -> str | None:
    """A field of the format (``timestamp``, ``input_length``, ``output_length``, ``hash_ids``) that the line's
    object holds twice, or None; a cheap count of the quoted name first, a parse of the pairs only when it is
    seen twice."""
    names = [name for name in (*_FIELDS, "hash_ids") if text.count(f'"{name}"') > 1]
    if not names:
        return None
    counts: dict[str, int] = {}

    def pairs(items):
        for key, _ in items:
            counts[key] = counts.get(key, 0) + 1
        return dict(items)

    json.loads(text, object_pairs_hook=pairs)
    return next((name for name in names if counts.get(name, 0) > 1), None)


def _parse(path: Path, line: int, text: str) -> dict:
    """Decodes and checks one line's JSON object (see :func:`load_mooncake` for the rules)."""
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as err:
        ended_early = "Unterminated" in err.msg or err.pos >= len(text)
        what = "truncated line (JSON ends early)" if ended_early else "invalid JSON"
        raise fail(path, f"{what}: {err.msg} at character {err.pos + 1}", line,
                   value=text[:80]) from None
    except (ValueError, RecursionError) as err:   # e.g. an integer of > 4300 digits
        raise fail(path, f"invalid JSON: {str(err).splitlines()[0][:120]}", line,
                   value=text[:80]) from None
    repeated = _repeated_field(text)
    if repeated:
        raise fail(path, "field given twice in one object (JSON keeps the last silently)", line, repeated)
    if _plainly_good(rec):
        return rec
    if not isinstance(rec, dict):
        raise fail(path, "expected a JSON object", line, value=text.strip()[:80])
    for field in _FIELDS:
        if field not in rec:
            raise fail(path, "missing field", line, field)
    _check_timestamp(path, line, rec["timestamp"])
    for field in ("input_length", "output_length"):
        _check_tokens(path, line, field, rec[field])
    problem = hash_ids_problem(rec.get("hash_ids"), rec["input_length"])
    if problem:
        raise fail(path, problem, line, "hash_ids", JsonShown(rec["hash_ids"]))
    return rec


_INT_ONLY = {int}


def _plainly_good(rec) -> bool:
    """Fast path: a record of plain ints in range with the right number of block ids.
    Accepts a subset of what the full checks in :func:`_parse` accept."""
    if type(rec) is not dict:
        return False
    t, n_in, n_out = rec.get("timestamp"), rec.get("input_length"), rec.get("output_length")
    ids = rec.get("hash_ids")
    return (type(t) is int and type(n_in) is int and type(n_out) is int
            and -MAX_TIMESTAMP_MS <= t <= MAX_TIMESTAMP_MS
            and 1 <= n_in <= MAX_TOKENS and 1 <= n_out <= MAX_TOKENS
            and type(ids) is list and len(ids) == -(-n_in // MOONCAKE_BLOCK_TOKENS)
            and set(map(type, ids)) == _INT_ONLY and min(ids) >= 0 and max(ids) <= MAX_BLOCK_ID)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_timestamp(path: Path, line: int, value) -> None:
    """A finite number of milliseconds with magnitude at most 2**53."""
    if not _is_number(value):
        raise fail(path, "timestamp is not a number", line, "timestamp", JsonShown(value))
    if value != value:
        raise fail(path, "timestamp is NaN (not a number)", line, "timestamp", value)
    if value in (float("inf"), float("-inf")):
        raise fail(path, "timestamp is infinite", line, "timestamp", value)
    if abs(value) > MAX_TIMESTAMP_MS:
        raise fail(path, "timestamp beyond +-2**53 ms (float64 holds integer milliseconds "
                   "exactly only up to there)", line, "timestamp", value)


def _check_tokens(path: Path, line: int, field: str, value) -> None:
    """An integer (or integral float) in [1, MAX_TOKENS]."""
    if not _is_number(value):
        raise fail(path, "token count is not a number", line, field, JsonShown(value))
    if value != value or value in (float("inf"), float("-inf")):
        raise fail(path, "token count is not a number (NaN or infinite)", line, field, value)
    if value != int(value):
        raise fail(path, "token count is not an integer", line, field, value)
    if value < 1:
        raise fail(path, "token count must be >= 1", line, field, value)
    if value > MAX_TOKENS:
        raise fail(path, f"token count above {MAX_TOKENS:,} (no model has such a context)",
                   line, field, value)
