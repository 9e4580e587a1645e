"""Per-layer and per-worker host overheads (issue 31 item 3, sim.timing.overheads): the eager launch floor per layer
(this repository's H200 harness: 9,323.7 us of launch per 32-layer Llama-3-8B forward) and Vidur's host cost per
tensor-parallel all-reduce (``nccl_cpu_launch_overhead_ms + skew x tp^1.25``); hand-computed values."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from sim.setup.catalog import get_gpu, get_model
from sim.timing.compute import BatchShape, ComputeFieldError, RooflineComputeModel, decode_batch
from sim.timing.overheads import (H200_EAGER_LAUNCH_US_PER_KERNEL, H200_EAGER_LAUNCH_US_PER_LAYER,
                                  VIDUR_NCCL_CPU_LAUNCH_US, collective_host_us)
from sim.timing.pipeline import PipelineComputeModel

LLAMA_8B, LLAMA_70B, H200 = get_model("llama-3-8b"), get_model("llama-3-70b"), get_gpu("h200")
MIXED = BatchShape(new_tokens=48 + 64, attention_pairs=48 * 1025 + 64 * 65 / 2, kv_read_tokens=48 * 1024,
                   logit_sequences=49, max_context_tokens=1025)


def test_sourced_figures_agree_with_the_harness_measurement():
    """9,323.7 us / 32 layers = 291.37 us a layer; at 20.7 us a kernel that is ~14 kernels a layer (~450 a
    forward, docs/validation/README.md)."""
    assert H200_EAGER_LAUNCH_US_PER_LAYER == pytest.approx(291.365625)
    assert 32 * H200_EAGER_LAUNCH_US_PER_LAYER / H200_EAGER_LAUNCH_US_PER_KERNEL == pytest.approx(450, rel=0.01)
    assert VIDUR_NCCL_CPU_LAUNCH_US == pytest.approx(20.0)


def test_defaults_change_nothing():
    """All three fields at 0 give the same floats as a model without them (the README runs' hashes rely on it)."""
    base = RooflineComputeModel(LLAMA_8B, H200, launch_floor_us=8000.0, decode_graphs=1.0)
    zero = RooflineComputeModel(LLAMA_8B, H200, launch_floor_us=8000.0, decode_graphs=1.0, launch_us_per_layer=0.0,
                                allreduce_launch_us=0.0, allreduce_skew_us=0.0)
    for batch in (decode_batch(16, 1024), MIXED):
        assert zero.iteration_us(batch) == base.iteration_us(batch)
    assert zero._eager_floor_us == 8000.0


def test_eager_decode_is_held_at_the_per_layer_floor():
    """An eager batch-16 decode of Llama-3-8B on the H200 has a roofline + 1.3 ms far below 9.3 ms, so it takes
    32 x 291.37 = 9,323.7 us: the harness's measured launch time."""
    model = RooflineComputeModel(LLAMA_8B, H200, launch_us_per_layer=H200_EAGER_LAUNCH_US_PER_LAYER)
    assert RooflineComputeModel(LLAMA_8B, H200).iteration_us(decode_batch(16, 1024)) < 9000
    assert model.iteration_us(decode_batch(16, 1024)) == pytest.approx(9323.7)


def test_the_floor_applies_only_to_iterations_that_are_not_graphed():
    graphed = RooflineComputeModel(LLAMA_8B, H200, decode_graphs=1.0)
    floored = RooflineComputeModel(LLAMA_8B, H200, decode_graphs=1.0, launch_us_per_layer=1000.0)
    assert floored.iteration_us(decode_batch(16, 1024)) == graphed.iteration_us(decode_batch(16, 1024))
    assert floored.iteration_us(MIXED) == pytest.approx(32_000.0)   # mixed: eager, 32 layers x 1 ms


def test_the_floor_grows_with_layers_not_with_tp_workers():
    """80 layers x 291.37 us = 23,309 us at tp 4 and at tp 8 (each worker launches its own kernels at once;
    at tp 1 the 140 GB of weights alone take longer than the floor)."""
    for tp in (4, 8):
        model = RooflineComputeModel(LLAMA_70B, H200, tp, launch_us_per_layer=H200_EAGER_LAUNCH_US_PER_LAYER)
        assert model._eager_floor_us == pytest.approx(80 * 291.365625)
        assert model.iteration_us(decode_batch(4, 512)) == pytest.approx(80 * 291.365625)


def test_the_thread_block_form_is_floored_too():
    """A profile's block form (``attention_key_us`` > 0) takes the same floor on its eager iterations."""
    model = RooflineComputeModel(LLAMA_8B, H200, attention_key_us=0.001, launch_us_per_layer=1000.0)
    assert model.iteration_us(decode_batch(16, 1024)) == pytest.approx(32_000.0)
    assert model.iteration_us_array(*(np.array([v]) for v in (16, 16 * 1025, 16 * 1024, 16)))[0] == pytest.approx(32_000.0)


def test_a_larger_launch_floor_wins():
    model = RooflineComputeModel(LLAMA_8B, H200, launch_floor_us=12_000.0, launch_us_per_layer=100.0)
    assert model.iteration_us(decode_batch(16, 1024)) == pytest.approx(12_000.0)


def test_pipeline_round_floor_is_micro_batches_times_stage_layers():
    """pp 2 splits 32 layers 16 + 16: one sequence is one micro-batch (16 x 1,000 us), 8 are two (32 x 1,000)."""
    model = PipelineComputeModel(LLAMA_8B, H200, 1, pp=2, launch_us_per_layer=1000.0)
    assert model.iteration_us(decode_batch(1, 128)) == pytest.approx(16_000.0)
    assert model.iteration_us(decode_batch(8, 128)) == pytest.approx(32_000.0)
    assert all(stage.launch_us_per_layer == 0.0 for stage in model.stage_models)


def test_collective_host_cost_is_vidurs_form():
    """Vidur: launch + skew x tp^1.25 per all-reduce; 4^1.25 = 5.65685."""
    assert collective_host_us(20.0, 1.0, 4) == pytest.approx(20.0 + 4 ** 1.25)
    assert collective_host_us(20.0, 1.0, 1) == 0.0


@pytest.mark.parametrize("tp, launch_us, skew_us, added_us", [
    (2, 20.0, 0.0, 2 * 32 * 20.0),                   # 1,280 us: two all-reduces a layer x 32 layers x 20 us
    (4, 0.0, 1.0, 2 * 32 * 4 ** 1.25),               # 362.04 us
    (1, 20.0, 1.0, 0.0),                             # no collective at tp 1
])
def test_collective_host_cost_adds_two_per_layer(tp, launch_us, skew_us, added_us):
    base = RooflineComputeModel(LLAMA_8B, H200, tp)
    costed = RooflineComputeModel(LLAMA_8B, H200, tp, allreduce_launch_us=launch_us, allreduce_skew_us=skew_us)
    for batch in (decode_batch(16, 1024), MIXED):
        assert costed.iteration_us(batch) - base.iteration_us(batch) == pytest.approx(added_us)


def test_decode_run_forms_agree_with_the_iteration_form():
    model = RooflineComputeModel(LLAMA_8B, H200, 2, launch_us_per_layer=250.0, allreduce_launch_us=20.0)
    run = model.decode_run_us(16, 16 * 1024, 16 * 1025, 5, 1025)
    assert list(model.decode_run_iter(16, 16 * 1024, 16 * 1025, 5, 1025)) == run.tolist()
    assert run[0] == pytest.approx(model.iteration_us(decode_batch(16, 1024)))


@pytest.mark.parametrize("name", ["launch_us_per_layer", "allreduce_launch_us", "allreduce_skew_us"])
def test_negative_values_are_refused_by_name(name):
    with pytest.raises(ComputeFieldError, match=name):
        RooflineComputeModel(LLAMA_8B, H200).with_overrides({name: -1.0})


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 256), st.integers(0, 8192), st.floats(0.0, 2000.0))
def test_an_eager_iteration_never_ends_before_its_launches(batch_size, context_tokens, per_layer_us):
    model = RooflineComputeModel(LLAMA_8B, H200, launch_us_per_layer=per_layer_us)
    batch = decode_batch(batch_size, context_tokens)
    time_us = model.iteration_us(batch)
    assert time_us >= 32 * per_layer_us * (1 - 1e-12)
    assert time_us >= RooflineComputeModel(LLAMA_8B, H200).iteration_us(batch)
    assert np.isclose(model.iteration_us_array(*(np.array([v]) for v in (
        batch.new_tokens, batch.attention_pairs, batch.kv_read_tokens, batch.logit_sequences)))[0], time_us)
