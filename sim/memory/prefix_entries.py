"""The prefix cache's entry bookkeeping (:class:`PrefixEntries`, mixed into
:class:`sim.memory.prefix.PrefixCachingPolicy`): references of slots to cache entries kept incrementally, the
evictable (unmapped) entries and their eviction, and unmapping a slot's private and shared pages.

Every change of an entry (created, referenced, unreferenced, dropped) bumps the policy's ``admission_epoch``
(:mod:`sim.memory.vattention`, "Admission epoch": a lookup's hit, the pinned entries and the reclaimable pages
depend on them); creating or dropping one also bumps ``lookup_version`` (what :meth:`PrefixCachingPolicy.lookup`
reads: which keys are cached, and the partial-match index)."""
from __future__ import annotations

from itertools import compress

from sim.memory.plan import UnmapOp


class PrefixEntries:
    """Cache-entry and eviction bookkeeping of :class:`sim.memory.prefix.PrefixCachingPolicy` (mixed in before
    :class:`sim.memory.vattention.VAttentionPolicy`, whose methods it extends: ``self`` is the prefix policy, its
    state set up by the policy's ``__init__``)."""

    # ---- entry references (kept incrementally) ----------------------------------------------------------
    # duplicate_refs: over cache entries, the active slots mapping each beyond the first (sum of refs - 1): a
    # running request's used pages count its shared ones, so the iteration's used page groups are physical only
    # after subtracting them (sim.core.lifecycle._iteration_pass)
    def _new_entry(self, key: tuple, slot: int, parent: tuple | None = None, tiered: bool = True) -> None:
        """A new cache entry ``key`` that ``slot`` maps (``tiered``: the lower tiers see it; not a duplicate copy,
        :meth:`sim.memory.prefix.PrefixCachingPolicy.donate`)."""
        self.cache[key] = {slot}
        self.admission_epoch += 1
        self.lookup_version += 1
        if parent is not None:
            self._parent[key] = parent
            self._children[parent] = self._children.get(parent, 0) + 1
        if self.tier_store is not None and tiered:
            self.tier_store.on_donate(key)
        self._active_refs[key] = 1 if self.active[slot] else 0
        self._freeable += self._active_refs[key] == 0

    def _ref(self, key: tuple, slot: int) -> None:
        self.admission_epoch += 1
        slots = self.cache[key]
        if not slots:
            del self._unmapped[key]
        slots.add(slot)
        if self.active[slot]:
            self._active_refs[key] += 1
            self._freeable -= self._active_refs[key] == 1
            self.duplicate_refs += self._active_refs[key] >= 2

    def _unref(self, key: tuple, slot: int) -> None:
        self.admission_epoch += 1
        slots = self.cache[key]
        slots.discard(slot)
        if self.active[slot]:
            self._active_refs[key] -= 1
            self._freeable += self._active_refs[key] == 0
            self.duplicate_refs -= self._active_refs[key] >= 1
        if not slots:
            self._unmapped[key] = self._free_stamp()       # most recently used last

    def _set_active(self, slot: int, active: bool) -> None:
        super()._set_active(slot, active)
        for key in self.slot_keys[slot]:
            before = self._active_refs[key]
            self._active_refs[key] = before + (1 if active else -1)
            self._freeable += (self._active_refs[key] == 0) - (before == 0)
            self.duplicate_refs += (before >= 1) if active else -(before >= 2)

    def _reclaimable_page_groups(self) -> int:
        """Page groups that unmapping every idle slot (without in-flight maps) and then evicting would free:
        idle private pages, plus cache entries that no active slot maps (exact unless an idle slot has
        background maps in flight, which is then checked entry by entry)."""
        busy_idle = {s for s in self._idle if self.in_flight_maps[s]}
        idle_private = sum(self.mapped[s] - self.shared[s] for s in self._idle if s not in busy_idle)
        if not busy_idle:
            return idle_private + self._freeable
        freeable = sum(1 for key, slots in self.cache.items()
                       if self._active_refs[key] == 0 and not slots & busy_idle)
        return idle_private + freeable

    def _evict(self, page_groups: int) -> int:
        """Evict up to ``page_groups`` unmapped cache entries, least recently used first (handles go back to
        the pool; no VMM call). Returns how many were evicted."""
        evicted = 0
        while evicted < page_groups and self._unmapped:
            for key in self.victims(self):
                self._evict_entry(key)
                evicted += 1
        self._count_evicted(evicted)
        return evicted

    def _evict_entry(self, key: tuple) -> None:
        """Drop the evictable entry ``key`` (already taken off ``_unmapped``) and demote it to the lower tiers
        (a duplicate copy is not demoted); :meth:`_count_evicted` gives its page back."""
        self._drop_key(key)
        if self.tier_store is not None and len(key) == 2:
            self.tier_store.on_evict(key)

    def _count_evicted(self, evicted: int) -> None:
        """The pages of ``evicted`` evicted entries are free (holding an earlier request's KV) and counted."""
        self.free_page_groups += evicted
        self.dirty_free_page_groups += evicted
        self.stats["evictions"] += evicted

    def _drop_key(self, key: tuple) -> None:
        del self.cache[key]
        self.admission_epoch += 1
        self.lookup_version += 1
        refs = self._active_refs.pop(key)
        self._freeable -= refs == 0
        self.duplicate_refs -= max(0, refs - 1)
        parent = self._parent.pop(key, None)
        if parent is not None:
            self._children[parent] -= 1
            if not self._children[parent]:
                del self._children[parent]
        if len(key) == 4:                     # a copy of a page another request cached (donate)
            copies = self._copies.get(key[:2])
            if copies is not None and key in copies:
                copies.remove(key)
                if not copies:
                    del self._copies[key[:2]]
        elif key in self._copies:             # the original goes: a copy takes its key (and its chain's children)
            self._promote_copy(key)
            return
        for chain_id in self._partials_of.pop(key, []):
            if self._partial_index.get(chain_id) == key:
                del self._partial_index[chain_id]

    def _promote_copy(self, key: tuple) -> None:
        """The cache entry ``key`` was dropped while a copy of its page is cached: the copy takes the key, so
        lookups reach it and the pages chained after it, as vLLM's ``cached_block_hash_to_block`` keeps the other
        blocks of a hash reachable when one is evicted (helper-57: a request hit 0 of 2,032 tokens with the copy
        and the next pages cached). The copy keeps its place in the eviction order and its partial-match index
        entries stay the original's."""
        copies = self._copies[key]
        copy = copies.pop(0)
        if not copies:
            del self._copies[key]
        self.cache[key] = self.cache.pop(copy)
        self._active_refs[key] = self._active_refs.pop(copy)
        parent = self._parent.pop(copy, None)
        if parent is not None:
            self._parent[key] = parent
        if copy in self._unmapped:            # renamed in place (callers may hold the dict)
            items = list(self._unmapped.items())
            self._unmapped.clear()
            self._unmapped.update((key if k == copy else k, v) for k, v in items)
        for slot in self.cache[key]:
            keys = self.slot_keys[slot]
            keys[keys.index(copy)] = key

    def _unmap_range(self, slot: int, first_page: int) -> UnmapOp | None:
        """Unmap pages ``first_page..`` of ``slot``: private ones go to the free list, shared ones drop the
        slot's reference (the entry stays cached)."""
        count = self.mapped[slot] - first_page
        if count <= 0:
            return None
        shared_dropped = max(0, self.shared[slot] - first_page)
        private = count - shared_dropped
        self.free_page_groups += private     # the private pages (above the shared ones) first: tail first, as
        self.dirty_free_page_groups += private           # vLLM's free_blocks appends a request's blocks
        for key in reversed(self.slot_keys[slot][first_page:]):
            self._unref(key, slot)        # tail first: the chain's last page is the least recently used
        del self.slot_keys[slot][first_page:]
        self.shared[slot] -= shared_dropped
        self._add_mapped(slot, -count)
        return UnmapOp(slot, first_page, count)

    def _unmap_all(self, slot: int) -> UnmapOp:
        op = self._unmap_range(slot, 0)
        if op is None:
            raise RuntimeError(f"slot {slot} has no page to unmap")
        return op

    @property
    def physical_page_groups(self) -> int:
        """Physical page groups in use: private mapped pages plus cache entries (mapped or not)."""
        return self._mapped_total - sum(self.shared) + len(self.cache)

    @property
    def deferred_page_groups(self) -> int:
        """Physical page groups that only idle slots map (kept by deferred reclamation or eager maps), each once:
        the idle slots' private pages plus the cache entries some idle slot and no active slot maps. With the
        running requests' used pages (shared ones once) and the entries no slot maps, they make up
        :attr:`physical_page_groups` exactly (the per-slot sum ``_deferred_total``, which counts a page shared
        by k idle slots k times, stays what reclamation works with)."""
        shared = self.shared
        idle_shared = sum(shared) - sum(compress(shared, self.active))
        return self._deferred_total - idle_shared + self._freeable - len(self._unmapped)
