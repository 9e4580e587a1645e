"""``python -m hwbackend.replay.cli`` / ``beyond_replay`` check the machine and ``--out`` before the replay
(minutes of GPU time must not end in a traceback at the write)."""
from __future__ import annotations

import importlib.util

import pytest

from hwbackend.replay.cli import main, preflight

TORCH = importlib.util.find_spec("torch") is not None


def test_negative_warmup_and_unusable_out_are_refused_first(tmp_path):
    assert preflight("cpu", tmp_path / "new", False, -5.0) == "--warmup-s -5.0: must be >= 0 seconds"
    a_file = tmp_path / "file"
    a_file.write_text("mine")
    assert "exists and is not a directory" in preflight("cpu", a_file, False, 0.0)
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    assert "already holds a run (summary.json); pass --force" in preflight("cpu", run, False, 0.0)
    assert a_file.read_text() == "mine"


@pytest.mark.skipif(not TORCH, reason="torch is not installed (the hw extra)")
def test_device_spelling_is_checked(tmp_path):
    assert preflight("gpu0", tmp_path / "new", False, 0.0).startswith("--device 'gpu0': use cuda:N")
    assert preflight("cpu", tmp_path / "new", True, 0.0) is None


def test_cli_exits_2_with_one_line_before_loading_the_trace(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    # the trace does not exist either: --out is reported first, before any work
    assert main(["--trace", str(tmp_path / "missing.csv"), "--out", str(run), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("replay: error: --out") and "Traceback" not in err[0]
