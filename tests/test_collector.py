"""The collector's settings during a run (:mod:`sim.core.collector`): changed inside, restored after (also on
an error), re-entrant; a run's tables do not depend on them."""
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

