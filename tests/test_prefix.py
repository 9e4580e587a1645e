"""Prefix sharing of physical pages (vAttention) and block-level prefix caching (paged), with the
correctness traps seen in other simulators: prefix state kept for preempted requests inflating hits, and
hits counted only on the first prefill chunk."""
import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sim.setup.config import SimConfig
from sim.core.engine import Simulator
from sim.memory import PrefixCachingPolicy, VAttentionConfig
from tests.helpers import ConstantCompute, constant_vmm, trace


def run(rows, hash_ids, **config):
    frame = trace(rows)
    frame["hash_ids"] = hash_ids
    out = Simulator(SimConfig(prefix_caching=True, **config), frame, vmm=constant_vmm(),
                    compute=ConstantCompute(1000.0)).run()
    return out, out.requests_frame().set_index("request_id"), out.iterations_frame()


R1 = (0.0, 2600, 2)        # 5 full 512-token blocks (2,560 tokens) + 40 tokens
R2 = (1.0, 3000, 2)        # arrives after r1 finished
IDS1 = [1, 2, 3, 4, 5, 6]
IDS2 = [1, 2, 3, 9, 10, 11]


def test_full_pages_shared_and_partial_page_copied_on_write():
    """2 MiB pages hold 1,024 tokens = 2 blocks. r1 donates its full pages inside its full blocks: page 0
    (blocks 1,2) and page 1 (blocks 3,4). r2 shares blocks 1,2,3: page 0 is mapped shared (1,024 tokens)
    and page 1 matches only its first block, so its first 512 tokens are copied into a private page
    (copy-on-write): 1,536 prompt tokens are not computed again; r2 computes 3,000 - 1,536 = 1,464."""
    out, req, it = run([R1, R2], [IDS1, IDS2], sync_mapping=True)
    assert list(req["prefix_hit_tokens"]) == [0, 1536]
    assert out.counters["prefix_shared_pages"] == 1 and out.counters["prefix_cow_tokens"] == 512
    # r2 took r1's idle slot, which already maps page 0: sharing it added no map call
    assert out.counters["prefix_shared_maps"] == 0
    assert out.counters["cow_bytes"] == 512 * 131072
    assert it["prefill_tokens"].sum() == 2600 + 3000 - 1536


def test_paged_block_prefix_caching_recomputes_no_partial_block():
    """vLLM-style: 16-token blocks inside the 3 shared 512-token blocks are reused: 1,536 tokens; blocks
    are never copied (a 512-token hash block is a whole number of 16-token blocks)."""
    out, req, _ = run([R1, R2], [IDS1, IDS2], policy="paged")
    assert list(req["prefix_hit_tokens"]) == [0, 1536]
    assert out.counters["prefix_cow_tokens"] == 0


def test_hits_counted_once_across_prefill_chunks():
    """Token budget 256: r2's remaining 1,464 prompt tokens take 6 chunks; the 1,536 hit tokens are counted
    once, at admission, and skipped by every chunk (not only the first)."""
    out, req, it = run([R1, R2], [IDS1, IDS2], sync_mapping=True, token_budget=256)
    assert req.loc[1, "prefix_hit_tokens"] == 1536
    assert it["prefill_tokens"].sum() == 2600 + 3000 - 1536


def test_concurrent_requests_share_physical_pages():
    """Two requests with the same 4-block prefix in flight together: the second maps r1's two donated
    pages; physical page groups in use are fewer than the pages mapped into slots."""
    rows = [(0.0, 2600, 400), (0.5, 2600, 400)]
    out, req, it = run(rows, [IDS1, IDS1], sync_mapping=True)
    assert req.loc[1, "prefix_hit_tokens"] == 2048      # pages 0 and 1 (blocks 1-4); page 2 is not full-block
    both = it[it["num_running"] == 2]
    assert (both["mapped_page_groups"] < 2 * 3).all()   # 3 pages per slot, 2 of them shared


def test_physical_pages_never_exceed_the_pool_under_pressure():
    """A pool of 6 page groups, requests sharing prefixes and growing past it: eviction and idle-slot
    reclamation must keep physical pages (private + cached) within the pool at every iteration."""
    import numpy as np
    cfg = SimConfig()
    util = (cfg.model_spec.weight_bytes() + 6 * 64 * 2 * 1024 * 1024 + 1) / cfg.gpu_spec.hbm_bytes
    rng = np.random.default_rng(3)
    rows = [(i * 0.003, int(p), int(o)) for i, (p, o) in enumerate(zip(rng.integers(600, 3000, 40), rng.integers(5, 400, 40)))]
    ids = [[int(rng.integers(0, 2))] + [int(x) for x in rng.integers(0, 3, 6)] for _ in range(40)]
    for sync in (True, False):
        out, req, it = run(rows, ids, memory_util_frac=util, admission_watermark_frac=0.0, sync_mapping=sync)
        assert (it["mapped_page_groups"] <= 6).all() and (it["free_page_groups"] >= 0).all()
        assert set(req["status"]) <= {"finished", "rejected"}
        assert req["prefix_hit_tokens"].sum() > 0


def _policy(pool=8, slots=3):
    return PrefixCachingPolicy(VAttentionConfig(num_slots=slots, max_pages_per_slot=6, pool_page_groups=pool,
                                                tokens_per_page=1024, admission_watermark_frac=0.0,
                                                low_watermark_frac=0.0, eager_page_groups=0), block_tokens=512)


def test_preempted_request_gets_no_hit_after_its_pages_were_evicted():
    """The trap: a simulator that remembers 'this request already computed its prefix' would count a hit
    after preemption even though the pages are gone. Here hits come only from the cache's real content."""
    p = _policy(pool=4)
    slot = p.alloc_slot(2048)
    p.admit_prefix(slot, IDS1, 2600)
    p.step({slot: 2600})
    assert p.donate(slot, IDS1, 2600, 2600) == 2          # pages 0 and 1 cached
    p.free_slot(slot, 0)                                   # preempted (recompute): KV dropped, pages cached
    p.iteration_completed(0)
    other = p.alloc_slot(4096)                             # best fit: slot 0 itself (3 pages mapped)
    p.admit_prefix(other, [7, 8, 9, 10, 11, 12, 13, 14], 4096)   # unrelated prompt: stale shared pages dropped
    p.step({other: 4096})                                  # needs all 4 groups: the cached entries are evicted
    assert p.cache == {} and p.conservation_error() == 0
    p.free_slot(other, 1)
    p.iteration_completed(1)
    again = p.alloc_slot(2048)
    assert p.admit_prefix(again, IDS1, 2600).hit_tokens == 0


def test_last_prompt_token_is_always_computed():
    """A prompt made only of cached full blocks still computes its last token (it produces the logits)."""
    p = _policy()
    slot = p.alloc_slot(2048)
    p.admit_prefix(slot, [], 2048)
    p.step({slot: 2048})
    p.donate(slot, [1, 2, 3, 4], 2048, 2048)
    p.free_slot(slot, 0)
    p.iteration_completed(0)
    hit = p.admit_prefix(p.alloc_slot(2048), [1, 2, 3, 4], 2048)
    # at most prompt - 1 = 2,047 tokens come from the cache (vLLM v1's cap): page 0 shared whole, and of the
    # fully matching page 1 all but the last token copied (not a whole 512-token hash block recomputed)
    assert hit.hit_tokens == 2047 and hit.cow_tokens == 1023


class PrefixMachine(RuleBasedStateMachine):
    """Random admissions with prefixes from a small alphabet, growth, donation, frees and completions."""

    def __init__(self):
        super().__init__()
        self.p = _policy(pool=10, slots=3)
        self.active = {}       # slot -> (ids, prompt, computed)
        self.iteration = 0

    @rule(ids=st.lists(st.integers(0, 2), min_size=1, max_size=8), prompt_blocks=st.integers(1, 8))
    def admit(self, ids, prompt_blocks):
        prompt = min(prompt_blocks, len(ids)) * 512 - 100
        slot = self.p.alloc_slot(1)
        if slot is None:
            return
        hit = self.p.admit_prefix(slot, ids, prompt)
        assert hit.hit_tokens < prompt
        plan = self.p.step({slot: hit.hit_tokens + 1})
        if plan is None:
            self.p.free_slot(slot, self.p.completed_iteration)
            return
        self.active[slot] = (ids, prompt, hit.hit_tokens + 1)

    @precondition(lambda self: self.active)
    @rule(data=st.data())
    def grow(self, data):
        slot = data.draw(st.sampled_from(sorted(self.active)))
        ids, prompt, computed = self.active[slot]
        target = min(computed + data.draw(st.integers(1, 1500)), 6 * 1024)
        if self.p.step({slot: target}) is None:
            return
        self.active[slot] = (ids, prompt, target)
        self.p.donate(slot, ids, prompt, min(target, prompt))
        assert self.p.mapped[slot] * 1024 >= target

    @precondition(lambda self: self.active)
    @rule(data=st.data())
    def finish(self, data):
        slot = data.draw(st.sampled_from(sorted(self.active)))
        self.p.free_slot(slot, self.iteration)
        del self.active[slot]

    @rule()
    def complete(self):
        self.p.iteration_completed(self.iteration)
        self.iteration += 1

    @invariant()
    def conserved_and_references_consistent(self):
        assert self.p.conservation_error() == 0 and self.p.free_page_groups >= 0
        for key, slots in self.p.cache.items():
            assert slots == {s for s in range(3) if key in self.p.slot_keys[s]}
        for s in range(3):
            assert self.p.shared[s] == len(self.p.slot_keys[s]) <= self.p.mapped[s]
        # the incremental indexes agree with a recount
        assert list(self.p._unmapped) == [k for k in self.p._unmapped if not self.p.cache[k]]
        assert set(self.p._unmapped) == {k for k, slots in self.p.cache.items() if not slots}
        for key, slots in self.p.cache.items():
            assert self.p._active_refs[key] == sum(self.p.active[s] for s in slots)
        assert self.p._freeable == sum(1 for k in self.p.cache if self.p._active_refs[k] == 0)


TestPrefixMachine = PrefixMachine.TestCase
TestPrefixMachine.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)


def test_the_printed_summary_has_a_prefix_cache_line_only_with_prefix_caching():
    """Hit ratio, prefill tokens saved and evictions printed beside the table (a new user found them only in
    summary.json); a run without prefix caching prints no such line, a tiered run its ``tier hbm`` line instead."""
    from analysis.summary import tier_lines

    cached = {"prefix_hit_ratio": 0.0536, "prefill_tokens_saved": 228864, "prefix_evictions": 201364}
    assert tier_lines(cached) == [("prefix cache", "hit 5.4% of prompt tokens (228,864 prefill tokens saved), "
                                                   "201,364 evictions")]
    assert tier_lines({}) == []
    tiered = tier_lines({**cached, "tier_hbm_demotions": 3})
    assert [label for label, _ in tiered] == ["tier hbm"]
    # re-admission hits are printed apart; no admitted request gives no ratio (it printed "hit nan%")
    again = tier_lines({**cached, "prefill_tokens_saved_preempted": 944})
    assert again[0][1] == "hit 5.4% of prompt tokens (228,864 prefill tokens saved; 944 re-hit after preemption), " \
                          "201,364 evictions"
    none = tier_lines({"prefix_hit_ratio": float("nan"), "prefill_tokens_saved": 0, "prefix_evictions": 0})
    assert none[0][1] == "hit n/a, no request admitted (0 prefill tokens saved), 0 evictions"


def test_a_copy_takes_the_key_of_an_evicted_original():
    """Two slots compute page 0 of one prefix in the same iteration: the second's page becomes a copy and its
    page 1 is chained after the original's key. When the original is evicted, the copy takes its key (vLLM keeps
    the other blocks of a hash reachable): a later prompt still hits both pages (helper-57: it hit 0)."""
    p = _policy(pool=8)
    a, b = p.alloc_slot(1024), p.alloc_slot(2048)
    p.admit_prefix(a, [], 1024)
    p.admit_prefix(b, [], 2048)
    p.step({a: 1024, b: 2048})
    assert p.donate(a, [1, 2], 1024, 1024) == 1                 # page 0: (0, chain [1, 2])
    assert p.donate(b, [1, 2, 3, 4], 2048, 2048) == 2           # a copy of page 0, then page 1
    assert len(p.cache) == 3 and p.conservation_error() == 0
    original = p.slot_keys[a][0]
    for slot in (a, b):
        p.free_slot(slot, 0)
    p.iteration_completed(0)
    p._unmap_all(a)                                             # slot a's reference goes: the original is unmapped
    p._unmapped.move_to_end(original, last=False)
    assert p._evict(1) == 1                                     # the original, least recently used
    assert original in p.cache and len(p.cache) == 2           # the copy now holds the original's key
    assert p.slot_keys[b][0] == original
    keys, _ = p.lookup([1, 2, 3, 4], 2049)
    assert len(keys) == 2                                       # both pages reachable again
    assert p.conservation_error() == 0
