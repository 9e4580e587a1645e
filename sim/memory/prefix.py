"""Prefix sharing on vAttention: one physical page group mapped into several slots.

Requests whose leading prefix blocks match (Mooncake ``hash_ids``: ids of 512-token prompt blocks, equal
leading ids = equal prefix) map the *same* physical page groups into their slots for the shared full pages.
domain.md: one handle mapped at two virtual addresses shows the same data, so this is feasible with the
public VMM API; vAttention itself does not do it.

Layout of a slot with sharing (pages are still a prefix ``0..mapped-1``)::

    page:   0        1        2      | 3        4 ...
            [cached] [cached] [cached] | [private][private]
            <-------- shared[s] ------>|<---- written by this request ---->

* A *cache entry* is a physical page group holding one full page of KV for a key (the block ids covering
  the page); it carries the set of slots that map it. Entries mapped by no slot stay cached (handles kept,
  unmapped) and are evicted LRU when pages run short (free list below the low watermark, or a step short).
* Admission looks up the longest cached run of pages for the request's blocks, maps those entries into the
  slot and skips their tokens (prefill tokens saved). If the match ends inside a page (blocks smaller than
  a page), the cached page holding the partial match is **copied** into a private page (copy-on-write of a
  partially shared last page); ``cow_partial=False`` (vLLM's block-level prefix caching) recomputes it.
* A request's own prompt pages become cache entries as soon as they are full and inside its full blocks.
* Preempted or finished requests keep nothing but real cache entries: a later lookup only hits what is
  actually still cached (no stale per-request prefix state).

Conservation: ``free + private mapped + in flight + cached == pool`` where ``private mapped = mapped - shared``.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from sim.memory.eviction import VICTIMS
from sim.memory.vattention import VAttentionConfig, VAttentionPolicy
from sim.memory.plan import MapOp, Plan, UnmapOp
from sim.memory.donation import Donation
from sim.memory.free_queue import FreeQueue
from sim.memory.prefix_entries import PrefixEntries


@dataclass
class PrefixHit:
    """Result of an admission with prefix lookup.

    Attributes:
        plan: unmaps of the slot's stale pages and maps of the shared entries (and of the COW page).
        hit_tokens: prompt tokens whose KV is reused (not computed again).
        shared_pages: cached page groups mapped anew into the slot (map calls added by sharing: x 2N').
        cow_tokens: tokens copied from a partially matching cached page into a private one.
        cached_pages: cached page groups the slot uses (fresh pages saved), mapped anew or already mapped.
    """

    plan: Plan
    hit_tokens: int = 0
    shared_pages: int = 0
    cow_tokens: int = 0
    cached_pages: int = 0


def count_admission(stats: dict, hit: PrefixHit, preempted: bool) -> bool:
    """Add one successful admission's hit to a prefix cache's ``stats``: a re-admission after a preemption under
    ``preempted_lookups`` / ``preempted_hit_tokens`` (vLLM v1's ``PrefixCacheStats`` keeps them apart), any
    other under ``lookups``, ``hit_tokens``, ``shared_pages`` and ``shared_maps``. Returns whether it was the
    latter (the caller adds its own counters then). Shared by :class:`PrefixCachingPolicy` and
    :class:`sim.memory.hybrid_prefix.HybridPrefixPolicy`."""
    if preempted:
        stats["preempted_lookups"] += 1
        stats["preempted_hit_tokens"] += hit.hit_tokens
        return False
    stats["lookups"] += 1
    stats["hit_tokens"] += hit.hit_tokens
    stats["shared_pages"] += hit.cached_pages
    stats["shared_maps"] += hit.shared_pages
    return True


class PrefixCachingPolicy(Donation, PrefixEntries, FreeQueue, VAttentionPolicy):
    """vAttention (or, with no VMM cost charged, a paged block manager) with a shared prefix cache.

    Args:
        config: as for :class:`VAttentionPolicy`.
        block_tokens: tokens per hash block of the trace (512 for Mooncake).
        cow_partial: copy a partially matching last page (vAttention) instead of recomputing it (vLLM).
    """

    def __init__(self, config: VAttentionConfig, block_tokens: int = 512, cow_partial: bool = True):
        super().__init__(config)
        self.block_tokens = block_tokens
        self.cow_partial = cow_partial
        self.shared = [0] * config.num_slots
        self.slot_keys: list[list[tuple]] = [[] for _ in range(config.num_slots)]
        self.cache: OrderedDict[tuple, set[int]] = OrderedDict()   # key -> slots mapping it; LRU order
        self._partial_index: dict[int, tuple] = {}                 # block-prefix chain id ending inside a page -> key
        self._partials_of: dict[tuple, list[int]] = {}              # key -> its partial-index entries
        # incremental indexes (the cache can hold ~10^5 entries for 16-token blocks):
        self._unmapped: OrderedDict[tuple, None] = OrderedDict()    # entries no slot maps: evictable, LRU first
        self._active_refs: dict[tuple, int] = {}                    # entry -> active slots mapping it
        self.duplicate_refs = 0                                      # sum over entries of (active refs - 1)+
        self._freeable = 0                                          # entries no active slot maps
        self._unprepared: set[int] = set()      # allocated slots that admit_prefix has not prepared yet
        # eviction policy and lower tiers (sim.memory.eviction, sim.memory.tiers); the chain's parent links
        self.victims = VICTIMS["lru"]
        self.pages_per_region = 1
        self.tier_store = None
        self._parent: dict[tuple, tuple] = {}
        self._children: dict[tuple, int] = {}
        # shared_pages: pages served from the cache (fresh pages saved); shared_maps: of those, the ones mapped
        # anew into the slot (map calls sharing adds; a slot that already maps the entry needs none)
        self.stats = {"lookups": 0, "hit_tokens": 0, "shared_pages": 0, "shared_maps": 0, "cow_tokens": 0,
                      "evictions": 0, "preempted_lookups": 0, "preempted_hit_tokens": 0}
        self.lookup_version = 0      # bumped when a key enters or leaves the cache or the partial index
        self._duplicates = 0         # copies of a cached page donated by a request that computed it too (donate)
        self._copies: dict[tuple, list[tuple]] = {}   # key -> its cached copies' keys (the first takes it over)
        # one LRU order over free pages and evictable entries (sim.memory.free_queue, evict=lru only)
        self._stamp, self._free_runs, self._free_tracked = 0, deque(), 0
        self._last_lookup: tuple | None = None    # (lookup_version, hash_ids, prompt_tokens, result)

    @property
    def caches_when_scheduled(self) -> bool:
        """Whether the engine donates a request's full prompt pages when it schedules them (vLLM v1's
        ``allocate_slots`` -> ``cache_blocks``, before the forward pass: paged, ``cow_partial`` off) rather than
        once computed (vAttention: its copy-on-write of a partial page copies before the forward pass)
        (:meth:`sim.core.admission.Admission._donate_scheduled`)."""
        return not self.cow_partial

    # ---- keys ------------------------------------------------------------------------------------------
    @staticmethod
    def block_chain(hash_ids: Sequence[int]) -> list[int]:
        """``chain[b]`` identifies the block prefix ``hash_ids[:b + 1]``: ``hash((chain[b - 1], id_b))``, O(1)
        per block (Python's hash of a tuple of ints is deterministic; a 64-bit collision is negligible)."""
        chain, previous = [], 0
        for block_id in hash_ids:
            previous = hash((previous, int(block_id)))
            chain.append(previous)
        return chain

    def page_key(self, chain: Sequence[int], page: int) -> tuple[int, int]:
        """Key of page ``page``: ``(page, chain[last block covering tokens [0, (page + 1) * tokens_per_page)])``
        (the page index matters: pages smaller than a block share their covering blocks)."""
        return page, chain[-(-(page + 1) * self.config.tokens_per_page // self.block_tokens) - 1]

    # ---- accounting ------------------------------------------------------------------------------------
    def conservation_error(self) -> int:
        private = sum(self.mapped) - sum(self.shared)
        held = private + sum(self.in_flight_maps) + self.in_flight_unmaps + len(self.cache)
        return self.config.pool_page_groups - held - self.free_page_groups

    # ---- admission ---------------------------------------------------------------------------------------
    def alloc_slot(self, first_target_tokens: int, reserve_tokens: int | None = None,
                   committed_page_groups: int = 0, cached: tuple[int, int] = (0, 0)) -> int | None:
        """As :meth:`VAttentionPolicy.alloc_slot` (``cached`` from :meth:`admission_credit`); the slot must
        then be prepared by :meth:`admit_prefix` (with no ids to only drop its stale shared pages) before it
        is stepped."""
        slot = super().alloc_slot(first_target_tokens, reserve_tokens, committed_page_groups, cached)
        if slot is not None:
            self._unprepared.add(slot)
        return slot

    def lookup(self, hash_ids: Sequence[int], prompt_tokens: int,
               own: tuple[int, int] | None = None) -> tuple[list[tuple], int]:
        """The cached prefix of a prompt: the longest contiguous run of cached full pages, and the tokens of
        a partial match inside the *next* page (0 unless ``cow_partial``).

        The hit follows vLLM v1 (``KVCacheManager.get_computed_blocks``, vllm/v1/core/kv_cache_manager.py):
        at most ``prompt_tokens - 1`` tokens are served from the cache, in whole cache pages (blocks), so a
        fully matched prompt recomputes only its last token's page remainder, not a whole trace hash block.
        Only pages inside the prompt's full hash blocks can match (a block's id names its 512 tokens).
        A partial match extends the contiguous pages into the next page only, by at most one page's tokens
        minus one, and only from a cached entry *at that page index* (never content of a later page).

        ``own = (owner, seq_len_tokens)``: the lookup of a request re-admitted after a recompute preemption.
        vLLM v1 hashes every full block of the request's tokens, its prompt's and its output's
        (``Request.block_hashes``), so it looks up ``seq_len - 1`` tokens: the prompt's hash blocks are capped
        there (not at ``prompt - 1``), and after them, matched in full, the run goes on through the pages
        :meth:`keep_own_pages` cached under the request's own keys (paged: :attr:`caches_own_pages`; vAttention
        keeps none, and a partial match inside the hash blocks is copied as for a first admission).

        Returns:
            ``(keys, partial_tokens)``: the cache keys of the matched pages (page order) and the partial tokens.
        """
        per_page, block = self.config.tokens_per_page, self.block_tokens
        full_blocks = min(len(hash_ids), prompt_tokens // block)
        last_tokens = prompt_tokens if own is None else own[1]
        cap_tokens = min(full_blocks * block, last_tokens - 1)    # vLLM v1: max_cache_hit_length = n - 1
        if own is None and cap_tokens < per_page and not self.cow_partial:
            return [], 0
        chain = self.block_chain(hash_ids[:full_blocks])
        keys = []
        for page in range(cap_tokens // per_page):
            key = self.page_key(chain, page)
            if key not in self.cache:
                break
            keys.append(key)
        if own is not None:
            if len(keys) == full_blocks * block // per_page:     # the prompt's hash blocks matched in full
                for page in range(len(keys), (own[1] - 1) // per_page):
                    key = (page, "own", own[0])
                    if key not in self.cache:
                        break
                    keys.append(key)
            if not self.cow_partial or len(keys) * per_page >= cap_tokens:
                return keys, 0
        partial = 0
        if self.cow_partial:
            start = len(keys) * per_page
            if (len(keys) + 1) * per_page <= full_blocks * block and self.page_key(chain, len(keys)) in self.cache:
                return keys, cap_tokens - start        # the next page matches whole: all the cap leaves of it
            for blocks in range(min(full_blocks, -(-cap_tokens // block)), start // block, -1):
                entry = self._partial_index.get(chain[blocks - 1])
                if entry is not None and entry[0] == len(keys):      # the next page, nothing later
                    partial = min(blocks * block, cap_tokens) - start
                    break
        return keys, max(0, min(partial, per_page - 1))

    def _lookup_once(self, hash_ids: Sequence[int], prompt_tokens: int,
                     own: tuple[int, int] | None = None) -> tuple[list[tuple], int]:
        """:meth:`lookup`, reusing the last result while neither the arguments (the same ``hash_ids`` object)
        nor the cache's keys (:attr:`lookup_version`) changed: :meth:`admission_credit` and the
        :meth:`admit_prefix` after it look the cache up once. The result is shared: callers must not change it."""
        last = self._last_lookup
        if (last is not None and last[1] is hash_ids and last[2] == (prompt_tokens, own)
                and last[0] == self.lookup_version):
            return last[3]
        result = self.lookup(hash_ids, prompt_tokens, own)
        self._last_lookup = (self.lookup_version, hash_ids, (prompt_tokens, own), result)
        return result

    def admission_credit(self, hash_ids: Sequence[int], prompt_tokens: int,
                         own: tuple[int, int] | None = None) -> tuple[int, int, int]:
        """What a lookup would serve from the cache now, for admission: ``(hit_tokens, cached_page_groups,
        pinned_page_groups)`` - the tokens skipped (full pages only: a copy-on-write page needs a fresh page
        group), the leading pages served by cache entries, and of those the entries no active slot maps
        (evictable today, pinned once this request maps them); ``own`` as for :meth:`lookup`. Changes nothing."""
        if not hash_ids and own is None:
            return 0, 0, 0
        keys, _ = self._lookup_once(hash_ids, prompt_tokens, own)
        pinned = sum(1 for key in keys if self._active_refs[key] == 0)
        return len(keys) * self.config.tokens_per_page, len(keys), pinned

    def admit_prefix(self, slot: int, hash_ids: Sequence[int], prompt_tokens: int,
                     own: tuple[int, int] | None = None) -> PrefixHit:
        """After :meth:`alloc_slot`: map the cached prefix into ``slot`` and copy a partial page (COW); ``own``
        as for :meth:`lookup` (a re-admission after a recompute preemption).

        Returns a :class:`PrefixHit` whose plan is already applied to the accounting; a COW page that cannot
        be allocated is simply not copied (those tokens are computed instead).
        """
        self._unprepared.discard(slot)
        keys, partial = self._lookup_once(hash_ids, prompt_tokens, own) if hash_ids or own else ([], 0)
        current = self.slot_keys[slot]
        common = 0
        while common < min(len(current), len(keys)) and current[common] == keys[common]:
            common += 1
        unmaps, maps = [], []
        if common < len(keys) or common < self.shared[slot]:
            # from the first divergent page on, the slot's pages are dropped (shared ones stay cached). Keeping
            # the private tail and remapping fresh pages in place was measured worse on the Mooncake trace
            # (more maps: the fresh pages are mapped whether or not the new request reaches them).
            op = self._unmap_range(slot, common)
            if op:
                unmaps.append(op)
        first_new = self.mapped[slot]
        for page in range(self.mapped[slot], len(keys)):
            self._ref(keys[page], slot)
            self.slot_keys[slot].append(keys[page])
            self.shared[slot] += 1
            self._add_mapped(slot, 1)
        if len(keys) > first_new:
            maps.append(MapOp(slot, first_new, len(keys) - first_new))
        cow = 0
        if partial and (self.mapped[slot] > len(keys) or self.free_page_groups > self._admission_groups):
            if self.mapped[slot] == len(keys):
                self._add_mapped(slot, 1)
                self._take_free(1)
                maps.append(MapOp(slot, len(keys), 1))
            cow = partial
        hit = len(keys) * self.config.tokens_per_page + cow
        return PrefixHit(Plan(maps=tuple(self._merge(maps)), unmaps=tuple(unmaps)), hit, max(0, len(keys) - common),
                         cow, len(keys))

    def record_admission(self, hit: PrefixHit, preempted: bool) -> None:
        """Count an admission that succeeded (a failed one counts nothing). Hits of a request re-admitted
        after a preemption (on blocks it computed itself) are counted apart, as vLLM v1's
        ``PrefixCacheStats`` keeps ``preempted_queries`` / ``preempted_hits`` apart from ``queries`` / ``hits``."""
        if count_admission(self.stats, hit, preempted):
            self.stats["cow_tokens"] += hit.cow_tokens

    @staticmethod
    def _merge(maps: list[MapOp]) -> list[MapOp]:
        merged: list[MapOp] = []
        for op in maps:
            if merged and merged[-1].first_page + merged[-1].num_pages == op.first_page:
                last = merged.pop()
                op = MapOp(op.slot, last.first_page, last.num_pages + op.num_pages)
            merged.append(op)
        return merged

    # ---- reclamation -------------------------------------------------------------------------------------
    def step(self, target_tokens):
        """As :meth:`VAttentionPolicy.step`; when short, evicts unmapped cache entries first, then unmaps idle
        slots (which may make more entries evictable) and evicts again.

        Raises:
            RuntimeError: for a slot allocated but not prepared by :meth:`admit_prefix` (its stale shared
                pages would be written).
        """
        if self._unprepared.intersection(target_tokens):
            raise RuntimeError(f"slots {sorted(self._unprepared.intersection(target_tokens))} were not prepared "
                               "by admit_prefix()")
        need = sum(n for _, _, n in self._needs(target_tokens))
        if need <= self.free_page_groups:
            return super().step(target_tokens)
        if need > self.free_page_groups + self._reclaimable_page_groups():
            return None
        if self._unified_lru:          # the maps take the oldest of free pages and entries (FreeQueue)
            unmaps = self._unmap_idle_for(need)
            self._evict_queue_head(need)
            plan = super().step(target_tokens)
            return Plan(maps=plan.maps, unmaps=tuple(unmaps) + plan.unmaps)
        self._evict(need - self.free_page_groups)
        unmaps = self._reclaim_idle(need - self.free_page_groups) if need > self.free_page_groups else []
        if self.free_page_groups < need:
            raise RuntimeError("prefix cache reclamation freed less than it promised")
        plan = super().step(target_tokens)
        return Plan(maps=plan.maps, unmaps=tuple(unmaps) + plan.unmaps)

    def _reclaim_idle(self, page_groups: int) -> list[UnmapOp]:
        """Unmap idle slots (most mapped first), evicting the entries this leaves unmapped, until
        ``page_groups`` more are free."""
        target = self.free_page_groups + page_groups
        unmaps = []
        for slot in sorted(self._idle, key=lambda s: (-self.mapped[s], s)):
            if self.free_page_groups >= target:
                break
            if not self.mapped[slot] or self.in_flight_maps[slot]:
                continue
            unmaps.append(self._unmap_all(slot))
            self._evict(target - self.free_page_groups)
        return unmaps

    def _low_watermark_unmaps(self) -> list[UnmapOp]:
        self._evict(2 * self._low_groups - self.free_page_groups)
        unmaps = []
        high = 2 * self._low_groups
        if self.free_page_groups + self.in_flight_unmaps >= high:
            return unmaps
        for slot in sorted(self._idle, key=lambda s: (-self.mapped[s], s)):
            while (self.mapped[slot] > self.shared[slot] and self.free_page_groups + self.in_flight_unmaps < high
                   and not self.in_flight_maps[slot]):
                self._add_mapped(slot, -1)
                self.in_flight_unmaps += 1
                self.in_flight_unmaps_slot[slot] += 1
                unmaps.append(UnmapOp(slot, self.mapped[slot], 1))
        return unmaps
