"""Start-up stays cheap (issue 32): ``kvsim --version`` and the parsers' ``--help`` import neither numpy, pandas,
pyarrow nor SimPy. A check of the set of modules imported (``python -X importtime``), not of a time: the
figures are in ``python bench/bench_targets.py --only version`` and docs/scale.md."""
from __future__ import annotations

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
    """The ``calibrate`` options come from :mod:`hwbackend.calibration.vmm_options`: building the parser (here
    for ``simulate --help``) imports neither the calibration code nor the VMM driver wrappers."""
    done = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "cli.py"), "simulate", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    modules = {line.split("|")[2].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "hwbackend.calibration.vmm_options" in modules
    assert not modules & {"hwbackend.calibration.vmm", "hwbackend.vmm.driver", "hwbackend.vmm.kvcache"}
