"""Multi-replica routing: exact round-robin split, co-simulated least-outstanding routing, merged records."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import traces
from sim.routing import round_robin, run_routed, split_trace
from sim.runner import run_simulation
from sim.config import SimConfig


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
    with pytest.raises(ValueError, match="choose one of round-robin, least-outstanding"):
        run_routed(SimConfig(), traces.synthetic_default(0, num_requests=5), 2, "random")
