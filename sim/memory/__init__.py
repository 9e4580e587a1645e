"""Memory managers: pure policy logic (no SimPy, no I/O) that returns :class:`sim.plan.Plan` objects.

All three policies share one interface (that of :class:`VAttentionPolicy`) and one accounting unit, the
*allocation unit* of :class:`sim.config.SimConfig` (``tokens_per_page`` tokens, ``page_group_bytes`` bytes):

* ``vattention``: a page group (one VMM page in each of the 2N' K/V sub-tensors), deferred reclamation,
  eager allocation, low watermark, asynchronous mapper;
* ``paged`` (vLLM block manager, Kwon et al. SOSP'23): a block of ``block_size_tokens`` tokens allocated on
  demand from the block pool and freed at once; no VMM calls, a block table per request;
* ``static`` (Orca / FasterTransformer): one unit of ``max_len`` tokens reserved at admission.

The paged and static managers are the same slot/pool bookkeeping with deferral, eager allocation and
watermark reclamation switched off, so their differences from vAttention are exactly the knobs.
"""
from sim.memory.hybrid import HybridPolicy, build_hybrid_policy
from sim.memory.prefix import PrefixCachingPolicy, PrefixHit
from sim.memory.vattention import VAttentionConfig, VAttentionPolicy


def build_policy(config) -> VAttentionPolicy:
    """The memory policy a :class:`sim.config.SimConfig` describes (with a prefix cache when
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
    if getattr(config, "hybrid_alloc", False):
        return build_hybrid_policy(config, policy_config)      # per-group sub-policies (sim.memory.hybrid)
    if config.prefix_caching:
        return PrefixCachingPolicy(policy_config, config.prefix_block_tokens, cow_partial=vattention)
    return VAttentionPolicy(policy_config)


__all__ = ["HybridPolicy", "PrefixCachingPolicy", "PrefixHit", "VAttentionConfig", "VAttentionPolicy", "build_policy"]
