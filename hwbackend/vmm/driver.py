"""Thin, checked and timed wrapper over the CUDA driver's virtual memory management (VMM) API.

The calls (domain.md "Mechanism"; CUDA Driver API, "Virtual Memory Management")::

    cuMemAddressReserve  reserve virtual addresses (no HBM)     -> reserve(size_bytes)      -> va
    cuMemCreate          create a physical allocation handle     -> create(size_bytes)       -> handle
    cuMemMap             back [va, va+size) with the handle      -> map(va, size_bytes, handle)
    cuMemSetAccess       grant read/write (mapping alone is not) -> set_access(va, size_bytes)
    cuMemUnmap / cuMemRelease / cuMemAddressFree                 -> unmap / release / free_address

Every call is checked at once (:class:`VmmError` carries the CUDA error name and the call's arguments)
and timed around the bare driver call with :func:`time.perf_counter_ns`; the latencies, in microseconds,
are kept per call name in :class:`CallStats` (``driver.stats``). The calls are usable from any thread:
call :meth:`CudaVmmDriver.make_current` once in a new thread (it binds the device's primary context, the
one PyTorch uses, with ``cuCtxSetCurrent``).

:class:`hwbackend.vmm.emulated.EmulatedVmmDriver` offers the same interface (:class:`VmmDriver`) without a GPU.
``cuda.bindings`` is imported only when a :class:`CudaVmmDriver` is opened, so this module imports on
machines without cuda-python.
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Protocol

CALL_NAMES = ("cuMemAddressReserve", "cuMemAddressFree", "cuMemCreate", "cuMemRelease",
              "cuMemMap", "cuMemUnmap", "cuMemSetAccess")
"""VMM calls by their CUDA names; the keys of :class:`CallStats` and of a profile's ``vmm`` section."""


class VmmError(RuntimeError):
    """A VMM call failed.

    Attributes:
        call: CUDA function name, e.g. ``"cuMemMap"``.
        error_name: CUDA error name, e.g. ``"CUDA_ERROR_OUT_OF_MEMORY"``.
        call_args: the call's arguments (addresses as ints).
        detail: why, where known (the emulated driver says which rule was broken).
    """

    def __init__(self, call: str, error_name: str, call_args: tuple[Any, ...], detail: str = ""):
        self.call, self.error_name, self.call_args, self.detail = call, error_name, call_args, detail
        shown = ", ".join(hex(a) if isinstance(a, int) and a > 1 << 32 else repr(a) for a in call_args)
        super().__init__(f"{call}({shown}) failed: {error_name}" + (f" ({detail})" if detail else ""))


class GpuUnavailableError(RuntimeError):
    """No usable GPU: cuda-python missing, no NVIDIA driver or device, or no VMM support."""


class CallStats:
    """Per-call latency records (microseconds) and call counts, appended from any thread.

    ``list.append`` is atomic under the interpreter lock, so no lock is taken on the timed path.
    """

    def __init__(self) -> None:
        self._latencies_us: defaultdict[str, list[float]] = defaultdict(list)

    def record(self, call: str, latency_us: float) -> None:
        """Append one latency of ``call`` in microseconds."""
        self._latencies_us[call].append(latency_us)

    def latencies_us(self, call: str) -> list[float]:
        """Recorded latencies of ``call`` in call order (microseconds)."""
        return list(self._latencies_us.get(call, ()))

    def count(self, call: str) -> int:
        """How many times ``call`` was issued (successful or not)."""
        return len(self._latencies_us.get(call, ()))

    def counts(self) -> dict[str, int]:
        """Call name -> number of calls."""
        return {call: len(values) for call, values in self._latencies_us.items()}

    def clear(self) -> None:
        """Forget every record."""
        self._latencies_us.clear()


class VmmDriver(Protocol):
    """The interface shared by :class:`CudaVmmDriver` and the emulated driver. Sizes and addresses in bytes."""

    granularity_bytes: int
    device_ordinal: int
    stats: CallStats

    def make_current(self) -> None: ...
    def reserve(self, size_bytes: int, alignment_bytes: int = 0) -> int: ...
    def free_address(self, va: int, size_bytes: int) -> None: ...
    def create(self, size_bytes: int) -> Any: ...
    def release(self, handle: Any) -> None: ...
    def map(self, va: int, size_bytes: int, handle: Any) -> None: ...
    def unmap(self, va: int, size_bytes: int) -> None: ...
    def set_access(self, va: int, size_bytes: int) -> None: ...
    def mem_info(self) -> tuple[int, int]: ...
    def record_event(self, stream_handle: int = 0) -> Any: ...
    def close(self) -> None: ...


def _import_driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise GpuUnavailableError(
            f"cuda-python is not installed ({exc}); install the hw extra: pip install 'kvsim[hw]'") from None
    return driver


def _constants(drv: Any) -> dict[str, Any]:
    """The one table of driver constants this backend uses (CUDA Driver API enums)."""
    return {
        "success": drv.CUresult.CUDA_SUCCESS,
        "not_ready": drv.CUresult.CUDA_ERROR_NOT_READY,
        "alloc_pinned": drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED,
        "location_device": drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE,
        "handle_none": drv.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE,
        "access_read_write": drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        "granularity_recommended": drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
        "granularity_minimum": drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        "attr_vmm_supported": drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
        "event_disable_timing": drv.CUevent_flags.CU_EVENT_DISABLE_TIMING,
    }


class DriverEvent:
    """A CUDA event recorded on a stream; ``query()`` is True once all work before it has finished."""

    def __init__(self, driver: "CudaVmmDriver", event: Any):
        self._driver, self._event = driver, event

    def query(self) -> bool:
        """True when the GPU has passed the event (``cuEventQuery``: SUCCESS), False when NOT_READY."""
        err = self._driver._drv.cuEventQuery(self._event)[0]
        if err == self._driver._c["not_ready"]:
            return False
        if err != self._driver._c["success"]:
            raise VmmError("cuEventQuery", err.name, (int(self._event),))
        return True

    def synchronize(self) -> None:
        """Block until the GPU has passed the event."""
        self._driver._checked("cuEventSynchronize", self._driver._drv.cuEventSynchronize, self._event)

    def close(self) -> None:
        """Destroy the event (idempotent)."""
        if self._event is not None:
            self._driver._checked("cuEventDestroy", self._driver._drv.cuEventDestroy, self._event)
            self._event = None


class CudaVmmDriver:
    """VMM calls on one GPU through ``cuda.bindings.driver``, checked and timed.

    Args:
        device_ordinal: CUDA device index.

    Attributes:
        granularity_bytes: recommended allocation granularity (2 MiB on H200, domain.md).
        min_granularity_bytes: minimum allocation granularity.
        stats: per-call latency records (:class:`CallStats`).

    Raises:
        GpuUnavailableError: one clear message when cuda-python, the driver, the device or VMM support
            (``CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED``) is missing.
    """

    def __init__(self, device_ordinal: int = 0):
        self._drv = _import_driver()
        self._c = _constants(self._drv)
        self.device_ordinal = device_ordinal
        self.stats = CallStats()
        self._device = self._open_device(device_ordinal)
        self._context = self._checked("cuDevicePrimaryCtxRetain", self._drv.cuDevicePrimaryCtxRetain, self._device)
        self.make_current()
        self._prop = self._allocation_prop()
        self._access = [self._access_desc()]
        self.granularity_bytes = self._granularity(self._c["granularity_recommended"])
        self.min_granularity_bytes = self._granularity(self._c["granularity_minimum"])

    # ---- set-up ----------------------------------------------------------------------------------------
    def _open_device(self, ordinal: int) -> Any:
        try:
            err, = self._drv.cuInit(0)
        except RuntimeError as exc:  # cuda.pathfinder: libcuda.so not found (no NVIDIA driver)
            raise GpuUnavailableError(f"no NVIDIA driver found: {exc}") from None
        if err != self._c["success"]:
            raise GpuUnavailableError(f"cuInit failed: {err.name} (no usable NVIDIA GPU or driver)")
        count = self._checked("cuDeviceGetCount", self._drv.cuDeviceGetCount)
        if not 0 <= ordinal < count:
            raise GpuUnavailableError(f"CUDA device {ordinal} does not exist ({count} device(s) visible)")
        device = self._checked("cuDeviceGet", self._drv.cuDeviceGet, ordinal)
        vmm = self._checked("cuDeviceGetAttribute", self._drv.cuDeviceGetAttribute,
                            self._c["attr_vmm_supported"], device)
        if not vmm:
            raise GpuUnavailableError(f"CUDA device {ordinal} does not support virtual memory management "
                                      "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 0)")
        return device

    def _allocation_prop(self) -> Any:
        prop = self._drv.CUmemAllocationProp()
        prop.type = self._c["alloc_pinned"]
        prop.location.type = self._c["location_device"]
        prop.location.id = self.device_ordinal
        prop.requestedHandleTypes = self._c["handle_none"]
        return prop

    def _access_desc(self) -> Any:
        desc = self._drv.CUmemAccessDesc()
        desc.location.type = self._c["location_device"]
        desc.location.id = self.device_ordinal
        desc.flags = self._c["access_read_write"]
        return desc

    def _granularity(self, option: Any) -> int:
        return int(self._checked("cuMemGetAllocationGranularity", self._drv.cuMemGetAllocationGranularity,
                                 self._prop, option))

    # ---- the checked, timed call ---------------------------------------------------------------------
    def _checked(self, call: str, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)``, record its latency under ``call``, raise :class:`VmmError` on failure.

        Returns:
            ``None`` for calls that return only an error code, the value for ``(err, value)``, else the tuple
            of values.
        """
        start_ns = time.perf_counter_ns()
        result = fn(*args)
        self.stats.record(call, (time.perf_counter_ns() - start_ns) * 1e-3)
        err = result[0]
        if err != self._c["success"]:
            raise VmmError(call, getattr(err, "name", str(err)), tuple(_plain(a) for a in args))
        return None if len(result) == 1 else result[1] if len(result) == 2 else result[1:]

    # ---- VMM calls -----------------------------------------------------------------------------------
    def make_current(self) -> None:
        """Bind the device's primary context to the calling thread (needed once per new thread)."""
        self._checked("cuCtxSetCurrent", self._drv.cuCtxSetCurrent, self._context)

    def reserve(self, size_bytes: int, alignment_bytes: int = 0) -> int:
        """``cuMemAddressReserve``: reserve ``size_bytes`` of virtual addresses; returns the base address."""
        return int(self._checked("cuMemAddressReserve", self._drv.cuMemAddressReserve,
                                 size_bytes, alignment_bytes, 0, 0))

    def free_address(self, va: int, size_bytes: int) -> None:
        """``cuMemAddressFree``: free a whole reservation (``size_bytes`` as reserved)."""
        self._checked("cuMemAddressFree", self._drv.cuMemAddressFree, va, size_bytes)

    def create(self, size_bytes: int) -> Any:
        """``cuMemCreate``: allocate ``size_bytes`` of HBM on the device; returns the handle."""
        return self._checked("cuMemCreate", self._drv.cuMemCreate, size_bytes, self._prop, 0)

    def release(self, handle: Any) -> None:
        """``cuMemRelease``: release a handle (its memory is freed once it is no longer mapped)."""
        self._checked("cuMemRelease", self._drv.cuMemRelease, handle)

    def map(self, va: int, size_bytes: int, handle: Any) -> None:
        """``cuMemMap``: back ``[va, va + size_bytes)`` with ``handle`` from offset 0."""
        self._checked("cuMemMap", self._drv.cuMemMap, va, size_bytes, 0, handle, 0)

    def unmap(self, va: int, size_bytes: int) -> None:
        """``cuMemUnmap``: unmap ``[va, va + size_bytes)`` (whole mappings only)."""
        self._checked("cuMemUnmap", self._drv.cuMemUnmap, va, size_bytes)

    def set_access(self, va: int, size_bytes: int) -> None:
        """``cuMemSetAccess``: grant this device read/write access to a mapped range."""
        self._checked("cuMemSetAccess", self._drv.cuMemSetAccess, va, size_bytes, self._access, 1)

    # ---- other driver queries ------------------------------------------------------------------------
    def mem_info(self) -> tuple[int, int]:
        """``cuMemGetInfo``: (free, total) device memory in bytes as the driver reports it."""
        free_bytes, total_bytes = self._checked("cuMemGetInfo", self._drv.cuMemGetInfo)
        return int(free_bytes), int(total_bytes)

    def record_event(self, stream_handle: int = 0) -> DriverEvent:
        """Record a timing-free event on ``stream_handle`` (e.g. ``torch.cuda.current_stream().cuda_stream``)."""
        event = self._checked("cuEventCreate", self._drv.cuEventCreate, self._c["event_disable_timing"])
        self._checked("cuEventRecord", self._drv.cuEventRecord, event, stream_handle)
        return DriverEvent(self, event)

    def environment(self) -> dict[str, Any]:
        """GPU name, driver CUDA version and granularity, for calibration profiles."""
        name = self._checked("cuDeviceGetName", self._drv.cuDeviceGetName, 256, self._device)
        version = int(self._checked("cuDriverGetVersion", self._drv.cuDriverGetVersion))
        return {"gpu_name": name.split(b"\0", 1)[0].decode(),
                "cuda_driver_api_version": f"{version // 1000}.{version % 1000 // 10}",
                "granularity_bytes": self.granularity_bytes,
                "min_granularity_bytes": self.min_granularity_bytes}

    def close(self) -> None:
        """Release the primary-context reference taken at start (idempotent)."""
        if self._context is not None:
            self._context = None
            self._checked("cuDevicePrimaryCtxRelease", self._drv.cuDevicePrimaryCtxRelease, self._device)

    def __enter__(self) -> "CudaVmmDriver":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _plain(value: Any) -> Any:
    """Driver objects (CUdeviceptr, handles) as ints for error messages; others unchanged."""
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    try:
        return int(value)
    except (TypeError, ValueError):
        return type(value).__name__
