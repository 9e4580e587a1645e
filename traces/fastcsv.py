"""A CSV trace read without pandas, where the file is plain (issue 32: ``kvsim simulate`` imports no pandas
before its run has results).

:func:`read_columns` reads the Azure (ISO timestamps), Splitwise (float seconds) and length-only formats when
every value the loader uses is plainly valid: token counts of ASCII digits in [1, ``MAX_TOKENS``], times in
seconds as plain decimals (:func:`_seconds`), timestamps
``YYYY-MM-DD HH:MM:SS[.f...]`` (``T`` or a space between date and time, 1 to 9 fraction digits, every row
the same width, no offset) with every field in range; no quote, byte-order mark, blank line or CR but in a CRLF
line end, valid UTF-8 throughout. It returns the columns that pandas' reader gives such a file
(:func:`traces.formats.load_csv`'s ``_convert`` of every chunk, concatenated: int64 tokens, int64 ns since
the Unix epoch, naive times taken as UTC, as ``pd.to_datetime(..., format="ISO8601", utc=True)`` parses
them), and None for any other file, which then takes pandas' reader: its checks name the file, line, column
and value of whatever is wrong, so every message stays the one it was. BurstGPT files (extra columns kept as
categories) always take pandas' reader.

Float times keep pandas' bits: a decimal of at most 15 digits is an exact integer over an exact power of ten,
which every pandas parser since 1.2 (``precise_xstrtod``'s one division by its table of powers of ten) and
Python's ``float`` round correctly alike; a longer one only where the installed pandas parses with
fast_float, correctly rounded as ``float`` is (:func:`pandas_rounds_floats`: pandas >= 3.1.1, checked on
600,000 random decimals of 16-18 digits and on the Splitwise traces, whose times have up to 17).

The caller has checked the header (:func:`traces.csvread.header_fields`, the format's columns present) and
every line's field count (:func:`traces.csvread.check_field_counts`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

FORMATS = ("azure", "lengths", "splitwise")
"""The formats read here (:data:`traces.formats.CSV_FORMATS` names)."""

MAX_TOKENS = 100_000_000         # traces.fields.MAX_TOKENS (a larger count takes pandas' reader and its message)
_DAYS_IN_MONTH = np.array([0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)
_NS_PER_S = 1_000_000_000
_EXACT_DIGITS = 15                # a decimal of at most this many digits: its mantissa and its power of ten exact
CORRECTLY_ROUNDED_PANDAS = (3, 1, 1)
"""The first pandas version known here to read CSV floats correctly rounded (fast_float, pandas-dev/pandas
#64432; tested on 3.1.1)."""


def read_columns(path: Path, spec, header: list[str]) -> dict[str, np.ndarray] | None:
    """``{"prompt_tokens", "output_tokens"[, "time"]}`` of a plain file of ``spec``'s format (module
    docstring), in file order, or None where pandas' reader must read it.

    Args:
        path: The CSV file.
        spec: Its :class:`traces.formats.CsvFormat`.
        header: Its header fields, stripped (:func:`traces.csvread.header_fields`).
    """
    if spec.name not in FORMATS:
        return None
    data = path.read_bytes()
    if b'"' in data or data.startswith(b"\xef\xbb\xbf"):
        return None
    if b"\r" in data:                            # CRLF line ends (the Azure files); a CR elsewhere: pandas
        if data.count(b"\r") != data.count(b"\r\n"):
            return None
        data = data.replace(b"\r\n", b"\n")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    start = data.find(b"\n") + 1
    body = data[start:-1] if data.endswith(b"\n") else data[start:]
    n_fields = len(header)
    if not start or not body or n_fields < 2:
        return None
    n_rows = body.count(b"\n") + 1
    cells = body.replace(b"\n", b",").split(b",")
    if len(cells) != n_rows * n_fields:         # a blank line (the field counts of the others are checked)
        return None
    out = {}
    for key, column in (("prompt_tokens", spec.prompt_column), ("output_tokens", spec.output_column)):
        values = _tokens(cells[header.index(column)::n_fields])
        if values is None:
            return None
        out[key] = values
    if spec.time_kind == "iso":
        time = _timestamps_ns(cells[header.index(spec.time_column)::n_fields])
        if time is None:
            return None
        out["time"] = time
    elif spec.time_kind == "seconds":
        time = _seconds(cells[header.index(spec.time_column)::n_fields])
        if time is None:
            return None
        out["time"] = time
    elif spec.time_kind != "none":
        return None
    return out


def pandas_rounds_floats() -> bool:
    """Whether the installed pandas reads CSV floats correctly rounded (version >=
    :data:`CORRECTLY_ROUNDED_PANDAS`, read from its metadata: pandas is not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        text = version("pandas")
    except PackageNotFoundError:
        return False
    parts = []
    for piece in text.split(".")[:3]:
        digits = len(piece) - len(piece.lstrip("0123456789"))
        if not digits:
            break
        parts.append(int(piece[:digits]))
        if digits < len(piece):       # a pre-release (3.1.1rc1): not the release itself
            return tuple(parts) > CORRECTLY_ROUNDED_PANDAS
    return tuple(parts) >= CORRECTLY_ROUNDED_PANDAS


def _seconds(cells: list[bytes]) -> np.ndarray | None:
    """float64 seconds of plain decimals (ASCII digits with at most one point between two digits: no sign,
    exponent or blank), as pandas reads them (module docstring), or None."""
    joined = b"".join(cells)
    if not joined.replace(b".", b"").isdigit() or not all(cells):
        return None
    for cell in cells:
        if cell.count(b".") > 1 or cell[0] == 46 or cell[-1] == 46:
            return None
    longest = max(map(len, cells))
    if longest > _EXACT_DIGITS:
        digits = max(len(cell) - (b"." in cell) for cell in cells)
        # up to 18 digits (an integer one still an int64 for pandas) where pandas rounds as float does
        if digits > _EXACT_DIGITS and (digits > 18 or not pandas_rounds_floats()):
            return None
    return np.array(list(map(float, cells)), dtype=np.float64)


def _tokens(cells: list[bytes]) -> np.ndarray | None:
    """int64 token counts, or None unless every cell is ASCII digits with a value in [1, MAX_TOKENS]."""
    if not b"".join(cells).isdigit() or not all(cells):
        return None
    try:
        values = np.array(list(map(int, cells)), dtype=np.int64)
    except OverflowError:
        return None
    if values.min() < 1 or values.max() > MAX_TOKENS:
        return None
    return values


def _timestamps_ns(cells: list[bytes]) -> np.ndarray | None:
    """int64 ns since the Unix epoch of ``YYYY-MM-DD HH:MM:SS[.fraction]`` cells of one width (UTC), or None."""
    width = len(cells[0])
    if width != 19 and not 21 <= width <= 29:
        return None
    joined = b"".join(cells)
    if len(joined) != width * len(cells):
        return None
    grid = np.frombuffer(joined, dtype=np.uint8).reshape(len(cells), width)
    if not ((grid[:, 4] == 45).all() and (grid[:, 7] == 45).all() and (grid[:, 13] == 58).all()
            and (grid[:, 16] == 58).all() and ((grid[:, 10] == 32) | (grid[:, 10] == 84)).all()
            and (width == 19 or (grid[:, 19] == 46).all())):
        return None
    digit_at = [0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18, *range(20, width)]
    digits = grid[:, digit_at].astype(np.int64) - 48
    if not ((digits >= 0) & (digits <= 9)).all():
        return None

    def number(first: int, count: int) -> np.ndarray:
        value = np.zeros(len(cells), dtype=np.int64)
        for position in range(first, first + count):
            value = value * 10 + digits[:, position]
        return value

    year, month, day = number(0, 4), number(4, 2), number(6, 2)
    hour, minute, second = number(8, 2), number(10, 2), number(12, 2)
    if not ((year >= 1970).all() and (year <= 2200).all() and (month >= 1).all() and (month <= 12).all()
            and (hour <= 23).all() and (minute <= 59).all() and (second <= 59).all() and (day >= 1).all()):
        return None
    leap = ((year % 4 == 0) & (year % 100 != 0)) | (year % 400 == 0)
    if not (day <= _DAYS_IN_MONTH[month] + (leap & (month == 2))).all():
        return None
    # days from the civil date (H. Hinnant's days_from_civil, proleptic Gregorian; years >= 1970 here)
    y = year - (month <= 2)
    era = y // 400
    year_of_era = y - era * 400
    day_of_year = (153 * (month + np.where(month > 2, -3, 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    days = era * 146097 + day_of_era - 719468
    seconds = ((days * 24 + hour) * 60 + minute) * 60 + second
    n_fraction = width - 20
    fraction = number(14, n_fraction) * 10 ** (9 - n_fraction) if n_fraction > 0 else 0
    return seconds * _NS_PER_S + fraction
