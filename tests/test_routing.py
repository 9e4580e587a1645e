"""Multi-replica routing: exact round-robin split, co-simulated least-outstanding routing, merged records."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import traces
from sim.cluster.routing import round_robin, run_routed, split_trace
from sim.core.runner import run_simulation
from sim.setup.config import SimConfig


TRACE_FORMATS = ("synthetic", "mooncake")


def write_mooncake(path, num_requests: int, seed: int = 0):
    """A small Mooncake JSONL trace (with ``hash_ids``) at ``path``: the lengths and arrivals (whole ms) of
    ``traces.synthetic_default(seed, num_requests)``; request i belongs to conversation ``i mod 4``, whose
    requests share their first two 512-token blocks (ids ``10 * conversation + j``), the rest unique."""
    import json

    rows, next_id = traces.synthetic_default(seed, num_requests=num_requests), 1000
    with open(path, "w") as fh:
        for i, (arrival_s, prompt, output) in enumerate(zip(rows["arrival_s"], rows["prompt_tokens"],
                                                            rows["output_tokens"])):
            blocks = -(-int(prompt) // 512)
            shared = [10 * (i % 4) + j for j in range(min(2, blocks))]
            ids = shared + list(range(next_id, next_id + blocks - len(shared)))
            next_id += blocks - len(shared)
            fh.write(json.dumps({"timestamp": round(float(arrival_s) * 1000), "input_length": int(prompt),
                                 "output_length": int(output), "hash_ids": ids}) + "\n")
    return path


def trace_of_format(fmt: str, directory, num_requests: int, seed: int = 0):
    """The canonical table of ``num_requests`` requests in trace format ``fmt`` (one of ``TRACE_FORMATS``):
    the synthetic generator's table, or a Mooncake file written by :func:`write_mooncake` and read back."""
    if fmt == "synthetic":
        return traces.synthetic_default(seed, num_requests=num_requests)
    return traces.load_trace(write_mooncake(f"{directory}/mooncake-{num_requests}-{seed}.jsonl", num_requests, seed))


@pytest.fixture(scope="module", params=TRACE_FORMATS)
def workload(request, tmp_path_factory):
    return trace_of_format(request.param, tmp_path_factory.mktemp("traces"), 60)


def test_round_robin_splits_exactly(workload):
    assignment = round_robin(len(workload), 3)
    assert list(assignment[:7]) == [0, 1, 2, 0, 1, 2, 0]
    parts = split_trace(workload, assignment, 3)
    assert [len(p) for p in parts] == [20, 20, 20]
    assert list(parts[1]["request_id"]) == list(range(1, 60, 3))
    assert parts[2]["arrival_s"].tolist() == workload["arrival_s"].iloc[2::3].tolist()


def test_one_replica_equals_a_plain_run(workload):
    config = SimConfig()
    routed = run_routed(config, workload, 1)
    plain = run_simulation(config, workload).requests
    pd.testing.assert_frame_equal(routed.requests.drop(columns="replica"), plain)


def test_round_robin_run_merges_every_request_once(workload):
    routed = run_routed(SimConfig(), traces.scale_rate(workload, 20.0), 3)
    assert routed.requests["request_id"].tolist() == list(range(60))
    assert (routed.requests["replica"].to_numpy() == np.arange(60) % 3).all()
    assert routed.summary["finished"] == 60 and routed.summary["replicas"] == 3


def test_least_outstanding_picks_the_replica_with_fewest_outstanding(workload):
    """Recount, from the merged records, each replica's outstanding requests (assigned earlier, not yet
    completed) at every arrival: the router's choice is always a minimum, ties broken by fewer requests
    assigned so far, then the lower index."""
    trace = traces.scale_rate(workload, 20.0)
    routed = run_routed(SimConfig(), trace, 3, "least-outstanding")
    req = routed.requests.set_index("request_id")
    arrivals, completions = req["arrival_at_us"].to_numpy(), req["completion_at_us"].to_numpy()
    assigned = [0, 0, 0]
    for i, choice in enumerate(routed.assignment):
        earlier = np.arange(i)
        outstanding = [int(np.sum((routed.assignment[earlier] == r) & ~(completions[earlier] <= arrivals[i])))
                       for r in range(3)]
        best = min(range(3), key=lambda r: (outstanding[r], assigned[r], r))
        assert choice == best, (i, outstanding, assigned)
        assigned[choice] += 1
    assert routed.summary["finished"] == 60 and len(set(routed.assignment)) == 3


def test_least_outstanding_one_replica_equals_a_plain_run(workload):
    """Co-simulated with arrivals pushed by the router, one replica gives the plain run's records."""
    config = SimConfig()
    routed = run_routed(config, workload, 1, "least-outstanding")
    plain = run_simulation(config, workload).requests
    pd.testing.assert_frame_equal(routed.requests.drop(columns="replica"), plain)


def test_unknown_routing():
    with pytest.raises(ValueError, match="choose one of round-robin, random, session-hash, least-outstanding"):
        run_routed(SimConfig(), traces.synthetic_default(0, num_requests=5), 2, "weighted")


@pytest.mark.parametrize("routing", ["round-robin", "random", "session-hash"])
def test_state_free_routers_split_equals_co_simulation(workload, routing):
    """A state-free router's replicas simulated apart (split trace) give exactly the records of the same
    assignment co-simulated in one SimPy environment with a router submitting each request at its arrival."""
    from sim.cluster.routing import assign, co_simulate_least_outstanding, merge_replicas

    trace = traces.scale_rate(workload, 20.0)
    config = SimConfig()
    split = run_routed(config, trace, 3, routing, workers=2)
    assignment = assign(trace, 3, routing, config.seed)
    assert np.array_equal(split.assignment, assignment)
    _, results = co_simulate_least_outstanding(config, trace, 3, assignment=assignment)
    co_requests, co_summary = merge_replicas(results, config)
    pd.testing.assert_frame_equal(split.requests, co_requests)
    assert split.summary["tbt_p99_ms"] == co_summary["tbt_p99_ms"] and split.summary["finished"] == 60


def test_session_hash_keeps_sessions_together_and_random_is_seeded():
    from sim.cluster.routing import random_assignment, session_hash

    trace = pd.DataFrame({"request_id": range(8), "session_id": ["a", "b", "a", "c", "b", "a", "d", "c"]})
    replica = session_hash(trace, 3)
    for session in "abcd":
        assert len(set(replica[trace["session_id"] == session])) == 1
    assert np.array_equal(random_assignment(100, 4, 7), random_assignment(100, 4, 7))
    assert not np.array_equal(random_assignment(100, 4, 7), random_assignment(100, 4, 8))
    assert set(random_assignment(1000, 4, 7)) == {0, 1, 2, 3}


def test_replicas_streamed_to_files_merge_like_in_memory(workload, tmp_path):
    trace = traces.scale_rate(workload, 20.0)
    in_memory = run_routed(SimConfig(), trace, 2, "round-robin")
    streamed = run_routed(SimConfig(), trace, 2, "round-robin", records_dir=str(tmp_path))
    pd.testing.assert_frame_equal(in_memory.requests, streamed.requests)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"replica-{r}{suffix}" for r in (0, 1) for suffix in (".parquet", ".requests.parquet", ".duration-values.npy", ".duration-cum.npy",
                                                             ".tbt-gaps.npy", ".tbt-cum.npy", ".parts.json"))
    assert in_memory.summary == streamed.summary


def test_session_hash_warns_when_keys_are_fewer_than_replicas():
    from sim.cluster.routing import session_key_note

    shared = pd.DataFrame({"request_id": range(5), "hash_ids": [[0, 1], [0, 2], [0], [0, 5], [0, 9]]})
    assert "1 distinct session key(s) (hash_ids[0]" in session_key_note(shared, 4)
    assert session_key_note(pd.DataFrame({"request_id": range(5)}), 4) is None     # request ids: 5 keys


def test_trace_digest_covers_hash_ids_and_is_stable(tmp_path):
    """A Mooncake replica's rows digest (they used to raise TypeError: unhashable type: 'list'): the same rows give
    the same digest whether ``hash_ids`` hold lists (JSONL) or arrays (Parquet); one block id changed, or two
    swapped, gives another; a trace of scalar columns keeps the digest of before (sha1 of pandas' row hashes)."""
    import hashlib

    from sim.cluster.routing import trace_digest

    rows = trace_of_format("mooncake", tmp_path, 12)
    digest = trace_digest(rows)
    assert len(digest) == 16 and trace_digest(rows.copy()) == digest
    assert trace_digest(rows.assign(hash_ids=[np.array(ids, dtype=np.int64) for ids in rows["hash_ids"]])) == digest
    k = next(i for i, ids in enumerate(rows["hash_ids"]) if len(ids) >= 2)
    changed = [list(ids) for ids in rows["hash_ids"]]
    changed[k][-1] += 1
    assert trace_digest(rows.assign(hash_ids=changed)) != digest
    swapped = [list(ids) for ids in rows["hash_ids"]]
    swapped[k][0], swapped[k][1] = swapped[k][1], swapped[k][0]
    assert trace_digest(rows.assign(hash_ids=swapped)) != digest
    plain = rows.drop(columns="hash_ids")
    before = hashlib.sha1(pd.util.hash_pandas_object(plain, index=False).to_numpy().tobytes()
                          + ",".join(plain.columns).encode()).hexdigest()[:16]
    assert trace_digest(plain) == before


@pytest.mark.parametrize("routing, workers", [("round-robin", "1"), ("random", "2"), ("session-hash", "2")])
def test_cli_simulates_a_mooncake_trace_over_replicas(tmp_path, capsys, routing, workers):
    """``kvsim simulate --trace mooncake.jsonl --replicas 2`` with a state-free router (issue 28, item 12),
    in process and on a local process pool: every request finishes once, as the in-memory routed run."""
    import json

    from cli import main

    path = write_mooncake(tmp_path / "mooncake.jsonl", 40)
    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(path), "--num-requests", "40", "--replicas", "2", "--routing", routing,
                 "--workers", workers, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    workload, _ = traces.clip_context(traces.load_trace(path), SimConfig().slot_max_tokens)   # as the CLI clips it
    expected = run_routed(SimConfig(), workload, 2, routing).summary
    assert summary["finished"] == expected["finished"] == 40
    assert summary["ttft_p99_ms"] == expected["ttft_p99_ms"]


def test_the_merged_peak_mapped_memory_adds_the_replicas_peaks_as_the_pool_adds_their_pools(workload):
    """Each replica has its own GPU: the deployment's pool is the replicas' pools summed, and so is its peak mapped
    memory (it had been the largest replica's, a third of the pool's scale; P/D sums both already)."""
    config = SimConfig()
    trace = traces.scale_rate(workload, 20.0)
    routed = run_routed(config, trace, 3)
    singles = [run_simulation(config, part) for part in split_trace(trace, round_robin(len(trace), 3), 3)]
    assert routed.summary["pool_bytes"] == sum(s.summary["pool_bytes"] for s in singles)
    assert routed.summary["peak_mapped_bytes"] == sum(s.summary["peak_mapped_bytes"] for s in singles)
    assert routed.summary["peak_mapped_bytes"] > max(s.summary["peak_mapped_bytes"] for s in singles)
