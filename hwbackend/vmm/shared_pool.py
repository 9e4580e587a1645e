"""Two (or more) tenants' KV caches backed by one pool of physical pages (issue 34, the executor side of
:mod:`sim.memory.shared_pool`).

Each tenant keeps its own 2N' virtual reservations (its model's layers); the physical handles (cuMemCreate'd
pages of ``page_size_bytes``) belong to one :class:`SharedHandlePool`. A page a tenant unmaps goes back to the
pool still created, and the next tenant that needs a page maps that same handle into its own range: the page
handover is one cuMemUnmap in the giver's range and one cuMemMap + cuMemSetAccess in the taker's::

    tenant A  [slot 0: p0 p1 p2 ...]           tenant B  [slot 0: p0 ...]
                        | cuMemUnmap                       ^ cuMemMap + cuMemSetAccess
                        v                                  |
               SharedHandlePool: free handles  ------------+

Ceilings per tenant are enforced here as in the simulator (a take beyond the ceiling raises). Works on the
real driver and on the emulated one (:mod:`hwbackend.vmm.emulated`, ``tests/test_colocate_hw.py``).
"""
from __future__ import annotations

import threading
from typing import Any

from hwbackend.vmm.kvcache import KVCache, KVCacheLayout
from hwbackend.vmm.transaction import Transaction


class SharedHandlePool:
    """Physical page handles shared by several tenants' caches.

    Args:
        driver: the VMM driver (real or emulated).
        page_size_bytes: size of every handle (a multiple of the driver's granularity).
        num_pages: handles created by :meth:`open`.
        ceilings_pages: most handles each tenant may hold at once (one entry per tenant).
    """

    def __init__(self, driver: Any, page_size_bytes: int, num_pages: int, ceilings_pages: list[int]):
        if num_pages < 1 or not ceilings_pages or min(ceilings_pages) < 1:
            raise ValueError(f"a shared pool needs >= 1 page and ceilings >= 1, got {num_pages}, {ceilings_pages}")
        self.driver, self.page_size_bytes, self.num_pages = driver, page_size_bytes, num_pages
        self.ceilings_pages = list(ceilings_pages)
        self.held_pages = [0] * len(ceilings_pages)
        self.handed_over_pages = 0            # takes of a handle another tenant returned last
        self.moved_in_pages = [0] * len(ceilings_pages)   # the same, per taking tenant
        self._free: list[tuple[Any, int]] = []   # (handle, tenant that returned it; -1: never mapped)
        self._lock = threading.Lock()

    def open(self) -> "SharedHandlePool":
        """Create every handle (all or nothing)."""
        with Transaction() as tx:
            for _ in range(self.num_pages):
                handle = self.driver.create(self.page_size_bytes)
                tx.on_rollback(self.driver.release, handle)
                self._free.append((handle, -1))
                tx.on_rollback(self._free.pop)
        return self

    def close(self) -> None:
        """Release every free handle (tenants' caches close first and return theirs)."""
        with self._lock:
            while self._free:
                self.driver.release(self._free.pop()[0])

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def take(self, tenant: int) -> Any:
        """A handle for ``tenant``.

        Raises:
            RuntimeError: the pool is empty or the tenant is at its ceiling.
        """
        with self._lock:
            if self.held_pages[tenant] >= self.ceilings_pages[tenant]:
                raise RuntimeError(f"tenant {tenant} is at its ceiling ({self.ceilings_pages[tenant]} pages)")
            if not self._free:
                raise RuntimeError(f"shared page pool exhausted ({self.num_pages} pages)")
            handle, last = self._free.pop()
            self.held_pages[tenant] += 1
            moved = last not in (-1, tenant)
            self.handed_over_pages += moved
            self.moved_in_pages[tenant] += moved
            return handle

    def give_back(self, tenant: int, handles: list) -> None:
        """``tenant`` no longer maps ``handles``."""
        with self._lock:
            self._free.extend((h, tenant) for h in handles)
            self.held_pages[tenant] -= len(handles)

    def conservation_error(self) -> int:
        """``num_pages - free - sum(held)``; 0 when conserved."""
        return self.num_pages - len(self._free) - sum(self.held_pages)


class TenantKVCache(KVCache):
    """One tenant's :class:`KVCache` whose handles come from a :class:`SharedHandlePool`.

    Args:
        driver, layout: as :class:`KVCache` (the layout's page size must be the pool's).
        pool: the shared pool (opened); ``tenant``: this tenant's index in it.
    """

    def __init__(self, driver: Any, layout: KVCacheLayout, pool: SharedHandlePool, tenant: int):
        if layout.page_size_bytes != pool.page_size_bytes:
            raise ValueError(f"page size {layout.page_size_bytes} differs from the pool's {pool.page_size_bytes}")
        groups = max(1, pool.ceilings_pages[tenant] // layout.num_sub_tensors)
        super().__init__(driver, layout, groups, create_on_demand=True)
        self.pool, self.tenant = pool, tenant

    def open(self) -> "TenantKVCache":
        """Reserve the tenant's 2N' ranges; no handle is created (the pool owns them)."""
        return super().open()      # create_on_demand: the base creates nothing at open

    def _take_handle(self, tx: Transaction) -> Any:
        handle = self.pool.take(self.tenant)
        tx.on_rollback(self.pool.give_back, self.tenant, [handle])
        return handle

    def _return_handles(self, tx: Transaction, handles: list) -> None:
        self.pool.give_back(self.tenant, handles)
        tx.on_rollback(self._retake, list(handles))

    def _retake(self, handles: list) -> None:
        with self.pool._lock:
            for handle in handles:
                self.pool._free.remove(next(item for item in self.pool._free if item[0] is handle))
            self.pool.held_pages[self.tenant] += len(handles)

    @property
    def num_free_page_groups(self) -> int:
        room = self.pool.ceilings_pages[self.tenant] - self.pool.held_pages[self.tenant]
        return min(room, self.pool.free_pages) // self.layout.num_sub_tensors

    def close(self) -> None:
        """Unmap every page (handles back to the pool, not released) and free the reservations."""
        with self._lock:
            for (slot, page), handles in list(self._page_handles.items()):
                for t, _ in enumerate(handles):
                    self.driver.unmap(self.page_va(t, slot, page), self.layout.page_size_bytes)
                self.pool.give_back(self.tenant, handles)
                del self._page_handles[(slot, page)]
            while self.bases:
                self.driver.free_address(self.bases.pop(), self.layout.reservation_bytes)
