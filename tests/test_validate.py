"""``kvsim validate --hw-run`` on CPU against the committed H200 replay (docs/validation/hw-async): the
error table is computed from the measured records (hand-checkable figures), and the simulator runs on the
run's own configuration and trace slice."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("simpy")

from cli import main  # noqa: E402
from hwbackend.calibration.run_files import config_from_run  # noqa: E402
from hwbackend.calibration.validate import check_targets, error_table, validate_run  # noqa: E402

RUN = Path(__file__).resolve().parent.parent / "docs" / "validation" / "hw-async"


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    if not (RUN / "iterations.parquet").is_file():
        pytest.skip(f"{RUN} is not present")
    out = tmp_path_factory.mktemp("validate")
    table, hw, sim, _ = validate_run(RUN, None, out)
    return table, hw, sim, out


def row(table: pd.DataFrame, metric: str, stat: str) -> pd.Series:
    return table[(table["metric"] == metric) & (table["stat"] == stat)].iloc[0]


def test_hardware_column_is_the_committed_measurement(validated):
    table, _, _, _ = validated
    iterations = pd.read_parquet(RUN / "iterations.parquet")
    requests = pd.read_parquet(RUN / "requests.parquet")
    finished = requests[requests["status"] == "finished"]
    assert row(table, "iteration latency", "p50")["hw"] == pytest.approx(iterations["duration_us"].median() / 1e3)
    assert row(table, "TTFT", "p99")["hw"] == pytest.approx(np.percentile(finished["ttft_us"], 99) / 1e3)
    assert row(table, "TPOT", "p50")["hw"] == pytest.approx(finished["tpot_us"].median() / 1e3)
    mapped = iterations["sync_map_page_groups"] > 0
    step_us = iterations.loc[~mapped, "sync_stall_us"].median()  # the policy step, timed inside the stall
    mapping_ms = (iterations.loc[mapped, "sync_stall_us"] - step_us).clip(lower=0).sum() / 1e3
    assert row(table, "sync mapping stall", "total")["hw"] == pytest.approx(mapping_ms)
    summary = json.loads((RUN / "summary.json").read_text())
    assert row(table, "page groups mapped", "total")["hw"] == summary["map_page_groups"]
    assert len(requests) == 1000 and len(finished) == 1000  # the first 1,000 requests of the Azure conv trace


def test_simulator_ran_the_same_configuration_and_trace(validated):
    table, hw, sim, _ = validated
    assert sim.config["label"] == hw.config["label"] == "vattention 2 MiB async"
    assert config_from_run(hw.config).pool_page_groups == hw.config["pool_page_groups"]
    assert sim.requests["arrival_at_us"].tolist() == hw.requests["arrival_at_us"].tolist()
    assert sim.requests["prompt_tokens"].tolist() == hw.requests["prompt_tokens"].tolist()
    p50 = row(table, "TTFT", "p50")
    assert p50["error"] == pytest.approx(p50["sim"] / p50["hw"] - 1)


def test_report_files_and_targets(validated):
    table, _, _, out = validated
    text = (out / "validation.md").read_text()
    assert "| iteration latency | p50 | ms |" in text and "targets missed:" in text
    assert (out / "overlay.html").stat().st_size > 10_000
    assert pd.read_csv(out / "errors.csv").shape == table.shape
    missed = check_targets(table)
    assert all("target" in line for line in missed)


def test_cli_prints_the_error_table(capsys):
    if not (RUN / "iterations.parquet").is_file():
        pytest.skip(f"{RUN} is not present")
    assert main(["validate", "--hw-run", str(RUN)]) == 0
    printed = capsys.readouterr().out
    assert "| TPOT | p99 | ms |" in printed and "vattention 2 MiB async" in printed


def test_error_is_sim_over_hw_minus_one():
    class Run:
        def __init__(self, scale: float):
            self.iterations = pd.DataFrame({"duration_us": [1000.0 * scale, 3000.0 * scale], "sync_stall_us": [0.0, 0.0],
                                            "sync_map_page_groups": [0, 1]})
            self.requests = pd.DataFrame({"status": ["finished"] * 2, "ttft_us": [1e3, 2e3], "tpot_us": [1e3, 1e3],
                                          "e2e_us": [1e6, 2e6]})
            self.summary = {"map_page_groups": 2, "peak_mapped_bytes": 2**30}

    table = error_table(Run(1.0), Run(1.1))
    assert row(table, "iteration latency", "p50")["error"] == pytest.approx(0.1)
    assert row(table, "TTFT", "p50")["error"] == pytest.approx(0.0)
    assert "TBT" not in set(table["metric"])          # a hardware run from before TBT was recorded

    hw, sim = Run(1.0), Run(1.0)
    hw.summary = {**hw.summary, "tbt_p50_ms": 10.0, "tbt_p90_ms": 12.0, "tbt_p99_ms": 20.0}
    sim.summary = {**sim.summary, "tbt_p50_ms": 10.6, "tbt_p90_ms": 12.0, "tbt_p99_ms": 23.0}
    table = error_table(hw, sim)
    assert row(table, "TBT", "p50")["error"] == pytest.approx(0.06) and row(table, "TBT", "p99")["error"] == pytest.approx(0.15)
    missed = check_targets(table)
    assert "TBT p99: +15.0% (target 10%)" in missed and not any(m.startswith("TBT p50") for m in missed)


# ---- the replays with decode CUDA graphs (graphs-x1.5: second session; same-start: the profile's fit), in-loop fit
GRAPHS = RUN.parent / "graphs-x1.5"
PROFILE = RUN.parent.parent.parent / "profiles" / "h200.json"


SAME_START = RUN.parent / "same-start"  # every run on one start of the machine; the profile's fit is on train-*


@pytest.fixture(scope="module")
def same_start_validated():
    if not (SAME_START / "test-sync-x1" / "iterations.parquet").is_file():
        pytest.skip(f"{SAME_START} is not present")
    return {name: validate_run(SAME_START / name, str(PROFILE))[0]
            for name in ("test-async-x1", "test-sync-x1", "test-async", "test-sync")}


@pytest.mark.parametrize("name", ["test-async-x1", "test-sync-x1"])
def test_in_loop_model_meets_every_target_on_the_held_out_runs_in_real_time(same_start_validated, name):
    # the configuration: the first 1,000 requests at their trace times; fitted on requests 1,000-3,799
    # (docs/validation/same-start/PLAN.md fixed the fit before these runs were validated)
    assert check_targets(same_start_validated[name]) == []


@pytest.mark.parametrize("name", ["test-async", "test-sync"])
def test_in_loop_model_on_the_held_out_runs_at_x1_5(same_start_validated, name):
    # measured: every p50 within 5%, iteration and TTFT p99 within 10%; TPOT p99 -11.1% (async) / -10.8%
    # (sync) misses the 10% target (docs/validation/README.md: half of it is the compute model on the
    # hardware's own schedule, half the simulated schedule's drift)
    table = same_start_validated[name]
    for metric in ("iteration latency", "TTFT", "TPOT"):
        assert abs(row(table, metric, "p50")["error"]) <= 0.05, metric
    assert [line.split(":")[0] for line in check_targets(table)] == ["TPOT p99"]
    assert -0.12 < row(table, "TPOT", "p99")["error"] < -0.10


def test_replayed_trace_is_rebuilt_from_the_request_records():
    from hwbackend.calibration.validate import trace_of_run

    run = GRAPHS / "test-sync"
    if not (run / "requests.parquet").is_file():
        pytest.skip(f"{run} is not present")
    requests = pd.read_parquet(run / "requests.parquet")
    assert not (run / "trace.parquet").exists()  # the trace itself is not copied into the repository
    trace = trace_of_run(run, requests)
    ordered = requests.sort_values("arrival_at_us", kind="stable")
    assert np.array_equal(np.round(trace["arrival_s"].to_numpy() * 1e7), np.round(ordered["arrival_at_us"].to_numpy() * 10))
    assert trace["prompt_tokens"].tolist() == ordered["prompt_tokens"].tolist()
    assert trace["output_tokens"].tolist() == ordered["output_tokens"].tolist()


def test_compute_model_on_the_hardware_batches():
    from hwbackend.calibration.validate import same_batches_error

    run = SAME_START / "train-a-sync"
    if not (run / "shapes.parquet").is_file():
        pytest.skip(f"{run} is not present")
    config = config_from_run(json.loads((run / "config.json").read_text()))
    frame = same_batches_error(run, config, str(PROFILE)).set_index("stat")
    iterations = pd.read_parquet(run / "iterations.parquet")
    # the hardware column is the measured duration minus the mapping part of the stall: never above duration
    assert frame.loc["p50", "hw_ms"] <= iterations["duration_us"].median() / 1e3
    assert frame.loc["per-iteration |error| median", "error"] < 0.05  # a run the fit was made on (3.3% over the three)
    # a run from before max_context_tokens was logged cannot evaluate the wave term: no table, not a wrong one
    assert same_batches_error(GRAPHS / "test-sync", config, str(PROFILE)) is None


def test_eager_runs_are_simulated_with_the_grid_fit_under_auto():
    from hwbackend.calibration.validate import matching_compute_model

    eager = json.loads((RUN / "config.json").read_text())
    assert not eager.get("cuda_graphs")
    assert matching_compute_model(eager, str(PROFILE), "auto") == "tiled"
    assert matching_compute_model(eager, str(PROFILE), "in-loop") == "in-loop"
    assert matching_compute_model({"cuda_graphs": True}, str(PROFILE), "auto") == "auto"


def test_mapping_stall_removes_the_policy_step_only_where_an_iteration_mapped():
    from hwbackend.calibration.inloop import mapping_stall_us

    # step medians 70 us over the three iterations that mapped nothing; the two that mapped lose 70 us each,
    # the second clipped at 0 (a stall shorter than the step maps nothing measurable)
    iterations = pd.DataFrame({"sync_stall_us": [60.0, 70.0, 90.0, 3070.0, 50.0],
                               "sync_map_page_groups": [0, 0, 0, 1, 2]})
    mapping_us, step_us = mapping_stall_us(iterations)
    assert step_us == 70.0
    assert mapping_us.tolist() == [0.0, 0.0, 0.0, 3000.0, 0.0]
    simulated = pd.DataFrame({"sync_stall_us": [0.0, 0.0, 2600.0], "sync_map_page_groups": [0, 0, 1]})
    assert mapping_stall_us(simulated)[0].tolist() == [0.0, 0.0, 2600.0]  # simulator records: unchanged


def test_tpot_on_the_hardware_schedule_by_hand():
    from hwbackend.calibration.validate import tpot_on_hardware_schedule

    # three iterations of 10, 20, 30 us ending at 10, 30, 60; request A: first token at 10, done at 60 with
    # 3 output tokens -> (20 + 30) / 2 = 25 us measured; modelled durations 10, 10, 10 -> (10 + 10) / 2 = 10 us
    rows = pd.DataFrame({"iteration": [0, 1, 2], "start_at_us": [0.0, 10.0, 30.0], "duration_us": [10.0, 20.0, 30.0]})
    requests = pd.DataFrame({"status": ["finished", "finished", "rejected"], "output_tokens": [3, 1, 5],
                             "first_token_at_us": [10.0, 30.0, np.nan], "completion_at_us": [60.0, 30.0, np.nan]})
    frame = tpot_on_hardware_schedule(rows, np.array([10.0, 10.0, 10.0]), requests).set_index("stat")
    row50 = frame.loc["TPOT p50 on the hardware's schedule"]
    assert row50["hw_ms"] == pytest.approx(0.025) and row50["sim_ms"] == pytest.approx(0.010)
    assert row50["error"] == pytest.approx(0.010 / 0.025 - 1)


def test_binned_error_groups_iterations_by_longest_context_and_batch_size():
    """Four iterations, hand-made: two short-context single-sequence ones (model 10% low), two long-context
    batches of 20 (model 20% high)."""
    from hwbackend.calibration.validate import binned_error

    rows = pd.DataFrame({"max_context_tokens": [100, 900, 5000, 5500], "batch_size": [1, 1, 20, 20]})
    measured = np.array([1000.0, 2000.0, 3000.0, 4000.0])
    predicted = measured * np.array([0.9, 0.9, 1.2, 1.2])
    bins = binned_error(rows, predicted, measured).set_index(["by", "bin"])
    short = bins.loc[("longest context (tokens)", "0-1,023")]
    assert short["iterations"] == 2 and short["hw_p50_ms"] == 1.5 and abs(short["error_p50"] + 0.1) < 1e-12
    assert bins.loc[("longest context (tokens)", "4,096-6,143"), "abs_error_median"] == pytest.approx(0.2)
    assert bins.loc[("batch size", "1"), "iterations"] == 2 and bins.loc[("batch size", "17-32"), "iterations"] == 2
    assert len(bins) == 4          # empty bins are left out
