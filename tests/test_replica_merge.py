"""The bounded-memory replica merge (sim.cluster.replica_merge): exact order statistics across sorted arrays, numpy's
percentile and pairwise sum reproduced bit for bit, and the merged summary of replicas simulated to files equal
to the in-memory merge's."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

import traces
from sim.setup.config import SimConfig
from sim.cluster.replica_merge import Concatenation, kth_smallest, linear_percentile, pairwise_sum
from sim.cluster.routing import run_routed
from tests.test_routing import TRACE_FORMATS, trace_of_format, write_mooncake

# few distinct values (ties across and within arrays), wide magnitudes, zeros of both signs and infinities
_values = st.one_of(st.sampled_from([0.0, -0.0, 1.0, 2.5, -3.0, 1e-300, math.inf, -math.inf]),
                    st.floats(allow_nan=False, width=64))
_arrays = st.lists(st.lists(_values, max_size=30), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(_arrays, st.data())
def test_kth_smallest_across_sorted_arrays_equals_sorting_the_union(arrays, data):
    arrays = [np.sort(np.array(a, dtype=float)) for a in arrays]
    union = np.sort(np.concatenate(arrays))
    if not len(union):
        with pytest.raises(ValueError):
            kth_smallest(arrays, 1)
        return
    k = data.draw(st.integers(1, len(union)))
    assert kth_smallest(arrays, k) == union[k - 1]
    with pytest.raises(ValueError):
        kth_smallest(arrays, len(union) + 1)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.tuples(st.floats(-1e300, 1e300) | st.sampled_from([0.0, -0.0, 1.0, 2.5]),
                                    st.integers(0, 5)), max_size=20), min_size=1, max_size=5),
       st.sampled_from([50, 90, 99]))
def test_weighted_kth_smallest_is_the_nearest_rank_of_tbt_stats(pairs, q):
    """With weights (cumulative per distinct value, as a replica stores its TBT gaps), the k-th smallest is
    the token-weighted nearest rank of sim.results.records.tbt_stats_us: the smallest value whose cumulative weight
    reaches q / 100 of the total."""
    from sim.results.records import tbt_stats_us

    arrays, cumulative = [], []
    for replica in pairs:
        values = np.array([v for v, _ in replica], dtype=float)
        weights = np.array([w for _, w in replica], dtype=np.int64)
        order = np.argsort(values, kind="stable")
        values, weights = values[order], weights[order]
        starts = np.flatnonzero(np.concatenate([[True], values[1:] != values[:-1]])) if len(values) else []
        arrays.append(values[starts] if len(values) else values)
        cumulative.append(np.cumsum(np.add.reduceat(weights, starts)) if len(values) else weights)
    all_values = np.concatenate([np.array([v for v, _ in r], dtype=float) for r in pairs])
    all_weights = np.concatenate([np.array([w for _, w in r], dtype=np.int64) for r in pairs])
    total = int(all_weights.sum())
    if not total:
        return
    expected = tbt_stats_us([], [(all_values, all_weights)])[f"tbt_p{q}_us"]
    assert kth_smallest(arrays, max(1, math.ceil(q / 100 * total)), cumulative) == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=64, min_value=-1e300, max_value=1e300),
                min_size=1, max_size=60),
       st.sampled_from([50, 90, 99, 0, 100, 37.5]))
def test_linear_percentile_is_numpys_bit_for_bit(values, q):
    ordered = np.sort(np.array(values, dtype=float))
    got = linear_percentile(len(ordered), q, lambda i: ordered[i])
    expected = float(np.percentile(np.array(values, dtype=float), q))
    assert got == expected or (math.isnan(got) and math.isnan(expected))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 3000), min_size=1, max_size=5), st.integers(0, 2**32 - 1),
       st.sampled_from([1, 128, 136, 1000]))
def test_pairwise_sum_over_a_concatenation_is_numpys_sum(lengths, seed, leaf):
    rng = np.random.default_rng(seed)
    parts = [rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n) for n in lengths]
    whole = np.concatenate(parts)
    column = Concatenation([lambda p=p: p for p in parts], lengths)
    total = pairwise_sum(column.length, column.take, leaf=leaf)
    assert total == float(np.sum(whole))
    if len(whole):
        assert np.float64(total) / len(whole) == whole.mean()


@pytest.mark.parametrize("fmt, num_requests", [("synthetic", 240), ("mooncake", 60)])
@pytest.mark.parametrize("config, routing, replicas", [
    (SimConfig(), "round-robin", 3),
    (SimConfig(memory_util_frac=0.2, sync_mapping=True), "random", 4),
    (SimConfig(policy="paged", memory_util_frac=0.15, preemption="swap"), "session-hash", 2),
    (SimConfig(policy="static", max_len_tokens=2048), "round-robin", 3),
])
def test_bounded_merge_equals_the_in_memory_merge(tmp_path, config, routing, replicas, fmt, num_requests):
    """Replicas simulated to files and merged with bounded memory give exactly the in-memory merge's summary
    (every key, same order, same types) and request table; the mix covers stalls, preemptions, swaps and
    rejected requests, for a synthetic table and a Mooncake file (``hash_ids``, which keep its rows in the job)."""
    trace = traces.scale_rate(trace_of_format(fmt, tmp_path, num_requests), 40.0 * num_requests / 240)
    trace, _ = traces.clip_context(trace, 8192)
    in_memory = run_routed(config, trace, replicas, routing)
    on_disk = run_routed(config, trace, replicas, routing, records_dir=str(tmp_path), workers=2)
    assert all(r is None or r.parts is not None for r in on_disk.replicas)
    assert list(on_disk.summary) == list(in_memory.summary)
    for key, value in in_memory.summary.items():
        other = on_disk.summary[key]
        assert type(other) is type(value), key
        assert other == value or (isinstance(value, float) and math.isnan(value) and math.isnan(other)), key
    pd.testing.assert_frame_equal(on_disk.requests, in_memory.requests)
    if config.policy == "static":
        assert in_memory.summary["rejected"] > 0 and in_memory.summary["rejected_by_reason"]


@pytest.mark.parametrize("fmt", TRACE_FORMATS)
def test_simulate_replicas_writes_the_merged_tables_in_windows(tmp_path, capsys, monkeypatch, fmt):
    """``kvsim simulate --replicas`` writes the merged request table window by window (forced small here) and
    the iteration table row group by row group: the same values as merging the replicas in memory, and
    ``load_run`` reads the requests when first used; the synthetic workload, or a Mooncake file."""
    import json

    import sim.cluster.replica_merge as replica_merge
    from analysis.results import load_run
    from cli import main

    windowed = replica_merge.write_merged_requests
    monkeypatch.setattr(replica_merge, "write_merged_requests", lambda results, path: windowed(results, path, 7))
    out = tmp_path / "run"
    source = [] if fmt == "synthetic" else ["--trace", str(write_mooncake(tmp_path / "mooncake.jsonl", 90, 3))]
    assert main(["simulate", "--out", str(out), "--num-requests", "90", "--replicas", "3", "--workers", "2",
                 "--routing", "random", "--seed", "3", *source]) == 0
    run = load_run(out)
    assert isinstance(run._requests, type(out))          # not read yet
    trace = traces.synthetic_default(3, num_requests=90) if fmt == "synthetic" else traces.clip_context(
        traces.load_trace(tmp_path / "mooncake.jsonl"), SimConfig().slot_max_tokens)[0]
    config = SimConfig(seed=3)
    in_memory = run_routed(config, trace, 3, "random")
    pd.testing.assert_frame_equal(run.requests, in_memory.requests)
    expected = pd.concat([r.iterations.assign(replica=i) for i, r in enumerate(in_memory.replicas) if r is not None],
                         ignore_index=True)
    pd.testing.assert_frame_equal(run.iterations, expected)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] == 90 and summary["replicas"] == 3
    assert not (out / ".replicas").exists()


def test_a_merge_of_some_replicas_equals_the_in_memory_merge_of_them(tmp_path):
    """Request ids need not be 0..n-1 over the merged replicas (``bench_week.py --merge-only`` of a run still
    going): rows go to their rank among the ids."""
    from sim.cluster.routing import merge_replicas, merged_summary

    trace = traces.scale_rate(traces.synthetic_default(0, num_requests=120), 40.0)
    config = SimConfig()
    in_memory = run_routed(config, trace, 3, "round-robin").replicas
    on_disk = run_routed(config, trace, 3, "round-robin", records_dir=str(tmp_path)).replicas
    in_memory[1] = on_disk[1] = None
    expected = merge_replicas(in_memory, config)[1]
    assert merged_summary(on_disk, config) == expected and expected["requests"] == 80


def test_a_prefix_caching_merge_on_disk_keeps_the_hit_ratio(tmp_path):
    """Replicas with a prefix cache, simulated to files (round-robin): the merged summary has the prefix cache's
    hit ratio and counters, equal to the in-memory merge's (the files path left the ratio out, so the summary
    printed no prefix-cache line)."""
    from sim.cluster.routing import merge_replicas, merged_summary
    from tests.test_routing import write_mooncake

    trace = traces.load_trace(write_mooncake(tmp_path / "mc.jsonl", 60))
    config = SimConfig(policy="vattention", prefix_caching=True)
    in_memory = run_routed(config, trace, 2, "round-robin").replicas
    on_disk = run_routed(config, trace, 2, "round-robin", records_dir=str(tmp_path / "records")).replicas
    expected = merge_replicas(in_memory, config)[1]
    merged = merged_summary(on_disk, config)
    assert merged == expected and 0 < merged["prefix_hit_ratio"] < 1 and merged["prefill_tokens_saved"] > 0


def test_a_streamed_runs_summary_equals_the_in_memory_runs(tmp_path, monkeypatch):
    """A streamed run's summary reads its iteration columns row group by row group (sim.results.columns): the same
    summary, to the bit, as the run kept in memory; row groups of 50 iterations here."""
    from sim.results.recorder import IterationRecorder
    from sim.core.runner import run_simulation

    original = IterationRecorder.__init__      # (its defaults cannot be patched: the module may be compiled)
    monkeypatch.setattr(IterationRecorder, "__init__",
                        lambda self, path=None, chunk_iterations=None: original(self, path, 50))
    trace, _ = traces.clip_context(traces.scale_rate(traces.synthetic_default(0, num_requests=150), 30.0), 8192)
    config = SimConfig(memory_util_frac=0.2, sync_mapping=True)
    in_memory = run_simulation(config, trace).summary
    streamed = run_simulation(config, trace, records_path=str(tmp_path / "it.parquet"))
    import pyarrow.parquet as pq
    assert pq.ParquetFile(streamed.iterations_file).num_row_groups > 10
    assert streamed.summary == in_memory and in_memory["iterations_with_stall"] > 0


def test_keeping_only_the_merged_columns_gives_the_same_summary(tmp_path):
    """``keep_iterations=False`` (bench_week.py --summary-columns-only) keeps two columns of each replica's
    iteration records: the same merged summary."""
    from sim.cluster.routing import assign, merged_summary, simulate_replicas

    trace = traces.scale_rate(traces.synthetic_default(0, num_requests=120), 40.0)
    config = SimConfig(memory_util_frac=0.2, sync_mapping=True)
    expected = run_routed(config, trace, 3, "round-robin").summary
    results = simulate_replicas(config, trace, assign(trace, 3, "round-robin"), 3, records_dir=str(tmp_path),
                                keep_iterations=False)
    assert merged_summary(results, config) == expected
    assert sorted(p.name for p in tmp_path.glob("*.parquet") if "columns" not in p.name and "requests" not in p.name) == []


@pytest.mark.parametrize("fmt", TRACE_FORMATS)
def test_a_stopped_run_resumes_from_its_records(tmp_path, monkeypatch, fmt):
    """``resume``: replicas with a complete record (``parts.json``) are read back, the others simulated; the
    merged summary equals one uninterrupted run. A record of another seed is refused, naming its file; so is
    one of other trace rows (by :func:`sim.cluster.routing.trace_digest`, which covers a Mooncake trace's ``hash_ids``)."""
    from sim.cluster import routing
    from sim.cluster.routing import assign, merged_summary, simulate_replicas

    trace = traces.scale_rate(trace_of_format(fmt, tmp_path, 90), 40.0)
    config = SimConfig(memory_util_frac=0.2)
    assignment = assign(trace, 3, "round-robin")
    expected = merged_summary(simulate_replicas(config, trace, assignment, 3, records_dir=str(tmp_path / "a")), config)
    records = tmp_path / "b"
    simulate_replicas(config, trace, assignment, 3, records_dir=str(records))
    (records / "replica-1.parts.json").unlink()        # replica 1 was stopped before its record was complete
    simulated = []
    original = routing._simulate_replica
    monkeypatch.setattr(routing, "_simulate_replica", lambda job: simulated.append(job) or original(job))
    results = simulate_replicas(config, trace, assignment, 3, records_dir=str(records), resume=True)
    assert [job is None for job in simulated] == [True, False, True]
    assert merged_summary(results, config) == expected
    with pytest.raises(ValueError, match=r"replica-0\.parts\.json: a record of another run \(seed 0"):
        simulate_replicas(SimConfig(memory_util_frac=0.2, seed=5), trace, assignment, 3, records_dir=str(records),
                          resume=True)
    other = trace.assign(prompt_tokens=trace["prompt_tokens"] + 1)    # same seed and counts, other rows
    with pytest.raises(ValueError, match=r"replica-0\.parts\.json: a record of another run \(seed 0, trace rows"):
        simulate_replicas(config, other, assignment, 3, records_dir=str(records), resume=True)
    if fmt == "mooncake":       # one prefix-block id of replica 0's first request changed: other rows
        ids = [list(i) for i in trace["hash_ids"]]
        ids[0][-1] += 10**6
        with pytest.raises(ValueError, match=r"replica-0\.parts\.json: a record of another run \(seed 0, trace rows"):
            simulate_replicas(config, trace.assign(hash_ids=ids), assignment, 3, records_dir=str(records), resume=True)
    (records / "replica-2.parts.json").write_text('{"parts": ')     # cut short: refused, naming the file
    with pytest.raises(ValueError, match=r"replica-2\.parts\.json: not a complete replica record"):
        simulate_replicas(config, trace, assignment, 3, records_dir=str(records), resume=True)


def test_a_records_directory_moves_and_damaged_records_are_named(tmp_path):
    """Records name their files relative to their directory (a moved directory resumes); a missing or cut file
    is refused with the record and file named."""
    import shutil

    from sim.cluster.routing import assign, merged_summary, simulate_replicas

    trace = traces.scale_rate(traces.synthetic_default(0, num_requests=60), 40.0)
    config = SimConfig(memory_util_frac=0.2)
    assignment = assign(trace, 2, "round-robin")
    first = tmp_path / "first"
    expected = merged_summary(simulate_replicas(config, trace, assignment, 2, records_dir=str(first)), config)
    moved = tmp_path / "moved"
    shutil.move(first, moved)
    results = simulate_replicas(config, trace, assignment, 2, records_dir=str(moved), resume=True)
    assert merged_summary(results, config) == expected
    (moved / "replica-1.duration-values.npy").write_bytes(b"\x93NUMPY")          # cut short
    with pytest.raises(ValueError, match=r"replica-1\.parts\.json: its file .*replica-1\.duration-values\.npy cannot"):
        simulate_replicas(config, trace, assignment, 2, records_dir=str(moved), resume=True)
    (moved / "replica-0.requests.parquet").unlink()
    with pytest.raises(ValueError, match=r"replica-0\.parts\.json: its file .*replica-0\.requests\.parquet cannot"):
        simulate_replicas(config, trace, assignment, 2, records_dir=str(moved), resume=True)
