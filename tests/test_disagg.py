"""Disaggregated prefill and decode (issue 22): hand-computed one-request runs (prefill + transfer + decode
steps, pull and layer-wise streaming), KV bytes moved, page conservation on both sides, no decode before the
KV lands, the link model, and the command line."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.setup.config import SimConfig
from sim.cluster.disagg import DecodeInstance, DisaggCluster, DisaggConfig, PrefillInstance, parse_kv_stream, parse_pd, run_disagg
from sim.timing.kvlink import LINKS, KvLink, parse_bandwidth_bytes_per_s, parse_kv_link, streamed_finish_us
from tests.helpers import ConstantCompute, constant_vmm, trace

KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2          # llama-3-8b: 2 (K, V) x 32 layers x 8 KV heads x 128 x bf16
LINK = KvLink("test", 100e9, 10.0, "test")          # 1e5 bytes per us, 10 us latency
NO_BT = dict(block_table_base_us=0.0, block_table_per_block_us=0.0)


def constant_models(iteration_us: float = 1000.0) -> dict:
    return {role: (constant_vmm(), ConstantCompute(iteration_us)) for role in ("prefill", "decode")}


def paged(**fields) -> SimConfig:
    return SimConfig(policy="paged", **NO_BT, **fields)


# ---- hand computations -------------------------------------------------------------------------------------
def test_one_request_pull_is_prefill_plus_transfer_plus_decode_steps():
    """Prompt 1,000 tokens, 5 output tokens, arrival 0, every iteration 1 ms, paged (no VMM time, no block-table
    time): the prefill (one chunk) ends at 1,000 us; the decode instance admits it at once and maps its
    blocks (a zero-token iteration); 1,000 x 131,072 B = 131,072,000 B at 1e5 B/us take 1,310.72 us plus 10 us
    latency: the KV lands at 2,320.72 us (the TTFT); then 4 decode steps of 1,000 us."""
    run = run_disagg(DisaggConfig(paged(), paged(), 1, 1, LINK), trace([(0.0, 1000, 5)]), models=constant_models())
    row = run.requests.iloc[0]
    assert row["status"] == "finished"
    assert row["prefill_done_at_us"] == 1000.0
    assert row["kv_mapped_at_us"] == 1000.0 and row["kv_transfer_start_at_us"] == 1000.0
    assert row["kv_transfer_bytes"] == 1000 * KV_BYTES_PER_TOKEN == 131_072_000
    assert row["kv_landed_at_us"] == pytest.approx(1000 + 1310.72 + 10)
    assert row["ttft_us"] == pytest.approx(2320.72)
    assert row["completion_at_us"] == pytest.approx(2320.72 + 4 * 1000)
    assert row["tpot_us"] == pytest.approx(1000.0)
    assert row["kv_transfer_us"] == pytest.approx(1320.72) and row["kv_handover_us"] == pytest.approx(1320.72)
    summary = run.summary
    assert summary["kv_transfer_bytes"] == 131_072_000 and summary["gpus"] == 2
    assert summary["kv_transfer_p50_ms"] == pytest.approx(1.32072)
    # the first decode gap counts from the landing (the first token reaches the user then)
    assert summary["tbt_max_ms"] == pytest.approx(1.0) and summary["tbt_tokens"] == 4


def test_one_request_with_synchronous_vattention_maps_before_the_transfer():
    """vAttention with synchronous mapping and constant VMM calls (map 10 us + set-access 40 us per page,
    64 pages per page group): the decode side maps ceil(1001 / 1024) = 1 page group = 3,200 us before the
    transfer starts; the prefill side maps its own page group the same way before its compute."""
    config = SimConfig(sync_mapping=True)
    run = run_disagg(DisaggConfig(config, config, 1, 1, LINK), trace([(0.0, 1000, 3)]), models=constant_models())
    row = run.requests.iloc[0]
    map_us = 64 * (10 + 40)
    assert row["prefill_done_at_us"] == pytest.approx(map_us + 1000)
    assert row["kv_mapped_at_us"] == pytest.approx(map_us + 1000 + map_us)
    assert row["kv_transfer_start_at_us"] == row["kv_mapped_at_us"]
    assert row["kv_landed_at_us"] == pytest.approx(2 * map_us + 1000 + 1310.72 + 10)
    assert row["completion_at_us"] == pytest.approx(row["kv_landed_at_us"] + 2 * 1000)


def test_one_request_layerwise_streaming_overlaps_the_prefill():
    """Token budget 512: the prefill runs two chunks, 512 tokens in [0, 1000] and 488 in [1000, 2000] us. The
    decode instance (chosen at arrival) maps at 0, so the link is usable from 0. Per chunk, 32 layer slices of
    31.25 us; a layer of chunk 1 sends in 512 x 131072 / 32 / 1e5 = 20.97152 us, of chunk 2 in 19.98848 us.
    Chunk 1 is compute-bound: ends 31.25 + 31 x 31.25 + 20.97152 = 1020.97152; chunk 2 too: 1031.25 + 968.75 +
    19.98848 = 2019.98848; plus 10 us latency. Without streaming: 2000 + 1310.72 + 10."""
    config = paged(token_budget=512)
    rows = {}
    for streaming in (True, False):
        run = run_disagg(DisaggConfig(config, config, 1, 1, LINK, streaming=streaming), trace([(0.0, 1000, 5)]),
                         models=constant_models())
        rows[streaming] = run.requests.iloc[0]
    streamed, pulled = rows[True], rows[False]
    assert streamed["prefill_done_at_us"] == pulled["prefill_done_at_us"] == 2000.0
    assert streamed["kv_mapped_at_us"] == 0.0
    assert streamed["kv_transfer_start_at_us"] == pytest.approx(31.25)
    assert streamed["kv_landed_at_us"] == pytest.approx(2019.98848 + 10)
    assert pulled["kv_landed_at_us"] == pytest.approx(2000 + 1310.72 + 10)
    assert streamed["ttft_us"] < pulled["ttft_us"]
    assert streamed["kv_transfer_bytes"] == pulled["kv_transfer_bytes"] == 1000 * KV_BYTES_PER_TOKEN


def test_streamed_finish_closed_form_matches_a_layer_by_layer_pipe():
    rng = np.random.default_rng(3)
    for _ in range(200):
        layers = int(rng.integers(1, 40))
        chunks, t = [], float(rng.uniform(0, 50))
        for _ in range(int(rng.integers(0, 4))):
            duration = float(rng.uniform(0, 100))
            chunks.append((t, t + duration, int(rng.integers(0, 3000))))
            t += duration + float(rng.uniform(0, 30))
        start, bpt, rate = float(rng.uniform(0, 200)), float(rng.uniform(1, 1e5)), float(rng.uniform(1e3, 1e6))
        finish = start
        for begin, end, tokens in chunks:
            if tokens <= 0:
                continue
            for layer in range(layers):
                finish = max(finish, begin + (layer + 1) * (end - begin) / layers) + tokens * bpt / layers / rate
        assert streamed_finish_us(start, chunks, bpt, layers, rate)[1] == pytest.approx(finish, rel=1e-9, abs=1e-6)


def test_one_output_token_finishes_on_the_prefill_instance_and_moves_nothing():
    run = run_disagg(DisaggConfig(paged(), paged(), 1, 1, LINK), trace([(0.0, 500, 1), (0.0, 500, 2)]),
                     models=constant_models())
    one, two = run.requests.iloc[0], run.requests.iloc[1]
    assert one["status"] == two["status"] == "finished"
    assert one["kv_transfer_bytes"] == 0 and one["decode_instance"] == -1
    assert one["ttft_us"] == one["e2e_us"] == 1000.0
    assert two["kv_transfer_bytes"] == 500 * KV_BYTES_PER_TOKEN
    assert run.summary["kv_transfers"] == 1


def test_tensor_parallel_roles_use_min_tp_links_and_move_the_whole_models_kv():
    """Prefill at tp 2, decode at tp 1: one link (min of the two); the bytes are the model's KV whatever the tp."""
    run = run_disagg(DisaggConfig(paged(tp=2), paged(), 1, 1, LINK), trace([(0.0, 1000, 3)]),
                     models=constant_models())
    row = run.requests.iloc[0]
    assert row["kv_transfer_bytes"] == 1000 * KV_BYTES_PER_TOKEN
    assert row["kv_transfer_us"] == pytest.approx(1310.72 + 10)
    both = run_disagg(DisaggConfig(paged(tp=2), paged(tp=2), 1, 1, LINK), trace([(0.0, 1000, 3)]),
                      models=constant_models()).requests.iloc[0]
    assert both["kv_transfer_us"] == pytest.approx(1310.72 / 2 + 10)
    assert run.summary["gpus"] == 3


def test_transfers_queue_on_a_shared_link():
    """Two requests prefilled in one iteration on one prefill instance, handed to one decode instance: the
    second transfer waits for the first on the link."""
    run = run_disagg(DisaggConfig(paged(), paged(), 1, 1, LINK), trace([(0.0, 500, 3), (0.0, 500, 3)]),
                     models=constant_models())
    first, second = run.requests.iloc[0], run.requests.iloc[1]
    send_us = 500 * KV_BYTES_PER_TOKEN / 1e5
    assert first["kv_transfer_start_at_us"] == 1000.0
    assert second["kv_transfer_start_at_us"] == pytest.approx(1000.0 + send_us)
    assert second["kv_landed_at_us"] == pytest.approx(1000.0 + 2 * send_us + 10)


# ---- invariants over random workloads ---------------------------------------------------------------------
class _Checked:
    """Checks, at every landing and every decode iteration: pages conserved on both sides, the decode side holds
    pages for the whole prompt before the KV lands, the prefill side still holds its copy, and every token a
    decode iteration computes belongs to a request whose KV landed before that iteration's compute began."""

    def __init__(self, monkeypatch):
        self.violations: list[str] = []
        self.landed_at: dict[int, float] = {}
        checker = self
        land, free_held, finish = DecodeInstance.land, PrefillInstance.free_held, DecodeInstance._finish_iteration

        def checked_land(instance, request):
            need = instance.policy.config.pages_for_tokens(request.prompt_tokens)
            if instance.policy.mapped[request.slot] < need:
                checker.violations.append(f"decode pages of {request.request_id} not mapped at landing")
            if instance.policy.conservation_error():
                checker.violations.append("decode pool not conserved")
            checker.landed_at[id(request)] = instance.env.now
            land(instance, request)

        def checked_free(instance, request):
            need = instance.policy.config.pages_for_tokens(request.prompt_tokens)
            if instance.policy.mapped[request.slot] < need:
                checker.violations.append(f"prefill copy of {request.request_id} gone before landing")
            if instance.policy.conservation_error():
                checker.violations.append("prefill pool not conserved")
            free_held(instance, request)

        def checked_finish(instance, batch, done_us, iteration=None):
            for request, tokens in batch:
                if tokens and request.computed >= request.prompt_tokens and request.generated >= 1:
                    landed = checker.landed_at.get(id(request))
                    if landed is None or landed > instance.compute_start_us:
                        checker.violations.append(f"request {request.request_id} decoded before its KV landed")
            finish(instance, batch, done_us, iteration)

        monkeypatch.setattr(DecodeInstance, "land", checked_land)
        monkeypatch.setattr(PrefillInstance, "free_held", checked_free)
        monkeypatch.setattr(DecodeInstance, "_finish_iteration", checked_finish)


POLICIES = {"vattention": {}, "vattention-sync": {"sync_mapping": True}, "paged": {"policy": "paged"},
            "static": {"policy": "static", "max_len_tokens": 4096}}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.floats(0, 0.5), st.integers(1, 3000), st.integers(1, 600)), min_size=1, max_size=25),
       num_prefill=st.integers(1, 3), num_decode=st.integers(1, 3), streaming=st.booleans(),
       prefill_policy=st.sampled_from(sorted(POLICIES)), decode_policy=st.sampled_from(sorted(POLICIES)),
       scheduler=st.sampled_from(["sarathi", "vllm"]), admission=st.sampled_from(["whole-prompt", "chunk"]),
       preemption=st.sampled_from(["recompute", "swap"]), small_pool=st.booleans())
def test_invariants_on_random_workloads(monkeypatch, rows, num_prefill, num_decode, streaming, prefill_policy,
                                        decode_policy, scheduler, admission, preemption, small_pool):
    """Pools of ~1 GB (7 vAttention page groups) make instances preempt (recompute or swap) and queue behind
    KV in transfer; every request still ends, with the invariants above."""
    checked = _Checked(monkeypatch)
    memory = {"memory_util_frac": 0.113} if small_pool else {}      # ~1 GB of KV: pressure, preemptions
    common = dict(scheduler=scheduler, max_context_tokens=4096, token_budget=1024, admission=admission,
                  preemption=preemption, **memory)
    prefill = SimConfig(**common, **POLICIES[prefill_policy])
    decode = SimConfig(**common, **POLICIES[decode_policy])
    rows = sorted(rows)
    table = trace(rows)
    config = DisaggConfig(prefill, decode, num_prefill, num_decode, LINKS["ib"], streaming)
    cluster = DisaggCluster(config, table)
    run = cluster.run()
    requests = run.requests
    assert not checked.violations, checked.violations[:3]
    assert len(requests) == len(rows) and set(requests["status"]) <= {"finished", "rejected"}
    for instance in [*cluster.prefills, *cluster.decodes]:
        assert instance.policy.conservation_error() == 0
    assert all(not p.held for p in cluster.prefills)
    assert all(not d.in_transfer and not d.awaiting for d in cluster.decodes)
    done = requests[requests["status"] == "finished"]
    moved = done["output_tokens"] > 1
    # KV bytes transferred equal each request's prompt KV (the whole model's), and nothing for one-token outputs
    assert (done.loc[moved, "kv_transfer_bytes"] == done.loc[moved, "prompt_tokens"] * KV_BYTES_PER_TOKEN).all()
    assert (done.loc[~moved, "kv_transfer_bytes"] == 0).all()
    assert run.summary["kv_transfer_bytes"] == int(requests["kv_transfer_bytes"].sum())
    hand = done[moved]
    assert (hand["prefill_done_at_us"] >= hand["first_scheduled_at_us"]).all()
    assert (hand["kv_mapped_at_us"] >= hand["decode_admitted_at_us"]).all()
    assert (hand["kv_transfer_start_at_us"] >= hand["kv_mapped_at_us"]).all()
    assert (hand["kv_landed_at_us"] > hand["prefill_done_at_us"]).all()
    assert (hand["first_token_at_us"] == hand["kv_landed_at_us"]).all()
    assert (hand["completion_at_us"] > hand["kv_landed_at_us"]).all()
    if not streaming:
        assert (hand["decode_admitted_at_us"] >= hand["prefill_done_at_us"]).all()
    assert run.summary["finished"] == len(done)


def test_a_prefill_pool_full_of_outgoing_kv_waits_instead_of_rejecting():
    """One prefill and one decode instance whose pools hold two of these requests each (3,520 tokens): the
    prefill instance keeps finished prompts until their KV is pulled, so later requests wait for a slot to be
    freed; every request is served, none rejected."""
    small = paged(memory_util_frac=0.1096, max_context_tokens=4096)    # 0.46 GB of KV above the weights
    pool_tokens = small.pool_page_groups * small.tokens_per_page
    assert 2 * 1500 <= pool_tokens < 3 * 1500
    run = run_disagg(DisaggConfig(small, small, 1, 1, LINK), trace([(0.0, 1500, 20)] * 6), models=constant_models())
    assert (run.requests["status"] == "finished").all()
    assert run.summary["rejected"] == 0


# ---- the link model ---------------------------------------------------------------------------------------
def test_link_presets_and_custom_links():
    assert parse_kv_link("nvlink").bandwidth_bytes_per_s == 450e9
    assert parse_kv_link("IB").bandwidth_bytes_per_s == 50e9
    assert parse_kv_link("pcie").bandwidth_bytes_per_s == 55e9
    custom = parse_kv_link("25GB/s,20us")
    assert (custom.bandwidth_bytes_per_s, custom.latency_us) == (25e9, 20.0)
    assert parse_kv_link("400Gb/s").bandwidth_bytes_per_s == 50e9 and parse_kv_link("400Gb/s").latency_us == 0
    assert parse_kv_link("1GiB/s,0").bandwidth_bytes_per_s == 2 ** 30
    assert parse_bandwidth_bytes_per_s("2TB/s") == 2e12
    assert LINKS["ib"].transfer_us(50e9, links=2) == pytest.approx(10 + 0.5e6)
    for bad in ("fast", "25GB", "0GB/s", "25GB/s,soon", "-1GB/s"):
        with pytest.raises(ValueError, match=f"kv_link={bad!r}: "):
            parse_kv_link(bad)


def test_pd_and_stream_parsing():
    assert parse_pd("1:2") == (1, 2) and parse_pd(" 3 : 1 ") == (3, 1)
    for bad in ("0:1", "1", "a:b", "1:0", "1:2:3"):
        with pytest.raises(ValueError, match=f"pd={bad!r}: "):
            parse_pd(bad)
    assert parse_kv_stream("layerwise") and not parse_kv_stream("off")
    with pytest.raises(ValueError, match="kv_stream='chunked': "):
        parse_kv_stream("chunked")


def test_config_refusals():
    from sim.setup.config import ConfigError
    with pytest.raises(ConfigError, match="one model"):
        DisaggConfig(SimConfig(), SimConfig(model="llama-2-7b"))
    with pytest.raises(ConfigError, match="prefix caching"):
        DisaggConfig(SimConfig(prefix_caching=True), SimConfig())


# ---- the command line ---------------------------------------------------------------------------------------
def _one_error(capsys, *words):
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("kvsim: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_simulate_pd_writes_a_run_with_transfers_and_role_tables(tmp_path, capsys):
    from cli import main
    out = tmp_path / "run"
    assert main(["simulate", "--pd", "1:2", "--kv-link", "nvlink", "--num-requests", "60", "--out", str(out),
                 "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "KV transfer" in printed and "prefill" in printed and "decode" in printed
    summary = json.loads((out / "summary.json").read_text())
    requests = pd.read_parquet(out / "requests.parquet")
    assert summary["pd"] == "1:2" and summary["gpus"] == 3 and summary["kv_link"] == "nvlink"
    assert summary["kv_transfer_bytes"] == int(requests["kv_transfer_bytes"].sum()) > 0
    assert {"kv_transfer_p50_ms", "kv_transfer_p99_ms", "kv_handover_p99_ms"} <= set(summary)
    assert set(summary["roles"]) == {"prefill", "decode"} and len(summary["instances"]) == 3
    assert {"utilisation", "queue_delay_p99_ms", "peak_mapped_bytes", "mean_waiting"} <= set(summary["instances"]["decode1"])
    iterations = pd.read_parquet(out / "iterations.parquet")
    assert set(iterations["role"]) == {"prefill", "decode"}
    config = json.loads((out / "config.json").read_text())
    assert config["kv_link"]["bandwidth_bytes_per_s"] == 450e9 and config["decode"]["policy"] == "vattention"


@pytest.mark.parametrize("argv, words", [
    (["--pd", "0:1"], ["--pd", "'0:1'"]),
    (["--pd", "1:1", "--kv-link", "warp"], ["--kv-link", "'warp'"]),
    (["--pd", "1:1", "--kv-stream", "yes"], ["--kv-stream", "'yes'"]),
    (["--kv-link", "ib"], ["--kv-link", "--pd"]),
    (["--pd", "1:1", "--prefill-tp", "3"], ["--prefill-tp 3"]),
    (["--pd", "1:1", "--decode-policy", "paged:prefix=on"], ["prefix caching"]),
])
def test_simulate_pd_bad_input_is_one_line(tmp_path, capsys, argv, words):
    from cli import main
    out = tmp_path / "run"
    assert main(["simulate", *argv, "--num-requests", "5", "--out", str(out), "--quiet"]) == 2
    _one_error(capsys, *words)
    assert not out.exists()


# ---- capacity and sweeps -------------------------------------------------------------------------------------
def test_candidate_deployments_cover_every_split_within_the_budget():
    from analysis.planning.disagg import candidate_deployments
    labels = [c.label for c in candidate_deployments(4, [1])]
    assert labels == ["co-located 1 x tp1", "co-located 2 x tp1", "co-located 3 x tp1", "co-located 4 x tp1",
                      "P:D 1:1 tp1/tp1", "P:D 1:2 tp1/tp1", "P:D 2:1 tp1/tp1", "P:D 1:3 tp1/tp1", "P:D 2:2 tp1/tp1",
                      "P:D 3:1 tp1/tp1"]
    mixed = candidate_deployments(4, [1, 2])
    assert all(c.gpus <= 4 for c in mixed)
    assert {(c.num_prefill, c.num_decode, c.prefill_tp, c.decode_tp) for c in mixed if not c.colocated} >= {
        (1, 1, 2, 2), (2, 1, 1, 2), (1, 2, 2, 1)}
    assert [c.label for c in mixed if c.colocated] == ["co-located 1 x tp1", "co-located 2 x tp1", "co-located 1 x tp2",
                                                       "co-located 3 x tp1", "co-located 4 x tp1", "co-located 2 x tp2"]


def test_disagg_capacity_counts_the_whole_deployment():
    """The capacity of a 1:1 deployment is a rate for 2 GPUs; its per-GPU goodput is half of it; a point passes
    only when every SLO holds on the merged request table."""
    import traces
    from analysis.planning.disagg import find_disagg_capacity
    from analysis.planning.slo import parse_slos
    workload = traces.synthetic_default(0, num_requests=80)
    config = DisaggConfig(SimConfig(), SimConfig(), 1, 1)
    result = find_disagg_capacity(config, workload, parse_slos("ttft_p99=500ms"), tolerance=0.1)
    assert result.best is not None and result.best.passed
    assert result.best.summary["ttft_p99_ms"] <= 500 and result.best.summary["gpus"] == 2
    assert result.above is None or "ttft_p99" in result.above.failed or "stability" in result.above.failed


def test_capacity_pd_and_pd_search_on_the_command_line(tmp_path, capsys):
    from cli import main
    out = tmp_path / "cap.json"
    assert main(["capacity", "--pd", "1:1", "--num-requests", "60", "--slo", "ttft_p99=1s", "--tolerance", "0.2",
                 "--target-rate", "10", "--json", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "capacity of the deployment" in printed and "prefill GPUs" in printed
    record = json.loads(out.read_text())
    assert record["gpus"] == 2 and record["capacity_req_per_s_per_gpu"] == pytest.approx(record["capacity_req_per_s"] / 2)
    assert record["units"] * record["capacity_req_per_s"] >= 10
    out = tmp_path / "search.json"
    assert main(["capacity", "--pd-search", "2", "--num-requests", "40", "--slo", "ttft_p99=1s", "--tolerance", "0.2",
                 "--json", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "ranked by goodput per GPU" in printed and "at 2 GPUs:" in printed
    deployments = json.loads(out.read_text())["deployments"]
    assert [d["deployment"] for d in deployments] == ["co-located 1 x tp1", "co-located 2 x tp1", "P:D 1:1 tp1/tp1"]
    assert all(d["capacity_req_per_s_per_gpu"] == pytest.approx(d["capacity_req_per_s"] / d["gpus"]) for d in deployments)


@pytest.mark.parametrize("argv, words", [
    (["--pd", "1:1", "--check-replicas", "--target-rate", "5"], ["--check-replicas"]),
    (["--pd", "1:1", "--pd-search", "3"], ["--pd", "--pd-search"]),
    (["--pd-tp", "1,2"], ["--pd-tp", "--pd-search"]),
    (["--pd-search", "3", "--pd-tp", "one"], ["--pd-tp", "'one'"]),
    (["--pd", "2:x"], ["--pd", "'2:x'"]),
    # helper-61: the search dropped per-role degrees, one deployment dropped --pd-tp (the same output as without)
    (["--pd-search", "2", "--prefill-tp", "2", "--decode-tp", "2"], ["--prefill-tp", "--pd-tp LIST"]),
    (["--pd", "1:1", "--pd-tp", "2"], ["--pd-tp", "--prefill-tp"]),
])
def test_capacity_pd_bad_input_is_one_line(capsys, argv, words):
    from cli import main
    assert main(["capacity", "--slo", "ttft_p99=2s", "--num-requests", "5", "--quiet", *argv]) == 2
    _one_error(capsys, *words)


def test_sweep_with_a_pd_axis_compares_colocated_and_disaggregated(tmp_path, capsys):
    from cli import main
    out = tmp_path / "sweep"
    assert main(["sweep", "--grid", "pd=none,1:1", "--grid", "kv_link=ib,nvlink", "--num-requests", "30",
                 "--out", str(out), "--quiet", "--workers", "1"]) == 0
    table = pd.read_csv(out / "sweep.csv")
    assert (table["status"] == "ok").all() and len(table) == 4
    disagg = table[table["pd"] == "1:1"]
    assert (disagg["gpus"] == 2).all() and (disagg["kv_transfer_bytes"] > 0).all()
    assert set(disagg["kv_link"]) == {"ib", "nvlink"}
    # every point names the compute model that timed it, P/D points too (they had no column, and the sweep's
    # compute-model line counted only the co-located points)
    assert table["compute_model"].notna().all()
    assert "compute model: in-loop" in capsys.readouterr().out
    assert main(["sweep", "--grid", "pd=1:1,0:1", "--num-requests", "5", "--out", str(tmp_path / "bad"), "--quiet",
                 "--workers", "1"]) == 2
    _one_error(capsys, "--pd", "'0:1'")
    assert not (tmp_path / "bad").exists()


def test_a_stalled_deployment_fails_its_capacity_point_and_is_one_error_line(monkeypatch, tmp_path, capsys):
    import sim.cluster.disagg
    import traces
    from analysis.planning.disagg import STALLED, make_disagg_evaluator
    from analysis.planning.slo import parse_slos
    from cli import main

    def stall(*args, **kwargs):
        raise sim.cluster.disagg.DisaggStallError("the disaggregated deployment 1:1 stalled at t=1.000 s with 3 requests "
                                          "unfinished")
    monkeypatch.setattr(sim.cluster.disagg, "run_disagg", stall)
    evaluate = make_disagg_evaluator(DisaggConfig(SimConfig(), SimConfig()), traces.synthetic_default(0, num_requests=10),
                                     parse_slos("ttft_p99=2s"))
    point = evaluate(1.0)
    assert not point.passed and point.failed == (STALLED,)
    assert main(["simulate", "--pd", "1:1", "--num-requests", "5", "--out", str(tmp_path / "run"), "--quiet"]) == 2
    _one_error(capsys, "stalled")


def test_instances_that_receive_no_request_report_zeros():
    run = run_disagg(DisaggConfig(paged(), paged(), 2, 3, LINK), trace([(0.0, 100, 5)]), models=constant_models())
    instances = run.summary["instances"]
    assert run.summary["finished"] == 1 and set(instances) == {"prefill0", "prefill1", "decode0", "decode1", "decode2"}
    assert [instances[name]["requests"] for name in sorted(instances)] == [1, 0, 0, 1, 0]
    assert instances["decode1"]["utilisation"] == 0.0 and instances["decode0"]["utilisation"] > 0


def test_impossible_searches_and_links_are_one_line(tmp_path, capsys):
    """Fresh-user findings: a --pd-tp that cannot shard the model or fit the budget, a link so slow that a
    transfer leaves the exact range of the clock, and a bad --prefill-tp named as such."""
    from cli import main

    from tests.conftest import SHARED_TRACES
    path = SHARED_TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    if not path.exists():
        pytest.skip("../shared traces absent")
    trace = str(path)
    base = ["--trace", trace, "--num-requests", "50"]
    for args, needle in ((["capacity", *base, "--slo", "ttft_p99=2s", "--pd-search", "4", "--pd-tp", "3"],
                          "--pd-tp 3 does not divide"),
                         (["capacity", *base, "--slo", "ttft_p99=2s", "--pd-search", "2", "--pd-tp", "4"],
                          "no deployment fits 2 GPU(s)"),
                         (["simulate", *base, "--pd", "1:1", "--kv-link", "1e-9GB/s", "--out", str(tmp_path / "a")],
                          "below 1 MB/s"),
                         (["simulate", *base, "--pd", "1:1", "--prefill-tp", "3", "--out", str(tmp_path / "b")],
                          "--prefill-tp 3 does not divide")):
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err


def test_a_window_aware_hybrid_decode_role_receives_only_what_its_layer_groups_hold(tmp_path, capsys):
    """Jamba (4 attention layers, 28 Mamba layers) with paged:window=free: a request's hand-over is its 4 full
    layers' KV plus the 28 layers' state, kv_bytes_for_tokens(groups, prompt) - not prompt x all 32 layers' KV
    (7.2x too much on request 0). With window=off the decode role holds every layer: the whole-model bytes."""
    import pandas as pd

    from cli import main
    from sim.memory.layer_groups import kv_bytes_for_tokens, layer_groups
    from sim.setup.catalog import get_model
    from traces import load_trace

    code = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
    jamba = Path(__file__).resolve().parents[1] / "models" / "jamba-v0.1.json"
    spec = get_model(str(jamba))
    prompts = load_trace(code).head(8)["prompt_tokens"].to_numpy()
    for policy, expected in (("paged:window=free", [kv_bytes_for_tokens(layer_groups(spec, 1), int(n)) for n in prompts]),
                             ("paged", [int(n) * spec.kv_bytes_per_token(1) for n in prompts])):
        out = tmp_path / policy.replace(":", "_").replace("=", "_")
        assert main(["simulate", "--trace", str(code), "--num-requests", "8", "--model", str(jamba), "--policy", policy,
                     "--pd", "1:1", "--out", str(out), "--quiet"]) == 0
        requests = pd.read_parquet(out / "requests.parquet").sort_values("request_id")
        sent = requests["kv_transfer_bytes"].to_numpy()
        one_token = requests["output_tokens"].to_numpy() == 1       # finishes on its prefill instance: sends nothing
        assert list(sent[~one_token]) == [e for e, o in zip(expected, one_token) if not o]
    assert expected[0] > 5 * kv_bytes_for_tokens(layer_groups(spec, 1), int(prompts[0]))
    assert "are held as full attention layers" in capsys.readouterr().err     # the window=off run's note


def test_a_pd_run_adds_the_engines_front_end_cost_once_as_a_colocated_run_does(tmp_path):
    """--frontend-overhead-ms 10 (vLLM v1's, sim/setup/engines.py): TTFT and E2E 10 ms later than the KV's landing
    and the decode's completion, TPOT unchanged; it had been dropped under --pd (a bias of --pd-search)."""
    from cli import main

    code = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
    runs = {}
    for overhead in ("0", "10"):
        out = tmp_path / overhead
        assert main(["simulate", "--trace", str(code), "--num-requests", "30", "--pd", "1:1", "--frontend-overhead-ms",
                     overhead, "--out", str(out), "--quiet"]) == 0
        runs[overhead] = pd.read_parquet(out / "requests.parquet").set_index("request_id")
    plain, shifted = runs["0"], runs["10"]
    moved = plain["kv_transfer_bytes"] > 0
    np.testing.assert_allclose(shifted["ttft_us"], plain["ttft_us"] + 10_000.0)
    np.testing.assert_allclose(shifted["e2e_us"], plain["e2e_us"] + 10_000.0)
    np.testing.assert_allclose(shifted.loc[moved, "first_token_at_us"], shifted.loc[moved, "kv_landed_at_us"] + 10_000.0)
    np.testing.assert_allclose(shifted["tpot_us"].dropna(), plain["tpot_us"].dropna())
