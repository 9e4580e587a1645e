"""Prefix caching with window-aware paged allocation (issue 33 item 3; sim/memory/hybrid_prefix.py,
hybrid_prefix_pool.py): vLLM v1's hit rule over KV-cache groups (hand-computed), per-group block caches over
vLLM's free queue (hand-computed hits after reuse of a window's blocks), a Hypothesis property over random
operation sequences (conservation per group, hits <= prompt - 1 and <= the full groups' hit), runs through the
simulator, and the refusals."""
import pytest
from hypothesis import given, settings, strategies as st

from sim.core.engine import Simulator
from sim.frontend.policy_spec import parse_policy
from sim.memory import build_policy
from sim.memory.hybrid_prefix import GroupCache, HybridPrefixPolicy, longest_cache_hit_tokens
from sim.memory.hybrid_prefix_pool import CachedFullGroup, CachedWindowGroup, CachingPool
from sim.memory.layer_groups import LayerGroup
from sim.memory.vattention import VAttentionConfig
from sim.setup.config import ConfigError, SimConfig
from tests.helpers import ConstantCompute, constant_vmm, trace

GEMMA = "models/gemma-3-12b.json"
GPT_OSS = "models/gpt-oss-20b.json"
P = 16            # tokens per block (page) of the hand-built policies
W = 40            # their sliding window: cdiv(W - 1, 16) = 3 blocks before a hit's end


# ---- the rule ------------------------------------------------------------------------------------------------
def test_freed_window_blocks_before_the_hit_shorten_it():
    """16-token blocks, W = 40: the sliding group needs cdiv(39, 16) = 3 cached blocks just before the hit.
    Full group: blocks 0-9 cached, hit 160 tokens. Sliding group: blocks 0-1 freed (out of a window), 2-4
    cached, 5 freed, 6-9 cached: scanning from block 9 the run 9, 8, 7 reaches 3 blocks, so the hit ends
    after block 9: 160 tokens. With block 8 freed too, runs are {9}, {6, 7}, then {2, 3, 4} reaches 3 at block
    2: the hit ends after block 4, 80 tokens (the shorter hit: blocks 0-1 may be freed)."""
    full = GroupCache("full", 16, frozenset(range(10)))
    window = GroupCache("sliding", 16, frozenset({2, 3, 4, 6, 7, 8, 9}), window_tokens=40)
    assert longest_cache_hit_tokens([full, window], 10_000) == 160
    window = GroupCache("sliding", 16, frozenset({2, 3, 4, 6, 7, 9}), window_tokens=40)
    assert longest_cache_hit_tokens([full, window], 10_000) == 80


def test_window_hit_is_bounded_by_the_full_groups_and_the_cap():
    """Full group: blocks 0-3 cached (64 tokens), sliding all 10 cached: the hit is the full groups' 64. A
    cap of 50 tokens (prompt - 1) leaves 3 whole blocks = 48. A sliding run reaching block 0 counts even if
    shorter than the window's 3 blocks: blocks {0, 1} only -> 32 tokens."""
    full = GroupCache("full", 16, frozenset(range(4)))
    window = GroupCache("sliding", 16, frozenset(range(10)), window_tokens=40)
    assert longest_cache_hit_tokens([full, window], 10_000) == 64
    assert longest_cache_hit_tokens([full, window], 50) == 48
    assert longest_cache_hit_tokens([GroupCache("full", 16, frozenset(range(10))),
                                     GroupCache("sliding", 16, frozenset({0, 1}), window_tokens=40)], 10_000) == 32


def test_hit_is_rounded_to_every_groups_block_size():
    """Blocks of 16 and 24 tokens, everything cached, cap 100: full 96 (6 x 16), sliding under it 96 (4 x 24);
    lcm(16, 24) = 48 -> 96. Cap 90: full 80, sliding 72, rounded to 48."""
    full = GroupCache("full", 16, frozenset(range(20)))
    window = GroupCache("sliding", 24, frozenset(range(20)), window_tokens=40)
    assert longest_cache_hit_tokens([full, window], 100) == 96
    assert longest_cache_hit_tokens([full, window], 90) == 48


def test_unmodelled_kinds_are_refused_by_the_rule():
    for kind in ("chunked", "linear", "mystery"):
        with pytest.raises(ValueError, match="full and sliding groups only"):
            longest_cache_hit_tokens([GroupCache("full", 16, frozenset(range(10))), GroupCache(kind, 16)], 100)


@settings(max_examples=60, deadline=None)
@given(full=st.sets(st.integers(0, 15)), window=st.sets(st.integers(0, 15)), w=st.integers(1, 80),
       cap=st.integers(0, 300))
def test_hit_never_exceeds_the_full_groups_alone(full, window, w, cap):
    """Invariant: the hybrid hit <= the full group's hit alone <= cap, and its window rule holds: the
    ``cdiv(W - 1, 16)`` blocks before the hit (or all of them, from block 0) are cached in the window group."""
    full_cache = GroupCache("full", 16, frozenset(full))
    hit = longest_cache_hit_tokens([full_cache, GroupCache("sliding", 16, frozenset(window), window_tokens=w)], cap)
    assert hit <= longest_cache_hit_tokens([full_cache], cap) <= max(cap, 0)
    end = hit // 16
    needed = -(-(w - 1) // 16)
    assert all(b in window for b in range(max(0, end - needed), end))


# ---- the policy: hand-computed hits --------------------------------------------------------------------------
def small_policy(pool_units: int, num_slots: int = 4) -> HybridPrefixPolicy:
    """One full and one sliding (W = 40) layer, 16-token blocks, one unit per block, hash blocks of 16 tokens."""
    config = VAttentionConfig(num_slots=num_slots, max_pages_per_slot=64, pool_page_groups=pool_units,
                              tokens_per_page=P, deferred_reclaim=False, eager_lookahead_steps=0,
                              eager_page_groups=0, eager_idle_slots=0, low_watermark_frac=0.0,
                              admission_watermark_frac=0.0)
    pool = CachingPool(pool_units)
    groups = [CachedFullGroup(config, pool, 1, LayerGroup("full", 1, 0, 2)),
              CachedWindowGroup(config, pool, 1, LayerGroup("sliding", 1, W, 2), "free", False)]
    return HybridPrefixPolicy(groups, pool, 0.0, block_tokens=P)


def admit(policy: HybridPrefixPolicy, ids, prompt: int):
    """Admit a whole prompt as the engine does (credit, slot, prefix, step, donation); returns (slot, hit)."""
    hit_tokens, *cached = policy.admission_credit(ids, prompt)
    slot = policy.alloc_slot(prompt, None, 0, tuple(cached))
    assert slot is not None
    hit = policy.admit_prefix(slot, ids, prompt)
    assert hit.hit_tokens == hit_tokens
    policy.record_admission(hit, preempted=False)
    policy.computed[slot] = hit.hit_tokens
    assert policy.step({slot: prompt}) is not None
    policy.donate(slot, ids, prompt, prompt)
    assert policy.conservation_error() == 0
    return slot, hit


def test_an_identical_prompt_after_the_first_finished_hits_prompt_minus_one_in_whole_blocks():
    """A: 160 tokens (10 blocks, ids 1-10), one decode step (161 tokens: the sliding group drops blocks 0-6,
    freed with their hashes), finished. B, the same prompt: cap 159 tokens = 9 whole blocks; the full group
    holds blocks 0-9, the sliding group still holds 0-9 cached (0-6 freed but not reused), so the run 8, 7, 6
    satisfies the window: hit 144 tokens. B maps 9 full blocks and the 3 sliding ones (6-8)."""
    policy = small_policy(100)
    ids = list(range(1, 11))
    slot, hit = admit(policy, ids, 160)
    assert hit.hit_tokens == 0
    policy.computed[slot] = 160
    assert policy.step({slot: 161}) is not None
    window = policy.groups[1]
    assert (window.base[slot], window.mapped[slot]) == (7, 4)           # skipped(160) = 121 -> 7 blocks dropped
    policy.free_slot(slot, 0)
    policy.iteration_completed(0)
    assert policy.pool.free_units == 100 and policy.conservation_error() == 0
    assert len(policy.groups[0].entries) == 10 and len(window.entries) == 10
    assert policy.admission_credit(ids, 160) == (144, 9, 12)           # 9 + 3 free cached blocks touched
    slot, hit = admit(policy, ids, 160)
    assert (hit.hit_tokens, hit.cached_pages, hit.shared_pages) == (144, 9, 12)
    assert policy.groups[0].shared[slot] == 9       # block 9 is computed again; its key is cached: it stays private
    assert (window.base[slot], window.mapped[slot]) == (6, 4)           # blocks 6-8 hit + block 9 computed


def test_a_long_ago_prefix_whose_window_blocks_were_reused_gets_the_shorter_hit():
    """Pool of 59 units. A (ids 1-10, 160 tokens) runs one decode step and finishes; the free queue is then
    [37 uncached][s6 s5 s4 s3 s2 s1 s0][1][f9 ... f0][1][s9 s8 s7] (sN: sliding block N, fN: full block N;
    vLLM frees tail first, group after group). C (20 blocks of other ids, 320 tokens) takes 40 units from the
    head: the 37 uncached and s6, s5, s4, which lose their hashes. D, A's prompt again: the full groups hit 9
    blocks; the sliding group holds {0, 1, 2, 3, 7, 8, 9}: from block 8 the run 8, 7 breaks at 6, and 3, 2, 1
    reaches 3 blocks: the hit ends after block 3, 64 tokens (where every layer were full: 144)."""
    policy = small_policy(59)
    ids = list(range(1, 11))
    slot, _ = admit(policy, ids, 160)
    policy.computed[slot] = 160
    policy.step({slot: 161})
    policy.free_slot(slot, 0)
    policy.iteration_completed(0)
    admit(policy, list(range(101, 121)), 320)
    window = policy.groups[1]
    chain, cap = policy._chain(ids, 160)
    assert window.evictions == 3 and [p for p in range(10) if p in window.cached(chain)] == [0, 1, 2, 3, 7, 8, 9]
    assert longest_cache_hit_tokens([policy.group_caches(chain)[0]], cap) == 144      # the full groups alone
    slot, hit = admit(policy, ids, 160)
    assert hit.hit_tokens == 64
    assert policy.stats["window_limited_tokens"] == 144 - 64 and policy.stats["hit_tokens"] == 64
    assert (window.base[slot], window.mapped[slot]) == (1, 9)          # blocks 1-3 hit, 4-9 computed anew


def test_no_hash_ids_or_a_short_prompt_hits_nothing():
    policy = small_policy(40)
    assert policy.admission_credit((), 100) == (0, 0, 0)
    admit(policy, [1], 16)
    assert policy.admission_credit([1], 16) == (0, 0, 0)              # cap: prompt - 1 = 15 tokens < a block
    # a re-admission after a recompute preemption (seq_len 17) is capped at seq_len - 1 = 16 tokens, as vLLM v1's
    # num_tokens - 1: the block hits (1 page; none of its units in the free queue: the first request maps it)
    assert policy.admission_credit([1], 16, (0, 17)) == (16, 1, 0)


# ---- the property ----------------------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 6), st.integers(0, 40), st.integers(0, 2)),
                min_size=1, max_size=25),
       st.integers(30, 120))
def test_random_operations_conserve_every_group_and_bound_the_hits(ops, pool_units):
    """Random admissions (prompts over 4 shared prefixes), decode steps and finishes on a small pool: after
    every operation the pool and each group's cache are conserved; every hit is a whole number of blocks, at
    most ``prompt - 1`` and at most what the full groups alone would serve; finishing everything frees the pool."""
    policy = small_policy(pool_units, num_slots=3)
    running: dict[int, int] = {}
    for prefix, blocks, extra, action in ops:
        if action == 0 and len(running) < 3:
            ids = [1000 * prefix + b for b in range(blocks)]
            prompt = blocks * P + extra % P
            chain, cap = policy._chain(ids, prompt)
            full_alone = longest_cache_hit_tokens([policy.group_caches(chain)[0]], cap)
            hit_tokens, *cached = policy.admission_credit(ids, prompt)
            assert hit_tokens % P == 0 and hit_tokens <= prompt - 1 and hit_tokens <= full_alone
            slot = policy.alloc_slot(prompt, None, 0, tuple(cached))
            if slot is not None:
                hit = policy.admit_prefix(slot, ids, prompt)
                assert hit.hit_tokens == hit_tokens
                policy.computed[slot] = hit_tokens
                if policy.step({slot: prompt}) is None:
                    policy.free_slot(slot, 0)
                else:
                    policy.donate(slot, ids, prompt, prompt)
                    running[slot] = prompt
        elif action == 1 and running:
            slot = min(running)
            policy.computed[slot] = running[slot]
            target = running[slot] + extra
            if policy.step({slot: target}) is None:
                policy.free_slot(slot, 0)                              # preempted
                del running[slot]
            else:
                running[slot] = target
        elif running:
            slot = max(running)
            del running[slot]
            policy.free_slot(slot, 0)
        policy.iteration_completed(0)
        assert policy.conservation_error() == 0
    for slot in list(running):
        policy.free_slot(slot, 0)
    assert policy.conservation_error() == 0 and policy.pool.free_units == pool_units


# ---- through the simulator ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", [GEMMA, GPT_OSS])
def test_runs_share_prefixes_and_conserve(model):
    """Four requests on a real hybrid model (512-token hash blocks): the first computes ids [1, 2, 3]; every
    later one shares ids [1, 2] and hits min(2 x 512, prompt - 1) = 1,024 tokens (both groups still hold those
    blocks: nothing was reused), and the pool is conserved at the end."""
    frame = trace([(0.0, 1500, 20), (0.5, 1500, 10), (1.0, 1200, 5), (1.5, 1500, 3)])
    frame["hash_ids"] = [[1, 2, 3], [1, 2, 4], [1, 2], [1, 2, 3]]
    sim = Simulator(SimConfig(model=model, **parse_policy("paged:window=free,prefix=on")), frame,
                    vmm=constant_vmm(), compute=ConstantCompute(1000.0))
    req = sim.run().requests_frame()
    assert set(req["status"]) == {"finished"}
    assert list(req["prefix_hit_tokens"]) == [0, 1024, 1024, 1024]
    assert sim.policy.conservation_error() == 0
    assert sim.policy.pool.free_units == sim.policy.pool.total_units
    assert sim.policy.stats["lookups"] == 4 and sim.policy.stats["hit_tokens"] == 3072


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 4), st.integers(1, 400), st.integers(1, 400)),
                min_size=1, max_size=8))
def test_random_traces_terminate_and_conserve(rows):
    """Small random traces with shared hash ids on gpt-oss-20b with a tight KV budget: every request finishes,
    no hit exceeds ``prompt - 1``, and the pool is conserved."""
    frame = trace([(0.001 * i, blocks * 512 + extra, out) for i, (_, blocks, extra, out) in enumerate(rows)])
    frame["hash_ids"] = [[100 * prefix + b for b in range(blocks)] for prefix, blocks, _, _ in rows]
    config = SimConfig(model=GPT_OSS, memory_util_frac=0.093, **parse_policy("paged:window=free,prefix=on"))
    sim = Simulator(config, frame, vmm=constant_vmm(), compute=ConstantCompute(1000.0))
    req = sim.run().requests_frame()
    assert set(req["status"]) == {"finished"}
    assert (req["prefix_hit_tokens"] <= req["prompt_tokens"] - 1).all()
    assert sim.policy.conservation_error() == 0


# ---- refusals ------------------------------------------------------------------------------------------------------
def test_paged_window_free_builds_the_hybrid_prefix_policy():
    assert isinstance(build_policy(SimConfig(model=GEMMA, **parse_policy("paged:window=free,prefix=on"))),
                      HybridPrefixPolicy)


@pytest.mark.parametrize("model, policy, match", [
    ("models/jamba-v0.1.json", "paged:window=free,prefix=on", "jamba-v0.1 has a linear group .*MambaManager"),
    (GPT_OSS, "vattention:window=unmap,prefix=on", "paged .* only, not vattention"),
    (GPT_OSS, "paged:window=free,prefix=on,evict=radix-leaf", "prefix_evict=lru only"),
])
def test_unmodelled_combinations_are_refused_with_a_named_error(model, policy, match):
    with pytest.raises(ConfigError, match=match):
        SimConfig(model=model, **parse_policy(policy))
