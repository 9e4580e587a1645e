"""Multi-replica routing: exact round-robin split, least-outstanding replay, merged records."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import traces
from analysis.routing import least_outstanding, round_robin, run_routed, split_trace
from analysis.runner import run_simulation
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


def test_least_outstanding_replay_by_hand():
    arrival_us = np.array([0.0, 1.0, 2.0, 3.0, 10.0])
    completion_us = np.array([5.0, 2.0, 20.0, 4.0, 11.0])
    # t=0: both empty -> 0; t=1: r0 has 1 -> 1; t=2: r1's request done at 2 -> r1 (0 vs 1 outstanding, r1 has
    # 1 assigned = r0's 1, r1 0 outstanding) ; t=3: r0 1, r1 1 -> fewer assigned: r0 (1) vs r1 (2) -> 0;
    # t=10: r0 empty, r1 holds 20 -> 0
    assert least_outstanding(arrival_us, completion_us, 2).tolist() == [0, 1, 1, 0, 0]


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


def test_least_outstanding_run_is_valid_and_reports_its_exact_prefix(workload):
    routed = run_routed(SimConfig(), traces.scale_rate(workload, 20.0), 3, "least-outstanding", max_passes=3)
    assert set(np.unique(routed.assignment)) <= {0, 1, 2} and routed.summary["finished"] == 60
    assert 0 <= routed.exact_share <= 1 and 1 <= routed.passes <= 3
    with pytest.raises(ValueError, match="choose one of round-robin, least-outstanding"):
        run_routed(SimConfig(), workload, 2, "random")
