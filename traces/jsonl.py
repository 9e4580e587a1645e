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

from traces.canonical import build_table
from traces.csvread import read_head
from traces.fields import MAX_TOKENS
from traces.errors import fail

MOONCAKE_BLOCK_TOKENS = 512
_FIELDS = ("timestamp", "input_length", "output_length")


def load_mooncake(path: Path) -> pd.DataFrame:
    """Loads a Mooncake JSONL trace into the canonical table (plus ``hash_ids``).

    Raises:
        TraceError: Invalid JSON, a missing field, or a bad value; the message names
            the line and field.
    """
    read_head(path)  # missing, empty or binary file
    times, prompts, outputs, hashes = [], [], [], []
    with open(path, "rb") as fh:
        for line, raw in enumerate(fh, start=1):
            text = _decode(path, line, raw).strip()
            if not text:
                continue
            rec = _parse(path, line, text)
            times.append(rec["timestamp"])
            prompts.append(rec["input_length"])
            outputs.append(rec["output_length"])
            hashes.append(rec.get("hash_ids", []))
    if not times:
        raise fail(path, "empty file (no requests)")
    arrival_s = np.asarray(times, dtype=np.float64) / 1000.0
    return build_table(arrival_s - arrival_s.min(), prompts, outputs, str(path),
                       extra={"hash_ids": pd.Series(hashes, dtype=object)})


def _decode(path: Path, line: int, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise fail(path, f"binary or non-UTF-8 file: invalid byte 0x{raw[err.start]:02x}",
                   line) from None


def _parse(path: Path, line: int, text: str) -> dict:
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as err:
        ended_early = "Unterminated" in err.msg or err.pos >= len(text)
        what = "truncated line (JSON ends early)" if ended_early else "invalid JSON"
        raise fail(path, f"{what}: {err.msg} at character {err.pos + 1}", line,
                   value=text[:80]) from None
    if not isinstance(rec, dict):
        raise fail(path, "expected a JSON object", line, value=text.strip()[:80])
    for field in _FIELDS:
        if field not in rec:
            raise fail(path, "missing field", line, field)
    _check_number(path, line, "timestamp", rec["timestamp"], minimum=None)
    for field in ("input_length", "output_length"):
        _check_number(path, line, field, rec[field], minimum=1)
    if not isinstance(rec.get("hash_ids", []), list):
        raise fail(path, "hash_ids must be a list of block ids", line, "hash_ids",
                   rec["hash_ids"])
    return rec


def _check_number(path: Path, line: int, field: str, value, minimum: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise fail(path, "not a number", line, field, value)
    if minimum is not None and (value != int(value)):
        raise fail(path, "token count is not an integer", line, field, value)
    if minimum is not None and value < minimum:
        raise fail(path, f"token count must be >= {minimum}", line, field, value)
    if minimum is not None and value > MAX_TOKENS:
        raise fail(path, f"token count above {MAX_TOKENS:,} (no model has such a context)", line, field, value)
    if minimum is None and not abs(value) < 1e15:
        raise fail(path, "timestamp out of range", line, field, value)
