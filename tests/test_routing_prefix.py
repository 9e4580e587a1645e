"""Cache-aware routers (sim.cluster.routers_prefix): a repeated prefix goes to the replica that holds it."""
import numpy as np
import pytest

from sim.setup.config import SimConfig
from sim.memory.tiers import parse_kv_tier
from sim.cluster.routers_prefix import parse_routing
from sim.cluster.routing import run_routed
from tests.helpers import trace


def _trace():
    """Request 0 = blocks [1..4], request 1 = [11..14], request 2 repeats request 1 (each 2,048 prompt tokens,
    1 s apart: every request is finished before the next arrives, so loads are equal and only the cache differs)."""
    frame = trace([(0.0, 2048, 2), (1.0, 2048, 2), (2.0, 2048, 2)])
    frame["hash_ids"] = [[1, 2, 3, 4], [11, 12, 13, 14], [11, 12, 13, 14]]
    return frame


@pytest.mark.parametrize("routing, expected", [
    ("round-robin", [0, 1, 0]),
    ("prefix-aware", [0, 1, 1]),                       # replica 1 holds [11..14]'s pages (exact state)
    ("prefix-approx", [0, 1, 1]),                      # the router sent [11..14] to replica 1 (its record)
    ("prefix-aware:overlap_weight=0", [0, 1, 0]),      # no overlap term: ties go to fewer requests, then index
])
def test_a_repeated_prefix_goes_to_the_replica_that_holds_it(routing, expected):
    """Requests 0 and 1 tie (nothing cached, no load): replica 0 then replica 1 (fewer requests so far). Request 2
    repeats request 1's prompt: cost = (2,048 - overlap) / 512 on replica 1 (overlap 1,024: one 1,024-token page
    under the prompt - 1 cap; the approximate record: 4 blocks = 2,048) against 2,048 / 512 on replica 0."""
    run = run_routed(SimConfig(prefix_caching=True), _trace(), 2, routing)
    assert run.assignment.tolist() == expected
    if routing == "prefix-aware":
        # served there: page 0 shared plus 1,023 tokens of page 1 copied on write (vAttention), 2,047 = prompt - 1
        assert run.requests.set_index("request_id").loc[2, "prefix_hit_tokens"] == 2047


def test_prefix_aware_counts_tier_pages_and_sums_tier_figures():
    """With a DRAM tier the merged summary carries the replicas' tier counters, summed."""
    config = SimConfig(prefix_caching=True, kv_tiers=(parse_kv_tier("dram:1GiB"),))
    run = run_routed(config, _trace(), 2, "prefix-aware")
    assert run.assignment.tolist() == [0, 1, 1]
    assert run.summary["tier_dram_capacity_bytes"] == 2 * 2**30
    assert "tier_dram_hit_ratio" in run.summary and run.summary["prefix_hit_ratio"] == pytest.approx(2047 / 6144)


@pytest.mark.parametrize("spec, message", [
    ("prefix-aware:weight=1", "unknown key 'weight'"),
    ("prefix-aware:overlap_weight=x", "not a number"),
    ("prefix-approx:ttl_s=-1", ">= 0"),
    ("round-robin:overlap_weight=1", "takes no parameters"),
])
def test_bad_routing_specs_are_refused_by_name(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_routing(spec)


def test_parse_routing_reads_the_weights():
    assert parse_routing("prefix-aware:overlap_weight=2,load_weight=0.5") == (
        "prefix-aware", {"overlap_weight": 2.0, "load_weight": 0.5})
    assert parse_routing("round-robin") == ("round-robin", {})
    assert np.isfinite(parse_routing("prefix-approx:ttl_s=30")[1]["ttl_s"])
