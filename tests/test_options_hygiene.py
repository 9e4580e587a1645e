"""Options (issue 16, part 2): --max-context beyond the model's context, --out checked before any work,
--force replacing a result as a whole (and never a folder that is not a kvsim result), empty selections,
policy keys set twice, one flag name per concept, and --help showing every default.

Each refusal is one ``kvsim: error:`` line naming the flag, exit status 2, no traceback.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import pytest

from cli import build_parser, main

CASES = Path(__file__).resolve().parent.parent.parent / "shared" / "cases"
LONG_TRACE = CASES / "longer_than_ctx_8b.csv"


def one_error_line(capsys, *words: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("kvsim: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


@pytest.fixture
def long_trace(tmp_path) -> Path:
    """The shared case (a 9,000-token prompt against llama-3-8b's 8,192-token context), or the same rows."""
    if LONG_TRACE.is_file():
        return LONG_TRACE
    path = tmp_path / "longer_than_ctx_8b.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,9000,10\n0.1,100,10\n")
    return path


# ---- --max-context beyond the model's native context ------------------------------------------------------
def test_simulate_refuses_a_max_context_beyond_the_model_and_the_override_is_recorded(tmp_path, long_trace, capsys):
    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(long_trace), "--max-context", "20000", "--out", str(out)]) == 2
    one_error_line(capsys, "--max-context 20000", "8,192", "--allow-long-context")
    assert not out.exists()
    assert main(["simulate", "--trace", str(long_trace), "--max-context", "20000", "--allow-long-context",
                 "--out", str(out), "--quiet"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["allow_long_context"] is True and config["max_context_tokens"] == 20000
    assert config["slot_max_tokens"] == 20000
    assert "beyond llama-3-8b's native context" in capsys.readouterr().err
    # within the context nothing changes, and config.json says the override was not used
    assert main(["simulate", "--trace", str(long_trace), "--max-context", "8192", "--out", str(tmp_path / "in"),
                 "--quiet"]) == 0
    assert json.loads((tmp_path / "in" / "config.json").read_text())["allow_long_context"] is False


@pytest.mark.parametrize("command, out_flag", [
    (["compare", "--policy", "vattention", "--policy", "paged", "--workers", "1"], "--out"),
    (["capacity", "--slo", "ttft_p99=2s", "--quiet"], "--out"),
    (["sweep", "--grid", "seed=0,1", "--quiet", "--workers", "1"], "--out"),
])
def test_every_command_with_max_context_refuses_it_beyond_the_model(tmp_path, long_trace, capsys, command, out_flag):
    out = tmp_path / "out"
    assert main([*command, "--trace", str(long_trace), "--max-context", "20000", out_flag, str(out)]) == 2
    one_error_line(capsys, "--max-context 20000", "--allow-long-context")
    assert not out.exists()


def test_sweep_refuses_a_grid_point_beyond_the_context_before_running_any(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", "--grid", "max_context=4096,20000", "--num-requests", "5", "--out", str(out),
                 "--quiet", "--workers", "1"]) == 2
    one_error_line(capsys, "--max-context 20000", "max_context=20000", "--allow-long-context")
    assert not out.exists()
    assert main(["sweep", "--grid", "max_context=4096,20000", "--num-requests", "5", "--out", str(out),
                 "--quiet", "--workers", "1", "--allow-long-context"]) == 0
    assert (pd.read_csv(out / "sweep.csv")["status"] == "ok").all()


# ---- --out checked before any work -------------------------------------------------------------------------
@pytest.fixture
def no_work(monkeypatch):
    """Any trace load or simulation fails the test: refusals must come first."""
    def forbidden(*args, **kwargs):
        raise AssertionError("work started before --out was checked")
    import importlib
    for module, name in (("cli", "load_workload"), ("sim.core.runner", "run_simulation"),
                         ("analysis.comparison", "run_policies"), ("analysis.planning.sweep_run", "run_sweep"),
                         ("analysis.planning.capacity", "find_capacity"), ("analysis.cli", "load_runs"),
                         ("traces.cli", "load_with_transforms")):
        monkeypatch.setattr(importlib.import_module(module), name, forbidden)


WRITERS = {  # command -> (argv before the output flag, output flag)
    "simulate": (["simulate", "--num-requests", "5"], "--out"),
    "compare": (["compare", "--policy", "vattention", "--policy", "paged", "--num-requests", "5"], "--out"),
    "capacity": (["capacity", "--slo", "ttft_p99=2s", "--num-requests", "5"], "--out"),
    "sweep": (["sweep", "--grid", "seed=0", "--num-requests", "5"], "--out"),
    "report": (["report", "some-run"], "--out"),
    "traces convert": (["traces", "convert", "some.csv"], "--out"),
}


@pytest.mark.parametrize("command", sorted(WRITERS))
@pytest.mark.parametrize("where", ["/proc/x", "", "   ", "FILE/below", "DIR"])
def test_out_is_refused_before_any_work_naming_the_flag(command, where, tmp_path, no_work, capsys):
    argv, flag = WRITERS[command]
    (tmp_path / "FILE").write_text("x")
    (tmp_path / "DIR").mkdir()
    (tmp_path / "DIR" / "mine.txt").write_text("keep me")
    target = where if where in ("/proc/x", "", "   ") else str(tmp_path / where)
    assert main([*argv, flag, target]) == 2
    one_error_line(capsys, flag)
    assert (tmp_path / "DIR" / "mine.txt").read_text() == "keep me"
    assert sorted(p.name for p in (tmp_path / "DIR").iterdir()) == ["mine.txt"]


def test_the_real_trace_to_proc_is_refused_before_simulating(no_work, capsys):
    trace = CASES.parent / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    assert main(["simulate", "--trace", str(trace), "--out", "/proc/x"]) == 2
    one_error_line(capsys, "--out /proc/x")


@pytest.mark.parametrize("command", ["report", "capacity", "traces convert"])
def test_an_existing_output_file_needs_force(command, tmp_path, no_work, capsys):
    argv, flag = WRITERS[command]
    existing = tmp_path / "old.out"
    existing.write_text("old")
    assert main([*argv, flag, str(existing)]) == 2
    one_error_line(capsys, flag, "--force")
    assert existing.read_text() == "old"


# ---- --force replaces the whole result -----------------------------------------------------------------------
def leftovers(folder: Path) -> list[str]:
    """kvsim's temporary siblings of ``folder`` (none may survive a command)."""
    return sorted(p.name for p in folder.parent.iterdir() if ".kvsim-" in p.name)


def test_force_leaves_no_stale_report(tmp_path, capsys):
    run = tmp_path / "R"
    assert main(["simulate", "--num-requests", "100", "--report", "--out", str(run), "--quiet"]) == 0
    assert (run / "report.html").is_file()
    assert main(["simulate", "--num-requests", "50", "--out", str(run), "--quiet"]) == 2
    one_error_line(capsys, f"--out {run}", "--force")
    assert main(["simulate", "--num-requests", "50", "--out", str(run), "--force", "--quiet"]) == 0
    assert sorted(p.name for p in run.iterdir()) == [".kvsim-result", "config.json", "iterations.parquet",
                                                     "requests.parquet", "summary.json"]
    assert json.loads((run / "summary.json").read_text())["requests"] == 50
    assert leftovers(run) == []


def test_force_on_compare_drops_the_saved_runs_of_the_old_comparison(tmp_path):
    out = tmp_path / "C"
    base = ["compare", "--num-requests", "20", "--workers", "1", "--out", str(out)]
    assert main([*base, "--policy", "vattention", "--policy", "paged", "--policy", "static", "--save-runs"]) == 0
    assert {p.name for p in out.iterdir()} >= {"run0", "run1", "run2"}
    assert main([*base, "--policy", "paged", "--force"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [".kvsim-result", "compare.csv", "compare.parquet"]
    assert list(pd.read_csv(out / "compare.csv")["policy"]) == ["paged"]
    assert leftovers(out) == []


def test_force_on_sweep_drops_points_of_another_grid_and_resume_keeps_them(tmp_path):
    out = tmp_path / "S"
    base = ["sweep", "--num-requests", "10", "--quiet", "--workers", "1", "--out", str(out)]
    assert main([*base, "--grid", "seed=0,1"]) == 0
    assert len(list((out / "points").iterdir())) == 2
    assert main([*base, "--grid", "seed=2"]) == 0           # resume: the other points stay cached
    assert len(list((out / "points").iterdir())) == 3
    assert main([*base, "--grid", "seed=2", "--force"]) == 0  # afresh: only this grid's point
    assert len(list((out / "points").iterdir())) == 1
    assert list(pd.read_csv(out / "sweep.csv")["seed"]) == [2]
    assert leftovers(out) == []


@pytest.mark.parametrize("foreign", ["notes.txt", "shapes.parquet", "subdir"])
def test_force_never_replaces_a_folder_that_holds_anything_but_a_kvsim_result(tmp_path, foreign, capsys):
    run = tmp_path / "R"
    assert main(["simulate", "--num-requests", "10", "--out", str(run), "--quiet"]) == 0
    (run / foreign).mkdir() if foreign == "subdir" else (run / foreign).write_text("the user's")
    before = sorted(p.name for p in run.iterdir())
    for extra in ([], ["--force"]):
        assert main(["simulate", "--num-requests", "10", "--out", str(run), "--quiet", *extra]) == 2
        one_error_line(capsys, f"--out {run}", foreign)
    assert sorted(p.name for p in run.iterdir()) == before


@pytest.mark.parametrize("files", [{"config.json": '{"my": "own config"}'},
                                   {"summary.json": "{}", "compare.csv": "a,b\n1,2\n"},
                                   {"report.html": "<html>my notes</html>"}])
def test_force_never_replaces_a_users_files_named_like_kvsims(tmp_path, files, capsys):
    """A folder whose files merely carry kvsim's names (a user's own config.json) is not a kvsim result: without
    kvsim's marker it is refused, with or without --force, and left as it was."""
    run = tmp_path / "mine"
    run.mkdir()
    for name, text in files.items():
        (run / name).write_text(text)
    for extra in ([], ["--force"]):
        assert main(["simulate", "--num-requests", "10", "--out", str(run), "--quiet", *extra]) == 2
        line = one_error_line(capsys, f"--out {run}", ".kvsim-result")
        assert "even with --force" in line
    assert {p.name: p.read_text() for p in run.iterdir()} == files


def test_a_new_or_empty_out_is_written(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["simulate", "--num-requests", "10", "--out", str(empty), "--quiet"]) == 0
    assert (empty / "summary.json").is_file()
    deep = tmp_path / "a" / "b" / "c"
    assert main(["simulate", "--num-requests", "10", "--out", str(deep), "--quiet"]) == 0
    assert (deep / "summary.json").is_file() and leftovers(deep) == []


def test_a_failed_run_leaves_the_old_result_and_no_temporary(tmp_path, monkeypatch):
    run = tmp_path / "R"
    assert main(["simulate", "--num-requests", "10", "--out", str(run), "--quiet"]) == 0
    before = (run / "summary.json").read_text()

    def broken(result, out_dir, overwrite=False):
        (Path(out_dir) / "requests.parquet").write_text("half written")
        raise OSError("No space left on device")
    monkeypatch.setattr("analysis.results.write_run", broken)
    assert main(["simulate", "--num-requests", "20", "--out", str(run), "--quiet", "--force"]) == 2
    assert (run / "summary.json").read_text() == before and leftovers(run) == []


# ---- empty selections ------------------------------------------------------------------------------------------
def test_traces_convert_refuses_a_window_that_keeps_no_request(tmp_path, long_trace, capsys):
    out = tmp_path / "w.parquet"
    assert main(["traces", "convert", str(long_trace), "--window", "100:200", "--out", str(out)]) == 2
    one_error_line(capsys, "--window 100:200")
    assert not out.exists()
    for flag in ("--num-requests", "--sample"):
        with pytest.raises(SystemExit) as exit_:
            main(["traces", "convert", str(long_trace), flag, "0", "--out", str(out)])
        assert exit_.value.code == 2 and f"{flag}: must be >= 1" in capsys.readouterr().err
    assert not out.exists()


def test_load_workload_refuses_an_empty_trace():
    import traces
    from cli import load_workload
    empty = pd.DataFrame({c: pd.Series(dtype="float64") for c in ("arrival_s", "prompt_tokens", "output_tokens")})
    args = argparse.Namespace(trace="x.csv", trace_format=None, arrival=None, num_requests=None, rate_scale=1.0,
                              skip_requests=0)
    import unittest.mock
    with unittest.mock.patch.object(traces, "resolve_trace", lambda t: t), \
            unittest.mock.patch.object(traces, "load_trace", lambda *a, **k: empty):
        with pytest.raises(traces.TraceError, match="no requests left"):
            load_workload(args, 0, 8192)


# ---- policy specs ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, keys", [("vattention:mapping=async,sync", ("'mapping'", "'sync'")),
                                        ("vattention:sync,mapping=async", ("'sync'", "'mapping'")),
                                        ("vattention:page=2MiB,page=4MiB", ("'page'", "twice")),
                                        ("paged:block=16, block=32", ("'block'", "twice"))])
@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_a_policy_key_set_twice_is_refused_naming_it(tmp_path, spec, keys, command, capsys):
    assert main([command, "--policy", spec, "--num-requests", "5", "--out", str(tmp_path / "o")]) == 2
    one_error_line(capsys, spec, *keys)
    assert not (tmp_path / "o").exists()


# ---- one name per concept ----------------------------------------------------------------------------------------
def test_traces_take_rate_scale_and_num_requests_and_the_old_spellings_warn(tmp_path, long_trace, capsys):
    new, old = tmp_path / "new.parquet", tmp_path / "old.parquet"
    assert main(["traces", "convert", str(long_trace), "--rate-scale", "2", "--num-requests", "1",
                 "--out", str(new)]) == 0
    assert "deprecated" not in capsys.readouterr().err
    assert main(["traces", "convert", str(long_trace), "--scale-rate", "2", "--first", "1", "--out", str(old)]) == 0
    err = capsys.readouterr().err
    assert "kvsim: warning: --scale-rate is deprecated; use --rate-scale" in err
    assert "kvsim: warning: --first is deprecated; use --num-requests" in err
    pd.testing.assert_frame_equal(pd.read_parquet(new), pd.read_parquet(old))
    help_text = _help("traces", "convert")
    assert "--rate-scale" in help_text and "--num-requests" in help_text
    assert "--scale-rate" not in help_text and "--first" not in help_text


def test_capacity_routing_without_check_replicas_is_refused(capsys, no_work):
    assert main(["capacity", "--slo", "ttft_p99=2s", "--routing", "least-outstanding"]) == 2
    one_error_line(capsys, "--routing", "--check-replicas")
    assert "without --check-replicas it is refused" in " ".join(_help("capacity").split())


# ---- --help --------------------------------------------------------------------------------------------------------
def _subparser(*names: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in names:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def _help(*names: str) -> str:
    return _subparser(*names).format_help()


@pytest.mark.parametrize("names", [("simulate",), ("compare",), ("capacity",), ("sweep",), ("report",),
                                   ("traces", "stats"), ("traces", "convert")])
def test_help_shows_every_default(names):
    parser = _subparser(*names)
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or action.required \
                or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        text = formatter._expand_help(action) if action.help else ""
        assert "(default: " in text, f"kvsim {' '.join(names)} {action.option_strings[0]}: {text!r}"
    assert "(default: 2048)" in _help("simulate") or names != ("simulate",)


def test_compare_help_lists_every_policy_key_from_the_parser_table():
    from sim.frontend.policy_spec import POLICY_KEYS
    text = _help("compare")
    for name, table in POLICY_KEYS.items():
        assert f"{name} keys:" in text
        for key in table:
            assert f"  {key}=" in text, key
    for expected in ("page=SIZE", "mapping=sync|async", "zero=off|on-reuse|on-free", "max_len=TOKENS",
                     "bt_per_block_us=US", "preempt=recompute|swap", "prefix=on|off"):
        assert expected in text


def test_traces_fetch_help_names_the_data_directory_variable():
    assert "KVSIM_DATA" in _help("traces", "fetch")


# ---- the core names fields, the command lines name flags (issue 29 item 4) -----------------------------------------
@pytest.mark.parametrize("argv, fields, field_text, flag_text", [
    (["--page-size", "100KiB"], dict(page_size_bytes=102400), "page_size_bytes=102400 B: must be a power of two",
     "--page-size 102400 B: must be a power of two >= 64KiB (page_size_bytes)"),
    (["--tp", "3"], dict(tp=3), "tp=3 does not divide llama-3-8b's 8 KV heads", "--tp 3 does not divide"),
    (["--pp", "40"], dict(pp=40), "pp=40: llama-3-8b has 32 layers", "--pp 40: llama-3-8b has 32 layers"),
    (["--memory-util", "0.05"], dict(memory_util_frac=0.05), "memory_util_frac=0.05: llama-3-8b's weights at tp=1",
     "--memory-util 0.05: llama-3-8b's weights at --tp 1"),
    (["--max-context", "9000"], dict(max_context_tokens=9000),
     "max_context_tokens=9000: beyond llama-3-8b's native context of 8,192 tokens; set allow_long_context",
     "--max-context 9000: beyond llama-3-8b's native context of 8,192 tokens; set --allow-long-context to "
     "simulate it anyway (max_context_tokens)"),
])
def test_simconfig_names_the_field_and_the_command_lines_the_flag(argv, fields, field_text, flag_text, capsys,
                                                                   tmp_path):
    """A Python caller of SimConfig reads the field and its value (and no flag); ``kvsim simulate`` and the
    hardware replay CLI (refused before any device is touched) read the flag the user typed."""
    import pickle

    from hwbackend.replay.cli import main as replay_main
    from sim.setup.config import ConfigError, SimConfig
    from sim.setup.specs import FieldError
    with pytest.raises(FieldError) as refused:
        SimConfig(**fields)
    assert field_text in str(refused.value) and "--" not in str(refused.value)
    assert refused.value.fields[0] == next(iter(fields))
    again = pickle.loads(pickle.dumps(refused.value))       # a sweep or replica worker's error keeps its fields
    assert (str(again), again.fields, type(again)) == (str(refused.value), refused.value.fields, type(refused.value))
    assert isinstance(refused.value, (ConfigError, FieldError))
    assert main(["simulate", "--num-requests", "5", "--out", str(tmp_path / "run"), *argv]) == 2
    assert flag_text in one_error_line(capsys)
    assert replay_main([*argv, "--device", "cpu", "--out", str(tmp_path / "replay")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("replay: error: ") and flag_text in err and len(err.splitlines()) == 1


def test_a_role_flag_and_the_disaggregation_fields_are_named_by_their_flags(capsys):
    """``--prefill-tp 3`` is named as typed (not the shared ``--tp``); ``pd``, ``kv_link`` and ``kv_stream``
    values refused by the core's parsers are named by their flags on the command line, by their fields in
    Python."""
    from sim.cluster.disagg import parse_kv_stream, parse_pd
    from sim.timing.kvlink import parse_kv_link
    for parse, text, field in ((parse_pd, "0:1", "pd"), (parse_kv_link, "fast", "kv_link"),
                               (parse_kv_stream, "chunked", "kv_stream")):
        with pytest.raises(ValueError) as refused:
            parse(text)
        assert str(refused.value).startswith(f"{field}={text!r}: ") and refused.value.fields == (field,)
    for argv, told in ((["--pd", "1:1", "--prefill-tp", "3"], "--prefill-tp 3 does not divide llama-3-8b's"),
                       (["--pd", "0:1"], "--pd '0:1': expected P:D"),
                       (["--pd", "1:1", "--kv-link", "fast"], "--kv-link 'fast': not a bandwidth"),
                       (["--pd", "1:1", "--kv-stream", "chunked"], "--kv-stream 'chunked': choose one of off, layerwise")):
        assert main(["simulate", "--num-requests", "5", *argv]) == 2
        assert told in one_error_line(capsys)


def test_a_spec_key_and_a_flag_in_one_message_are_each_named_as_written(capsys):
    """A page size from ``--page-size`` refused beside a ``--policy`` spec names the flag; one the spec set names
    the spec's key (``page=``), never the field or the flag the user did not pass."""
    assert main(["simulate", "--num-requests", "5", "--page-size", "3MiB", "--policy", "vattention:sync"]) == 2
    assert ("policy 'vattention:sync': --page-size 3145728 B: must be a power of two >= 64KiB (page_size_bytes)"
            in one_error_line(capsys))
    assert main(["simulate", "--num-requests", "5", "--policy", "vattention:page=3MiB"]) == 2
    line = one_error_line(capsys, "policy 'vattention:page=3MiB': page=3145728 B: must be a power of two")
    assert "--page-size" not in line and "page_size_bytes" not in line


def test_flag_message_rewrites_only_the_fields_the_error_names():
    """:func:`sim.frontend.flags.flag_message` on hand-made errors: ``field=value`` -> ``--flag value``, a bare
    field -> its flag, the renamed fields whose name differs from their flag's in parentheses; a field the
    error does not list, or that no option sets, keeps its name; a plain ValueError is left as it is."""
    from sim.frontend.flags import flag_message, parser_flags
    from sim.setup.specs import FieldError
    flags = parser_flags(build_parser())
    assert flags["max_batch"] == "--max-batch" and flags["num_requests"] == "--num-requests"   # not --first
    error = FieldError("token_budget=0: must be >= 1; raise max_batch_slots or tp (tp=2), not block_size_tokens",
                       "token_budget", "max_batch_slots", "block_size_tokens")
    assert flag_message(error, flags) == ("--token-budget 0: must be >= 1; raise --max-batch or tp (tp=2), not "
                                          "block_size_tokens (max_batch_slots)")
    assert flag_message(ValueError("tp=2: no"), flags) == "tp=2: no"
    assert flag_message(FieldError("tp=2: no", "tp"), {}, renames={"tp": "--decode-tp"}) == "--decode-tp 2: no (tp)"


def test_the_preemption_policy_key_is_named_as_its_flag():
    """One name per concept (issue 36 item 13): ``preemption=`` as ``--preemption`` and the field; the old
    ``preempt=`` still parses to the same setting, and giving both is refused naming both keys."""
    from sim.frontend.policy_spec import parse_policy
    from sim.setup.config import ConfigError
    assert parse_policy("paged:preemption=swap") == parse_policy("paged:preempt=swap") == \
        {"policy": "paged", "preemption": "swap", "explicit_fields": ("preemption",)}
    with pytest.raises(ConfigError, match="'preempt' and 'preemption' both set preemption"):
        parse_policy("paged:preempt=swap,preemption=recompute")


def test_a_policy_key_never_silently_overrides_a_flag_in_compare_or_sweep(tmp_path, capsys):
    """Helper-48: compare ran ``vattention:deferred=on`` beside ``--no-deferred-reclaim`` with reclamation on, and a
    sweep's axis or policy value replaced a flag written at its default (``--page-size 2MiB``). simulate refuses the
    same spec with one line naming both; so now do compare and sweep, and compare refuses two spellings of one
    configuration."""
    from cli import main
    trace = str(Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_llm_2023"
                / "AzureLLMInferenceTrace_conv.csv")
    common = ["--trace", trace, "--num-requests", "10", "--quiet"]
    cases = [
        (["compare", "--policy", "vattention", "--policy", "vattention:deferred=on", "--no-deferred-reclaim"],
         "policy 'vattention:deferred=on' contradicts --no-deferred-reclaim"),
        (["compare", "--policy", "vattention", "--policy", "vattention:mapping=async", "--sync-mapping"],
         "policy 'vattention:mapping=async' contradicts --sync-mapping"),
        (["compare", "--policy", "vattention", "--policy", "vattention:page=4MiB", "--page-size", "2MiB"],
         "policy 'vattention:page=4MiB' contradicts --page-size"),
        (["compare", "--policy", "paged", "--policy", "paged:block=16"],
         "--policy 'paged' and --policy 'paged:block=16' are the same configuration"),
        (["simulate", "--policy", "vattention:page=4MiB", "--page-size", "2MiB"],
         "policy 'vattention:page=4MiB' contradicts --page-size"),
        (["sweep", "--grid", "page_size=2MiB,4MiB", "--page-size", "2MiB"],
         "--grid page_size sets what --page-size also sets on the command line"),
        (["sweep", "--grid", "policy=vattention:page=4MiB,paged", "--page-size", "2MiB"],
         "--grid policy=vattention:page=4MiB: policy 'vattention:page=4MiB' contradicts --page-size"),
    ]
    for number, (command, message) in enumerate(cases):
        out = tmp_path / f"out{number}"
        assert main([*command, *common, "--out", str(out)]) == 2, command
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (command, err)
        assert not out.exists()
    # the same spec and flag agreeing, or the flag at its default not written, still run
    assert main(["compare", "--policy", "vattention", "--policy", "vattention:page=64KiB", *common,
                 "--out", str(tmp_path / "ok")]) == 0
    assert main(["simulate", "--policy", "vattention:page=2MiB", "--page-size", "2MiB", *common,
                 "--out", str(tmp_path / "ok2")]) == 0


def test_capacity_takes_one_result_file(tmp_path, capsys):
    """``--out A --json B`` (``--json`` is the deprecated name of ``--out``) is refused before any work: one file
    would be written, and not necessarily the one the user reads (helper-48)."""
    import pytest

    from cli import main
    for flags in (["--out", str(tmp_path / "a.json"), "--json", str(tmp_path / "b.json")],
                  ["--json", str(tmp_path / "b.json"), "--out", str(tmp_path / "a.json")]):
        with pytest.raises(SystemExit) as exited:
            main(["capacity", "--slo", "ttft_p99=2s", *flags])
        assert exited.value.code == 2
        assert "the result file was already given" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
