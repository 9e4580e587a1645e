"""The asynchronous mapper's side of the vAttention policy (:class:`BackgroundMapping`, mixed into
:class:`sim.memory.vattention.VAttentionPolicy`): the background plan (look-ahead maps, eager allocation of idle
slots, low-watermark reclamation), reservations and their commit / cancel, and the pool's recycled pages
(zero-on-reuse accounting). Pure policy logic, as the rest of :mod:`sim.memory`."""
from __future__ import annotations

from collections.abc import Mapping

from sim.memory.plan import EMPTY_PLAN, MapOp, Plan, UnmapOp


class BackgroundMapping:
    """Background-mapper methods of :class:`sim.memory.vattention.VAttentionPolicy` (which it is mixed into:
    ``self`` is that policy; its state is set up by the policy's ``__init__``)."""

    # ---- background (asynchronous mapper) ------------------------------------------------------------
    def background_plan(self, lookahead_tokens: Mapping[int, int]) -> Plan:
        """Work for the asynchronous mapper while the GPU computes (``step_async``): map ahead for running
        slots, pre-map idle slots (eager allocation), reclaim idle slots below the low watermark.

        Every returned op is *reserved*: the executor must :meth:`commit` or :meth:`cancel` each one.
        Ops are single page groups so that they can be committed one at a time.

        Args:
            lookahead_tokens: active slot -> tokens it is predicted to hold a few iterations ahead.
        """
        maps = self._lookahead_maps(lookahead_tokens)
        if self._eager_dirty and self.free_page_groups > 2 * self._low_groups:
            maps += self._eager_idle_maps()
            self._eager_dirty = False
        unmaps = self._low_watermark_unmaps() if self.free_page_groups < self._low_groups else []
        return Plan(maps=tuple(maps), unmaps=tuple(unmaps)) if maps or unmaps else EMPTY_PLAN

    def has_background_work(self) -> bool:
        """Whether :meth:`background_plan` could return eager or low-watermark work (look-ahead aside)."""
        return ((self._eager_dirty and self.free_page_groups > 2 * self._low_groups)
                or self.free_page_groups < self._low_groups)

    def _reserve_map(self, slot: int) -> MapOp:
        op = MapOp(slot, self.mapped[slot] + self.in_flight_maps[slot], 1)
        self.in_flight_maps[slot] += 1
        self._in_flight_slots.add(slot)
        if not self.active[slot]:           # an idle slot with maps in flight is neither allocatable nor reclaimable
            self.admission_epoch += 1
        if self.dirty_free_page_groups:
            self.dirty_free_page_groups -= 1
            self._reserved_dirty.add(op)
        self.free_page_groups -= 1
        return op

    def _take_free(self, page_groups: int) -> None:
        recycled = min(page_groups, self.dirty_free_page_groups)
        self.dirty_free_page_groups -= recycled
        self._recycled_taken += recycled
        self.free_page_groups -= page_groups

    def take_recycled(self) -> int:
        """Page groups that synchronous steps took from the pool still holding an earlier request's KV since
        the last call (they need clearing under zero-on-reuse)."""
        taken, self._recycled_taken = self._recycled_taken, 0
        return taken

    def reserved_is_recycled(self, op: MapOp) -> bool:
        """Whether a reserved background map took a page still holding an earlier request's KV."""
        return op in self._reserved_dirty

    def _lookahead_maps(self, lookahead_tokens: Mapping[int, int]) -> list[MapOp]:
        maps = []
        cap, per_page = self.config.max_pages_per_slot, self.config.tokens_per_page
        mapped, in_flight = self.mapped, self.in_flight_maps
        for slot, tokens in lookahead_tokens.items():   # once per running request and iteration: locals, no calls
            want = -(-tokens // per_page)                 # VAttentionConfig.pages_for_tokens
            if want > cap:
                want = cap
            if mapped[slot] + in_flight[slot] >= want:    # the common case: already mapped ahead
                continue
            while mapped[slot] + in_flight[slot] < want and self.free_page_groups > self._admission_groups:
                maps.append(self._reserve_map(slot))
        return maps

    def _eager_idle_maps(self) -> list[MapOp]:
        """Keep ``eager_idle_slots`` idle slots (those with the most pages) at >= ``eager_page_groups``."""
        target = min(self.config.eager_page_groups, self.config.max_pages_per_slot)
        wanted = self.config.eager_idle_slots
        if sum(map(len, self._idle_buckets[target:])) >= wanted:
            return []
        idle = []
        for bucket in reversed(self._idle_buckets):
            idle += sorted(bucket)[: wanted - len(idle)]
            if len(idle) >= wanted:
                break
        maps = []
        for slot in idle:
            while self.mapped[slot] + self.in_flight_maps[slot] < target and self.free_page_groups > 2 * self._low_groups:
                maps.append(self._reserve_map(slot))
        return maps

    def _low_watermark_unmaps(self) -> list[UnmapOp]:
        unmaps = []
        high = 2 * self._low_groups
        if self.free_page_groups + self.in_flight_unmaps >= high or not self._deferred_total:
            return unmaps
        for slot in self._idle_most_mapped_first():
            while self.mapped[slot] and self.free_page_groups + self.in_flight_unmaps < high and not self.in_flight_maps[slot]:
                self._add_mapped(slot, -1)
                self.in_flight_unmaps += 1
                self.in_flight_unmaps_slot[slot] += 1
                unmaps.append(UnmapOp(slot, self.mapped[slot], 1))
            if self.free_page_groups + self.in_flight_unmaps >= high:
                break                     # the watermark is restored: no later slot is touched
        return unmaps

    def _idle_most_mapped_first(self):
        """Idle slots that map page groups, most mapped first (ties: lowest slot id), the order fixed when each
        slot is reached. A caller may unmap the slot it was handed (all of its pages, or stop the walk): a
        slot only ever moves to the empty bucket, so none is handed out twice. Walks the idle buckets from
        the top, or sorts the idle slots when the buckets far outnumber them (long slots, small pages)."""
        buckets = self._idle_buckets
        if len(buckets) > 4 * len(self._idle) + 64:
            mapped = self.mapped
            yield from (s for s in sorted(self._idle, key=lambda s: (-mapped[s], s)) if mapped[s])
            return
        for count in range(len(buckets) - 1, 0, -1):
            if buckets[count]:
                yield from sorted(buckets[count])

    def commit(self, op: MapOp | UnmapOp) -> None:
        """The executor finished a reserved background op."""
        if isinstance(op, MapOp):
            self._check_in_flight(op)
            self.in_flight_maps[op.slot] -= op.num_pages
            if not self.in_flight_maps[op.slot]:
                self._in_flight_slots.discard(op.slot)
            self._add_mapped(op.slot, op.num_pages)       # an idle slot's: bumps the admission epoch
            self._reserved_dirty.discard(op)
            self._settle(op.slot)
        else:
            self.in_flight_unmaps -= op.num_pages
            self.in_flight_unmaps_slot[op.slot] -= op.num_pages
            self.free_page_groups += op.num_pages
            self.dirty_free_page_groups += op.num_pages
            self._eager_dirty = True
            self.admission_epoch += 1

    def cancel(self, op: MapOp | UnmapOp) -> None:
        """The executor dropped a reserved background op before starting it (state as if never planned).
        Ops must be cancelled in reverse order of reservation for a slot (prefix order is kept)."""
        self._eager_dirty = True
        self.admission_epoch += 1
        if isinstance(op, MapOp):
            self._check_in_flight(op)
            self.in_flight_maps[op.slot] -= op.num_pages
            if not self.in_flight_maps[op.slot]:
                self._in_flight_slots.discard(op.slot)
            self.free_page_groups += op.num_pages
            if op in self._reserved_dirty:
                self._reserved_dirty.discard(op)
                self.dirty_free_page_groups += op.num_pages
            self._settle(op.slot)
        else:
            self.in_flight_unmaps -= op.num_pages
            self.in_flight_unmaps_slot[op.slot] -= op.num_pages
            self._add_mapped(op.slot, op.num_pages)

    def _settle(self, slot: int) -> None:
        if slot in self._free_after_settle and not self.in_flight_maps[slot]:
            self._free_after_settle.discard(slot)
            self.admission_epoch += 1
            if self.mapped[slot] and not self.active[slot]:
                self._settled_unmaps.append(self._unmap_all(slot))

    def take_settled_unmaps(self) -> Plan:
        """Unmaps of freed slots (deferred reclamation off) whose in-flight background maps have now
        settled; already applied to the accounting, the executor must perform them."""
        if not self._settled_unmaps:
            return EMPTY_PLAN
        unmaps, self._settled_unmaps = tuple(self._settled_unmaps), []
        return Plan(unmaps=unmaps)

    def _check_in_flight(self, op: MapOp) -> None:
        if self.in_flight_maps[op.slot] < op.num_pages:
            raise RuntimeError(f"{op} was not reserved")
