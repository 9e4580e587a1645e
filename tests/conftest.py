"""Shared fixtures and the GPU marker's skip rule."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_TRACES = REPO_ROOT.parent / "shared" / "traces"


def _gpu_available() -> tuple[bool, str]:
    try:
        from cuda.bindings import driver  # noqa: F401
    except Exception:  # pragma: no cover - depends on the machine
        return False, "cuda-python is not installed (pip install '.[hw]')"
    try:
        err, = driver.cuInit(0)
        if int(err) != 0:
            return False, f"cuInit failed: {err}"
        err, count = driver.cuDeviceGetCount()
        if int(err) != 0 or count < 1:
            return False, "no CUDA device"
    except Exception as exc:  # pragma: no cover
        return False, f"CUDA driver unusable: {exc}"
    return True, ""


def pytest_collection_modifyitems(config, items):
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    ok, reason = _gpu_available()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"needs an NVIDIA GPU with VMM support: {reason}")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture
def shared_traces() -> Path:
    """Path of ../shared/traces (skips the test when absent)."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"{SHARED_TRACES} is not present")
    return SHARED_TRACES
