"""Memory managers: pure policy logic (no SimPy, no I/O) that returns :class:`sim.memory.plan.Plan` objects.

Public API: :func:`build_policy` (a :class:`sim.setup.config.SimConfig` -> its policy),
:class:`VAttentionPolicy` / :class:`VAttentionConfig` (:mod:`sim.memory.vattention`; its asynchronous mapper's
part, the background plan with reservations, commit and cancel, is the :class:`sim.memory.background.BackgroundMapping`
mixin),
:class:`PrefixCachingPolicy` / :class:`PrefixHit` (:mod:`sim.memory.prefix`; its cache-entry and eviction
bookkeeping is the :class:`sim.memory.prefix_entries.PrefixEntries` mixin, its one LRU order of free pages and entries
the :class:`sim.memory.free_queue.FreeQueue` mixin), :class:`HybridPrefixPolicy`
(:mod:`sim.memory.hybrid_prefix`: prefix caching with window-aware paged allocation, vLLM v1's multi-group hit rule), and the plans both executors carry
out (:mod:`sim.memory.plan`: ``Plan``, ``MapOp``, ``UnmapOp``, ``EMPTY_PLAN``). Imports nothing of ``sim`` but
itself (and :mod:`sim.lazy`, which loads the prefix and hybrid policies on first use).

All three policies share one interface (that of :class:`VAttentionPolicy`) and one accounting unit, the
*allocation unit* of :class:`sim.setup.config.SimConfig` (``tokens_per_page`` tokens, ``page_group_bytes`` bytes):

* ``vattention``: a page group (one VMM page in each of the 2N' K/V sub-tensors), deferred reclamation,
  eager allocation, low watermark, asynchronous mapper;
* ``paged`` (vLLM block manager, Kwon et al. SOSP'23): a block of ``block_size_tokens`` tokens allocated on
  demand from the block pool and freed at once; no VMM calls, a block table per request;
* ``static`` (Orca / FasterTransformer): one unit of ``max_len`` tokens reserved at admission (``window=reserve``
  for hybrid models: the unit is one reservation per layer group, :func:`sim.memory.hybrid_sizing.static_reserved_tokens`).

The paged and static managers are the same slot/pool bookkeeping with deferral, eager allocation and
watermark reclamation switched off, so their differences from vAttention are exactly the knobs.
"""
from sim.lazy import lazy_exports
from sim.memory.vattention import VAttentionConfig, VAttentionPolicy

# the prefix-caching and hybrid policies load on first use (PEP 562; build_policy imports the one it builds):
# a plain run does not import them (issue 32: start-up)
_EXPORTS = {"HybridPolicy": "sim.memory.hybrid", "HybridPrefixPolicy": "sim.memory.hybrid_prefix",
            "PrefixCachingPolicy": "sim.memory.prefix", "PrefixHit": "sim.memory.prefix"}
__getattr__ = lazy_exports(globals(), _EXPORTS)


def build_policy(config) -> VAttentionPolicy:
    """The memory policy a :class:`sim.setup.config.SimConfig` describes (with a prefix cache when
    ``config.prefix_caching``: vAttention shares pages and copies a partial last page; paged shares blocks)."""
    vattention = config.policy == "vattention"
    policy_config = VAttentionConfig(
        num_slots=config.max_batch_slots, max_pages_per_slot=config.max_pages_per_slot,
        pool_page_groups=config.pool_page_groups, tokens_per_page=config.tokens_per_page,
        deferred_reclaim=config.deferred_reclaim and vattention,
        eager_lookahead_steps=config.eager_lookahead_steps if vattention else 0,
        eager_page_groups=config.eager_page_groups if vattention else 0,
        eager_idle_slots=config.eager_idle_slots if vattention else 0,
        low_watermark_frac=config.low_watermark_frac if vattention else 0.0,
        admission_watermark_frac=0.0 if config.policy == "static" else config.admission_watermark_frac)
    if getattr(config, "hybrid_alloc", False) and config.policy == "static":
        return VAttentionPolicy(policy_config)   # one unit = one request's reservation over every group (hybrid_sizing)
    if getattr(config, "hybrid_alloc", False) and config.prefix_caching:
        from sim.memory.hybrid_prefix import build_hybrid_prefix_policy
        return build_hybrid_prefix_policy(config, policy_config)   # per-group block caches (sim.memory.hybrid_prefix)
    if getattr(config, "hybrid_alloc", False):
        from sim.memory.hybrid import build_hybrid_policy
        return build_hybrid_policy(config, policy_config)      # per-group sub-policies (sim.memory.hybrid)
    if config.prefix_caching:
        from sim.memory.prefix import PrefixCachingPolicy
        policy = PrefixCachingPolicy(policy_config, config.prefix_block_tokens, cow_partial=vattention)
        _attach_eviction_and_tiers(policy, config)
        return policy
    return VAttentionPolicy(policy_config)


def _attach_eviction_and_tiers(policy, config) -> None:
    """The eviction policy (``config.prefix_evict``, with 2 MiB regions of cache pages for ``page``) and the
    tier store below HBM (``config.kv_tiers``; pages of ``tokens_per_page x kv_bytes_per_token`` bytes)."""
    from sim.memory.eviction import VICTIMS
    from sim.memory.tiers import TierStore
    policy.victims = VICTIMS[config.prefix_evict]
    page_bytes = config.tokens_per_page * config.model_spec.sub_tensor_bytes_per_token(config.tp)
    policy.pages_per_region = max(1, (2 * 1024 * 1024) // page_bytes)
    if config.kv_tiers:
        policy.tier_store = TierStore(config.kv_tiers, config.tokens_per_page * config.model_spec.kv_bytes_per_token(config.tp),
                                      config.tokens_per_page, config.tier_write_policy)


__all__ = ["HybridPolicy", "HybridPrefixPolicy", "PrefixCachingPolicy", "PrefixHit", "VAttentionConfig", "VAttentionPolicy", "build_policy"]
