"""A fresh streamed run's results without pandas (issue 32): the request table as numpy columns
(:meth:`sim.core.engine.SimOutput.request_table`), its summary (:func:`sim.results.summary.summarize` on
columns) and its ``requests.parquet`` (:func:`sim.results.columns.write_parquet`) equal the DataFrame path's."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

import traces
from analysis.results import write_run
from sim.core.engine import SimOutput, Simulator
from sim.results.columns import ColumnTable
from sim.results.summary import SUMMARY_ITERATION_COLUMNS, _nan_sum, build_result, summarize
from sim.setup.config import SimConfig


def _json(summary: dict) -> str:
    return json.dumps(summary, sort_keys=True, allow_nan=True)


@pytest.mark.parametrize("overrides", [{}, {"policy": "paged"}, {"policy": "static"},
                                       {"memory_util_frac": 0.13, "preemption": "swap", "host_swap_bytes": 2 << 30},
                                       {"memory_util_frac": 0.13}])
def test_streamed_result_without_pandas_equals_the_frame_path(tmp_path, overrides):
    config = SimConfig(**overrides)
    trace, _ = traces.clip_context(traces.synthetic_default(3, num_requests=400), config.slot_max_tokens)
    trace = traces.scale_rate(trace, 8.0)
    output = Simulator(config, trace, records_path=str(tmp_path / "iterations.parquet")).run()
    result = build_result(output, config.to_dict())
    assert isinstance(result._requests, ColumnTable)
    if "memory_util_frac" in overrides:
        assert result.summary["preemptions"] > 0
    frame = output.requests_frame()
    kept = pd.DataFrame({name: output.recorder.column(name) for name in SUMMARY_ITERATION_COLUMNS})
    expected = summarize(frame, kept, output.counters, config.to_dict(), output.recorder.summary_figures())
    assert _json(result.summary) == _json(expected)
    write_run(result, tmp_path)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "requests.parquet"), frame, check_exact=True)
    frame.to_parquet(tmp_path / "pandas.parquet", index=False)
    ours, theirs = pq.read_table(tmp_path / "requests.parquet"), pq.read_table(tmp_path / "pandas.parquet")
    assert ours.schema.equals(theirs.schema, check_metadata=False) and ours.equals(theirs)
    pd.testing.assert_frame_equal(result.requests, frame, check_exact=True)     # made a DataFrame on access


def test_request_table_declines_other_types():
    """A None, an all-int float column or extra request columns: None (the DataFrame path builds those)."""
    record = (0, 1.5, 10, 5, 2.0, 3.0, 0.5, 0.25, 1.5, 0, 1, "finished", 0, 1.5, 0.0, 0, 0, "")
    output = SimOutput([record, record], recorder=None, counters={})
    assert output.request_table() is not None
    assert SimOutput([record, record[:4] + (None,) + record[5:]], None, {}).request_table() is None
    ints = record[:1] + (1,) + record[2:]
    assert SimOutput([ints, ints], None, {}).request_table() is None             # pandas: int64 arrivals
    assert SimOutput([record], None, {}, extra_request_columns={"x": [1]}).request_table() is None


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(st.floats(min_value=-1e15, max_value=1e15), st.just(math.nan)),
                max_size=300))
def test_nan_sum_is_pandas_sum(values):
    array = np.array(values, dtype=np.float64)
    ours, theirs = _nan_sum(array), float(pd.Series(array, dtype=np.float64).sum())
    assert ours == theirs or (math.isnan(ours) and math.isnan(theirs))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.floats(min_value=-1e12, max_value=1e12, allow_nan=False),
                          st.sampled_from([0.0, -0.0, 1.5, 2.5, 1e-300])), min_size=1, max_size=200))
def test_percentiles_are_numpys(values):
    """The summary's percentiles from one sort equal ``np.percentile``'s, bit for bit (zeros included)."""
    from sim.results.summary import _linear_percentiles
    finite = np.array(values, dtype=np.float64)
    ours = _linear_percentiles(finite, (50, 90, 99))
    theirs = [np.percentile(finite, q) for q in (50, 90, 99)]
    assert [np.float64(v).tobytes() for v in ours] == [np.float64(v).tobytes() for v in theirs]
