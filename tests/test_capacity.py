"""Capacity search: SLO parsing, the stability criterion, bisection on a stub, reproducibility on a real trace."""
from __future__ import annotations

import argparse
import math

import numpy as np
import pandas as pd
import pytest

from analysis.planning import capacity
from sim.core import runner
from analysis.planning.capacity import base_rate_per_s, find_capacity, judge, search_capacity
from analysis.results import RunResult
from analysis.planning.slo import SLO_METRICS, Slo, parse_slos, ttft_growth
from sim.setup.config import SimConfig
from tests.helpers import trace


def kvsim_parser() -> argparse.ArgumentParser:
    import cli
    from analysis.planning.cli import register
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if "capacity" not in sub.choices:
        register(sub)
    return parser


# ---- SLO parsing ------------------------------------------------------------------------------------------
def test_parse_slos_units_to_microseconds():
    slos = parse_slos("ttft_p99=2s, tpot_p99=100ms,e2e_p50=250us")
    assert slos == (Slo("ttft_p99", 2e6), Slo("tpot_p99", 1e5), Slo("e2e_p50", 250.0))


@pytest.mark.parametrize("text, message", [
    ("ttft_p98=2s", "valid metrics: ttft_p50, ttft_p90, ttft_p99"),
    ("ttft_p99=2", "not a duration"),
    ("ttft_p99", "expected METRIC=DURATION"),
    ("ttft_p99=1s,ttft_p99=2s", "given twice"),
    ("", "no objective"),
])
def test_parse_slos_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_slos(text)


def test_unknown_metric_error_lists_every_valid_metric():
    with pytest.raises(ValueError) as info:
        parse_slos("latency=1s")
    assert all(metric in str(info.value) for metric in SLO_METRICS)


def test_slo_reads_summary_units():
    summary = {"ttft_p99_ms": 1500.0, "e2e_p90_s": 3.0, "tpot_p50_ms": float("nan")}
    assert Slo("ttft_p99", 2e6).holds(summary) and Slo("ttft_p99", 2e6).value_us(summary) == 1.5e6
    assert not Slo("e2e_p90", 2e6).holds(summary)
    assert not Slo("tpot_p50", 1e5).holds(summary)  # undefined fails


# ---- stability ----------------------------------------------------------------------------------------------
def _requests(arrival_s: np.ndarray, ttft_s: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"arrival_at_us": arrival_s * 1e6, "ttft_us": ttft_s * 1e6,
                         "completion_at_us": (arrival_s + ttft_s + 1) * 1e6, "status": "finished"})


def test_ttft_growth_is_zero_for_a_stable_queue_and_the_slope_for_a_growing_one():
    arrival_s = np.linspace(0, 100, 400)
    assert ttft_growth(_requests(arrival_s, np.full(400, 0.2))) == pytest.approx(0.0, abs=1e-12)
    assert ttft_growth(_requests(arrival_s, 0.1 + 0.2 * arrival_s)) == pytest.approx(0.2)


def test_judge_orders_violations_tightest_first():
    slos = parse_slos("ttft_p99=1s,tpot_p99=100ms")
    evaluation = judge(2.0, 10.0, {"ttft_p99_ms": 1100.0, "tpot_p99_ms": 300.0}, 0.0, slos)
    assert evaluation.failed == ("tpot_p99", "ttft_p99") and not evaluation.passed
    assert judge(1.0, 5.0, {"ttft_p99_ms": 900.0, "tpot_p99_ms": 90.0}, 0.2, slos).failed == ("stability",)


# ---- bisection on a stub ------------------------------------------------------------------------------------
def _threshold_evaluator(threshold: float, slos, calls: list):
    def evaluate(scale: float):
        calls.append(scale)
        return judge(scale, scale * 2.0, {"ttft_p99_ms": 1000.0 * scale / threshold}, 0.0, slos)
    return evaluate


@pytest.mark.parametrize("threshold", [3.7, 0.13, 1.0, 40.0])
def test_bisection_brackets_a_known_threshold_within_tolerance(threshold):
    slos, calls = parse_slos("ttft_p99=1s"), []
    result = search_capacity(_threshold_evaluator(threshold, slos, calls), slos, tolerance=0.01, base_rate=2.0)
    assert result.best.scale <= threshold < result.above.scale
    assert result.above.scale / result.best.scale - 1 <= 0.01
    assert result.rate_per_s == pytest.approx(2.0 * result.best.scale)
    assert result.binding == "ttft_p99" and len(calls) == len(result.steps) < 30


def test_search_reports_no_capacity_and_unbounded_capacity():
    slos = parse_slos("ttft_p99=1s")
    never = search_capacity(_threshold_evaluator(1e-9, slos, []), slos)
    assert never.best is None and never.rate_per_s == 0 and never.replicas_for(10) is None
    always = search_capacity(_threshold_evaluator(1e9, slos, []), slos)
    assert always.above is None and always.binding.startswith("none")


def test_replicas_for_rounds_up():
    slos = parse_slos("ttft_p99=1s")
    result = search_capacity(_threshold_evaluator(2.5, slos, []), slos, tolerance=0.001, base_rate=2.0)
    assert result.rate_per_s == pytest.approx(5.0, rel=0.002)   # the stub offers 2 req/s per unit of scale
    assert result.replicas_for(12.0) == math.ceil(12.0 / result.rate_per_s) == 3


def test_find_capacity_with_a_monotone_fake_simulator(monkeypatch):
    """The real search loop over a fake run function whose TPOT p99 crosses 100 ms at 12 req/s."""
    workload = trace([(i * 0.5, 100, 10) for i in range(40)])   # 2 req/s

    def fake_run(config, scaled, profile_path=None):
        rate_per_s = base_rate_per_s(scaled)
        requests = _requests(scaled["arrival_s"].to_numpy(), np.full(len(scaled), 0.05))
        return RunResult(requests, pd.DataFrame(), {"tpot_p99_ms": 100.0 * rate_per_s / 12.0, "ttft_p99_ms": 50.0})

    monkeypatch.setattr(runner, "run_simulation", fake_run)
    result = find_capacity(SimConfig(), workload, parse_slos("ttft_p99=2s,tpot_p99=100ms"), tolerance=0.02)
    assert 12.0 / 1.02 <= result.rate_per_s <= 12.0 + 1e-9
    assert result.binding == "tpot_p99"
    assert result.output_tokens_per_s == pytest.approx(result.rate_per_s * 10)


# ---- real simulator -----------------------------------------------------------------------------------------
def test_capacity_on_a_tiny_real_trace_is_reproducible(shared_traces):
    import traces
    path = shared_traces / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    config = SimConfig(gpu="h100")
    workload, _ = traces.clip_context(traces.first_n(traces.load_trace(path), 200), config.slot_max_tokens)
    slos = parse_slos("ttft_p99=1s,tpot_p99=50ms")
    first = find_capacity(config, workload, slos, tolerance=0.05)
    second = find_capacity(config, workload, slos, tolerance=0.05)
    assert first.rate_per_s > 0 and first.above is not None
    assert [(s.scale, s.values_us, s.failed) for s in first.steps] == \
           [(s.scale, s.values_us, s.failed) for s in second.steps]
    assert first.rate_per_s == second.rate_per_s


def test_cli_capacity_prints_steps_answer_and_replicas(capsys, tmp_path):
    parser = kvsim_parser()
    args = parser.parse_args(["capacity", "--num-requests", "150", "--slo", "ttft_p99=500ms,tpot_p99=40ms",
                              "--tolerance", "0.1", "--target-rate", "50", "--check-replicas",
                              "--json", str(tmp_path / "cap.json")])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "capacity per replica:" in out and "binding constraint:" in out and "replicas for 50 req/s:" in out
    assert "check: 50 req/s over" in out and " pass" in out
    assert (tmp_path / "cap.json").is_file()


def test_cli_capacity_quiet_prints_no_step_table(capsys):
    parser = kvsim_parser()
    args = parser.parse_args(["capacity", "--num-requests", "150", "--slo", "ttft_p99=500ms", "--tolerance", "0.2",
                              "--quiet"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "capacity per replica:" in out
    assert "rate req/s" not in out                                       # the step table's header
    assert not any(line.rstrip().endswith(" pass") or " FAIL " in line for line in out.splitlines())  # its rows


def test_cli_capacity_rejects_an_unknown_slo_metric():
    args = kvsim_parser().parse_args(["capacity", "--num-requests", "20", "--slo", "ttfb_p99=1s"])
    with pytest.raises(ValueError, match="valid metrics"):
        args.func(args)


def test_module_uses_runner_indirection():
    assert capacity.runner is runner   # tests monkeypatch runner.run_simulation


@pytest.mark.parametrize("width", [2, 3, 7])
def test_parallel_search_walks_the_serial_path(width):
    """Speculative parallel evaluation returns the serial answer and the serial steps; it only adds points."""
    threshold = 5.3719

    def evaluate(scale):
        return judge(scale, scale * 2.0, {"ttft_p99_ms": 100.0 * scale / threshold}, 0.0,
                     (Slo("ttft_p99", 100_000.0),))

    evaluated = []

    def evaluate_many(scales):
        evaluated.extend(scales)
        return [evaluate(s) for s in scales]

    serial = search_capacity(evaluate, (Slo("ttft_p99", 100_000.0),), 0.01, base_rate=2.0)
    parallel = search_capacity(evaluate, (Slo("ttft_p99", 100_000.0),), 0.01, base_rate=2.0,
                               evaluate_many=evaluate_many, width=width)
    assert [e.scale for e in parallel.steps] == [e.scale for e in serial.steps]
    assert parallel.rate_per_s == serial.rate_per_s and parallel.best.scale <= threshold < parallel.above.scale
    assert len(evaluated) >= len(serial.steps) - 1


def test_parallel_capacity_on_a_process_pool_equals_serial():
    import traces
    from sim.setup.config import SimConfig

    trace = traces.synthetic_default(0, num_requests=120)
    slos = (Slo("ttft_p99", 500_000.0),)
    serial = capacity.find_capacity(SimConfig(), trace, slos, 0.05)
    parallel = capacity.find_capacity(SimConfig(), trace, slos, 0.05, workers=2)
    assert [e.scale for e in parallel.steps] == [e.scale for e in serial.steps]
    assert parallel.rate_per_s == serial.rate_per_s
