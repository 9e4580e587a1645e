"""An emulated VMM driver: the interface of :class:`hwbackend.vmm.driver.CudaVmmDriver` with strict semantics
and no GPU, so CPU-only CI exercises the same KV cache and executor code (style.md #9).

It is *stricter* than the real driver where the real one would silently do something the backend must
never rely on. Every violation raises :class:`~hwbackend.vmm.driver.VmmError` with a CUDA error name and a
``detail`` naming the rule:

* sizes (reserve, create, map, unmap, set-access) must be positive multiples of ``granularity_bytes``;
* a mapping must lie inside one reservation, cover a whole handle (offset 0) and not overlap a mapping;
* unmap must cover whole mappings only; set-access only mapped granules;
* a handle still mapped cannot be released; a reservation still holding mappings cannot be freed;
* created handles may not exceed ``capacity_bytes`` (``CUDA_ERROR_OUT_OF_MEMORY``).

Every call is counted and timed in ``stats`` exactly like the real driver. Fault injection:
``inject_fault("cuMemMap", nth=40)`` makes the 40th ``cuMemMap`` from now fail (no state change), as an
out-of-memory on the 40th page of a page group would. ``delay_us`` adds a sleep per call, to emulate
driver latency (e.g. ``{"cuMemSetAccess": 50}``) when testing that a background thread hides it.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Mapping

from hwbackend.vmm.driver import CallStats, VmmError

MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40
_VA_BASE = 0x7F00_0000_0000  # where emulated reservations start (any nonzero, aligned value works)


class CompletedEvent:
    """An event that is always complete: the emulated GPU finishes work as soon as it is launched."""

    def query(self) -> bool:
        """Always True."""
        return True

    def synchronize(self) -> None:
        """Nothing to wait for."""

    def close(self) -> None:
        """Nothing to free."""


class EmulatedVmmDriver:
    """Strict in-process emulation of the VMM calls.

    Args:
        granularity_bytes: allocation granularity (2 MiB as measured on H200, domain.md).
        capacity_bytes: physical memory that handles may take in total.
        va_limit_bytes: virtual addresses that may be reserved in total (64 TiB succeeded on H200).
        delay_us: call name -> emulated latency in microseconds (slept, outside the lock).
        device_ordinal: reported device index.
    """

    def __init__(self, granularity_bytes: int = 2 * MIB, capacity_bytes: int = 8 * GIB,
                 va_limit_bytes: int = 64 * TIB, delay_us: Mapping[str, float] | None = None,
                 device_ordinal: int = 0):
        if granularity_bytes <= 0 or capacity_bytes < 0:
            raise ValueError(f"granularity_bytes={granularity_bytes} and capacity_bytes={capacity_bytes} "
                             "must be positive")
        self.granularity_bytes = self.min_granularity_bytes = granularity_bytes
        self.capacity_bytes, self.va_limit_bytes = capacity_bytes, va_limit_bytes
        self.device_ordinal = device_ordinal
        self.delay_us = dict(delay_us or {})
        self.stats = CallStats()
        self._lock = threading.Lock()
        self._reservations: dict[int, int] = {}          # base va -> size_bytes
        self._handles: dict[int, int] = {}               # handle -> size_bytes
        self._mappings: dict[int, tuple[int, int]] = {}  # start va -> (size_bytes, handle)
        self._granule_owner: dict[int, int] = {}         # granule va -> start va of its mapping
        self._accessible: set[int] = set()               # granule vas with read/write access
        self._handle_uses: Counter[int] = Counter()      # handle -> number of mappings
        self._faults: dict[str, dict[int, str]] = {}     # call -> absolute call index -> error name
        self._next_va, self._next_handle = _VA_BASE, 1

    # ---- instrumentation -----------------------------------------------------------------------------
    def inject_fault(self, call: str, nth: int = 1, error_name: str = "CUDA_ERROR_OUT_OF_MEMORY") -> None:
        """Make the ``nth`` call of ``call`` from now on fail with ``error_name`` (state unchanged)."""
        if nth < 1:
            raise ValueError(f"nth must be >= 1, got {nth}")
        self._faults.setdefault(call, {})[self.stats.count(call) + nth] = error_name

    def live_objects(self) -> dict[str, int]:
        """Reservations, handles and mappings alive now (all zero after a clean teardown)."""
        with self._lock:
            return {"reservations": len(self._reservations), "handles": len(self._handles),
                    "mappings": len(self._mappings)}

    def is_accessible(self, va: int, size_bytes: int) -> bool:
        """Whether every granule of ``[va, va + size_bytes)`` is mapped with read/write access."""
        with self._lock:
            return all(g in self._accessible for g in self._granules(va, size_bytes))

    # ---- the counted call ----------------------------------------------------------------------------
    def _begin(self, call: str, args: tuple) -> None:
        delay_us = self.delay_us.get(call, 0.0)
        if delay_us:
            time.sleep(delay_us * 1e-6)
        self.stats.record(call, delay_us)
        error_name = self._faults.get(call, {}).pop(self.stats.count(call), None)
        if error_name is not None:
            raise VmmError(call, error_name, args, "injected fault")

    def _check_size(self, call: str, args: tuple, size_bytes: int) -> None:
        if size_bytes <= 0 or size_bytes % self.granularity_bytes:
            raise VmmError(call, "CUDA_ERROR_INVALID_VALUE", args,
                           f"size {size_bytes} is not a positive multiple of {self.granularity_bytes}")

    def _granules(self, va: int, size_bytes: int) -> range:
        return range(va, va + size_bytes, self.granularity_bytes)

    def _reservation_of(self, va: int, size_bytes: int) -> int | None:
        for base, reserved in self._reservations.items():
            if base <= va and va + size_bytes <= base + reserved:
                return base
        return None

    # ---- VMM calls -----------------------------------------------------------------------------------
    def make_current(self) -> None:
        """No context to bind; counted for parity with the real driver."""
        self._begin("cuCtxSetCurrent", ())

    def reserve(self, size_bytes: int, alignment_bytes: int = 0) -> int:
        """Reserve virtual addresses; returns the base address."""
        args = (size_bytes, alignment_bytes, 0, 0)
        self._begin("cuMemAddressReserve", args)
        self._check_size("cuMemAddressReserve", args, size_bytes)
        with self._lock:
            if sum(self._reservations.values()) + size_bytes > self.va_limit_bytes:
                raise VmmError("cuMemAddressReserve", "CUDA_ERROR_OUT_OF_MEMORY", args, "virtual address limit")
            align = max(alignment_bytes, self.granularity_bytes)
            base = -(-self._next_va // align) * align
            self._next_va = base + size_bytes + self.granularity_bytes  # a guard gap between reservations
            self._reservations[base] = size_bytes
        return base

    def free_address(self, va: int, size_bytes: int) -> None:
        """Free a whole reservation that holds no mapping."""
        args = (va, size_bytes)
        self._begin("cuMemAddressFree", args)
        with self._lock:
            if self._reservations.get(va) != size_bytes:
                raise VmmError("cuMemAddressFree", "CUDA_ERROR_INVALID_VALUE", args, "not a whole reservation")
            if any(va <= start < va + size_bytes for start in self._mappings):
                raise VmmError("cuMemAddressFree", "CUDA_ERROR_INVALID_VALUE", args, "reservation still mapped")
            del self._reservations[va]

    def create(self, size_bytes: int) -> int:
        """Create a physical handle of ``size_bytes``."""
        args = (size_bytes,)
        self._begin("cuMemCreate", args)
        self._check_size("cuMemCreate", args, size_bytes)
        with self._lock:
            if sum(self._handles.values()) + size_bytes > self.capacity_bytes:
                raise VmmError("cuMemCreate", "CUDA_ERROR_OUT_OF_MEMORY", args, "physical capacity exceeded")
            handle, self._next_handle = self._next_handle, self._next_handle + 1
            self._handles[handle] = size_bytes
        return handle

    def release(self, handle: int) -> None:
        """Release a handle that is not mapped anywhere."""
        args = (handle,)
        self._begin("cuMemRelease", args)
        with self._lock:
            if handle not in self._handles:
                raise VmmError("cuMemRelease", "CUDA_ERROR_INVALID_VALUE", args, "unknown handle")
            if self._handle_uses[handle]:
                raise VmmError("cuMemRelease", "CUDA_ERROR_INVALID_VALUE", args, "handle still mapped")
            del self._handles[handle]

    def map(self, va: int, size_bytes: int, handle: int) -> None:
        """Map a whole handle at ``va`` inside a reservation, over no existing mapping."""
        args = (va, size_bytes, 0, handle, 0)
        self._begin("cuMemMap", args)
        self._check_size("cuMemMap", args, size_bytes)
        with self._lock:
            if self._handles.get(handle) != size_bytes:
                raise VmmError("cuMemMap", "CUDA_ERROR_INVALID_VALUE", args, "unknown handle or size mismatch")
            if va % self.granularity_bytes or self._reservation_of(va, size_bytes) is None:
                raise VmmError("cuMemMap", "CUDA_ERROR_INVALID_VALUE", args, "outside any reservation")
            granules = self._granules(va, size_bytes)
            if any(g in self._granule_owner for g in granules):
                raise VmmError("cuMemMap", "CUDA_ERROR_INVALID_VALUE", args, "range already mapped")
            self._mappings[va] = (size_bytes, handle)
            self._granule_owner.update((g, va) for g in granules)
            self._handle_uses[handle] += 1

    def unmap(self, va: int, size_bytes: int) -> None:
        """Unmap ``[va, va + size_bytes)``, which must consist of whole mappings."""
        args = (va, size_bytes)
        self._begin("cuMemUnmap", args)
        self._check_size("cuMemUnmap", args, size_bytes)
        with self._lock:
            starts = self._whole_mappings(va, size_bytes)
            if starts is None:
                raise VmmError("cuMemUnmap", "CUDA_ERROR_INVALID_VALUE", args, "not whole mappings")
            for start in starts:
                mapped_bytes, handle = self._mappings.pop(start)
                for g in self._granules(start, mapped_bytes):
                    del self._granule_owner[g]
                    self._accessible.discard(g)
                self._handle_uses[handle] -= 1

    def _whole_mappings(self, va: int, size_bytes: int) -> list[int] | None:
        starts, cursor = [], va
        while cursor < va + size_bytes:
            if self._granule_owner.get(cursor) != cursor:
                return None
            starts.append(cursor)
            cursor += self._mappings[cursor][0]
        return starts if cursor == va + size_bytes else None

    def set_access(self, va: int, size_bytes: int) -> None:
        """Grant read/write access to a fully mapped range."""
        args = (va, size_bytes, "[read_write]", 1)
        self._begin("cuMemSetAccess", args)
        self._check_size("cuMemSetAccess", args, size_bytes)
        with self._lock:
            granules = self._granules(va, size_bytes)
            if not all(g in self._granule_owner for g in granules):
                raise VmmError("cuMemSetAccess", "CUDA_ERROR_INVALID_VALUE", args, "range not fully mapped")
            self._accessible.update(granules)

    # ---- other queries -------------------------------------------------------------------------------
    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of the emulated physical capacity."""
        with self._lock:
            return self.capacity_bytes - sum(self._handles.values()), self.capacity_bytes

    def record_event(self, stream_handle: int = 0) -> CompletedEvent:
        """A trivially complete event (the emulated GPU is never behind)."""
        return CompletedEvent()

    def environment(self) -> dict[str, object]:
        """Description for profiles and logs."""
        return {"gpu_name": "emulated", "granularity_bytes": self.granularity_bytes}

    def close(self) -> None:
        """Nothing to release: leaks stay visible through :meth:`live_objects`."""

    def __enter__(self) -> "EmulatedVmmDriver":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
