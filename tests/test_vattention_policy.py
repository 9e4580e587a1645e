"""vAttention policy: scenario tests with exact slots and page counts, and a Hypothesis state machine
checking the invariants of domain.md (pages are conserved; nothing computes on unmapped memory; a slot is
never reused while an iteration that reads it is in flight; a failing step leaves no partial mapping)."""
import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sim.memory import VAttentionConfig, VAttentionPolicy
from sim.memory.plan import MapOp, Plan, UnmapOp


def policy(**overrides) -> VAttentionPolicy:
    values = dict(num_slots=4, max_pages_per_slot=8, pool_page_groups=10, tokens_per_page=16,
                  admission_watermark_frac=0.0, low_watermark_frac=0.0)
    values.update(overrides)
    return VAttentionPolicy(VAttentionConfig(**values))


def test_step_maps_the_target_not_one_more_token():
    p = policy()
    slot = p.alloc_slot(40)
    assert slot == 0
    # A 40-token prefill chunk needs ceil(40 / 16) = 3 page groups at once.
    assert p.step({0: 40}) == Plan(maps=(MapOp(0, 0, 3),))
    assert p.step({0: 48}) == Plan()          # 48 tokens still fit 3 pages
    assert p.step({0: 49}) == Plan(maps=(MapOp(0, 3, 1),))
    assert (p.mapped_page_groups, p.free_page_groups) == (4, 6)


def test_deferred_reclamation_and_best_fit_reuse():
    p = policy()
    a, b = p.alloc_slot(16), p.alloc_slot(16)
    p.step({a: 60, b: 20})                    # slot 0: 4 pages, slot 1: 2 pages
    assert p.free_slot(a, last_read_iteration=0) == Plan()   # pages stay mapped (deferred)
    assert p.free_slot(b, last_read_iteration=0) == Plan()
    assert p.deferred_page_groups == 6
    p.iteration_completed(0)
    # Needs 2 pages: best fit is slot 1 (2 mapped), not slot 0 (4 mapped) nor empty slots.
    assert p.alloc_slot(30) == 1
    assert p.step({1: 30}) == Plan()          # nothing to map: reused pages
    # Needs 5 pages: no idle slot has 5, so take the one with most mapped (slot 0, 4) and map 1 more.
    assert p.alloc_slot(70) == 0
    assert p.step({0: 70}) == Plan(maps=(MapOp(0, 4, 1),))


def test_without_deferred_reclamation_free_unmaps():
    p = policy(deferred_reclaim=False)
    slot = p.alloc_slot(30)
    p.step({slot: 30})
    assert p.free_slot(slot, 0) == Plan(unmaps=(UnmapOp(0, 0, 2),))
    assert p.free_page_groups == 10


def test_slot_not_reused_before_its_last_iteration_completes():
    p = policy(num_slots=1)
    slot = p.alloc_slot(10)
    p.step({slot: 10})
    p.free_slot(slot, last_read_iteration=5)
    p.iteration_completed(4)
    assert p.alloc_slot(10) is None
    p.iteration_completed(5)
    assert p.alloc_slot(10) == 0


def test_best_fit_prefers_the_smallest_sufficient_idle_slot():
    p = policy(pool_page_groups=6)
    a = p.alloc_slot(16)
    p.step({a: 64})
    p.free_slot(a, 0)
    p.iteration_completed(0)
    assert p.alloc_slot(16) == 0              # slot 0 (4 pages) is the only one covering 1 page


def test_failing_step_changes_nothing_then_reclaims_idle():
    p = policy(pool_page_groups=6)
    a, b = p.alloc_slot(16), p.alloc_slot(16)
    p.step({a: 32, b: 32})                    # 2 + 2 pages, 2 free
    before = (list(p.mapped), p.free_page_groups)
    assert p.step({a: 32, b: 96}) is None     # b needs 6 - 2 = 4 more, only 2 free, nothing idle
    assert (list(p.mapped), p.free_page_groups) == before
    p.free_slot(a, 0)                          # slot 0's 2 pages become deferred (reclaimable)
    plan = p.step({b: 96})
    assert plan == Plan(maps=(MapOp(1, 2, 4),), unmaps=(UnmapOp(0, 0, 2),))
    assert p.free_page_groups == 0 and p.conservation_error() == 0


def test_admission_watermark():
    p = policy(pool_page_groups=100, max_pages_per_slot=100, admission_watermark_frac=0.01)
    slot = p.alloc_slot(16)
    p.step({slot: 16 * 98})                   # 98 used, 2 free, watermark 1
    assert p.can_admit(16)                    # 1 new page leaves 1 free
    assert not p.can_admit(32)                # 2 new pages would leave 0 < 1


def test_background_plan_lookahead_eager_and_commit():
    p = policy(eager_page_groups=2, eager_idle_slots=1, low_watermark_frac=0.1)
    slot = p.alloc_slot(16)
    p.step({slot: 16})
    plan = p.background_plan({slot: 40})      # lookahead needs 3 pages: 2 more on slot 0
    assert plan.maps[:2] == (MapOp(0, 1, 1), MapOp(0, 2, 1))
    assert plan.maps[2:] == (MapOp(1, 0, 1), MapOp(1, 1, 1))   # one idle slot pre-mapped to 2 groups
    assert p.free_page_groups == 10 - 1 - 4 and p.conservation_error() == 0
    for op in plan.maps[:3]:
        p.commit(op)
    p.cancel(plan.maps[3])
    assert p.mapped[:2] == [3, 1] and p.conservation_error() == 0


def test_low_watermark_reclaims_idle_pages_with_hysteresis():
    p = policy(pool_page_groups=20, max_pages_per_slot=10, low_watermark_frac=0.2, eager_page_groups=0)   # low 4, high 8
    a, b = p.alloc_slot(16), p.alloc_slot(16)
    p.step({a: 16 * 9, b: 16 * 8})            # 17 mapped, 3 free < 4
    p.free_slot(a, 0)
    plan = p.background_plan({b: 16 * 8})
    # Reclaim slot 0's pages one group at a time, from its top, until 8 are free (5 unmaps).
    assert plan.unmaps == tuple(UnmapOp(0, page, 1) for page in (8, 7, 6, 5, 4))
    for op in plan.unmaps:
        p.commit(op)
    assert p.free_page_groups == 8 and p.mapped[0] == 4


class PolicyMachine(RuleBasedStateMachine):
    """Random sequences of admissions, steps, frees, background plans and completions."""

    def __init__(self):
        super().__init__()
        self.p = policy(num_slots=4, max_pages_per_slot=6, pool_page_groups=12, tokens_per_page=4,
                        eager_page_groups=2, eager_idle_slots=2, low_watermark_frac=0.2, admission_watermark_frac=0.1)
        self.tokens = {}                       # active slot -> tokens it holds
        self.in_flight_iteration = -1
        self.iteration = 0
        self.reserved: list = []               # background ops not yet committed/cancelled

    @rule(first=st.integers(1, 24))
    def admit(self, first):
        slot = self.p.alloc_slot(first)
        if slot is not None:
            assert slot not in self.tokens
            # never reuse a slot that an unfinished iteration reads
            assert self.p.last_read_iteration[slot] <= self.p.completed_iteration
            self.tokens[slot] = 0

    @rule(data=st.data())
    def iterate(self, data):
        if not self.tokens:
            return
        self._settle_slots(self.tokens)
        targets = {s: min(t + data.draw(st.integers(1, 9)), 24) for s, t in self.tokens.items()}
        before = (list(self.p.mapped), self.p.free_page_groups)
        plan = self.p.step(targets)
        if plan is None:
            assert (list(self.p.mapped), self.p.free_page_groups) == before   # no partial mapping
            victim = max(self.tokens)
            self.p.free_slot(victim, self.p.completed_iteration)
            del self.tokens[victim]
            return
        for slot, target in targets.items():
            assert self.p.mapped[slot] * 4 >= target          # nothing computes on unmapped memory
            self.tokens[slot] = target
        self.in_flight_iteration = self.iteration
        self.iteration += 1

    @rule()
    def complete_iteration(self):
        self.p.iteration_completed(self.in_flight_iteration)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def finish(self, data):
        slot = data.draw(st.sampled_from(sorted(self.tokens)))
        self.p.free_slot(slot, self.in_flight_iteration)
        del self.tokens[slot]

    @rule(ahead=st.integers(0, 12))
    def background(self, ahead):
        plan = self.p.background_plan({s: min(t + ahead, 24) for s, t in self.tokens.items()})
        self.reserved += list(plan.unmaps) + list(plan.maps)

    @precondition(lambda self: self.reserved)
    @rule(commit=st.booleans())
    def settle_one(self, commit):
        if commit:
            op = self.reserved.pop(0)
            if isinstance(op, MapOp):
                assert op.first_page == self.p.mapped[op.slot]      # pages stay a prefix 0..k-1
            self.p.commit(op)
        else:
            self.p.cancel(self.reserved.pop())
        self.p.take_settled_unmaps()

    def _settle_slots(self, slots):
        # the executor's take-over: cancel queued ops (newest first) so that step() may run
        while self.reserved:
            self.p.cancel(self.reserved.pop())

    @invariant()
    def pages_conserved(self):
        assert self.p.conservation_error() == 0
        assert self.p.free_page_groups >= 0
        assert all(0 <= m <= 6 for m in self.p.mapped)


class PolicyMachineNoDeferral(PolicyMachine):
    """The same with deferred reclamation off: frees unmap at once, or once in-flight maps settle."""

    def __init__(self):
        super().__init__()
        self.p = policy(num_slots=4, max_pages_per_slot=6, pool_page_groups=12, tokens_per_page=4,
                        eager_page_groups=2, eager_idle_slots=2, low_watermark_frac=0.2,
                        admission_watermark_frac=0.1, deferred_reclaim=False)

    @invariant()
    def idle_slots_hold_only_eager_or_settling_pages(self):
        for slot in range(4):
            if not self.p.active[slot]:
                assert self.p.mapped[slot] <= 2 or slot in self.p._free_after_settle


TestPolicyMachine = PolicyMachine.TestCase
TestPolicyMachineNoDeferral = PolicyMachineNoDeferral.TestCase
TestPolicyMachineNoDeferral.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestPolicyMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_slot_length_far_beyond_the_pool_costs_no_memory():
    """A slot of 10**9 page groups over a pool of 8: the policy keeps buckets only up to the pool (a slot never
    maps more), so building it is cheap, and a request longer than the pool is refused."""
    from sim.memory.vattention import VAttentionConfig, VAttentionPolicy

    policy = VAttentionPolicy(VAttentionConfig(num_slots=4, max_pages_per_slot=10**9, pool_page_groups=8,
                                               tokens_per_page=16, admission_watermark_frac=0.0))
    assert len(policy._idle_buckets) == 9
    assert policy.alloc_slot(9 * 16) is None
    slot = policy.alloc_slot(8 * 16)
    assert slot is not None and policy.step({slot: 8 * 16}).num_page_groups_mapped == 8
