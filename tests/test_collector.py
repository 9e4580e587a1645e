"""The collector's settings during a run (:mod:`sim.core.collector`): changed inside, restored after (also on
an error), re-entrant; a run's tables do not depend on them, nor its summary on the number of BLAS threads."""
from __future__ import annotations

import gc

import pytest

import traces
from sim.core.collector import YOUNG_THRESHOLD, quiet_collector
from sim.core.runner import run_simulation
from sim.setup.config import SimConfig


def test_settings_are_restored_after_the_run_and_on_error():
    before = gc.get_threshold()
    with quiet_collector():
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD and gc.get_freeze_count() > 0
        with quiet_collector():                       # nested: the outer one restores
            pass
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError):
        with quiet_collector():
            raise RuntimeError("inside the run")
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_a_run_is_the_same_with_the_interpreters_collector(monkeypatch):
    trace, _ = traces.clip_context(traces.scale_rate(traces.synthetic_default(0, num_requests=120), 20.0), 8192)
    config = SimConfig(memory_util_frac=0.2)
    quiet = run_simulation(config, trace)
    import contextlib

    import sim.core.engine as engine
    monkeypatch.setattr(engine, "quiet_collector", contextlib.nullcontext)
    plain = run_simulation(config, trace)
    assert quiet.requests.equals(plain.requests) and quiet.iterations.equals(plain.iterations)
    assert quiet.summary == plain.summary and quiet.summary["preemptions"] > 0


def test_ttft_growth_does_not_depend_on_the_blas_threads():
    """The summary's TTFT slope (the capacity search's stability criterion) is the same bit for bit whatever the
    number of BLAS threads (np.dot split its sum over them: the machine's core count showed in its last bits)."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT
    code = ("import numpy as np; from sim.results.summary import ttft_growth_of; r = np.random.default_rng(0); "
            "x = np.sort(r.random(20000)) * 1e9; print(ttft_growth_of(x, x * 1e-3 + r.random(20000) * 1e5).hex())")
    values = {subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True,
                             env={**os.environ, "OPENBLAS_NUM_THREADS": str(n)}).stdout.strip() for n in (1, 2)}
    assert len(values) == 1 and float.fromhex(values.pop()) > 0
