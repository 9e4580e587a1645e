"""The shared physical page pool (sim.memory.shared_pool): conservation across tenants, ceilings and floors
(Hypothesis state machine over two tenants' vAttention policies drawing from one pool)."""
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sim.memory.shared_pool import SharedPagePool, SharedPoolPolicy, TenantShare
from sim.memory.vattention import VAttentionConfig

PAGES_PER_GROUP = (64, 56)       # llama-3.1-8b (32 layers) and qwen2.5-7b (28 layers): 2N' sub-tensors


def test_draw_release_and_moves_between_tenants():
    pool = SharedPagePool(1000, [TenantShare(64, 0, 15), TenantShare(56, 0, 17)])
    assert pool.drawable_groups(0) == 15          # ceiling: 15 x 64 = 960 <= 1000
    pool.draw(0, 15)
    assert pool.drawable_groups(1) == 0           # 40 pages left: less than one 56-page group
    pool.release(0, 5)                            # 360 pages free, 320 of them released by tenant 0
    pool.draw(1, 6)                               # 336 pages: 40 never held, 296 handed over from tenant 0
    assert pool.moved_in_pages == [0, 296]
    assert pool.conservation_error() == 0


def test_floor_keeps_pages_from_the_other_tenant():
    pool = SharedPagePool(1000, [TenantShare(64, 10, 15), TenantShare(56, 0, 17)])
    assert pool.drawable_groups(1) == (1000 - 640) // 56       # tenant 0's unmet floor (640 pages) is kept
    with pytest.raises(RuntimeError, match="only 6 were drawable"):
        pool.draw(1, 7)


def test_floors_above_the_pool_are_refused():
    with pytest.raises(ValueError, match="floors need 1280 pages"):
        SharedPagePool(1000, [TenantShare(64, 10, 15), TenantShare(64, 10, 15)])


class TwoTenants(RuleBasedStateMachine):
    """Two tenants' policies step, free and reclaim at random; the pool is conserved, no tenant holds more than
    its ceiling, and each tenant's holding equals its mappings."""

    def __init__(self):
        super().__init__()
        self.pool = SharedPagePool(2000, [TenantShare(PAGES_PER_GROUP[0], 3, 20), TenantShare(PAGES_PER_GROUP[1], 0, 30)])
        self.policies = [SharedPoolPolicy(VAttentionConfig(num_slots=4, max_pages_per_slot=12, pool_page_groups=c,
                                                           tokens_per_page=100), self.pool, i)
                         for i, c in enumerate((20, 30))]
        self.tokens = [dict(), dict()]
        self.iteration = 0

    @rule(tenant=st.integers(0, 1), tokens=st.integers(1, 1200))
    def admit(self, tenant, tokens):
        policy = self.policies[tenant]
        slot = policy.alloc_slot(tokens)
        if slot is not None:
            slot = slot[0] if isinstance(slot, tuple) else slot
            self.tokens[tenant][slot] = tokens

    @rule(tenant=st.integers(0, 1), grow=st.integers(0, 300))
    def step(self, tenant, grow):
        targets = {s: min(t + grow, 1200) for s, t in self.tokens[tenant].items()}
        if targets and self.policies[tenant].step(targets) is not None:
            self.tokens[tenant] = targets

    @rule(tenant=st.integers(0, 1), data=st.data())
    def free(self, tenant, data):
        if self.tokens[tenant]:
            slot = data.draw(st.sampled_from(sorted(self.tokens[tenant])))
            del self.tokens[tenant][slot]
            self.policies[tenant].free_slot(slot, self.iteration)

    @rule(tenant=st.integers(0, 1))
    def background(self, tenant):
        policy = self.policies[tenant]
        plan = policy.background_plan({s: t + 50 for s, t in self.tokens[tenant].items()})
        for op in (*plan.unmaps, *plan.maps):
            policy.commit(op)

    @rule(tenant=st.integers(0, 1))
    def trim(self, tenant):
        self.iteration += 1
        for policy in self.policies:
            policy.iteration_completed(self.iteration)
        self.policies[tenant].trim_idle()

    @invariant()
    def conserved(self):
        assert self.pool.conservation_error() == 0
        assert self.pool.free_pages >= 0
        for i, policy in enumerate(self.policies):
            assert policy.conservation_error() == 0
            assert self.pool.held_groups[i] <= self.pool.shares[i].ceiling_groups


TestTwoTenants = TwoTenants.TestCase
TestTwoTenants.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
