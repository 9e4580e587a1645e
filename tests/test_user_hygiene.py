"""What a new user meets (issue 36, items 1-8): files a user owns are never lost, no silently wrong or incomplete
output, GPU helper scripts without a GPU. One test per item; each refusal is checked to come before any work
(milliseconds), and the runs are of a few requests."""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("simpy")

from cli import main  # noqa: E402
from traces import TraceError, load_trace, scale_rate  # noqa: E402
from traces.canonical import MAX_ARRIVAL_S  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HW_RUN = ROOT / "docs" / "validation" / "same-start" / "test-sync-x1"


def one_error(capsys) -> str:
    """The one line on stderr (no traceback)."""
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def lengths_csv(tmp_path: Path, rows: int = 3) -> Path:
    path = tmp_path / "lengths.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n" + "".join(f"{100 + i},{5 + i}\n" for i in range(rows)))
    return path


# 1 ------------------------------------------------------------------------------------------------------------
def test_validate_out_follows_the_result_directory_rule(tmp_path, capsys):
    """validate --out: a directory kvsim did not mark as its result is never written, even with --force (as
    simulate / compare / sweep); a marked one needs --force."""
    if not (HW_RUN / "shapes.parquet").is_file():
        pytest.skip(f"{HW_RUN} is not present")
    user = tmp_path / "mine"
    user.mkdir()
    (user / "validation.md").write_text("my notes\n")
    (user / "errors.csv").write_text("my,table\n")
    assert main(["validate", "--hw-run", str(HW_RUN), "--out", str(user), "--force"]) == 2
    line = one_error(capsys)
    assert f"--out {user} holds files named like a kvsim result" in line and ".kvsim-result" in line
    assert (user / "validation.md").read_text() == "my notes\n" and (user / "errors.csv").read_text() == "my,table\n"
    marked = tmp_path / "earlier"
    marked.mkdir()
    for name in ("validation.md", "errors.csv", ".kvsim-result"):
        (marked / name).write_text("x\n")
    assert main(["validate", "--hw-run", str(HW_RUN), "--out", str(marked)]) == 2
    assert "already holds a kvsim result" in one_error(capsys) and (marked / "validation.md").read_text() == "x\n"
    # the run itself as --out: one of the command's inputs
    copy = tmp_path / "run"
    shutil.copytree(HW_RUN, copy)
    assert main(["validate", "--hw-run", str(copy), "--out", str(copy), "--force"]) == 2
    assert "is one of the command's inputs" in one_error(capsys)


# 2 ------------------------------------------------------------------------------------------------------------
def test_no_output_is_one_of_the_inputs(tmp_path, capsys):
    run = tmp_path / "R"
    run.mkdir()
    for name in ("requests.parquet", "iterations.parquet", "summary.json", "config.json"):
        (run / name).write_text("{}")
    (tmp_path / "link").symlink_to(run)
    for out in (run / "summary.json", tmp_path / "link" / "config.json", tmp_path / "R" / ".." / "R" / "config.json"):
        assert main(["report", str(run), "--out", str(out), "--force"]) == 2
        assert f"--out {out} is one of the command's inputs" in one_error(capsys)
    assert (run / "summary.json").read_text() == "{}"
    trace = lengths_csv(tmp_path)
    before = trace.read_text()
    assert main(["traces", "convert", str(trace), "--out", str(trace), "--force"]) == 2
    assert "one of the command's inputs" in one_error(capsys) and trace.read_text() == before
    # a result directory holding the trace read
    assert main(["simulate", "--trace", str(trace), "--arrival", "poisson:1", "--out", str(tmp_path), "--force"]) == 2
    assert f"--out {tmp_path} holds one of the command's inputs ({trace})" in one_error(capsys)


# 3 ------------------------------------------------------------------------------------------------------------
def test_every_way_of_making_arrivals_keeps_the_clock_exact(tmp_path, capsys):
    """The 30 synthetic requests span ~5 s; x1e-12 stretches them to ~5e12 s, beyond MAX_ARRIVAL_S (2**53 ticks
    of 100 ns, ~9.007e8 s), where latencies come out quantised."""
    assert main(["simulate", "--num-requests", "30", "--rate-scale", "1e-12", "--out", str(tmp_path / "a")]) == 2
    line = one_error(capsys)
    assert "--rate-scale 1e-12 stretches the arrivals beyond" in line and "900,719,925 s" in line
    assert main(["simulate", "--num-requests", "30", "--rate-scale", "inf", "--out", str(tmp_path / "a")]) == 2
    assert "--rate-scale: must be a finite number > 0 (got inf)" in one_error(capsys)
    assert not (tmp_path / "a").exists()
    trace = load_trace(lengths_csv(tmp_path), arrival="poisson:1")
    with pytest.raises(TraceError, match="rate scale 1e-12 stretches"):
        scale_rate(trace, 1e-12)
    assert scale_rate(trace, 2.0)["arrival_s"].iloc[-1] == trace["arrival_s"].iloc[-1] / 2   # within range: kept
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_text("".join(json.dumps({"timestamp": 0, "input_length": 10, "output_length": 5}) + "\n"
                                for _ in range(3)))
    with pytest.raises(TraceError, match=r"--arrival poisson:1e-12: request 2 of 3 would arrive"):
        load_trace(mooncake, arrival="poisson:1e-12")     # fresh times on a JSONL trace are checked too
    assert MAX_ARRIVAL_S == 2**53 / 1e7


# 4 ------------------------------------------------------------------------------------------------------------
def test_the_arrival_process_is_recorded(tmp_path, capsys):
    path = lengths_csv(tmp_path)
    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(path), "--arrival", "poisson:16", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"trace: {path} | arrivals poisson:16, seed 0" in printed
    assert json.loads((out / "config.json").read_text())["trace_source"].startswith(
        f"{path} | arrivals poisson:16, seed 0")
    assert load_trace(path, arrival="gamma:5,2", seed=3).attrs["source"] == f"{path} | arrivals gamma:5,2, seed 3"
    assert load_trace(path, arrival="offline").attrs["source"] == f"{path} | arrivals offline"


# 5 ------------------------------------------------------------------------------------------------------------
def test_replicas_with_one_or_no_request_merge(tmp_path, capsys):
    """3 requests on 4 replicas (round robin: 1, 1, 1, 0). Replica 0's one request is scheduled at the clock's
    integer start, so its first_scheduled_at_us column was int64 where the others' are double."""
    out = tmp_path / "run"
    assert main(["simulate", "--num-requests", "3", "--replicas", "4", "--workers", "1", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "requests per replica 1, 1, 1, 0" in captured.out
    assert "4 replicas for 3 requests: at least 1 replicas receive none" in captured.err
    requests = pd.read_parquet(out / "requests.parquet")
    assert requests["request_id"].tolist() == [0, 1, 2] and requests["replica"].tolist() == [0, 1, 2]
    assert requests["first_scheduled_at_us"].dtype == np.float64 and requests["first_scheduled_at_us"].iloc[0] == 0
    from sim.cluster.replica_merge import _common_schema
    schemas = [pa.schema([("a", pa.int64()), ("b", pa.null())]), pa.schema([("a", pa.float64()), ("b", pa.string())])]
    assert _common_schema(schemas) == pa.schema([("a", pa.float64()), ("b", pa.string())])


# 6 ------------------------------------------------------------------------------------------------------------
def test_inputs_accepted_silently_before(tmp_path, capsys):
    dup = tmp_path / "dup.csv"
    dup.write_text("num_prefill_tokens,num_decode_tokens,num_decode_tokens\n10,2,3\n")
    with pytest.raises(TraceError, match=r"column 'num_decode_tokens' appears twice in the header \(fields 2 and 3\)"):
        load_trace(dup, arrival="poisson:1")
    from traces.workload import instances_note, prefix_note
    plain = load_trace(lengths_csv(tmp_path), arrival="poisson:1")
    assert "no request can hit the cache" in prefix_note(plain, ["paged:prefix=on"])
    assert prefix_note(plain, []) is None
    with_ids = plain.assign(hash_ids=[[1], [2], [3]])
    assert prefix_note(with_ids, ["paged:prefix=on"]) is None
    assert "1,000 prefill instances and 1,000 decode instances for 30 requests" in instances_note(1000, 1000, 30)
    assert instances_note(2, 30, 30) is None
    # llama-3-8b on h200: 1 GiB of virtual addresses per vAttention slot (64 tensors x 8 pages x 2 MiB), 64 TiB
    # reservable -> 65,536 slots; paged: 57,038 blocks of 16 tokens in the pool
    assert main(["simulate", "--max-batch", "100000000", "--out", str(tmp_path / "x")]) == 2
    line = one_error(capsys)
    assert "--max-batch 100,000,000" in line and "1 GiB of virtual addresses per slot" in line and "65,536 slots" in line
    assert main(["simulate", "--max-batch", "100000000", "--policy", "paged", "--out", str(tmp_path / "x")]) == 2
    assert "choose --max-batch <= 57,038" in one_error(capsys)
    # one slot alone beyond the reservable 64 TiB: the context length is named, not the slot count
    # (1e11 tokens / 1,024 per 2 MiB page = 97,656,250 pages x 64 tensors x 2 MiB = 11,920.93 TiB)
    assert main(["simulate", "--max-context", "100000000000", "--allow-long-context", "--out",
                 str(tmp_path / "x")]) == 2
    line = one_error(capsys)
    assert line.startswith("kvsim: error: --max-context 100,000,000,000: one vAttention slot") and (
        "11920.93 TiB" in line and "lower --max-context" in line and "--max-batch" not in line)


# 7 ------------------------------------------------------------------------------------------------------------
def test_compare_with_kv_tiers_runs_and_names_a_spec_without_a_prefix_cache(tmp_path, capsys):
    """compare --kv-tier never ran (its base configuration, built before the specs, had no prefix cache); now
    the specs with prefix=on run with the tier, and one without it is named."""
    from tests.test_routing import write_mooncake

    trace = str(write_mooncake(f"{tmp_path}/mc.jsonl", 30))
    common = ["compare", "--trace", trace, "--kv-tier", "dram:1GiB", "--quiet"]
    assert main([*common, "--policy", "vattention:prefix=on", "--policy", "paged:prefix=on",
                 "--out", str(tmp_path / "c")]) == 0
    assert "prefix hit ratio" in capsys.readouterr().out
    assert main([*common, "--policy", "vattention", "--policy", "paged:prefix=on", "--out", str(tmp_path / "d")]) == 2
    assert one_error(capsys).startswith("kvsim: error: policy 'vattention': KV tiers (--kv-tier) hold prefix-cache "
                                        "pages: turn the prefix cache on")


def test_a_router_over_one_replica_is_noted(tmp_path, capsys):
    """--routing without --replicas routes every request to the one replica: said (it was silently a plain run)."""
    assert main(["simulate", "--num-requests", "10", "--routing", "least-outstanding", "--quiet",
                 "--out", str(tmp_path / "r")]) == 0
    assert "--routing least-outstanding over one replica sends every request to it" in capsys.readouterr().err


def test_messages_say_what_the_path_is(tmp_path, capsys):
    """A device is not "no such file", /proc is not "missing", a Markdown file given as --gpu is said to have been
    read as JSON (its name does not end in .toml)."""
    assert main(["simulate", "--trace", "/dev/null", "--out", str(tmp_path / "a")]) == 2
    assert one_error(capsys) == ("kvsim: error: /dev/null: is not a regular file (a device, pipe or socket), not a "
                                 "trace file")
    assert main(["simulate", "--num-requests", "5", "--out", "/proc/x"]) == 2
    assert "cannot create a directory in /proc" in one_error(capsys)
    notes = tmp_path / "notes.md"
    notes.write_text("# my GPU\n")
    assert main(["simulate", "--num-requests", "5", "--gpu", str(notes), "--out", str(tmp_path / "b")]) == 2
    assert "notes.md: not valid JSON (read as JSON: a name not ending in .toml;" in one_error(capsys)


def test_messages_name_the_cause_and_the_row(tmp_path, capsys):
    parquet = tmp_path / "t.parquet"
    pq.write_table(pa.table({"request_id": [0, 1, 2], "arrival_s": [0.0, 1.0, 2.0],
                             "prompt_tokens": pa.array([5, None, 7], pa.int64()), "output_tokens": [1, 2, 3]}), parquet)
    with pytest.raises(TraceError, match=r"row 2, column 'prompt_tokens': missing value \(null\)"):
        load_trace(parquet)
    misnamed = tmp_path / "a.csv"
    misnamed.write_text("Arrived_At,num_prefill_tokens,num_decode_tokens\n0.5,10,2\n")
    with pytest.raises(TraceError, match=r"'Arrived_At' \(field 1\) is not a known column, but 'arrived_at' of the "
                                         r"splitwise format is"):
        load_trace(misnamed)
    burst = tmp_path / "b.csv"
    burst.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     "0,ChatGPT,10,0,10,Conversation log\n1,ChatGPT,12,0,12,Conversation log\n")
    with pytest.raises(TraceError, match="all 2 rows are failed requests"):
        load_trace(burst)
    array = tmp_path / "m.json"
    array.write_text(json.dumps([{"timestamp": 0, "input_length": 10, "output_length": 5}]))
    with pytest.raises(TraceError, match="a JSON array, not JSON Lines"):
        load_trace(array)
    for spec, told in (("paged:factor=0.5", "factor=0.5: must lie in [1, 100]"), ("paged:block=16.5", "block=16.5: expected "
                       "a whole number"), ("vattention:layout_factor=-1", "layout_factor=-1: must lie in (0, 100]"),
                       ("paged:block=0", "block=0: must be >= 1 token")):
        assert main(["simulate", "--policy", spec, "--out", str(tmp_path / "x")]) == 2
        line = one_error(capsys)
        assert f"policy '{spec}': {told}" in line, line
        assert "paged_attention_factor" not in line and "layout attention factor" not in line
    empty = tmp_path / "model"
    empty.mkdir()
    assert main(["simulate", "--model", str(empty), "--out", str(tmp_path / "x")]) == 2
    assert f"{empty}: a directory without a config.json in it" in one_error(capsys)
    shutil.copy(ROOT / "models" / "mistral-7b.json", empty / "config.json")
    from sim.setup.catalog import get_model
    assert get_model(str(empty)).num_layers >= 1       # a Hugging Face model directory is read


# 8 ------------------------------------------------------------------------------------------------------------
def test_gpu_scripts_without_torch_say_so_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)       # import torch raises ImportError
    from hwbackend.replay.tp import allreduce
    assert allreduce.main([]) == 2
    assert one_error(capsys).startswith("allreduce: error: needs torch with CUDA")
    spec = importlib.util.spec_from_file_location("_bench_hw", ROOT / "bench" / "bench_hw.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--iterations", "1"]) == 2
    assert one_error(capsys).startswith("bench_hw: error: needs torch with CUDA")
    from hwbackend.beyond import gpu
    with pytest.raises(SystemExit) as exit_:
        gpu.main(["--out", str(tmp_path / "out")])
    assert exit_.value.code == 2 and one_error(capsys).startswith("python -m hwbackend.beyond.gpu: error: needs torch")
    assert not (tmp_path / "out").exists()
