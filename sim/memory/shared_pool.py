"""One physical KV page pool shared by several models on one GPU (kvcached-style elastic sharing).

Each tenant (a model served on the GPU) keeps its own vAttention slots and virtual ranges; the physical pages
behind them come from one pool of ``pool_pages`` pages of ``page_size_bytes`` (the GPU's memory after every
tenant's weights: ``memory_util x HBM - sum(weights)``). A tenant's page group costs it ``pages_per_group``
physical pages (its 2N' sub-tensors), so tenants of different depth draw at different rates::

    pool (physical pages) ==draw==> tenant A: mapped + in-flight groups x 2N'_A
         ^                \\-draw--> tenant B: mapped + in-flight groups x 2N'_B
         |  release (unmap + cuMemRelease, at once: kvcached frees a page's physical memory when it unmaps it)
         +----------------------------------------------------------------------------------------------

Conservation (checked by ``tests/test_colocate_pool.py``, Hypothesis)::

    free_pages + sum_i held_groups_i x pages_per_group_i == pool_pages

Per tenant: a **ceiling** (at most this many page groups held: kvcached's per-instance limit, ``kvctl limit``,
``kvcached/kv_cache_manager.py`` ``resize``) and a **floor** (page groups no other tenant may take: the pool
keeps ``max(0, floor_j - held_j)`` groups' pages of every other tenant j out of tenant i's reach).

The mechanism (kvcached ``csrc/page_allocator.cpp``): a page is mapped (cuMemCreate + cuMemMap) when the engine
needs it and unmapped with its physical memory released when it is freed beyond the engine's small reserve of
mapped-but-unused pages; ``trim()`` unmaps that reserve. Here the vAttention policy's mapped pages on idle slots
(deferred reclamation, eager pre-mapping) play the reserve; :mod:`sim.cluster.colocate` trims them after an idle
delay. Pure logic: no time, no SimPy.
"""
from __future__ import annotations

from dataclasses import dataclass

from sim.memory.vattention import VAttentionConfig, VAttentionPolicy


@dataclass(frozen=True)
class TenantShare:
    """One tenant's place in the shared pool.

    Attributes:
        pages_per_group: physical pages one of its page groups takes (2N', its K/V sub-tensors).
        floor_groups: page groups kept out of the other tenants' reach (0: none).
        ceiling_groups: most page groups it may hold (>= floor_groups, >= 1).
    """

    pages_per_group: int
    floor_groups: int
    ceiling_groups: int

    def __post_init__(self) -> None:
        if self.pages_per_group < 1:
            raise ValueError(f"pages_per_group must be >= 1, got {self.pages_per_group}")
        if not 0 <= self.floor_groups <= self.ceiling_groups or self.ceiling_groups < 1:
            raise ValueError(f"a tenant needs 0 <= floor ({self.floor_groups}) <= ceiling ({self.ceiling_groups}) "
                             "and a ceiling >= 1 page group")


class SharedPagePool:
    """The physical page pool and each tenant's holding (page groups), with page moves between tenants.

    Args:
        pool_pages: physical pages the pool holds (``kv bytes // page_size_bytes``).
        shares: one :class:`TenantShare` per tenant, in tenant order.

    Raises:
        ValueError: when the floors' pages exceed the pool.
    """

    def __init__(self, pool_pages: int, shares: list[TenantShare]):
        floors = sum(s.floor_groups * s.pages_per_group for s in shares)
        if floors > pool_pages:
            raise ValueError(f"the tenants' floors need {floors} pages, more than the pool's {pool_pages}")
        self.pool_pages, self.shares = pool_pages, list(shares)
        self.free_pages = pool_pages
        self.held_groups = [0] * len(shares)
        self.peak_groups = [0] * len(shares)
        # free pages by the tenant that last held them (index n: never held), for the handover count
        self._free_by_owner = [0] * len(shares) + [pool_pages]
        self.moved_in_pages = [0] * len(shares)     # pages a tenant took that another tenant had released
        self.drawn_pages = [0] * len(shares)
        self.released_pages = [0] * len(shares)
        # per tenant, a callable that unmaps its mapped-but-unused reserve (idle slots' pages) and returns the
        # page groups freed: sim.cluster.colocate's trim; None where no one registered
        self.reclaimers: list = [None] * len(shares)

    def reclaim_for(self, tenant: int) -> int:
        """Trim every other tenant's mapped-but-unused reserve (kvcached's ``trim()``, here on demand: a tenant
        short of pages gets back what the others hold on idle slots, their deferred and eager pages) before
        ``tenant`` gives up; returns the page groups freed."""
        return sum(reclaim() for j, reclaim in enumerate(self.reclaimers) if j != tenant and reclaim is not None)

    def drawable_groups(self, tenant: int) -> int:
        """Page groups ``tenant`` could draw now: within its ceiling, leaving the other tenants' unmet floors."""
        share = self.shares[tenant]
        kept = sum(max(0, s.floor_groups - self.held_groups[j]) * s.pages_per_group
                   for j, s in enumerate(self.shares) if j != tenant)
        by_pages = max(0, self.free_pages - kept) // share.pages_per_group
        return max(0, min(share.ceiling_groups - self.held_groups[tenant], by_pages))

    def draw(self, tenant: int, groups: int) -> None:
        """``tenant`` maps ``groups`` more page groups from the pool.

        Raises:
            RuntimeError: beyond :meth:`drawable_groups` (the policy asked for pages it was not offered).
        """
        if groups > self.drawable_groups(tenant):
            raise RuntimeError(f"tenant {tenant} drew {groups} page groups, only {self.drawable_groups(tenant)} "
                               "were drawable")
        pages = groups * self.shares[tenant].pages_per_group
        self.free_pages -= pages
        self.held_groups[tenant] += groups
        self.peak_groups[tenant] = max(self.peak_groups[tenant], self.held_groups[tenant])
        self.drawn_pages[tenant] += pages
        for owner in (tenant, len(self.shares), *range(len(self.shares))):   # own first, then fresh, then others
            take = min(pages, self._free_by_owner[owner])
            self._free_by_owner[owner] -= take
            if owner not in (tenant, len(self.shares)):
                self.moved_in_pages[tenant] += take
            pages -= take

    def release(self, tenant: int, groups: int) -> None:
        """``tenant`` unmaps ``groups`` page groups and returns their physical pages.

        Raises:
            RuntimeError: releasing more than it holds.
        """
        if groups > self.held_groups[tenant]:
            raise RuntimeError(f"tenant {tenant} released {groups} page groups, it holds {self.held_groups[tenant]}")
        pages = groups * self.shares[tenant].pages_per_group
        self.held_groups[tenant] -= groups
        self.free_pages += pages
        self._free_by_owner[tenant] += pages
        self.released_pages[tenant] += pages

    def conservation_error(self) -> int:
        """``pool - free - sum(held x pages per group)`` in pages; 0 when conserved."""
        held = sum(g * s.pages_per_group for g, s in zip(self.held_groups, self.shares))
        return self.pool_pages - self.free_pages - held


class SharedPoolPolicy(VAttentionPolicy):
    """A tenant's vAttention policy whose free page groups are the shared pool's drawable ones.

    The base policy's ``free_page_groups`` counter becomes a view: reading it gives
    :meth:`SharedPagePool.drawable_groups`; lowering it draws from the pool, raising it releases pages to the
    pool at once (an unmap releases the physical memory, as kvcached does). So every rule of the base policy
    (admission watermark, look-ahead, eager pre-mapping, low-watermark reclamation of idle slots) sees the
    pool as it is, other tenants included. ``config.pool_page_groups`` is the tenant's ceiling.

    Args:
        config: the tenant's sizes and knobs (``pool_page_groups`` = its ceiling).
        pool: the shared pool; ``tenant``: this tenant's index in it.
    """

    refusals_repeat = False
    """Other tenants change what this one may draw, beside its own admission epoch (:mod:`sim.memory.vattention`,
    "Admission epoch"): the serving loop retries every refused admission."""

    def __init__(self, config: VAttentionConfig, pool: SharedPagePool, tenant: int):
        self._pool, self._tenant, self._bound = pool, tenant, False
        super().__init__(config)
        self._bound = True

    @property
    def free_page_groups(self) -> int:
        if not self._bound:
            return 0
        return self._pool.drawable_groups(self._tenant)

    @free_page_groups.setter
    def free_page_groups(self, value: int) -> None:
        if not self._bound:      # the base constructor's "all handles free": nothing is held yet
            return
        delta = value - self._pool.drawable_groups(self._tenant)
        if delta < 0:
            self._pool.draw(self._tenant, -delta)
        elif delta > 0:
            self._pool.release(self._tenant, delta)

    @property
    def held_page_groups(self) -> int:
        """Page groups this tenant holds in the pool (mapped + in-flight maps + in-flight unmaps)."""
        return self._pool.held_groups[self._tenant]

    def conservation_error(self) -> int:
        """``held - (mapped + in-flight)`` for this tenant; 0 when its holding matches its mappings."""
        if self._mapped_total != sum(self.mapped):
            raise RuntimeError("mapped page-group counter out of step")
        held = sum(self.mapped) + sum(self.in_flight_maps) + self.in_flight_unmaps
        return self.held_page_groups - held

    def step(self, target_tokens):
        """As :meth:`VAttentionPolicy.step`; when the pool cannot cover it, the other tenants' reserves are
        trimmed (:meth:`SharedPagePool.reclaim_for`) and the step is tried once more before giving up."""
        plan = super().step(target_tokens)
        if plan is None and self._pool.reclaim_for(self._tenant):
            plan = super().step(target_tokens)
        return plan

    def trim_idle(self) -> list:
        """kvcached's ``trim()``: unmap every idle slot's pages (the mapped-but-unused reserve), returning
        their physical pages to the pool; returns the unmap ops for the executor to perform."""
        return list(self.reclaim_idle().unmaps)
