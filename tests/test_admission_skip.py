"""Refused admissions are not asked again while nothing they read changed for the better (the policy's admission
epoch, :mod:`sim.memory.vattention`; :meth:`sim.core.admission.Admission._admit`), and the prefix cache is looked
up once per admission: the records are those of asking every time."""
from __future__ import annotations

import pandas as pd
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sim.core.engine import Simulator
from sim.memory import PrefixCachingPolicy, VAttentionConfig
from sim.setup.config import SimConfig
from sim.units import KIB
from tests.helpers import ConstantCompute, constant_vmm, trace
from tests.test_serving_properties import STEP_BOUND_PER_TOKEN, _memory_util, configs, workloads


class CountingSimulator(Simulator):
    """Counts admission attempts (``_admit`` calls) and the ones that reached the policy (``alloc_slot``)."""

    def __init__(self, *args, skip: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self._skip_refusals = skip
        self.attempts = 0
        self.policy_calls = 0
        alloc = self.policy.alloc_slot

        def counted(*a, **k):
            self.policy_calls += 1
            return alloc(*a, **k)
        self.policy.alloc_slot = counted

    def _admit(self, request, first_tokens):
        self.attempts += 1
        return super()._admit(request, first_tokens)


def _blocked_head(skip: bool) -> CountingSimulator:
    """A pool of 11 page groups of 32 tokens (64 KiB pages, Llama-3-8B), no admission watermark, synchronous
    mapping, 1,000 us per iteration, no fast-forwarding (one admission attempt per iteration):

    * A (prompt 100, 100 outputs) and C (prompt 20, 10 outputs) are admitted at iteration 0 (4 + 1 groups);
      C finishes at the end of iteration 9 (its slot keeps its 1 group: deferred), A at the end of 99
      (7 groups: ceil(199 / 32)).
    * B (prompt 230: 8 groups under whole-prompt admission) arrives during iteration 0. From iteration 1 on
      6 groups are free: refused (8 > 6). After C finished, 6 free + 1 reclaimable: refused (8 > 7). A's
      decode pages (groups 5-7, at 129, 161 and 193 tokens) only take free groups. After A finished:
      3 free + 8 reclaimable, A's slot (7 mapped) + 1 new group: admitted at iteration 100.
    """
    config = SimConfig(page_size_bytes=64 * KIB, max_context_tokens=1024, sync_mapping=True,
                       admission_watermark_frac=0.0, memory_util_frac=_memory_util(11 * 32, 1))
    assert config.pool_page_groups == 11 and config.tokens_per_page == 32
    table = trace([(0.0, 100, 100), (0.0, 20, 10), (0.0005, 230, 2)])
    sim = CountingSimulator(config, table, vmm=constant_vmm(), compute=ConstantCompute(1000.0), coalesce=False,
                            skip=skip)
    sim.run()
    return sim


def test_a_blocked_head_is_asked_once_per_memory_change_not_once_per_iteration():
    asked, skipped = _blocked_head(skip=False), _blocked_head(skip=True)
    # B is attempted in iterations 1-100 (99 refusals, then admitted); A and C once each at iteration 0
    assert asked.attempts == skipped.attempts == 2 + 100
    assert asked.policy_calls == 2 + 100
    # the policy sees B at iteration 1 (refused), 10 (C's slot freed: refused), 100 (A's slot freed: admitted)
    assert skipped.policy_calls == 2 + 3
    assert skipped._admissions_skipped == 97
    b = [r for r in skipped.requests if r.request_id == 2][0]
    assert b.first_scheduled_at_us == [r for r in asked.requests if r.request_id == 2][0].first_scheduled_at_us
    assert _same_records(skipped, asked)


def _same_records(a: Simulator, b: Simulator) -> bool:
    """Whether two finished runs have the same request and iteration records and counters (NaN equal to NaN)."""
    out_a, out_b = a.output(), b.output()
    return (out_a.requests_frame().equals(out_b.requests_frame())
            and out_a.iterations_frame().equals(out_b.iterations_frame()) and repr(out_a.counters) == repr(out_b.counters))


def _run(config: SimConfig, table: pd.DataFrame, skip: bool) -> CountingSimulator:
    tokens = int((table["prompt_tokens"] + table["output_tokens"]).sum())
    sim = CountingSimulator(config, table, vmm=constant_vmm(), compute=ConstantCompute(1000.0),
                            max_iterations=STEP_BOUND_PER_TOKEN * tokens + 100, skip=skip)
    sim.run()
    return sim


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(data=st.data())
def test_skipping_refused_admissions_gives_the_records_of_asking_every_time(data):
    table = data.draw(workloads())
    config = data.draw(configs(prefix_possible="hash_ids" in table))
    skipped, asked = _run(config, table, skip=True), _run(config, table, skip=False)
    assert skipped.attempts == asked.attempts
    assert skipped.policy_calls == asked.policy_calls - skipped._admissions_skipped
    assert asked._admissions_skipped == 0
    event(f"skipped: {skipped._admissions_skipped > 0}")
    assert _same_records(skipped, asked)


def test_prefix_cache_is_looked_up_once_per_admission():
    """admission_credit then admit_prefix with the cache unchanged in between: one lookup; a new cache entry
    in between (a donation) makes admit_prefix look up again."""
    policy = PrefixCachingPolicy(VAttentionConfig(num_slots=4, max_pages_per_slot=8, pool_page_groups=16,
                                                  tokens_per_page=32), block_tokens=32)
    calls = []
    lookup = policy.lookup
    policy.lookup = lambda ids, prompt, *own: calls.append(ids) or lookup(ids, prompt, *own)
    ids = (1, 2, 3)
    slot = policy.alloc_slot(96)
    policy.admit_prefix(slot, (), 96)
    policy.step({slot: 96})
    assert policy.donate(slot, ids, 96, 96) == 3           # pages 0-2 cached
    credit = policy.admission_credit(ids, 96)
    assert credit == (64, 2, 0)                              # at most 95 tokens served: 2 whole pages
    other = policy.alloc_slot(96, cached=credit[1:])
    hit = policy.admit_prefix(other, ids, 96)
    assert hit.hit_tokens == 64 + 31 and len(calls) == 1     # the next page copied (COW): 31 tokens
    policy.admission_credit((7, 8), 64)
    third = policy.alloc_slot(64)
    policy.admit_prefix(third, (), 64)
    policy.step({third: 64})
    policy.donate(third, (7, 8), 64, 64)                     # cache changed since the credit
    policy.admit_prefix(policy.alloc_slot(64), (7, 8), 64)
    assert len(calls) == 3
