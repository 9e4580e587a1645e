"""Summaries are strict JSON: a NaN figure is written as null and read back as NaN (sim.results.json_text)."""
import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, strategies as st

from sim.results.json_text import finite_or_none, nan_for_null, strict_json_text


def test_non_finite_floats_become_null_and_the_text_is_strict():
    text = strict_json_text({"a": float("nan"), "b": [1.5, float("inf"), np.float64("nan")],
                             "c": {"d": -float("inf"), "e": np.float32(2.5)}, "s": "x", "n": 3})
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"a": None, "b": [1.5, None, None], "c": {"d": None, "e": 2.5}, "s": "x", "n": 3}


def test_nan_for_null_turns_every_null_back_into_nan_and_keeps_the_rest():
    back = nan_for_null({"a": None, "b": [1, None], "c": {"d": None, "e": "f"}})
    assert math.isnan(back["a"]) and back["b"][0] == 1 and math.isnan(back["b"][1])
    assert math.isnan(back["c"]["d"]) and back["c"]["e"] == "f"


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                    max_leaves=12))
def test_round_trip_keeps_finite_values_and_every_non_finite_float_comes_back_as_nan(value):
    text = strict_json_text(value)
    json.loads(text, parse_constant=lambda token: pytest.fail(f"non-strict token {token}"))

    def same(original, read):
        if isinstance(original, float) and not math.isfinite(original) or original is None:
            return isinstance(read, float) and math.isnan(read)
        if isinstance(original, dict):
            return original.keys() == read.keys() and all(same(original[k], read[k]) for k in original)
        if isinstance(original, (list, tuple)):
            return len(original) == len(read) and all(same(a, b) for a, b in zip(original, read))
        return original == read and type(original) is type(read)
    assert same(value, nan_for_null(json.loads(text)))
    assert finite_or_none(value) == json.loads(text)


def test_a_run_that_served_nobody_writes_strict_json_and_loads_its_nan_figures(tmp_path, capsys):
    from analysis.results import load_run
    from cli import main
    trace = tmp_path / "t.csv"         # every request needs more than one 10-token reservation: all rejected
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,100,10\n0.5,200,10\n")
    assert main(["simulate", "--trace", str(trace), "--policy", "static:max_len=10", "--out", str(tmp_path / "run"),
                 "--quiet"]) == 0
    text = (tmp_path / "run" / "summary.json").read_text()
    json.loads(text, parse_constant=lambda token: pytest.fail(f"summary.json holds {token}"))
    written = json.loads(text)
    assert written["finished"] == 0 and written["rejected"] == 2 and written["ttft_p50_ms"] is None
    loaded = load_run(tmp_path / "run").summary
    assert math.isnan(loaded["ttft_p50_ms"]) and math.isnan(loaded["e2e_p99_s"]) and loaded["finished"] == 0
    assert loaded.keys() == written.keys()
