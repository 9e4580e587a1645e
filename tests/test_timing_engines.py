"""Engine presets (``--engine``) and the per-request front-end cost (issue 31, item 4).

Expected values are the engines' own defaults as their code states them (sim/setup/engines.py cites each file), and
the golden two-request run of tests/test_engine.py shifted by the front-end cost.
"""
from __future__ import annotations

import math

import pytest

from cli import build_parser, main
from sim.setup.catalog import get_gpu
from sim.setup.config import SimConfig
from sim.core.engine import Simulator
from sim.setup.engines import ENGINES, engine_preset
from sim.frontend.options import config_from_args
from sim.core.request import Request
from sim.units import KIB
from tests.helpers import ConstantCompute, constant_vmm, trace


def _config(*flags: str) -> SimConfig:
    return config_from_args(build_parser().parse_args(["simulate", *flags]))


def test_no_engine_keeps_kvsims_own_defaults():
    assert _config() == SimConfig()
    config = _config()
    assert (config.scheduler, config.token_budget, config.max_batch_slots) == ("sarathi", 2048, 256)
    assert config.engine is None and config.frontend_overhead_us == 0.0 and config.cuda_graph_decodes is None


@pytest.mark.parametrize("gpu, budget, seqs", [("h100", 8192, 1024), ("h200", 8192, 1024), ("b200", 8192, 1024),
                                               ("a100", 2048, 256), ("a100-80gb-pcie", 2048, 256),
                                               ("l40s", 2048, 256)])
def test_vllm_v1_batch_defaults_follow_get_batch_defaults(gpu, budget, seqs):
    """vllm/engine/arg_utils.py get_batch_defaults: >= 70 GiB and not an A100 -> 8192 / 1024, else 2048 / 256."""
    config = _config("--engine", "vllm-v1", "--gpu", gpu)
    assert (config.token_budget, config.max_batch_slots) == (budget, seqs)
    assert (config.scheduler, config.policy, config.block_size_tokens) == ("sarathi", "paged", 16)
    assert config.prefix_caching and config.cuda_graph_decodes and config.frontend_overhead_us == 10_000.0


@pytest.mark.parametrize("gpu, chunk", [("l40s", 4096), ("a100-40gb", 4096), ("h100", 8192), ("h200", 8192),
                                        ("b200", 16384), ("mi300x", 16384)])
def test_sglang_chunked_prefill_size_follows_the_gpu_memory_buckets(gpu, chunk):
    """server_args.py: < 60 GB 4096, < 160 GB 8192, else 16384 (GB of 1024 MiB)."""
    config = _config("--engine", "sglang", "--gpu", gpu)
    assert config.token_budget == chunk and config.block_size_tokens == 1 and config.max_batch_slots == 2048
    assert config.scheduler == "vllm" and config.policy == "paged" and config.prefix_caching


def test_vattention_preset_is_kvsims_default_run():
    config = _config("--engine", "vattention")
    assert config == SimConfig(engine="vattention", cuda_graph_decodes=False)


def test_explicit_flags_and_policy_keys_override_the_preset():
    config = _config("--engine", "vllm-v1", "--gpu", "h100", "--token-budget", "512", "--max-batch", "64",
                     "--scheduler", "vllm", "--frontend-overhead-ms", "2.5", "--policy", "vattention")
    assert (config.token_budget, config.max_batch_slots, config.scheduler) == (512, 64, "vllm")
    assert config.frontend_overhead_us == 2500.0 and config.policy == "vattention"
    assert _config("--engine", "vllm-v1", "--policy", "paged:block=32").block_size_tokens == 32


def test_every_engine_has_a_preset_and_unknown_ones_are_refused():
    for engine in ENGINES:
        assert engine_preset(engine, get_gpu("h200"))["frontend_overhead_us"] >= 0
    with pytest.raises(ValueError, match="engine='tgi': choose one of"):
        engine_preset("tgi", get_gpu("h200"))


def test_record_adds_the_frontend_cost_to_ttft_and_e2e_only():
    request = Request(0, 1000.0, 10, 5)
    request.first_token_at_us, request.completion_at_us = 3000.0, 7000.0
    plain, shifted = request.record(), request.record(500.0)
    names = ("first_token_at_us", "completion_at_us", "ttft_us", "tpot_us", "e2e_us")
    assert plain[4:9] == (3000.0, 7000.0, 2000.0, 1000.0, 6000.0)
    assert shifted[4:9] == (3500.0, 7500.0, 2500.0, 1000.0, 6500.0), names


def test_frontend_cost_shifts_the_golden_run_and_no_iteration():
    """tests/test_engine.py's golden run (TTFT 7,400 / 9,100 us) with a 2 ms front-end cost: +2,000 us on TTFT and
    E2E, the same iterations."""
    def run(frontend_us):
        config = SimConfig(page_size_bytes=64 * KIB, sync_mapping=True, frontend_overhead_us=frontend_us)
        out = Simulator(config, trace([(0.0, 40, 3), (0.0025, 10, 2)]), vmm=constant_vmm(),
                        compute=ConstantCompute(1000.0)).run()
        return out.requests_frame().set_index("request_id"), out.iterations_frame()
    (req0, it0), (req2, it2) = run(0.0), run(2000.0)
    assert list(req0["ttft_us"]) == [7400.0, 9100.0] and list(req2["ttft_us"]) == [9400.0, 11100.0]
    assert list(req2["e2e_us"]) == [14600.0, 12100.0]
    assert list(req2["tpot_us"]) == list(req0["tpot_us"])
    assert it0.equals(it2)


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "x", "1e300"])
def test_a_bad_frontend_overhead_is_one_error_line(value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--frontend-overhead-ms", value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--frontend-overhead-ms" in err and "Traceback" not in err


def test_simconfig_refuses_a_negative_frontend_cost():
    from sim.setup.config import ConfigError
    with pytest.raises(ConfigError, match=r"frontend_overhead_us=-1.0: must be a number of microseconds >= 0"):
        SimConfig(frontend_overhead_us=-1.0)
    # beyond the clock's exact range (2**53 ticks of 100 ns = 9.0072e14 us): a 300-digit TTFT before
    with pytest.raises(ConfigError, match=r"frontend_overhead_us=1e\+300: .* at most 9.0072e\+14"):
        SimConfig(frontend_overhead_us=1e300)
    assert math.isfinite(SimConfig(frontend_overhead_us=0.0).frontend_overhead_us)
