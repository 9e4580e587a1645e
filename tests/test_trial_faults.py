"""Faults a new user's trial found (2026-12-02), each as the behaviour it must have: a profile's host-copy rates
are checked, ``capacity --out FILE --force`` replaces only a capacity result, runs started in the same second
get their own default directories, a named trace is the published file or is refused (and kept), and a stray
comma is refused in every comma-separated option."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.output import _remove_if_empty, default_out_dir, is_capacity_file  # noqa: E402
from cli import main  # noqa: E402
from sim.frontend.colocate_options import parse_tenant_spec  # noqa: E402
from sim.frontend.policy_spec import parse_policy  # noqa: E402
from sim.memory.tiers import parse_kv_tier  # noqa: E402
from sim.setup.config import ConfigError  # noqa: E402
from sim.timing.latency import ProfileError, read_profile  # noqa: E402
from sim.units import comma_items  # noqa: E402
from traces import TraceError  # noqa: E402

AZURE_CODE = ROOT.parent / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"


@pytest.mark.parametrize("field, value", [("h2d_bytes_per_s", 0), ("d2h_bytes_per_s", -5e10), ("latency_us", -1.0)])
def test_host_copy_rates_are_checked(tmp_path, field, value):
    profile = json.loads((ROOT / "profiles" / "h200.json").read_text())
    profile["host_copy"][field] = value
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    with pytest.raises(ProfileError, match=f"field host_copy.{field} must be"):
        read_profile(path)


def test_capacity_force_replaces_only_its_own_file(tmp_path, capsys):
    mine = tmp_path / "notes.txt"
    mine.write_text("precious\n")
    argv = ["capacity", "--num-requests", "40", "--slo", "ttft_p99=2s", "--quiet", "--force"]
    assert main(argv + ["--out", str(mine)]) == 2
    assert mine.read_text() == "precious\n"
    assert "is not a capacity result kvsim wrote" in capsys.readouterr().err
    other_json = tmp_path / "x.json"
    other_json.write_text('{"x": 1}\n')
    assert main(argv + ["--out", str(other_json)]) == 2 and other_json.read_text() == '{"x": 1}\n'
    ours = tmp_path / "cap.json"
    assert main(argv + ["--out", str(ours)]) == 0 and is_capacity_file(ours)
    assert main(argv + ["--out", str(ours)]) == 0 and json.loads(ours.read_text())["written_by"] == "kvsim capacity"


def test_default_directories_are_claimed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first, second = default_out_dir(), default_out_dir()
    assert first != second and first.is_dir() and second.is_dir()
    (second / "x").write_text("")
    _remove_if_empty(first)
    _remove_if_empty(second)
    assert not first.exists() and second.exists()      # an unused claim goes, a written one stays


def test_runs_started_together_keep_their_results(tmp_path):
    command = [sys.executable, str(ROOT / "cli.py"), "simulate", "--num-requests", "30", "--quiet"]
    runs = [subprocess.Popen(command + ["--seed", str(seed)], cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL) for seed in (1, 2, 3)]
    assert [run.wait(timeout=120) for run in runs] == [0, 0, 0]
    seeds = sorted(json.loads((d / "config.json").read_text())["seed"] for d in (tmp_path / "runs").iterdir())
    assert seeds == [1, 2, 3]
    assert subprocess.run(command + ["--trace", str(tmp_path / "missing.csv")], cwd=tmp_path,
                          capture_output=True).returncode == 2
    assert len(list((tmp_path / "runs").iterdir())) == 3          # a refused run leaves no empty directory


@pytest.mark.skipif(not AZURE_CODE.is_file(), reason="needs ../shared/traces")
def test_a_named_trace_must_be_the_published_file(tmp_path, monkeypatch):
    from traces.named import fetch_trace, resolve_trace
    monkeypatch.setenv("KVSIM_DATA", str(tmp_path))
    copy = tmp_path / "AzureLLMInferenceTrace_code.csv"
    copy.write_text("".join(AZURE_CODE.read_text().splitlines(keepends=True)[:5]))     # a truncated copy
    with pytest.raises(TraceError, match="SHA-256 mismatch.*the file was kept"):
        resolve_trace("azure-code-2023")
    with pytest.raises(TraceError, match="the file was kept"):
        fetch_trace("azure-code-2023")
    assert copy.is_file() and len(copy.read_text().splitlines()) == 5
    assert resolve_trace(str(copy)) == copy                         # by its path it is used as it is
    copy.write_bytes(AZURE_CODE.read_bytes())
    assert resolve_trace("azure-code-2023") == copy


def test_comma_items():
    assert comma_items(" a=1 , b ", "x") == ["a=1", "b"] and comma_items("", "x") == []
    with pytest.raises(ValueError, match="objective 2 of 2 is empty"):
        comma_items("a,", "x", "objective")
    for text, where in (("a,", "item 2 of 2"), (",a", "item 1 of 2"), ("a,,b", "item 2 of 3")):
        with pytest.raises(ValueError, match=f"x '{text}': {where} is empty"):
            comma_items(text, f"x {text!r}")


@pytest.mark.parametrize("parse, text", [
    (parse_policy, "paged:block=16,"), (parse_policy, "paged:"), (parse_policy, "vattention:sync,,page=2MiB"),
    (parse_kv_tier, "dram:1GiB,"), (lambda text: parse_tenant_spec(text, 0), "model=qwen2.5-7b,")])
def test_a_stray_comma_is_refused(parse, text):
    with pytest.raises((ConfigError, ValueError), match="empty|nothing after"):
        parse(text)


def test_specs_without_stray_commas_still_parse():
    assert parse_policy("paged:block=16")["block_size_tokens"] == 16 and parse_policy("paged")["policy"] == "paged"
    assert parse_kv_tier("dram:1GiB").capacity_bytes == 1 << 30


def test_several_bad_rows_name_the_first(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,0\n"
                     "2023-11-16 18:15:50.9951690,0,26\n")
    assert main(["traces", "stats", str(trace)]) == 2
    assert "line 2, column 'GeneratedTokens': token count must be >= 1" in capsys.readouterr().err


def test_a_negative_duration_says_it_must_be_positive():
    from sim.units import parse_duration_us, parse_size_bytes
    for text in ("-1s", "0s"):
        with pytest.raises(ValueError, match="duration must be positive"):
            parse_duration_us(text)
    with pytest.raises(ValueError, match="size must be a positive"):
        parse_size_bytes("-2MiB")


def test_stats_of_simultaneous_arrivals_say_undefined(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n0,12,6\n0,8,3\n")
    assert main(["traces", "stats", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "mean_rate_per_s  undefined (every request arrives at the same instant" in out and "nan" not in out


def test_convert_writes_only_a_parquet_name(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n1,12,6\n")
    assert main(["traces", "convert", str(trace), "--out", str(tmp_path / "x.csv")]) == 2
    assert not (tmp_path / "x.csv").exists() and "writes Parquet" in capsys.readouterr().err
    assert main(["traces", "convert", str(trace), "--out", str(tmp_path / "x.parquet")]) == 0


def test_report_and_compare_take_each_run_once(tmp_path, capsys):
    run = tmp_path / "r"
    assert main(["simulate", "--num-requests", "20", "--out", str(run), "--quiet"]) == 0
    assert main(["report", str(run), str(tmp_path / "." / "r"), "--out", str(tmp_path / "rep.html")]) == 2
    assert "given twice" in capsys.readouterr().err and not (tmp_path / "rep.html").exists()
    import analysis
    assert list(analysis.compare([str(run)]).index) == list(analysis.compare([analysis.load_run(run)]).index)


def test_a_jsonl_trace_may_start_with_a_byte_order_mark(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    body = ('{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]}\n'
            '{"timestamp": 10, "input_length": 100, "output_length": 10, "hash_ids": [1]}\n')
    trace.write_bytes(b"\xef\xbb\xbf" + body.encode())
    plain = tmp_path / "p.jsonl"
    plain.write_text(body)
    assert main(["traces", "stats", str(trace)]) == 0
    with_mark = capsys.readouterr().out.splitlines()[1:]
    assert main(["traces", "stats", str(plain)]) == 0
    assert with_mark == capsys.readouterr().out.splitlines()[1:]


def test_vattention_flags_with_another_policy_get_a_note(tmp_path, capsys):
    assert main(["simulate", "--num-requests", "20", "--policy", "paged", "--sync-mapping", "--no-deferred-reclaim",
                 "--out", str(tmp_path / "p"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "--sync-mapping sets vAttention's page mapping; the paged policy" in err
    assert "--no-deferred-reclaim sets vAttention's page mapping" in err
    assert main(["simulate", "--num-requests", "20", "--sync-mapping", "--out", str(tmp_path / "v"), "--quiet"]) == 0
    assert "changes nothing" not in capsys.readouterr().err


def test_the_synthetic_workload_is_bounded(capsys):
    from traces.workload import MAX_SYNTHETIC_REQUESTS
    assert main(["simulate", "--skip-requests", str(MAX_SYNTHETIC_REQUESTS), "--quiet"]) == 2
    assert f"holds at most {MAX_SYNTHETIC_REQUESTS:,}" in capsys.readouterr().err


def test_a_value_starting_with_a_dash_gets_a_hint(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--page-size", "-2MiB"])
    assert exit_.value.code == 2
    assert "write --page-size=-2MiB to pass it as a value" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["simulate", "--page-size"])
    assert "starts with '-'" not in capsys.readouterr().err


HW_RUN = ROOT / "docs" / "validation" / "same-start" / "test-async-x1"


@pytest.mark.parametrize("damage, message", [
    ("iterations cut", "the iteration table is cut short"), ("starts negated", "iterations must start in their order"),
    ("requests cut", "500 requests, but"), ("request twice", "appears twice")])
def test_validate_refuses_files_of_different_runs(tmp_path, capsys, damage, message):
    import pandas as pd
    import shutil
    run = tmp_path / "run"
    shutil.copytree(HW_RUN, run)
    iterations, requests = pd.read_parquet(run / "iterations.parquet"), pd.read_parquet(run / "requests.parquet")
    if damage == "iterations cut":
        iterations.head(1000).to_parquet(run / "iterations.parquet", index=False)
    elif damage == "starts negated":
        iterations.assign(start_at_us=-iterations["start_at_us"]).to_parquet(run / "iterations.parquet", index=False)
    elif damage == "requests cut":
        requests.head(500).to_parquet(run / "requests.parquet", index=False)
    else:
        pd.concat([requests, requests.head(3)]).to_parquet(run / "requests.parquet", index=False)
    assert main(["validate", "--hw-run", str(run), "--profile", str(ROOT / "profiles" / "h200.json")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_every_committed_hardware_run_is_consistent():
    from hwbackend.calibration.run_files import load_hw_run
    runs = [c.parent for c in (ROOT / "docs" / "validation").rglob("config.json")
            if json.loads(c.read_text()).get("backend") == "hardware" and (c.parent / "requests.parquet").exists()]
    assert len(runs) > 50
    for run in runs:
        load_hw_run(run)


def test_validate_names_its_compute_model_and_the_options_it_ignores(tmp_path, capsys):
    assert main(["validate", "--hw-run", str(HW_RUN), "--memory-util", "0.5", "--out", str(tmp_path / "v")]) == 0
    captured = capsys.readouterr()
    assert "--memory-util ignored" in captured.err and "compute model: in-loop (compute_in_loop of" in captured.out


@pytest.mark.parametrize("devices, message", [("cpu,cpu", None), ("cpu,cuda:0", "all ranks on the CPU"),
                                              ("bogus", "'bogus' is not cpu or cuda:N")])
def test_allreduce_says_what_it_needs_in_one_line(devices, message):
    import importlib.util
    if message is None:
        if importlib.util.find_spec("torch") is not None:
            pytest.skip("torch is installed: gloo would run")
        message = "needs torch, also on the CPU (gloo)"
    done = subprocess.run([sys.executable, "-m", "hwbackend.replay.tp.allreduce", "--devices", devices],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_tier_specs_refuse_a_repeated_key_and_a_tier_below_one_page():
    with pytest.raises(ValueError, match="key 'bw' given twice"):
        parse_kv_tier("dram:10GiB,bw=5GB/s,bw=6GB/s")
    from sim.setup.config import SimConfig
    with pytest.raises(ConfigError, match="less than one cache page"):
        SimConfig(policy="paged", prefix_caching=True, kv_tiers=(parse_kv_tier("dram:1KiB"),))


def test_colocated_tenants_that_differ_are_both_named(tmp_path, capsys):
    assert main(["colocate", "--tenant", "model=llama-3.1-8b,num-requests=10,policy=vattention:page=4MiB",
                 "--tenant", "model=qwen2.5-7b,num-requests=10", "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "tenants t0-llama-3.1-8b and t1-qwen2.5-7b differ (--page-size 2 MiB against 4 MiB)" in err


def test_cache_aware_routing_without_a_prefix_to_match_says_so(tmp_path, capsys):
    assert main(["simulate", "--num-requests", "30", "--replicas", "2", "--routing", "prefix-aware",
                 "--out", str(tmp_path / "r"), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "prefix cache, which is off" in captured.err and "2 replicas (prefix-aware" in captured.out
    assert main(["simulate", "--num-requests", "30", "--replicas", "2", "--out", str(tmp_path / "s"), "--quiet"]) == 0
    assert "placed by load alone" not in capsys.readouterr().err


def test_tenant_keys_without_effect_get_a_note(tmp_path, capsys):
    assert main(["colocate", "--tenant", "model=llama-3.1-8b,num-requests=10,sleep-weights=yes,slo=ttft_p99=2s",
                 "--tenant", "model=qwen2.5-7b,num-requests=10", "--out", str(tmp_path / "c")]) == 0
    err = capsys.readouterr().err
    assert "sleep-weights=yes has no effect without sleep-after=" in err
    assert "slo= is judged by kvsim capacity --colocate only" in err and "no trace=" in err


def test_tier_policy_flags_without_a_tier_get_a_note(tmp_path, capsys):
    assert main(["simulate", "--num-requests", "10", "--kv-tier-load", "layerwise", "--out", str(tmp_path / "t"),
                 "--quiet"]) == 0
    assert "--kv-tier-load layerwise sets how KV tiers are used; no --kv-tier is given" in capsys.readouterr().err


@pytest.mark.skipif(not (ROOT.parent / "shared" / "traces" / "mooncake_fast25").is_dir(), reason="needs ../shared")
def test_report_says_when_a_tiered_run_lacks_its_occupancy_table(tmp_path, capsys):
    run = tmp_path / "tier"
    trace = ROOT.parent / "shared" / "traces" / "mooncake_fast25" / "conversation_trace.jsonl"
    assert main(["simulate", "--trace", str(trace), "--model", "llama-3.1-8b", "--num-requests", "60", "--policy",
                 "paged:prefix=on", "--kv-tier", "dram:64GiB", "--out", str(run), "--quiet"]) == 0
    (run / "tiers.parquet").unlink()
    capsys.readouterr()
    assert main(["report", str(run), "--out", str(tmp_path / "r.html")]) == 0
    assert "no tiers.parquet: the report leaves out its tier occupancy figure" in capsys.readouterr().err


@pytest.mark.parametrize("damage, message", [
    ("nan arrival", "row 3: not a finite time"), ("shuffled", "rows must be sorted by arrival"),
    ("negative arrival", "negative"), ("repeated id", "appears twice"), ("fractional tokens", "not a whole number"),
    ("zero tokens", "must be >= 1"), ("missing column", "missing column(s) output_tokens")])
def test_the_simulator_refuses_a_table_that_is_not_canonical(damage, message):
    """A NaN arrival never came (the run did not end), an unsorted table was served out of order: every such
    table is refused with the column and row, before the run."""
    import numpy as np
    import traces
    from sim.core.engine import TraceTableError
    from sim.core.runner import run_simulation
    from sim.setup.config import SimConfig
    table = traces.synthesize(20, "poisson:5.5", seed=0)
    damaged = {"nan arrival": lambda t: t.assign(arrival_s=t["arrival_s"].where(t.index != 3, np.nan)),
               "shuffled": lambda t: t.sample(frac=1, random_state=1),
               "negative arrival": lambda t: t.assign(arrival_s=t["arrival_s"] - 10),
               "repeated id": lambda t: t.assign(request_id=0),
               "fractional tokens": lambda t: t.assign(prompt_tokens=t["prompt_tokens"] + 0.7),
               "zero tokens": lambda t: t.assign(prompt_tokens=0),
               "missing column": lambda t: t.drop(columns=["output_tokens"])}[damage](table)
    with pytest.raises(TraceTableError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run_simulation(SimConfig(), damaged)
    with pytest.raises(TypeError, match="expected a table with columns"):
        run_simulation(SimConfig(), table.to_dict("records"))


@pytest.mark.parametrize("field, value, message", [
    ("sync_mapping", "False", "must be true or false"), ("token_budget", True, "must be a whole number"),
    ("token_budget", 2048.0, "must be a whole number"), ("token_budget", float("nan"), "must be a whole number"),
    ("seed", -3, "must be >= 0"), ("seed", "1", "must be a whole number"), ("model", 8, "must be a name"),
    ("memory_util_frac", "0.9", "must be a number")])
def test_a_config_value_of_the_wrong_kind_is_refused(field, value, message):
    from sim.setup.config import SimConfig
    with pytest.raises(ConfigError, match=f"{field}=.*{message}"):
        SimConfig(**{field: value})
    import numpy as np
    assert SimConfig(token_budget=np.int64(512), memory_util_frac=1).token_budget == 512   # numpy ints, ints as floats


@pytest.mark.skipif(not (ROOT.parent / "shared" / "traces" / "mooncake_fast25").is_dir(), reason="needs ../shared")
def test_replicas_merge_their_prefix_counters(tmp_path):
    """The merged summary of prefix-cached replicas carries the summed counters (it said 0 prefill tokens saved
    while the request table held 50,176 hit tokens)."""
    import pandas as pd
    trace = ROOT.parent / "shared" / "traces" / "mooncake_fast25" / "conversation_trace.jsonl"
    run = tmp_path / "rep"
    assert main(["simulate", "--policy", "vattention:prefix=on", "--routing", "prefix-aware", "--replicas", "2",
                 "--trace", str(trace), "--model", "llama-3.1-8b", "--num-requests", "60", "--workers", "1",
                 "--quiet", "--out", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    hits = int(pd.read_parquet(run / "requests.parquet")["prefix_hit_tokens"].sum())
    assert hits > 0 and summary["prefill_tokens_saved"] == hits and "prefix_evictions" in summary


def test_a_vidur_profile_is_not_called_a_harness_fit(tmp_path, capsys):
    assert main(["simulate", "--gpu", "a100", "--model", "llama-2-7b", "--profile",
                 str(ROOT / "profiles" / "vidur-a100-llama-2-7b.json"), "--num-requests", "20",
                 "--out", str(tmp_path / "v"), "--quiet"]) == 0
    assert "PyTorch harness" not in capsys.readouterr().err


def test_compare_takes_run_policies_dict():
    import analysis
    from analysis.comparison import run_policies
    import traces
    from sim.setup.config import SimConfig
    trace, _ = traces.clip_context(traces.synthesize(30, "poisson:5", seed=0), SimConfig().slot_max_tokens)
    runs = run_policies(SimConfig(), ["vattention", "paged"], trace)
    assert list(analysis.compare(runs).index) == list(analysis.compare(list(runs.values())).index)


def test_api_misuse_gets_a_clear_exception(tmp_path, capsys):
    import analysis
    import traces
    from analysis.comparison import run_policies
    from sim.core.runner import run_simulation
    from sim.setup.config import SimConfig
    table = traces.synthesize(5, "poisson:5", seed=0)
    with pytest.raises(TypeError, match="expected a sim.setup.config.SimConfig"):
        run_simulation({"model": "llama-3-8b"}, table)
    with pytest.raises(TypeError, match="expected a string"):
        parse_policy(None)
    with pytest.raises(ValueError, match="no runs given"):
        analysis.compare([])
    with pytest.raises(TypeError, match="a list of policy specs"):
        run_policies(SimConfig(), "vattention", table)
    with pytest.raises(TraceError, match="whole number of tokens"):
        traces.clip_context(table, float("nan"))
    # found by a new user's trial (stop 48): each of these was a raw AttributeError / pathlib TypeError, or a
    # result for nothing (an empty trace's NaN summary; a capacity without SLOs)
    from analysis.planning.capacity import find_capacity
    with pytest.raises(ValueError, match="trace: no requests"):
        run_simulation(SimConfig(), table.iloc[:0])
    with pytest.raises(TypeError, match="profile_path: expected a profile JSON's path"):
        run_simulation(SimConfig(), table, profile_path=5)
    with pytest.raises(TypeError, match="compare: expected a list of runs"):
        analysis.compare(None)
    with pytest.raises(TypeError, match="with_overrides: expected a mapping"):
        SimConfig().with_overrides("paged")
    with pytest.raises(ValueError, match="capacity needs at least one objective"):
        find_capacity(SimConfig(), table, ())
    assert find_capacity(SimConfig(), table, "ttft_p99=2s", 0.3).rate_per_s > 0      # the --slo text is taken
    assert main(["capacity", "--num-requests", "20", "--slo", "ttft_p99=2s", "--json", str(tmp_path / "c.json"),
                 "--quiet"]) == 0
    assert "--json is deprecated" in capsys.readouterr().err and is_capacity_file(tmp_path / "c.json")


SHARED_CASES = ROOT.parent / "shared" / "cases"


@pytest.mark.parametrize("flags, expected", [
    (["--page-size", "3KiB"], "kvsim: error: --page-size 3072 B: must be a power of two >= 64KiB"),
    (["--memory-util", "0.01"], "kvsim: error: --memory-util 0.01: llama-3-8b's weights"),
    (["--gpu", "nosuchgpu"], "kvsim: error: unknown GPU 'nosuchgpu'"),
])
def test_a_colocate_shared_flag_error_names_the_flag_not_the_first_tenant(tmp_path, capsys, flags, expected):
    """--gpu, --page-size and --memory-util hold for every tenant: their errors are the flag's, as simulate's."""
    tenants = ["--tenant", f"model=llama-3-8b,trace={SHARED_CASES / 'admit_steal.csv'}",
               "--tenant", f"model=llama-3-8b,trace={SHARED_CASES / 'eager_admit.csv'}"]
    assert main(["colocate", *tenants, *flags, "--out", str(tmp_path / "o"), "--no-report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(expected) and "--tenant" not in err[0]


def test_a_colocate_gpu_file_error_names_the_file_and_a_tenants_own_page_names_the_tenant(tmp_path, capsys):
    gpu = tmp_path / "bad.toml"
    gpu.write_text('name = "bad"\n')
    tenant = f"model=llama-3-8b,trace={SHARED_CASES / 'admit_steal.csv'}"
    assert main(["colocate", "--tenant", tenant, "--gpu", str(gpu), "--out", str(tmp_path / "o"), "--no-report"]) == 2
    assert capsys.readouterr().err.strip() == f"kvsim: error: {gpu}: field bf16_flops is missing"
    assert main(["colocate", "--tenant", tenant + ",policy=vattention:page=3KiB", "--out", str(tmp_path / "o"),
                 "--no-report"]) == 2
    assert capsys.readouterr().err.strip().startswith("kvsim: error: --tenant t0-llama-3-8b: policy "
                                                      "'vattention:page=3KiB': page=3072 B")


@pytest.mark.parametrize("edit, field, problem", [
    (lambda p: p["compute_in_loop"].__setitem__("models", "not-yi-6b"), "compute_in_loop.models", "a list of names"),
    (lambda p: p["compute_in_loop"].__setitem__("models", [1, 2]), "compute_in_loop.models[0]", "a name"),
    (lambda p: p["compute_in_loop"]["params"].__setitem__("flops_efficiency", 50), "compute_in_loop.params.flops_efficiency",
     "in (0, 1]"),
    (lambda p: p["compute_in_loop"]["params"].__setitem__("bw_efficiency", 1.0000001), "compute_in_loop.params.bw_efficiency",
     "in (0, 1]"),
    (lambda p: p.__setitem__("environment", "NVIDIA H200"), "environment", "an object"),
    (lambda p: p.setdefault("compute", {}).__setitem__("gpu_name", 5), "compute.gpu_name", "a name"),
    (lambda p: p["vmm_in_loop"].__setitem__("tp", "two"), "vmm_in_loop.tp", "the tensor-parallel degree"),
    (lambda p: p["vmm_in_loop"].__setitem__("models", {"a": 1}), "vmm_in_loop.models", "a list of names"),
])
def test_a_profile_field_of_the_wrong_kind_is_refused_by_name(tmp_path, edit, field, problem):
    """A string ``models`` was matched by substring (a fit applied to yi-6b), efficiencies above the datasheet
    peak ran 3-30x faster than the GPU, and a string ``environment`` or ``tp`` raised a traceback."""
    profile = json.loads((ROOT / "profiles" / "h200-engine.json").read_text())
    edit(profile)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    with pytest.raises(ProfileError) as error:
        read_profile(path)
    assert str(error.value).startswith(f"profile {path}: field {field} must be ") and problem in str(error.value)


AZURE_CODE_TRACE = ROOT.parent / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"


@pytest.mark.parametrize("flags", [["--routing", "random"], ["--workers", "4"], ["--executor", "ray"]])
def test_a_pd_run_refuses_the_replica_flags_it_would_ignore(tmp_path, capsys, flags):
    """--pd routes by least outstanding requests: --routing, --workers and --executor changed nothing (same md5)."""
    assert main(["simulate", "--trace", str(AZURE_CODE_TRACE), "--num-requests", "20", "--pd", "1:1", *flags,
                 "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kvsim: error: {flags[0]} {flags[1]} applies to co-located replicas") and "\n" not in err
    assert not (tmp_path / "o").exists()


def test_workers_with_one_replica_are_noted(tmp_path, capsys):
    assert main(["simulate", "--trace", str(AZURE_CODE_TRACE), "--num-requests", "10", "--workers", "3",
                 "--out", str(tmp_path / "o"), "--quiet"]) == 0
    assert "kvsim: note: --workers 3 spreads replicas over processes; one replica runs in this process" in \
        capsys.readouterr().err


@pytest.mark.parametrize("change, needle", [({"num_prefill": 1.5}, "num_prefill=1.5: expected a whole number"),
                                            ({"num_decode": "2"}, "num_decode='2': expected a whole number"),
                                            ({"link": "nvlink"}, "link='nvlink': expected a KvLink"),
                                            ({"prefill": "h200"}, "prefill: expected a SimConfig")])
def test_a_disagg_config_of_the_wrong_types_is_refused_by_field(change, needle):
    from sim.cluster.disagg import DisaggConfig
    from sim.setup.config import SimConfig
    with pytest.raises(ConfigError, match="^" + needle.replace("(", r"\(").replace(".", r"\.")):
        DisaggConfig(**{"prefill": SimConfig(), "decode": SimConfig(), **change})


def test_a_pd_run_with_an_engine_preset_that_caches_prefixes_names_the_preset(tmp_path, capsys):
    assert main(["simulate", "--trace", str(AZURE_CODE_TRACE), "--num-requests", "20", "--pd", "1:1", "--engine",
                 "vllm-v1", "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert "the engine preset vllm-v1 turns it on: add prefix=off" in capsys.readouterr().err


def _one_run(tmp_path):
    from sim.core.runner import run_simulation
    from sim.setup.config import SimConfig
    import pandas as pd
    trace = pd.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 0.1], "prompt_tokens": [100, 200],
                          "output_tokens": [5, 6]})
    return run_simulation(SimConfig(), trace)


def test_write_run_marks_its_run_so_the_command_line_may_replace_it_and_spares_a_users_summary(tmp_path, capsys):
    from analysis.output import RESULT_MARKER
    from analysis.results import write_run
    run = _one_run(tmp_path)
    out = write_run(run, tmp_path / "api")
    assert (out / RESULT_MARKER).is_file()
    assert main(["simulate", "--trace", str(SHARED_CASES / "admit_steal.csv"), "--out", str(out), "--force",
                 "--quiet"]) == 0                                        # refused before: no marker
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.json").write_text('{"my": "notes"}\n')
    with pytest.raises(FileExistsError, match="holds summary.json but is not a kvsim run"):
        write_run(run, mine, overwrite=True)
    assert (mine / "summary.json").read_text() == '{"my": "notes"}\n'
    with pytest.raises(FileExistsError, match="already holds a kvsim run"):
        write_run(run, out)


def test_write_report_refuses_to_write_over_a_runs_own_files(tmp_path):
    from analysis.report import write_report
    from analysis.results import load_run, write_run
    out = write_run(_one_run(tmp_path), tmp_path / "r")
    run = load_run(out)
    before = (out / "summary.json").read_bytes()
    for target in ("summary.json", "requests.parquet"):
        with pytest.raises(ValueError, match="kvsim never writes over what it reads"):
            write_report([run], out / target)
    assert (out / "summary.json").read_bytes() == before
    assert write_report([run], out / "report.html").is_file()


@pytest.mark.parametrize("name, change, needle", [
    ("iterations.parquet", lambda f: f.assign(duration_us=f["duration_us"].astype(str)),
     "column duration_us must hold numbers, got str values"),
    ("iterations.parquet", lambda f: f.assign(start_at_us=f["start_at_us"].where(f.index != 1, float("inf"))),
     "row 2: column start_at_us must hold finite numbers >= 0, got inf"),
    ("iterations.parquet", lambda f: f.drop(columns=["mapped_page_groups", "free_page_groups"]),
     "missing column(s) mapped_page_groups, free_page_groups that the report draws"),
    ("requests.parquet", lambda f: f.assign(ttft_us=-f["ttft_us"]), "row 1: column ttft_us must hold numbers >= 0 or NaN"),
])
def test_report_names_the_run_file_column_and_row_of_a_corrupt_table(tmp_path, capsys, name, change, needle):
    """A string or infinite column was a TypeError / OverflowError traceback; missing columns named no run."""
    import pandas as pd

    from analysis.results import write_run
    good = write_run(_one_run(tmp_path), tmp_path / "good")
    bad = write_run(_one_run(tmp_path), tmp_path / "bad")
    change(pd.read_parquet(bad / name)).to_parquet(bad / name)
    assert main(["report", str(good), str(bad), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kvsim: error: {bad / name}: ") and needle in err and "\n" not in err, err


def test_report_refuses_a_summary_count_that_is_not_a_number(tmp_path, capsys):
    from analysis.results import write_run
    bad = write_run(_one_run(tmp_path), tmp_path / "bad")
    summary = json.loads((bad / "summary.json").read_text())
    summary["iterations"] = "many"
    (bad / "summary.json").write_text(json.dumps(summary))
    assert main(["report", str(bad), "--out", str(tmp_path / "r.html")]) == 2
    assert "summary.json: field 'iterations' must be a whole number >= 0, got 'many'" in capsys.readouterr().err


def test_a_refused_command_leaves_no_runs_folder_and_a_refused_replay_no_out_folder(tmp_path):
    """``kvsim validate`` without a GPU left an empty runs/ in the working directory, the replays their --out."""
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "cli.py"), "validate", "--num-requests", "5"], cwd=tmp_path,
                          capture_output=True, text=True, env=env)
    assert done.returncode == 2 and "validate:" in done.stderr and not (tmp_path / "runs").exists()
    try:
        import torch  # noqa: F401     (with torch the replay's refusal below is a different one)
    except ImportError:
        done = subprocess.run([sys.executable, "-m", "hwbackend.replay.cli", "--out", str(tmp_path / "a" / "b")],
                              cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 2 and "needs torch" in done.stderr and not (tmp_path / "a").exists()


def test_the_roofline_caveat_is_said_once_and_validation_md_names_the_default_profile(tmp_path, capsys):
    from sim.results.summary import ROOFLINE_CAVEAT, compute_model_text
    once = compute_model_text("roofline (built-in defaults)", "h200")
    assert compute_model_text(once, "h200") == once and once.count(ROOFLINE_CAVEAT.format(gpu="h200")) == 1
    hw = ROOT / "docs" / "validation" / "hw-sync"
    assert main(["validate", "--hw-run", str(hw), "--profile", str(ROOT / "profiles" / "h200.json"), "--compute-model",
                 "roofline", "--out", str(tmp_path / "v")]) == 0
    assert capsys.readouterr().out.count("not validated for h200") == 1
    text = (tmp_path / "v" / "validation.md").read_text()
    assert "compute model: roofline (compute.roofline of" in text and "roofline (roofline" not in text
    assert main(["validate", "--hw-run", str(hw), "--out", str(tmp_path / "w")]) == 0
    assert "profile: `h200-engine.json, h200's default`" in (tmp_path / "w" / "validation.md").read_text()


def test_a_named_pipe_as_profile_is_refused_not_read_forever(tmp_path):
    import os
    fifo = tmp_path / "p.json"
    os.mkfifo(fifo)
    with pytest.raises(ProfileError, match="not a regular file"):
        read_profile(fifo)


def test_a_fit_section_without_an_efficiency_says_the_built_in_value_is_used(tmp_path):
    from sim.core.runner import compute_model_source
    from sim.setup.config import SimConfig
    profile = json.loads((ROOT / "profiles" / "h200-engine.json").read_text())
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    assert "built-in" not in compute_model_source(SimConfig(), str(path))[1]
    del profile["compute_in_loop"]["params"]["flops_efficiency"]
    path.write_text(json.dumps(profile))
    chosen, text = compute_model_source(SimConfig(), str(path))
    assert chosen == "in-loop" and text.endswith("; flops_efficiency built-in (absent from the section))")


def test_the_compute_model_line_names_what_a_profile_still_supplies_and_a_fit_for_another_model(tmp_path):
    """Llama-3.1-70B on the H200: the engine profile's fit is for 8B, yet its paged-attention factor (1.7241) and VMM
    latencies still apply; the Vidur H100 profile fitted on Llama-2-70B applied to Llama-3.1-70B without a word."""
    from sim.core.runner import compute_model_source
    from sim.setup.config import SimConfig
    seventy = str(ROOT / "models" / "llama-3.1-70b.json")
    _, paged = compute_model_source(SimConfig(model=seventy, gpu="h200", tp=4, policy="paged"), None)
    assert paged.startswith("roofline (built-in defaults:") and "h200-engine.json: paged-attention factor 1.7241" in paged
    _, vattention = compute_model_source(SimConfig(model=seventy, gpu="h200", tp=4), None)
    assert "h200-engine.json: VMM latencies" in vattention and "paged-attention" not in vattention
    _, vidur = compute_model_source(SimConfig(model=seventy, gpu="h100", tp=8),
                                    str(ROOT / "profiles" / "vidur-h100-llama-2-70b.json"))
    assert vidur.endswith(f"; fitted for llama-2-70b, applied to {seventy})")
    _, same = compute_model_source(SimConfig(model="llama-2-7b", gpu="a100"),
                                   str(ROOT / "profiles" / "vidur-a100-llama-2-7b.json"))
    assert "fitted for" not in same


def test_a_static_reservation_of_a_whole_long_slot_is_noted_with_the_length_the_trace_needs():
    """Llama-3.1-70B's 131,072-token slot reserved for requests of at most 4,154 tokens: capacity collapsed (0.13
    req/s at tp 4) without a hint; max_len= set, or a slot within 4x the longest request, says nothing."""
    import pandas as pd

    from sim.setup.config import SimConfig
    from traces.workload import static_note
    trace = pd.DataFrame({"prompt_tokens": [4000, 100], "output_tokens": [155, 10]})
    seventy = str(ROOT / "models" / "llama-3.1-70b.json")
    note = static_note(SimConfig(model=seventy, gpu="h100", tp=8, policy="static"), trace)
    assert "reserves a whole slot, 131,072 tokens" in note and "static:max_len=4154" in note
    assert static_note(SimConfig(model=seventy, gpu="h100", tp=8, policy="static", max_len_tokens=8192), trace) is None
    assert static_note(SimConfig(policy="static"), trace) is None          # 8,192 < 4 x 4,154
    assert static_note(SimConfig(model=seventy, gpu="h100", tp=8), trace) is None


def test_compare_prints_each_runs_overload_warning_as_simulate_does(tmp_path, capsys):
    """Helper-47: ``kvsim compare`` printed an overloaded run's latencies without the warning ``simulate`` prints.
    At 8x the conversation trace's rate one H200 cannot keep up (TTFT growth well above the 0.05 s/s bound)."""
    from analysis.summary import attention_lines
    from cli import main
    trace = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    assert main(["compare", "--trace", str(trace), "--num-requests", "1000", "--rate-scale", "8", "--policy",
                 "vattention", "--policy", "paged", "--workers", "1", "--out", str(tmp_path / "c"), "--quiet"]) == 0
    printed = capsys.readouterr().out
    lines = [line for line in printed.splitlines() if line.startswith("WARNING:")]
    assert [line.split(":")[1].strip() for line in lines] == ["vattention", "paged"]
    assert all("overloaded: the queue grows through the run" in line for line in lines)
    assert attention_lines({"ttft_growth_s_per_s": 0.01}) == []       # a run that keeps up: no line


def test_one_token_outputs_print_no_tpot_instead_of_nan():
    """Every output one token long: TPOT and TBT are undefined (summary.json null); the printed summary says so
    in words, as it does for a run that served nothing (helper-48: it printed ``nan / nan / nan ms``)."""
    from analysis.summary import summary_lines
    from sim.core.runner import run_simulation
    from sim.setup.config import SimConfig
    import pandas as pd
    trace = pd.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 0.5], "prompt_tokens": [100, 200],
                          "output_tokens": [1, 1]})
    summary = run_simulation(SimConfig(), trace).summary
    assert summary["finished"] == 2 and summary["tpot_p99_ms"] != summary["tpot_p99_ms"]
    rows = dict(summary_lines(summary))
    assert rows["TPOT p50 / p90 / p99"] == rows["TBT p50 / p99 / max"] == \
        "none: no served request has a second output token"
    assert "nan" not in " ".join(rows.values()) and rows["TTFT p50 / p90 / p99"].endswith("ms")


def test_compare_prints_long_policy_labels_in_full(tmp_path, capsys):
    """Helper-48: the comparison table cut long labels (``vattention:sync,layout=cross-lay…``); its width now
    follows the labels, so each header is the spec as given."""
    from cli import main
    trace = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    specs = ["vattention:sync,layout=cross-layer,page=64KiB", "paged:block=16",
             "vattention:page=256KiB,eager=0,deferred=off", "static"]
    assert main(["compare", "--trace", str(trace), "--num-requests", "10", "--workers", "1", "--quiet",
                 "--out", str(tmp_path / "c"), *[a for spec in specs for a in ("--policy", spec)]]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("metric"))
    assert header.split() == ["metric", *specs] and "…" not in header
