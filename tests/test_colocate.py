"""Co-location (sim.cluster.colocate): static sharing equals separate runs bit for bit, determinism, ceilings,
the compute resource serialising tenants, sleep/wake, the CLI's run directory and its bad-input messages."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import traces
from sim.cluster.colocate import Sharing, Tenant, TenantConfig, kv_pool_bytes, simulate_colocated, tenant_configs
from sim.core.runner import run_simulation
from sim.setup.config import ConfigError, SimConfig


def _trace(seed: int, n: int = 40, rate: float = 20.0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"request_id": np.arange(n), "arrival_s": np.cumsum(rng.exponential(1 / rate, n)),
                         "prompt_tokens": rng.integers(200, 3000, n), "output_tokens": rng.integers(20, 300, n)})


def _tenants(mem: float = 0.3, **extra) -> list[Tenant]:
    return [Tenant("a", SimConfig(model="llama-3.1-8b", memory_util_frac=mem), _trace(1), **extra),
            Tenant("b", SimConfig(model="qwen2.5-7b", memory_util_frac=mem), _trace(2), **extra)]


def test_pool_is_hbm_times_util_minus_every_weight():
    tenants = _tenants()
    c0, c1 = tenants[0].config, tenants[1].config
    expected = int(0.3 * c0.gpu_spec.hbm_bytes) - c0.model_spec.weight_bytes(1) - c1.model_spec.weight_bytes(1)
    assert kv_pool_bytes(tenants) == expected


def test_static_split_gives_shares_of_the_pool():
    tenants = _tenants()
    configs = tenant_configs(tenants, Sharing("static", (1.0, 3.0)))
    pool = kv_pool_bytes(tenants)
    assert [c.kv_budget_bytes for c in configs] == [int(pool / 4), int(pool * 3 / 4)]
    assert configs[0].pool_page_groups == int(pool / 4) // configs[0].page_group_bytes


def test_static_isolated_equals_separate_runs_bit_for_bit():
    tenants = _tenants()
    sharing = Sharing("static", (2.0, 1.0), compute="isolated")
    run = simulate_colocated(tenants, sharing)
    for tenant, config, result in zip(tenants, tenant_configs(tenants, sharing), run.results):
        alone = run_simulation(config, tenant.trace)
        pd.testing.assert_frame_equal(result.requests, alone.requests, check_exact=True)
        pd.testing.assert_frame_equal(result.iterations, alone.iterations, check_exact=True)


def test_deterministic_elastic():
    first = simulate_colocated(_tenants(), Sharing("elastic"))
    second = simulate_colocated(_tenants(), Sharing("elastic"))
    for a, b in zip(first.results, second.results):
        pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
        pd.testing.assert_frame_equal(a.iterations, b.iterations, check_exact=True)
    assert first.stats == second.stats
    pd.testing.assert_frame_equal(first.memory, second.memory)


def test_elastic_tenant_never_exceeds_its_ceiling():
    tenants = _tenants()
    tenants = [tenants[0], Tenant("b", tenants[1].config, tenants[1].trace, ceiling_frac=0.25)]
    run = simulate_colocated(tenants, Sharing("elastic"), sample_us=1_000.0)
    ceiling_bytes = int(run.pool_bytes * 0.25)
    assert run.stats[1]["peak_kv_bytes"] <= ceiling_bytes
    assert run.memory["b_bytes"].max() <= ceiling_bytes
    assert run.results[1].summary["finished"] == len(tenants[1].trace)


def test_serial_compute_waits_and_isolated_does_not():
    serial = simulate_colocated(_tenants(), Sharing("static", compute="serial"))
    isolated = simulate_colocated(_tenants(), Sharing("static", compute="isolated"))
    assert all(s["gpu_wait_s"] > 0 for s in serial.stats)
    assert all(s["gpu_wait_s"] == 0 for s in isolated.stats)
    # both tenants' compute shares one resource: the sum of compute time fits within the span of the run
    busy_us = sum(r.iterations["compute_us"].sum() for r in serial.results)
    span_us = max(r.iterations["start_at_us"].iloc[-1] + r.iterations["duration_us"].iloc[-1] for r in serial.results)
    assert busy_us <= span_us


def test_idle_trim_hands_pages_to_the_busy_tenant():
    a, b = _tenants(mem=0.27)
    later = Tenant("b", b.config, b.trace.assign(arrival_s=b.trace.arrival_s + a.trace.arrival_s.max() + 5.0))
    run = simulate_colocated([a, later], Sharing("elastic", trim_delay_us=500_000.0))
    assert run.stats[0]["trim_unmap_page_groups"] > 0 and run.stats[0]["trim_vmm_ms"] > 0
    assert run.stats[1]["moved_in_pages"] > 0 and run.stats[0]["moved_in_pages"] == 0


@pytest.mark.parametrize("mode", ["elastic", "static"])
def test_sleep_releases_pages_and_wake_costs_weights_copy(mode):
    """A wake with sleep-weights copies the weights back over PCIe under either sharing (static charged only the
    fixed 0.1 s: helper-56)."""
    early = _trace(3, n=10)
    late = early.assign(request_id=early.request_id + 10, arrival_s=early.arrival_s + 30.0)
    trace = pd.concat([early, late], ignore_index=True)
    config = SimConfig(model="llama-3.1-8b", memory_util_frac=0.3)
    tenants = [Tenant("a", config, trace, sleep_after_us=2e6, sleep_weights=True),
               Tenant("b", SimConfig(model="qwen2.5-7b", memory_util_frac=0.3), _trace(2))]
    run = simulate_colocated(tenants, Sharing(mode))
    stats = run.stats[0]
    assert stats["sleeps"] >= 1
    copy_s = config.model_spec.weight_bytes(1) / config.gpu_spec.pcie_bytes_per_s
    assert stats["wake_s"] >= copy_s + 0.1 - 1e-9      # weights over PCIe + the fixed 100 ms
    assert run.results[0].summary["finished"] == 20


def test_elastic_refuses_paged_tenant():
    tenants = _tenants()
    paged = Tenant("p", SimConfig(model="llama-3.1-8b", memory_util_frac=0.3, policy="paged"), _trace(3))
    with pytest.raises(ConfigError, match="tenant p: elastic sharing needs the vattention"):
        simulate_colocated([tenants[0], paged], Sharing("elastic"))


def test_elastic_refuses_window_aware_allocation():
    """A hybrid-attention tenant with window-aware allocation (gemma-3's sliding-window layers, window=unmap) ended
    in an AttributeError deep in the shared pool's policy: refused by name, before any step; static sharing runs it."""
    from pathlib import Path

    gemma = str(Path(__file__).resolve().parents[1] / "models" / "gemma-3-12b.json")
    tenants = _tenants()
    hybrid = Tenant("g", SimConfig(model=gemma, memory_util_frac=0.3, window_alloc="unmap"), _trace(3))
    with pytest.raises(ConfigError, match=r"tenant g: elastic sharing takes full-attention page groups; .*"
                                          r"\(window=unmap\) is not drawn from the shared pool"):
        simulate_colocated([tenants[0], hybrid], Sharing("elastic"))
    assert simulate_colocated([tenants[0], hybrid], Sharing("static")).results[1].summary["finished"] == 40


def test_a_share_too_small_for_one_unit_names_the_split():
    """A static split whose small share holds no allocation unit is blamed on the split (it advised raising
    memory_util_frac, which the pool already allowed), naming the tenant, its share and its unit."""
    from sim.cluster.colocate import tenant_configs

    with pytest.raises(ConfigError, match=r"tenant a: its share of sharing static:split=1/1000 is .* pool, less "
                                          r"than one of its allocation units \(128 MiB\): give it a larger share"):
        tenant_configs(_tenants(), Sharing("static", split=(1.0, 1000.0)))


def test_sharing_both_refuses_an_elastic_misfit_before_running_static(tmp_path, capsys):
    """--sharing both with a tenant elastic sharing cannot take: refused in one line before any mode runs (the
    static half ran and printed its table, then the run failed and its results were lost)."""
    import cli
    path = tmp_path / "a.csv"
    t = _trace(1, n=10)
    pd.DataFrame({"arrived_at": t.arrival_s, "num_prefill_tokens": t.prompt_tokens,
                  "num_decode_tokens": t.output_tokens}).to_csv(path, index=False)
    gemma = str(Path(__file__).resolve().parents[1] / "models" / "gemma-3-12b.json")
    code = cli.main(["colocate", "--tenant", f"model={gemma},trace={path},policy=vattention:window=unmap",
                     "--tenant", f"model=llama-3.1-8b,trace={path}", "--sharing", "both", "--memory-util", "0.5",
                     "--out", str(tmp_path / "run"), "--no-report"])
    captured = capsys.readouterr()
    assert code == 2 and "kvsim colocate:" not in captured.out and "compute model" not in captured.out
    assert "elastic sharing takes full-attention page groups" in captured.err and not (tmp_path / "run").exists()


def test_weights_that_leave_no_memory_are_refused():
    with pytest.raises(ConfigError, match="leave no KV memory"):
        kv_pool_bytes(_tenants(mem=0.2))


def test_tenant_config_is_an_ordinary_config_with_a_budget():
    config = TenantConfig(model="llama-3.1-8b", kv_share_bytes=8 * 2**30)
    assert config.kv_budget_bytes == 8 * 2**30
    assert config.to_dict()["kv_share_bytes"] == 8 * 2**30


def test_cli_writes_tenants_and_prints_table(tmp_path, capsys):
    import cli
    path = tmp_path / "a.csv"
    t = _trace(1)
    pd.DataFrame({"arrived_at": t.arrival_s, "num_prefill_tokens": t.prompt_tokens,
                  "num_decode_tokens": t.output_tokens}).to_csv(path, index=False)
    code = cli.main(["colocate", "--tenant", f"model=llama-3.1-8b,trace={path},name=x", "--tenant",
                     f"model=qwen2.5-7b,trace={path},name=y,policy=vattention:page=2MiB", "--sharing", "elastic",
                     "--memory-util", "0.3", "--out", str(tmp_path / "run"), "--no-report"])
    assert code == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [t["tenant"] for t in summary["tenants"]] == ["x", "y"]
    assert (tmp_path / "run" / "tenants" / "y" / "iterations.parquet").exists()
    out = capsys.readouterr().out
    assert "TTFT p99 ms" in out and "moved in GiB" in out


@pytest.mark.parametrize("argv, message", [
    (["--tenant", "trace=x.csv"], "model= is required"),
    (["--tenant", "model=llama-3.1-8b,colour=red"], "unknown key 'colour'"),
    (["--tenant", "model=llama-3.1-8b,floor=2"], "floor=2: must lie in"),
    (["--tenant", "model=llama-3.1-8b", "--sharing", "static:split=1/2"], "split needs 1 positive"),
    (["--tenant", "model=llama-3.1-8b", "--sharing", "fancy"], "choose static"),
    (["--tenant", "model=llama-3.1-8b,name=../x"], "name='../x': names the directory tenants/<name>/"),
    (["--tenant", "model=llama-3.1-8b,name=a/b"], "may not contain '/'"),
    (["--tenant", "model=llama-3.1-8b,name= "], "name= is empty"),
    (["--tenant", "model=llama-3.1-8b", "--tenant", "model=qwen2.5-7b", "--memory-util", "0.2"],
     "leave no KV memory on h200 at --memory-util 0.2 (memory_util_frac)"),
    # a share below one page group: the tenant's own config error keeps its fields (was: memory_util_frac, tp)
    (["--tenant", "model=llama-3.1-8b", "--tenant", "model=qwen2.5-7b", "--memory-util", "0.2076"],
     "not one page group (128 MiB); raise --memory-util or --tp"),
])
def test_cli_bad_tenant_specs(argv, message, capsys, tmp_path):
    import cli
    assert cli.main(["colocate", *argv, "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not (tmp_path / "x").exists()    # nothing written, not even beside


def test_default_tenant_name_of_a_model_file_is_its_stem():
    """A tenant's name is a directory under tenants/: a model file's folder would nest it (tenants/t0-models/...)."""
    from sim.frontend.colocate_options import parse_tenant_spec
    assert parse_tenant_spec("model=models/gpt-oss-20b.json", 0)["name"] == "t0-gpt-oss-20b"
    assert parse_tenant_spec("model=llama-3.1-8b", 1)["name"] == "t1-llama-3.1-8b"


def test_synthetic_default_tenant_runs():
    trace = traces.synthetic_default(0, num_requests=10)
    run = simulate_colocated([Tenant("s", SimConfig(model="llama-3.1-8b"), trace)], Sharing("static"))
    assert run.results[0].summary["finished"] == 10


@pytest.mark.parametrize("extra, flag", [(["--out", "cap.json"], "--out"), (["--target-rate", "10"], "--target-rate"),
                                         (["--slo", "ttft_p99=1ms"], "--slo"), (["--num-requests", "5"], "--num-requests"),
                                         (["--model", "qwen2.5-7b"], "--model"), (["--policy", "paged"], "--policy"),
                                         (["--rate-scale", "3"], "--rate-scale"),
                                         # helper-61: these 13 (and 4 more) were accepted and dropped
                                         (["--kv-dtype", "fp8"], "--kv-dtype"), (["--pp", "2"], "--pp"),
                                         (["--frontend-overhead-ms", "500"], "--frontend-overhead-ms"),
                                         (["--stability-tol", "0.9"], "--stability-tol"),
                                         (["--slo-attainment", "0.5"], "--slo-attainment"),
                                         (["--allow-rejected"], "--allow-rejected"), (["--engine", "sglang"], "--engine"),
                                         (["--preemption", "swap"], "--preemption"),
                                         (["--sync-mapping"], "--sync-mapping"),
                                         (["--host-swap", "1GiB"], "--host-swap"), (["--workers", "3"], "--workers"),
                                         (["--max-context", "512"], "--max-context"), (["--force"], "--force"),
                                         (["--usd-per-gpu-hour", "1"], "--usd-per-gpu-hour")])
def test_capacity_colocate_refuses_flags_it_would_ignore(extra, flag, capsys, tmp_path):
    """capacity --colocate wrote no --out file and used no --target-rate, --slo, --num-requests, --model, --policy
    or --rate-scale (each tenant's come from its --tenant keys), silently: the same table with or without them."""
    import cli
    argv = ["capacity", "--colocate", "--tenant", "model=llama-3.1-8b,slo=ttft_p99=2s", *extra]
    assert cli.main([x.replace("cap.json", str(tmp_path / "cap.json")) for x in argv]) == 2
    assert f"{flag} does not apply to capacity --colocate" in capsys.readouterr().err
    assert not (tmp_path / "cap.json").exists()


@pytest.mark.parametrize("slo, message", [
    ("ttft_p99=fast", "--tenant a: slo=ttft_p99=fast: ttft_p99: not a duration: 'fast'"),
    ("bogus_p99=2s", "--tenant a: slo=bogus_p99=2s: unknown metric 'bogus_p99'"),
    # a stray '+' (read as a comma) left an empty objective that was dropped silently
    ("ttft_p99=2s+", "--tenant a: slo=ttft_p99=2s+: an empty objective between '+'"),
    ("+ttft_p99=2s", "--tenant a: slo=+ttft_p99=2s: an empty objective between '+'"),
    ("ttft_p99=2s++tpot_p99=100ms", "--tenant a: slo=ttft_p99=2s++tpot_p99=100ms: an empty objective between '+'"),
])
@pytest.mark.parametrize("command", [["colocate"], ["capacity", "--colocate"]])
def test_a_tenants_bad_slo_is_refused_before_anything_runs(command, slo, message, capsys, tmp_path):
    """kvsim colocate ran with an unparsable slo= (it only matters to capacity); capacity --colocate printed its
    table's header before the error. Both now refuse it first, naming the tenant."""
    import cli
    argv = [*command, "--tenant", f"model=llama-3.1-8b,name=a,slo={slo}", "--tenant", "model=qwen2.5-7b,name=b"]
    if command == ["colocate"]:
        argv += ["--out", str(tmp_path / "o")]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""
    assert not (tmp_path / "o").exists()


def test_capacity_colocate_with_slos_that_never_hold_fails(capsys, tmp_path):
    """A 1 us TTFT p99 holds at no rate: the search reports no capacity and exits 1 (it printed 0.000 and 0)."""
    import cli
    path = tmp_path / "a.csv"
    t = _trace(1, n=10)
    pd.DataFrame({"arrived_at": t.arrival_s, "num_prefill_tokens": t.prompt_tokens,
                  "num_decode_tokens": t.output_tokens}).to_csv(path, index=False)
    code = cli.main(["capacity", "--colocate", "--quiet", "--memory-util", "0.3",
                     "--tenant", f"model=llama-3.1-8b,name=a,trace={path},slo=ttft_p99=1us",
                     "--tenant", f"model=qwen2.5-7b,name=b,trace={path},slo=ttft_p99=2s"])
    captured = capsys.readouterr()
    assert code == 1
    assert "  static     none" in captured.out and " elastic     none" in captured.out
    assert "capacity: none for static: the SLOs fail even at scale" in captured.err and "a:ttft_p99" in captured.err
    # tenant a (Llama-3.1-8B) is covered by the H200's default profile, tenant b (Qwen2.5-7B) is not
    assert "compute model of a: in-loop (compute_in_loop of " in captured.out
    assert "compute model of b: roofline (built-in defaults: " in captured.out


def test_colocate_force_replaces_the_whole_result_and_records_each_compute_model(tmp_path, capsys):
    """--force failed at the first tenant folder ("already holds a run") and would have left a --sharing both
    result's static/ and elastic/ beside a new one; each tenant's config.json names its compute model (a profile
    fitted for one tenant's model falls back to the roofline for the other's)."""
    import cli
    path = tmp_path / "a.csv"
    t = _trace(1, n=10)
    pd.DataFrame({"arrived_at": t.arrival_s, "num_prefill_tokens": t.prompt_tokens,
                  "num_decode_tokens": t.output_tokens}).to_csv(path, index=False)
    out = tmp_path / "run"
    tenants = ["--tenant", f"model=llama-3.1-8b,name=a,trace={path}", "--tenant", f"model=qwen2.5-7b,name=b,trace={path}"]
    assert cli.main(["colocate", *tenants, "--memory-util", "0.3", "--sharing", "both", "--no-report",
                     "--out", str(out)]) == 0
    assert (out / "static").is_dir() and (out / "elastic").is_dir()
    profile = str(Path(__file__).resolve().parents[1] / "profiles" / "h200-engine.json")
    assert cli.main(["colocate", *tenants, "--memory-util", "0.3", "--no-report", "--out", str(out), "--force",
                     "--profile", profile]) == 0
    assert sorted(p.name for p in out.iterdir()) == [".kvsim-result", "memory.parquet", "summary.json", "tenants"]
    config_a = json.loads((out / "tenants" / "a" / "config.json").read_text())
    config_b = json.loads((out / "tenants" / "b" / "config.json").read_text())
    assert config_a["compute_model"].startswith("in-loop (compute_in_loop of ")
    assert config_b["compute_model"].startswith("roofline (built-in defaults: ") and "not qwen2.5-7b" in config_b["compute_model"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert cli.main(["colocate", *tenants, "--out", str(mine), "--force"]) == 2
    assert (mine / "notes.txt").read_text() == "mine"


def test_colocate_refuses_an_empty_out_and_prints_each_tenants_compute_model(tmp_path, capsys, monkeypatch):
    """--out '' wrote into runs/colocate-<time> (simulate refuses it); the compute model of every tenant is
    printed, as simulate and capacity print theirs."""
    import cli
    monkeypatch.chdir(tmp_path)
    assert cli.main(["colocate", "--out", "", "--tenant", "model=llama-3.1-8b,num-requests=5"]) == 2
    assert "--out '': an empty path" in capsys.readouterr().err and not (tmp_path / "runs").exists()
    profile = str(Path(__file__).resolve().parents[1] / "profiles" / "h200-engine.json")
    assert cli.main(["colocate", "--out", str(tmp_path / "o"), "--no-report", "--memory-util", "0.3", "--profile",
                     profile, "--tenant", "model=llama-3.1-8b,name=a,num-requests=5",
                     "--tenant", "model=qwen2.5-7b,name=b,num-requests=5"]) == 0
    out = capsys.readouterr().out
    assert "compute model of a: in-loop (compute_in_loop of " in out
    assert "compute model of b: roofline (built-in defaults: " in out


def test_colocate_warns_once_about_a_harness_timed_profile(tmp_path, capsys):
    """Both tenants run on profiles/h200.json's harness-timed tiled fit: one warning line, not one per tenant;
    profiles/h200-engine.json (an engine fit, the roofline for these models) gives none."""
    import cli
    path = tmp_path / "a.csv"
    t = _trace(1, n=10)
    pd.DataFrame({"arrived_at": t.arrival_s, "num_prefill_tokens": t.prompt_tokens,
                  "num_decode_tokens": t.output_tokens}).to_csv(path, index=False)
    tenants = ["--tenant", f"model=llama-3.1-8b,name=a,trace={path}", "--tenant", f"model=qwen2.5-7b,name=b,trace={path}"]
    profiles = Path(__file__).resolve().parents[1] / "profiles"
    assert cli.main(["colocate", *tenants, "--memory-util", "0.3", "--no-report", "--out", str(tmp_path / "r1"),
                     "--profile", str(profiles / "h200.json")]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "harness" in line]
    assert len(lines) == 1 and lines[0].startswith("kvsim: warning: ") and "Which compute model to plan with" in lines[0]
    assert cli.main(["colocate", *tenants, "--memory-util", "0.3", "--no-report", "--out", str(tmp_path / "r2"),
                     "--profile", str(profiles / "h200-engine.json")]) == 0
    assert "harness" not in capsys.readouterr().err


def test_capacity_colocate_reads_its_shared_flags_and_refuses_a_per_request_tenant_slo(capsys):
    """The shared flags pass (an abbreviation too); a tenant's per-request objective (``ttft=100s``) needs an
    attainment no tenant takes: it was judged as a percentile never found, so every scale failed (helper-61)."""
    import cli
    from analysis.planning.cli import _refuse_unshared_flags
    from cli import build_parser
    args = build_parser(None).parse_args(["capacity", "--colocate", "--tenant", "model=llama-3.1-8b", "--gpu", "h100",
                                          "--mem", "0.8", "--seed", "3", "--tp", "1", "--compute", "isolated",
                                          "--tolerance", "0.05", "--quiet"])
    _refuse_unshared_flags(args)          # raises nothing
    assert cli.main(["capacity", "--colocate", "--tenant", "model=llama-3.1-8b,num-requests=5,slo=ttft=100s"]) == 2
    assert "ttft<=100s is a per-request objective" in capsys.readouterr().err
