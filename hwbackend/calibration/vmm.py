"""Calibration: microbenchmarks of the CUDA VMM calls, written as a ``kvsim-profile/1`` JSON profile
(format: ``docs/profile-format.md``; the simulator reads ``vmm[call][str(page_size_bytes)]``).

What is measured, per page size (default 2 MiB, 4 MiB, 32 MiB), one thread, ``samples`` calls each:
``cuMemAddressReserve`` (+ ``cuMemAddressFree``) of one page, then ``cuMemCreate``, ``cuMemMap``,
``cuMemSetAccess``, ``cuMemUnmap``, ``cuMemRelease`` of ``samples`` pages in one reservation, each call
timed by the wrapper around the bare driver call (:mod:`hwbackend.vmm.driver`). Everything twice: with the
GPU idle (``vmm``) and while another thread keeps a bf16 matmul loop running on its own stream
(``vmm_under_load``). Then one page-group growth per model (2N' x (map + set-access), pages from a pool)
and the batched form (2N' maps into one contiguous range, then one set-access over it).

Run: ``kvsim calibrate --out profiles/NAME.json`` or ``python -m hwbackend.calibration.vmm --out ...``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hwbackend.vmm.driver import CudaVmmDriver, GpuUnavailableError
from hwbackend.vmm.kvcache import KVCache, KVCacheLayout
from hwbackend.calibration.vmm_options import DEFAULT_MODELS, add_arguments  # noqa: F401 (re-exported)
from sim.memory.plan import MapOp, Plan, UnmapOp

MIB = 1 << 20
DEFAULT_PAGE_SIZES_BYTES = (2 * MIB, 4 * MIB, 32 * MIB)
MEASURED_CALLS = ("cuMemAddressReserve", "cuMemAddressFree", "cuMemCreate", "cuMemMap", "cuMemSetAccess",
                  "cuMemUnmap", "cuMemRelease")
MAX_BATCH_BYTES = 8 << 30  # pages alive at once while measuring (8 GiB of the H200's 141 GB)
MAX_STORED_SAMPLES = 1000


def summarize_us(values_us: list[float] | np.ndarray, keep_samples: bool = True) -> dict[str, Any]:
    """Quantiles (p50/p90/p99/mean/min/max, microseconds) and up to 1000 samples rounded to 0.01 us."""
    import numpy as np     # here: the CLI's parser imports this module for its options
    values = np.asarray(values_us, dtype=float)
    summary: dict[str, Any] = {"n": int(values.size), "quantiles_us": {
        "p50": round(float(np.percentile(values, 50)), 2), "p90": round(float(np.percentile(values, 90)), 2),
        "p99": round(float(np.percentile(values, 99)), 2), "mean": round(float(values.mean()), 2),
        "min": round(float(values.min()), 2), "max": round(float(values.max()), 2)}}
    if keep_samples:
        stride = max(1, -(-values.size // MAX_STORED_SAMPLES))
        summary["samples_us"] = [round(float(v), 2) for v in values[::stride]]
    return summary


# ---- per-call microbenchmarks --------------------------------------------------------------------------
def measure_calls(driver: CudaVmmDriver, page_size_bytes: int, samples: int) -> dict[str, list[float]]:
    """Latencies (us) of each VMM call for ``samples`` pages of ``page_size_bytes``; leaves nothing behind."""
    driver.stats.clear()
    for _ in range(samples):
        va = driver.reserve(page_size_bytes, page_size_bytes)
        driver.free_address(va, page_size_bytes)
    latencies = {call: driver.stats.latencies_us(call) for call in ("cuMemAddressReserve", "cuMemAddressFree")}
    driver.stats.clear()
    batch = max(1, min(samples, MAX_BATCH_BYTES // page_size_bytes))
    for done in range(0, samples, batch):
        _page_cycle(driver, page_size_bytes, min(batch, samples - done))
    latencies.update({call: driver.stats.latencies_us(call) for call in MEASURED_CALLS if call not in latencies})
    return latencies


def _page_cycle(driver: CudaVmmDriver, page_size_bytes: int, count: int) -> None:
    """create, map, set-access, unmap, release ``count`` pages in one reservation (each call timed)."""
    va = driver.reserve(count * page_size_bytes, page_size_bytes)
    handles: list[Any] = []
    mapped = 0
    try:
        handles.extend(driver.create(page_size_bytes) for _ in range(count))
        for i, handle in enumerate(handles):
            driver.map(va + i * page_size_bytes, page_size_bytes, handle)
            mapped += 1
        for i in range(count):
            driver.set_access(va + i * page_size_bytes, page_size_bytes)
    finally:
        for i in range(mapped):
            driver.unmap(va + i * page_size_bytes, page_size_bytes)
        for handle in handles:
            driver.release(handle)
        driver.free_address(va, count * page_size_bytes)


# ---- compute load ------------------------------------------------------------------------------------
@contextmanager
def compute_load(device_ordinal: int = 0, size: int = 8192) -> Iterator[dict[str, float]]:
    """Keep the GPU busy with bf16 ``size^3`` matmuls on a side stream from another thread.

    Yields a dict that receives ``matmul_ms`` (mean time per product while the load ran).
    """
    import torch

    stats: dict[str, float] = {}
    stop = threading.Event()
    device = torch.device("cuda", device_ordinal)
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    stream = torch.cuda.Stream(device=device)
    counts = {"products": 0}

    def loop() -> None:
        torch.cuda.set_device(device)
        with torch.cuda.stream(stream):
            while not stop.is_set():
                for _ in range(4):
                    torch.matmul(a, b)
                counts["products"] += 4
                stream.synchronize()

    thread = threading.Thread(target=loop, name="matmul-load", daemon=True)
    start_s = time.perf_counter()
    thread.start()
    time.sleep(0.2)  # let the loop reach steady state
    try:
        yield stats
    finally:
        stop.set()
        thread.join()
        stats["matmul_ms"] = (time.perf_counter() - start_s) * 1e3 / max(1, counts["products"])
        del a, b


# ---- page-group growth ---------------------------------------------------------------------------------
def measure_page_group_growth(driver: CudaVmmDriver, model_name: str, page_size_bytes: int,
                              repetitions: int) -> dict[str, Any]:
    """One page-group growth of ``model_name`` (2N' x (map + set-access), pooled handles), and the batched
    form (2N' maps into one contiguous range + one set-access), ``repetitions`` times each (us).

    ``sync_us`` is the wall time of :meth:`KVCache.apply` (transaction bookkeeping included);
    ``sync_in_driver_us`` the part spent inside the driver calls of that growth.
    """
    from sim.setup.catalog import get_model

    model = get_model(model_name)
    tokens_per_page = model.tokens_per_page(page_size_bytes)
    layout = KVCacheLayout.for_model(model, num_slots=1, max_context_tokens=repetitions * tokens_per_page,
                                     page_size_bytes=page_size_bytes)
    sync_us, driver_us = [], []
    with KVCache(driver, layout, pool_page_groups=layout.max_pages_per_slot) as cache:
        for page in range(repetitions):
            counts_before = driver.stats.counts()
            start_ns = time.perf_counter_ns()
            cache.apply(Plan(maps=(MapOp(0, page, 1),)))
            sync_us.append((time.perf_counter_ns() - start_ns) * 1e-3)
            driver_us.append(sum(sum(driver.stats.latencies_us(call)[counts_before.get(call, 0):])
                                 for call in ("cuMemMap", "cuMemSetAccess")))
        cache.apply(Plan(unmaps=(UnmapOp(0, 0, repetitions),)))
    batched_us = [_batched_growth_us(driver, model.num_sub_tensors(), page_size_bytes) for _ in range(repetitions)]
    return {"num_sub_tensors": model.num_sub_tensors(), "page_size_bytes": page_size_bytes,
            "sync_us": summarize_us(sync_us), "sync_in_driver_us": summarize_us(driver_us),
            "batched_set_access_us": summarize_us(batched_us)}


def _batched_growth_us(driver: CudaVmmDriver, num_pages: int, page_size_bytes: int) -> float:
    size_bytes = num_pages * page_size_bytes
    va = driver.reserve(size_bytes, page_size_bytes)
    handles = [driver.create(page_size_bytes) for _ in range(num_pages)]
    start_ns = time.perf_counter_ns()
    for i, handle in enumerate(handles):
        driver.map(va + i * page_size_bytes, page_size_bytes, handle)
    driver.set_access(va, size_bytes)
    elapsed_us = (time.perf_counter_ns() - start_ns) * 1e-3
    driver.unmap(va, size_bytes)
    for handle in handles:
        driver.release(handle)
    driver.free_address(va, size_bytes)
    return elapsed_us


# ---- wrapper overhead --------------------------------------------------------------------------------
def measure_wrapper_overhead(driver: CudaVmmDriver, calls: int = 20000) -> dict[str, Any]:
    """Per-call cost the wrapper adds: a cheap driver query timed from outside, bare vs through
    ``CudaVmmDriver._checked`` (median of ``calls`` single-call timings, us)."""
    import numpy as np     # here: the CLI's parser imports this module for its options
    drv, prop = driver._drv, driver._prop
    option = driver._c["granularity_recommended"]
    bare, wrapped = [], []
    for _ in range(calls):
        start_ns = time.perf_counter_ns()
        err, _ = drv.cuMemGetAllocationGranularity(prop, option)
        if err != driver._c["success"]:
            raise RuntimeError(err)
        mid_ns = time.perf_counter_ns()
        driver._checked("cuMemGetAllocationGranularity", drv.cuMemGetAllocationGranularity, prop, option)
        end_ns = time.perf_counter_ns()
        bare.append((mid_ns - start_ns) * 1e-3)
        wrapped.append((end_ns - mid_ns) * 1e-3)
    bare_us, wrapped_us = float(np.median(bare)), float(np.median(wrapped))
    return {"call": "cuMemGetAllocationGranularity", "n": calls, "bare_p50_us": round(bare_us, 3),
            "wrapped_p50_us": round(wrapped_us, 3), "overhead_p50_us": round(wrapped_us - bare_us, 3)}


# ---- memory bandwidth over mapped VMM pages (issue 10: zero-on-reuse, copy-on-write) ---------------------
def measure_memory_bandwidth(driver: CudaVmmDriver, size_bytes: int = 4 << 30, repetitions: int = 10,
                             warmup: int = 3) -> dict[str, Any]:
    """Clearing and copying bandwidth over ``size_bytes`` of mapped 2 MiB VMM pages (two ranges of pooled
    handles, as the KV cache maps them), timed with CUDA events on torch's current stream, median of
    ``repetitions`` after ``warmup``. Returns the profile's ``memory`` section: ``memset_bytes_per_s`` (bytes
    cleared / s, ``cuMemsetD32Async``, what :class:`hwbackend.beyond.ops.SharingKVCache` uses) and
    ``copy_bytes_per_s`` (bytes read + written / s, ``cuMemcpyDtoDAsync``, copy-on-write), plus torch's
    ``zero_`` / ``copy_`` and ``cuMemsetD8Async`` for comparison."""
    import numpy as np     # here: the CLI's parser imports this module for its options
    import torch

    from hwbackend.beyond.ops import cuda_copy_fn, cuda_memset_fn
    from hwbackend.vmm.tensors import tensor_at

    page = driver.granularity_bytes
    size_bytes -= size_bytes % page
    count = size_bytes // page
    device = f"cuda:{driver.device_ordinal}"
    stream = torch.cuda.current_stream().cuda_stream
    ranges, handles, mapped = [], [], []
    start_s = time.perf_counter()
    try:
        for _ in range(2):
            va = driver.reserve(size_bytes, page)
            ranges.append(va)
            for i in range(count):
                handles.append(driver.create(page))
                driver.map(va + i * page, page, handles[-1])
                mapped.append(va + i * page)
            driver.set_access(va, size_bytes)
        src, dst = (tensor_at(va, (size_bytes,), torch.uint8, device) for va in ranges)
        src.random_(0, 256)
        memset32, copy = cuda_memset_fn(driver, stream), cuda_copy_fn(driver, stream)

        def d8() -> None:
            driver._checked("cuMemsetD8Async", driver._drv.cuMemsetD8Async, ranges[1], 0, size_bytes, stream)

        methods = {"cuMemsetD32Async": lambda: memset32(ranges[1], size_bytes), "cuMemsetD8Async": d8,
                   "torch_zero_": lambda: dst.zero_(),
                   "cuMemcpyDtoDAsync": lambda: copy(ranges[1], ranges[0], size_bytes),
                   "torch_copy_": lambda: dst.copy_(src)}
        times: dict[str, list[float]] = {name: [] for name in methods}
        for rep in range(warmup + repetitions):
            for name, fn in methods.items():
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                fn()
                end.record()
                end.synchronize()
                if rep >= warmup:
                    times[name].append(begin.elapsed_time(end) * 1e-3)
        dst.copy_(src)
        torch.cuda.synchronize()
        copy_ok = bool(torch.equal(dst[: 1 << 24], src[: 1 << 24]))
        rates = {name: (2 if "cop" in name.lower() or "DtoD" in name else 1) * size_bytes / float(np.median(t))
                 for name, t in times.items()}
    finally:
        torch.cuda.synchronize()
        for va in mapped:
            driver.unmap(va, page)
        for handle in handles:
            driver.release(handle)
        for va in ranges:
            driver.free_address(va, size_bytes)
    return {"memset_bytes_per_s": round(rates["cuMemsetD32Async"]), "copy_bytes_per_s": round(rates["cuMemcpyDtoDAsync"]),
            "bytes_per_s": {name: round(rate) for name, rate in rates.items()},
            "median_ms": {name: round(float(np.median(t)) * 1e3, 4) for name, t in times.items()},
            "size_bytes": size_bytes, "copy_check": copy_ok,
            "method": (f"{size_bytes >> 20} MiB in {count} mapped {page >> 20} MiB VMM pages per range (two "
                       "reservations); CUDA events on the current stream, median of "
                       f"{repetitions} after {warmup} warm-ups; memset = bytes cleared / s (cuMemsetD32Async), "
                       "copy = bytes read + written / s (cuMemcpyDtoDAsync)"),
            "seconds": round(time.perf_counter() - start_s, 1)}


# ---- the profile ---------------------------------------------------------------------------------------
def environment(driver: CudaVmmDriver) -> dict[str, Any]:
    """GPU, driver, CUDA, cuda-python and torch versions, granularity and date (UTC)."""
    env = driver.environment()
    try:
        import cuda.bindings
        cuda_python = cuda.bindings.__version__
    except (ImportError, AttributeError):
        cuda_python = None
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    return {"gpu_name": env["gpu_name"], "driver_version": _nvidia_driver_version(),
            "cuda_version": env["cuda_driver_api_version"], "cuda_python_version": cuda_python,
            "torch_version": torch_version, "granularity_bytes": env["granularity_bytes"],
            "min_granularity_bytes": env["min_granularity_bytes"],
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _nvidia_driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return out.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def _vmm_section(driver: CudaVmmDriver, page_sizes_bytes: list[int], samples: int) -> dict[str, Any]:
    section: dict[str, Any] = {call: {} for call in MEASURED_CALLS}
    for page_size_bytes in page_sizes_bytes:
        for call, latencies_us in measure_calls(driver, page_size_bytes, samples).items():
            section[call][str(page_size_bytes)] = summarize_us(latencies_us)
    return section


def run_calibration(page_sizes_bytes: list[int], samples: int, models: tuple[str, ...] = DEFAULT_MODELS,
                    growth_repetitions: int = 50, created_by: str = "", under_load: bool = True,
                    device_ordinal: int = 0) -> dict[str, Any]:
    """Measure everything and return the profile (a JSON-ready dict)."""
    with CudaVmmDriver(device_ordinal) as driver:
        for page_size_bytes in page_sizes_bytes:
            if page_size_bytes % driver.granularity_bytes:
                raise ValueError(f"page size {page_size_bytes} is not a multiple of the granularity "
                                 f"{driver.granularity_bytes}")
        profile: dict[str, Any] = {"format": "kvsim-profile/1", "created_by": created_by,
                                   "environment": environment(driver)}
        measure_calls(driver, page_sizes_bytes[0], min(samples, 50))  # warm-up, discarded
        profile["vmm"] = _vmm_section(driver, page_sizes_bytes, samples)
        if under_load and _has_torch_cuda():
            with compute_load(device_ordinal) as load:
                profile["vmm_under_load"] = _vmm_section(driver, page_sizes_bytes, samples)
            profile["vmm_under_load_matmul_ms"] = round(load["matmul_ms"], 3)
        growth_page_bytes = min(page_sizes_bytes)
        profile["page_group_growth"] = {
            name: measure_page_group_growth(driver, name, growth_page_bytes, growth_repetitions)
            for name in models}
        profile["wrapper_overhead_us"] = measure_wrapper_overhead(driver)
    return profile


def _has_torch_cuda() -> bool:
    try:
        import torch
    except ImportError:
        print("torch is not installed: skipping the under-load measurements", file=sys.stderr)
        return False
    return bool(torch.cuda.is_available())


def parse_page_sizes(text: str) -> list[int]:
    """``"2MiB,4MiB,32MiB"`` -> bytes."""
    from sim.units import parse_size_bytes

    return [parse_size_bytes(part.strip()) for part in text.split(",") if part.strip()]


def command(args: argparse.Namespace, prog: str = "kvsim") -> int:
    """Run calibration for parsed ``args``; returns the exit status (2 with one ``kvsim: error:`` line: no usable
    GPU or cuda-python, a bad ``--page-sizes`` / ``--samples``, an existing ``--out`` without ``--force``).

    ``prog`` prefixes ``sys.argv[1:]`` in the profile's ``created_by`` (``kvsim`` when called as
    ``kvsim calibrate ...``, whose argv[1] is ``calibrate``).
    """
    out = Path(args.out)
    if out.exists() and not args.force:
        print(f"kvsim: error: --out {out} exists; pass --force to overwrite it", file=sys.stderr)
        return 2
    try:
        page_sizes = parse_page_sizes(args.page_sizes)
        if args.samples < 1:
            raise ValueError(f"--samples must be >= 1, got {args.samples}")
    except ValueError as exc:
        print(f"kvsim: error: {exc}", file=sys.stderr)
        return 2
    created_by = " ".join([prog, *sys.argv[1:]])
    try:
        profile = run_calibration(page_sizes, args.samples, tuple(m for m in args.models.split(",") if m),
                                  created_by=created_by, under_load=not args.no_load, device_ordinal=args.device)
    except GpuUnavailableError as exc:
        print(f"kvsim: error: calibrate needs an NVIDIA GPU with CUDA VMM support: {exc}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m hwbackend.calibration.vmm``."""
    parser = argparse.ArgumentParser(prog="python -m hwbackend.calibration.vmm", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return command(parser.parse_args(argv), prog="python -m hwbackend.calibration.vmm")


if __name__ == "__main__":
    sys.exit(main())
