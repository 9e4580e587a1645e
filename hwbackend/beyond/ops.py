"""Beyond vAttention on real VMM calls (issue 10): prefix sharing of physical pages with copy-on-write, and
zero-on-reuse. The cross-layer layout is an option of :class:`hwbackend.vmm.kvcache.KVCacheLayout`
(``layers_per_sub_tensor``); its attention cost is measured by :mod:`hwbackend.beyond.layout`.

:class:`SharingKVCache` is a :class:`~hwbackend.vmm.kvcache.KVCache` that can

* **share** a slot's mapped pages with another slot: the *same* physical handles are mapped a second time
  into the other slot's range of every sub-tensor (one ``cuMemMap`` per handle, one ``cuMemSetAccess`` per
  sub-tensor over the shared run); a reference count per handle keeps it out of the pool until its last
  mapping is gone (``cuMemUnmap`` of one mapping leaves the others intact);
* **copy-on-write** a shared page of a slot (a partially filled last shared page that the slot will write
  into): take private handles from the pool, map them into a scratch reservation, copy the valid prefix
  bytes from the shared page, then unmap the slot's shared mapping and map the private handle at the same
  virtual address. The other slots keep the shared handle; a later write through the slot goes to its
  private page only;
* **zero** memory before a new request can read it (multi-tenant isolation): ``zero_on_map`` clears every
  page group as it is mapped (pages recycled from the pool still hold the previous owner's KV), and
  :meth:`SharingKVCache.zero_slot` clears the pages a reused slot kept mapped (deferred reclamation).

Bytes are cleared and copied by callables so that this module imports without torch or a GPU:
``memset_fn(va, nbytes)`` and ``copy_fn(dst_va, src_va, nbytes)``; :func:`cuda_memset_fn` and
:func:`cuda_copy_fn` make them from ``cuMemsetD32Async`` / ``cuMemcpyDtoDAsync`` on a stream. The emulated
driver tests pass recording callables.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from hwbackend.vmm.kvcache import KVCache, KVCacheLayout, _attempt
from hwbackend.vmm.transaction import Transaction
from sim.memory.plan import MapOp, UnmapOp

MemsetFn = Callable[[int, int], None]
CopyFn = Callable[[int, int, int], None]


def handle_key(handle: Any) -> int:
    """A hashable identity of a physical handle (an ``int`` for both drivers)."""
    try:
        return int(handle)
    except (TypeError, ValueError):
        return id(handle)


class SharingKVCache(KVCache):
    """A KV cache whose physical pages can be mapped into several slots, copied on write, and cleared.

    Args:
        driver, layout, pool_page_groups, create_on_demand: as :class:`~hwbackend.vmm.kvcache.KVCache`.
        memset_fn: ``memset_fn(va, nbytes)`` clears device memory (needed by ``zero_on_map`` and
            :meth:`zero_slot`).
        zero_on_map: clear every page group when it is mapped (recycled pages hold stale KV).

    Attributes:
        zeroed_bytes: bytes cleared so far. copied_bytes: bytes copied by copy-on-write so far.
    """

    def __init__(self, driver: Any, layout: KVCacheLayout, pool_page_groups: int, create_on_demand: bool = False,
                 memset_fn: MemsetFn | None = None, zero_on_map: bool = False):
        super().__init__(driver, layout, pool_page_groups, create_on_demand)
        if zero_on_map and memset_fn is None:
            raise ValueError("zero_on_map needs a memset_fn")
        self.memset_fn, self.zero_on_map = memset_fn, zero_on_map
        self._mappings: Counter[int] = Counter()  # handle key -> live mappings (absent: pooled or 1 private)
        self._scratch: int | None = None
        self.zeroed_bytes = self.copied_bytes = 0

    # ---- queries -------------------------------------------------------------------------------------
    def handles_of(self, slot: int, page: int) -> list[Any]:
        """The physical handles (one per sub-tensor) mapped at ``page`` of ``slot``."""
        with self._lock:
            return list(self._page_handles[(slot, page)])

    def mapping_count(self, handle: Any) -> int:
        """How many virtual ranges map ``handle`` now (0: in the pool)."""
        key = handle_key(handle)
        with self._lock:
            return sum(handle_key(h) == key for hs in self._page_handles.values() for h in hs)

    def is_shared(self, slot: int, page: int) -> bool:
        """Whether any handle of ``page`` of ``slot`` is mapped elsewhere too."""
        with self._lock:
            return any(self._mappings.get(handle_key(h), 1) > 1 for h in self._page_handles[(slot, page)])

    # ---- sharing ---------------------------------------------------------------------------------------
    def share(self, src_slot: int, dst_slot: int, first_page: int, num_pages: int) -> None:
        """Map the handles of ``src_slot``'s pages ``[first_page, first_page + num_pages)`` into the same pages of
        ``dst_slot`` (prefix pages sit at the same positions in every slot). All or nothing.

        Raises:
            RuntimeError: a source page is not mapped or a destination page is already mapped.
        """
        pages = self._pages(MapOp(dst_slot, first_page, num_pages))
        size = self.layout.page_size_bytes
        with self._lock, Transaction() as tx:
            for page in pages:
                if (src_slot, page) not in self._page_handles:
                    raise RuntimeError(f"page {page} of slot {src_slot} is not mapped: nothing to share")
                if (dst_slot, page) in self._page_handles:
                    raise RuntimeError(f"page {page} of slot {dst_slot} is already mapped")
            for page in pages:
                handles = list(self._page_handles[(src_slot, page)])
                self._page_handles[(dst_slot, page)] = handles
                tx.on_rollback(self._page_handles.pop, (dst_slot, page))
                for handle in handles:
                    self._add_mapping(tx, handle, +1)
            for t in range(self.layout.num_sub_tensors):
                for page in pages:
                    va = self.page_va(t, dst_slot, page)
                    self.driver.map(va, size, self._page_handles[(dst_slot, page)][t])
                    tx.on_rollback(self.driver.unmap, va, size)
                self.driver.set_access(self.page_va(t, dst_slot, first_page), size * num_pages)

    def _add_mapping(self, tx: Transaction, handle: Any, delta: int) -> None:
        key = handle_key(handle)
        before = self._mappings.get(key, 1)
        after = before + delta
        if after <= 1:
            self._mappings.pop(key, None)
        else:
            self._mappings[key] = after
        tx.on_rollback(self._set_count, key, before)

    def _set_count(self, key: int, count: int) -> None:
        if count <= 1:
            self._mappings.pop(key, None)
        else:
            self._mappings[key] = count

    # ---- copy-on-write -----------------------------------------------------------------------------------
    def copy_on_write(self, slot: int, page: int, valid_bytes: int, copy_fn: CopyFn,
                      sync_fn: Callable[[], None] | None = None) -> None:
        """Give ``slot`` a private copy of its shared ``page``: the first ``valid_bytes`` of the page in every
        sub-tensor are copied into fresh pool pages, which then replace the shared mapping at the same virtual
        addresses. The other slots keep the shared handles. All or nothing.

        Args:
            valid_bytes: bytes of each sub-tensor's page that hold KV (``tokens * layout.bytes_per_token``).
            copy_fn: ``copy_fn(dst_va, src_va, nbytes)``; ``sync_fn``: waits for the copies (called before the
                scratch mapping is removed).
        """
        size, n = self.layout.page_size_bytes, self.layout.num_sub_tensors
        if not 0 <= valid_bytes <= size:
            raise ValueError(f"valid_bytes {valid_bytes} outside one page ({size} B)")
        with self._lock, Transaction() as tx:
            old = self._page_handles.get((slot, page))
            if old is None:
                raise RuntimeError(f"page {page} of slot {slot} is not mapped")
            if not self.is_shared(slot, page):
                raise RuntimeError(f"page {page} of slot {slot} is not shared: nothing to copy")
            scratch = self._scratch_base()
            new = [self._take_handle(tx) for _ in range(n)]
            for t, handle in enumerate(new):
                self.driver.map(scratch + t * size, size, handle)
                tx.on_rollback(self.driver.unmap, scratch + t * size, size)
            self.driver.set_access(scratch, n * size)
            if valid_bytes:
                for t in range(n):
                    copy_fn(scratch + t * size, self.page_va(t, slot, page), valid_bytes)
                if sync_fn is not None:
                    sync_fn()
            for t in range(n):
                self.driver.unmap(scratch + t * size, size)
            tx.on_rollback(_remap_all, self, [(scratch + t * size, h) for t, h in enumerate(new)])
            for t, (old_handle, new_handle) in enumerate(zip(old, new)):
                va = self.page_va(t, slot, page)
                self.driver.unmap(va, size)
                tx.on_rollback(self._remap, va, old_handle)
                self.driver.map(va, size, new_handle)
                tx.on_rollback(self.driver.unmap, va, size)
                self.driver.set_access(va, size)
                self._add_mapping(tx, old_handle, -1)
            self._page_handles[(slot, page)] = new
            tx.on_rollback(self._page_handles.__setitem__, (slot, page), old)
            self.copied_bytes += valid_bytes * n

    def _scratch_base(self) -> int:
        if self._scratch is None:
            self._scratch = self.driver.reserve(self.layout.num_sub_tensors * self.layout.page_size_bytes,
                                                self.layout.page_size_bytes)
        return self._scratch

    # ---- zeroing -------------------------------------------------------------------------------------
    def zero_slot(self, slot: int) -> int:
        """Clear every page ``slot`` has mapped (a reused slot's stale KV); returns the bytes cleared.

        Shared pages are skipped (they hold a live prefix, not another tenant's stale data)."""
        if self.memset_fn is None:
            raise ValueError("zero_slot needs a memset_fn")
        size, cleared = self.layout.page_size_bytes, 0
        with self._lock:
            pages = [p for p in self.mapped_pages(slot) if not self.is_shared(slot, p)]
            for first, count in _runs(pages):
                for t in range(self.layout.num_sub_tensors):
                    self.memset_fn(self.page_va(t, slot, first), count * size)
                cleared += count * size * self.layout.num_sub_tensors
        self.zeroed_bytes += cleared
        return cleared

    def _map_pages(self, tx: Transaction, op: MapOp) -> None:
        super()._map_pages(tx, op)
        if self.zero_on_map:
            size = op.num_pages * self.layout.page_size_bytes
            for t in range(self.layout.num_sub_tensors):
                self.memset_fn(self.page_va(t, op.slot, op.first_page), size)
            self.zeroed_bytes += size * self.layout.num_sub_tensors

    # ---- unmapping with reference counts -----------------------------------------------------------------
    def _return_handles(self, tx: Transaction, handles: list) -> None:
        """A handle still mapped by another slot stays out of the pool (its mapping count drops by one)."""
        freed = []
        for handle in handles:
            if self._mappings.get(handle_key(handle), 1) > 1:
                self._add_mapping(tx, handle, -1)
            else:
                freed.append(handle)
        self._free_handles.extend(freed)
        tx.on_rollback(_drop_last_n, self._free_handles, len(freed))

    def close(self) -> None:
        """Unmap every mapping, release every handle once, free every reservation and the scratch range."""
        errors: list[Exception] = []
        with self._lock:
            owned: dict[int, Any] = {}
            for (slot, page), handles in list(self._page_handles.items()):
                for t, handle in enumerate(handles):
                    if _attempt(errors, self.driver.unmap, self.page_va(t, slot, page), self.layout.page_size_bytes):
                        owned[handle_key(handle)] = handle
                del self._page_handles[(slot, page)]
            self._mappings.clear()
            self._free_handles.extend(owned.values())
            while self._free_handles:
                if _attempt(errors, self.driver.release, self._free_handles.pop()):
                    self._num_handles -= 1
            while self.bases:
                _attempt(errors, self.driver.free_address, self.bases.pop(), self.layout.reservation_bytes)
            if self._scratch is not None:
                _attempt(errors, self.driver.free_address, self._scratch,
                         self.layout.num_sub_tensors * self.layout.page_size_bytes)
                self._scratch = None
        if errors:
            for other in errors[1:]:
                errors[0].add_note(f"teardown also failed: {other!r}")
            raise errors[0]


def _remap_all(cache: KVCache, pairs: list[tuple[int, Any]]) -> None:
    for va, handle in pairs:
        cache._remap(va, handle)


def _drop_last_n(items: list, count: int) -> None:
    if count:
        del items[len(items) - count:]


def _runs(pages: list[int]) -> list[tuple[int, int]]:
    """Ascending pages as (first, count) runs of adjacent pages."""
    runs: list[tuple[int, int]] = []
    for page in pages:
        if runs and runs[-1][0] + runs[-1][1] == page:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((page, 1))
    return runs


# ---- device byte operations through the driver (no torch) ----------------------------------------------
def cuda_memset_fn(driver: Any, stream_handle: int = 0) -> MemsetFn:
    """``memset_fn(va, nbytes)`` clearing with ``cuMemsetD32Async`` (``nbytes % 4 == 0``; else ``D8``) on a stream."""
    drv = driver._drv

    def memset(va: int, nbytes: int) -> None:
        if nbytes % 4 == 0:
            driver._checked("cuMemsetD32Async", drv.cuMemsetD32Async, va, 0, nbytes // 4, stream_handle)
        else:
            driver._checked("cuMemsetD8Async", drv.cuMemsetD8Async, va, 0, nbytes, stream_handle)
    return memset


def cuda_copy_fn(driver: Any, stream_handle: int = 0) -> CopyFn:
    """``copy_fn(dst_va, src_va, nbytes)`` with ``cuMemcpyDtoDAsync`` on a stream."""
    drv = driver._drv

    def copy(dst_va: int, src_va: int, nbytes: int) -> None:
        driver._checked("cuMemcpyDtoDAsync", drv.cuMemcpyDtoDAsync, dst_va, src_va, nbytes, stream_handle)
    return copy


def cuda_sync_fn(driver: Any, stream_handle: int = 0) -> Callable[[], None]:
    """Waits for a stream (``cuStreamSynchronize``)."""
    drv = driver._drv
    return lambda: driver._checked("cuStreamSynchronize", drv.cuStreamSynchronize, stream_handle)
