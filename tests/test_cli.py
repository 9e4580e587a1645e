"""The kvsim command line: the default run, real traces, and one clear message per bad input."""
import json

import pandas as pd
import pytest

from cli import main


def test_default_simulate_is_synthetic_and_writes_the_run(tmp_path, capsys):
    assert main(["simulate", "--out", str(tmp_path / "run"), "--num-requests", "200"]) == 0
    printed = capsys.readouterr().out
    assert "synthetic" in printed and "TTFT p50" in printed
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["finished"] == 200
    requests = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert len(requests) == 200 and (requests["ttft_us"] > 0).all()
    iterations = pd.read_parquet(tmp_path / "run" / "iterations.parquet")
    # every request's prefill and decode tokens are accounted for exactly once (no preemption here)
    assert summary["preemptions"] == 0
    assert iterations["prefill_tokens"].sum() == requests["prompt_tokens"].sum()
    assert iterations["decode_tokens"].sum() == (requests["output_tokens"] - 1).sum()


def test_existing_run_is_not_overwritten(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["simulate", "--out", out, "--num-requests", "20"]) == 0
    assert main(["simulate", "--out", out, "--num-requests", "20"]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["simulate", "--out", out, "--num-requests", "20", "--force"]) == 0


@pytest.mark.parametrize("args, message", [
    (["--model", "gpt-9"], "known models: llama-2-7b"),
    (["--gpu", "tpu-v5"], "known GPUs: a100, a100-40gb, a100-80gb-pcie, a40, b200, h100"),
    (["--tp", "3"], "does not divide"),
    (["--page-size", "3MiB"], "power of two"),
    (["--trace", "/nonexistent/trace.csv"], "/nonexistent/trace.csv"),
    (["--profile", "/nonexistent/profile.json"], "profile /nonexistent/profile.json"),
])
def test_bad_input_gives_one_message_and_exit_2(tmp_path, capsys, args, message):
    assert main(["simulate", "--out", str(tmp_path / "r"), "--num-requests", "5", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert err.count("kvsim: error") == 1


def test_malformed_trace_names_file_line_and_column(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n0.5,-3,5\n")
    assert main(["simulate", "--trace", str(bad), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "bad.csv" in err and "line 3" in err and "num_prefill_tokens" in err


def test_unknown_page_size_unit_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--page-size", "2 parsecs"])
    assert exc.value.code == 2
    assert "not a size" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit):
        main(["--version"])
    assert "kvsim 0.1.0" in capsys.readouterr().out


@pytest.mark.slow
def test_full_conversation_trace_both_forms_identical(tmp_path, shared_traces):
    """README point 10: all 19,366 requests complete, and the Azure CSV and its Splitwise form agree."""
    azure = shared_traces / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    splitwise = shared_traces / "vidur_processed_traces" / "splitwise_conv.csv"
    for name, path in (("azure", azure), ("splitwise", splitwise)):
        assert main(["simulate", "--trace", str(path), "--model", "llama-3-8b", "--gpu", "h200",
                     "--out", str(tmp_path / name), "--quiet"]) == 0
    a = pd.read_parquet(tmp_path / "azure" / "requests.parquet")
    b = pd.read_parquet(tmp_path / "splitwise" / "requests.parquet")
    assert len(a) == 19_366 and (a["status"] == "finished").all()
    assert a.equals(b)
    assert pd.read_parquet(tmp_path / "azure" / "iterations.parquet").equals(
        pd.read_parquet(tmp_path / "splitwise" / "iterations.parquet"))


@pytest.mark.slow
def test_code_trace_completes(tmp_path, shared_traces):
    path = shared_traces / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
    assert main(["simulate", "--trace", str(path), "--out", str(tmp_path / "code"), "--quiet"]) == 0
    summary = json.loads((tmp_path / "code" / "summary.json").read_text())
    assert summary["finished"] == 8_819


def test_tensor_parallel_summary_says_which_rows_count_one_worker(tmp_path, capsys):
    assert main(["simulate", "--out", str(tmp_path / "tp2"), "--num-requests", "50", "--tp", "2"]) == 0
    out = capsys.readouterr().out
    for label in ("peak mapped KV memory (per worker)", "VMM map / unmap calls (per worker)",
                  "VMM time per TP worker", "VMM time, critical path"):
        assert label in out, label
    assert main(["simulate", "--out", str(tmp_path / "tp1"), "--num-requests", "50"]) == 0
    assert "(per worker)" not in capsys.readouterr().out


def test_trace_options_without_a_trace_are_refused(tmp_path, capsys):
    assert main(["simulate", "--out", str(tmp_path / "r"), "--num-requests", "5", "--format", "nope"]) == 2
    assert main(["simulate", "--out", str(tmp_path / "r"), "--num-requests", "5", "--arrival", "poisson:-1"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors == ["kvsim: error: --format applies to a --trace; the built-in synthetic workload has its own "
                      "arrivals and lengths",
                      "kvsim: error: --arrival applies to a --trace; the built-in synthetic workload has its own "
                      "arrivals and lengths"]
    assert not (tmp_path / "r").exists()


def test_a_bad_argument_is_one_line_without_the_usage_dump(capsys):
    """argparse would print every option's usage first; the error is one line naming the argument."""
    import pytest

    with pytest.raises(SystemExit) as raised:
        main(["simulate", "--max-batch", "0"])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert err == "kvsim: error: simulate: argument --max-batch: must be >= 1, got 0 (see kvsim simulate --help)\n"


def test_more_requests_asked_than_the_trace_has_is_said(tmp_path, capsys):
    """--num-requests beyond the trace keeps every request, with a warning (a planner may expect that many)."""
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:46.{i:06d},{10 + i},{3}\n" for i in range(5)))
    assert main(["simulate", "--trace", str(trace), "--num-requests", "1000", "--quiet",
                 "--out", str(tmp_path / "run")]) == 0
    assert "--num-requests 1,000: the trace has only 5 requests; all of them are simulated" in capsys.readouterr().err


def test_vllm_scheduler_refuses_a_token_budget_below_max_batch(tmp_path, capsys):
    """vLLM refuses max_num_batched_tokens < max_num_seqs (vllm/config/scheduler.py, issue 28 item 7): so does
    ``--scheduler vllm`` with ``--token-budget`` below ``--max-batch``: SimConfig's error names both fields (and no
    flag), the command line's both flags; equal values, the sarathi scheduler and the vllm scheduler on its
    defaults (2048 tokens, 256 slots) are accepted."""
    import pytest

    from sim.setup.config import ConfigError, SimConfig

    with pytest.raises(ConfigError) as refused:
        SimConfig(scheduler="vllm", token_budget=128, max_batch_slots=256)
    for name in ("scheduler=vllm", "token_budget=128", "max_batch_slots=256", "max_num_seqs",
                 "raise token_budget to 256 or more, or lower max_batch_slots to 128 or less"):
        assert name in str(refused.value)
    assert "--" not in str(refused.value)
    assert refused.value.fields == ("scheduler", "token_budget", "max_batch_slots")
    assert SimConfig(scheduler="vllm", token_budget=256, max_batch_slots=256).token_budget == 256
    assert SimConfig(scheduler="sarathi", token_budget=128).max_batch_slots == 256
    assert main(["simulate", "--out", str(tmp_path / "r"), "--num-requests", "5", "--scheduler", "vllm",
                 "--token-budget", "64", "--max-batch", "65"]) == 2
    assert capsys.readouterr().err == (
        "kvsim: error: --scheduler vllm: --token-budget 64 (vLLM's max_num_batched_tokens) is below "
        "--max-batch 65 (vLLM's max_num_seqs); vLLM refuses this (max_num_batched_tokens must be "
        ">= max_num_seqs): raise --token-budget to 65 or more, or lower --max-batch to 64 or less "
        "(max_batch_slots)\n")
    assert not (tmp_path / "r").exists()
    assert main(["simulate", "--out", str(tmp_path / "d"), "--num-requests", "5", "--scheduler", "vllm",
                 "--quiet"]) == 0


def test_simulate_warns_once_about_a_harness_timed_profile(tmp_path, capsys):
    """--profile profiles/h200.json (compute fitted on the replay harness) prints one warning line naming the
    README section; profiles/h200-engine.json and --profile roofline print none."""
    from pathlib import Path
    profiles = Path(__file__).resolve().parents[1] / "profiles"
    assert main(["simulate", "--num-requests", "20", "--quiet", "--out", str(tmp_path / "a"),
                 "--profile", str(profiles / "h200.json")]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "harness" in line]
    assert len(lines) == 1 and lines[0].startswith("kvsim: warning: ") and "Which compute model to plan with" in lines[0]
    for index, profile in enumerate((str(profiles / "h200-engine.json"), "roofline")):
        assert main(["simulate", "--num-requests", "20", "--quiet", "--out", str(tmp_path / f"b{index}"),
                     "--profile", profile]) == 0
        assert "harness" not in capsys.readouterr().err


def test_policy_key_reference_lists_each_policys_own_values():
    """`kvsim compare --help`'s key reference: `window=` takes different values per policy (vattention
    unmap|recycle, paged free, static reserve), so each policy lists its own (it was listed once as a common key
    with vattention's values, hiding paged:window=free), and every key says what it does."""
    from cli import policy_keys_help
    from sim.frontend.policy_spec import POLICY_KEYS
    text = policy_keys_help()
    sections = dict(zip(["vattention", "paged", "static", "every"], text.split(" keys")[1:]))
    assert "window=off|unmap|recycle" in sections["vattention"].split("paged")[0]
    assert "window=off|free" in text and "window=off|reserve" in text
    assert "sets " not in text                          # no placeholder "sets <field>" line
    assert "kernel=vllm-sosp23|" in text
    for table in POLICY_KEYS.values():
        for key in table:
            assert f"  {key}=" in text
