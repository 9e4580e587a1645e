"""Progress of the long-running commands (issue 36, item 12): a rich bar on a terminal, nothing when stderr is
not a terminal or with ``--quiet`` (analysis.flags.Progress); compare reports each finished policy."""
from __future__ import annotations

import sys

import pytest

from analysis.flags import Progress


@pytest.mark.parametrize("tty, quiet, shown", [(True, False, True), (True, True, False), (False, False, False)])
def test_progress_only_on_a_terminal_and_without_quiet(monkeypatch, tty, quiet, shown):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty, raising=False)
    progress = Progress(3, quiet, "steps")
    assert (progress.bar is not None) is shown
    with progress as advance:
        assert (advance is not None) is shown
        if advance:
            advance(2)
            assert progress.bar.tasks[0].completed == 2 and progress.bar.tasks[0].total == 3


def test_short_jobs_get_no_bar(monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert Progress(2000, False, "simulating", min_total=2000).bar is None      # simulate: > 2,000 requests
    assert Progress(None, False, "capacity search").bar is not None            # an unknown number of steps


def test_run_policies_reports_each_finished_run():
    from analysis.comparison import run_policies
    from sim.setup.config import SimConfig
    from traces import synthetic_default
    calls = []
    run_policies(SimConfig(), ["vattention", "paged"], synthetic_default(0, 20), workers=1, keep_tables=False,
                 on_done=lambda done, total: calls.append((done, total)))
    assert calls == [(1, 2), (2, 2)]


@pytest.mark.parametrize("argv", [
    ["compare", "--policy", "vattention", "--policy", "paged", "--workers", "1"],
    ["capacity", "--slo", "ttft_p99=2s", "--tolerance", "0.5"],
])
def test_commands_print_no_progress_when_not_a_terminal(tmp_path, capsys, argv):
    from cli import main
    assert main([*argv, "--num-requests", "20", "--out", str(tmp_path / "out")]) in (0, 1)
    err = capsys.readouterr().err
    assert "\r" not in err and "━" not in err            # no bar drawn into a pipe


def test_sweep_prints_no_per_point_lines_when_not_a_terminal(tmp_path, capsys):
    """A sweep into a pipe prints neither a bar nor a line per finished point (issue 36 item 12); the points'
    results are in the sweep's table."""
    from cli import main
    assert main(["sweep", "--grid", "max_batch=8,16", "--num-requests", "20", "--workers", "1",
                 "--out", str(tmp_path / "sw")]) == 0
    err = capsys.readouterr().err
    assert "[1/2]" not in err and "[2/2]" not in err and "━" not in err
