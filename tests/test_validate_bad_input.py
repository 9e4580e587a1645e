"""``kvsim validate --hw-run`` on malformed input: one ``kvsim: error: ...`` line naming the file, the field /
column / row and the value, exit status 2, nothing simulated (every check runs before the simulation, so these
tests take milliseconds each). The runs are tmp_path copies of a committed hardware run, corrupted one way each."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("simpy")

from cli import main  # noqa: E402
from hwbackend.calibration.run_files import RunInputError, config_from_run  # noqa: E402
from hwbackend.calibration.validate import error_table  # noqa: E402

RUN = Path(__file__).resolve().parent.parent / "docs" / "validation" / "same-start" / "test-sync-x1"
RUN_FILES = ("config.json", "summary.json", "requests.parquet", "iterations.parquet", "shapes.parquet")


@pytest.fixture
def run(tmp_path) -> Path:
    """A copy of the committed run (its five files validation reads)."""
    if not (RUN / "shapes.parquet").is_file():
        pytest.skip(f"{RUN} is not present")
    copy = tmp_path / "run"
    copy.mkdir()
    for name in RUN_FILES:
        shutil.copy(RUN / name, copy / name)
    return copy


def edit_config(run: Path, change) -> None:
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps(change(config)))


def edit_table(run: Path, name: str, change) -> None:
    change(pd.read_parquet(run / name)).to_parquet(run / name, index=False)


def refused(capsys, *argv: str) -> str:
    """The one error line of ``kvsim validate ARGV`` (exit 2, nothing on stdout: nothing was simulated)."""
    assert main(["validate", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsim: error: "), captured.err
    assert "Traceback" not in captured.err
    return lines[0]


def _set(key, value):
    def change(config):
        config[key] = value
        return config
    return change


def _drop(key):
    def change(config):
        del config[key]
        return config
    return change


@pytest.mark.parametrize("change, needles, absent", [
    (_set("max_batch_slots", "lots"), ["'max_batch_slots'", '"lots"', "whole number"], []),
    (_set("page_size_bytes", [1, 2]), ["'page_size_bytes'", "[1, 2]"], []),
    (_set("model", None), ["'model'", "null"], []),
    (lambda config: [1, 2], ["JSON object", "list"], []),
    # a value the simulator's own check refuses: named by its config.json field, not by a CLI flag
    (_set("page_size_bytes", -5), ["page_size_bytes", "-5", "power of two"], ["--page-size"]),
    (_set("max_batch_slots", 0), ["max_batch_slots", "0"], ["--max-batch"]),
    (_set("tp", 3), ["tp=3", "does not divide"], ["--tp"]),
    (_set("memory_util_frac", 1.5), ["memory_util_frac", "1.5"], ["--memory-util"]),
    (_set("model", "gpt-9"), ["'model'", "unknown model 'gpt-9'"], []),
    (_set("gpu", "tpu"), ["'gpu'", "'tpu'"], []),
    (_set("scheduler", "fifo"), ["'scheduler'", '"fifo"', "sarathi"], []),
    (_set("sync_mapping", "yes"), ["'sync_mapping'", '"yes"', "boolean"], []),
    (_set("sync_mapping", 1), ["'sync_mapping'", "1", "boolean"], []),
    (_set("cuda_graphs", "yes"), ["'cuda_graphs'", '"yes"'], []),
    (_set("memory_util_frac", float("nan")), ["'memory_util_frac'", "NaN"], []),
    # settings that disagree with the label / sizes the run recorded: the file was edited
    (_set("sync_mapping", False), ["'label'", "vattention 2 MiB sync", "vattention 2 MiB async"], []),
    (_set("pool_page_groups", 5), ["'pool_page_groups'", "5", "891"], []),
    (_drop("model"), ["missing field(s) model"], []),
    (_drop("memory_util_frac"), ["missing field(s) memory_util_frac"], []),
    (_set("backend", "simulator"), ["'backend'", '"simulator"', "not a hardware run"], []),
])
def test_bad_config_names_the_file_and_field(run, capsys, change, needles, absent):
    edit_config(run, change)
    line = refused(capsys, "--hw-run", str(run))
    assert f"{run / 'config.json'}: " in line
    for needle in needles:
        assert needle in line, line
    for flag in absent:
        assert flag not in line, line


def test_config_from_run_without_a_source_leaves_the_prefix_to_the_caller():
    config = json.loads((RUN / "config.json").read_text()) if (RUN / "config.json").is_file() else pytest.skip()
    assert config_from_run(config).label == config["label"]
    with pytest.raises(RunInputError, match=r"^field 'tp': expected a whole number, got 2.0$"):
        config_from_run({**config, "tp": 2.0})
    with pytest.raises(RunInputError, match=r"^x/config.json: missing field\(s\) gpu "):
        config_from_run({k: v for k, v in config.items() if k != "gpu"}, "x/config.json")
    # fields added after the first hardware runs may be absent (their default is what those runs ran with)
    assert config_from_run({k: v for k, v in config.items() if k != "copy_bytes_per_s"}).copy_bytes_per_s is None


def _nan_prompt(frame):
    frame["prompt_tokens"] = frame["prompt_tokens"].astype(float)
    frame.loc[5, "prompt_tokens"] = np.nan
    return frame


def _at(column, row, value):
    def change(frame):
        frame[column] = frame[column].astype(type(value)) if isinstance(value, float) else frame[column]
        frame.loc[row, column] = value
        return frame
    return change


@pytest.mark.parametrize("name, change, needles", [
    ("requests.parquet", lambda f: f.drop(columns="arrival_at_us"), ["missing column(s) arrival_at_us"]),
    ("requests.parquet", lambda f: f.drop(columns=["status", "ttft_us"]), ["missing column(s) status, ttft_us"]),
    ("iterations.parquet", lambda f: f.drop(columns="duration_us"), ["missing column(s) duration_us"]),
    ("requests.parquet", _nan_prompt, ["row 6 (request_id 5)", "'prompt_tokens'", "not a whole number", "nan"]),
    ("requests.parquet", _at("prompt_tokens", 3, 2.5), ["row 4", "'prompt_tokens'", "not a whole number", "2.5"]),
    ("requests.parquet", _at("output_tokens", 7, -4), ["row 8 (request_id 7)", "'output_tokens'", ">= 1", "-4"]),
    ("requests.parquet", _at("output_tokens", 2, 0), ["row 3", "'output_tokens'", ">= 1", "(got 0)"]),
    ("requests.parquet", _at("prompt_tokens", 9, 10**6), ["row 10 (request_id 9)", "prompt_tokens 1000000", "8192"]),
    ("requests.parquet", _at("prompt_tokens", 9, 10**9), ["row 10", "'prompt_tokens'", "above 100,000,000", "1000000000"]),
    ("requests.parquet", _at("arrival_at_us", 1, float("inf")), ["row 2", "'arrival_at_us'", "finite", "inf"]),
    ("requests.parquet", lambda f: f.assign(status="rejected"), ["no request with status 'finished'"]),
    ("iterations.parquet", _at("duration_us", 4, -1.0), ["row 5", "'duration_us'", ">= 0", "-1.0"]),
    ("iterations.parquet", lambda f: f.assign(duration_us=f["duration_us"].astype(str)),
     ["'duration_us'", "expected numbers"]),
    ("iterations.parquet", lambda f: f.iloc[:0], ["no iteration recorded"]),
    ("requests.parquet", lambda f: f.assign(ttft_us=-f["ttft_us"]), ["row 1", "column ttft_us of a finished request",
                                                                    ">= 0", "-"]),
    ("requests.parquet", _at("e2e_us", 5, float("nan")), ["row 6 (request_id 5)", "column e2e_us", "nan"]),
    ("shapes.parquet", lambda f: f.drop(columns="new_tokens"), ["missing column(s) new_tokens"]),
])
def test_bad_table_names_the_file_column_and_row(run, capsys, name, change, needles):
    edit_table(run, name, change)
    line = refused(capsys, "--hw-run", str(run))
    assert f"{run / name}: " in line
    for needle in needles:
        assert needle in line, line


def test_truncated_parquet_is_named_as_corrupt(run, capsys):
    for name in ("shapes.parquet", "requests.parquet"):
        data = (run / name).read_bytes()
        (run / name).write_bytes(data[: len(data) // 2])
        line = refused(capsys, "--hw-run", str(run))
        assert f"{run / name}: unreadable or corrupt" in line, line
        shutil.copy(RUN / name, run / name)


def test_bad_json_files_are_named(run, capsys):
    (run / "summary.json").write_text(json.dumps({"requests": 1000}))
    assert "summary.json: missing field 'map_page_groups'" in refused(capsys, "--hw-run", str(run))
    (run / "summary.json").write_text("[1, 2]")
    assert f"{run / 'summary.json'}: expected a JSON object, got a JSON list" in refused(capsys, "--hw-run", str(run))
    shutil.copy(RUN / "summary.json", run / "summary.json")
    (run / "config.json").write_text("{not json")
    assert f"{run / 'config.json'}: unreadable or corrupt" in refused(capsys, "--hw-run", str(run))
    (run / "config.json").unlink()
    assert "config.json is missing" in refused(capsys, "--hw-run", str(run))


def test_out_and_profile_are_checked_before_simulating(run, tmp_path, capsys):
    user_file = tmp_path / "passwd"
    user_file.write_text("keep me\n")
    assert refused(capsys, "--hw-run", str(run), "--out", str(user_file)) == \
        f"kvsim: error: --out {user_file} is a file, not a directory"
    assert f"{user_file} is not a directory" in refused(capsys, "--hw-run", str(run), "--out", str(user_file / "sub"))
    assert user_file.read_text() == "keep me\n"
    done = tmp_path / "done"
    done.mkdir()
    (done / "validation.md").write_text("an earlier validation\n")
    line = refused(capsys, "--hw-run", str(run), "--out", str(done))
    assert f"--out {done} holds files named like a kvsim result (validation.md)" in line and "--force" in line
    assert (done / "validation.md").read_text() == "an earlier validation\n"
    line = refused(capsys, "--hw-run", str(run), "--profile", str(tmp_path))
    assert line == (f"kvsim: error: --profile {tmp_path} is a directory, not a profile JSON file (kvsim calibrate "
                    "writes one, e.g. profiles/h200.json)")
    assert f"{tmp_path / 'none.json'}" in refused(capsys, "--hw-run", str(run), "--profile", str(tmp_path / "none.json"))
    # the run itself is checked before the simulation too, whatever --out says
    edit_config(run, _set("model", "gpt-9"))
    assert "gpt-9" in refused(capsys, "--hw-run", str(run), "--out", str(tmp_path / "new"))
    assert not (tmp_path / "new").exists()


def test_missing_run_directory_is_named(tmp_path, capsys):
    assert f"{tmp_path / 'nope'}: does not exist" in refused(capsys, "--hw-run", str(tmp_path / "nope"))


def test_a_simulation_that_finishes_nothing_gives_nan_not_a_numpy_error():
    class Run:
        def __init__(self, status: str):
            self.iterations = pd.DataFrame({"duration_us": [1000.0], "sync_stall_us": [0.0], "sync_map_page_groups": [0]})
            self.requests = pd.DataFrame({"status": [status], "ttft_us": [1e3], "tpot_us": [1e3], "e2e_us": [1e6]})
            self.summary = {"map_page_groups": 0, "peak_mapped_bytes": 0}

    table = error_table(Run("finished"), Run("rejected"))
    ttft = table[(table["metric"] == "TTFT") & (table["stat"] == "p50")].iloc[0]
    assert ttft["hw"] == 1.0 and np.isnan(ttft["sim"]) and np.isnan(ttft["error"])


@pytest.mark.parametrize("edit, needle", [
    (lambda s: s.pop("tbt_p90_ms"), "missing field 'tbt_p90_ms' (the run records tbt_p50_ms, tbt_p99_ms"),
    (lambda s: s.__setitem__("tbt_p99_ms", -50), "field 'tbt_p99_ms': must be >= 0, got -50"),
    (lambda s: s.__setitem__("tbt_p99_ms", "abc"), "field 'tbt_p99_ms': expected a finite number"),
    (lambda s: s.__setitem__("tbt_p99_ms", None), "field 'tbt_p99_ms': expected a finite number"),
    (lambda s: s.__setitem__("map_page_groups", -5), "field 'map_page_groups': must be >= 0, got -5"),
])
def test_the_hardware_summary_figures_compared_are_checked(run, capsys, edit, needle):
    """The hardware run's TBT percentiles (all three when any) and memory figures are finite numbers >= 0: a
    missing p90 was a KeyError traceback, a negative one was compared (error -249%), a null one dropped silently."""
    summary = json.loads((run / "summary.json").read_text())
    summary.setdefault("tbt_p50_ms", 5.0), summary.setdefault("tbt_p90_ms", 6.0), summary.setdefault("tbt_p99_ms", 9.0)
    edit(summary)
    (run / "summary.json").write_text(json.dumps(summary))
    line = refused(capsys, "--hw-run", str(run))
    assert line.startswith(f"kvsim: error: {run / 'summary.json'}: ") and needle in line, line
