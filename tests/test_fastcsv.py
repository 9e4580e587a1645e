"""The CSV reader without pandas (:mod:`traces.fastcsv`, issue 32) gives the columns pandas' reader gives
(:func:`traces.formats.load_csv`'s own chunks), or declines and leaves the file to pandas' reader (whose
checks word the messages); the loaded tables are the same either way."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

import traces
import traces.csvread as csvread
from traces import fastcsv
from traces.canonical import TraceColumns, as_frame
from traces.formats import _chunks, _concat_columns, _convert, detect_csv


def _pandas_columns(path: Path) -> tuple[dict, dict | None]:
    header = csvread.header_fields(path, csvread.read_head(path))
    spec = detect_csv(path, header)
    slow = _concat_columns([_convert(path, chunk, spec, len(header)) for chunk in _chunks(path, spec)])
    return slow, fastcsv.read_columns(path, spec, header)


def _same(fast: dict, slow: dict) -> bool:
    return fast.keys() == slow.keys() and all(
        fast[k].dtype == slow[k].dtype and np.array_equal(fast[k], slow[k]) for k in fast)


AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens"


@pytest.mark.parametrize("body, read", [
    (["2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:50.9951690,396,109"], True),
    (["2024-02-29T23:59:59.123456789,1,1", "2024-03-01T00:00:00.000000001,7,100000000"], True),   # leap day, T
    (["2023-01-01 00:00:00,5,6", "2023-01-01 00:00:01,5,6"], True),                              # no fraction
    (["2023-01-01 00:00:00.5,5,6", "2023-01-01 00:00:01.25,5,6"], False),        # widths differ: pandas
    (["2023-01-01 00:00:00+00:00,5,6"], False),                                   # an offset: pandas
    (["2023-01-01 00:00:00, 5,6"], False),                                        # a blank before a value
    (["2023-01-01 00:00:00,5.0,6"], False),                                       # a float token count
    (["2023-01-01 00:00:00,0012,6"], True),                                       # leading zeros: 12 both
])
def test_azure_fast_columns_equal_pandas(tmp_path, body, read):
    for newline in ("\n", "\r\n"):
        path = tmp_path / "t.csv"
        path.write_bytes(newline.join([AZURE_HEAD, *body]).encode() + newline.encode())
        slow, fast = _pandas_columns(path)
        assert (fast is not None) == read
        if fast is not None:
            assert _same(fast, slow)


def test_declined_files_still_load_with_their_messages(tmp_path):
    """A value the fast reader refuses takes pandas' reader, which names it (the message is pandas' path's)."""
    path = tmp_path / "bad.csv"
    path.write_text(f"{AZURE_HEAD}\n2023-11-16 18:15:46.6805900,374,0\n")
    with pytest.raises(traces.TraceError, match=r"line 2, column 'GeneratedTokens': token count must be >= 1"):
        traces.load_trace(path, light=True)
    path.write_text(f"{AZURE_HEAD}\n2023-13-16 18:15:46.6805900,374,3\n")
    with pytest.raises(traces.TraceError, match="unparseable timestamp"):
        traces.load_trace(path, light=True)


@pytest.mark.filterwarnings("ignore::traces.TraceWarning")
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**12), st.integers(1, 10**6), st.integers(1, 10**6)),
                min_size=1, max_size=40),
       st.integers(0, 9), st.sampled_from(["\n", "\r\n"]), st.booleans())
def test_plain_tables_read_as_pandas_reads_them(tmp_path_factory, rows, digits, newline, lengths_only):
    """Random plain Azure and length-only files: the same columns, and the same canonical table (light or not)."""
    path = tmp_path_factory.mktemp("fast") / "t.csv"
    if lengths_only:
        lines = ["num_prefill_tokens,num_decode_tokens,pd_ratio"] + [f"{p},{o},{p / o}" for _, p, o in rows]
    else:
        def stamp(us: int) -> str:
            text = str(np.datetime64("2020-01-01T00:00:00", "s") + np.timedelta64(us // 10**6, "s")).replace("T", " ")
            return text + (f".{us % 10**6:06d}{'7' * max(0, digits - 6)}"[:digits + 1] if digits else "")
        lines = [AZURE_HEAD] + [f"{stamp(us)},{p},{o}" for us, p, o in rows]
    path.write_bytes(newline.join(lines).encode() + (newline.encode() if len(rows) % 2 else b""))
    slow, fast = _pandas_columns(path)
    assert fast is not None and _same(fast, slow)
    arrival = "poisson:3" if lengths_only else None
    light = traces.load_trace(path, arrival=arrival, light=True)
    frame = traces.load_trace(path, arrival=arrival)
    assert isinstance(light, TraceColumns) and isinstance(frame, pd.DataFrame)
    pd.testing.assert_frame_equal(as_frame(light), frame, check_exact=True)
    assert as_frame(light).attrs == frame.attrs


def test_light_transforms_equal_the_frame_ones(tmp_path):
    """first_n, skip_n, scale_rate and clip_context on a TraceColumns give the DataFrame forms' tables."""
    path = tmp_path / "t.csv"
    path.write_text(f"{AZURE_HEAD}\n" + "\n".join(
        f"2023-11-16 18:{i // 60:02d}:{i % 60:02d}.{(977 * i) % 10**7:07d},{100 + 997 * i % 9000},{1 + 31 * i % 700}"
        for i in range(300)) + "\n")
    light, frame = traces.load_trace(path, light=True), traces.load_trace(path)
    steps = [lambda t: traces.skip_n(t, 7), lambda t: traces.first_n(t, 250),
             lambda t: traces.scale_rate(t, 2.5, "--rate-scale"), lambda t: traces.clip_context(t, 4096)[0]]
    for step in steps:
        light, frame = step(light), step(frame)
        assert isinstance(light, TraceColumns)
        pd.testing.assert_frame_equal(as_frame(light), frame, check_exact=True)
        assert as_frame(light).attrs == frame.attrs


SPLITWISE_HEAD = "arrived_at,num_prefill_tokens,num_decode_tokens"


@pytest.mark.parametrize("times, read", [
    (["0.0", "4.314579", "10"], True),
    (["0", "1", "2"], True),                                   # integer seconds (pandas: an int64 column)
    (["0.123456789012345", "1.5"], True),                      # 15 digits: exact for every pandas
    (["1e3", "2"], False), (["-1.5", "2"], False), ([".5", "2"], False), (["5.", "6"], False),
    (["1.2.3", "4"], False), (["nan", "1"], False), (["1.5 ", "2"], False),
    (["1.2345678901234567890", "2"], False),                   # 20 digits: pandas' reader
])
def test_splitwise_seconds_equal_pandas(tmp_path, times, read):
    path = tmp_path / "s.csv"
    path.write_text("\n".join([SPLITWISE_HEAD, *(f"{t},10,5" for t in times)]) + "\n")
    slow = None
    try:
        slow, fast = _pandas_columns(path)
    except traces.TraceError:
        fast = fastcsv.read_columns(path, detect_csv(path, csvread.header_fields(path, csvread.read_head(path))),
                                    csvread.header_fields(path, csvread.read_head(path)))
    assert (fast is not None) == read
    if fast is not None:
        assert _same({k: v.view(np.int64) for k, v in fast.items()}, {k: v.view(np.int64) for k, v in slow.items()})


@pytest.mark.skipif(not fastcsv.pandas_rounds_floats(), reason="the installed pandas is not known to round as float")
@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**17), st.integers(0, 17)), min_size=1, max_size=60))
def test_long_decimals_read_as_pandas_reads_them(tmp_path_factory, values):
    """Decimals of 16-18 digits (the Splitwise traces' times have up to 17): the same float64 bits."""
    path = tmp_path_factory.mktemp("long") / "s.csv"
    def text(mantissa: int, point: int) -> str:
        digits = str(mantissa)
        point = min(point, len(digits) - 1)
        return digits[:len(digits) - point] + (("." + digits[len(digits) - point:]) if point else "")
    path.write_text("\n".join([SPLITWISE_HEAD, *(f"{text(m, p)},10,5" for m, p in values)]) + "\n")
    slow, fast = _pandas_columns(path)
    assert fast is not None
    assert np.array_equal(fast["time"].view(np.int64), slow["time"].astype(np.float64).view(np.int64))
