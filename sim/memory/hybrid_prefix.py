"""Prefix caching with window-aware paged allocation (``paged:window=free,prefix=on``): vLLM v1's rule for a
prefix-cache hit over several KV-cache groups, and the hybrid policy that keeps one block cache per group
(the pool and the caches: :mod:`sim.memory.hybrid_prefix_pool`).

**The rule** (:func:`longest_cache_hit_tokens`), vLLM v1:

* a full-attention group hits the longest run of cached blocks from block 0
  (``FullAttentionManager.find_longest_cache_hit``, vllm/v1/core/single_type_kv_cache_manager.py);
* a sliding-window group scans its blocks right to left from that length and takes the first position where the
  ``cdiv(W - 1, block_size)`` blocks just before it are all cached (the blocks before those may be freed: null
  blocks); a run reaching block 0 is a hit even if shorter (``SlidingWindowManager.find_longest_cache_hit``);
* ``HybridKVCacheCoordinator.find_longest_cache_hit`` (vllm/v1/core/kv_cache_coordinator.py) bounds the window
  groups by the full groups' hit and takes the shorter one, rounded down to a multiple of every group's block size
  (one full and one other kind: one pass suffices, the coordinator's ``is_simple_hybrid``);
* at most ``prompt_tokens - 1`` tokens are served (``max_cache_hit_length``, vllm/v1/core/kv_cache_manager.py
  ``get_computed_blocks``), and only blocks inside the trace's full hash blocks (a hash id names 512 tokens).

**What the groups keep cached** (:class:`HybridPrefixPolicy`): a full group keeps every computed full prompt block
of a request cached after the request releases it; a sliding group's blocks that leave the window
(``remove_skipped_blocks``) are freed at once, tail first, but keep their hash in the free queue until they are
popped for reuse (vllm/v1/core/block_pool.py ``free_blocks`` / ``get_new_blocks`` / ``_maybe_evict_cached_block``).
So a second identical prompt hits ``prompt - 1`` tokens rounded down to a block, while a prompt sharing only an
old prefix hits where the window's blocks before the shared end are still cached.

**A hit at admission**: the full groups map the hit's blocks ``0..h-1`` (``touch``: a block with no reference
leaves the free queue), a sliding group the ``cdiv(W - 1, block)`` blocks before the hit end (its base moves there);
the admission check counts the blocks beyond the hit and the touched blocks that were free
(``SingleTypeKVCacheManager.get_num_blocks_to_allocate``: ``num_evictable_computed_blocks``); the hit's tokens are
not computed again. Chunked-local and linear (Mamba) groups are refused with ``prefix=on``
(:func:`sim.memory.hybrid_sizing.window_alloc_error`).
"""
from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from math import lcm

from sim.memory.hybrid import HybridPolicy, WindowGroupPolicy, _merge, _tag
from sim.memory.hybrid_prefix_pool import CachedPages, CachingPool
from sim.memory.plan import MapOp, Plan
from sim.memory.prefix import PrefixCachingPolicy, PrefixHit, count_admission


@dataclass(frozen=True)
class GroupCache:
    """What one KV-cache group holds cached for one prompt.

    Attributes:
        kind: the layer group's kind (``full``, ``sliding``, ``chunked``, ``linear``).
        block_tokens: tokens per block of the group (>= 1).
        cached_blocks: the indices of the prompt's blocks (block ``b`` covers tokens ``[b * block_tokens,
            (b + 1) * block_tokens)``) whose KV this group holds cached (any container of ints).
        window_tokens: W of a sliding group (tokens), 0 otherwise.
    """

    kind: str
    block_tokens: int
    cached_blocks: Container[int] = field(default_factory=frozenset)
    window_tokens: int = 0


def _full_hit_blocks(cache: GroupCache, max_blocks: int) -> int:
    blocks = 0
    while blocks < max_blocks and blocks in cache.cached_blocks:
        blocks += 1
    return blocks


def window_run_blocks(window_tokens: int, block_tokens: int) -> int:
    """Cached blocks a sliding group needs just before a hit's end: ``cdiv(W - 1, block)``
    (``SlidingWindowManager.sliding_window_contiguous_blocks``)."""
    return -(-(window_tokens - 1) // block_tokens)


def _sliding_hit_blocks(cache: GroupCache, max_blocks: int) -> int:
    """``SlidingWindowManager.find_longest_cache_hit``: right to left, the first end whose
    ``cdiv(W - 1, block)`` preceding blocks are cached; a run reaching block 0 is a hit."""
    needed = window_run_blocks(cache.window_tokens, cache.block_tokens)
    if needed <= 0:
        return max_blocks                      # W = 1: no earlier token is read
    run = 0
    for index in range(max_blocks - 1, -1, -1):
        if index in cache.cached_blocks:
            run += 1
            if run >= needed:
                return index + run
        else:
            run = 0
    return run                                 # the leading run (reaches block 0)


def longest_cache_hit_tokens(groups: Sequence[GroupCache], max_hit_tokens: int) -> int:
    """Tokens of a prompt every group can serve from the cache (module docstring: vLLM v1's rule).

    Args:
        groups: one :class:`GroupCache` per KV-cache group (at least one).
        max_hit_tokens: the most tokens a hit may cover (tokens): ``min(prompt - 1, full hash blocks' tokens)``.

    Returns:
        the hit in tokens, a multiple of every group's block size, ``<= max_hit_tokens`` and ``<=`` the full
        groups' hit alone.

    Raises:
        ValueError: for no group, a block size below 1 or a kind other than full and sliding.
    """
    if not groups:
        raise ValueError("a cache hit needs at least one group")
    if any(g.block_tokens < 1 for g in groups):
        raise ValueError("block_tokens must be >= 1 in every group")
    hit = max(0, max_hit_tokens)
    for g in groups:                           # the full groups bound the others
        if g.kind == "full":
            hit = _full_hit_blocks(g, hit // g.block_tokens) * g.block_tokens
    for g in groups:
        if g.kind == "sliding":
            hit = min(hit, _sliding_hit_blocks(g, hit // g.block_tokens) * g.block_tokens)
        elif g.kind != "full":
            raise ValueError(f"group kind {g.kind!r}: the hit rule is modelled for full and sliding groups only")
    align = lcm(*(g.block_tokens for g in groups))
    return hit // align * align


class HybridPrefixPolicy(HybridPolicy):
    """:class:`HybridPolicy` over a :class:`CachingPool` whose groups keep block caches, with the prefix-cache
    interface of :class:`sim.memory.prefix.PrefixCachingPolicy` (``admission_credit``, ``alloc_slot``,
    ``admit_prefix``, ``donate``, ``record_admission``, ``stats``) under vLLM v1's multi-group rule.
    ``stats["window_limited_tokens"]``: over first admissions, the tokens the full groups alone would have
    served beyond the hit (what the window groups' evicted blocks cost); ``stats["evictions"]``: cached bundles
    popped from the free queue for reuse, all groups.

    Args:
        groups: the sub-policies (each a :class:`CachedPages` full or sliding group), in group order.
        pool: the caching pool.
        admission_watermark_frac: as for :class:`HybridPolicy`.
        block_tokens: tokens per hash block of the trace (Mooncake: 512).

    Raises:
        ValueError: for a group without a block cache, or a hash block that is not a whole number of pages.
    """

    def __init__(self, groups: Sequence[CachedPages], pool: CachingPool, admission_watermark_frac: float = 0.0,
                 block_tokens: int = 512):
        super().__init__(groups, pool, admission_watermark_frac)
        if not all(isinstance(g, CachedPages) for g in self.groups):
            raise ValueError("every group of a hybrid prefix cache needs a block cache (full or sliding)")
        pool.owners = self.groups
        for index, g in enumerate(self.groups):
            g.init_cache(index, block_tokens)
        self.block_tokens = block_tokens
        self._chains: list[tuple] = [((), [])] * self.config.num_slots
        self._stats = {"lookups": 0, "hit_tokens": 0, "shared_pages": 0, "shared_maps": 0, "cow_tokens": 0,
                       "preempted_lookups": 0, "preempted_hit_tokens": 0, "window_limited_tokens": 0}
        self._full_groups_hit = 0     # of the last admit_prefix: the full groups' hit alone (tokens)

    @property
    def stats(self) -> dict:
        """The counters of :attr:`sim.memory.prefix.PrefixCachingPolicy.stats` (``evictions``: cached bundles
        popped from the free queue, every group) and ``window_limited_tokens`` (class docstring)."""
        return {**self._stats, "evictions": sum(g.evictions for g in self.groups)}

    # ---- the hit -----------------------------------------------------------------------------------
    def _chain(self, hash_ids: Sequence[int], prompt_tokens: int, own: tuple | None = None) -> tuple[list[int], int]:
        """The prompt's block chain over its full hash blocks, and the most tokens a hit may cover: ``prompt - 1``,
        or for a re-admission after a recompute preemption (``own = (owner, seq_len)``) ``seq_len - 1`` (vLLM
        v1 looks all the request's tokens up; no pages of its own beyond the hash blocks are kept here)."""
        full_blocks = min(len(hash_ids), prompt_tokens // self.block_tokens)
        cap_tokens = min(full_blocks * self.block_tokens, (prompt_tokens if own is None else own[1]) - 1)
        return PrefixCachingPolicy.block_chain(hash_ids[:full_blocks]), max(0, cap_tokens)

    def group_caches(self, chain: Sequence[int]) -> list[GroupCache]:
        """What each group holds cached for a prompt's block chain (pages of ``tokens_per_page`` tokens)."""
        per_page = self.config.tokens_per_page
        return [GroupCache(g.group.kind, per_page, g.cached(chain), g.group.window_tokens) for g in self.groups]

    def _lookup(self, hash_ids: Sequence[int], prompt_tokens: int, own: tuple | None = None) -> tuple[list[int], int, int]:
        """``(chain, hit, full_hit)``: the prompt's block chain, the hit (tokens) :func:`longest_cache_hit_tokens`
        gives now over every group, and the hit the full groups alone would give (what one group holding every
        layer in full would serve with the same blocks cached); the chain and the groups' views are built once.
        Changes nothing."""
        if not hash_ids:
            return [], 0, 0
        chain, cap_tokens = self._chain(hash_ids, prompt_tokens, own)
        if not cap_tokens:
            return chain, 0, 0
        caches = self.group_caches(chain)
        full = [c for c in caches if c.kind == "full"]
        return (chain, longest_cache_hit_tokens(caches, cap_tokens),
                longest_cache_hit_tokens(full, cap_tokens) if full else 0)

    def _hit_pages(self, g, hit_pages: int) -> range:
        """Pages of a hit of ``hit_pages`` pages group ``g`` maps: all of them (full), or the window's run before
        the end (sliding)."""
        if isinstance(g, WindowGroupPolicy):
            run = window_run_blocks(g.group.window_tokens, self.config.tokens_per_page)
            return range(max(0, hit_pages - run), hit_pages)
        return range(hit_pages)

    def admission_credit(self, hash_ids: Sequence[int], prompt_tokens: int,
                         own: tuple | None = None) -> tuple[int, int, int]:
        """``(hit_tokens, hit_pages, touched_free_units)``: the tokens a lookup would serve now, its pages, and
        the units of the hit's entries that sit in the free queue (touching them takes them off it:
        ``num_evictable_computed_blocks``). Changes nothing; passed on to :meth:`alloc_slot` as ``cached``;
        ``own`` as for :meth:`_chain`."""
        chain, hit, _ = self._lookup(hash_ids, prompt_tokens, own)
        if not hit:
            return 0, 0, 0
        pages = hit // self.config.tokens_per_page
        touched = sum(g.units for g in self.groups for page in self._hit_pages(g, pages)
                      if not g.entries[g.page_key(chain, page)])
        return hit, pages, touched

    # ---- admission -----------------------------------------------------------------------------------
    def _fresh_units_after_hit(self, slot: int, first_tokens: int, tokens: int, hit_pages: int) -> int:
        """Units beyond a hit of ``hit_pages`` pages (``first_tokens`` and ``tokens`` include it): full groups the
        pages past the hit; window groups the first chunk's pages past it, or a window and a chunk's worth
        ``ceil((W - 1 + chunk) / p) + 1`` for the later chunks (:meth:`HybridPolicy._fresh_units` with no hit)."""
        per_page, units = self.config.tokens_per_page, 0
        pages, first_pages = -(-tokens // per_page), -(-first_tokens // per_page)
        chunk = first_tokens - hit_pages * per_page
        for g in self.groups:
            if isinstance(g, WindowGroupPolicy):
                later = -(-(g.group.window_tokens - 1 + chunk) // per_page) + 1
                need = max(first_pages - hit_pages, min(pages - hit_pages, later))
            else:
                need = pages - hit_pages
            units += g.units * max(0, need - g.mapped[slot])
        return units

    def _pick(self, first_target_tokens, reserve_tokens, committed_page_groups, cached) -> int | None:
        hit_pages, touched_units = cached
        slot = self._growing[0]._pick_slot(first_target_tokens, reserve_tokens, committed_page_groups,
                                           (hit_pages, 0))
        if slot is None or any(not g._allocatable(slot) or g.active[slot] for g in self.groups):
            return None
        tokens = max(first_target_tokens, reserve_tokens or 0)
        committed = committed_page_groups * sum(g.units for g in self._growing)
        fresh = self._fresh_units_after_hit(slot, first_target_tokens, tokens, hit_pages)
        if fresh + touched_units + committed > self.pool.free_units - self._admission_units:
            return None
        return slot

    def admit_prefix(self, slot: int, hash_ids: Sequence[int], prompt_tokens: int, own: tuple | None = None) -> PrefixHit:
        """After :meth:`alloc_slot`: map the hit's cached blocks into ``slot`` in every group (module docstring).
        Returns a :class:`PrefixHit` whose plan is already applied to the accounting (maps of shared blocks:
        no VMM call in paged)."""
        chain, hit, self._full_groups_hit = self._lookup(hash_ids, prompt_tokens, own)
        self._chains[slot] = (hash_ids, chain) if hash_ids else ((), [])
        pages = hit // self.config.tokens_per_page
        plans, shared = [], 0
        for index, g in enumerate(self.groups):
            used = self._hit_pages(g, pages)
            g.map_entries(slot, used.start, [g.page_key(chain, page) for page in used])
            if len(used):
                plans.append(_tag(Plan(maps=(MapOp(slot, used.start, len(used)),)), index))
                shared += len(used)
        self._refresh((slot,))
        return PrefixHit(_merge(plans), hit, shared, 0, pages)

    def donate(self, slot: int, hash_ids: Sequence[int], prompt_tokens: int, computed_tokens: int) -> int:
        """Turn the slot's computed full prompt pages into cache entries in every group (pages a window group
        already dropped are gone). Returns the pages donated over all groups."""
        ids, chain = self._chains[slot]
        if ids is not hash_ids:
            chain = self._chain(hash_ids, prompt_tokens)[0]
            self._chains[slot] = (hash_ids, chain)
        full_pages = len(chain) * self.block_tokens // self.config.tokens_per_page
        return sum(g.donate(slot, chain, full_pages, computed_tokens) for g in self.groups)

    def record_admission(self, hit: PrefixHit, preempted: bool) -> None:
        """Count an admission that succeeded, as :meth:`PrefixCachingPolicy.record_admission`."""
        if count_admission(self._stats, hit, preempted):
            self._stats["window_limited_tokens"] += self._full_groups_hit - hit.hit_tokens

    def free_slot(self, slot: int, last_read_iteration: int) -> Plan:
        plan = super().free_slot(slot, last_read_iteration)
        self._chains[slot] = ((), [])
        return plan

    # ---- accounting ------------------------------------------------------------------------------------
    @property
    def physical_page_groups(self) -> int:
        """Units off the free queue: private blocks and cache entries some slot maps."""
        return sum(g.units * g.held_page_groups() for g in self.groups)

    def conservation_error(self) -> int:
        """As :meth:`HybridPolicy.conservation_error` (shared blocks counted once), and the free queue checked
        against its count and each group's unreferenced entries.

        Raises:
            RuntimeError: when the free queue or a group's cache is out of step with the counters.
        """
        if self.pool.queue_error():
            raise RuntimeError("free queue out of step with the free-unit count")
        for g in self.groups:
            if g.cache_error() or sum(g.shared) != sum(len(p) for p in g.slot_pages):
                raise RuntimeError(f"group {g.index} ({g.group.kind}): cache entries out of step with the pool")
        return super().conservation_error()


def build_hybrid_prefix_policy(config, base) -> HybridPrefixPolicy:
    """The :class:`HybridPrefixPolicy` of a :class:`sim.setup.config.SimConfig` with ``paged``, ``window=free``
    and ``prefix_caching`` (``base``: the :class:`sim.memory.vattention.VAttentionConfig` knobs
    :func:`sim.memory.build_policy` derived; groups and units as :func:`sim.memory.hybrid.build_hybrid_policy`).

    Raises:
        ValueError: for a chunked-local or linear group (refused earlier by the configuration's checks).
    """
    from dataclasses import replace
    from sim.memory.hybrid_prefix_pool import CachedFullGroup, CachedWindowGroup
    pool = CachingPool(config.pool_page_groups)
    subs = []
    for group, units in zip(config.layer_groups, config.group_units):
        sub_config = replace(base, pool_page_groups=max(1, config.pool_page_groups // units))
        if group.kind == "sliding":
            subs.append(CachedWindowGroup(sub_config, pool, units, group, "free", False))
        elif group.kind == "full":
            subs.append(CachedFullGroup(sub_config, pool, units, group))
        else:
            raise ValueError(f"a {group.kind} group has no prefix-cache rule here")
    return HybridPrefixPolicy(subs, pool, base.admission_watermark_frac, config.prefix_block_tokens)
