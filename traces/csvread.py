"""Checked, chunked CSV reading: every failure becomes one :class:`TraceError`.

Data rows keep their position as the pandas index across chunks, so the file line of
row ``i`` is ``i + 2`` (line 1 is the header). Blank lines are skipped.
"""

from __future__ import annotations

import re
from itertools import islice
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from traces.errors import TraceError, fail

HEAD_BYTES = 1 << 16
CHUNK_ROWS = 1_000_000
_DELIMITERS = {";": "semicolon", "\t": "tab", "|": "pipe"}


def line_of(index: int) -> int:
    """File line (1-based, header = 1) of the data row with pandas index ``index``."""
    return int(index) + 2


def read_head(path: Path) -> bytes:
    """Returns the first bytes of a file after checking it exists and is text.

    Raises:
        TraceError: Missing, empty, binary (NUL bytes) or not UTF-8 at the start.
    """
    if not path.is_file():
        raise TraceError(f"{path}: {'is a directory, not a trace file' if path.is_dir() else 'no such file'}")
    with open(path, "rb") as fh:
        head = fh.read(HEAD_BYTES)
    if not head.strip():
        raise fail(path, "empty file (no header, no requests)")
    if b"\x00" in head:
        line = head[:head.index(b"\x00")].count(b"\n") + 1
        raise fail(path, "binary file (NUL byte), not a UTF-8 text trace", line)
    _check_utf8(path, head)
    return head


def _check_utf8(path: Path, head: bytes) -> None:
    lines = head.split(b"\n")
    if len(head) == HEAD_BYTES:
        lines = lines[:-1]  # the last piece may be a cut multi-byte character
    for number, raw in enumerate(lines, start=1):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise fail(path, "binary or non-UTF-8 file: invalid byte "
                       f"0x{raw[err.start]:02x} at byte {err.start + 1} of the line",
                       number) from None


def header_fields(path: Path, head: bytes) -> list[str]:
    """Parses the comma-separated header line (line 1).

    Raises:
        TraceError: If the header uses another delimiter (semicolon, tab, pipe).
    """
    first = head.split(b"\n", 1)[0].decode("utf-8").lstrip("\ufeff").rstrip("\r")
    if "," not in first:
        for sep, name in _DELIMITERS.items():
            if sep in first:
                raise fail(path, f"wrong delimiter: the header is {name}-separated; "
                           "expected comma-separated values", 1, value=first)
    return [f.strip() for f in first.split(",")]


def iter_chunks(path: Path, dtype: dict[str, type] | None = None,
                chunk_rows: int = CHUNK_ROWS) -> Iterator[pd.DataFrame]:
    """Yields the data rows in chunks; blank lines dropped, index = row position.

    Args:
        path: CSV file with a header line.
        dtype: Per-column dtypes (columns not listed are inferred per chunk).
        chunk_rows: Rows per chunk.

    Raises:
        TraceError: Too many fields on a line, or invalid UTF-8 further in the file.
    """
    try:
        reader = pd.read_csv(path, chunksize=chunk_rows, dtype=dtype, encoding="utf-8",
                             skip_blank_lines=False, skipinitialspace=True)
        with reader:
            for chunk in reader:
                chunk.columns = [str(c).strip() for c in chunk.columns]
                yield chunk.dropna(how="all")
    except pd.errors.ParserError as err:
        raise _parser_error(path, err) from None
    except UnicodeDecodeError:
        raise _utf8_error(path) from None


def _parser_error(path: Path, err: Exception) -> TraceError:
    m = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(err))
    if m:
        return fail(path, f"too many fields: {m[3]}, expected {m[1]}", int(m[2]))
    return fail(path, f"unreadable CSV: {str(err).splitlines()[-1]}")


def _utf8_error(path: Path) -> TraceError:
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as err:
                return fail(path, "binary or non-UTF-8 file: invalid byte "
                            f"0x{raw[err.start]:02x}", number)
    return fail(path, "binary or non-UTF-8 file")


def raw_line(path: Path, line: int) -> str:
    """Returns the text of one 1-based line (slow path, only used for messages)."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        got = next(islice(fh, line - 1, None), "")
    return got.rstrip("\r\n")


def check_present(path: Path, chunk: pd.DataFrame, columns: list[str],
                  n_fields: int) -> None:
    """Raises on the first row with an empty required field: truncated or blank value.

    Args:
        path: The file (for messages).
        chunk: Rows as read.
        columns: Required columns.
        n_fields: Number of fields in the header.
    """
    missing = chunk[columns].isna().to_numpy()
    if not missing.any():
        return
    row = int(np.argmax(missing.any(axis=1)))
    column = columns[int(np.argmax(missing[row]))]
    line = line_of(chunk.index[row])
    text = raw_line(path, line)
    n_got = len(text.split(","))
    if n_got < n_fields:
        raise fail(path, f"truncated line: {n_got} of {n_fields} fields, "
                   f"no value for this column", line, column, text)
    raise fail(path, "empty value", line, column, text)


def check_last_line(path: Path, n_fields: int) -> None:
    """Raises if the file's last non-blank line has fewer fields than the header.

    Catches a partly written file whose last number was cut (which would otherwise
    load as a silently wrong, shorter value).
    """
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        fh.seek(max(0, fh.tell() - 4096))
        tail = fh.read()
    body = tail.rstrip(b"\r\n")
    last = body.rsplit(b"\n", 1)[-1].decode("utf-8", errors="replace").rstrip("\r")
    n_got = len(last.split(","))
    if last.strip() and n_got < n_fields:
        line = _count_newlines(path) - tail[len(body):].count(b"\n") + 1
        raise fail(path, f"truncated line: {n_got} of {n_fields} fields", line,
                   value=last)


def _count_newlines(path: Path) -> int:
    count = 0
    with open(path, "rb") as fh:
        while block := fh.read(1 << 24):
            count += block.count(b"\n")
    return count
