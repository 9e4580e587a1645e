"""Multi-replica routing: exact round-robin split, co-simulated least-outstanding routing, merged records."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import traces
from sim.cluster.routing import round_robin, run_routed, split_trace
from sim.core.runner import run_simulation
from sim.setup.config import SimConfig


@pytest.fixture(scope="module")
def workload():
    return traces.synthetic_default(0, num_requests=60)


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
