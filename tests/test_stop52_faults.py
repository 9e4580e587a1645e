"""Faults found in stop 52 by helpers run as an attacker of the command line (61) and others, each made a test with
the value the helper gave as right (hand-checked here)."""
from __future__ import annotations

import json

from cli import main

ARXIV = "../shared/traces/vidur_processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"
HEAD = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


def test_a_swap_preemption_with_no_room_on_the_host_is_counted_and_said(tmp_path, capsys):
    """Two 600 + 700-token requests in a 282 MiB pool preempt (the second, under the vLLM scheduler); a 1 MiB host
    (8 tokens of llama-3-8b's 128 KiB each) holds none of the victim's KV: the preemption recomputes, and the run
    said 'swap preemption' and nothing else (helper-61). Now ``swap_refused_preemptions`` counts it and the
    summary prints a warning; with 4 GiB it swaps and nothing is said."""
    trace = tmp_path / "t.csv"
    trace.write_text(HEAD + "0.0,600,700\n0.001,600,700\n0.002,600,700\n")
    for host, refused in (("1MiB", True), ("4GiB", False)):
        out = tmp_path / host
        assert main(["simulate", "--trace", str(trace), "--scheduler", "vllm", "--policy", "paged",
                     "--memory-util", "0.1085", "--preemption", "swap", "--host-swap", host, "--out", str(out)]) == 0
        summary = json.loads((out / "summary.json").read_text())
        printed = capsys.readouterr().out
        assert summary["preemptions"] > 0
        if refused:
            assert summary["swap_refused_preemptions"] == summary["preemptions"] and summary["swap_out_bytes"] == 0
            assert "preemptions recomputed instead of swapped" in printed
        else:
            assert summary["swap_refused_preemptions"] == 0 and summary["swap_out_bytes"] > 0
            assert "recomputed instead of swapped" not in printed


def test_sigterm_leaves_no_partial_run_directory(tmp_path):
    """``timeout`` / ``kill`` send SIGTERM: a run being written left a hidden ``.OUT.kvsim-new-*`` folder with a
    partial iterations.parquet each time (helper-61); SIGTERM now unwinds as Ctrl-C does: exit 143, nothing left."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    conv = root.parent / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    if not conv.exists():
        import pytest
        pytest.skip(f"{conv} is not present")
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "cli.py", "simulate", "--trace", str(conv), "--out", str(out), "--quiet"],
                            cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".run.kvsim-new-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if proc.poll() is not None:
        import pytest
        pytest.skip("the run ended before its directory was being written (a very fast machine)")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    if proc.returncode == 0:       # it finished between the poll and the signal: the whole run is there
        assert (out / "summary.json").is_file() and [p.name for p in tmp_path.iterdir()] == ["run"]
        return
    assert proc.returncode == 143 and "kvsim: terminated" in err
    assert list(tmp_path.iterdir()) == []


def test_sweep_reruns_a_damaged_point_names_a_missing_trace_and_notes_an_inert_rate_scale(tmp_path, capsys):
    """helper-61: a truncated points/*.json made the resumed sweep fail with a bare 'Unterminated string' naming no
    file; a trace axis naming no file became error rows (docs/capacity.md: refused before any point runs); and
    rate_scale under --arrival offline ran equal points without a word (simulate says so)."""
    from pathlib import Path
    splitwise = "../shared/traces/vidur_processed_traces/splitwise_conv.csv"
    if not Path(splitwise).exists():
        import pytest
        pytest.skip(f"{splitwise} is not present")
    out = tmp_path / "sw"
    argv = ["sweep", "--trace", splitwise, "--num-requests", "10", "--arrival", "offline", "--grid", "rate_scale=1,2",
            "--out", str(out), "--quiet", "--workers", "1"]
    assert main(argv) == 0
    assert "--grid rate_scale changes nothing with --arrival offline" in capsys.readouterr().err
    point = sorted((out / "points").glob("*.json"))[0]
    point.write_text(point.read_text()[:40])
    assert main(argv) == 0
    assert f"{point}: not a readable sweep point" in capsys.readouterr().err
    assert json.loads(point.read_text())["status"] == "ok"          # run again and written whole
    assert main(["sweep", "--grid", f"trace={tmp_path / 'none.csv'},{splitwise}", "--num-requests", "10",
                 "--out", str(tmp_path / "sw2"), "--quiet", "--workers", "1"]) == 2
    assert "no such file" in capsys.readouterr().err and not (tmp_path / "sw2").exists()


def test_pd_search_takes_its_degrees_from_pd_tp_alone(tmp_path, capsys):
    """llama-3-70b's weights need tp >= 2 on an H100: ``--pd-search 8 --pd-tp 4`` was refused for --tp 1 (the
    default, never asked for) unless --tp 4 was given too (helper-63); the search now runs at its own degrees."""
    conv = "../shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
    assert main(["capacity", "--trace", conv, "--num-requests", "20", "--model", "llama-3-70b", "--gpu", "h100",
                 "--slo", "ttft_p99=2s,tpot_p99=100ms", "--pd-search", "8", "--pd-tp", "4", "--quiet"]) == 0
    assert "P:D 1:1 tp4/tp4" in capsys.readouterr().out


def test_a_paged_prompt_admitted_whole_keeps_its_blocks_from_running_decodes(tmp_path):
    """7 blocks of 16; D = 16 + 40 tokens, P = 96 + 2, budget 32 (helper-64's derivation from Sarathi-Serve's
    ``BaseBlockSpaceManager.allocate``, which takes all 6 of P's prompt blocks at admission): iteration 0 prefills
    16 of each and leaves 0 blocks free; at iteration 1 D's decode needs its second block, so P (the last admitted)
    is preempted having computed 16 tokens, and waits for D. kvsim had mapped P chunk by chunk: D's decodes took the
    blocks P was admitted with and P was preempted after 78 tokens."""
    trace = tmp_path / "steal.csv"
    trace.write_text(HEAD + "0.0,16,40\n0.0,96,2\n")
    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(trace), "--policy", "paged", "--token-budget", "32",
                 "--memory-util", "0.10663838891357288", "--out", str(out), "--quiet"]) == 0
    import pandas as pd
    requests = pd.read_parquet(out / "requests.parquet")
    iterations = pd.read_parquet(out / "iterations.parquet")
    assert list(requests["recomputed_tokens"]) == [0, 16] and list(requests["preemptions"]) == [0, 1]
    assert list(iterations["prefill_tokens"][:2]) == [32, 0] and iterations["free_page_groups"].iloc[0] == 0
    assert requests["completion_at_us"].iloc[1] > requests["completion_at_us"].iloc[0]    # P waited for D


def test_capacity_says_when_a_gpu_is_timed_by_the_roofline(tmp_path, capsys):
    """helper-63 compared an H100 (no measured profile: the roofline) with an H200 (its engine profile) and found
    them equal; only the 'compute model:' line told them apart. capacity now says so for a roofline GPU."""
    from pathlib import Path
    conv = "../shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
    if not Path(conv).exists():
        import pytest
        pytest.skip(f"{conv} is not present")
    args = ["capacity", "--trace", conv, "--num-requests", "30", "--slo", "ttft_p99=2s", "--quiet"]
    main([*args, "--gpu", "h100"])
    assert "h100 has no measured compute profile" in capsys.readouterr().err
    main([*args, "--gpu", "h200"])
    assert "no measured compute profile" not in capsys.readouterr().err


def test_a_page_that_holds_the_whole_slot_is_said():
    """Llama-3-70B at tp 8: a 2 MiB page holds 8,192 tokens of one sub-tensor's KV (1 KV head x 128 x 2 bytes =
    256 B a token), the whole 8,192-token slot: vAttention then maps whole slots, as static reservation (helper-63)."""
    from sim.setup.config import SimConfig
    notes = SimConfig(model="llama-3-70b", tp=8, gpu="h100").notes
    assert any("holds 8,192 tokens here (tp=8), the whole 8,192-token slot" in note for note in notes)
    assert not any("the whole" in note for note in SimConfig(model="llama-3-70b", tp=4, gpu="h100").notes)


def test_summary_labels_units_of_merged_replicas_and_one_time_unit_per_line():
    """helper-63: 'peak mapped KV memory (per worker) (sum of the replicas' peaks)', an unlabelled iteration count
    summed over replicas, and 'TTFT 78.5 ms / 9352.6 ms / 14.60 s' (three units on one line)."""
    from analysis.summary import _relabel, format_ms
    config = {"tp": 2, "replicas": 3, "policy": "vattention"}
    assert _relabel("peak mapped KV memory", config) == "peak mapped KV memory (per worker; sum of the replicas' peaks)"
    assert _relabel("iterations", config) == "iterations (sum over replicas)"
    assert _relabel("iterations", {"tp": 1}) == "iterations"
    assert format_ms([78.5, 9352.6, 14600.0]) == "0.079 / 9.353 / 14.60 s"
    assert format_ms([23.3, 86.6, 138.9]) == "23.3 / 86.6 / 138.9 ms"


def test_input_messages_name_the_real_cause(tmp_path, capsys):
    """helper-61's unclear messages: a gzip trace was 'binary file (NUL byte)'; --page-size 2MB said only 'a power
    of two'; a 300-byte --out name gave a raw '[Errno 36]'; --engine sglang --policy static did not say the preset
    turned prefix caching on; a quoted CSV header (R's write.csv) was 'unrecognised'; a model TOML with a BOM was
    'not valid TOML'."""
    import gzip
    trace = tmp_path / "t.csv"
    trace.write_text(HEAD + "0.0,100,10\n")
    (tmp_path / "t.csv.gz").write_bytes(gzip.compress(trace.read_bytes()))
    cases = [
        (["simulate", "--trace", str(tmp_path / "t.csv.gz")], "a gzip file (binary), not a text trace: decompress it first"),
        (["simulate", "--num-requests", "3", "--page-size", "2MB"], "2,000,000 B is not 2 MiB; write 2MiB"),
        (["simulate", "--num-requests", "3", "--out", str(tmp_path / ("a" * 300))],
         "a name of 300 bytes, longer than the 255"),
        (["simulate", "--num-requests", "3", "--engine", "sglang", "--policy", "static"],
         "the --engine sglang preset turns prefix caching on"),
    ]
    for argv, needle in cases:
        assert main([*argv, "--quiet"]) == 2
        assert needle in capsys.readouterr().err
    quoted = tmp_path / "q.csv"
    quoted.write_text('"arrived_at","num_prefill_tokens","num_decode_tokens"\n0.0,100,10\n"0.5",200,"20"\n')
    out = tmp_path / "q"
    assert main(["simulate", "--trace", str(quoted), "--out", str(out), "--quiet"]) == 0
    import pandas as pd
    assert list(pd.read_parquet(out / "requests.parquet")["prompt_tokens"]) == [100, 200]
    from sim.setup.catalog import get_model
    bom = tmp_path / "mine.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + b"num_layers = 2\nhidden_size = 64\nnum_q_heads = 4\nnum_kv_heads = 2\n"
                    b"head_dim = 16\nffn_size = 128\nvocab_size = 100\nmax_context_tokens = 4096\n")
    assert get_model(str(bom)).num_layers == 2


def test_colocate_floors_that_sum_above_the_pool_name_the_tenants(tmp_path, capsys):
    """helper-61: two tenants with floor=0.8 were told 'a tenant needs 0 <= floor (622) <= ceiling (155)', naming no
    tenant and no unit, while the cause is that floors are shares of one pool summing to 1.6."""
    splitwise = "../shared/traces/vidur_processed_traces/splitwise_conv.csv"
    tenant = "model={},trace=" + splitwise + ",num-requests=5,floor=0.8"
    assert main(["colocate", "--tenant", tenant.format("llama-3-8b"), "--tenant", tenant.format("qwen2.5-7b"),
                 "--sharing", "elastic", "--out", str(tmp_path / "co")]) == 2
    err = capsys.readouterr().err
    assert "floors are shares of one KV pool and sum to 1.6 (t0-llama-3-8b 0.8, t1-qwen2.5-7b 0.8)" in err


def test_a_tenant_beyond_its_native_context_is_told_its_own_key(tmp_path, capsys):
    """helper-61: a tenant's max-context beyond the model's native context said 'set allow_long_context', a key no
    tenant had; the tenant key allow-long-context=yes now exists and the message names it."""
    splitwise = "../shared/traces/vidur_processed_traces/splitwise_conv.csv"
    tenant = f"model=llama-3-8b,trace={splitwise},num-requests=5,max-context=16384"
    assert main(["colocate", "--tenant", tenant, "--out", str(tmp_path / "a")]) == 2
    assert "add allow-long-context=yes to the tenant" in capsys.readouterr().err
    assert main(["colocate", "--tenant", tenant + ",allow-long-context=yes", "--out", str(tmp_path / "b")]) == 0
    assert main(["colocate", "--tenant", tenant + ",allow-long-context=maybe", "--out", str(tmp_path / "c")]) == 2


def test_check_replicas_tries_fewer_while_they_hold(tmp_path, capsys):
    """helper-63: the check confirmed only the rounded-up count (10 replicas where 8 held). It now checks one fewer
    while the SLOs hold: every count tried but the last passed, the last failed (or is 1), and the fewest is the
    last passing count."""
    conv = "../shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
    out = tmp_path / "cap.json"
    assert main(["capacity", "--trace", conv, "--num-requests", "400", "--slo", "ttft_p99=2s,tpot_p99=100ms",
                 "--target-rate", "60", "--check-replicas", "--quiet", "--out", str(out)]) == 0
    check = json.loads(out.read_text())["check"]
    tried = check["fewer_tried"]
    assert check["passed"] and tried and [t["replicas"] for t in tried] == list(
        range(check["replicas"] - 1, check["replicas"] - 1 - len(tried), -1))
    assert all(t["passed"] for t in tried[:-1]) and (not tried[-1]["passed"] or tried[-1]["replicas"] == 1)
    assert check["fewest_replicas"] == (tried[-1]["replicas"] if tried[-1]["passed"] else tried[-1]["replicas"] + 1)
    printed = capsys.readouterr().out
    assert printed.count("check: 60 req/s over") == 1 + len(tried)


def test_compare_notes_vattention_flags_that_no_compared_policy_reads(tmp_path, capsys):
    """helper-61: ``compare --policy paged --policy static --sync-mapping`` said nothing, as simulate does."""
    assert main(["compare", "--policy", "paged", "--policy", "static", "--sync-mapping", "--num-requests", "5",
                 "--out", str(tmp_path / "a"), "--quiet"]) == 0
    assert "--sync-mapping sets vAttention's page mapping; no compared policy maps pages" in capsys.readouterr().err
    assert main(["compare", "--policy", "paged", "--policy", "vattention", "--sync-mapping", "--num-requests", "5",
                 "--out", str(tmp_path / "b"), "--quiet"]) == 0
    assert "changes nothing" not in capsys.readouterr().err


def test_pd_preemptions_waiting_for_held_kv_are_recorded_and_not_repeated(tmp_path):
    """helper-62: on a P/D instance the only running request short of pages is preempted to wait for KV held for
    transfers; that pass records no iteration, so its preemption was lost from iterations.parquet (summary 1, the
    table 0), and under chunk admission the victim was re-admitted at once and preempted again, 313 times,
    recomputing 641,620 tokens of a 3,900-token prompt. Now the count is carried to the next recorded iteration
    and nothing is admitted until held KV is freed: one preemption, its 2,644 computed tokens recomputed once."""
    import pandas as pd
    trace = tmp_path / "t4.jsonl"
    trace.write_text("".join(f'{{"timestamp": {t}, "input_length": {p}, "output_length": {o}}}\n' for t, p, o in
                             ((0, 100, 3000), (0, 100, 3000), (50, 3500, 10), (100, 3500, 10), (150, 3900, 10))))
    out = tmp_path / "R"
    assert main(["simulate", "--trace", str(trace), "--pd", "1:1", "--memory-util", "0.116967", "--max-context",
                 "4096", "--policy", "vattention:admission=chunk", "--decode-policy", "static", "--out", str(out),
                 "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    requests = pd.read_parquet(out / "requests.parquet")
    assert summary["finished"] == 5 and summary["preemptions"] == 1
    assert pd.read_parquet(out / "iterations.parquet")["preemptions"].sum() == summary["preemptions"]
    assert requests["recomputed_tokens"].max() < 3900


def test_a_tiered_prefix_run_without_hash_ids_survives_a_recompute_preemption(tmp_path):
    """helper-65: a re-admission's own-page lookup took the prefix branch for a request without hash ids, and the
    tier credit then read ``len(None)``: a traceback (both policies). The tiers hold hash blocks only: no credit."""
    import pandas as pd
    trace = tmp_path / "pre3.csv"
    trace.write_text(HEAD + "0.0,160,100\n0.0,16,100\n0.0,16,100\n")
    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(trace), "--policy", "paged:prefix=on,admission=chunk", "--memory-util",
                 "0.10681923206332875", "--kv-tier", "dram:64MiB", "--out", str(out), "--quiet"]) == 0
    assert list(pd.read_parquet(out / "requests.parquet")["prefix_hit_tokens_preempted"]) == [0, 48, 0]


def test_eager_and_watermark_keys_under_sync_mapping_are_noted():
    """helper-62: ``vattention:sync,eager=8,watermark=0.3`` ran the same as ``vattention:sync`` without a word
    (checked here on 500 conversation requests: the same TTFT, map calls and stalls); now noted, and only for keys
    the user set (the defaults say nothing)."""
    from sim.frontend.policy_spec import parse_policy
    from sim.setup.config import SimConfig
    base = SimConfig()
    notes = base.with_overrides(parse_policy("vattention:sync,eager=8,watermark=0.3")).notes
    assert any(n.startswith("eager_page_groups, low_watermark_frac set with sync_mapping") for n in notes)
    assert not any("set with sync_mapping" in n for n in base.with_overrides(parse_policy("vattention:sync")).notes)
    assert not any("set with sync_mapping" in n for n in base.with_overrides(parse_policy("vattention:eager=8")).notes)
