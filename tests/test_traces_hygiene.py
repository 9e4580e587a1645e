"""Trace readers refuse each kind of input fault with one line (issue 16, "Readers").

Kinds, each across every format it applies to: a CSV row whose field count is not the
header's (extra field, trailing comma, short row, row of empty fields), ``hash_ids`` that
are not ``ceil(input_length / 512)`` integers (Mooncake JSONL, Parquet), non-finite times,
arrivals beyond the simulator clock's exact range, unsorted Parquet, numpy reprs in
messages, and ``kvsim traces stats`` on a length-only file. The "Input faults" files of
``../shared/cases/README.md`` are read in place (never copied into the repository).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cli import main
from traces import TraceError, TraceWarning, load_trace, scale_rate, trace_stats, write_parquet
from traces.canonical import ARRIVAL_TICKS_PER_S, MAX_ARRIVAL_S
from traces.csvread import check_field_counts

REPO = Path(__file__).resolve().parents[1]
CASES = REPO / ".." / "shared" / "cases"
SHAREGPT = (REPO / ".." / "shared" / "traces" / "vidur_processed_traces"
            / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv")

# One good 3-row file per CSV format; TIME is replaced by each row's time.
HEADERS = {
    "azure": "TIMESTAMP,ContextTokens,GeneratedTokens",
    "azure2024": "TIMESTAMP,ContextTokens,GeneratedTokens",
    "splitwise": "arrived_at,num_prefill_tokens,num_decode_tokens",
    "lengths": "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio",
    "burstgpt": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
}
ROWS = {
    "azure": ["2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:50.9951690,396,109",
              "2023-11-16 18:15:51.2224670,879,55"],
    "azure2024": ["2024-05-12 00:00:00.0045480+00:00,374,44",
                  "2024-05-12 00:00:04.3191270+00:00,396,109",
                  "2024-05-12 00:00:04.5464250+00:00,879,55"],
    "splitwise": ["0.0,374,44", "4.314579,396,109", "4.541877,879,55"],
    "lengths": ["374,44,418,8.5", "396,109,505,3.6", "879,55,934,16.0"],
    "burstgpt": ["5,ChatGPT,374,44,418,Conversation log", "45,ChatGPT,396,109,505,API log",
                 "118,GPT-4,879,55,934,Conversation log"],
}
TIME_COLUMN = {"azure": "TIMESTAMP", "azure2024": "TIMESTAMP", "splitwise": "arrived_at",
               "burstgpt": "Timestamp"}
ARRIVAL = {"lengths": "poisson:2"}


def needs_cases():
    return pytest.mark.skipif(not CASES.is_dir(), reason=f"{CASES} not present")


def write(tmp_path: Path, fmt: str, rows: list[str], header: str | None = None,
          name: str | None = None, end: str = "\n") -> Path:
    path = tmp_path / (name or f"{fmt}.csv")
    path.write_text("\n".join([header or HEADERS[fmt]] + rows) + end)
    return path


def load(path: Path, fmt: str) -> pd.DataFrame:
    return load_trace(path, arrival=ARRIVAL.get(fmt))


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("kvsim: error: "), err
    return lines[0]


# ---------------------------------------------------------------- the shared input cases

CASE_EXPECT = {
    # file: (extra CLI args, what the one-line message must contain)
    "lengths_extra_field.csv": (["--arrival", "poisson:1"],
                                ["line 2", "too many fields: 5, the header has 4"]),
    "trailing_comma.csv": ([], ["line 2", "too many fields: 4, the header has 3",
                                "trailing comma"]),
    "mc_hash_nested_list.jsonl": ([], ["line 1, column 'hash_ids'", "element 1 is a list"]),
    "mooncake_hash_too_many.jsonl": ([], ["line 1, column 'hash_ids'",
                                          "10 block ids for 1000 prompt tokens",
                                          "ceil(1000 / 512) = 2"]),
    "huge_time.csv": ([], ["line 3, column 'arrived_at'", "900,719,925 s", "2**53"]),
}


@needs_cases()
@pytest.mark.parametrize("name", sorted(CASE_EXPECT))
def test_case_refused_by_loader(name):
    args, parts = CASE_EXPECT[name]
    arrival = args[1] if args else None
    with pytest.raises(TraceError) as err:
        load_trace(CASES / name, arrival=arrival)
    msg = str(err.value)
    assert "\n" not in msg and str(CASES / name) in msg, msg
    for part in parts:
        assert part in msg, msg
    assert "empty value" not in msg   # trailing_comma used to blame num_decode_tokens


@needs_cases()
@pytest.mark.parametrize("command", ["stats", "simulate"])
@pytest.mark.parametrize("name", sorted(CASE_EXPECT))
def test_case_refused_by_cli(tmp_path, capsys, name, command):
    args, parts = CASE_EXPECT[name]
    path = str(CASES / name)
    argv = (["traces", "stats", path] if command == "stats" else
            ["simulate", "--trace", path, "--out", str(tmp_path / "run")]) + args
    assert main(argv) == 2
    line = one_line_error(capsys)
    for part in [path] + parts:
        assert part in line, line
    assert not (tmp_path / "run").exists()


@needs_cases()
def test_case_console_command_exit_2_without_traceback():
    """The installed entry point (a fresh interpreter), not only ``main``."""
    name = "mc_hash_nested_list.jsonl"
    command = ([shutil.which("kvsim")] if shutil.which("kvsim") else
               [sys.executable, "-c", "import sys; from cli import main; sys.exit(main(sys.argv[1:]))"])
    done = subprocess.run(command + ["traces", "stats", str(CASES / name)],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert "column 'hash_ids'" in done.stderr


# ---------------------------------------------------------------- CSV field counts

@pytest.mark.parametrize("fmt", list(HEADERS))
def test_every_row_one_field_more_than_header_is_refused(tmp_path, fmt):
    """pandas takes the first column as an index then (columns shifted silently)."""
    path = write(tmp_path, fmt, [row + ",7" for row in ROWS[fmt]])
    n = HEADERS[fmt].count(",") + 1
    with pytest.raises(TraceError, match=rf"line 2: too many fields: {n + 1}, "
                                         rf"the header has {n} \(got "):
        load(path, fmt)


@pytest.mark.parametrize("fmt", list(HEADERS))
def test_trailing_comma_is_an_extra_empty_field(tmp_path, fmt):
    path = write(tmp_path, fmt, [row + "," for row in ROWS[fmt]])
    with pytest.raises(TraceError, match="line 2: too many fields.*trailing comma") as err:
        load(path, fmt)
    assert "empty value" not in str(err.value)


@pytest.mark.parametrize("fmt", list(HEADERS))
def test_extra_field_on_last_row_only(tmp_path, fmt):
    rows = list(ROWS[fmt])
    rows[2] += ",1"
    with pytest.raises(TraceError, match="line 4: too many fields"):
        load(write(tmp_path, fmt, rows), fmt)


@pytest.mark.parametrize("fmt", ["lengths", "burstgpt"])
def test_row_missing_an_optional_column_is_refused(tmp_path, fmt):
    """The required columns are all there, but the row is one field short."""
    rows = list(ROWS[fmt])
    rows[1] = rows[1].rsplit(",", 1)[0]
    n = HEADERS[fmt].count(",") + 1
    with pytest.raises(TraceError, match=rf"line 3: truncated line: {n - 1} of {n} fields"):
        load(write(tmp_path, fmt, rows), fmt)


@pytest.mark.parametrize("fmt", list(HEADERS))
def test_row_of_empty_fields_is_refused_not_dropped(tmp_path, fmt):
    rows = list(ROWS[fmt])
    rows.insert(1, "," * HEADERS[fmt].count(","))
    with pytest.raises(TraceError, match="line 3: a row of .* empty fields"):
        load(write(tmp_path, fmt, rows), fmt)


@pytest.mark.parametrize("fmt", list(HEADERS))
def test_blank_lines_crlf_and_no_final_newline_still_load(tmp_path, fmt):
    rows = [ROWS[fmt][0], "", "   ", ROWS[fmt][1], ROWS[fmt][2]]
    path = tmp_path / "x.csv"
    path.write_bytes(("\r\n".join([HEADERS[fmt]] + rows)).encode())
    df = load(path, fmt)
    assert df["prompt_tokens"].tolist() == [374, 396, 879]
    assert df["output_tokens"].tolist() == [44, 109, 55]


def test_quoted_comma_is_not_a_delimiter(tmp_path):
    rows = ['5,"GPT-4, turbo",374,44,418,Conversation log', "45,ChatGPT,396,109,505,API log"]
    df = load_trace(write(tmp_path, "burstgpt", rows))
    assert df["model"].astype(str).tolist() == ["GPT-4, turbo", "ChatGPT"]
    assert df["prompt_tokens"].tolist() == [374, 396]
    rows.append('118,"GPT-4",879,55,934,Conversation log,extra')
    with pytest.raises(TraceError, match="line 4: too many fields: 7, the header has 6"):
        load_trace(write(tmp_path, "burstgpt", rows))


@pytest.mark.parametrize("slice_bytes", [1, 7, 64, 1 << 20])
def test_field_count_line_numbers_across_slices(tmp_path, slice_bytes):
    rows = [f"{i}.5,{i + 1},{i + 2}" for i in range(300)]
    path = write(tmp_path, "splitwise", rows)
    check_field_counts(path, 3, slice_bytes=slice_bytes)            # all good
    rows[250] += ",9"
    rows[120] = ""                                                 # blank line: skipped
    path = write(tmp_path, "splitwise", rows, end="")
    with pytest.raises(TraceError, match=r"line 252: too many fields: 4") as err:
        check_field_counts(path, 3, slice_bytes=slice_bytes)
    assert "250.5,251,252,9" in str(err.value)


def test_field_count_check_finds_cut_last_line(tmp_path):
    path = write(tmp_path, "splitwise", ROWS["splitwise"] + ["9.0,12"], end="")
    with pytest.raises(TraceError, match="line 5: truncated line: 2 of 3 fields"):
        load_trace(path)


# ---------------------------------------------------------------- non-finite and huge times

@pytest.mark.parametrize("fmt", ["splitwise", "burstgpt"])
@pytest.mark.parametrize("text,what", [("nan", "time is NaN"), ("NaN", "time is NaN"),
                                       ("inf", "time is infinite"),
                                       ("-inf", "time is infinite"),
                                       ("Infinity", "time is infinite"),
                                       ("soon", "time is not a number")])
def test_non_finite_time_named(tmp_path, fmt, text, what):
    rows = list(ROWS[fmt])
    rows[1] = text + rows[1][rows[1].index(","):]
    with pytest.raises(TraceError, match=what) as err:
        load(write(tmp_path, fmt, rows), fmt)
    assert f"line 3, column '{TIME_COLUMN[fmt]}'" in str(err.value)


@pytest.mark.parametrize("fmt", ["splitwise", "lengths", "burstgpt"])
@pytest.mark.parametrize("text", ["nan", "NA", "null", "inf"])
def test_na_words_in_token_column_are_not_empty(tmp_path, fmt, text):
    rows = list(ROWS[fmt])
    parts = rows[2].split(",")
    column = HEADERS[fmt].split(",")[{"splitwise": 1, "lengths": 0, "burstgpt": 2}[fmt]]
    parts[HEADERS[fmt].split(",").index(column)] = text
    rows[2] = ",".join(parts)
    with pytest.raises(TraceError, match="token count is not an integer") as err:
        load(write(tmp_path, fmt, rows), fmt)
    assert f"line 4, column '{column}'" in str(err.value) and f"(got " in str(err.value)
    assert str(err.value).rstrip(")'").endswith(text)


@pytest.mark.parametrize("fmt", ["splitwise", "burstgpt"])
@pytest.mark.parametrize("row", [1, 2])          # the only negative one, or one of several
def test_negative_time_of_a_start_relative_format_is_refused(tmp_path, fmt, row):
    """splitwise's ``arrived_at`` and BurstGPT's ``Timestamp`` count seconds from the trace's start: a
    negative one is not of the format (it was sorted first, shifting every other arrival, or taken silently
    when all were negative); the first is named by line. With ``--arrival`` the file's times are not used."""
    rows = list(ROWS[fmt])
    for k in range(row, len(rows)) if row == 1 else [row]:
        rows[k] = "-1.5" + rows[k][rows[k].index(","):]
    path = write(tmp_path, fmt, rows)
    with pytest.raises(TraceError, match=rf"line {row + 2}, column '{TIME_COLUMN[fmt]}': negative time: .*"
                                         r"\(>= 0\) \(got -1.5\)"):
        load(path, fmt)
    assert len(load_trace(path, arrival="poisson:1")) == len(rows)


def test_max_arrival_matches_the_simulator_tick():
    from sim.core.engine import ARRIVAL_TICKS_PER_S as SIM_TICKS
    assert ARRIVAL_TICKS_PER_S == SIM_TICKS
    assert MAX_ARRIVAL_S * ARRIVAL_TICKS_PER_S == 2**53
    # every tick count up to the bound is an exact float64 integer; one past it is not
    assert float(2**53 - 1) == 2**53 - 1 and float(2**53 + 1) != 2**53 + 1


@pytest.mark.parametrize("fmt,late,ok", [
    ("splitwise", "1e300", f"{MAX_ARRIVAL_S - 1:.0f}"),
    ("burstgpt", "1000000000", "900000000"),
    ("azure", "2060-01-01 00:00:00.0000000", "2051-01-01 00:00:00.0000000"),
    ("azure2024", "2060-01-01 00:00:00.0000000+00:00", "2051-01-01 00:00:00.0000000+00:00"),
])
def test_arrival_beyond_clock_refused_just_inside_kept(tmp_path, fmt, late, ok):
    def rows_with(text):
        rows = list(ROWS[fmt])
        rows[2] = text + rows[2][rows[2].index(","):]
        return rows
    with pytest.raises(TraceError, match="900,719,925 s") as err:
        load(write(tmp_path, fmt, rows_with(late)), fmt)
    assert f"line 4, column '{TIME_COLUMN[fmt]}'" in str(err.value)
    assert "earliest request (line 2)" in str(err.value)
    df = load(write(tmp_path, fmt, rows_with(ok)), fmt)
    assert 0 < df["arrival_s"].iloc[-1] <= MAX_ARRIVAL_S


def test_arrival_override_ignores_file_times(tmp_path):
    rows = list(ROWS["splitwise"])
    rows[2] = "1e300" + rows[2][rows[2].index(","):]
    df = load_trace(write(tmp_path, "splitwise", rows), arrival="poisson:1")
    assert df["prompt_tokens"].tolist() == [374, 396, 879]


# ---------------------------------------------------------------- Mooncake JSONL

MC = [{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]},
      {"timestamp": 3000, "input_length": 513, "output_length": 7, "hash_ids": [0, 2]},
      {"timestamp": 6000, "input_length": 512, "output_length": 9, "hash_ids": [3]}]


def write_jsonl(tmp_path: Path, records: list, raw: dict | None = None) -> Path:
    lines = [json.dumps(r) for r in records]
    for i, text in (raw or {}).items():
        lines[i] = text
    path = tmp_path / "mc.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def with_field(i: int, field: str, value) -> list:
    records = [dict(r) for r in MC]
    records[i][field] = value
    return records


@pytest.mark.parametrize("value,what", [
    ([[1], 2], "element 1 is a list"), ([0, "1"], "element 2 is a string"),
    ([0, 1.0], "element 2 is a float"), ([True, 1], "element 1 is a boolean"),
    ([0, None], "element 2 is null"), ([0, -1], r"\[0, 2\*\*63 - 1\] \(got -1\)"),
    ([0, 2**63], r"\(got 9223372036854775808\)"), ([0, 1, 2], "3 block ids for 513"),
    ([0], "1 block ids for 513"), ({"a": 1}, "not an object"), (7, "not an integer"),
    ("0,1", "not a string")])
def test_mooncake_bad_hash_ids(tmp_path, value, what):
    with pytest.raises(TraceError, match=what) as err:
        load_trace(write_jsonl(tmp_path, with_field(1, "hash_ids", value)))
    assert "line 2, column 'hash_ids'" in str(err.value)


@pytest.mark.parametrize("value", ["absent", None, []])
def test_mooncake_no_hash_ids_means_no_prefix_information(tmp_path, value):
    records = with_field(1, "hash_ids", value)
    if value == "absent":
        del records[1]["hash_ids"]
    df = load_trace(write_jsonl(tmp_path, records))
    assert df["hash_ids"].tolist() == [[0, 1], [], [3]]


def test_mooncake_block_count_rule_at_the_edges(tmp_path):
    df = load_trace(write_jsonl(tmp_path, MC))     # 1000 -> 2, 513 -> 2, 512 -> 1
    assert df["hash_ids"].tolist() == [[0, 1], [0, 2], [3]]


@pytest.mark.parametrize("text,what", [("NaN", "timestamp is NaN"),
                                       ("Infinity", "timestamp is infinite"),
                                       ("-Infinity", "timestamp is infinite"),
                                       ('"3000"', "timestamp is not a number"),
                                       ("1e400", "timestamp is infinite"),
                                       ("9007199254740993", "beyond"),
                                       ("1" + "0" * 5000, "invalid JSON")])
def test_mooncake_bad_timestamp(tmp_path, text, what):
    line = json.dumps(MC[1]).replace('"timestamp": 3000', f'"timestamp": {text}')
    with pytest.raises(TraceError, match=what) as err:
        load_trace(write_jsonl(tmp_path, MC, raw={1: line}))
    assert "line 2" in str(err.value)


@pytest.mark.parametrize("text", ["NaN", "Infinity", "1e400", "true", "[5]"])
def test_mooncake_non_finite_token_count_no_traceback(tmp_path, text):
    line = json.dumps(MC[1]).replace('"output_length": 7', f'"output_length": {text}')
    with pytest.raises(TraceError, match="line 2, column 'output_length'"):
        load_trace(write_jsonl(tmp_path, MC, raw={1: line}))


def test_mooncake_arrival_beyond_clock(tmp_path):
    records = with_field(2, "timestamp", int(MAX_ARRIVAL_S * 1000) + 1000)
    with pytest.raises(TraceError, match="line 3, column 'timestamp'.*900,719,925 s"):
        load_trace(write_jsonl(tmp_path, records))


def test_mooncake_deeply_nested_json_no_traceback(tmp_path):
    with pytest.raises(TraceError, match="line 2"):
        load_trace(write_jsonl(tmp_path, MC, raw={1: "[" * 100_000 + "]" * 100_000}),
                   fmt="mooncake")


# ---------------------------------------------------------------- canonical Parquet

def parquet(tmp_path: Path, **columns) -> Path:
    data = {"request_id": [0, 1, 2], "arrival_s": [0.0, 1.0, 2.0],
            "prompt_tokens": [1000, 513, 512], "output_tokens": [5, 7, 9]}
    data.update(columns)
    path = tmp_path / "t.parquet"
    pd.DataFrame(data).to_parquet(path, index=False)
    return path


@pytest.mark.parametrize("ids,what", [
    ([[0, 1, 2], [0, 2], [3]], "row 1, column 'hash_ids': 3 block ids for 1000"),
    ([[0, 1], [0, 2], [3, 4]], "row 3, column 'hash_ids': 2 block ids for 512"),
    ([["0", "1"], ["a", "b"], ["3"]], "row 1, column 'hash_ids': element 1 is a string"),
    ([[[0], [1]], [[0], [2]], [[3]]], "row 1, column 'hash_ids': element 1 is a list"),
    ([[0, 1], [0, -2], [3]], r"row 2, column 'hash_ids': block ids must be in"),
    ([1, 2, 3], "row 1, column 'hash_ids': must be a list"),
])
def test_parquet_bad_hash_ids(tmp_path, ids, what):
    with pytest.raises(TraceError, match=what):
        load_trace(parquet(tmp_path, hash_ids=ids))


def test_parquet_good_and_missing_hash_ids(tmp_path):
    df = load_trace(parquet(tmp_path, hash_ids=[[0, 1], None, []]))
    assert [list(x) if x is not None else None for x in df["hash_ids"]] == [[0, 1], None, []]


def test_parquet_unsorted_warns_like_csv(tmp_path):
    path = parquet(tmp_path, arrival_s=[2.0, 0.0, 1.0])
    with pytest.warns(TraceWarning, match="2 rows out of time order were sorted"):
        df = load_trace(path)
    assert df["prompt_tokens"].tolist() == [513, 512, 1000]
    assert df["arrival_s"].tolist() == [0.0, 1.0, 2.0]


def test_parquet_sorted_does_not_warn(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_trace(parquet(tmp_path))


@pytest.mark.parametrize("values,what", [
    ([0.0, float("nan"), 2.0], "row 2, column 'arrival_s': arrival time is NaN"),
    ([0.0, float("inf"), 2.0], "row 2, column 'arrival_s': arrival time is infinite"),
    ([0.0, 1.0, 1e300], "row 3, column 'arrival_s': arrival 1e\\+300 s after"),
    (["0", "1", "2"], "column 'arrival_s': must be numeric"),
    ([True, False, True], "column 'arrival_s': must be numeric"),
])
def test_parquet_bad_arrivals(tmp_path, values, what):
    with pytest.raises(TraceError, match=what):
        load_trace(parquet(tmp_path, arrival_s=values))


def test_parquet_tokens_nullable_and_huge(tmp_path):
    with pytest.raises(TraceError, match="row 2, column 'prompt_tokens': missing value"):
        load_trace(parquet(tmp_path, prompt_tokens=pd.array([1, None, 3], dtype="Int64")))
    with pytest.raises(TraceError, match="row 3, column 'output_tokens': token count above"):
        load_trace(parquet(tmp_path, output_tokens=np.array([1, 2, 2**64 - 1], dtype=np.uint64)))
    df = load_trace(parquet(tmp_path, prompt_tokens=np.array([1, 2, 3], dtype=np.int32)))
    assert df["prompt_tokens"].dtype == np.int64


def test_parquet_round_trip_of_mooncake_table(tmp_path):
    df = load_trace(write_jsonl(tmp_path, MC))
    back = load_trace(write_parquet(df, tmp_path / "mc.parquet"))
    assert [list(x) for x in back["hash_ids"]] == df["hash_ids"].tolist()
    assert back["arrival_s"].tolist() == df["arrival_s"].tolist()


# ---------------------------------------------------------------- plain values in messages

def test_messages_show_numbers_plainly(tmp_path):
    messages = []
    for make in (lambda: load_trace(parquet(tmp_path, prompt_tokens=[1, -200, 3])),
                 lambda: load_trace(write(tmp_path, "splitwise", ["0.0,-200,5"])),
                 lambda: scale_rate(load_trace(parquet(tmp_path)), np.float64(-2.0))):
        with pytest.raises(TraceError) as err:
            make()
        messages.append(str(err.value))
    for msg in messages:
        assert "np." not in msg and "array(" not in msg, msg
    assert messages[0].endswith("(got -200)") and messages[1].endswith("(got -200)")
    assert messages[2].endswith("(got -2.0)")


# ---------------------------------------------------------------- stats on length-only files

def test_stats_of_length_only_file_without_arrival(tmp_path, capsys):
    path = write(tmp_path, "lengths", ROWS["lengths"])
    assert main(["traces", "stats", str(path)]) == 0
    out = capsys.readouterr().out
    assert "none in the file (length-only trace)" in out
    assert "prompt_p50" in out and "output_max" in out and "span_s" not in out
    assert "rows         3" in out


def test_stats_of_length_only_file_with_arrival_has_span(tmp_path, capsys):
    path = write(tmp_path, "lengths", ROWS["lengths"])
    assert main(["traces", "stats", str(path), "--arrival", "poisson:2"]) == 0
    out = capsys.readouterr().out
    assert "span_s" in out and "none in the file" not in out


@pytest.mark.skipif(not SHAREGPT.is_file(), reason=f"{SHAREGPT} not present")
def test_stats_of_real_length_only_file(capsys):
    assert main(["traces", "stats", str(SHAREGPT)]) == 0
    out = capsys.readouterr().out
    assert "rows         30,731" in out and "prompt_max   8,141" in out


def test_trace_stats_without_arrivals_has_only_lengths():
    df = pd.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 1.0],
                       "prompt_tokens": [10, 20], "output_tokens": [1, 3]})
    stats = trace_stats(df, arrivals=False)
    assert "span_s" not in stats and "iat_cv" not in stats
    assert stats["rows"] == 2 and stats["prompt_max"] == 20 and stats["output_mean"] == 2.0
    assert math.isclose(trace_stats(df)["mean_rate_per_s"], 2.0)


# ---------------------------------------------------------------- ServeGen rate files

@pytest.mark.parametrize("line,what", [
    ("0,1.0,1.0,Gamma,0.5,0.1,9", "too many fields: 7, a ServeGen rate line has 6"),
    ("0,1.0,1.0,Gamma,0.5", "truncated line: 5 of 6 fields")])
def test_servegen_rate_file_field_count(tmp_path, line, what):
    from traces.servegen import load_rates
    path = tmp_path / "chunk-0-trace.csv"
    path.write_text("600,0.5,1.2,Gamma,0.7,0.04\n" + line + "\n")
    with pytest.raises(TraceError, match=what) as err:
        load_rates(path)
    assert "line 2" in str(err.value)


def test_an_azure_file_mixing_naive_and_offset_timestamps_is_refused(tmp_path):
    """Helper-48: a naive time read as UTC beside ``+05:00`` moved one row by 5 hours, and only a 'rows out of
    time order were sorted' line said anything. One line now names the first row of the other kind."""
    import pytest

    from traces.errors import TraceError
    from traces.loader import load_trace
    head = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    mixed = tmp_path / "mixed.csv"
    mixed.write_text(head + "2023-11-16 18:17:03.9799600,100,5\n2023-11-16 18:17:04+05:00,200,5\n")
    with pytest.raises(TraceError, match=r"line 3, column 'TIMESTAMP': timestamps with and without a UTC offset"):
        load_trace(mixed)
    zulu_first = tmp_path / "z.csv"
    zulu_first.write_text(head + "2023-11-16 18:17:03Z,100,5\n2023-11-16 18:17:04,200,5\n")
    with pytest.raises(TraceError, match=r"line 3.*the first row's has one"):
        load_trace(zulu_first)
    same = tmp_path / "same.csv"          # every row with an offset: applied (0.1 s apart in UTC)
    same.write_text(head + "2023-11-16 18:17:03.9+00:00,100,5\n2023-11-16 23:17:04.0+05:00,200,5\n")
    assert load_trace(same)["arrival_s"].tolist() == pytest.approx([0.0, 0.1])


def test_a_mooncake_line_giving_a_field_twice_is_refused(tmp_path):
    """Helper-48: ``{"timestamp": 0, ..., "timestamp": 5000}`` kept the last value silently (Python's json)."""
    import pytest

    from traces.errors import TraceError
    from traces.loader import load_trace
    path = tmp_path / "dup.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 100, "output_length": 5}\n'
                    '{"timestamp": 10, "input_length": 100, "output_length": 5, "input_length": 7}\n')
    with pytest.raises(TraceError, match=r"line 2, column 'input_length': field given twice in one object"):
        load_trace(path)
    path.write_text('{"timestamp": 0, "input_length": 100, "output_length": 5}\n')
    assert load_trace(path)["prompt_tokens"].tolist() == [100]
