"""Loader tests: canonical table, real public files, and one test per fault kind."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from traces import TraceError, TraceWarning, clip_context, load_trace, synthetic_default

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"
AZURE_CONV = SHARED / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
SPLITWISE_CONV = SHARED / "vidur_processed_traces" / "splitwise_conv.csv"
SHAREGPT = SHARED / "vidur_processed_traces" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
MOONCAKE = SHARED / "mooncake_fast25" / "conversation_trace.jsonl"


def needs(path: Path):
    return pytest.mark.skipif(not path.is_file(), reason=f"{path} not present")


# Good 4-row files per CSV format; row r (0-based) is on line r + 2.
GOOD = {
    "azure": ("TIMESTAMP,ContextTokens,GeneratedTokens",
              ["2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:50.9951690,396,109",
               "2023-11-16 18:15:51.2224670,879,55", "2023-11-16 18:15:51.3910170,91,16"]),
    "azure2024": ("TIMESTAMP,ContextTokens,GeneratedTokens",
                  ["2024-05-12 00:00:00.0045480+00:00,374,44",
                   "2024-05-12 00:00:04.3191270+00:00,396,109",
                   "2024-05-12 00:00:04.5464250+00:00,879,55",
                   "2024-05-12 00:00:04.7149750+00:00,91,16"]),
    "splitwise": ("arrived_at,num_prefill_tokens,num_decode_tokens",
                  ["0.0,374,44", "4.314579,396,109", "4.541877,879,55", "4.710427,91,16"]),
    "lengths": ("num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio",
                ["374,44,418,8.5", "396,109,505,3.6", "879,55,934,16.0", "91,16,107,5.7"]),
    "burstgpt": ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
                 ["5,ChatGPT,374,44,418,Conversation log", "45,ChatGPT,396,109,505,API log",
                  "118,GPT-4,879,55,934,Conversation log",
                  "185,ChatGPT,91,16,107,Conversation log"]),
}
# (time field index or None, prompt field index, output field index, prompt column name)
LAYOUT = {"azure": (0, 1, 2, "ContextTokens"), "azure2024": (0, 1, 2, "ContextTokens"),
          "splitwise": (0, 1, 2, "num_prefill_tokens"),
          "lengths": (None, 0, 1, "num_prefill_tokens"),
          "burstgpt": (0, 2, 3, "Request tokens")}
ARRIVAL = {"lengths": "poisson:2"}


def write_csv(tmp_path: Path, fmt: str, rows: list[str] | None = None,
              header: str | None = None) -> Path:
    head, good = GOOD[fmt]
    path = tmp_path / f"{fmt}.csv"
    path.write_text("\n".join([header or head] + (good if rows is None else rows)) + "\n")
    return path


def set_field(fmt: str, row: int, field: int, value: str) -> list[str]:
    rows = list(GOOD[fmt][1])
    parts = rows[row].split(",")
    parts[field] = value
    rows[row] = ",".join(parts)
    return rows


def load(path: Path, fmt: str) -> pd.DataFrame:
    return load_trace(path, arrival=ARRIVAL.get(fmt))


def assert_names(err: pytest.ExceptionInfo, path: Path, line: int, column: str | None):
    msg = str(err.value)
    assert str(path) in msg and f"line {line}" in msg, msg
    if column:
        assert f"'{column}'" in msg, msg


# ---------------------------------------------------------------- canonical table

@pytest.mark.parametrize("fmt", list(GOOD))
def test_good_file_gives_canonical_table(tmp_path, fmt):
    df = load(write_csv(tmp_path, fmt), fmt)
    assert list(df.columns[:4]) == ["request_id", "arrival_s", "prompt_tokens", "output_tokens"]
    assert [str(t) for t in df.dtypes[:4]] == ["int64", "float64", "int64", "int64"]
    assert df["request_id"].tolist() == [0, 1, 2, 3]
    assert df["arrival_s"].iloc[0] == 0.0 and df["arrival_s"].is_monotonic_increasing
    assert df["prompt_tokens"].tolist() == [374, 396, 879, 91]
    assert df["output_tokens"].tolist() == [44, 109, 55, 16]
    assert str(tmp_path) in df.attrs["source"]


def test_azure_timestamps_are_seconds_since_first(tmp_path):
    df = load(write_csv(tmp_path, "azure"), "azure")
    np.testing.assert_allclose(df["arrival_s"], [0.0, 4.314579, 4.541877, 4.710427], atol=1e-9)


def test_azure_2024_offset_equals_2023_spacing(tmp_path):
    df = load(write_csv(tmp_path, "azure2024"), "azure2024")
    np.testing.assert_allclose(df["arrival_s"], [0.0, 4.314579, 4.541877, 4.710427], atol=1e-9)


def test_lengths_without_arrival_is_an_error(tmp_path):
    path = write_csv(tmp_path, "lengths")
    with pytest.raises(TraceError, match="arrival"):
        load_trace(path)


def test_lengths_arrival_is_seeded(tmp_path):
    path = write_csv(tmp_path, "lengths")
    a = load_trace(path, arrival="gamma:2,3", seed=1)
    b = load_trace(path, arrival="gamma:2,3", seed=1)
    c = load_trace(path, arrival="gamma:2,3", seed=2)
    pd.testing.assert_frame_equal(a, b)
    assert not np.array_equal(a["arrival_s"], c["arrival_s"])


def test_burstgpt_failed_requests_dropped_and_counted(tmp_path):
    rows = set_field("burstgpt", 1, 3, "0") + ["200,GPT-4,10,0,10,API log"]
    with pytest.warns(TraceWarning, match="2 failed requests"):
        df = load(write_csv(tmp_path, "burstgpt", rows), "burstgpt")
    assert df["prompt_tokens"].tolist() == [374, 879, 91]
    assert df["model"].astype(str).tolist() == ["ChatGPT", "GPT-4", "ChatGPT"]


def test_burstgpt_optional_session_columns_kept(tmp_path):
    header = ("Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,"
              "Total tokens,Log Type")
    rows = ["5,a1,1.5,ChatGPT,374,44,418,Conversation log",
            "45,a2,2.0,GPT-4,396,109,505,API log"]
    path = tmp_path / "b3.csv"
    path.write_text("\n".join([header] + rows) + "\n")
    df = load_trace(path)
    assert df["session_id"].tolist() == ["a1", "a2"]
    assert df["elapsed_s"].tolist() == [1.5, 2.0]


def test_explicit_format_overrides_detection(tmp_path):
    path = write_csv(tmp_path, "splitwise")
    df = load_trace(path, fmt="lengths", arrival="poisson:1")
    assert df["prompt_tokens"].tolist() == [374, 396, 879, 91]


def test_unknown_format_name(tmp_path):
    with pytest.raises(TraceError, match="unknown format 'csv'"):
        load_trace(write_csv(tmp_path, "azure"), fmt="csv")


def test_clip_context():
    df = pd.DataFrame({"request_id": [0, 1, 2], "arrival_s": [0.0, 1.0, 2.0],
                       "prompt_tokens": [100, 90, 5], "output_tokens": [10, 200, 5]})
    out, n = clip_context(df, 100)
    assert n == 2
    assert out["prompt_tokens"].tolist() == [90, 1, 5]
    assert out["output_tokens"].tolist() == [10, 99, 5]
    assert df["prompt_tokens"].tolist() == [100, 90, 5]  # input untouched


# ---------------------------------------------------------------- faults, every CSV format

@pytest.mark.parametrize("fmt", list(GOOD))
def test_fault_missing_column(tmp_path, fmt):
    head = GOOD[fmt][0]
    column = LAYOUT[fmt][3]
    path = write_csv(tmp_path, fmt, header=head.replace(column, "Other"))
    with pytest.raises(TraceError, match="missing column") as err:
        load(path, fmt)
    assert_names(err, path, 1, column)


@pytest.mark.parametrize("fmt", list(GOOD))
@pytest.mark.parametrize("value", ["abc", "12.5"])
def test_fault_non_integer_tokens(tmp_path, fmt, value):
    _, prompt, _, column = LAYOUT[fmt]
    path = write_csv(tmp_path, fmt, set_field(fmt, 2, prompt, value))
    with pytest.raises(TraceError, match="not an integer") as err:
        load(path, fmt)
    assert_names(err, path, 4, column)
    assert value in str(err.value)


@pytest.mark.parametrize("fmt", list(GOOD))
@pytest.mark.parametrize("value", ["0", "-3"])
def test_fault_zero_or_negative_tokens(tmp_path, fmt, value):
    _, prompt, _, column = LAYOUT[fmt]
    path = write_csv(tmp_path, fmt, set_field(fmt, 1, prompt, value))
    with pytest.raises(TraceError, match=">= 1") as err:
        load(path, fmt)
    assert_names(err, path, 3, column)


@pytest.mark.parametrize("fmt,column", [("azure", "TIMESTAMP"), ("azure2024", "TIMESTAMP"),
                                        ("splitwise", "arrived_at"),
                                        ("burstgpt", "Timestamp")])
def test_fault_unparseable_timestamp(tmp_path, fmt, column):
    path = write_csv(tmp_path, fmt, set_field(fmt, 3, 0, "2023-13-45 25:00:00"))
    with pytest.raises(TraceError) as err:
        load(path, fmt)
    assert_names(err, path, 5, column)
    assert "2023-13-45 25:00:00" in str(err.value)


@pytest.mark.parametrize("fmt", list(GOOD))
def test_fault_empty_file(tmp_path, fmt):
    path = tmp_path / "empty.csv"
    path.write_bytes(b"")
    with pytest.raises(TraceError, match="empty file") as err:
        load(path, fmt)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("fmt", list(GOOD))
def test_fault_header_only(tmp_path, fmt):
    path = write_csv(tmp_path, fmt, rows=[])
    with pytest.raises(TraceError, match="no requests"):
        load(path, fmt)


def test_fault_binary_file(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_bytes(b"PK\x03\x04\x00\x00binary\x00junk")
    with pytest.raises(TraceError, match="binary") as err:
        load_trace(path)
    assert_names(err, path, 1, None)


@pytest.mark.parametrize("fmt", list(GOOD))
def test_fault_non_utf8(tmp_path, fmt):
    path = write_csv(tmp_path, fmt)
    lines = path.read_bytes().split(b"\n")
    lines[3] = lines[3].replace(b",", b"\xe9,", 1)
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(TraceError, match="non-UTF-8") as err:
        load(path, fmt)
    assert_names(err, path, 4, None)


def test_fault_non_utf8_far_into_file(tmp_path):
    rows = GOOD["splitwise"][1] + [f"{5 + i},10,10" for i in range(20_000)]
    path = write_csv(tmp_path, "splitwise", rows)
    data = path.read_bytes()
    path.write_bytes(data + b"99,1\xff0,5\n")
    with pytest.raises(TraceError, match="non-UTF-8") as err:
        load_trace(path)
    assert_names(err, path, 20_006, None)


@pytest.mark.parametrize("fmt", list(GOOD))
def test_fault_semicolon_delimiter(tmp_path, fmt):
    head, rows = GOOD[fmt]
    path = write_csv(tmp_path, fmt, [r.replace(",", ";") for r in rows], head.replace(",", ";"))
    with pytest.raises(TraceError, match="semicolon-separated") as err:
        load(path, fmt)
    assert_names(err, path, 1, None)


@pytest.mark.parametrize("fmt", list(GOOD))
def test_fault_truncated_line_in_middle(tmp_path, fmt):
    rows = list(GOOD[fmt][1])
    rows[1] = ",".join(rows[1].split(",")[:LAYOUT[fmt][2]])  # cut before the output field
    path = write_csv(tmp_path, fmt, rows)
    with pytest.raises(TraceError, match="truncated line") as err:
        load(path, fmt)
    assert_names(err, path, 3, None)


@pytest.mark.parametrize("fmt", list(GOOD))
def test_fault_truncated_last_line(tmp_path, fmt):
    head, rows = GOOD[fmt]
    text = "\n".join([head] + rows)
    path = tmp_path / "cut.csv"
    path.write_text(text[:text.rindex(",") + 0])  # drop the last field: "...,9" -> "..."
    with pytest.raises(TraceError, match="truncated line") as err:
        load(path, fmt)
    assert_names(err, path, 5, None)


@pytest.mark.parametrize("fmt", list(GOOD))
def test_fault_too_many_fields(tmp_path, fmt):
    rows = list(GOOD[fmt][1])
    rows[2] += ",7"
    path = write_csv(tmp_path, fmt, rows)
    with pytest.raises(TraceError, match="too many fields") as err:
        load(path, fmt)
    assert_names(err, path, 4, None)


@pytest.mark.parametrize("fmt", ["azure", "azure2024", "splitwise", "burstgpt"])
def test_out_of_order_rows_sorted_with_count(tmp_path, fmt):
    rows = list(GOOD[fmt][1])
    rows = [rows[2], rows[0], rows[3], rows[1]]
    with pytest.warns(TraceWarning, match="2 rows out of time order were sorted"):
        df = load(write_csv(tmp_path, fmt, rows), fmt)
    assert df["prompt_tokens"].tolist() == [374, 396, 879, 91]
    assert df["arrival_s"].iloc[0] == 0.0


def test_unrecognised_header(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(TraceError, match="unrecognised CSV header") as err:
        load_trace(path)
    assert_names(err, path, 1, None)


def test_missing_file(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "nope.csv")


# ---------------------------------------------------------------- real public files

@needs(AZURE_CONV)
@needs(SPLITWISE_CONV)
def test_azure_conv_equals_splitwise_conv():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        azure = load_trace(AZURE_CONV)        # (its load time is a benchmark's business: bench/, not a test)
        splitwise = load_trace(SPLITWISE_CONV)
    assert len(azure) == len(splitwise) == 19_366
    np.testing.assert_allclose(azure["arrival_s"], splitwise["arrival_s"], rtol=0, atol=1e-6)
    for col in ("request_id", "prompt_tokens", "output_tokens"):
        assert azure[col].equals(splitwise[col])
    assert azure["arrival_s"].iloc[-1] == pytest.approx(3501.7, abs=0.05)


@needs(SHAREGPT)
def test_sharegpt_lengths_file():
    df = load_trace(SHAREGPT, arrival="poisson:10", seed=3)
    assert len(df) == 30_731
    assert df["prompt_tokens"].max() == 8141 and df["output_tokens"].max() == 1024
    assert len(df) / df["arrival_s"].iloc[-1] == pytest.approx(10, rel=0.03)


# ---------------------------------------------------------------- default workload

def test_synthetic_default_is_deterministic():
    a, b = synthetic_default(7), synthetic_default(7)
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(synthetic_default(8))
    assert len(a) == 1000 and a["request_id"].tolist() == list(range(1000))
    assert a.attrs["source"].startswith("synthetic:") and "Azure" in a.attrs["source"]


def test_synthetic_default_matches_azure_conv_statistics():
    df = synthetic_default(0, num_requests=200_000)
    prompt = np.percentile(df["prompt_tokens"], [50, 90, 99])
    output = np.percentile(df["output_tokens"], [50, 90, 99])
    np.testing.assert_allclose(prompt, [1020, 2734, 4142], rtol=0.05)
    np.testing.assert_allclose(output, [129, 424, 601], rtol=0.05)
    assert df["prompt_tokens"].between(2, 14050).all()
    assert df["output_tokens"].between(7, 1000).all()
    assert df["prompt_tokens"].mean() == pytest.approx(1154.7, rel=0.20)
    assert df["output_tokens"].mean() == pytest.approx(211.1, rel=0.20)
    rate_per_s = (len(df) - 1) / df["arrival_s"].iloc[-1]
    assert rate_per_s == pytest.approx(5.53, rel=0.03)


@pytest.mark.parametrize("spec, says", [("poisson:-1", "arrival rate must be > 0 req/s (got -1.0)"),
                                        ("poisson:0", "arrival rate must be > 0 req/s (got 0.0)"),
                                        ("gamma:5,-1", "arrival CV must be > 0 (got -1.0)"),
                                        ("gamma:5", "expected 'poisson:RATE' or 'gamma:RATE,CV'"),
                                        ("poisson:abc", "expected 'poisson:RATE' or 'gamma:RATE,CV'")])
def test_a_bad_arrival_spec_says_what_is_wrong(spec, says):
    """The arrival spec is named, and a rate or CV out of range is said to be (not only the expected form)."""
    from traces.generators import parse_arrival

    with pytest.raises(TraceError) as raised:
        parse_arrival(spec)
    assert str(raised.value).startswith(f"arrival {spec!r}: ") and says in str(raised.value)


def test_a_parquet_named_text_file_is_named_as_such(tmp_path):
    """A file named .parquet without Parquet's magic bytes is said to be that, not an unknown CSV header."""
    fake = tmp_path / "trace.parquet"
    fake.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,10,3\n")
    with pytest.raises(TraceError, match="named .parquet but not a Parquet file"):
        load_trace(fake)
    assert len(load_trace(fake, fmt="azure")) == 1       # --format reads it as what it is
