"""vAttention memory policy: slots, a physical page-group pool, deferred and low-watermark reclamation,
eager allocation. Pure logic: every decision is returned as a :class:`sim.memory.plan.Plan`; nothing here
knows about time, SimPy or CUDA (domain.md "Mechanism"; Prabhu et al., vAttention, ASPLOS'25).

Accounting unit: the **page group** (one page of ``page_size_bytes`` in each of the 2N' sub-tensors of a
slot). The pool conserves page groups at every moment::

    sum(mapped) + sum(in_flight_maps) + free + in_flight_unmaps == pool_page_groups

* ``mapped[s]``: page groups mapped on slot ``s`` (always the prefix ``0..mapped[s]-1``).
* in-flight: reserved by :meth:`background_plan` and not yet committed or cancelled by the executor.
* *deferred*: pages mapped on idle slots (kept for the next request that takes the slot).

**Admission epoch** (:attr:`VAttentionPolicy.admission_epoch`): a counter bumped by every change of the state
:meth:`VAttentionPolicy.alloc_slot` reads except two that can only keep a refused admission refused: fewer free
page groups, and pages mapped (or reserved, or committed) on *active* slots (those are not idle, hence neither
best-fit candidates nor reclaimable). A slot taken or freed, pages mapped or unmapped on an idle slot, background
maps reserved, committed or cancelled on an idle slot, unmaps in flight, slots waiting for their maps to settle
and iterations completing past a freed slot's last read all bump it. So an admission refused at epoch ``e`` with
``f`` free page groups is refused again, with the same arguments, while the epoch is ``e`` and at most ``f``
page groups are free (:meth:`VAttentionPolicy._pick_slot`: a smaller ``spare`` fails each of its checks that
failed before, and the slot it picks is the same); the serving loop skips such attempts
(:meth:`sim.core.admission.Admission._admit`).

Errors follow three tiers: running out of pages is a return value (``None``), caller misuse raises
``ValueError`` naming the value, corrupted state raises ``RuntimeError``.
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

from sim.memory.background import BackgroundMapping
from sim.memory.plan import EMPTY_PLAN, MapOp, Plan, UnmapOp


def knob_range_error(knobs) -> str:
    """Why the watermark and eager-allocation knobs of ``knobs`` (an object with :class:`VAttentionConfig`'s field
    names, such as a :class:`sim.setup.config.SimConfig`) are out of range (``"field=value: ..."``), or ``""``:
    watermark fractions lie in [0, 0.5), eager settings are >= 0."""
    for name in ("low_watermark_frac", "admission_watermark_frac"):
        if not 0 <= getattr(knobs, name) < 0.5:
            return f"{name}={getattr(knobs, name)}: must lie in [0, 0.5)"
    for name in ("eager_lookahead_steps", "eager_page_groups", "eager_idle_slots"):
        if getattr(knobs, name) < 0:
            return f"{name}={getattr(knobs, name)}: must be >= 0"
    return ""


@dataclass(frozen=True)
class VAttentionConfig:
    """Sizes and knobs of one worker's vAttention cache.

    Attributes:
        num_slots: B, request slots (batch rows of every K/V tensor).
        max_pages_per_slot: page groups that cover one slot's ``L_max`` tokens.
        pool_page_groups: physical page groups the memory budget holds (created at start-up).
        tokens_per_page: tokens one page of one sub-tensor holds, ``floor(G / (H' D P))``.
        deferred_reclaim: keep a finished slot's pages mapped for the next request (reference default: on).
        eager_lookahead_steps: decode steps mapped ahead for running slots (reference: 9).
        eager_page_groups: page groups pre-mapped on idle slots (reference: 2).
        eager_idle_slots: how many idle slots are kept pre-mapped (this project's choice: 8).
        low_watermark_frac: below this fraction of free page groups, idle slots' pages are reclaimed in the
            background until twice this fraction is free (hysteresis; this project's default 0.05).
        admission_watermark_frac: admit only while this fraction of the pool stays free (reference: 0.01).
    """

    num_slots: int
    max_pages_per_slot: int
    pool_page_groups: int
    tokens_per_page: int
    deferred_reclaim: bool = True
    eager_lookahead_steps: int = 9
    eager_page_groups: int = 2
    eager_idle_slots: int = 8
    low_watermark_frac: float = 0.05
    admission_watermark_frac: float = 0.01

    def __post_init__(self) -> None:
        for name in ("num_slots", "max_pages_per_slot", "tokens_per_page"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.pool_page_groups < 1:
            raise ValueError(f"the memory budget holds no page group (pool_page_groups={self.pool_page_groups})")
        message = knob_range_error(self)
        if message:
            raise ValueError(message)

    def pages_for_tokens(self, tokens: int) -> int:
        """Page groups needed for ``tokens`` tokens: ``ceil(tokens / tokens_per_page)``."""
        return -(-tokens // self.tokens_per_page)

    def check_first_target(self, first_target_tokens: int) -> None:
        """Refuse a first iteration that no slot can hold.

        Raises:
            ValueError: if ``first_target_tokens`` needs more than ``max_pages_per_slot`` pages.
        """
        if self.pages_for_tokens(first_target_tokens) > self.max_pages_per_slot:
            raise ValueError(f"first_target_tokens={first_target_tokens} exceeds the slot capacity "
                             f"({self.max_pages_per_slot * self.tokens_per_page} tokens)")


class VAttentionPolicy(BackgroundMapping):
    """The vAttention policy for one worker (see module docstring for the accounting).

    Args:
        config: sizes and knobs.
    """

    duplicate_refs = 0
    """Active slots' references to shared pages beyond the first (only a prefix cache shares pages:
    :mod:`sim.memory.prefix_entries`); subtracted from the running requests' page count to give used pages."""

    refusals_repeat = True
    """Whether :attr:`admission_epoch` and the free page groups decide a refused admission's repeat (module
    docstring, "Admission epoch")."""

    def __init__(self, config: VAttentionConfig):
        self.config = config
        num_slots = config.num_slots
        self.mapped = [0] * num_slots
        self.in_flight_maps = [0] * num_slots
        self.in_flight_unmaps_slot = [0] * num_slots
        self.active = [False] * num_slots
        self.last_read_iteration = [-1] * num_slots
        self.completed_iteration = -1
        self.free_page_groups = config.pool_page_groups
        self.in_flight_unmaps = 0
        self._idle = set(range(num_slots))
        self._in_flight_slots: set[int] = set()      # slots with background maps in flight
        # idle slots bucketed by mapped page groups: best-fit and eager look-ups without scanning all slots
        # (a slot never maps more page groups than the pool holds, whatever its length: no bucket beyond that)
        self._idle_buckets: list[set[int]] = [set() for _ in range(min(config.max_pages_per_slot,
                                                                       config.pool_page_groups) + 1)]
        self._idle_buckets[0].update(range(num_slots))
        self._mapped_total = 0
        self._deferred_total = 0
        self._eager_dirty = True
        # pages returned to the pool still hold a previous request's KV (zero-on-reuse accounting); the pool
        # is a stack, so the most recently released (dirty) handles are taken first
        self.dirty_free_page_groups = 0
        self._recycled_taken = 0
        self._reserved_dirty: set[MapOp] = set()
        self._free_after_settle: set[int] = set()   # freed slots whose unmap waits for in-flight maps
        self._settled_unmaps: list[UnmapOp] = []
        self._low_groups = int(config.low_watermark_frac * config.pool_page_groups)
        self._admission_groups = int(config.admission_watermark_frac * config.pool_page_groups)
        self.admission_epoch = 0        # module docstring, "Admission epoch"
        self._latest_free_read = -1     # the latest last_read_iteration a free_slot set

    # ---- queries -------------------------------------------------------------------------------------
    @property
    def mapped_page_groups(self) -> int:
        """Page groups mapped on any slot (active or idle)."""
        return self._mapped_total

    @property
    def physical_page_groups(self) -> int:
        """Physical page groups held by mappings (without prefix sharing: the mapped ones)."""
        return self._mapped_total

    @property
    def deferred_page_groups(self) -> int:
        """Page groups mapped on idle slots (kept by deferred reclamation or eager pre-mapping)."""
        return self._deferred_total

    def _add_mapped(self, slot: int, delta: int) -> None:
        if not self.active[slot]:
            self._idle_buckets[self.mapped[slot]].discard(slot)
            self._idle_buckets[self.mapped[slot] + delta].add(slot)
            self._deferred_total += delta
            self._eager_dirty = True
            self.admission_epoch += 1
        self.mapped[slot] += delta
        self._mapped_total += delta

    def _set_active(self, slot: int, active: bool) -> None:
        self.active[slot] = active
        self._deferred_total += -self.mapped[slot] if active else self.mapped[slot]
        (self._idle.discard if active else self._idle.add)(slot)
        (self._idle_buckets[self.mapped[slot]].discard if active else self._idle_buckets[self.mapped[slot]].add)(slot)
        self._eager_dirty = True
        self.admission_epoch += 1

    def conservation_error(self) -> int:
        """``pool - (mapped + in-flight + free)``; 0 when the pool is conserved."""
        if self._mapped_total != sum(self.mapped):
            raise RuntimeError("mapped page-group counter out of step")
        held = sum(self.mapped) + sum(self.in_flight_maps) + self.in_flight_unmaps
        return self.config.pool_page_groups - held - self.free_page_groups

    def _allocatable(self, slot: int) -> bool:
        return (self.last_read_iteration[slot] <= self.completed_iteration and not self.in_flight_maps[slot]
                and not self.in_flight_unmaps_slot[slot] and slot not in self._free_after_settle)

    def _best_fit(self, need: int) -> int | None:
        """Best fit (domain.md): the allocatable idle slot with the fewest mapped pages that still covers
        ``need``; otherwise the one with the most mapped pages (fewest new maps). Ties: lowest slot id."""
        buckets = self._idle_buckets
        need = min(need, len(buckets) - 1)
        allocatable = self._allocatable
        for mapped in itertools.chain(range(need, len(buckets)), range(need - 1, -1, -1)):
            bucket = buckets[mapped]
            if bucket:
                lowest = min(bucket)                  # usually allocatable: one check instead of a scan
                if allocatable(lowest):
                    return lowest
                ready = min((s for s in bucket if allocatable(s)), default=None)
                if ready is not None:
                    return ready
        return None

    def can_admit(self, first_target_tokens: int, reserve_tokens: int | None = None,
                  committed_page_groups: int = 0, cached: tuple[int, int] = (0, 0)) -> bool:
        """Whether a request whose first iteration targets ``first_target_tokens`` tokens can take a slot
        now while the admission watermark of free page groups stays free (reclaimable deferred pages count);
        ``reserve_tokens``, ``committed_page_groups`` and ``cached`` as for :meth:`alloc_slot`."""
        return self._pick_slot(first_target_tokens, reserve_tokens, committed_page_groups, cached) is not None

    def idle_slots_mapping(self) -> list[int]:
        """Idle slots with background maps in flight (eager allocation, or maps of a freed slot), ascending."""
        return sorted(s for s in self._in_flight_slots if not self.active[s])

    def _reclaimable_page_groups(self) -> int:
        """Page groups on idle slots without background maps in flight (those could be unmapped now)."""
        return self._deferred_total - sum(self.mapped[s] for s in self._in_flight_slots if not self.active[s])

    def _pick_slot(self, first_target_tokens: int, reserve_tokens: int | None = None,
                   committed_page_groups: int = 0, cached: tuple[int, int] = (0, 0)) -> int | None:
        need = self.config.pages_for_tokens(max(first_target_tokens, reserve_tokens or 0))
        cached_groups, pinned_groups = cached
        spare = self.free_page_groups - self._admission_groups
        fresh = max(0, need - cached_groups)          # a cached prefix page needs no fresh page group
        if fresh + committed_page_groups > spare and not any(self._idle_buckets[need:]):
            # every idle slot maps fewer than `need` page groups, so every slot needs the same
            # need - mapped + committed new ones against spare + reclaimable - mapped: decided without a slot
            if fresh + committed_page_groups > spare + self._reclaimable_page_groups() - pinned_groups:
                return None
        slot = self._best_fit(need)
        if slot is None:
            return None
        # the slot's own pages beyond the cached prefix stay mapped (they are not reclaimable for this
        # request); pages under the prefix are the cached entries themselves (pinned) or are replaced by them
        kept = max(0, self.mapped[slot] - cached_groups)
        new_groups = max(0, need - max(self.mapped[slot], cached_groups)) + committed_page_groups
        if new_groups > spare and (new_groups > spare + self._reclaimable_page_groups() - kept - pinned_groups):
            return None
        return slot

    # ---- slot lifecycle ------------------------------------------------------------------------------
    def alloc_slot(self, first_target_tokens: int, reserve_tokens: int | None = None,
                   committed_page_groups: int = 0, cached: tuple[int, int] = (0, 0)) -> int | None:
        """Take a slot for a new request (``alloc_reqid``); ``None`` when no slot or memory is available.

        Args:
            first_target_tokens: tokens the request holds after its first iteration (mapped by the caller's
                next :meth:`step`).
            reserve_tokens: tokens whose pages must fit now (whole-prompt admission: the whole prompt; the
                pages are still mapped chunk by chunk); ``None``: the first target.
            committed_page_groups: page groups already promised to running requests (whole-prompt admission:
                the prompt pages they have not mapped yet), counted as taken.
            cached: ``(cached_page_groups, pinned_page_groups)`` of a prefix-cache hit: the leading pages of
                the request that cached entries serve (they need no fresh page group), and how many of those
                are evictable now (no active slot maps them: they stop counting as reclaimable). vLLM v1 looks
                the cache up first and allocates only the blocks beyond the hit
                (``Scheduler.schedule`` -> ``KVCacheManager.allocate_slots``, vllm/v1/core/sched/scheduler.py).

        Raises:
            ValueError: if ``first_target_tokens`` exceeds one slot's capacity.
        """
        self.config.check_first_target(first_target_tokens)
        slot = self._pick_slot(first_target_tokens, reserve_tokens, committed_page_groups, cached)
        if slot is not None:
            self._set_active(slot, True)
        return slot

    def free_slot(self, slot: int, last_read_iteration: int) -> Plan:
        """Release a slot (``free_reqid``) after its request finished or was preempted.

        The slot becomes allocatable only once iteration ``last_read_iteration`` has completed
        (:meth:`iteration_completed`). With deferred reclamation its pages stay mapped; without it the
        returned plan unmaps them (applied at once to the accounting; the executor performs it).

        Raises:
            ValueError: if the slot is not active.
        """
        if not self.active[slot]:
            raise ValueError(f"slot {slot} is not active")
        self._set_active(slot, False)
        self.last_read_iteration[slot] = last_read_iteration
        self._latest_free_read = max(self._latest_free_read, last_read_iteration)
        if self.config.deferred_reclaim or not (self.mapped[slot] or self.in_flight_maps[slot]):
            return Plan()
        if self.in_flight_maps[slot]:
            # background maps for this slot are still in flight: unmap once they settle, keeping the
            # prefix 0..k-1 intact (see take_settled_unmaps)
            self._free_after_settle.add(slot)
            return Plan()
        return Plan(unmaps=(self._unmap_all(slot),))

    def _unmap_all(self, slot: int) -> UnmapOp:
        op = UnmapOp(slot, 0, self.mapped[slot])
        self._add_mapped(slot, -op.num_pages)
        self.free_page_groups += op.num_pages
        self.dirty_free_page_groups += op.num_pages
        return op

    def iteration_completed(self, iteration: int) -> None:
        """Record that every kernel of ``iteration`` finished (slots it read may now be reused)."""
        if self._latest_free_read > self.completed_iteration and iteration > self.completed_iteration:
            self.admission_epoch += 1       # a freed slot may become allocatable
        self.completed_iteration = max(self.completed_iteration, iteration)

    # ---- foreground step -----------------------------------------------------------------------------
    def step(self, target_tokens: Mapping[int, int]) -> Plan | None:
        """Map, for every slot, what this iteration's target length needs (``step(seq_lens)``).

        Args:
            target_tokens: slot -> computed + scheduled tokens of this iteration.

        Returns:
            The plan (idle slots' deferred pages unmapped first when the pool is short), already applied to
            the accounting; or ``None`` when even reclaiming every idle slot cannot cover it (nothing changed:
            the scheduler must preempt and retry).

        Raises:
            ValueError: for an inactive slot or a target beyond the slot capacity.
            RuntimeError: if a slot needs pages while background maps for it are in flight (the executor
                must first cancel the queued ones and wait for the one in progress).
        """
        needs = self._needs(target_tokens)
        shortfall = sum(n for _, _, n in needs) - self.free_page_groups
        if shortfall > 0 and shortfall > self._reclaimable_page_groups():
            return None
        unmaps = self._reclaim_idle(shortfall) if shortfall > 0 else []
        maps = []
        for slot, first_page, num_pages in needs:
            self._add_mapped(slot, num_pages)
            self._take_free(num_pages)
            maps.append(MapOp(slot, first_page, num_pages))
        return Plan(maps=tuple(maps), unmaps=tuple(unmaps)) if maps or unmaps else EMPTY_PLAN

    def _needs(self, target_tokens: Mapping[int, int]) -> list[tuple[int, int, int]]:
        needs = []
        active, mapped, per_page, cap = self.active, self.mapped, self.config.tokens_per_page, self.config.max_pages_per_slot
        for slot, tokens in target_tokens.items():   # once per running request and iteration: locals, no calls
            if not active[slot]:
                raise ValueError(f"step() for inactive slot {slot}")
            pages = -(-tokens // per_page)            # VAttentionConfig.pages_for_tokens
            if pages > cap:
                raise ValueError(f"slot {slot} target {tokens} tokens exceeds the slot capacity")
            if pages > mapped[slot]:
                if self.in_flight_maps[slot]:
                    raise RuntimeError(f"step() needs pages of slot {slot} that background maps hold in flight")
                needs.append((slot, mapped[slot], pages - mapped[slot]))
        return needs

    def reclaim_idle(self) -> Plan:
        """Unmap every idle slot's deferred pages (those without background maps in flight), applied to the
        accounting at once; the returned plan's unmaps are for the executor to perform. Used between the points
        of a calibration grid (``hwbackend.calibration.grid``), never by the serving loop."""
        return Plan(unmaps=tuple(self._reclaim_idle(self._reclaimable_page_groups())))

    def _reclaim_idle(self, page_groups: int) -> list[UnmapOp]:
        """Unmap whole idle slots, most-mapped first, until ``page_groups`` are freed."""
        unmaps = []
        for slot in self._idle_most_mapped_first():
            if page_groups <= 0:
                break
            if self.in_flight_maps[slot]:
                continue
            page_groups -= self.mapped[slot]
            unmaps.append(self._unmap_all(slot))
        return unmaps
