"""Tests of Mooncake/Parquet loading, generators, transformations, stats and the CLI."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traces import (TraceError, TraceWarning, clip_context, first_n, gamma_arrivals,
                    load_trace, merge, parse_arrival, poisson_arrivals, sample_n,
                    scale_rate, synthesize, synthetic_default, time_window, trace_stats,
                    write_parquet)
from traces.cli import register
from traces.servegen import load_rates, servegen_mix

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"
MOONCAKE = SHARED / "mooncake_fast25" / "conversation_trace.jsonl"
AZURE_CODE = SHARED / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
DEEPSEEK = SHARED / "servegen" / "data" / "reason" / "deepseek-r1"


def needs(path: Path):
    return pytest.mark.skipif(not path.exists(), reason=f"{path} not present")


def table(arrival_s, prompt, output):
    return pd.DataFrame({"request_id": np.arange(len(arrival_s)),
                         "arrival_s": np.asarray(arrival_s, dtype=float),
                         "prompt_tokens": np.asarray(prompt, dtype=np.int64),
                         "output_tokens": np.asarray(output, dtype=np.int64)})


# ---------------------------------------------------------------- Mooncake JSONL

MC_ROWS = [{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]},
           {"timestamp": 0, "input_length": 1100, "output_length": 7, "hash_ids": [0, 2, 3]},
           {"timestamp": 3000, "input_length": 600, "output_length": 9, "hash_ids": [0, 2]},
           {"timestamp": 6000, "input_length": 20, "output_length": 1, "hash_ids": [4]}]


def write_jsonl(tmp_path: Path, rows=MC_ROWS, raw_lines: dict | None = None) -> Path:
    lines = [json.dumps(r) for r in rows]
    for i, text in (raw_lines or {}).items():
        lines[i] = text
    path = tmp_path / "mc.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_mooncake_loads_with_hash_ids_and_ms(tmp_path):
    df = load_trace(write_jsonl(tmp_path))
    assert df["arrival_s"].tolist() == [0.0, 0.0, 3.0, 6.0]
    assert df["hash_ids"].tolist() == [[0, 1], [0, 2, 3], [0, 2], [4]]
    stats = trace_stats(df)
    # hits: r0 0; r1 [0] -> 1; r2 [0, 2] -> 2; r3 0  => 3 of 8 blocks
    assert (stats["prefix_hit_blocks"], stats["prefix_total_blocks"]) == (3, 8)
    assert stats["prefix_unique_blocks"] == 5


@pytest.mark.parametrize("field", ["timestamp", "input_length", "output_length"])
def test_mooncake_fault_missing_field(tmp_path, field):
    rows = [dict(r) for r in MC_ROWS]
    del rows[2][field]
    path = write_jsonl(tmp_path, rows)
    with pytest.raises(TraceError, match="missing field") as err:
        load_trace(path)
    assert f"line 3, column '{field}'" in str(err.value) and str(path) in str(err.value)


@pytest.mark.parametrize("value,what", [("x", "not a number"), (2.5, "not an integer"),
                                        (0, ">= 1"), (-4, ">= 1")])
def test_mooncake_fault_bad_tokens(tmp_path, value, what):
    rows = [dict(r) for r in MC_ROWS]
    rows[1]["output_length"] = value
    with pytest.raises(TraceError, match=what) as err:
        load_trace(write_jsonl(tmp_path, rows))
    assert "line 2, column 'output_length'" in str(err.value)


def test_clipped_requests_keep_their_prompt_s_blocks_only(tmp_path):
    """Clipping a Mooncake table to a context cuts each clipped request's hash_ids to ceil(prompt / 512) blocks, so
    that the clipped table is canonical: it is written and read back (``traces convert --max-context`` wrote a file
    that stats and simulate refused: 3 ids for a 500-token prompt); unclipped rows keep theirs whole."""
    df = load_trace(write_jsonl(tmp_path))
    clipped, n = clip_context(df, 600)
    # 1000+5 -> prompt 595 (2 blocks), 1100+7 -> 593 (2 of its 3 ids), 600+9 -> 591 (2), 20+1 unclipped
    assert n == 3 and clipped["prompt_tokens"].tolist() == [595, 593, 591, 20]
    assert [list(ids) for ids in clipped["hash_ids"]] == [[0, 1], [0, 2], [0, 2], [4]]
    path = write_parquet(clipped, tmp_path / "clipped.parquet")
    back = load_trace(path)
    assert [list(ids) for ids in back["hash_ids"]] == [[0, 1], [0, 2], [0, 2], [4]]
    tight, _ = clip_context(df, 300)                  # 1000+5 -> 295 tokens: 1 block
    assert [len(ids) for ids in tight["hash_ids"]] == [1, 1, 1, 1]


def test_mooncake_fault_truncated_line(tmp_path):
    path = write_jsonl(tmp_path, raw_lines={3: json.dumps(MC_ROWS[3])[:30]})
    with pytest.raises(TraceError, match="truncated line") as err:
        load_trace(path, fmt="mooncake")
    assert "line 4" in str(err.value)


def test_mooncake_fault_non_utf8(tmp_path):
    path = write_jsonl(tmp_path)
    path.write_bytes(path.read_bytes().replace(b'"output_length": 9', b'"output_length": \xe99'))
    with pytest.raises(TraceError, match="non-UTF-8") as err:
        load_trace(path, fmt="mooncake")
    assert "line 3" in str(err.value)


def test_mooncake_out_of_order_sorted(tmp_path):
    rows = [MC_ROWS[2], MC_ROWS[0], MC_ROWS[3], MC_ROWS[1]]
    with pytest.warns(TraceWarning, match="2 rows out of time order were sorted"):
        df = load_trace(write_jsonl(tmp_path, rows))
    assert df["prompt_tokens"].tolist() == [1000, 1100, 600, 20]


@needs(MOONCAKE)
def test_mooncake_conversation_prefix_hit_ratio():
    stats = trace_stats(load_trace(MOONCAKE))
    assert stats["rows"] == 12_031
    assert (stats["prefix_hit_blocks"], stats["prefix_total_blocks"]) == (105_710, 288_500)
    assert stats["prefix_unique_blocks"] == 182_790
    assert round(100 * stats["prefix_hit_ratio"], 1) == 36.6
    assert stats["span_s"] == pytest.approx(3537.0, abs=0.5)


# ---------------------------------------------------------------- Parquet round trip

def test_parquet_round_trip(tmp_path):
    df = load_trace(write_jsonl(tmp_path))
    out = write_parquet(df, tmp_path / "t.parquet")
    back = load_trace(out)
    assert back.attrs["source"] == str(out)
    pd.testing.assert_frame_equal(back, df, check_like=False)


def test_parquet_fault_missing_column(tmp_path):
    path = tmp_path / "bad.parquet"
    table([0.0, 1.0], [1, 2], [3, 4]).drop(columns="output_tokens").to_parquet(path)
    with pytest.raises(TraceError, match="missing column 'output_tokens'"):
        load_trace(path)


def test_parquet_fault_zero_tokens(tmp_path):
    path = tmp_path / "bad.parquet"
    table([0.0, 1.0], [1, 0], [3, 4]).to_parquet(path)
    with pytest.raises(TraceError, match="row 2, column 'prompt_tokens'"):
        load_trace(path)


# ---------------------------------------------------------------- generators

def test_parse_arrival():
    assert parse_arrival("poisson:2.5").rate_per_s == 2.5
    spec = parse_arrival("gamma:4,0.5")
    assert (spec.kind, spec.rate_per_s, spec.cv) == ("gamma", 4.0, 0.5)
    for bad in ("poisson", "gamma:4", "poisson:-1", "gamma:1,0", "weibull:3"):
        with pytest.raises(TraceError, match="arrival"):
            parse_arrival(bad)


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_arrivals_rate_and_cv(cv):
    arrival_s = gamma_arrivals(100_000, 8.0, cv, np.random.default_rng(1))
    iat_s = np.diff(arrival_s)
    assert arrival_s[0] == 0.0
    assert 1 / iat_s.mean() == pytest.approx(8.0, rel=0.03)
    assert iat_s.std() / iat_s.mean() == pytest.approx(cv, rel=0.05)


def test_poisson_arrivals_seeded():
    a = poisson_arrivals(10, 1.0, np.random.default_rng(5))
    assert np.array_equal(a, poisson_arrivals(10, 1.0, np.random.default_rng(5)))


def test_synthesize_empirical_lengths_come_from_source():
    source = table([0.0, 1.0, 2.0], [10, 20, 30], [1, 2, 3])
    df = synthesize(500, "gamma:3,2", seed=4, lengths_from=source)
    pairs = set(zip(df["prompt_tokens"], df["output_tokens"]))
    assert pairs <= {(10, 1), (20, 2), (30, 3)} and len(pairs) == 3
    assert df.attrs["source"].startswith("synthetic:")


def test_synthesize_lognormal_fit_within_source_range():
    source = synthetic_default(1, 5000)
    df = synthesize(5000, "poisson:5", seed=2, lengths_from=source, lengths="lognormal")
    assert df["prompt_tokens"].between(source["prompt_tokens"].min(),
                                       source["prompt_tokens"].max()).all()
    assert df["prompt_tokens"].median() == pytest.approx(source["prompt_tokens"].median(),
                                                         rel=0.08)


@needs(DEEPSEEK)
def test_servegen_mix_rate_matches_pool_statistics():
    df = servegen_mix(DEEPSEEK, start_s=36_000, duration_s=1200, seed=0)
    assert df["client_id"].nunique() > 5
    expected = 0.0
    for cid in df["client_id"].unique():
        rates = load_rates(DEEPSEEK / f"chunk-{cid}-trace.csv")
        inside = rates["window_start_s"].between(36_000, 37_199)
        expected += (rates.loc[inside, "rate_per_s"] * 600).sum()
    assert len(df) == pytest.approx(expected, rel=0.2)
    again = servegen_mix(DEEPSEEK, start_s=36_000, duration_s=1200, seed=0)
    pd.testing.assert_frame_equal(df, again)


# ---------------------------------------------------------------- transformations

def test_scale_rate_and_window_and_first():
    df = table([0.0, 1.0, 2.0, 4.0], [1, 2, 3, 4], [1, 1, 1, 1])
    assert scale_rate(df, 2.0)["arrival_s"].tolist() == [0.0, 0.5, 1.0, 2.0]
    win = time_window(df, 1.0, 4.0)
    assert win["prompt_tokens"].tolist() == [2, 3] and win["arrival_s"].tolist() == [0, 1]
    assert first_n(df, 2)["prompt_tokens"].tolist() == [1, 2]
    with pytest.raises(TraceError):
        scale_rate(df, 0)
    with pytest.raises(TraceError):
        time_window(df, 3, 1)


def test_sample_n_is_seeded_subset_in_order():
    df = synthetic_default(0, 200)
    a, b = sample_n(df, 50, seed=3), sample_n(df, 50, seed=3)
    pd.testing.assert_frame_equal(a, b)
    assert a["arrival_s"].is_monotonic_increasing and len(a) == 50
    with pytest.raises(TraceError):
        sample_n(df, 201, seed=0)


def test_merge_overlays_traces():
    a = table([0.0, 2.0], [1, 2], [1, 1])
    b = table([0.0, 1.0], [10, 20], [1, 1])
    out = merge([a, b])
    assert out["prompt_tokens"].tolist() == [1, 10, 20, 2]
    assert out["trace_index"].tolist() == [0, 1, 1, 0]
    assert out["request_id"].tolist() == [0, 1, 2, 3]


canonical_tables = st.lists(
    st.tuples(st.floats(0, 1e4), st.integers(1, 10_000), st.integers(1, 10_000)),
    min_size=1, max_size=40).map(
        lambda rows: table(sorted(r[0] for r in rows), [r[1] for r in rows],
                           [r[2] for r in rows]))


@settings(max_examples=60, deadline=None)
@given(df=canonical_tables, max_tokens=st.integers(2, 20_000))
def test_clip_context_properties(df, max_tokens):
    out, n = clip_context(df, max_tokens)
    total = out["prompt_tokens"] + out["output_tokens"]
    assert (total <= max_tokens).all()
    assert (out["prompt_tokens"] >= 1).all() and (out["output_tokens"] >= 1).all()
    changed = (out["prompt_tokens"] != df["prompt_tokens"]) | \
        (out["output_tokens"] != df["output_tokens"])
    assert n == int(changed.sum()) == int((df["prompt_tokens"] + df["output_tokens"]
                                           > max_tokens).sum())


@settings(max_examples=60, deadline=None)
@given(df=canonical_tables, factor=st.floats(0.01, 100), n=st.integers(0, 50))
def test_transforms_keep_canonical_invariants(df, factor, n):
    for out in (scale_rate(df, factor), first_n(df, n), sample_n(df, min(n, len(df)), 1),
                merge([df, df])):
        assert out["request_id"].tolist() == list(range(len(out)))
        assert out["arrival_s"].is_monotonic_increasing
        if len(out):
            assert out["arrival_s"].iloc[0] == 0.0


# ---------------------------------------------------------------- stats and CLI

def test_trace_stats_small_table():
    stats = trace_stats(table([0.0, 1.0, 2.0, 4.0], [10, 20, 30, 40], [1, 2, 3, 4]))
    assert stats["rows"] == 4 and stats["span_s"] == 4.0 and stats["mean_rate_per_s"] == 1.0
    iat = np.array([1.0, 1.0, 2.0])
    assert stats["iat_cv"] == pytest.approx(iat.std() / iat.mean())
    assert stats["prompt_p50"] == 25.0 and stats["output_max"] == 4
    assert "prefix_hit_ratio" not in stats


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvsim")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_stats_prints_table(tmp_path, capsys):
    path = write_jsonl(tmp_path)
    assert run_cli(["traces", "stats", str(path)]) == 0
    out = capsys.readouterr().out
    assert "rows" in out and "prefix_hit_ratio      37.5 %" in out


def test_cli_stats_error_is_one_line(tmp_path, capsys):
    path = tmp_path / "x.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n5,6\n")
    assert run_cli(["traces", "stats", str(path), "--window", "0:5"]) == 2   # needs arrivals
    err = capsys.readouterr().err
    assert err.startswith("kvsim: error: ") and err.count("\n") == 1 and "arrival" in err and "Traceback" not in err


def test_cli_convert_refuses_overwrite(tmp_path, capsys):
    src, out = write_jsonl(tmp_path), tmp_path / "o.parquet"
    assert run_cli(["traces", "convert", str(src), "--out", str(out)]) == 0
    assert run_cli(["traces", "convert", str(src), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert run_cli(["traces", "convert", str(src), "--out", str(out), "--force",
                    "--first", "2"]) == 0
    assert len(load_trace(out)) == 2


def test_cli_convert_force_replaces_only_a_trace_it_wrote(tmp_path, capsys):
    """``--force`` replaces a Parquet trace ``traces convert`` wrote (its schema mark), never a user's own file of
    the same name, Parquet or not (helper-48: a text file and a one-column Parquet were overwritten)."""
    import pandas as pd

    from traces.loader import is_trace_file
    src = write_jsonl(tmp_path)
    notes = tmp_path / "notes.parquet"
    notes.write_text("my notes\n")
    own = tmp_path / "own.parquet"
    pd.DataFrame({"x": [1, 2]}).to_parquet(own)
    for path in (notes, own):
        before = path.read_bytes()
        assert run_cli(["traces", "convert", str(src), "--out", str(path), "--force"]) == 2
        assert "is not a trace kvsim traces convert wrote" in capsys.readouterr().err
        assert path.read_bytes() == before and not is_trace_file(path)
    ours = tmp_path / "ours.parquet"
    assert run_cli(["traces", "convert", str(src), "--out", str(ours)]) == 0 and is_trace_file(ours)


def test_cli_transform_flags(tmp_path, capsys):
    src = write_jsonl(tmp_path)
    assert run_cli(["traces", "stats", str(src), "--max-context", "1050",
                    "--scale-rate", "2"]) == 0
    captured = capsys.readouterr()
    assert "kvsim: warning: clipped 1 requests to 1050 tokens" in captured.err
    assert re.search(r"^span_s +3$", captured.out, re.M), captured.out


# ---------------------------------------------------------------- named traces

def test_named_trace_absent_says_where_to_put_it(tmp_path, monkeypatch):
    from traces.named import resolve_trace
    monkeypatch.setenv("KVSIM_DATA", str(tmp_path))
    with pytest.raises(TraceError, match="kvsim traces fetch azure-conv-2023") as err:
        resolve_trace("azure-conv-2023")
    assert str(tmp_path / "AzureLLMInferenceTrace_conv.csv") in str(err.value)
    with pytest.raises(TraceError, match="not a trace name"):
        resolve_trace("no-such-trace")


@needs(AZURE_CODE)
def test_fetch_verifies_checksum(tmp_path, monkeypatch):
    from traces.named import fetch_trace, resolve_trace
    monkeypatch.setenv("KVSIM_DATA", str(tmp_path / "data"))
    path = fetch_trace("azure-code-2023", url=AZURE_CODE.resolve().as_uri())
    assert resolve_trace("azure-code-2023") == path
    assert run_cli(["traces", "stats", "azure-code-2023"]) == 0
    path.unlink()
    with pytest.raises(TraceError, match="SHA-256 mismatch"):
        fetch_trace("azure-conv-2023", url=AZURE_CODE.resolve().as_uri())
    assert not (tmp_path / "data" / "AzureLLMInferenceTrace_conv.csv").exists()


def test_fetch_offline_is_a_clear_error(tmp_path, monkeypatch):
    from traces.named import fetch_trace
    monkeypatch.setenv("KVSIM_DATA", str(tmp_path))
    with pytest.raises(TraceError, match="cannot download 'sharegpt-8k'.*by hand"):
        fetch_trace("sharegpt-8k", url=(tmp_path / "missing.csv").as_uri())
    assert list(tmp_path.iterdir()) == []
