"""A KV cache per layer group over one pool of physical handles: the hardware side of window-aware allocation
(:mod:`sim.memory.hybrid`).

Each group keeps vAttention's layout, one virtually contiguous K and V tensor per layer (``2 N_g`` reservations,
:class:`~hwbackend.vmm.kvcache.KVCache`); every group takes its handles from one shared free list, so a page that
leaves a sliding window (an ``UnmapOp`` of pages below the window, ``op.group`` naming the group) goes back to the
pool and can back any group's next map. The policy's unit (a K and a V page of one layer) is two handles::

    group 0 (full, N_0 layers):    2 N_0 reservations ─┐
    group 1 (sliding, N_1 layers): 2 N_1 reservations ─┼── one free list of pool_units x 2 handles
                                                        ┘
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hwbackend.vmm.driver import VmmDriver
from hwbackend.vmm.kvcache import KVCache, KVCacheLayout
from hwbackend.vmm.transaction import Transaction
from sim.memory.plan import Plan


class GroupedKVCache:
    """One :class:`KVCache` per layer group sharing ``pool_units * 2`` handles (created at :meth:`open`).

    Args:
        driver: real or emulated VMM driver.
        layouts: one layout per group (its ``num_sub_tensors`` = 2 x the group's layers; equal slots, pages per
            slot and page size).
        pool_units: the policy's pool (``sim.setup.config.SimConfig.pool_page_groups`` with window-aware allocation).

    Raises:
        ValueError: layouts that disagree on slots, pages or page size, or an empty pool.
    """

    HANDLES_PER_UNIT = 2          # a K page and a V page of one layer (sim.memory.hybrid_sizing)

    def __init__(self, driver: VmmDriver, layouts: Sequence[KVCacheLayout], pool_units: int):
        shapes = {(l.num_slots, l.max_pages_per_slot, l.page_size_bytes) for l in layouts}
        if len(shapes) != 1 or pool_units < 1:
            raise ValueError(f"group layouts must agree on slots, pages and page size and the pool must hold a "
                             f"unit: {shapes}, pool_units={pool_units}")
        self.driver, self.pool_page_groups = driver, pool_units
        self.groups = [KVCache(driver, layout, pool_page_groups=1, create_on_demand=True) for layout in layouts]
        self._free_handles: list[Any] = []
        for cache in self.groups:
            cache._free_handles = self._free_handles          # one pool
        self.layout = replace(layouts[0], num_sub_tensors=2)   # what Executor checks: slots, pages, pool
        self.bases: list[int] = []

    def open(self) -> "GroupedKVCache":
        """Reserve every group's ranges and create the shared handles; all or nothing."""
        with Transaction() as tx:
            for cache in self.groups:
                cache.create_on_demand = True                # reserve only: handles come from the shared list
                cache.open()
                tx.on_rollback(cache.close)
                cache.create_on_demand = False
            for _ in range(self.pool_page_groups * self.HANDLES_PER_UNIT):
                handle = self.driver.create(self.layout.page_size_bytes)
                tx.on_rollback(self.driver.release, handle)
                self._free_handles.append(handle)
                tx.on_rollback(self._free_handles.pop)
            self.bases = [base for cache in self.groups for base in cache.bases]
        return self

    def close(self) -> None:
        """Unmap and release everything (each group's close releases the shared handles it finds free)."""
        for cache in self.groups:
            cache.close()
        self.bases = []

    def __enter__(self) -> "GroupedKVCache":
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def apply(self, plan: Plan) -> None:
        """Perform ``plan`` (unmaps first, then maps; each op on its ``op.group``'s cache) as one transaction.

        Raises:
            VmmError / RuntimeError / ValueError: as :meth:`KVCache.apply`; everything done is undone first.
        """
        with Transaction() as tx:
            for op in plan.unmaps:
                self.groups[op.group]._unmap_pages(tx, replace(op, group=0))
            for op in plan.maps:
                self.groups[op.group]._map_pages(tx, replace(op, group=0))

    def mapped_pages(self, group: int, slot: int) -> list[int]:
        """Pages of ``slot`` mapped now in ``group``, ascending."""
        return self.groups[group].mapped_pages(slot)

    @property
    def num_free_handles(self) -> int:
        return len(self._free_handles)

    @classmethod
    def for_config(cls, driver: VmmDriver, config) -> "GroupedKVCache":
        """The grouped cache a :class:`sim.setup.config.SimConfig` with ``window_alloc`` unmap/recycle describes."""
        spec = config.model_spec
        base = KVCacheLayout.for_model(spec, config.max_batch_slots, config.slot_max_tokens, config.page_size_bytes,
                                       config.tp)
        layouts = [replace(base, num_sub_tensors=tensors) for tensors in config.group_sub_tensors]
        return cls(driver, layouts, config.pool_page_groups)
