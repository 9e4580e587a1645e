"""Capacity search: SLO parsing, the stability criterion, bisection on a stub, reproducibility on a real trace."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import traces
from analysis.planning import capacity
from sim.core import runner
from analysis.planning.capacity import base_rate_per_s, find_capacity, judge, search_capacity
from analysis.results import RunResult
from analysis.planning.slo import SLO_METRICS, Slo, objectives, parse_slos, ttft_growth, with_default_bounds
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
    ("ttft_p99=2", "duration .2. has no unit"), ("ttft_p99=0", "duration must be positive, got .0."),
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


def test_check_replicas_refuses_more_replicas_than_requests_and_warns_on_few(capsys):
    """An infinite target rate is refused (it was an OverflowError); a target needing more replicas than the trace
    has requests is refused before routing (1e12 req/s tried to simulate 4e10 replicas); a check that gives each
    replica only a few requests says its figures rest on few."""
    from cli import main

    base = ["capacity", "--num-requests", "100", "--slo", "ttft_p99=2s", "--tolerance", "0.2", "--quiet"]
    assert main([*base, "--target-rate", "inf"]) == 2
    assert "--target-rate must be a finite rate > 0 req/s, got inf" in capsys.readouterr().err
    assert main([*base, "--target-rate", "1e12", "--check-replicas"]) == 2
    assert "replicas, more than the trace's 100 requests" in capsys.readouterr().err
    assert main([*base, "--target-rate", "100", "--check-replicas"]) in (0, 1)
    captured = capsys.readouterr()
    assert "check: 100 req/s over" in captured.out and "rest on few requests" in captured.err


def test_a_capacity_no_rate_failed_is_said_to_be_a_lower_bound(capsys, tmp_path):
    """5 requests cannot load a replica at any rate: every rate tried passes. The answer is printed as a lower
    bound with a warning (it read "44486.568 served req/s", replicas 1, as if measured), the replicas as an upper
    bound, and the JSON says so."""
    import json

    from cli import main

    out = tmp_path / "cap.json"
    assert main(["capacity", "--num-requests", "5", "--slo", "ttft_p99=2s", "--target-rate", "100", "--quiet",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "capacity per replica: at least " in printed and "the capacity is a lower bound" in printed
    assert "replicas for 100 req/s: at most 1" in printed
    assert json.loads(out.read_text())["capacity_is_lower_bound"] is True


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


# ---- SLO attainment and goodput (issue 28, item 6) --------------------------------------------------------
def _request_table():
    """Five requests, hand-made: r0 meets ttft<=200ms and tpot<=50ms; r1 misses TTFT (300 ms); r2 misses TPOT
    (60 ms); r3 has one output token (no TPOT: meets it); r4 was rejected (a miss)."""
    import numpy as np
    return pd.DataFrame({"request_id": range(5), "status": ["finished"] * 4 + ["rejected"],
                         "ttft_us": [100e3, 300e3, 100e3, 150e3, np.nan], "tpot_us": [20e3, 20e3, 60e3, np.nan, np.nan],
                         "e2e_us": [1e6, 1.2e6, 1.5e6, 0.15e6, np.nan]})


def test_attainment_and_goodput_of_a_hand_made_table():
    """2 of the 5 requests (r0, r3) meet both objectives: attainment 2 / 5 = 0.4 (the rejected request counts
    as a miss), 2 / 4 = 0.5 with one request excluded; goodput 2 / 10 s = 0.2 req/s. ttft<=200ms with e2e<=1s:
    r0 (1 s) and r3 (0.15 s) again; e2e<=0.5s alone: r3 only (1 / 5)."""
    from analysis.planning.slo import SloAttainment, attainment_of, objectives
    from analysis.results import goodput_figures

    table = _request_table()
    slos = objectives("ttft=200ms,tpot=50ms", 0.4)
    assert goodput_figures(table, slos, 10.0) == {"slo_met_requests": 2, "slo_attainment": 0.4,
                                                  "goodput_req_per_s": 0.2}
    assert attainment_of(table, slos[0].slos, excluded=1) == (2, 0.5)
    assert attainment_of(table, objectives("ttft=200ms,e2e=1s", 1.0)[0].slos) == (2, 0.4)
    assert attainment_of(table, objectives("e2e=500ms", 1.0)[0].slos) == (1, 0.2)
    assert goodput_figures(table, objectives("ttft_p99=1s"), 10.0) == {}       # no per-request objective
    passing, failing = SloAttainment(0.4, slos[0].slos), SloAttainment(0.5, slos[0].slos)
    assert passing.holds({"slo_attainment": 0.4}) and not failing.holds({"slo_attainment": 0.4})
    assert failing.excess({"slo_attainment": 0.4}) == pytest.approx(1.25)


def test_attainment_figures_are_printed_and_compared_only_when_given():
    from analysis.comparison import comparison_table
    from analysis.summary import summary_lines

    summary = {"requests": 5, "finished": 4, "rejected": 1, "slo_attainment": 0.4, "slo_met_requests": 2,
               "goodput_req_per_s": 0.2}
    rows = dict(line for line in summary_lines({**_base_summary(), **summary}))
    assert rows["SLO attainment / goodput"] == "40.0% (2 of 5 requests meet every SLO) / 0.200 req/s"
    assert "SLO attainment / goodput" not in dict(summary_lines(_base_summary()))
    table = comparison_table({"a": summary, "b": {"finished": 4}})
    assert table.loc["a", "goodput (req/s)"] == 0.2 and "SLO attainment (share of requests)" in table
    assert "goodput (req/s)" not in comparison_table({"b": {"finished": 4}})


def test_latency_rows_say_none_was_served_instead_of_nan():
    """Every request rejected (``static:max_len=10`` on 50 requests, say): the latency rows say so; the other rows
    are printed as usual; one served request brings the figures back."""
    from analysis.summary import LATENCY_ROWS, summary_lines

    base = _base_summary()
    rows = dict(summary_lines({**base, "finished": 0, "rejected": base["requests"], "tbt_tokens": 0}))
    assert {rows[label] for label in LATENCY_ROWS} == {"none: no request was served"} and len(LATENCY_ROWS) == 5
    assert rows["iterations"] == f"{base['iterations']:,}"
    # a request rejected mid-run streamed its tokens: TBT has figures though nothing finished (helper-49)
    streamed = dict(summary_lines({**base, "finished": 0, "rejected": base["requests"]}))
    assert base["tbt_tokens"] > 0 and streamed["TBT p50 / p99 / max"].endswith(" ms")
    assert streamed["TTFT p50 / p90 / p99"] == "none: no request was served"
    assert "nan" not in " ".join(dict(summary_lines(base)).values())


def _base_summary() -> dict:
    """A summary with every key the printed table reads (a tiny run's)."""
    from sim.setup.config import SimConfig
    from sim.core.runner import run_simulation

    return run_simulation(SimConfig(), traces.synthetic_default(0, num_requests=3)).summary


@pytest.mark.parametrize("text, attainment, message", [
    ("ttft=200ms", None, "a per-request objective needs --slo-attainment"),
    ("ttft_p99=1s", 0.9, "--slo-attainment needs per-request objectives"),
    ("ttft=1s", 1.5, r"--slo-attainment must lie in \(0, 1\]"),
])
def test_attainment_objectives_are_refused_half_given(text, attainment, message):
    from analysis.planning.slo import objectives

    with pytest.raises(ValueError, match=message):
        objectives(text, attainment)


def test_capacity_on_attainment_is_monotone_and_at_one_bounds_every_request():
    """60 requests: a higher attainment target never gives a higher capacity; at 1.0 the capacity point has every
    request finished within ttft<=150ms and tpot<=30ms (its maxima, recomputed from a rerun, are within the
    bounds), and the failing point just above has some request beyond one of them, or a failed run."""
    from sim.setup.config import SimConfig
    from sim.core.runner import run_simulation

    trace, _ = traces.clip_context(traces.synthetic_default(0, num_requests=60), 8192)
    capacities = {}
    for target in (0.5, 0.9, 1.0):
        slos = with_default_bounds(objectives("ttft=150ms,tpot=30ms", target))
        capacities[target] = find_capacity(SimConfig(), trace, slos, 0.05)
    assert capacities[0.5].rate_per_s >= capacities[0.9].rate_per_s >= capacities[1.0].rate_per_s > 0
    full = capacities[1.0]
    assert full.binding == "slo_attainment" and full.best.summary["slo_attainment"] == 1.0

    def within(scale: float) -> bool:
        requests = run_simulation(SimConfig(), traces.scale_rate(trace, scale)).requests
        return bool((requests["status"] == "finished").all() and requests["ttft_us"].max() <= 150e3
                    and requests["tpot_us"].max() <= 30e3)
    assert within(full.best.scale) and not within(full.above.scale)
    assert full.to_dict()["at_capacity_goodput_req_per_s"] > 0


def test_pd_search_and_capacity_search_on_attainment_from_the_command_line(tmp_path, capsys):
    """``kvsim capacity --slo ttft=..,tpot=.. --slo-attainment 0.9`` (one replica, and ``--pd-search 2``): every
    deployment that passes records an attainment of at least 0.9 at its capacity; the steps show the attained
    share; a per-request objective without ``--slo-attainment`` is refused before anything runs."""
    import json

    from cli import main

    common = ["--num-requests", "40", "--slo", "ttft=300ms,tpot=20ms", "--slo-attainment", "0.9", "--tolerance", "0.2"]
    out = tmp_path / "one.json"
    assert main(["capacity", *common, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "attainment>=0.9 of (ttft<=300ms, tpot<=20ms), sched_delay_p50<=2s" in printed and "attained (%)" in printed
    record = json.loads(out.read_text())
    assert record["capacity_req_per_s"] > 0 and record["at_capacity_slo_attainment"] >= 0.9
    out = tmp_path / "search.json"
    assert main(["capacity", "--pd-search", "2", *common, "--json", str(out), "--quiet"]) == 0
    deployments = json.loads(out.read_text())["deployments"]
    assert len(deployments) == 3 and all(d["at_capacity_slo_attainment"] >= 0.9 for d in deployments
                                         if d["capacity_req_per_s"] > 0)
    capsys.readouterr()
    assert main(["capacity", "--num-requests", "40", "--slo", "ttft=300ms"]) == 2
    assert "a per-request objective needs --slo-attainment" in capsys.readouterr().err


def test_capacity_warns_about_a_harness_timed_profile(capsys):
    """kvsim capacity --profile profiles/h200.json: one warning line that its compute was timed on the replay
    harness (README.md, "Which compute model to plan with")."""
    from pathlib import Path

    from cli import main
    profile = str(Path(__file__).resolve().parents[1] / "profiles" / "h200.json")
    assert main(["capacity", "--num-requests", "20", "--slo", "ttft_p99=2s", "--tolerance", "0.3", "--quiet",
                 "--profile", profile]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "harness" in line]
    assert len(lines) == 1 and lines[0].startswith("kvsim: warning: ") and "Which compute model to plan with" in lines[0]


def test_an_slo_with_a_stray_plus_is_one_line_naming_it(capsys):
    """--slo ttft_p99=2s+ (the tenant specs' '+' joiner on the command line) is refused, naming the value; a
    tenant's slo=...+ is refused as well (tests/test_colocate.py)."""
    from cli import main
    assert main(["capacity", "--num-requests", "20", "--slo", "ttft_p99=2s+"]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == ["kvsim: error: --slo ttft_p99: not a duration: '2s+' "
                                                 "(examples: 2s, 100ms, 250us)"]


def test_ttft_growth_does_not_depend_on_the_blas_threads():
    """The summary's TTFT slope (the capacity search's stability criterion) is the same bit for bit whatever the
    number of BLAS threads (np.dot split its sum over them: the machine's core count showed in its last bits)."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT
    code = ("import numpy as np; from sim.results.summary import ttft_growth_of; r = np.random.default_rng(0); "
            "x = np.sort(r.random(20000)) * 1e9; print(ttft_growth_of(x, x * 1e-3 + r.random(20000) * 1e5).hex())")
    values = {subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True,
                             env={**os.environ, "OPENBLAS_NUM_THREADS": str(n)}).stdout.strip() for n in (1, 2)}
    assert len(values) == 1 and float.fromhex(values.pop()) > 0


def test_a_capacity_found_on_less_than_600_s_of_traffic_is_warned_about():
    """2,000 requests at a base rate of 4.712 req/s scaled x4.41 arrive within (2000 - 1) / (4.712 x 4.41) = 96.2 s:
    shorter than an MLPerf Inference server run's 600 s minimum, so the capacity is flagged; a span of 600 s or
    more is not."""
    from analysis.planning.capacity import MIN_STEADY_SPAN_S, CapacityResult, Evaluation
    best = Evaluation(4.41, 20.777, {}, 0.0, ())
    short = CapacityResult((), 0.02, 4.712, (best,), best, None, num_requests=2000)
    assert short.span_at_capacity_s == pytest.approx(1999 / (4.712 * 4.41)) and round(short.span_at_capacity_s) == 96
    assert "span only 96 s at this rate, less than the 600 s" in short.short_span_warning
    assert short.to_dict()["span_at_capacity_s"] == short.span_at_capacity_s
    steady = CapacityResult((), 0.02, 4.712, (best,), best, None, num_requests=int(MIN_STEADY_SPAN_S * 4.712 * 4.41) + 2)
    assert steady.span_at_capacity_s >= MIN_STEADY_SPAN_S and steady.short_span_warning is None
    assert CapacityResult((), 0.02, 4.712, (), None, best, num_requests=2000).short_span_warning is None


def test_the_capacity_file_and_the_sweep_table_say_what_was_searched(tmp_path, capsys):
    """A planner sends these files on: they name the model, GPU, parallelism, policy, trace and request count."""
    import json as json_

    import pandas as pd

    from cli import main
    trace = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    assert main(["capacity", "--trace", str(trace), "--num-requests", "300", "--slo", "ttft_p99=2s", "--quiet",
                 "--out", str(tmp_path / "c.json")]) in (0, 1)
    record = json_.loads((tmp_path / "c.json").read_text())
    assert (record["model"], record["gpu"], record["tp"], record["policy"], record["num_requests"]) == \
        ("llama-3-8b", "h200", 1, "vattention 2 MiB async", 300)
    assert record["trace"].startswith(str(trace)) and record["compute_model"].startswith("in-loop")
    assert main(["sweep", "--trace", str(trace), "--num-requests", "200", "--grid", "gpu=h100,h200", "--quiet",
                 "--out", str(tmp_path / "s")]) == 0
    table = pd.read_csv(tmp_path / "s" / "sweep.csv")
    assert list(table["model"]) == ["llama-3-8b"] * 2 and list(table["num_requests"]) == [200, 200]
    captured = capsys.readouterr()
    assert "the points are timed by 2 different compute models" in captured.err
    assert "(1 point: gpu=h100)" in captured.out and "(1 point: gpu=h200)" in captured.out
    assert "--profile roofline times every point alike" in captured.err


def test_the_sweep_counts_compute_models_by_their_source_not_their_per_gpu_caveat():
    """All-roofline points on four GPUs are one compute model (helper-47: the per-GPU caveat and the default
    profile's per-point note made 16 roofline points read as 5 models and warn)."""
    import pandas as pd

    from analysis.planning.cli import compute_model_lines, compute_model_source_key
    from sim.results.summary import compute_model_text
    h200_note = ("roofline (built-in defaults: profiles/h200-engine.json's compute_in_loop was fitted for llama-3-8b "
                 "on h200 at tp 1, not x on h200 at tp 2); from profiles/h200-engine.json: VMM latencies")
    assert compute_model_source_key(h200_note) == "roofline (built-in defaults)"
    assert compute_model_source_key("in-loop (compute_in_loop of p.json; fitted for a, applied to b)") == \
        "in-loop (compute_in_loop of p.json)"
    assert compute_model_source_key("roofline (compute.roofline of p.json)") == "roofline (compute.roofline of p.json)"
    table = pd.DataFrame({"gpu": ["a100", "h200", "h200"], "tp": [2, 2, 4],
                          "compute_model": [compute_model_text("roofline (built-in defaults)", "a100"),
                                            compute_model_text(h200_note, "h200"),
                                            compute_model_text(h200_note.replace("tp 2", "tp 4"), "h200")]})
    lines = compute_model_lines(table, "compute_model", ["gpu", "tp"], None)
    assert lines[0] == "compute model: roofline (built-in defaults) (3 points)"
    assert "not validated for a100, h200 with a serving engine" in lines[1]
    assert not any(line.startswith("kvsim: warning:") for line in lines)
    mixed = table.assign(compute_model=[table["compute_model"][0], "in-loop (compute_in_loop of p.json)",
                                        "in-loop (compute_in_loop of p.json)"])
    lines = compute_model_lines(mixed, "compute_model", ["gpu", "tp"], "roofline")
    assert "compute model: in-loop (compute_in_loop of p.json) (2 points: gpu=h200 tp=2, gpu=h200 tp=4)" in lines
    warning = [line for line in lines if line.startswith("kvsim: warning:")]
    assert len(warning) == 1 and "2 different compute models" in warning[0] and "--profile roofline" not in warning[0]
