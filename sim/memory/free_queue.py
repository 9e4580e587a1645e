"""One LRU order over a prefix cache's free pages and evictable entries (:class:`FreeQueue`, mixed into
:class:`sim.memory.prefix.PrefixCachingPolicy` for ``evict=lru``): vLLM v1's free-block queue.

vLLM v1 keeps every free block, cached or not, in one queue (``BlockPool.free_block_queue``,
``vllm/v1/core/block_pool.py``): a freed request's blocks are appended (tail first), ``get_new_blocks`` pops the head
and evicts the cached block it pops. So a cached block older than a never-cached free one is reused first (kvsim
took never-cached pages first and evicted only when they ran out, which kept cached blocks longer: +2.9% hits on
1,500 Mooncake requests, helper-54). Free pages are runs ``[stamp, count]`` in the order they became free; entries
carry the stamp of the moment they became evictable (:attr:`PrefixCachingPolicy._unmapped`'s values); taking
pages pops the oldest of either. With another eviction policy (``radix-leaf``, ``page``) nothing here acts.
"""
from __future__ import annotations

from sim.memory.eviction import lru_victims
from sim.memory.plan import UnmapOp


class FreeQueue:
    """The free-page runs beside the evictable entries, and the hooks that take pages in their order (``self`` is
    the prefix policy: ``_free_runs``, ``_free_tracked``, ``_stamp`` set by its ``__init__``)."""

    @property
    def _unified_lru(self) -> bool:
        """Whether the policy evicts as vLLM v1 (``evict=lru``): only then do pages come in this one order."""
        return self.victims is lru_victims

    def _free_stamp(self) -> int:
        """Record the free pages that appeared since the last call as a run, then stamp the moment."""
        self._sync_free()
        self._stamp += 1
        return self._stamp

    def _sync_free(self) -> None:
        delta = self.free_page_groups - self._free_tracked
        if delta > 0:
            self._stamp += 1
            self._free_runs.append([self._stamp, delta])
        elif delta < 0:                     # taken without _take_pages (none expected): the oldest go
            self._take_runs(-delta)
        self._free_tracked = self.free_page_groups

    def _take_runs(self, count: int) -> None:
        runs = self._free_runs
        while count > 0 and runs:
            used = min(count, runs[0][1])
            runs[0][1] -= used
            count -= used
            if not runs[0][1]:
                runs.popleft()

    def _take_pages(self, count: int) -> None:
        """Before ``count`` free pages are taken: evict the evictable entries older than the free pages the
        queue would hand out, as vLLM's pops do; the pages taken leave the runs."""
        if not self._unified_lru:
            return
        self._sync_free()
        runs, unmapped = self._free_runs, self._unmapped
        evicted = 0
        while count > 0:
            oldest_entry = next(iter(unmapped.items()), None) if unmapped else None
            if runs and (oldest_entry is None or runs[0][0] < oldest_entry[1]):
                used = min(count, runs[0][1])
                self._take_runs(used)
                count -= used
                self._free_tracked -= used
            elif oldest_entry is not None:
                del unmapped[oldest_entry[0]]
                self._evict_entry(oldest_entry[0])
                evicted += 1
                count -= 1
            else:
                break
        self._count_evicted(evicted)                # (the evicted pages are taken at once: not a run)

    def _evict_queue_head(self, need: int) -> None:
        """Before a step that maps ``need`` pages with fewer free: evict the entries among the queue's first
        ``need`` items (what ``need`` pops of vLLM's free-block queue evict) and put their pages at the queue's
        head, so that the step then finds ``need`` free pages and takes exactly those (reclaiming nothing more)."""
        self._sync_free()
        runs, unmapped = self._free_runs, self._unmapped
        victims, taken, run_index = [], 0, 0
        run_left = runs[0][1] if runs else 0
        entries = iter(list(unmapped.items()))
        entry = next(entries, None)
        while taken < need:
            run_stamp = runs[run_index][0] if run_index < len(runs) else None
            if entry is not None and (run_stamp is None or entry[1] < run_stamp):
                victims.append(entry[0])
                entry = next(entries, None)
                taken += 1
            elif run_stamp is not None:
                used = min(need - taken, run_left)
                taken += used
                run_left -= used
                if not run_left:
                    run_index += 1
                    run_left = runs[run_index][1] if run_index < len(runs) else 0
            else:
                break
        evicted = 0
        for key in victims:
            if key not in unmapped:           # a copy renamed to its original's key (_promote_copy)
                key = key[:2]
                if key not in unmapped:
                    continue
            del unmapped[key]
            self._evict_entry(key)
            evicted += 1
        if evicted:
            self._count_evicted(evicted)
            runs.appendleft([-1, evicted])    # the oldest free pages now
            self._free_tracked += evicted

    def _unmap_idle_for(self, need: int) -> list[UnmapOp]:
        """Unmap idle slots (most mapped first) until free pages and evictable entries cover ``need`` maps; the
        maps then take the oldest of either (:meth:`_take_pages`), evicting entries in vLLM's order.

        Raises:
            RuntimeError: when even that does not cover them (the caller checked that it would).
        """
        unmaps = []
        for slot in sorted(self._idle, key=lambda s: (-self.mapped[s], s)):
            if self.free_page_groups + len(self._unmapped) >= need:
                break
            if self.mapped[slot] and not self.in_flight_maps[slot]:
                unmaps.append(self._unmap_all(slot))
        if self.free_page_groups + len(self._unmapped) < need:
            raise RuntimeError("prefix cache reclamation freed less than it promised")
        return unmaps

    def _take_free(self, page_groups: int) -> None:
        self._take_pages(page_groups)
        super()._take_free(page_groups)
        if self._unified_lru:
            self._free_tracked = self.free_page_groups

    def _reserve_map(self, slot: int):
        self._take_pages(1)
        op = super()._reserve_map(slot)
        if self._unified_lru:
            self._free_tracked = self.free_page_groups
        return op
