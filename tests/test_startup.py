"""Start-up stays cheap (issue 32): ``kvsim --version`` and the parsers' ``--help`` import neither numpy, pandas,
pyarrow nor SimPy. A check of the set of modules imported (``python -X importtime``), not of a time: the
figures are in ``python bench/bench_targets.py --only version`` and docs/scale.md."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {"numpy", "pandas", "pyarrow", "simpy"}


def imported_modules(*args: str) -> set[str]:
    """Top-level package names that ``python -X importtime cli.py ARGS`` imported (its stderr trace)."""
    done = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "cli.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    names = {line.split("|")[2].strip().split(".")[0] for line in done.stderr.splitlines()
             if line.startswith("import time:") and line.count("|") == 2}
    assert "argparse" in names or args == ("--version",)      # the import trace was read (--help: a parser built)
    return names


def test_version_imports_no_numpy_pandas_pyarrow():
    names = imported_modules("--version")
    assert "sim" in names              # the version comes from the package
    assert not names & HEAVY


@pytest.mark.parametrize("args", [("--help",), ("simulate", "--help"), ("traces", "--help")])
def test_help_imports_no_numpy_pandas_pyarrow(args):
    assert not imported_modules(*args) & HEAVY


def test_parser_imports_no_vmm_driver_code():
    """The ``calibrate`` options come from :mod:`hwbackend.calibration.vmm_options`: building the whole parser
    (here for ``--help``) imports neither the calibration code nor the VMM driver wrappers."""
    done = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "cli.py"), "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    modules = {line.split("|")[2].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "hwbackend.calibration.vmm_options" in modules
    assert not modules & {"hwbackend.calibration.vmm", "hwbackend.vmm.driver", "hwbackend.vmm.kvcache"}


WATCH_RUN = r"""
import json, sys
sys.path.insert(0, {root!r})
state = {{"run_done": False, "pandas_during_run": None, "pandas": False}}
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "pandas" and not state["pandas"]:
            state["pandas"], state["pandas_during_run"] = True, not state["run_done"]
        return None
sys.meta_path.insert(0, Watch())
import sim.core.engine as engine
run = engine.Simulator.run
def watched(self):
    out = run(self)
    state["run_done"] = True
    return out
engine.Simulator.run = watched
from cli import main
status = main({args!r})
print(json.dumps({{**state, "status": status}}))
"""


def _azure_csv(path: Path, rows: int) -> Path:
    """An Azure-format trace (ISO timestamps, CRLF line ends as in the published files)."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"2023-11-16 18:{15 + i // 60:02d}:{i % 60:02d}.{(7 * i) % 10_000_000:07d},{100 + 13 * i},{5 + i % 40}"
              for i in range(rows)]
    path.write_bytes(("\r\n".join(lines)).encode())
    return path


def _lengths_csv(path: Path, rows: int) -> Path:
    lines = ["num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio"]
    lines += [f"{50 + 7 * i},{3 + i % 30},{53 + 7 * i + i % 30},{(50 + 7 * i) / (3 + i % 30)}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _splitwise_csv(path: Path, rows: int) -> Path:
    lines = ["arrived_at,num_prefill_tokens,num_decode_tokens"]
    lines += [f"{0.37 * i + i / 7:.15g},{100 + 13 * i},{5 + i % 40}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("form", ["azure", "lengths", "splitwise"])
def test_simulate_csv_imports_no_pandas(tmp_path, form):
    """``simulate`` on a plain CSV trace (Azure timestamps, Splitwise seconds, or lengths with --arrival) reads
    it, runs the engine (records streamed), summarises and writes the run without importing pandas (issue 32)."""
    if form == "azure":
        args = ["--trace", str(_azure_csv(tmp_path / "azure.csv", 120))]
    elif form == "splitwise":
        args = ["--trace", str(_splitwise_csv(tmp_path / "splitwise.csv", 120))]
    else:
        args = ["--trace", str(_lengths_csv(tmp_path / "lengths.csv", 120)), "--arrival", "poisson:20"]
    args = ["simulate", *args, "--num-requests", "100", "--quiet", "--out", str(tmp_path / "run")]
    done = subprocess.run([sys.executable, "-c", WATCH_RUN.format(root=str(ROOT), args=args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    state = json.loads(done.stdout.strip().splitlines()[-1])
    assert state["status"] == 0 and state["run_done"]
    assert not state["pandas"], "pandas imported (during the run)" if state["pandas_during_run"] else "after the run"
    assert {p.name for p in (tmp_path / "run").iterdir()} >= {"requests.parquet", "iterations.parquet", "summary.json"}


def _subparser(parser, name: str):
    import argparse
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


@pytest.mark.parametrize("argv", [
    ["simulate"], ["simulate", "--trace", "x.csv", "--num-requests", "5", "--policy", "paged", "--replicas", "2"],
    ["simulate", "--replicas", "0"], ["simulate", "--bogus"], ["simulate", "--gpu"], ["simulate", "extra"],
    ["simulate", "--help"],
])
def test_simulate_only_parser_parses_as_the_whole_one(argv, capsys):
    """``kvsim simulate ...`` is parsed by a parser holding only ``simulate`` (issue 32): the same namespace,
    help, usage and error lines as the whole parser's."""
    import cli

    def outcome(parser):
        try:
            return ("ok", vars(parser.parse_args(argv))), capsys.readouterr()
        except SystemExit as stop:
            return ("exit", stop.code), capsys.readouterr()

    whole, light = outcome(cli.build_parser()), outcome(cli.build_parser("simulate"))
    assert whole == light
    assert (_subparser(cli.build_parser(), "simulate").format_help()
            == _subparser(cli.build_parser("simulate"), "simulate").format_help())


def test_simulate_builds_only_its_parser():
    """``simulate`` imports none of the other sub-commands' option modules (issue 32)."""
    done = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "cli.py"), "simulate", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    modules = {line.split("|")[2].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert not modules & {"hwbackend.cli", "analysis.planning.cli", "analysis.colocate", "traces.cli"}
