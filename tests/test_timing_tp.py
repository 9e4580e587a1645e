"""Tensor-parallel all-reduces with NCCL's latency (issue 31, item 3): hand-computed from NCCL's cost model
(``src/graph/tuning.cc`` constants in sim.timing.compute) and nccl-tests' bus-bandwidth definition."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from sim.setup.catalog import get_gpu, get_model
from sim.timing.compute import RooflineComputeModel, decode_batch, nccl_allreduce_us


def test_small_all_reduce_costs_ncclss_ring_ll_latency():
    """16 KiB over 2 NVLink GPUs: ring LL = 3.6 + 2 x 0.47 us + 16384 B / (450 GB/s / 4 x 2 / 2) = 4.6856 us,
    below tree LL (4.4 + 1.04 + 16384 / 14,474 B/us = 6.57) and both Simple variants (>= 15.2 us)."""
    assert nccl_allreduce_us(16384, 2, 450e9, True) == pytest.approx(3.6 + 0.94 + 16384 / 112_500)


def test_large_all_reduce_is_the_ring_at_the_bus_bandwidth():
    """1 GB over 8 GPUs: ring Simple, 8.4 + 14 x 3.4 us + 2 (n-1)/n x bytes / busbw (nccl-tests busbw)."""
    expected = 8.4 + 14 * 3.4 + 1e9 * (2 * 7 / 8) / 450e3
    assert nccl_allreduce_us(1e9, 8, 450e9, True) == pytest.approx(expected)


def test_pcie_steps_cost_more_than_nvlink_steps():
    assert nccl_allreduce_us(4096, 4, 32e9, False) > nccl_allreduce_us(4096, 4, 32e9, True)
    assert nccl_allreduce_us(4096, 4, 32e9, False) == pytest.approx(3.6 + 6 * 1.0 + 4096 / (8e3 * 4 / 6))


@settings(max_examples=60, deadline=None)
@given(st.floats(1, 1e9), st.floats(1, 1e9), st.integers(2, 8))
def test_all_reduce_time_grows_with_bytes_and_exceeds_the_bandwidth_bound(a, b, ranks):
    small, large = sorted((a, b))
    assert nccl_allreduce_us(small, ranks, 450e9, True) <= nccl_allreduce_us(large, ranks, 450e9, True)
    assert nccl_allreduce_us(large, ranks, 450e9, True) >= 2 * (ranks - 1) / ranks * large / 450e3


def test_bad_all_reduce_arguments_are_refused():
    with pytest.raises(ValueError, match="ranks >= 2"):
        nccl_allreduce_us(1, 1, 450e9, True)


def test_the_roofline_charges_two_all_reduces_per_layer_and_none_at_tp1():
    model, gpu = get_model("llama-3-8b"), get_gpu("h100")
    batch = decode_batch(32, 1024)
    tp1 = RooflineComputeModel(model, gpu, 1)
    assert tp1._comm_us(32) == 0.0
    tp2 = RooflineComputeModel(model, gpu, 2)
    assert tp2._comm_us(32) == pytest.approx(2 * 32 * nccl_allreduce_us(32 * 4096 * 2, 2, 450e9, True))
    # the per-collective latency is what grows with TP at small batches: 64 all-reduces of >= 4.5 us each
    assert tp2._comm_us(1) >= 64 * 4.5
    assert tp2.iteration_us(batch) > tp2._time_us(32, batch.attention_pairs, batch.kv_read_tokens, 32, max, 0.0) - tp2._comm_us(32)


def test_a_pcie_gpu_uses_pcie_latencies():
    model = get_model("llama-3-8b")
    l40s = RooflineComputeModel(model, get_gpu("l40s"), 2)
    assert l40s._comm_us(8) == pytest.approx(2 * 32 * nccl_allreduce_us(8 * 4096 * 2, 2, 32e9, False))
