"""Pinned host <-> device copy bandwidth and latency into mapped vAttention pages: the DRAM tier's load and
store path (issue 35, item 6).

``python -m hwbackend.beyond.host_copy_bench --out host_copy.json [--device 0] [--repetitions 20]``

Reserves a virtual range, maps 2 MiB VMM pages into it (``cuMemCreate`` / ``cuMemMap`` / ``cuMemSetAccess``
through :class:`hwbackend.vmm.driver.CudaVmmDriver`, the calls the executor's KV cache makes), views it as a
torch tensor and times ``copy_`` from and to a pinned host buffer (``pin_memory``) with CUDA events for sizes
64 KiB - 256 MiB (powers of 4), median of ``--repetitions`` after 3 warm-ups. Per direction it fits
``time_us = latency_us + bytes / bytes_per_s`` by least squares over the sizes and writes the profile section::

    {"host_copy": {"h2d_bytes_per_s": ..., "d2h_bytes_per_s": ..., "latency_us": ..., "source": ...,
                   "points": [{"bytes": ..., "h2d_us": ..., "d2h_us": ...}, ...], "environment": {...}}}

Merged into a profile (``kvsim simulate --profile``), it replaces the DRAM tier's defaults
(:func:`sim.memory.tiers.with_host_copy_profile`). Without a CUDA GPU it exits with status 2 and one line,
measuring nothing.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

SIZES_BYTES = tuple(64 * 1024 * 4 ** i for i in range(7))     # 64 KiB, 256 KiB, ..., 256 MiB
"""Copy sizes (bytes)."""
PAGE_BYTES = 2 * 1024 * 1024


def gpu_available() -> str | None:
    """None when a CUDA GPU is usable, else why not (one line)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    return None


def fit_latency_rate(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares ``time_us = latency_us + bytes / rate``: returns ``(latency_us, bytes_per_s)``.

    Raises:
        ValueError: fewer than two sizes, or a fit whose slope is not positive.
    """
    if len({size for size, _ in points}) < 2:
        raise ValueError("the fit needs at least two copy sizes")
    xs, ys = [float(s) for s, _ in points], [t for _, t in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    if slope <= 0:
        raise ValueError(f"copy time does not grow with size (slope {slope} us/B): not a usable measurement")
    return max(0.0, mean_y - slope * mean_x), 1e6 / slope


def measure(device: int, repetitions: int) -> dict:
    """The ``host_copy`` section measured on GPU ``device`` (module docstring)."""
    import torch

    from hwbackend.calibration.vmm import environment
    from hwbackend.vmm.driver import CudaVmmDriver
    from hwbackend.vmm.tensors import tensor_at

    torch.cuda.init()
    largest = max(SIZES_BYTES)
    with CudaVmmDriver(device) as driver:
        page = max(driver.granularity_bytes, PAGE_BYTES)
        va = driver.reserve(largest, page)
        handles = []
        try:
            for offset in range(0, largest, page):
                handles.append(driver.create(page))
                driver.map(va + offset, page, handles[-1])
            driver.set_access(va, largest)
            mapped = tensor_at(va, (largest,), torch.uint8, f"cuda:{device}")
            host = torch.empty(largest, dtype=torch.uint8).pin_memory()
            host.random_(0, 256)
            points = [{"bytes": size, "h2d_us": _median_us(lambda n=size: mapped[:n].copy_(host[:n], non_blocking=True),
                                                           repetitions),
                       "d2h_us": _median_us(lambda n=size: host[:n].copy_(mapped[:n], non_blocking=True), repetitions)}
                      for size in SIZES_BYTES]
            env = environment(driver)
        finally:
            torch.cuda.synchronize()
            for offset in range(0, len(handles) * page, page):
                driver.unmap(va + offset, page)
            for handle in handles:
                driver.release(handle)
            driver.free_address(va, largest)
    h2d_latency, h2d_rate = fit_latency_rate([(p["bytes"], p["h2d_us"]) for p in points])
    d2h_latency, d2h_rate = fit_latency_rate([(p["bytes"], p["d2h_us"]) for p in points])
    return {"h2d_bytes_per_s": h2d_rate, "d2h_bytes_per_s": d2h_rate, "latency_us": (h2d_latency + d2h_latency) / 2,
            "h2d_latency_us": h2d_latency, "d2h_latency_us": d2h_latency,
            "source": f"hwbackend/beyond/host_copy_bench.py on {env.get('gpu_name') or env.get('name') or 'GPU'}",
            "points": points, "environment": env}


def _median_us(copy, repetitions: int, warmup: int = 3) -> float:
    import torch

    times = []
    for rep in range(warmup + repetitions):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        copy()
        end.record()
        end.synchronize()
        if rep >= warmup:
            times.append(begin.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hwbackend.beyond.host_copy_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write (the profile's host_copy section)")
    parser.add_argument("--device", type=int, default=0, help="CUDA device ordinal")
    parser.add_argument("--repetitions", type=int, default=20, help="timed copies per size and direction")
    args = parser.parse_args(argv)
    why = gpu_available()
    if why:
        print(f"host_copy_bench: {why}; nothing measured", file=sys.stderr)
        return 2
    section = measure(args.device, args.repetitions)
    Path(args.out).write_text(json.dumps({"host_copy": section}, indent=1) + "\n")
    print(f"host copy into mapped VMM pages: H2D {section['h2d_bytes_per_s'] / 1e9:.1f} GB/s, D2H "
          f"{section['d2h_bytes_per_s'] / 1e9:.1f} GB/s, latency {section['latency_us']:.1f} us -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
