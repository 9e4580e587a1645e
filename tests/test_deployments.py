"""Issue 21 end to end: --model PATH / --gpu PATH / --pp on the command line, notes and derived figures in
config.json, cost per request in capacity and sweeps, --arrival offline and --sample."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import traces
from cli import main

AZURE_CONV = "../shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"


@pytest.fixture
def lengths_csv(tmp_path):
    """A length-only trace sorted by prompt length (as some public files are)."""
    path = tmp_path / "lengths.csv"
    prompts = np.arange(100, 100 + 40 * 50, 50)
    pd.DataFrame({"num_prefill_tokens": prompts, "num_decode_tokens": 20}).to_csv(path, index=False)
    return path


def test_offline_arrivals_are_all_at_zero():
    spec = traces.parse_arrival("offline")
    assert spec.kind == "offline"
    assert traces.arrivals_from_spec("offline", 5, np.random.default_rng(0)).tolist() == [0.0] * 5


def test_sample_is_seeded_shuffled_and_gets_fresh_arrivals(lengths_csv):
    table = traces.load_trace(lengths_csv, arrival="poisson:2", seed=0)
    one = traces.shuffle_sample(table, 10, seed=3, arrival="poisson:2")
    again = traces.shuffle_sample(table, 10, seed=3, arrival="poisson:2")
    other = traces.shuffle_sample(table, 10, seed=4, arrival="poisson:2")
    assert one.equals(again) and not one.equals(other)
    assert not np.all(np.diff(one["prompt_tokens"].to_numpy()) > 0)          # no longer sorted by length
    # the 10 arrivals are those --arrival poisson:2 gives any 10 requests with the run's seed
    assert one["arrival_s"].to_numpy() == pytest.approx(traces.arrivals_from_spec("poisson:2", 10,
                                                                                  np.random.default_rng(3)))
    assert set(one["prompt_tokens"]) <= set(table["prompt_tokens"]) and one["prompt_tokens"].is_unique


def test_simulate_offline_sample(tmp_path, lengths_csv, capsys):
    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(lengths_csv), "--arrival", "offline", "--sample", "25", "--out", str(out),
                 "--quiet"]) == 0
    requests = pd.read_parquet(out / "requests.parquet")
    assert len(requests) == 25 and (requests["arrival_at_us"] == 0).all()
    assert "sample 25 shuffled (seed 0)" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--sample", "5", "--num-requests", "3"], "--sample draws from the whole trace; leave out --num-requests"),
    (["--sample", "41"], "--sample 41: the trace has 40 requests"),
    (["--arrival", "steady"], "or 'offline'"),
])
def test_workload_errors_one_line(tmp_path, lengths_csv, capsys, args, message):
    extra = [] if "--arrival" in args else ["--arrival", "poisson:1"]
    assert main(["simulate", "--trace", str(lengths_csv), *extra, *args, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_capacity_refuses_offline(tmp_path, lengths_csv, capsys):
    assert main(["capacity", "--trace", str(lengths_csv), "--arrival", "offline", "--slo", "ttft_p99=2s"]) == 2
    assert "offline" in capsys.readouterr().err


def test_simulate_hf_model_notes_and_config_json(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", "--trace", AZURE_CONV, "--num-requests", "40", "--model", "models/mixtral-8x7b.json",
                 "--gpu", "h100", "--tp", "2", "--pp", "2", "--out", str(out), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "kvsim: note: h100 has no measured VMM latency profile: the H200's" in captured.err
    assert "(tp=2, pp=2)" in captured.out
    config = json.loads((out / "config.json").read_text())
    assert config["vmm_profile_borrowed_from"] == "h200" and config["pp"] == 2 and config["gpus_per_replica"] == 4
    derived = config["model_derived"]
    # Mixtral at tp=2: 2 x 32 layers x 4 KV heads x 128 x 2 B = 65,536 B per token per worker (whole model)
    assert derived["kv_bytes_per_token_per_worker"] == 65_536 and derived["experts"] == 8
    # each stage holds 16 layers: 32,768 B per token per worker
    assert [s["kv_bytes_per_token_per_worker"] for s in derived["pipeline_stages"]] == [32_768, 32_768]


def test_bad_model_file_exit_2_one_line(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    assert main(["simulate", "--model", str(bad), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"kvsim: error: {bad}: field hidden_size is missing"


def test_capacity_prints_requests_per_dollar(tmp_path, capsys):
    result = tmp_path / "cap.json"
    assert main(["capacity", "--trace", AZURE_CONV, "--num-requests", "200", "--gpu", "h100", "--tp", "2",
                 "--slo", "ttft_p99=2s,tpot_p99=100ms", "--tolerance", "0.2", "--quiet", "--json", str(result)]) == 0
    out = capsys.readouterr().out
    record = json.loads(result.read_text())
    # requests per $ = capacity req/s x 3600 / (2 GPUs x $4.76 per GPU-hour)
    assert record["requests_per_usd"] == pytest.approx(record["capacity_req_per_s"] * 3600 / (2 * 4.76))
    assert record["replica_usd_per_hour"] == pytest.approx(9.52)
    assert f"{record['requests_per_usd']:,.0f} requests per $" in out and "$9.52 per replica-hour" in out


def test_capacity_without_a_price_says_so(tmp_path, capsys):
    assert main(["capacity", "--trace", AZURE_CONV, "--num-requests", "100", "--gpu", "h20",
                 "--slo", "ttft_p99=2s", "--tolerance", "0.3", "--quiet"]) == 0
    assert "no $/GPU-hour for h20" in capsys.readouterr().out


def test_sweep_finds_the_cheapest_passing_configuration(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", "--job", "simulate", "--grid", "gpu=h100,l40s", "--grid", "tp=1,2", "--grid", "pp=1,2",
                 "--trace", AZURE_CONV, "--num-requests", "60", "--slo", "tpot_p99=40ms", "--out", str(out),
                 "--workers", "1", "--quiet", "--usd-per-gpu-hour", "2"]) == 0
    table = pd.read_csv(out / "sweep.csv")
    assert (table["gpus_per_replica"] == table["tp"] * table["pp"]).all()
    passing = table[table["passes_slos"]]
    best = passing.loc[passing["requests_per_usd"].idxmax()]
    assert table["cheapest_passing"].sum() == 1 and bool(table.loc[best.name, "cheapest_passing"])
    # every point at $2/GPU-hour: requests per $ = throughput x 3600 / (tp x pp x 2)
    assert best["requests_per_usd"] == pytest.approx(best["throughput_req_per_s"] * 3600 / (best["gpus_per_replica"] * 2))
    line = f"cheapest passing: gpu={best['gpu']} tp={best['tp']} pp={best['pp']}: {best['requests_per_usd']:,.0f} requests per $"
    assert line in capsys.readouterr().out


def test_a_simulate_sweep_without_slos_names_no_cheapest_point(tmp_path, capsys):
    """Without --slo every simulate point ran at the trace's rate: its requests per $ only rank GPU prices, so no
    point is called the cheapest passing one (helper-47); the column stays for the reader."""
    out = tmp_path / "sweep"
    assert main(["sweep", "--job", "simulate", "--grid", "gpu=h100,h200", "--trace", AZURE_CONV, "--num-requests",
                 "40", "--out", str(out), "--workers", "1", "--quiet"]) == 0
    table = pd.read_csv(out / "sweep.csv")
    assert not table["passes_slos"].any() and not table["cheapest_passing"].any()
    assert table["requests_per_usd"].notna().all()
    assert "cheapest passing: none: no --slo was given, so no point is judged" in capsys.readouterr().out


def test_a_page_size_axis_under_a_policy_without_vmm_pages_is_noted(tmp_path, capsys):
    """paged and static map no VMM pages: their page_size points are one configuration (equal rows), and the
    sweep says so before running (helper-47); vAttention's page_size points differ and get no note."""
    out = tmp_path / "sweep"
    assert main(["sweep", "--grid", "page_size=64KiB,2MiB", "--grid", "policy=paged,vattention", "--trace", AZURE_CONV,
                 "--num-requests", "40", "--out", str(out), "--workers", "1", "--quiet"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "page_size does not apply" in line]
    assert len(notes) == 1 and "policy paged" in notes[0] and "page_size=64KiB policy=paged" in notes[0]
    table = pd.read_csv(out / "sweep.csv").set_index(["policy", "page_size"])
    columns = ["ttft_p99_ms", "iterations", "tpot_p99_ms"]
    assert table.loc[("paged", "64KiB"), columns].tolist() == table.loc[("paged", "2MiB"), columns].tolist()


AZURE_CODE = str(Path(AZURE_CONV).with_name("AzureLLMInferenceTrace_code.csv"))


def test_a_sweep_prices_a_base_pd_deployment_at_its_gpus(tmp_path, capsys):
    """Helper-51: ``--pd 2:1`` as a base option (not an axis) was priced as one GPU (3x the requests per $)."""
    out = tmp_path / "s"
    assert main(["sweep", "--job", "capacity", "--pd", "2:1", "--grid", "memory_util=0.9", "--trace", AZURE_CODE,
                 "--num-requests", "200", "--slo", "ttft_p99=2s,tpot_p99=20ms", "--out", str(out), "--quiet",
                 "--tolerance", "0.2"]) == 0
    row = pd.read_csv(out / "sweep.csv").iloc[0]
    assert row["gpus"] == row["gpus_per_replica"] == 3
    assert row["requests_per_usd"] == pytest.approx(row["capacity_req_per_s"] * 3600 / (3 * row["usd_per_gpu_hour"]))
    assert "(3 GPU(s) at $" in capsys.readouterr().out


def test_capacity_pd_prints_and_records_the_deployments_cost(tmp_path, capsys):
    record = tmp_path / "pd.json"
    assert main(["capacity", "--trace", AZURE_CODE, "--num-requests", "200", "--slo", "ttft_p99=2s,tpot_p99=20ms",
                 "--pd", "2:1", "--out", str(record), "--quiet", "--tolerance", "0.2"]) == 0
    data = json.loads(record.read_text())
    assert data["kv_link"] == "ib" and data["deployment_usd_per_hour"] == pytest.approx(3 * 6.35)
    assert data["usd_per_gpu_hour"] == 6.35 and data["price_source"] and data["compute_model"].startswith("in-loop")
    assert (data["prefill_policy"], data["scheduler"], data["prefill_tp"]) == ("vattention 2 MiB async", "sarathi", 1)
    assert data["requests_per_usd"] == pytest.approx(data["capacity_req_per_s"] * 3600 / (3 * 6.35))
    assert f"cost: 3 x h200 at $6.35/GPU-hour = $19.05 per deployment-hour; {data['requests_per_usd']:,.0f}" in \
        capsys.readouterr().out


def test_a_simulate_sweep_fails_an_overloaded_point_as_capacity_does(tmp_path, capsys):
    """Helper-51: at 8x the conversation trace's rate (TTFT growth 0.79 s/s, scheduling delay p50 3.9 s) the
    point passed a loose TTFT bound and was named the cheapest; a capacity step fails it on stability."""
    out = tmp_path / "s"
    assert main(["sweep", "--job", "simulate", "--grid", "rate_scale=1,8", "--trace", AZURE_CONV, "--num-requests",
                 "600", "--slo", "ttft_p99=60s,tpot_p99=100ms", "--out", str(out), "--quiet", "--workers", "1"]) == 0
    table = pd.read_csv(out / "sweep.csv").set_index("rate_scale")
    assert table.loc[8, "ttft_growth_s_per_s"] > 0.05 and not table.loc[8, "passes_slos"]
    assert table.loc[1, "passes_slos"] and "cheapest passing: rate_scale=1:" in capsys.readouterr().out


def test_a_capacity_sweep_warns_of_short_spans(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["sweep", "--job", "capacity", "--grid", "memory_util=0.5,0.9", "--trace", AZURE_CONV,
                 "--num-requests", "200", "--slo", "ttft_p99=2s,tpot_p99=100ms", "--out", str(out), "--quiet",
                 "--tolerance", "0.2"]) == 0
    table = pd.read_csv(out / "sweep.csv")
    assert (table["span_at_capacity_s"] < 600).all()
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("WARNING:"))
    assert line.startswith("WARNING: 2 of 2 points' capacities rest on requests spanning less than 600 s")


def test_a_sweep_reruns_points_when_the_trace_file_changed(tmp_path, capsys):
    """Helper-51: the point key hashed the --trace text, so an edited file (or another file of the same relative
    name) reused the old points silently."""
    trace = tmp_path / "t.csv"
    lines = Path(AZURE_CONV).read_text().splitlines()[:61]
    trace.write_text("\n".join(lines) + "\n")
    command = ["sweep", "--grid", "memory_util=0.5,0.9", "--trace", str(trace), "--out", str(tmp_path / "s"),
               "--quiet", "--workers", "1"]
    assert main(command) == 0 and main(command) == 0
    assert "(0 run now, 2 already in" in capsys.readouterr().out
    doubled = [lines[0]] + [",".join([f.split(",")[0], str(2 * int(f.split(",")[1])), f.split(",")[2]])
                            for f in lines[1:]]
    trace.write_text("\n".join(doubled) + "\n")
    assert main(command) == 0
    assert "(2 run now, 0 already in" in capsys.readouterr().out
    # an edit of the same size with the modification time put back: the content is keyed, not the mtime
    import os
    stat = trace.stat()
    edited = "\n".join(doubled).replace(",2", ",4", 1) + "\n"
    assert len(edited) == stat.st_size
    trace.write_text(edited)
    os.utime(trace, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert main(command) == 0
    assert "(2 run now, 0 already in" in capsys.readouterr().out


def test_check_replicas_warns_when_session_hash_cannot_spread(tmp_path, capsys):
    mooncake = str(Path(AZURE_CONV).parents[1] / "mooncake_fast25" / "conversation_trace.jsonl")
    main(["capacity", "--trace", mooncake, "--num-requests", "200", "--slo", "ttft_p99=5s,tpot_p99=100ms",
          "--target-rate", "10", "--check-replicas", "--routing", "session-hash", "--quiet", "--tolerance", "0.3"])
    assert "kvsim: warning: --check-replicas: session-hash: the 200 requests have 1 distinct session key" in \
        capsys.readouterr().err


def test_a_sweep_refuses_a_missing_trace_before_any_point_runs(tmp_path, capsys):
    """Helper-52: a missing --trace failed every point, and the failed points were stored (and reused)."""
    out = tmp_path / "s"
    assert main(["sweep", "--grid", "max_batch=64,128", "--trace", str(tmp_path / "nope.csv"), "--out", str(out),
                 "--quiet"]) == 2
    assert "no such file, and not a trace name" in capsys.readouterr().err and not out.exists()


def test_a_sweep_reruns_points_whose_gpu_file_changed_and_failed_points(tmp_path, capsys):
    """Helper-53: a point's key hashed the option text, so an edited GPU TOML (4.8 -> 1.0 TB/s) gave the old
    TPOT from the stored point; and a stored failed point was never run again (its old error quoted after its
    cause was fixed). Both run again now; an axis value that no point can configure is refused before any runs."""
    import json

    def write_gpu(bandwidth: float, flops: float = 989e12) -> None:
        gpu.write_text(f"full_name = \"test H200\"\nhbm_bytes = 150754820096\nbf16_flops = {flops!r}\nfp8_flops = 1979e12\n"
                       f"mem_bw_bytes_per_s = {bandwidth!r}\nnvlink_bytes_per_s = 450e9\npcie_bytes_per_s = 64e9\n"
                       "vmm_measured = true\n")
    gpu = tmp_path / "g.toml"
    write_gpu(4.8e12)
    out = tmp_path / "s"
    command = ["sweep", "--grid", f"gpu=h200,{gpu}", "--num-requests", "20", "--out", str(out), "--quiet",
               "--workers", "1", "--profile", "roofline"]
    assert main(command) == 0 and main(command) == 0
    assert "(0 run now, 2 already in" in capsys.readouterr().out
    write_gpu(1.0e12)
    assert main(command) == 0
    assert "(1 run now, 1 already in" in capsys.readouterr().out
    table = pd.read_csv(out / "sweep.csv")
    assert table["tpot_p50_ms"].iloc[1] > 3 * table["tpot_p50_ms"].iloc[0]    # decode is bandwidth-bound
    # (points/ also holds the point of the GPU file before its edit: the h200 point is the one to fail)
    stored = next(path for path in (out / "points").glob("*.json")
                  if json.loads(path.read_text())["point"] == {"gpu": "h200"})
    record = json.loads(stored.read_text())
    stored.write_text(json.dumps({**record, "status": "error", "error": "RuntimeError: gone", "result": {}}))
    assert main(command) == 0
    assert "(1 run now, 1 already in" in capsys.readouterr().out
    assert (pd.read_csv(out / "sweep.csv")["status"] == "ok").all()
    write_gpu(1.0e12, flops=0.0)
    assert main(command) == 2
    assert f"--grid gpu={gpu}: " in capsys.readouterr().err
