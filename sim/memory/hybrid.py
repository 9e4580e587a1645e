"""Window-aware memory management for hybrid models: one policy per layer group over one physical pool.

:class:`HybridPolicy` has the interface of :class:`sim.memory.vattention.VAttentionPolicy` (the engine and the
executor drive it unchanged) and holds one sub-policy per layer group (:mod:`sim.memory.layer_groups`)::

    HybridPolicy ── group 0 full      GroupPolicy        (VAttentionPolicy: grows with the request)
                 ├─ group 1 sliding   WindowGroupPolicy  (pages below the window leave: unmapped or recycled)
                 ├─ group 2 chunked   WindowGroupPolicy  (pages of finished chunks leave)
                 └─ group 3 linear    StateGroupPolicy   (paged: one block per request; vattention: none, the
                                                          state is a fixed per-slot allocation made at start-up)
                          │ every sub-policy takes and returns units of one SharedPool

**Accounting rule.** Each sub-policy counts page groups of its own group (a page group = one page in each of the
group's sub-tensors: ``2 N_g`` pages for vAttention, ``ceil(N_g / group_size)`` blocks for paged) and conserves
them exactly as :class:`VAttentionPolicy` does; the pool counts *units* (:mod:`sim.memory.layer_groups`: a
layer page, or a vLLM block), and a group's page group costs ``units_g`` of them. At every moment::

    sum_g units_g * (mapped_g + in_flight_maps_g + in_flight_unmaps_g) + free_units == pool_units

Records and the engine see units (``free_page_groups``, ``physical_page_groups``) and, per slot, ``mapped[s]``:
the fewest pages any growing group maps from page 0 (a window group counts its first skipped pages as
covered), so the engine calls :meth:`step` whenever any group's pages end.

**Window rule** (vLLM v1 ``SlidingWindowManager.remove_skipped_blocks``, vllm/v1/core/single_type_kv_cache_manager.py):
when a slot's step maps a new page in a window group, pages wholly below ``skipped_tokens(computed)`` are no longer
read. ``unmap`` unmaps them (back to the pool: in the background mapper when asynchronous, else on the critical path);
``recycle`` moves their physical pages to the new end (unmap + map of the same handles, on the critical path, no
pool traffic); ``free`` (paged) frees the blocks. A decoding request then holds at most
``ceil(W / tokens_per_page) + 1`` pages in a sliding-window group. Window groups map no look-ahead.

Shortfall: a sub-policy's step that the pool cannot cover makes the facade reclaim every group's idle pages,
then unmap the *surplus* of the stepped slots (pages a reused slot maps above its target in some group: a
slot best fit in the lead group may carry another group's pages beyond the new request's length, which no group
could otherwise use) before giving up (``None``: the scheduler preempts), as :meth:`VAttentionPolicy.step` does
for one group. Admission (:meth:`HybridPolicy._pick`) counts the chosen slot's surplus the same way.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from sim.memory.hybrid_units import peak_units, used_and_waste
from sim.memory.layer_groups import LayerGroup
from sim.memory.vattention import VAttentionConfig, VAttentionPolicy
from sim.memory.plan import EMPTY_PLAN, MapOp, Plan, UnmapOp

WINDOW_MODES = ("unmap", "recycle", "free")


class SharedPool:
    """The physical pool of units every group draws from."""

    def __init__(self, total_units: int):
        if total_units < 1:
            raise ValueError(f"the memory budget holds no unit (total_units={total_units})")
        self.total_units = total_units
        self.free_units = total_units


class GroupPolicy(VAttentionPolicy):
    """A :class:`VAttentionPolicy` whose free page groups are ``free_units // units`` of a :class:`SharedPool`
    (taking or returning page groups takes or returns ``units`` each).

    Args:
        config: sizes and knobs; ``pool_page_groups`` is what the pool would hold for this group alone.
        pool: the shared pool.
        units: units one page group of this group costs (>= 1).
        group: the layer group.
    """

    holds_state = False
    """A state group (:class:`StateGroupPolicy`: one page group a request, whatever its length)."""
    window_pages = False
    """A window group (:class:`WindowGroupPolicy`: a slot maps pages ``[base, base + mapped)``)."""

    def __init__(self, config: VAttentionConfig, pool: SharedPool, units: int, group: LayerGroup):
        if units < 1:
            raise ValueError(f"units per page group must be >= 1, got {units}")
        self._pool = None                # set after the base constructor's own assignment of free_page_groups
        self.units, self.group = units, group
        super().__init__(config)
        self._pool = pool

    @property
    def free_page_groups(self) -> int:
        return self._pool.free_units // self.units if self._pool is not None else 0

    @free_page_groups.setter
    def free_page_groups(self, value: int) -> None:
        if self._pool is not None:
            self._pool.free_units += (value - self.free_page_groups) * self.units

    def held_page_groups(self) -> int:
        """Page groups this group holds: mapped, reserved for background maps, or being unmapped."""
        return self._mapped_total + sum(self.in_flight_maps) + self.in_flight_unmaps

    def extent(self, slot: int) -> int:
        """Pages from page 0 this group covers for ``slot`` (its mapped ones, and any skipped below them)."""
        return self.mapped[slot]

    def surplus_pages(self, slot: int, keep_pages: int) -> int:
        """Page groups ``slot`` maps above page ``keep_pages`` that :meth:`trim_surplus` would unmap (0 while
        background maps for the slot are in flight: its pages must stay a prefix)."""
        if self.in_flight_maps[slot]:
            return 0
        return max(0, min(self.mapped[slot], self.extent(slot) - keep_pages))

    def trim_surplus(self, slot: int, keep_pages: int) -> UnmapOp | None:
        """Unmap the pages ``slot`` maps above page ``keep_pages`` (back to the pool, as pages holding an
        earlier request's KV); applied to the accounting at once. None when there are none."""
        surplus = self.surplus_pages(slot, keep_pages)
        if not surplus:
            return None
        op = UnmapOp(slot, self.extent(slot) - surplus, surplus)
        self._add_mapped(slot, -surplus)
        self.free_page_groups += surplus
        self.dirty_free_page_groups += surplus
        return op


class WindowGroupPolicy(GroupPolicy):
    """A sliding-window or chunked-local group: a slot maps pages ``[base, base + mapped)``; pages below
    ``base`` were dropped (module docstring). ``computed`` (slot -> tokens computed before this step) is set by
    :class:`HybridPolicy` from the caller's hint before each :meth:`step`."""

    window_pages = True

    def __init__(self, config: VAttentionConfig, pool: SharedPool, units: int, group: LayerGroup, mode: str,
                 background_unmaps: bool):
        if mode not in WINDOW_MODES:
            raise ValueError(f"window mode {mode!r}: choose one of {', '.join(WINDOW_MODES)}")
        super().__init__(config, pool, units, group)
        self.mode, self.background_unmaps = mode, background_unmaps
        self.base = [0] * config.num_slots
        self.computed = [0] * config.num_slots
        self.window_unmaps: list[UnmapOp] = []     # background unmaps of skipped pages (taken by the facade)
        self.window_crossings = 0                  # steps that dropped or moved pages
        self.peak_pages_per_slot = 0

    def extent(self, slot: int) -> int:
        return self.base[slot] + self.mapped[slot]

    def _lookahead_maps(self, lookahead_tokens: Mapping[int, int]) -> list[MapOp]:
        return []                                  # window groups map at the crossing (module docstring)

    def _needs(self, target_tokens: Mapping[int, int]) -> list[tuple[int, int, int]]:
        needs, per_page, cap = [], self.config.tokens_per_page, self.config.max_pages_per_slot
        for slot, tokens in target_tokens.items():
            if not self.active[slot]:
                raise ValueError(f"step() for inactive slot {slot}")
            pages = -(-tokens // per_page)
            if pages > cap:
                raise ValueError(f"slot {slot} target {tokens} tokens exceeds the slot capacity")
            top = self.base[slot] + self.mapped[slot]
            if pages > top:
                needs.append((slot, top, pages - top))
        return needs

    def step(self, target_tokens: Mapping[int, int]) -> Plan | None:
        """Drop (or recycle) the pages below each slot's window, then map its new pages as
        :meth:`VAttentionPolicy.step`; ``None`` when the pool cannot cover the maps (the drops stay applied:
        those pages are never read again)."""
        front_unmaps: list[UnmapOp] = []
        per_page = self.config.tokens_per_page
        for slot, first_page, num_pages in self._needs(target_tokens):
            stale = min(self.group.skipped_tokens(self.computed[slot]) // per_page - self.base[slot],
                        self.mapped[slot])
            if stale <= 0:
                continue
            if self.mode == "recycle":
                stale = min(stale, num_pages)      # move as many handles as the new end needs
            op = self._drop_below_window(slot, stale)
            self.window_crossings += 1
            if self.background_unmaps and self.mode == "unmap":
                self.window_unmaps.append(op)
            else:
                front_unmaps.append(op)
        plan = super().step(target_tokens)
        for slot in target_tokens:
            self.peak_pages_per_slot = max(self.peak_pages_per_slot, self.mapped[slot])
        if plan is None:
            if front_unmaps:                       # performed anyway, with the retry's plan
                self.window_unmaps.extend(front_unmaps)
            return None
        if not front_unmaps:
            return plan
        return Plan(maps=plan.maps, unmaps=(*front_unmaps, *plan.unmaps))

    def _drop_below_window(self, slot: int, stale: int) -> UnmapOp:
        """Take the slot's ``stale`` lowest pages off it (back to the pool); returns their unmap."""
        op = UnmapOp(slot, self.base[slot], stale)
        self._add_mapped(slot, -stale)
        self.base[slot] += stale
        self.free_page_groups += stale
        return op

    def free_slot(self, slot: int, last_read_iteration: int) -> Plan:
        """As :meth:`VAttentionPolicy.free_slot`; a slot whose window moved unmaps its pages at once (deferred
        pages must start at page 0 for the next request)."""
        if self.active[slot] and self.base[slot] and not self.in_flight_maps[slot]:
            self._set_active(slot, False)
            self.last_read_iteration[slot] = last_read_iteration
            op = UnmapOp(slot, self.base[slot], self.mapped[slot]) if self.mapped[slot] else None
            if op is not None:
                self._add_mapped(slot, -op.num_pages)
                self.free_page_groups += op.num_pages
                self.dirty_free_page_groups += op.num_pages
            self.base[slot] = 0
            return Plan(unmaps=(op,)) if op is not None else EMPTY_PLAN
        return super().free_slot(slot, last_read_iteration)


class StateGroupPolicy(GroupPolicy):
    """Mamba / linear-attention state as paged vLLM holds it (``MambaManager``): one page group per running
    request, whatever its length."""

    holds_state = True

    def step(self, target_tokens: Mapping[int, int]) -> Plan | None:
        return super().step({slot: 1 for slot in target_tokens})

    def _lookahead_maps(self, lookahead_tokens: Mapping[int, int]) -> list[MapOp]:
        return []

    def extent(self, slot: int) -> int:
        return self.config.max_pages_per_slot if self.mapped[slot] else 0

    def surplus_pages(self, slot: int, keep_pages: int) -> int:
        return 0                      # one page group whatever the length


def _tag(plan: Plan | None, group: int) -> Plan | None:
    if not plan or group == 0:
        return plan
    return Plan(maps=tuple(replace(op, group=group) for op in plan.maps),
                unmaps=tuple(replace(op, group=group) for op in plan.unmaps))


def _merge(plans: Sequence[Plan]) -> Plan:
    maps = tuple(op for p in plans for op in p.maps)
    unmaps = tuple(op for p in plans for op in p.unmaps)
    return Plan(maps=maps, unmaps=unmaps) if maps or unmaps else EMPTY_PLAN


class HybridPolicy:
    """One worker's memory policy for a hybrid model: the sub-policies of its layer groups over one
    :class:`SharedPool` (module docstring), with :class:`VAttentionPolicy`'s interface.

    Args:
        groups: ``(sub-policy, ...)`` in group order (index = the ``group`` of the plans' ops); the first growing
            one picks each request's slot (best fit), the others take the same slot.
        pool: the shared pool.
        admission_watermark_frac: admit only while this fraction of the pool's units stays free.
    """

    duplicate_refs = 0     # (as VAttentionPolicy's: the used count of hybrid groups is their own)

    needs_computed = True
    """The caller sets ``computed[slot]`` (tokens computed before the step) for every slot it passes to
    :meth:`step` (``sim.core.engine`` does for short slots and admissions)."""

    def __init__(self, groups: Sequence[GroupPolicy], pool: SharedPool, admission_watermark_frac: float = 0.0):
        if not groups:
            raise ValueError("a hybrid policy needs at least one group")
        self.groups, self.pool = list(groups), pool
        self.config = replace(groups[0].config, pool_page_groups=pool.total_units)   # sizes in pool units
        num_slots = self.config.num_slots
        self.computed = [0] * num_slots
        self.mapped = [0] * num_slots
        self.in_flight_maps = [0] * num_slots
        self._growing = [g for g in self.groups if not isinstance(g, StateGroupPolicy)] or self.groups[:1]
        self._admission_units = int(admission_watermark_frac * pool.total_units)
        for g in self.groups:
            if isinstance(g, WindowGroupPolicy):
                g.computed = self.computed         # one list: the caller's hint reaches every window group

    # ---- queries ---------------------------------------------------------------------------------------
    @property
    def completed_iteration(self) -> int:
        return self.groups[0].completed_iteration

    @property
    def free_page_groups(self) -> int:
        """Free units of the pool."""
        return self.pool.free_units

    @property
    def mapped_page_groups(self) -> int:
        """Units held by mapped page groups of every group."""
        return sum(g.units * g.mapped_page_groups for g in self.groups)

    physical_page_groups = mapped_page_groups

    @property
    def deferred_page_groups(self) -> int:
        return sum(g.units * g.deferred_page_groups for g in self.groups)

    @property
    def window_crossings(self) -> int:
        """Steps of window groups that dropped or moved pages."""
        return sum(getattr(g, "window_crossings", 0) for g in self.groups)

    def used_and_waste(self, held_tokens: Mapping[int, int]) -> tuple[int, int]:
        """:func:`sim.memory.hybrid_units.used_and_waste` of this policy."""
        return used_and_waste(self, held_tokens)

    def group_mapped_page_groups(self) -> list[int]:
        """Page groups mapped per group (in each group's own page groups)."""
        return [g.mapped_page_groups for g in self.groups]

    def conservation_error(self) -> int:
        """``pool - (held units + free units)``; 0 when the pool is conserved (each group's counters checked)."""
        for g in self.groups:
            if g._mapped_total != sum(g.mapped):
                raise RuntimeError("mapped page-group counter out of step")
        held = sum(g.units * g.held_page_groups() for g in self.groups)
        return self.pool.total_units - held - self.pool.free_units

    def _refresh(self, slots) -> None:
        for slot in slots:
            self.mapped[slot] = min(g.extent(slot) for g in self._growing)
            self.in_flight_maps[slot] = sum(g.in_flight_maps[slot] for g in self.groups)

    def _refresh_plan(self, plan: Plan | None) -> Plan | None:
        if plan:
            self._refresh({op.slot for op in (*plan.maps, *plan.unmaps)})
        return plan

    # ---- admission ---------------------------------------------------------------------------------------
    def _fresh_units(self, slot: int, first_tokens: int, tokens: int) -> int:
        """Units the request's pages need beyond what ``slot`` maps: full groups ``ceil(tokens / p)`` pages;
        window groups the first chunk's pages (nothing is skipped before it is computed), or a window and a
        chunk's worth ``ceil((W - 1 + first) / p) + 1`` for the later chunks; state groups one."""
        return sum(g.units * max(0, self._admission_pages(g, first_tokens, tokens) - g.mapped[slot])
                   for g in self.groups)

    def _admission_pages(self, g: GroupPolicy, first_tokens: int, tokens: int) -> int:
        """Pages of group ``g`` an admission reserves (:meth:`_fresh_units`' rule, before what a slot maps)."""
        per_page = self.config.tokens_per_page
        if isinstance(g, StateGroupPolicy):
            return 1
        pages = -(-tokens // per_page)
        if isinstance(g, WindowGroupPolicy):
            later = -(-(g.group.window_tokens - 1 + first_tokens) // per_page) + 1
            return max(-(-first_tokens // per_page), min(pages, later))
        return pages

    def peak_units(self, prompt_tokens: int, final_kv_tokens: int, chunk_tokens: int,
                   reserve_tokens: int | None) -> int:
        """:func:`sim.memory.hybrid_units.peak_units` of this policy."""
        return peak_units(self, prompt_tokens, final_kv_tokens, chunk_tokens, reserve_tokens)

    def _pick(self, first_target_tokens, reserve_tokens, committed_page_groups, cached) -> int | None:
        """The slot an admission takes (None: none, or the pool cannot cover it). The first growing group picks it
        by best fit on the pages it will reserve (a window group: its window's share of the whole prompt); the
        pool's units decide whether it fits, every group's fresh units against the free units plus every group's
        reclaimable idle pages (the lead group's own count would see only its share: helper-52's Gemma
        requests were refused alone and rejected)."""
        lead = self._growing[0]
        tokens = max(first_target_tokens, reserve_tokens or 0)
        slot = lead._best_fit(self._admission_pages(lead, first_target_tokens, tokens))
        if slot is None or any(not g._allocatable(slot) or g.active[slot] for g in self.groups):
            return None
        committed = committed_page_groups * sum(g.units for g in self._growing)
        spare = self.pool.free_units - self._admission_units
        fresh = self._fresh_units(slot, first_target_tokens, tokens) + committed
        if fresh > spare and fresh > spare + self._reclaimable_units(slot) + self._surplus_units(slot, tokens):
            return None
        return slot

    def _surplus_units(self, slot: int, tokens: int) -> int:
        """Units the reused ``slot`` maps above ``tokens`` in its groups, which a short first step unmaps
        (:meth:`_trim_surplus`)."""
        keep = -(-tokens // self.config.tokens_per_page)
        return sum(g.units * g.surplus_pages(slot, keep) for g in self.groups)

    def _reclaimable_units(self, slot: int) -> int:
        """Units on idle slots other than ``slot`` that a step could unmap now (deferred or eager pages)."""
        return sum(g.units * (g._reclaimable_page_groups() - (g.mapped[slot] if slot not in g._in_flight_slots else 0))
                   for g in self.groups)

    def can_admit(self, first_target_tokens: int, reserve_tokens: int | None = None,
                  committed_page_groups: int = 0, cached: tuple[int, int] = (0, 0)) -> bool:
        """As :meth:`VAttentionPolicy.can_admit`, counting every group's fresh units against the shared pool."""
        return self._pick(first_target_tokens, reserve_tokens, committed_page_groups, cached) is not None

    def alloc_slot(self, first_target_tokens: int, reserve_tokens: int | None = None,
                   committed_page_groups: int = 0, cached: tuple[int, int] = (0, 0)) -> int | None:
        """As :meth:`VAttentionPolicy.alloc_slot`: one slot, taken in every group.

        Raises:
            ValueError: if ``first_target_tokens`` exceeds one slot's capacity.
        """
        self.config.check_first_target(first_target_tokens)
        slot = self._pick(first_target_tokens, reserve_tokens, committed_page_groups, cached)
        if slot is not None:
            for g in self.groups:
                g._set_active(slot, True)
            self.computed[slot] = 0
            self._refresh((slot,))
        return slot

    def free_slot(self, slot: int, last_read_iteration: int) -> Plan:
        """As :meth:`VAttentionPolicy.free_slot`, in every group."""
        plan = _merge([_tag(g.free_slot(slot, last_read_iteration), i) for i, g in enumerate(self.groups)])
        self._refresh((slot,))
        return plan

    def iteration_completed(self, iteration: int) -> None:
        for g in self.groups:
            g.iteration_completed(iteration)

    # ---- foreground ------------------------------------------------------------------------------------
    def step(self, target_tokens: Mapping[int, int]) -> Plan | None:
        """Every group's :meth:`VAttentionPolicy.step` for ``target_tokens`` (``computed`` set by the caller);
        when a group's maps do not fit, every idle slot of every group is reclaimed and that group retried;
        ``None`` when they still do not (the groups already stepped keep their maps, as they are needed by
        the retry after a preemption anyway)."""
        plans = []
        for index, g in enumerate(self.groups):
            plan = g.step(target_tokens)
            if plan is None:
                plans.append(self._reclaim_all_idle())
                plan = g.step(target_tokens)
            if plan is None:
                trimmed = self._trim_surplus(target_tokens)
                if trimmed:
                    plans.append(trimmed)
                    plan = g.step(target_tokens)
            if plan is None:
                pending = getattr(self, "_pending_front", None)   # performed with the retry's plan
                self._pending_front = _merge([p for p in (pending, *plans) if p])
                self._refresh(target_tokens)
                return None
            plans.append(_tag(plan, index))
        pending = getattr(self, "_pending_front", None)
        if pending:
            plans.insert(0, pending)
            self._pending_front = None
        self._refresh(target_tokens)
        return _merge(plans)

    def _trim_surplus(self, target_tokens: Mapping[int, int]) -> Plan:
        """Unmap, in every group, the pages each stepped slot maps above its target (module docstring)."""
        per_page = self.config.tokens_per_page
        plans = []
        for index, g in enumerate(self.groups):
            ops = [op for op in (g.trim_surplus(slot, -(-tokens // per_page)) for slot, tokens in target_tokens.items())
                   if op is not None]
            if ops:
                plans.append(_tag(Plan(unmaps=tuple(ops)), index))
        return self._refresh_plan(_merge(plans)) or EMPTY_PLAN

    def _reclaim_all_idle(self) -> Plan:
        plan = _merge([_tag(g.reclaim_idle(), i) for i, g in enumerate(self.groups)])
        return self._refresh_plan(plan) or EMPTY_PLAN

    def reclaim_idle(self) -> Plan:
        """Unmap every idle slot's deferred pages in every group (:meth:`VAttentionPolicy.reclaim_idle`)."""
        return self._reclaim_all_idle()

    def take_window_unmaps(self) -> Plan:
        """Unmaps of pages that left a window, for the background mapper (already applied to the accounting;
        not reserved: the executor performs them, nothing to commit)."""
        plans = []
        for index, g in enumerate(self.groups):
            if isinstance(g, WindowGroupPolicy) and g.window_unmaps:
                plans.append(_tag(Plan(unmaps=tuple(g.window_unmaps)), index))
                g.window_unmaps = []
        return _merge(plans)

    # ---- background ------------------------------------------------------------------------------------
    def background_plan(self, lookahead_tokens: Mapping[int, int]) -> Plan:
        """Every group's :meth:`VAttentionPolicy.background_plan` (window and state groups map no look-ahead)."""
        plan = _merge([_tag(g.background_plan(lookahead_tokens), i) for i, g in enumerate(self.groups)])
        return self._refresh_plan(plan) or EMPTY_PLAN

    def has_background_work(self) -> bool:
        return any(g.has_background_work() for g in self.groups)

    def idle_slots_mapping(self) -> list[int]:
        return sorted({s for g in self.groups for s in g.idle_slots_mapping()})

    def _untagged(self, op):
        return self.groups[op.group], replace(op, group=0)

    def commit(self, op: MapOp | UnmapOp) -> None:
        group, own = self._untagged(op)
        group.commit(own)
        self._refresh((op.slot,))

    def cancel(self, op: MapOp | UnmapOp) -> None:
        group, own = self._untagged(op)
        group.cancel(own)
        self._refresh((op.slot,))

    def reserved_is_recycled(self, op: MapOp) -> bool:
        group, own = self._untagged(op)
        return group.reserved_is_recycled(own)

    def take_recycled(self) -> int:
        return sum(g.take_recycled() for g in self.groups)

    def take_settled_unmaps(self) -> Plan:
        plan = _merge([_tag(g.take_settled_unmaps(), i) for i, g in enumerate(self.groups)])
        return plan or EMPTY_PLAN


def build_hybrid_policy(config, base: VAttentionConfig) -> HybridPolicy:
    """The :class:`HybridPolicy` of a :class:`sim.setup.config.SimConfig` with window-aware allocation
    (``config.layer_groups``, ``config.group_units``, ``config.pool_page_groups`` units; ``base``: the knobs
    :func:`sim.memory.build_policy` derived for the policy)."""
    pool = SharedPool(config.pool_page_groups)
    background_unmaps = config.has_async_mapper
    mode = config.window_alloc
    subs: list[GroupPolicy] = []
    for group, units in zip(config.layer_groups, config.group_units):
        if not units:
            continue                                    # vAttention's linear state: reserved at start-up
        sub_config = replace(base, pool_page_groups=max(1, config.pool_page_groups // units))
        if group.kind in ("sliding", "chunked"):
            subs.append(WindowGroupPolicy(sub_config, pool, units, group, mode, background_unmaps))
        elif group.kind == "linear":
            subs.append(StateGroupPolicy(replace(sub_config, eager_page_groups=0, eager_idle_slots=0), pool, units,
                                         group))
        else:
            subs.append(GroupPolicy(sub_config, pool, units, group))
    return HybridPolicy(subs, pool, base.admission_watermark_frac)
