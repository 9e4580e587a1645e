"""Prefix caching as vLLM v1's ``KVCacheManager`` does it (issue 28, items 1-4): tail-first eviction,
contiguous hits, the ``prompt - 1`` cap in cache-block units, and admission that credits cached pages.
Expected values are hand-computed from the page and block sizes in each test."""
import pytest

from sim.setup.config import SimConfig
from sim.core.engine import Simulator
from sim.memory import PrefixCachingPolicy, VAttentionConfig
from tests.helpers import ConstantCompute, constant_vmm, trace


def _policy(pool: int, tokens_per_page: int, cow: bool, slots: int = 3) -> PrefixCachingPolicy:
    config = VAttentionConfig(num_slots=slots, max_pages_per_slot=4096 // tokens_per_page, pool_page_groups=pool,
                              tokens_per_page=tokens_per_page, admission_watermark_frac=0.0,
                              low_watermark_frac=0.0, eager_page_groups=0, deferred_reclaim=False)
    return PrefixCachingPolicy(config, block_tokens=512, cow_partial=cow)


def _cache_prompt(p: PrefixCachingPolicy, ids: list[int], prompt: int, iteration: int = 0) -> int:
    """Admit, compute and donate a whole prompt, then free the slot (deferred reclamation off: its pages
    are unmapped and become evictable cache entries). Returns the pages donated."""
    slot = p.alloc_slot(prompt)
    p.admit_prefix(slot, ids, prompt)
    assert p.step({slot: prompt}) is not None
    donated = p.donate(slot, ids, prompt, prompt)
    p.free_slot(slot, iteration)
    p.iteration_completed(iteration)
    return donated


@pytest.mark.parametrize("cow", [False, True], ids=["paged", "vattention"])
def test_eviction_is_tail_first_so_the_chain_head_stays_reachable(cow):
    """512-token pages = hash blocks, a pool of 3: [1, 2, 3] is cached whole; one eviction must drop block 3
    (the least recently used: freed last-first), so [1, 2, 3] later hits blocks 1 and 2 = 1,024 tokens."""
    p = _policy(pool=3, tokens_per_page=512, cow=cow)
    assert _cache_prompt(p, [1, 2, 3], 1536) == 3
    assert p._evict(1) == 1
    assert sorted(page for page, _ in p.cache) == [0, 1]
    hit = p.admit_prefix(p.alloc_slot(1536), [1, 2, 3], 1536)
    assert hit.hit_tokens == 1024 and p.conservation_error() == 0


def test_a_partial_match_never_credits_a_later_page():
    """1,024-token pages hold two 512-token blocks. [1, 2, 3, 4] caches pages 0 and 1. If page 0 is gone (an
    LRU order where page 1 was used later), [1, 2, 3, 9] matches no contiguous page: its hit is 0, not the
    1,536 tokens of blocks 1-3 that page 1's partial index would credit from the wrong page."""
    p = _policy(pool=4, tokens_per_page=1024, cow=True)
    assert _cache_prompt(p, [1, 2, 3, 4], 2048) == 2
    page0 = next(key for key in p.cache if key[0] == 0)
    p._unmapped.move_to_end(page0, last=False)          # page 0 least recently used
    assert p._evict(1) == 1 and page0 not in p.cache
    keys, partial = p.lookup([1, 2, 3, 9], 2048)
    assert keys == [] and partial == 0


def test_a_partial_match_extends_into_the_next_page_only_by_less_than_a_page():
    """[1, 2, 3, 4] cached (pages 0 and 1); [1, 2, 3, 9]: page 0 whole (1,024) plus block 3 = the first 512
    tokens of page 1, copied on write: 1,536, at most one page beyond the full pages."""
    p = _policy(pool=4, tokens_per_page=1024, cow=True)
    _cache_prompt(p, [1, 2, 3, 4], 2048)
    keys, partial = p.lookup([1, 2, 3, 9], 2048)
    assert len(keys) == 1 and partial == 512


@pytest.mark.parametrize("tokens_per_page, cow, expected", [
    (16, False, 1520),     # vLLM v1: floor((1,536 - 1) / 16) x 16 in 16-token blocks
    (512, False, 1024),    # floor(1,535 / 512) x 512
    (1024, True, 1535),    # vAttention: page 0 shared, 511 tokens of the fully matching page 1 copied
])
def test_a_fully_matched_prompt_recomputes_only_what_the_engine_does(tokens_per_page, cow, expected):
    """A prompt of exactly three cached 512-token blocks (1,536 tokens): the hit is capped at prompt - 1 =
    1,535 tokens in cache-page units (vLLM v1 ``get_computed_blocks``: ``max_cache_hit_length = num_tokens
    - 1``), never a whole 512-token trace block less."""
    p = _policy(pool=200, tokens_per_page=tokens_per_page, cow=cow)
    if tokens_per_page == 1024:
        _cache_prompt(p, [1, 2, 3, 4], 2048)          # caches pages 0 and 1 (blocks 1-4)
    else:
        _cache_prompt(p, [1, 2, 3], 1536)
    hit = p.admit_prefix(p.alloc_slot(1536), [1, 2, 3], 1536)
    assert hit.hit_tokens == expected


@pytest.mark.parametrize("admission", ["whole-prompt", "chunk"])
def test_admission_asks_only_for_the_pages_beyond_a_cached_prefix(admission):
    """Llama-3-8B, 2 MiB pages of 1,024 tokens, a pool of 5 page groups. Request 0 (3,500 prompt + 100 output
    = 4 pages) donates pages 0-2 (its 6 full 512-token blocks). Request 1 has the same prompt: 3 pages are
    served by those entries, so it needs 4 - 3 = 1 fresh page group, and 1 is free while request 0 runs. It
    must be admitted at once, not after request 0 finishes (vLLM v1 allocates only the blocks beyond the hit)."""
    cfg = SimConfig()
    util = (cfg.model_spec.weight_bytes() + 5 * 64 * 2 * 1024 * 1024 + 1) / cfg.gpu_spec.hbm_bytes
    frame = trace([(0.0, 3500, 100), (0.01, 3500, 2)])
    frame["hash_ids"] = [list(range(1, 8)), list(range(1, 8))]
    out = Simulator(SimConfig(prefix_caching=True, memory_util_frac=util, admission_watermark_frac=0.0,
                              low_watermark_frac=0.0, eager_page_groups=0, sync_mapping=True,
                              admission=admission),
                    frame, vmm=constant_vmm(), compute=ConstantCompute(1000.0)).run()
    req = out.requests_frame().set_index("request_id")
    assert req.loc[1, "prefix_hit_tokens"] == 3072
    assert req.loc[1, "first_scheduled_at_us"] < req.loc[0, "completion_at_us"]
    assert set(req["status"]) == {"finished"}
