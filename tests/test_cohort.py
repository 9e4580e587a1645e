"""The decode cohort (sim.core.cohort): its running totals against the members visited one by one, and the serving
loop with and without it (the same tables, bit for bit)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.core.cohort import DecodeCohort
from sim.setup.config import SimConfig
from sim.core.engine import Simulator
from sim.timing.latency import VmmLatencyModel
from sim.core.request import Request
from tests.helpers import ConstantCompute, constant_vmm, trace
from tests.test_serving_properties import configs, workloads


def _member(request_id: int, prompt: int, output: int, generated: int) -> Request:
    request = Request(request_id, 0.0, prompt, output)
    request.generated = generated
    request.computed = prompt + generated - 1        # a plain decode: one token left to compute
    request.last_token_at_us = float(request_id)
    return request


@settings(max_examples=150, deadline=None, derandomize=True)
@given(per_page=st.sampled_from([1, 4, 16, 32]), ops=st.lists(st.tuples(
    st.sampled_from(["join", "join", "advance", "leave"]), st.integers(1, 400), st.integers(2, 300),
    st.integers(0, 40), st.integers(1, 9)), min_size=1, max_size=40))
def test_cohort_totals_equal_the_members_visited_one_by_one(per_page, ops):
    cohort = DecodeCohort(per_page)
    members: dict[Request, dict] = {}     # the reference: each member's own counters
    for i, (op, prompt, output, generated, steps) in enumerate(ops):
        if op == "join":
            generated = min(generated, output - 2) + 1          # 1 <= generated <= output - 1
            request = _member(i, prompt, output, generated)
            left = output - generated - 1                       # iterations before its last token's
            join_steps = max(1, min(left, 1 + i % 7))            # as if its pages ran out after 1-7
            cohort.join(request, join_steps, mapped_page_groups=i % 5)
            members[request] = {"computed": request.computed, "generated": generated, "mapped": i % 5,
                                "leave": join_steps}
        elif op == "advance" and members:
            steps = min(steps, min(m["leave"] for m in members.values()))
            if steps < 1:
                continue
            cohort.advance(steps)
            for m in members.values():
                m["computed"] += steps
                m["generated"] += steps
                m["leave"] -= steps
        elif op == "leave" and members:
            request = list(members)[steps % len(members)]
            cohort.leave(request)
            m = members.pop(request)
            assert (request.computed, request.generated) == (m["computed"], m["generated"])
        computed = [m["computed"] for m in members.values()]
        assert cohort.size == len(members)
        assert cohort.kv_tokens() == sum(computed)
        assert cohort.longest() == max(computed, default=0)
        assert cohort.mapped_sum == sum(m["mapped"] for m in members.values())
        assert cohort.used_now == sum(math.ceil(c / per_page) for c in computed)
        assert cohort.crossing_now() == sum(1 for c in computed if c % per_page == 0)
        expected_crossings: dict[int, int] = {}
        for c in computed:
            expected_crossings[-c % per_page] = expected_crossings.get(-c % per_page, 0) + 1
        assert cohort.crossings() == expected_crossings
        if members:
            assert cohort.steps_left() == min(m["leave"] for m in members.values())
    due = set(cohort.due())
    assert due == {r for r, m in members.items() if m["leave"] <= 0}


def test_cohort_leave_writes_back_the_last_token_time():
    """A member that ran in the cohort emitted its last token at the cohort's last emission; one that joined
    since keeps its own."""
    cohort = DecodeCohort(16)
    ran, joined = _member(0, 100, 50, 3), _member(1, 40, 50, 2)
    cohort.join(ran, 40, 7)
    cohort.advance(4)
    cohort.last_emit_us = 123.5
    cohort.join(joined, 40, 3)
    cohort.leave(ran)
    cohort.leave(joined)
    assert (ran.computed, ran.generated, ran.last_token_at_us) == (102 + 4, 3 + 4, 123.5)
    assert (joined.computed, joined.generated, joined.last_token_at_us) == (41, 2, 1.0)


class NoCohortSimulator(Simulator):
    """Every running request visited each iteration (runs still fast-forwarded)."""

    _cohort_ok = False


def _tables(simulator_class, config, table, vmm, compute):
    sim = simulator_class(config, table, vmm=vmm, compute=compute)
    out = sim.run()
    return out.requests_frame(), out.iterations_frame(), {k: v for k, v in out.counters.items() if k != "tbt_samples"}


def _assert_same(config, table, vmm=None, compute=None):
    vmm, compute = vmm or constant_vmm(), compute or ConstantCompute(1000.0)
    with_cohort = _tables(Simulator, config, table, vmm, compute)
    without = _tables(NoCohortSimulator, config, table, vmm, compute)
    pd.testing.assert_frame_equal(with_cohort[0], without[0], check_exact=True)
    pd.testing.assert_frame_equal(with_cohort[1], without[1], check_exact=True)
    assert with_cohort[2].keys() == without[2].keys()
    for key, value in with_cohort[2].items():
        assert value == without[2][key] or (value != value and without[2][key] != without[2][key]), key


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(data=st.data())
def test_cohort_gives_the_same_tables_over_every_policy_option(data):
    table = data.draw(workloads())
    config = data.draw(configs(prefix_possible="hash_ids" in table))
    _assert_same(config, table)


@pytest.mark.parametrize("settings_", [
    {}, {"sync_mapping": True}, {"scheduler": "vllm"}, {"policy": "paged"}, {"policy": "static"},
    {"deferred_reclaim": False, "page_size_bytes": 64 * 1024}, {"memory_util_frac": 0.3, "preemption": "swap"},
    {"memory_util_frac": 0.3, "admission": "chunk"}])
def test_cohort_gives_the_same_tables_with_the_roofline(settings_):
    """60 requests of 1-3,000 prompt and 1-400 output tokens, H200 VMM latencies and the roofline: plenty of
    joins, leaves (completions, page crossings) and fast-forwarded runs of the whole cohort."""
    rng = np.random.default_rng(11)
    rows = [(float(t), int(p), int(o)) for t, p, o in zip(np.cumsum(rng.exponential(0.03, 60)),
                                                          rng.integers(1, 3000, 60), rng.integers(1, 400, 60))]
    config = SimConfig(**settings_)
    sim = Simulator(config, trace(rows), vmm=VmmLatencyModel.h200_defaults())
    sim.run()
    assert sim.cohort is not None and sim.cohort.clock > 0      # the cohort did run
    _assert_same(config, trace(rows), vmm=VmmLatencyModel.h200_defaults(),
                 compute=Simulator(config, trace(rows)).compute)


def test_folded_tbt_buffers_give_the_same_figures(monkeypatch):
    """Folding the TBT buffers into (distinct gap, tokens) pairs every few entries leaves every TBT figure,
    the mean included, as it was (they depend only on the token multiset)."""
    import sim.core.engine

    rng = np.random.default_rng(5)
    rows = [(float(t), int(p), int(o)) for t, p, o in zip(np.cumsum(rng.exponential(0.02, 80)),
                                                          rng.integers(1, 2000, 80), rng.integers(1, 300, 80))]
    config = SimConfig()
    whole = Simulator(config, trace(rows), vmm=VmmLatencyModel.h200_defaults()).run().counters
    monkeypatch.setattr(sim.core.engine, "TBT_FOLD_ENTRIES", 64)
    folded_sim = Simulator(config, trace(rows), vmm=VmmLatencyModel.h200_defaults())
    folded = folded_sim.run().counters
    assert folded_sim._tbt_fold_at >= 64 and len(folded["tbt_samples"][0]) < 64     # it did fold
    keys = ["tbt_p50_us", "tbt_p90_us", "tbt_p99_us", "tbt_max_us", "tbt_mean_us", "tbt_tokens"]
    assert [folded[k] for k in keys] == [whole[k] for k in keys]
    assert whole["tbt_tokens"] > 1000


@pytest.mark.parametrize("settings_", [{}, {"sync_mapping": True}, {"scheduler": "vllm"}])
def test_last_token_iterations_fold_into_cohort_runs(monkeypatch, settings_):
    """Issue 32: cohort runs whose due members leave only to emit their last token take that iteration as
    their last step (it happens here), with the tables of visiting every request each iteration."""
    folded = []
    finish = Simulator._finish_folded_run
    monkeypatch.setattr(Simulator, "_finish_folded_run",
                        lambda self, *args: folded.append(args[1]) or finish(self, *args))
    rng = np.random.default_rng(12)
    rows = [(float(t), int(p), int(o)) for t, p, o in zip(np.cumsum(rng.exponential(0.2, 40)),
                                                          rng.integers(1, 2000, 40), rng.integers(2, 300, 40))]
    config = SimConfig(**settings_)
    _assert_same(config, trace(rows), vmm=VmmLatencyModel.h200_defaults(),
                 compute=Simulator(config, trace(rows)).compute)
    assert len(folded) >= 5 and min(folded) >= 3      # runs of at least 2 steps and the folded one

