"""Checked, chunked CSV reading: every failure becomes one :class:`TraceError`.

Data rows keep their position as the pandas index across chunks, so the file line of
row ``i`` is ``i + 2`` (line 1 is the header). Blank lines are skipped.
"""

from __future__ import annotations

import csv
import re
from itertools import islice
from pathlib import Path
from typing import Iterator

from typing import TYPE_CHECKING

import numpy as np

from traces.errors import TraceError, fail, not_a_file

if TYPE_CHECKING:
    import pandas as pd

HEAD_BYTES = 1 << 16
CHUNK_ROWS = 1_000_000
SLICE_BYTES = 1 << 20      # 1 MiB read at a time by check_field_counts (leaves peak memory as it was)
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
        raise TraceError(f"{path}: {not_a_file(path)}")
    with open(path, "rb") as fh:
        head = fh.read(HEAD_BYTES)
    if not head.strip():
        raise fail(path, "empty file (no header, no requests)")
    for magic, kind in ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"(\xb5/\xfd", "zstd"),
                        (b"PK\x03\x04", "zip"), (b"PAR1", "Parquet")):
        if head.startswith(magic):     # (helper-61: a .csv.gz was called a binary file)
            hint = ("decompress it first (e.g. gunzip -k)" if kind != "Parquet" else
                    "a Parquet trace is read by its .parquet name, not as this format")
            raise fail(path, f"a {kind} file (binary), not a text trace: {hint}", 1)
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
        TraceError: If the header uses another delimiter (semicolon, tab, pipe), or names a column twice
            (pandas would read the second as ``NAME.1`` and one of them would be ignored).
    """
    first = head.split(b"\n", 1)[0].decode("utf-8").lstrip("\ufeff").rstrip("\r")
    if "," not in first:
        for sep, name in _DELIMITERS.items():
            if sep in first:
                raise fail(path, f"wrong delimiter: the header is {name}-separated; "
                           "expected comma-separated values", 1, value=first)
    import csv
    # quoted names ("arrived_at", as R's write.csv writes them) read as pandas reads them (helper-61: refused)
    fields = [f.strip() for f in next(csv.reader([first]))] if '"' in first else [f.strip() for f in first.split(",")]
    seen: dict[str, int] = {}
    for position, name in enumerate(fields, 1):
        if name in seen and name:
            raise fail(path, f"column {name!r} appears twice in the header (fields {seen[name]} and {position}); "
                       "which one holds the values is ambiguous", 1, value=first)
        seen.setdefault(name, position)
    return fields


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
    import pandas as pd

    try:
        # Only an empty field is missing: "nan", "NA", "null" stay text, so that the
        # converters name them ("time is NaN", "not an integer") instead of "empty value".
        reader = pd.read_csv(path, chunksize=chunk_rows, dtype=dtype, encoding="utf-8",
                             skip_blank_lines=False, skipinitialspace=True,
                             keep_default_na=False, na_values=[""])
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


def check_field_counts(path: Path, n_fields: int, slice_bytes: int = SLICE_BYTES,
                       expected: str = "the header has") -> None:
    """Raises on the first line whose comma-separated field count is not the header's.

    Vectorised: the file is read in slices of ``slice_bytes`` (cut at the last newline);
    numpy counts the commas between newlines (about 0.1-0.2 s per 100 MB).
    Blank (whitespace-only) lines are skipped, as the reader skips them; a line of
    only empty fields (``,,,``) is refused, since the reader would drop it silently. A
    file with a double quote anywhere is counted by the :mod:`csv` module instead, so
    that quoted commas are not taken as delimiters (slower, exact).

    Args:
        path: CSV file (UTF-8 already checked at its start).
        n_fields: Number of fields in the header (line 1).
        slice_bytes: Bytes read at a time (memory: a few times this).
        expected: Words before the expected count in messages (a headerless file:
            e.g. ``"a ServeGen rate line has"``).

    Raises:
        TraceError: Naming the file, the 1-based line, the field count found and the
            header's, e.g. ``"line 2: too many fields: 4, the header has 3; the last
            field is empty (a trailing comma)"`` or ``"line 5: truncated line: 2 of 3
            fields"``.
    """
    line0, pending = 0, []                   # pending: the start of an unfinished line

    def scan(block: np.ndarray) -> None:
        nonlocal line0
        found, n_lines = _first_bad_line(block, n_fields)
        if found is not None:
            index, text = found
            raise _field_count_error(path, line0 + index + 1, text, n_fields, expected)
        line0 += n_lines

    with open(path, "rb") as fh:
        while piece := fh.read(slice_bytes):
            if b'"' in piece:
                _check_field_counts_quoted(path, n_fields, expected)
                return
            first = piece.find(b"\n") + 1
            if not first:
                pending.append(piece)            # a very long line: joined when it ends
                continue
            start = 0
            if pending:                          # the line that spans two reads
                scan(np.frombuffer(b"".join(pending) + piece[:first], np.uint8))
                pending, start = [], first
            stop = piece.rfind(b"\n") + 1
            if stop > start:                     # whole lines, a view: no copy
                scan(np.frombuffer(piece, np.uint8, stop - start, start))
            if stop < len(piece):
                pending = [piece[stop:]]
    if pending:                                  # the last line has no newline
        scan(np.frombuffer(b"".join(pending), np.uint8))


def _first_bad_line(block: np.ndarray, n_fields: int) -> tuple[tuple[int, bytes] | None, int]:
    """Scans whole lines for a wrong field count or only empty fields.

    Only the positions of bytes up to ``,`` in value are gathered (newlines, commas,
    blanks and a few rare others). A line of nothing but commas and blanks (space, tab,
    CR) is either blank (skipped, as the reader skips it) or a row of empty fields
    (refused: the reader would drop it silently); blanks are counted only when some line
    has no byte above ``,``.

    Returns:
        ``((index of the line within block, its bytes) or None, number of newlines)``.
    """
    at = np.flatnonzero(block <= 44)
    kind = block[at]
    newline_at = np.flatnonzero(kind == 10)                      # places within ``at``
    n_newlines = len(newline_at)
    ends = at[newline_at]
    if len(block) and block[-1] != 10:                           # last line, no newline
        newline_at = np.append(newline_at, len(at))
        ends = np.append(ends, len(block))
    commas_before = np.zeros(len(kind) + 1, dtype=np.int64)     # commas in at[:j]
    np.cumsum(kind == 44, out=commas_before[1:])
    first_special = np.empty_like(newline_at)
    first_special[:1] = 0
    first_special[1:] = newline_at[:-1] + 1
    commas = commas_before[newline_at] - commas_before[first_special]
    starts = np.empty_like(ends)
    starts[:1] = 0
    starts[1:] = ends[:-1] + 1
    bad = commas != n_fields - 1
    empty = ends - starts <= newline_at - first_special        # every byte is low
    if empty.any():                      # rare (blank lines): count the blanks and commas
        fill_before = np.zeros(len(kind) + 1, dtype=np.int64)
        np.cumsum((kind == 44) | (kind == 32) | (kind == 9) | (kind == 13),
                  out=fill_before[1:])
        fill = fill_before[newline_at] - fill_before[first_special]
        empty &= ends - starts == fill                           # nothing but , and blanks
    bad = (bad & ~(empty & (commas == 0))) | (empty & (commas > 0))
    if not bad.any():
        return None, n_newlines
    index = int(np.argmax(bad))
    return (index, block[starts[index]:ends[index]].tobytes()), n_newlines


def _check_field_counts_quoted(path: Path, n_fields: int, expected: str) -> None:
    """:func:`check_field_counts` for files with quotes: the csv module splits the lines."""
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        reader = csv.reader(fh, skipinitialspace=True)
        previous = 0
        for row in reader:
            first, previous = previous + 1, reader.line_num   # a quoted field may span lines
            empty = not "".join(row).strip()
            if empty and len(row) <= 1:
                continue                         # blank line
            if len(row) != n_fields or empty:
                text = raw_line(path, first).encode("utf-8", errors="replace")
                raise _field_count_error(path, first, text, n_fields, expected, len(row))


def _field_count_error(path: Path, line: int, raw: bytes, n_fields: int,
                       expected: str = "the header has", n_got: int | None = None) -> TraceError:
    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
    n_got = text.count(",") + 1 if n_got is None else n_got
    if n_got < n_fields:
        return fail(path, f"truncated line: {n_got} of {n_fields} fields ({expected} "
                    f"{n_fields})", line, value=text)
    if n_got > n_fields:
        tail = ("; the extra last field is empty (a trailing comma)"
                if text.rstrip(" \t\r").endswith(",") else "")
        return fail(path, f"too many fields: {n_got}, {expected} {n_fields}{tail}",
                    line, value=text)
    return fail(path, f"a row of {n_fields} empty fields (no values)", line, value=text)
