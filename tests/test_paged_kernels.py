"""Paged-attention factors per kernel and phase (issue 28 item 10; sources: sim/timing/paged_kernels.py).

Hand-computed roofline terms, Llama-3-8B on one H200 (sim/timing/compute.py defaults): KV 2 x 32 layers x 8 heads x
128 x 2 B = 131,072 B per token; B = 4.3e12 B/s = 4.3e6 B/us; attention F = 0.5 x 788e12 FLOP/s = 394e6 FLOP/us;
attention FLOPs 4 A Hq D N = A x 4 x 32 x 128 x 32 = A x 524,288.
"""
from dataclasses import replace

import numpy as np
import pytest

from sim.timing.compute import BatchShape, RooflineComputeModel, decode_batch
from sim.setup.config import ConfigError, SimConfig
from sim.timing.paged_kernels import PAGED_KERNELS
from sim.frontend.policy_spec import parse_policy, policy_config_error

KV_BYTES_PER_TOKEN = 131072
BYTES_PER_US = 4.3e6
ATTN_FLOPS_PER_US = 0.5 * 788e6
FLOPS_PER_PAIR = 4 * 32 * 128 * 32


def _contiguous():
    config = SimConfig()
    return RooflineComputeModel(config.model_spec, config.gpu_spec)


def _paged(spec: str) -> RooflineComputeModel:
    config = SimConfig().with_overrides(parse_policy(spec))
    return replace(_contiguous(), **config.paged_compute_fields())


def _decode_attention_us(batch: int, cached: int) -> float:
    """Memory-bound decode attention: (K_read + T) x 131,072 B / B (the FLOP term is 23x smaller here)."""
    flops_us = batch * (cached + 1) * FLOPS_PER_PAIR / ATTN_FLOPS_PER_US
    bytes_us = (batch * cached + batch) * KV_BYTES_PER_TOKEN / BYTES_PER_US
    assert bytes_us > flops_us
    return bytes_us


PREFILL = BatchShape(new_tokens=2048, attention_pairs=2048 * 2049 / 2, kv_read_tokens=0, logit_sequences=1,
                     max_context_tokens=2048)
PREFILL_ATTENTION_US = 2048 * 2049 / 2 * FLOPS_PER_PAIR / ATTN_FLOPS_PER_US   # compute-bound: 2,792 us


@pytest.mark.parametrize("spec, cached, factor", [
    ("paged", 16383, 1.23), ("paged:kernel=vllm-sosp23", 1023, 1.23),
    ("paged:kernel=vllm-v0", 1023, 1.23),                       # 1,024 keys per sequence: the short knot
    ("paged:kernel=vllm-v0", 8703, 1.23 + (2.8 - 1.23) * 0.5),  # 8,704 keys: half way from 1,024 to 16,384
    ("paged:kernel=vllm-v0", 16383, 2.8), ("paged:kernel=vllm-v0", 65535, 2.8),   # held at 2.8 beyond 16K
    ("paged:kernel=fa2-paged", 16383, 1.0), ("paged:kernel=flashinfer", 16383, 1.0),
    ("paged:kernel=vllm-v0,decode_factor=1.5", 16383, 1.5), ("paged:factor=1.4", 4095, 1.4),
    ("paged:decode_factor=2", 4095, 2.0),
])
def test_decode_iteration_pays_the_kernels_decode_factor_on_attention(spec, cached, factor):
    """A decode-only iteration of 8 sequences: paged minus contiguous time is the attention term x (factor - 1)."""
    batch = decode_batch(8, cached)
    extra_us = _paged(spec).iteration_us(batch) - _contiguous().iteration_us(batch)
    assert extra_us == pytest.approx(_decode_attention_us(8, cached) * (factor - 1), rel=1e-9, abs=1e-6)


@pytest.mark.parametrize("spec, factor", [
    ("paged", 1.23), ("paged:kernel=vllm-v0", 1.0), ("paged:kernel=fa2-paged", 1.37),
    ("paged:kernel=flashinfer", 1.0), ("paged:kernel=fa2-paged,prefill_factor=1.1", 1.1),
    ("paged:factor=1.5", 1.5), ("paged:prefill_factor=1.3", 1.3),
])
def test_prefill_iteration_pays_the_kernels_prefill_factor_on_attention(spec, factor):
    """One 2,048-token chunk at empty context: A = 2048 x 2049 / 2 pairs, compute-bound attention of
    A x 524,288 / 394e6 us; paged minus contiguous is that x (factor - 1)."""
    extra_us = _paged(spec).iteration_us(PREFILL) - _contiguous().iteration_us(PREFILL)
    assert extra_us == pytest.approx(PREFILL_ATTENTION_US * (factor - 1), rel=1e-9)


def test_default_paged_policy_keeps_the_one_factor_form_of_before():
    """Without the new keys the compute model gets the same single field as before (1.23): same floats."""
    assert SimConfig(policy="paged").paged_compute_fields() == {"paged_attention_factor": 1.23}
    assert SimConfig(policy="paged", paged_kernel="vllm-sosp23").paged_compute_fields() == {"paged_attention_factor": 1.23}
    assert "paged_factors" in SimConfig(policy="paged", paged_kernel="fa2-paged").paged_compute_fields()


@pytest.mark.parametrize("form", [{}, {"attention_key_us": 0.004, "attention_block_us": 2.0}])
def test_phase_factor_equals_a_constant_factor_model_in_its_phase(form):
    """Every compute form (the roofline; the FlashAttention block form) gives a per-phase model the times of
    a one-factor model at that phase's factor: fa2-paged == factor 1.37 on a prefill, == factor 1.0 on a
    decode; vllm-v0 at 16K keys == factor 2.8. Array form and single iterations agree."""
    base = replace(_contiguous(), **form)
    fa2 = replace(base, **SimConfig(paged_kernel="fa2-paged").paged_compute_fields())
    v0 = replace(base, **SimConfig(paged_kernel="vllm-v0").paged_compute_fields())
    decode = decode_batch(8, 16383)
    assert fa2.iteration_us(PREFILL) == replace(base, paged_attention_factor=1.37).iteration_us(PREFILL)
    assert fa2.iteration_us(decode) == base.iteration_us(decode)
    assert v0.iteration_us(decode) == pytest.approx(replace(base, paged_attention_factor=2.8).iteration_us(decode),
                                                    rel=1e-12)
    arrays = [np.array([getattr(b, name) for b in (PREFILL, decode)], dtype=float) for name in
              ("new_tokens", "attention_pairs", "kv_read_tokens", "logit_sequences", "max_context_tokens")]
    assert v0.iteration_us_array(*arrays).tolist() == pytest.approx(
        [v0.iteration_us(PREFILL), v0.iteration_us(decode)], rel=1e-12)


@pytest.mark.parametrize("graphs", [0.0, 1.0])
def test_decode_run_steps_through_the_context_dependent_factor(graphs):
    """A decode run crossing the 1,024..16,384 ramp: each step equals the single iteration at its context, and
    the lazy form (decode_run_iter) gives the array form's floats bit for bit."""
    model = replace(_paged("paged:kernel=vllm-v0"), decode_graphs=graphs)
    batch, cached, steps = 4, 1000, 60
    shape = decode_batch(batch, cached)
    run = model.decode_run_us(batch, shape.kv_read_tokens, shape.attention_pairs, steps, shape.max_context_tokens)
    lazy = list(model.decode_run_iter(batch, shape.kv_read_tokens, shape.attention_pairs, steps,
                                      shape.max_context_tokens))
    assert lazy == run.tolist()
    for step in (0, 30, 59):
        assert run[step] == pytest.approx(model.iteration_us(decode_batch(batch, cached + step)), rel=1e-12)
    assert run[59] > run[0]


def test_engine_applies_the_configured_kernel():
    """The simulator's compute model carries the paged policy's factors (sim.core.engine)."""
    from sim.core.engine import Simulator
    from tests.helpers import trace
    sim = Simulator(SimConfig(policy="paged", paged_kernel="vllm-v0"), trace([(0.0, 10, 5)]))
    assert sim.compute.paged_factors == PAGED_KERNELS["vllm-v0"]
    sim = Simulator(SimConfig(policy="paged", paged_attention_factor=1.5), trace([(0.0, 10, 5)]))
    assert sim.compute.paged_attention_factor == 1.5 and sim.compute.paged_factors is None


def test_spec_keys_set_the_fields():
    assert parse_policy("paged:kernel=vllm-v0,prefill_factor=1.1,decode_factor=2") == {
        "policy": "paged", "paged_kernel": "vllm-v0", "paged_prefill_factor": 1.1, "paged_decode_factor": 2.0,
        "explicit_fields": ("paged_decode_factor", "paged_kernel", "paged_prefill_factor")}
    assert parse_policy("paged:factor=1.3")["paged_attention_factor"] == 1.3
    assert parse_policy("vattention:page=64KiB,driver=modified")["vmm_driver"] == "modified"


@pytest.mark.parametrize("spec, expected", [
    ("paged:kernel=foo", "kernel=foo: unknown kernel 'foo'; choose one of vllm-sosp23, vllm-v0, fa2-paged"),
    ("paged:decode_factor=0.9", "decode_factor=0.9: must lie in [1, 100]"),
    ("paged:prefill_factor=inf", "prefill_factor=inf: must lie in [1, 100]"),
    ("paged:factor=x", "factor=x: expected a number >= 1"),
    ("paged:kernel=fa2-paged,factor=1.3", "kernel= and factor= both set"),
    ("paged:kernel=vllm-v0,kernel=fa2-paged", "key 'kernel' given twice"),
    ("vattention:driver=foo", "driver=foo: expected one of stock, modified"),
])
def test_bad_spec_values_name_the_key(spec, expected):
    with pytest.raises(ConfigError) as error:
        parse_policy(spec)
    assert str(error.value).startswith(f"policy {spec!r}: ") and expected in str(error.value)


def test_config_errors_are_renamed_to_the_specs_key():
    """A value refused by SimConfig (a Python caller's, or one no parser checked) names the spec's key."""
    spec = "paged:decode_factor=2"
    with pytest.raises(ConfigError) as error:
        try:
            SimConfig(policy="paged", paged_decode_factor=0.5)
        except ConfigError as exc:
            raise policy_config_error(spec, exc) from None
    assert "decode_factor=0.5: must lie in [1, 100]" in str(error.value)
    with pytest.raises(ConfigError, match="paged_kernel=foo: unknown kernel 'foo'"):
        SimConfig(paged_kernel="foo")
