"""Faults found by randomised invariant hunts and trials (helpers 49, 50 and 52; 4,648 and 1,180 runs), each as
the hunt shrank it: window-aware policies' unservable and refused requests, vLLM's swap-in beside new prompts,
prefix-shared deferred pages, elastic co-location's held reserves and floors, tier keys in hash order."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli import main


def _run(tmp_path, name: str, text: str, *flags: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    trace = tmp_path / name
    trace.write_text(text)
    out = tmp_path / (name + "_out")
    assert main(["simulate", "--trace", str(trace), "--out", str(out), "--force", "--quiet", *flags]) == 0
    return pd.read_parquet(out / "requests.parquet"), pd.read_parquet(out / "iterations.parquet")


HEAD = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


@pytest.mark.parametrize("row, flags", [
    # Gemma 3 (5 sliding : 1 full), 256-token blocks: 29 units, 33 at the last token (8 full + 5 window blocks)
    ("0.0,1023,1024", ["--model", "models/gemma-3-12b.json", "--policy", "paged:block=256,window=free",
                       "--memory-util", "0.15942"]),
    ("0.0,2995,867", ["--model", "models/mistral-7b.json", "--policy", "vattention:window=unmap",
                      "--memory-util", "0.09895"]),
    # gpt-oss under vllm: the whole 4,454-token prompt at once maps 18 window pages, which recycle keeps
    ("0.0,4454,1747", ["--model", "models/gpt-oss-20b.json", "--policy", "vattention:page=256KiB,window=recycle",
                       "--scheduler", "vllm", "--memory-util", "0.092945"]),
])
def test_a_window_aware_request_that_can_never_fit_is_rejected_at_arrival(tmp_path, row, flags):
    """It was admitted (the check counted the first group's pages against the pool's units), ran, and was
    rejected mid-run as ``pages`` with its TTFT recorded; now it is ``pool``, before any iteration."""
    requests, iterations = _run(tmp_path, "one.csv", HEAD + row + "\n", *flags)
    assert requests["status"].tolist() == ["rejected"] and requests["reject_reason"].tolist() == ["pool"]
    assert requests["ttft_us"].isna().all() and len(iterations) == 0


def test_a_window_group_reserves_its_window_not_the_whole_prompt(tmp_path):
    """Whole-prompt admission on an all-sliding model (Mistral, W = 4,096) reserved all 97 pages of a 6,150-token
    prompt against 87 free, so the request waited forever and was rejected; the window needs 66."""
    requests, _ = _run(tmp_path, "w.csv", HEAD + "0.0,6150,83\n", "--model", "models/mistral-7b.json",
                       "--policy", "vattention:page=128KiB,watermark=0.05,window=unmap", "--token-budget", "64",
                       "--memory-util", "0.100940")
    assert requests["status"].tolist() == ["finished"]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 9000), st.integers(1, 3000),
       st.sampled_from([("models/mistral-7b.json", "vattention:page=256KiB,window=unmap", 0.09696),
                        ("models/mistral-7b.json", "vattention:page=256KiB,window=recycle", 0.09696),
                        ("models/gemma-3-12b.json", "paged:block=256,window=free", 0.15743),
                        ("models/gpt-oss-20b.json", "vattention:page=256KiB,window=recycle", 0.09195),
                        ("models/gpt-oss-20b.json", "vattention:page=256KiB,window=unmap", 0.09195)]),
       st.sampled_from([0.001, 0.002, 0.004, 0.008]), st.sampled_from(["sarathi", "vllm"]),
       st.sampled_from([64, 512, 2048]))
def test_a_window_aware_request_alone_is_served_or_rejected_at_arrival(prompt, output, setup, extra, scheduler,
                                                                       budget):
    """Invariant: a request running alone either finishes or is refused before it runs (never mid-run), i.e.
    :meth:`sim.memory.hybrid.HybridPolicy.peak_units` is the request's real peak. ``memory_util`` is the weights'
    share (what leaves no KV) plus ``extra`` of the H200's memory: pools of a few dozen to a few hundred units,
    where about half the requests fit."""
    from sim.core.runner import run_simulation
    from sim.frontend.policy_spec import parse_policy
    from sim.setup.config import SimConfig
    model, spec, weights = setup
    memory = weights + extra
    config = SimConfig(model=model, scheduler=scheduler, token_budget=budget, memory_util_frac=memory,
                       max_context_tokens=16384, max_batch_slots=16).with_overrides(parse_policy(spec))
    trace = pd.DataFrame({"request_id": [0], "arrival_s": [0.0], "prompt_tokens": [prompt], "output_tokens": [output]})
    requests = run_simulation(config, trace).requests
    status, reason = requests["status"].iloc[0], requests["reject_reason"].iloc[0]
    assert status == "finished" or (status == "rejected" and reason in ("pool", "slot")), (status, reason)


def test_vllm_swaps_a_request_back_in_a_decode_iteration_without_new_prompts(tmp_path):
    """vLLM v0 (``Scheduler._schedule_default``): while a request is swapped out no prompt is admitted, and it comes
    back with the decodes. kvsim batched its swap-in and decode with the next request's prefill (iteration 200:
    100 prefill tokens, 1 decode). A pool of 3 page groups: request 1 is swapped out at iteration 25."""
    requests, iterations = _run(tmp_path, "mix.csv", HEAD + "0.0,1000,200\n0.0,1000,200\n0.5,100,10\n",
                                "--scheduler", "vllm", "--preemption", "swap", "--memory-util", "0.11")
    assert requests["status"].tolist() == ["finished"] * 3 and requests["preemptions"].tolist() == [0, 1, 0]
    swap_in = iterations[iterations["swap_us"] > 0].iloc[-1]
    assert swap_in["prefill_tokens"] == 0 and swap_in["decode_tokens"] >= 1
    assert not ((iterations["prefill_tokens"] > 0) & (iterations["decode_tokens"] > 0)).any()
    # the short request's prompt waits until the swapped request is back
    assert requests["first_scheduled_at_us"].iloc[2] > swap_in["start_at_us"]


def test_deferred_pages_shared_by_idle_slots_are_counted_once(tmp_path):
    """Three requests sharing four prefix pages end one-token runs: their idle slots map the shared pages three
    times; deferred counted them per slot (6 beside 5 mapped); each physical page once now."""
    lines = [f'{{"timestamp": 0, "input_length": 2100, "output_length": 1, "hash_ids": [1, 2, 3, 4, {last}]}}'
             for last in (5, 6, 7)] + ['{"timestamp": 1000, "input_length": 10, "output_length": 1, "hash_ids": [9]}']
    _, iterations = _run(tmp_path, "p.jsonl", "\n".join(lines) + "\n", "--policy", "vattention:prefix=on,eager=0",
                         "--memory-util", "0.115")
    last = iterations.iloc[-1]
    assert (last["mapped_page_groups"], last["used_page_groups"], last["deferred_page_groups"]) == (5, 1, 4)
    assert (iterations["used_page_groups"] + iterations["deferred_page_groups"]
            <= iterations["mapped_page_groups"]).all()


def test_replicas_with_kv_tiers_write_one_summary_whatever_the_hash_seed(tmp_path):
    """Helper-50: the merged tier keys came out in string-hash order, so summary.json differed between runs of one
    seed (PYTHONHASHSEED differs per process); now the keys keep the replicas' order."""
    import subprocess
    import sys
    trace = tmp_path / "m.jsonl"
    trace.write_text("\n".join([
        '{"timestamp": 0, "input_length": 2000, "output_length": 5, "hash_ids": [0, 1, 2, 3]}',
        '{"timestamp": 10, "input_length": 2000, "output_length": 5, "hash_ids": [0, 1, 2, 4]}',
        '{"timestamp": 500, "input_length": 3000, "output_length": 5, "hash_ids": [5, 6, 7, 8, 9, 10]}',
        '{"timestamp": 900, "input_length": 2000, "output_length": 5, "hash_ids": [0, 1, 2, 3]}']) + "\n")
    texts = []
    for seed in ("1", "2", "3"):
        out = tmp_path / f"o{seed}"
        subprocess.run([sys.executable, "cli.py", "simulate", "--trace", str(trace), "--policy", "paged:prefix=on",
                        "--kv-tier", "dram:1GiB", "--replicas", "2", "--memory-util", "0.115", "--quiet",
                        "--out", str(out)], check=True, env={**__import__("os").environ, "PYTHONHASHSEED": seed})
        texts.append((out / "summary.json").read_text())
    assert texts[0] == texts[1] == texts[2] and '"tier_' in texts[0]


def test_elastic_tenants_take_back_each_others_reserve_instead_of_rejecting(tmp_path):
    """Helper-50: under elastic sharing t0's eager maps (7 of the pool's 9.4 page groups for a 100-token request)
    were never given back, and t1's 4,500-token request (5 groups) was rejected mid-run as ``pages``; with
    ``eager=0`` on t0 both finished. A tenant short of pages now trims the others' idle reserve first, and waits
    while their requests hold pages."""
    import json
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text(HEAD + "0.0,100,5\n")
    b.write_text(HEAD + "0.0,3000,1500\n")
    out = tmp_path / "o"
    assert main(["colocate", "--tenant", f"model=llama-3.1-8b,trace={a}", "--tenant", f"model=llama-3.1-8b,trace={b}",
                 "--sharing", "elastic", "--memory-util", "0.221409", "--out", str(out), "--no-report"]) == 0
    tenants = json.loads((out / "summary.json").read_text())["tenants"]
    assert [(t["finished"], t["rejected"]) for t in tenants] == [(1, 0), (1, 0)]


def test_a_waking_tenant_gets_its_weights_pages_back_from_its_own_eager_maps(tmp_path):
    """Helper-50: t0 woke at 1.0 s with its mapper eagerly mapping the whole KV pool (its weights' lent pages
    among them) and waited 8.6 s for its weights' pages; the wake is now the documented 0.1 s plus the weights
    over PCIe (about 0.36 s for Llama-3.1-8B on the H200)."""
    import json
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text(HEAD + "0.0,100,5\n1.0,100,5\n")
    b.write_text(HEAD + "0.0,10,1\n0.9,2000,1500\n")
    out = tmp_path / "o"
    assert main(["colocate", "--tenant", f"model=llama-3.1-8b,trace={a},sleep-after=0.5s,sleep-weights=yes",
                 "--tenant", f"model=llama-3.1-8b,trace={b},policy=vattention:eager=0", "--sharing", "elastic",
                 "--memory-util", "0.221409", "--out", str(out), "--no-report"]) == 0
    t0, t1 = json.loads((out / "summary.json").read_text())["tenants"]
    assert t0["finished"] == t1["finished"] == 2 and 0.1 < t0["wake_s"] < 0.5


@settings(max_examples=15, deadline=None)
@given(st.lists(st.lists(st.tuples(st.floats(0, 3), st.integers(1, 6000), st.integers(1, 600)), min_size=1,
                         max_size=8), min_size=2, max_size=2),
       st.sampled_from(["", ",floor=0.2", ",ceiling=0.6", ",sleep-after=0.5s", ",sleep-after=0.5s,sleep-weights=yes",
                        ",policy=vattention:eager=0", ",policy=vattention:sync"]),
       st.sampled_from(["0.221", "0.23", "0.26"]), st.sampled_from(["serial", "isolated"]))
def test_elastic_co_location_always_ends_and_accounts_for_every_request(tenants, extra, memory, compute):
    """Invariant over small random co-locations (the waits of a tenant short of pages must never stall the run:
    the first version of them raised 'no progress' in 3 of 224 of helper-50's runs): every run ends, and each
    tenant's finished and rejected requests add up to its trace. Two Llama-3.1-8B tenants' weights take 0.212 of
    the H200: the pools hold about 1 to 6.5 GiB (8 to 52 page groups of 128 MiB)."""
    import json
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as scratch:
        flags = []
        for index, rows in enumerate(tenants):
            path = Path(scratch) / f"t{index}.csv"
            path.write_text(HEAD + "".join(f"{a:.3f},{p},{o}\n" for a, p, o in sorted(rows)))
            flags += ["--tenant", f"model=llama-3.1-8b,trace={path}" + (extra if index == 0 else "")]
        out = Path(scratch) / "o"
        assert main(["colocate", *flags, "--sharing", "elastic", "--compute", compute, "--memory-util", memory,
                     "--out", str(out), "--no-report"]) == 0
        summary = json.loads((out / "summary.json").read_text())
        for rows, tenant in zip(tenants, summary["tenants"]):
            assert tenant["finished"] + tenant["rejected"] == len(rows)


def test_a_hybrid_admission_counts_every_groups_reclaimable_pages(tmp_path):
    """Helper-52: Gemma 3 under ``vattention:window=unmap`` refused an admission that the pool covered once the
    window group's idle pages were reclaimed (the full group's own count saw only its share), and rejected a
    69,645-token request that finishes alone. Mooncake requests 120-124 on a 0.2 pool now all finish."""
    mooncake = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_fast25" / "conversation_trace.jsonl"
    out = tmp_path / "o"
    assert main(["simulate", "--model", "models/gemma-3-12b.json", "--policy", "vattention:window=unmap",
                 "--memory-util", "0.2", "--trace", str(mooncake), "--skip-requests", "120", "--num-requests", "5",
                 "--out", str(out), "--quiet"]) == 0
    assert pd.read_parquet(out / "requests.parquet")["status"].tolist() == ["finished"] * 5


def test_an_elastic_tenant_beyond_what_the_others_floors_leave_is_rejected_at_arrival(tmp_path):
    """A tenant may never draw the pages other tenants' floors keep: a request needing more is rejected at arrival
    (``pool``), not admitted and rejected mid-run as ``pages`` (helper-50's seed 303, three tenants)."""
    import json
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text(HEAD + "0.0,7000,2\n")       # 7 page groups of 128 MiB; the pool holds about 9.4, t1's floor 5
    b.write_text(HEAD + "0.0,10,2\n")
    out = tmp_path / "o"
    assert main(["colocate", "--tenant", f"model=llama-3.1-8b,trace={a}", "--tenant",
                 f"model=llama-3.1-8b,trace={b},floor=0.5", "--sharing", "elastic", "--memory-util", "0.221409",
                 "--out", str(out), "--no-report"]) == 0
    t0 = json.loads((out / "summary.json").read_text())["tenants"][0]
    assert (t0["finished"], t0["rejected"], t0["rejected_by_reason"]) == (0, 1, {"pool": 1})


def test_an_elastic_tenant_waits_while_another_tenants_mapper_is_mapping(tmp_path):
    """Helper-50's seed 353: t1's 7,720-token request found t0 with nothing running but its background mapper
    still mapping idle slots (those pages could not be trimmed yet); it was rejected as ``pages``. Pages in flight
    become trimmable once mapped, so a tenant waits for them too."""
    import json
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text(HEAD + "0.0,2213,49\n0.0,2537,21\n0.0,94,378\n0.0,1907,43\n0.0,626,46\n0.0,75,1\n0.0,1180,88\n"
                 "0.096726,57,50\n0.096726,2336,146\n0.096726,1281,8\n")
    b.write_text(HEAD + "0.056955,7720,37\n")
    out = tmp_path / "o"
    assert main(["colocate", "--tenant", f"model=llama-3-8b,trace={a},sleep-after=0.1s,ceiling=0.7,rate-scale=0.5",
                 "--tenant", f"model=llama-3-8b,trace={b},policy=vattention:sync,sleep-weights=yes,floor=0.2",
                 "--sharing", "elastic:trim-delay=0.1s", "--memory-util", "0.221468", "--out", str(out),
                 "--no-report"]) == 0
    tenants = json.loads((out / "summary.json").read_text())["tenants"]
    assert [(t["finished"], t["rejected"]) for t in tenants] == [(10, 0), (1, 0)]


@pytest.mark.parametrize("field, written, shown", [
    ("input_length", "true", "(got true)"),
    ("input_length", '"12"', '(got "12")'),
    ("timestamp", "null", "(got null)"),
    ("hash_ids", "[true]", "(got [true])"),
    ("hash_ids", '{"a": 1}', '(got {"a": 1})'),
])
def test_mooncake_value_is_shown_as_json_wrote_it(tmp_path, capsys, field, written, shown):
    """A Mooncake line's bad value is shown as JSON spells it (``true``, ``null``, ``"12"``), not Python's repr
    (``True``, ``None``, ``'12'``): the user looks for it in the file."""
    values = {"timestamp": "0", "input_length": "5", "output_length": "10", "hash_ids": "[1]", field: written}
    trace = tmp_path / "t.jsonl"
    trace.write_text("{" + ", ".join(f'"{k}": {v}' for k, v in values.items()) + "}\n")
    assert main(["simulate", "--trace", str(trace), "--quiet", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"line 1, column '{field}'" in err and shown in err, err


# ---- helper-53 (stop 51): a new user's reading of the printed summary ------------------------------------------
def test_summary_labels_per_stage_memory_and_prints_swap(tmp_path, capsys):
    """Under --pp the memory rows are one stage's (each stage maps its own layers' pages): they said nothing; a
    swap run printed neither that swap preemption was on nor what it moved (summary.json had 820 MiB)."""
    assert main(["simulate", "--pp", "2", "--num-requests", "30", "--out", str(tmp_path / "pp")]) == 0
    out = capsys.readouterr().out
    assert "peak mapped KV memory (per stage)" in out and "page pool (per stage)" in out
    assert "VMM time per TP worker (one stage)" in out
    sharegpt = Path(__file__).resolve().parents[2] / "shared" / "traces" / "vidur_processed_traces" / \
        "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
    assert main(["simulate", "--policy", "vattention:preemption=swap", "--trace", str(sharegpt), "--arrival",
                 "poisson:30", "--memory-util", "0.2", "--num-requests", "500", "--out", str(tmp_path / "sw")]) == 0
    out = capsys.readouterr().out
    import json
    summary = json.loads((tmp_path / "sw" / "summary.json").read_text())
    assert summary["swap_out_bytes"] > 0 and "swap preemption" in out
    from sim.units import format_bytes
    assert f"swapped out / in               {format_bytes(summary['swap_out_bytes'])}" in out
    assert "swap time total" in out
    assert main(["simulate", "--num-requests", "30", "--out", str(tmp_path / "plain")]) == 0
    assert "swapped out" not in capsys.readouterr().out       # nothing swapped: no rows


def test_an_engine_preset_names_itself_in_the_prefix_warning(tmp_path, capsys):
    """--engine sglang turns prefix caching on; the no-hash_ids warning named 'paged', which the user never wrote."""
    assert main(["simulate", "--engine", "sglang", "--num-requests", "20", "--out", str(tmp_path / "e")]) == 0
    captured = capsys.readouterr()
    assert "--engine sglang (its preset turns prefix caching on" in captured.err
    assert "blocks of 1 token," in captured.out


def test_an_slo_below_the_zero_load_latency_stops_the_search_and_says_so(capsys):
    """capacity --slo ttft_p99=1us halved the rate 16 times (17 simulations down to 7e-05 req/s) with TTFT p99 flat
    at 96.5 ms from 1/16 of the rate on, and said only 'fails even at'. The walk stops once the failing metric
    stays within 1% over 3 halvings, and the answer says it is the zero-load latency."""
    assert main(["capacity", "--slo", "ttft_p99=1us", "--num-requests", "100"]) == 1
    out = capsys.readouterr().out
    assert "stays the same as the rate falls 8-fold: that is the latency at zero load" in out
    assert "(7 simulations)" in out


def test_at_zero_load_needs_flat_failing_metrics_only():
    from analysis.planning.capacity import Evaluation, at_zero_load

    def e(value, failed=("ttft_p99",)):
        return Evaluation(1.0, 1.0, {"ttft_p99": value}, 0.0, failed)
    assert at_zero_load([e(200.0), e(100.0), e(100.5), e(100.2), e(100.0)])
    assert not at_zero_load([e(100.0), e(100.5), e(100.2)])                       # too few halvings
    assert not at_zero_load([e(103.0), e(101.0), e(100.5), e(100.0)])            # still falling by > 1%
    assert not at_zero_load([e(100.0), e(100.0), e(100.0), e(100.0, ("ttft_p99", "stability"))])
    assert not at_zero_load([e(100.0), e(100.0), e(100.0), e(100.0, ())])        # a pass


def test_a_queue_that_builds_mid_run_is_warned():
    """Helper-53: the conversation trace at --rate-scale 4 (22 req/s offered, capacity ~17) had TTFT p99 40.9 s and
    a median scheduling delay of 4.0 s, but its TTFT slope after the first quarter was -0.010 s/s (the load peaks
    mid-trace): no overload warning. A median delay above the capacity search's 2 s bound now warns."""
    from analysis.summary import attention_lines
    lines = attention_lines({"ttft_growth_s_per_s": -0.010, "sched_delay_p50_ms": 3978.2})
    assert len(lines) == 1 and lines[0].startswith("overloaded for part of the run: the median request waits 4.0 s")
    assert attention_lines({"ttft_growth_s_per_s": -0.010, "sched_delay_p50_ms": 1999.0}) == []
    assert len(attention_lines({"ttft_growth_s_per_s": 0.2, "sched_delay_p50_ms": 3978.2})) == 1    # one line


# ---- helper-56 (stop 51): window-aware runs' used pages and tail waste ---------------------------------------
def test_window_aware_used_pages_are_pool_units_of_each_groups_own_pages(tmp_path):
    """``used_page_groups`` counted ceil(T / p) pages from token 0 for every window-aware run: in pages, not the
    pool units the other columns hold, and blind to windows. An all-sliding Mistral (4,096-token window, 16-token
    blocks, 1 unit a block) request of 6,000 tokens holds ceil(4096 / 16) + 1 = 257 blocks: used was 375 beside 257
    mapped. A Gemma 3 prompt of 374 tokens in one 512-token page costs 8 (full) + 40 (sliding) units: used was 1
    beside 48 mapped."""
    _, iterations = _run(tmp_path, "long.csv", HEAD + "0.0,6000,200\n",
                         "--model", "models/mistral-7b.json", "--policy", "paged:window=free", "--token-budget", "512")
    last = iterations.iloc[-1]
    assert last["mapped_page_groups"] == 257 and last["used_page_groups"] == 257
    assert (iterations["used_page_groups"] <= iterations["mapped_page_groups"]).all()
    _, iterations = _run(tmp_path, "short.csv", HEAD + "0.0,374,20\n",
                         "--model", "models/gemma-3-12b.json", "--policy", "vattention:window=unmap,lookahead=0,eager=0")
    first = iterations.iloc[0]
    assert (first["mapped_page_groups"], first["used_page_groups"]) == (48, 48)
    # the page's 512 - 374 = 138 empty tokens in 48 layers, 8 KiB a token and layer (8 KV heads of 256, bf16)
    assert first["tail_waste_bytes"] == 138 * 48 * 2 * 8 * 256 * 2


def test_static_window_reserve_waste_is_the_reservation_less_the_held_bytes(tmp_path):
    """static:window=reserve's unit is one request's reservation over every layer group; its tail waste was
    max_len tokens at every layer's bytes (a mean of 311 GB on an H200); now the reservation's bytes less what the
    request's tokens hold in each group, never above the reserved bytes."""
    import json
    out = tmp_path / "st"
    assert main(["simulate", "--model", "models/gemma-3-12b.json", "--policy", "static:window=reserve",
                 "--num-requests", "60", "--out", str(out), "--quiet"]) == 0
    iterations = pd.read_parquet(out / "iterations.parquet")
    unit_bytes = json.loads((out / "summary.json").read_text())["kv_groups"]["unit_bytes"]
    active = iterations["mapped_page_groups"] - iterations["deferred_page_groups"]
    assert (iterations["tail_waste_bytes"] >= 0).all()
    assert (iterations["tail_waste_bytes"] <= active * unit_bytes).all()


# ---- helper-55 (stop 51): non-finite and empty values ------------------------------------------------------
SPLITWISE = str(Path(__file__).resolve().parents[2] / "shared" / "traces" / "vidur_processed_traces" /
                "splitwise_conv.csv")


@pytest.mark.parametrize("argv, words", [
    # NaN block-table time hung the run; inf and 1e308 factors gave NaN latencies with rc 0
    (["simulate", "--policy", "paged:bt_base_us=nan"], "bt_base_us=nan: must lie in [0, 1e+06]"),
    (["simulate", "--policy", "paged:bt_per_block_us=nan"], "bt_per_block_us=nan: must lie in [0, 1000]"),
    (["simulate", "--policy", "paged:bt_base_us=inf"], "bt_base_us=inf"),
    (["simulate", "--policy", "paged:decode_factor=1e308"], "decode_factor=1e308: must lie in [1, 100]"),
    (["simulate", "--policy", "vattention:layout=cross-layer,layout_factor=1e300"], "layout_factor=1e300"),
    (["simulate", "--policy", "vattention:layout_factor=nan"], "layout_factor=nan"),
    (["simulate", "--pd", "1:1", "--kv-link", "1e400GB/s"], "bandwidth must be > 0 and finite"),
    (["capacity", "--slo", "ttft_p99=1e400s"], "duration must be finite"),
    (["capacity", "--slo", "ttft_p99=2s", "--target-rate", "1e300"], "--target-rate must be at most 1e+15 req/s"),
    (["simulate", "--trace", ""], "--trace '': an empty path"),
    (["capacity", "--slo", "ttft_p99=2s", "--trace", " "], "an empty path"),
    (["sweep", "--grid", "seed=1", "--trace", ""], "an empty path"),
    (["traces", "stats", ""], "'': an empty path"),
    (["traces", "stats", "--seed", "-1", "--arrival", "poisson:5", SPLITWISE], "--seed: must be >= 0"),
])
def test_non_finite_and_empty_values_are_refused_by_name(tmp_path, capsys, argv, words):
    out = ["--out", str(tmp_path / "o")] if argv[0] in ("simulate", "sweep") else []
    rest = ["--num-requests", "5"] if argv[0] in ("simulate", "capacity", "sweep") else []
    try:
        status = main([*argv, *rest, *out])
    except SystemExit as exc:                 # an argparse type error exits from the parser
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("split, words", [("1e300/1", "less than one of its allocation units"),
                                          ("nan/0.5", "2 positive finite shares"),
                                          ("inf/1", "2 positive finite shares")])
def test_colocate_split_shares_must_be_finite(tmp_path, capsys, split, words):
    """split=1e300/1 raised OverflowError (a traceback); nan and inf named neither --sharing nor split."""
    tenant = f"model=llama-3-8b,trace={SPLITWISE},num-requests=5"
    assert main(["colocate", "--no-report", "--out", str(tmp_path / "c"), "--tenant", tenant,
                 "--tenant", tenant + ",name=b", "--sharing", f"static:split={split}"]) == 2
    err = capsys.readouterr().err
    assert words in err and "split" in err and "Traceback" not in err, err


GPU_TOML = ('full_name = "test"\nhbm_bytes = 150754820096\nbf16_flops = 989e12\nmem_bw_bytes_per_s = 4.8e12\n'
            'nvlink_bytes_per_s = 450e9\npcie_bytes_per_s = 64e9\n')


def test_a_gpu_files_efficiencies_are_used_and_checked(tmp_path, capsys):
    """flops_efficiency / bw_efficiency of a GPU TOML were accepted (even 2 and nan) and ignored: a GPU at 0.3 of
    its bandwidth decoded as fast as one at the H200's 0.896. Decode is bandwidth-bound, so TPOT grows ~0.896/0.3."""
    import json
    plain, slow = tmp_path / "plain.toml", tmp_path / "slow.toml"
    plain.write_text(GPU_TOML)
    slow.write_text(GPU_TOML + 'flops_efficiency = 0.3\nbw_efficiency = 0.3\nefficiency_source = "a test"\n')
    tpot = {}
    for gpu in (plain, slow):
        out = tmp_path / gpu.stem
        assert main(["simulate", "--gpu", str(gpu), "--profile", "roofline", "--num-requests", "20", "--quiet",
                     "--out", str(out)]) == 0
        tpot[gpu.stem] = json.loads((out / "summary.json").read_text())["tpot_p50_ms"]
    assert 2.0 < tpot["slow"] / tpot["plain"] < 3.2
    capsys.readouterr()
    for extra, words in (("flops_efficiency = 2\nbw_efficiency = 0.3\nefficiency_source = \"t\"\n",
                          "field flops_efficiency must lie in (0, 1]"),
                         ("bw_efficiency = nan\n", "field bw_efficiency must be a finite number"),
                         ("flops_efficiency = 0.3\n", "field bw_efficiency is missing beside flops_efficiency")):
        bad = tmp_path / "bad.toml"
        bad.write_text(GPU_TOML + extra)
        assert main(["simulate", "--gpu", str(bad), "--num-requests", "5", "--out", str(tmp_path / "b")]) == 2
        assert words in capsys.readouterr().err


def test_a_profile_naming_an_in_loop_fit_without_its_params_is_refused(tmp_path, capsys):
    """compute_in_loop without params ran the roofline and said the fit was for other models (it named this one)."""
    import json
    profile = json.loads((Path(__file__).resolve().parents[1] / "profiles" / "h200-engine.json").read_text())
    del profile["compute_in_loop"]["params"]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    assert main(["simulate", "--profile", str(path), "--num-requests", "5", "--out", str(tmp_path / "o")]) == 2
    assert "field compute_in_loop.params is missing" in capsys.readouterr().err


@pytest.mark.parametrize("argv, stream, words", [
    (["simulate", "--policy", "paged", "--page-size", "4MiB"], "err", "--page-size sets vAttention's page size"),
    (["simulate", "--host-swap", "8GiB"], "err", "--host-swap sizes the host memory"),
    (["simulate", "--trace", SPLITWISE, "--arrival", "offline", "--rate-scale", "2"], "err",
     "--rate-scale 2 changes nothing with --arrival offline"),
    (["colocate", "--no-report", "--tenant", f"model=llama-3-8b,trace={SPLITWISE},num-requests=5,floor=0.3,ceiling=0.4",
      "--tenant", f"model=llama-3-8b,trace={SPLITWISE},num-requests=5,name=b", "--sharing", "static"], "err",
     "floor= and ceiling= bound elastic sharing only"),
])
def test_options_that_change_nothing_are_noted(tmp_path, capsys, argv, stream, words):
    """Helper-55: options accepted and silently dropped (a user learns nothing from a run that is the same without
    them)."""
    rest = ["--num-requests", "5"] if argv[0] == "simulate" else []
    assert main([*argv, *rest, "--out", str(tmp_path / "o")]) == 0
    assert words in getattr(capsys.readouterr(), stream)


@pytest.mark.parametrize("argv, words", [
    (["sweep", "--grid", "policy=vattention,paged", "--policy", "static"], "--grid policy sets the policy that "
                                                                          "--policy static also sets"),
    (["sweep", "--grid", "seed=1", "--ray-address", "1.2.3.4:6379"], "applies to --executor ray"),
    (["sweep", "--grid", "seed=1", "--tolerance", "0.5"], "--tolerance is the capacity search's"),
    (["capacity", "--compute", "isolated", "--slo", "ttft_p99=2s"], "--compute isolated belongs to --colocate"),
])
def test_options_another_option_would_drop_are_refused(tmp_path, capsys, argv, words):
    out = ["--out", str(tmp_path / "o")] if argv[0] == "sweep" else []
    assert main([*argv, "--num-requests", "5", *out]) == 2
    assert words in capsys.readouterr().err


# ---- helper-54 (stop 51): prefix caching against vLLM v1 -------------------------------------------------
def _mooncake(rows) -> str:
    return "".join(f'{{"timestamp": {t}, "input_length": {n}, "output_length": {o}, "hash_ids": {list(ids)}}}\n'
                   for t, n, o, ids in rows)


@pytest.mark.parametrize("evict, hits", [("lru", [0, 0, 0, 0]), ("radix-leaf", [0, 0, 0, 512])])
def test_lru_eviction_pops_the_oldest_free_block_cached_or_not(tmp_path, evict, hits):
    """vLLM v1 keeps every free block in one queue (BlockPool.free_block_queue): a request's freed blocks go to the
    tail, get_new_blocks pops the head and evicts a cached block it pops. A pool of 4 blocks of 512: request 0
    caches [1, 2]; requests 1 and 2 (600 tokens, 2 blocks each) take the oldest free blocks, so request 2 takes
    request 0's cached blocks and request 3 ([1, 2] again) hits nothing. kvsim used never-cached pages first
    and evicted only when they ran out: request 3 hit 512. SGLang (radix-leaf) allocates free slots first and
    evicts only when short, as before."""
    text = _mooncake([(0, 1024, 1, [1, 2]), (1000, 600, 1, [7, 8]), (2000, 600, 1, [9, 10]), (3000, 1024, 1, [1, 2])])
    requests, _ = _run(tmp_path, "evict.jsonl", text, "--model", "llama-3.1-8b", "--policy",
                       f"paged:block=512,prefix=on,evict={evict}", "--memory-util", "0.1085372419507411")
    assert requests["status"].tolist() == ["finished"] * 4
    assert requests["prefix_hit_tokens"].tolist() == hits


@pytest.mark.parametrize("policy, hits", [("paged:prefix=on", [0, 1024, 2032]),
                                          ("vattention:prefix=on", [0, 0, 2047])])
def test_a_prefix_computed_twice_in_one_iteration_still_caches_what_follows(tmp_path, policy, hits):
    """Two prompts of one prefix prefilled in the same iteration: the second's pages for [1, 2] duplicated the
    first's; donation stopped there, so its pages for [3, 4] were never cached and a later [1, 2, 3, 4] prompt
    hit 1,024 tokens. vLLM caches blocks when it schedules them (allocate_slots -> cache_blocks, before the
    forward pass): the second request, scheduled after the first in the same step, hits its [1, 2] (1,024), and
    the third 2,032 (16-token blocks, prompt - 1 rounded down). vAttention donates computed pages (its
    copy-on-write copies before the forward pass): the second duplicates [1, 2], caches [3, 4] past the copy,
    and the third hits 2,047 with the partial page copied."""
    text = _mooncake([(0, 1024, 5, [1, 2]), (0, 2048, 5, [1, 2, 3, 4]), (1000, 2048, 5, [1, 2, 3, 4])])
    requests, iterations = _run(tmp_path, "dup.jsonl", text, "--model", "llama-3.1-8b", "--policy", policy)
    assert requests["prefix_hit_tokens"].tolist() == hits
    assert iterations["prefill_tokens"].iloc[0] == 1024 + 1024     # both prefixes in one iteration


@pytest.mark.parametrize("scheduler", ["sarathi", "vllm"])
def test_paged_blocks_are_cached_when_scheduled(tmp_path, scheduler):
    """Two identical 1,024-token prompts at 0 s: vLLM v1 schedules both in one step and the second hits the
    first's blocks cached at scheduling (1,008 = prompt - 1 rounded down to 16-token blocks); kvsim cached them
    after the compute: [0, 0] (helper-54)."""
    text = _mooncake([(0, 1024, 10, [1, 2]), (0, 1024, 10, [1, 2])])
    requests, _ = _run(tmp_path, "same.jsonl", text, "--model", "llama-3.1-8b", "--policy", "paged:prefix=on",
                       "--scheduler", scheduler)
    assert requests["prefix_hit_tokens"].tolist() == [0, 1008]


def test_hybrid_prefix_used_blocks_count_a_shared_block_once(tmp_path):
    """paged:window=free,prefix=on: a block two running requests share was used twice (used 194 beside 130
    mapped on Mistral: 64 = the 1,024 shared tokens in 16-token blocks)."""
    text = _mooncake([(0, 1024, 50, [1, 2]), (100, 2048, 10, [1, 2, 3, 4])])
    _, iterations = _run(tmp_path, "hyb.jsonl", text, "--model", "models/mistral-7b.json", "--policy",
                         "paged:window=free,prefix=on")
    assert (iterations["used_page_groups"] <= iterations["mapped_page_groups"]).all()


def test_tier_hits_at_a_readmission_are_a_column_of_their_own(tmp_path):
    """A request preempted and re-admitted loaded 80 tokens from DRAM that no per-request column held (the
    summary's tier_dram_hit_tokens had them): the computed tokens did not add up. Pool of 100 16-token blocks."""
    text = _mooncake([(0, 100, 560, [50]), (1, 1024, 400, [1, 2])])
    requests, iterations = _run(tmp_path, "po.jsonl", text, "--model", "llama-3.1-8b", "--policy", "paged:prefix=on",
                                "--memory-util", "0.1079321129608892", "--kv-tier", "dram:1GiB")
    assert requests["preemptions"].sum() >= 1 and requests["dram_hit_tokens_preempted"].sum() > 0
    computed = iterations["prefill_tokens"].sum() + iterations["decode_tokens"].sum()
    expected = (requests["prompt_tokens"] + requests["output_tokens"] - 1 + requests["recomputed_tokens"]
                - requests["prefix_hit_tokens"] - requests["prefix_hit_tokens_preempted"]
                - requests["dram_hit_tokens"] - requests["dram_hit_tokens_preempted"]).sum()
    assert computed == expected


def test_a_quantization_config_that_is_not_an_object_is_named(tmp_path, capsys):
    """"quantization_config": "fp8" (a string) said 'quantization_config.quant_method null is not supported'."""
    import json
    model = json.loads((Path(__file__).resolve().parents[1] / "models" / "mistral-7b.json").read_text())
    model["quantization_config"] = "fp8"
    path = tmp_path / "q.json"
    path.write_text(json.dumps(model))
    assert main(["simulate", "--model", str(path), "--num-requests", "5", "--out", str(tmp_path / "o")]) == 2
    assert 'field quantization_config must be an object with a quant_method (fp8, mxfp4), got "fp8"' in \
        capsys.readouterr().err


def test_an_engine_fit_removes_the_gpu_measured_harness_fits_only_with_force(tmp_path, capsys):
    """calibrate --from-run on an engine replay deleted the profile's compute.roofline and compute.tiled_roofline
    (measured on a GPU, not re-made without one) with a note only; now refused without --force."""
    import json
    root = Path(__file__).resolve().parents[1]
    profile = json.loads((root / "profiles" / "h200.json").read_text())
    profile.pop("compute_in_loop", None)
    out = tmp_path / "p.json"
    out.write_text(json.dumps(profile))
    run = str(root / "docs" / "validation" / "engine-piecewise" / "replays" / "pw-conv-piecewise")
    assert main(["calibrate", "--from-run", run, "--out", str(out)]) == 2
    assert "pass --force to remove them" in capsys.readouterr().err
    assert json.loads(out.read_text()) == profile                   # untouched
    assert main(["calibrate", "--from-run", run, "--out", str(out), "--force"]) == 0
    written = json.loads(out.read_text())
    assert "compute_in_loop" in written and "roofline" not in written.get("compute", {})


# ---- helper-58 (stop 51): P/D -------------------------------------------------------------------------------
CODE = str(Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_llm_2023" /
           "AzureLLMInferenceTrace_code.csv")


def test_an_mla_handover_moves_a_full_latent_copy_to_every_decode_gpu(tmp_path):
    """Under MLA every tensor-parallel GPU holds the whole latent (kv_bytes_per_token is the same at any tp), so
    each of the decode role's 8 GPUs needs a full copy: 8 copies over 8 links take bytes / bandwidth, not bytes /
    (8 x bandwidth). DeepSeek-V3, 4,808 tokens x 70,272 B over InfiniBand (50 GB/s, 10 us): 6,767.4 us (was 854.7)."""
    out = tmp_path / "mla"
    assert main(["simulate", "--trace", CODE, "--num-requests", "2", "--model", "models/deepseek-v3.json", "--pd", "1:1",
                 "--tp", "8", "--out", str(out), "--quiet"]) == 0
    first = pd.read_parquet(out / "requests.parquet").iloc[0]
    assert first["kv_transfer_bytes"] == first["prompt_tokens"] * 70_272
    assert first["kv_transfer_us"] == pytest.approx(10.0 + first["kv_transfer_bytes"] / 50e9 * 1e6)


@pytest.mark.parametrize("text, bytes_per_s", [("400gb/s", 50e9), ("400Gb/s", 50e9), ("0.4tb/s", 50e9),
                                               ("50GB/s", 50e9), ("8000kb/s", 1e6), ("64GiB/s", 64 * 2 ** 30)])
def test_a_lower_case_b_is_bits_whatever_the_prefix(text, bytes_per_s):
    """The docs: bits with a lower-case b. 400gb/s was read as 400 GB/s (8x) while 8000kb/s was bits."""
    from sim.timing.kvlink import parse_bandwidth_bytes_per_s
    assert parse_bandwidth_bytes_per_s(text) == pytest.approx(bytes_per_s)


def test_capacity_pd_says_a_lower_bound_and_unservable_requests(capsys):
    """capacity --pd printed a capacity no rate failed as a measurement (607,730 req/s from 6 requests), and
    dropped the --allow-rejected WARNING that the co-located answer prints."""
    assert main(["capacity", "--trace", CODE, "--num-requests", "6", "--slo", "ttft_p99=1000s,tpot_p99=10s",
                 "--tolerance", "0.1", "--pd", "1:1", "--quiet", "--target-rate", "10"]) == 0
    out = capsys.readouterr().out
    assert "capacity of the deployment: at least " in out and "is a lower bound, not a measurement" in out
    assert "for 10 req/s: at most 1 copy" in out
    main(["capacity", "--trace", CODE, "--num-requests", "100", "--slo", "ttft_p99=10s", "--tolerance", "0.3",
          "--pd", "2:1", "--memory-util", "0.113", "--allow-rejected", "--quiet"])
    out = capsys.readouterr().out
    assert "WARNING: " in out and "counts served requests only (--allow-rejected)" in out, out


def test_capacity_pd_out_holds_every_step(tmp_path, capsys):
    """The --out help promises every step; the P/D record had none (the co-located one has them)."""
    import json
    out = tmp_path / "pd.json"
    main(["capacity", "--trace", CODE, "--num-requests", "30", "--slo", "ttft_p99=2s", "--tolerance", "0.3",
          "--pd", "1:1", "--quiet", "--out", str(out)])
    record = json.loads(out.read_text())
    assert len(record["steps"]) == record["search_steps"] and record["steps"][0]["scale"] == 1.0


def test_a_replicated_summary_says_which_rows_are_summed(tmp_path, capsys):
    """--replicas 3: the peak is the sum of the replicas' peaks and the pool all replicas', but tail waste and the
    batch size are per replica; the rows said neither (helper-59)."""
    assert main(["simulate", "--replicas", "3", "--routing", "least-outstanding", "--num-requests", "60",
                 "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "peak mapped KV memory (sum of the replicas' peaks)" in out and "page pool (all replicas)" in out
    assert "tail waste mean / max (per replica)" in out and "batch size mean / max (per replica)" in out
