"""Eager-allocation knobs beyond their reach saturate (the run is the one at the bound) and the configuration says so
(``SimConfig.notes``): a slot's page groups for ``eager=``, its tokens for ``lookahead=``, the slots for
``eager_slots=``."""
import pandas as pd
import pytest

from sim.core.runner import run_simulation
from sim.setup.config import SimConfig


def _trace(n: int = 24) -> pd.DataFrame:
    return pd.DataFrame({"request_id": range(n), "arrival_s": [0.01 * i for i in range(n)],
                         "prompt_tokens": [300 + 97 * (i % 7) for i in range(n)],
                         "output_tokens": [40 + 13 * (i % 5) for i in range(n)]})


@pytest.mark.parametrize("field,bound", [("eager_page_groups", lambda c: c.max_pages_per_slot),
                                         ("eager_lookahead_steps", lambda c: c.slot_max_tokens),
                                         ("eager_idle_slots", lambda c: c.max_batch_slots)])
def test_a_knob_beyond_its_bound_runs_as_the_bound_and_is_noted(field, bound):
    base = SimConfig(max_context_tokens=4096, max_batch_slots=8)
    at = SimConfig(max_context_tokens=4096, max_batch_slots=8, **{field: bound(base)})
    beyond = SimConfig(max_context_tokens=4096, max_batch_slots=8, **{field: 10**9})
    assert not [n for n in at.notes if field in n]
    (note,) = [n for n in beyond.notes if field in n]
    assert f"{10**9:,}" in note and f"={bound(base)}" in note
    first, second = run_simulation(at, _trace()), run_simulation(beyond, _trace())
    pd.testing.assert_frame_equal(first.requests, second.requests)
    pd.testing.assert_frame_equal(first.iterations, second.iterations)


def test_paged_and_static_runs_have_no_eager_note():
    assert not [n for n in SimConfig(policy="paged", eager_page_groups=10**9).notes if "eager" in n]
