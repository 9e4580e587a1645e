"""CPU tests of the calibration code: the measurement routines run against the emulated driver, the
profile summaries have the documented keys, and the command's exit codes (no GPU needed)."""
from __future__ import annotations

import argparse
import json

import pytest

from hwbackend.calibration import vmm as calibrate
from hwbackend.cli import register
from hwbackend.vmm.driver import GpuUnavailableError
from hwbackend.vmm.emulated import EmulatedVmmDriver

MIB = 1 << 20


def test_summary_has_the_keys_the_simulator_reads():
    summary = calibrate.summarize_us([float(v) for v in range(1, 2001)])
    assert summary["n"] == 2000
    assert set(summary["quantiles_us"]) == {"p50", "p90", "p99", "mean", "min", "max"}
    assert summary["quantiles_us"]["p50"] == pytest.approx(1000.5)
    assert len(summary["samples_us"]) == 1000


def test_measure_calls_times_every_call_once_per_sample_and_leaks_nothing():
    driver = EmulatedVmmDriver(capacity_bytes=1 << 34)
    latencies = calibrate.measure_calls(driver, 4 * MIB, samples=30)
    assert {call: len(v) for call, v in latencies.items()} == {call: 30 for call in calibrate.MEASURED_CALLS}
    assert driver.live_objects() == {"reservations": 0, "handles": 0, "mappings": 0}


def test_page_group_growth_maps_64_sub_tensors_per_growth():
    driver = EmulatedVmmDriver(capacity_bytes=1 << 36)
    result = calibrate.measure_page_group_growth(driver, "llama-3-8b", 2 * MIB, repetitions=3)
    assert result["num_sub_tensors"] == 64 and result["sync_us"]["n"] == 3
    assert driver.stats.count("cuMemMap") == 2 * 3 * 64  # sync growth + batched growth
    assert driver.stats.count("cuMemSetAccess") == 3 * 64 + 3  # batched: one set-access per growth
    assert driver.live_objects() == {"reservations": 0, "handles": 0, "mappings": 0}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvsim")
    register(parser.add_subparsers())
    return parser.parse_args(["calibrate", *argv])


def test_calibrate_without_gpu_says_so_and_exits_2(tmp_path, monkeypatch, capsys):
    def no_gpu(*_args, **_kwargs):
        raise GpuUnavailableError("no NVIDIA driver found")

    monkeypatch.setattr(calibrate, "CudaVmmDriver", no_gpu)
    args = parse(["--out", str(tmp_path / "p.json")])
    assert args.func(args) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


def test_calibrate_refuses_to_overwrite_without_force(tmp_path, capsys):
    """A refusal exits 2 with one line, as every kvsim refusal (it exited 1: docs/cli.md, "Errors")."""
    out = tmp_path / "p.json"
    out.write_text(json.dumps({"keep": True}))
    args = parse(["--out", str(out)])
    assert args.func(args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("kvsim: error: --out ") and "pass --force" in line
    assert json.loads(out.read_text()) == {"keep": True}


def test_bad_page_size_is_a_clear_error(tmp_path, capsys):
    args = parse(["--out", str(tmp_path / "p.json"), "--page-sizes", "2MiB,lots"])
    assert args.func(args) == 2
    assert "lots" in capsys.readouterr().err
