"""The block pool and the per-group block caches of prefix caching with window-aware paged allocation
(``paged:window=free,prefix=on``; the hit rule and the facade: :mod:`sim.memory.hybrid_prefix`).

**The pool** (:class:`CachingPool`) is vLLM v1's ``BlockPool`` (vllm/v1/core/block_pool.py) in units of
:class:`sim.memory.hybrid.SharedPool`: one free queue in eviction order holding the uncached free units and the
*cached* free blocks (blocks whose request released them but which keep their hash)::

    head (evicted first)                                                  tail (freed last)
    [ 812 uncached units ][ full (3, h3) ][ sliding (9, h9) ][ 40 uncached ][ full (2, h2) ] ...

* ``free_blocks``: a released block whose hash is cached goes to the tail *with its hash* (it stays a cache
  entry and counts as free); an uncached one goes to the tail as a plain unit. A request's blocks are released
  tail first (``SingleTypeKVCacheManager.free``: ``reversed(req_blocks)``; ``remove_skipped_blocks`` the same),
  group after group (``KVCacheCoordinator.free``), so a prefix's last blocks are evicted first.
* ``get_new_blocks``: units are taken from the head; a cached block taken there loses its hash
  (``_maybe_evict_cached_block``): it is evicted.
* ``touch``: a hit on a cached free block takes it out of the queue (it is no longer free).

The layers of one kind form ``units_g`` vLLM KV-cache groups that hold the same tokens; their blocks of one
position are one cache entry here (one *bundle* of ``units_g`` units), cached, touched and evicted together, as
the ``KVCacheBlockBundle`` of vLLM's block pool (one bundle per single-type manager and position) does.

**A group's cache** (:class:`CachedPages`, mixed into the full and the window sub-policies): ``entries`` maps a
cache key (page index, block-chain id) to the slots that map it (a reference count); an entry with no reference
is a bundle in the pool's free queue. Per slot, ``slot_pages`` gives the slot's pages that are entries. At every
moment, for every group ``g``::

    units_g * (mapped_g - shared_g + referenced entries_g) summed over g  +  free units (with cached ones) == pool
    bundles of g in the free queue == entries of g with no reference

Errors: caller misuse raises ``ValueError``, corrupted state ``RuntimeError`` (as :mod:`sim.memory.vattention`).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from sim.memory.hybrid import GroupPolicy, SharedPool, WindowGroupPolicy
from sim.memory.plan import EMPTY_PLAN, Plan, UnmapOp


class CachingPool(SharedPool):
    """:class:`SharedPool` whose free units are vLLM's free queue (module docstring).

    ``free_units`` counts every free unit, cached or not; raising it releases uncached units to the tail,
    lowering it takes units from the head (evicting the cached bundles found there). ``owners[i]`` is the
    :class:`CachedPages` group whose bundles carry index ``i`` (set by the facade).
    """

    def __init__(self, total_units: int):
        self._queue: OrderedDict[tuple, int] = OrderedDict()   # item -> units; ("free", n) or (group, key)
        self._free = 0
        self._segments = 0
        self.owners: list = []
        self.evicted_units = 0
        super().__init__(total_units)

    @property
    def free_units(self) -> int:
        return self._free

    @free_units.setter
    def free_units(self, value: int) -> None:
        delta = value - self._free
        if delta > 0:
            self._append_uncached(delta)
        elif delta < 0:
            self._take(-delta)

    def _append_uncached(self, units: int) -> None:
        if self._queue:
            last = next(reversed(self._queue))
            if last[0] == "free":
                self._queue[last] += units
                self._free += units
                return
        self._segments += 1
        self._queue[("free", self._segments)] = units
        self._free += units

    def _take(self, units: int) -> None:
        if units > self._free:
            raise RuntimeError(f"{units} units taken from a pool with {self._free} free")
        self._free -= units
        while units > 0:
            item, held = next(iter(self._queue.items()))
            del self._queue[item]
            if item[0] != "free":
                self.owners[item[0]].evict_entry(item[1])      # popped for reuse: the block loses its hash
                self.evicted_units += held
            if held > units:                                  # the rest stays at the head, uncached
                self._segments += 1
                self._queue[("free", self._segments)] = held - units
                self._queue.move_to_end(("free", self._segments), last=False)
            units -= min(units, held)

    def release_cached(self, group: int, key: tuple, units: int) -> None:
        """A cached bundle of ``units`` units of group ``group`` freed: to the tail, keeping its key."""
        self._queue[(group, key)] = units
        self._free += units

    def touch(self, group: int, key: tuple) -> None:
        """A hit on a cached free bundle takes it out of the free queue (``BlockPool.touch``)."""
        self._free -= self._queue.pop((group, key))

    def queued_bundles(self, group: int) -> int:
        """Cached bundles of ``group`` in the free queue."""
        return sum(1 for item in self._queue if item[0] == group)

    def queue_error(self) -> int:
        """``free units - units in the queue``; 0 when the queue and its count agree."""
        return self._free - sum(self._queue.values())


class CachedPages:
    """A group's block cache (module docstring), mixed in before :class:`GroupPolicy` /
    :class:`WindowGroupPolicy` of a paged configuration (no deferred reclamation, no background maps)."""

    def init_cache(self, index: int, block_tokens: int) -> None:
        """Set up the cache of the group whose bundles carry ``index`` in the :class:`CachingPool`
        (``block_tokens``: tokens per hash block of the trace, Mooncake 512)."""
        self.index, self.block_tokens = index, block_tokens
        self.entries: dict[tuple, int] = {}
        self.referenced = 0                  # entries some slot maps (refs > 0): held_page_groups without a scan
        num_slots = self.config.num_slots
        self.slot_pages: list[dict[int, tuple]] = [{} for _ in range(num_slots)]
        self.shared = [0] * num_slots
        self.donated = [0] * num_slots       # pages below this are entries or were left private
        self.evictions = 0

    # ---- accounting --------------------------------------------------------------------------------
    def held_page_groups(self) -> int:
        """Page groups off the free queue: private mapped pages and entries some slot maps."""
        return (self._mapped_total - sum(self.shared) + self.referenced + sum(self.in_flight_maps)
                + self.in_flight_unmaps)

    def cache_error(self) -> int:
        """Entries with no reference minus this group's bundles in the free queue, plus any drift of the
        referenced-entry counter from a scan (0 when consistent)."""
        idle = sum(1 for refs in self.entries.values() if not refs)
        drift = abs(self.referenced - (len(self.entries) - idle))
        return idle - self._pool.queued_bundles(self.index) + drift

    def first_page(self, slot: int) -> int:
        """The slot's lowest mapped page."""
        return 0

    def page_key(self, chain: Sequence[int], page: int) -> tuple[int, int]:
        """Key of page ``page``: ``(page, chain[last hash block covering tokens [0, (page + 1) p)])``, as
        :meth:`sim.memory.prefix.PrefixCachingPolicy.page_key`."""
        return page, chain[-(-(page + 1) * self.config.tokens_per_page // self.block_tokens) - 1]

    def cached(self, chain: Sequence[int]) -> "_CachedView":
        """The pages of a prompt (its block chain) this group holds cached, as a container of page indices."""
        return _CachedView(self, chain)

    # ---- references ------------------------------------------------------------------------------------
    def map_entries(self, slot: int, first_page: int, keys: Sequence[tuple]) -> None:
        """Map the cached entries ``keys`` at pages ``first_page..`` of an empty slot (a hit: ``touch``)."""
        if self.mapped[slot]:
            raise RuntimeError(f"slot {slot} maps {self.mapped[slot]} pages before its prefix hit")
        for page, key in enumerate(keys, start=first_page):
            refs = self.entries[key]
            if refs == 0:
                self._pool.touch(self.index, key)
                self.referenced += 1
            self.entries[key] = refs + 1
            self.slot_pages[slot][page] = key
        self.shared[slot] = len(keys)
        self._add_mapped(slot, len(keys))
        self.donated[slot] = first_page + len(keys)

    def _release_page(self, slot: int, page: int) -> None:
        key = self.slot_pages[slot].pop(page, None)
        if key is None:
            self.free_page_groups += 1           # a private block: an uncached free block at the tail
            return
        self.shared[slot] -= 1
        refs = self.entries[key] - 1
        self.entries[key] = refs
        if refs == 0:                            # free but cached: keeps its key until popped for reuse
            self.referenced -= 1
            self._pool.release_cached(self.index, key, self.units)

    def evict_entry(self, key: tuple) -> None:
        """The pool popped this entry's bundle for reuse: it leaves the cache."""
        if self.entries.pop(key):
            raise RuntimeError(f"evicted cache entry {key} is still mapped")
        self.evictions += 1

    def donate(self, slot: int, chain: Sequence[int], full_pages: int, computed_tokens: int) -> int:
        """Make the slot's computed full pages inside the prompt's full hash blocks cache entries (a page whose
        key is already cached stays private: vLLM caches a duplicate, kvsim keeps one entry per key, as
        :meth:`sim.memory.prefix.PrefixCachingPolicy.donate`). Returns the pages donated."""
        top = min(full_pages, computed_tokens // self.config.tokens_per_page,
                  self.first_page(slot) + self.mapped[slot])
        page, donated = max(self.donated[slot], self.first_page(slot)), 0
        pages = self.slot_pages[slot]
        while page < top:
            if page not in pages:
                key = self.page_key(chain, page)
                if key not in self.entries:
                    self.entries[key] = 1
                    self.referenced += 1
                    pages[page] = key
                    self.shared[slot] += 1
                    donated += 1
            page += 1
        self.donated[slot] = max(self.donated[slot], top)
        return donated

    def free_slot(self, slot: int, last_read_iteration: int) -> Plan:
        """Release a slot: its blocks, tail first (``SingleTypeKVCacheManager.free``).

        Raises:
            ValueError: if the slot is not active.
        """
        if not self.active[slot]:
            raise ValueError(f"slot {slot} is not active")
        if self.in_flight_maps[slot]:
            raise RuntimeError(f"slot {slot} has background maps in flight (paged has none)")
        self._set_active(slot, False)
        self.last_read_iteration[slot] = last_read_iteration
        first, count = self.first_page(slot), self.mapped[slot]
        for page in range(first + count - 1, first - 1, -1):
            self._release_page(slot, page)
        self._add_mapped(slot, -count)
        self._reset_slot(slot)
        return Plan(unmaps=(UnmapOp(slot, first, count),)) if count else EMPTY_PLAN

    def _reset_slot(self, slot: int) -> None:
        self.donated[slot] = 0


class _CachedView:
    """``page in view``: whether the group holds the page of this block chain cached."""

    __slots__ = ("group", "chain")

    def __init__(self, group: CachedPages, chain: Sequence[int]):
        self.group, self.chain = group, chain

    def __contains__(self, page: int) -> bool:
        return self.group.page_key(self.chain, page) in self.group.entries


class CachedFullGroup(CachedPages, GroupPolicy):
    """A full-attention group with a block cache: every block of a finished request stays cached."""


class CachedWindowGroup(CachedPages, WindowGroupPolicy):
    """A sliding-window group with a block cache: blocks that leave the window (``remove_skipped_blocks``) are
    freed tail first and stay cached until popped for reuse."""

    def first_page(self, slot: int) -> int:
        return self.base[slot]

    def map_entries(self, slot: int, first_page: int, keys: Sequence[tuple]) -> None:
        if self.base[slot]:
            raise RuntimeError(f"slot {slot} starts at page {self.base[slot]} before its prefix hit")
        self.base[slot] = first_page
        super().map_entries(slot, first_page, keys)

    def _drop_below_window(self, slot: int, stale: int) -> UnmapOp:
        base = self.base[slot]
        for page in range(base + stale - 1, base - 1, -1):
            self._release_page(slot, page)
        self._add_mapped(slot, -stale)
        self.base[slot] = base + stale
        return UnmapOp(slot, base, stale)

    def _reset_slot(self, slot: int) -> None:
        self.donated[slot] = 0
        self.base[slot] = 0
