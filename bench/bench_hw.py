"""Benchmark of the hardware backend (issue 4, item 8).

1. Wrapper overhead: the cost :class:`hwbackend.vmm.driver.CudaVmmDriver` adds per call over the bare
   ``cuda.bindings`` call (target: under 2 us): a cheap query, and a map + set-access + unmap cycle.
2. Llama-3-8B page-group growth (64 sub-tensors, 2 MiB pages) in a serving loop where every iteration
   crosses a page boundary, each iteration a ~decode-sized bf16 matmul load on the GPU:
   * ``baseline``: no growth; iteration wall = compute;
   * ``sync``: ``step`` maps the page group on the critical path before launch;
   * ``async``: after launch, ``map_ahead`` lets the background thread map the next page group while the
     GPU computes; the next ``step`` finds it mapped.
   Reported: per-iteration wall time (median, ms), foreground ``step`` latency (median, us) and the share
   of the synchronous growth cost that the background thread hid.

Run on a GPU: ``python bench/bench_hw.py --out bench_hw.json``; without one: ``--emulated`` (the driver
sleeps the domain.md H200 medians per call and the "GPU" sleeps the compute time).
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hwbackend.vmm.executor import Executor, policy_config_for  # noqa: E402
from hwbackend.vmm.kvcache import KVCache, KVCacheLayout  # noqa: E402
from sim.setup.catalog import get_model  # noqa: E402
from sim.memory.vattention import VAttentionPolicy  # noqa: E402

MIB = 1 << 20
PAGE_BYTES = 2 * MIB
# domain.md, H200 medians (us): used only by --emulated
EMULATED_DELAY_US = {"cuMemMap": 5.0, "cuMemSetAccess": 49.6, "cuMemUnmap": 32.7}


class TorchCompute:
    """A decode-sized GPU load: ``products`` bf16 ``size^3`` matmuls per iteration."""

    def __init__(self, size: int = 8192, products: int = 4):
        import torch

        self.torch, self.products = torch, products
        self.a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        self.b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        self.stream_handle = torch.cuda.current_stream().cuda_stream
        self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def launch(self) -> None:
        self.start.record()
        for _ in range(self.products):
            self.torch.matmul(self.a, self.b)
        self.end.record()

    def wait(self) -> float:
        """Wait for the GPU; returns the GPU time of the iteration's products (ms, CUDA events)."""
        self.torch.cuda.synchronize()
        return self.start.elapsed_time(self.end)


class SleepCompute:
    """Stand-in GPU for --emulated: an iteration "runs" for ``duration_ms`` after launch."""

    stream_handle = 0

    def __init__(self, duration_ms: float = 5.6):
        self.duration_s, self.started_s = duration_ms * 1e-3, 0.0

    def launch(self) -> None:
        self.started_s = time.perf_counter()

    def wait(self) -> float:
        time.sleep(max(0.0, self.started_s + self.duration_s - time.perf_counter()))
        return self.duration_s * 1e3


def serving_loop(driver: Any, compute: Any, mode: str, iterations: int) -> dict[str, Any]:
    """Run ``iterations`` iterations of one request that grows one page group per iteration."""
    model = get_model("llama-3-8b")
    layout = KVCacheLayout.for_model(model, num_slots=1, max_context_tokens=(iterations + 2) * 1024,
                                     page_size_bytes=PAGE_BYTES)
    cache = KVCache(driver, layout, pool_page_groups=layout.max_pages_per_slot)
    policy = VAttentionPolicy(policy_config_for(cache, eager_idle_slots=0, admission_watermark_frac=0.0))
    grow = mode != "baseline"
    wall_ms, gpu_ms, slowest_calls = [], [], []
    with Executor(policy, cache, background=(mode == "async"), stream_handle=compute.stream_handle) as ex:
        slot = ex.alloc_slot(1)
        tokens_per_page = layout.tokens_per_page
        for i in range(iterations):
            counts_before = driver.stats.counts()
            start_ns = time.perf_counter_ns()
            target = (i + 1) * tokens_per_page if grow else tokens_per_page
            if not ex.step({slot: target}):
                raise RuntimeError(f"step failed at iteration {i}")
            compute.launch()
            ex.iteration_launched(i)
            if mode == "async":
                ex.map_ahead({slot: target + tokens_per_page})
            gpu_ms.append(compute.wait())
            wall_ms.append((time.perf_counter_ns() - start_ns) * 1e-6)
            slowest_calls.append(_slowest_call_since(driver.stats, counts_before))
        step_us = ex.metrics["step_latency_us"]
        metrics = {k: ex.metrics[k] for k in ("sync_page_groups", "background_page_groups", "cancelled_ops")}
    skip = min(2, iterations // 4)  # first iterations warm up
    return {"mode": mode, "iterations": iterations, "wall_ms_p50": round(statistics.median(wall_ms[skip:]), 3),
            "wall_ms": [round(v, 3) for v in wall_ms], "gpu_ms": [round(v, 3) for v in gpu_ms],
            "step_us": [round(v, 1) for v in step_us], "slowest_call_us": slowest_calls,
            "step_us_p50": round(statistics.median(step_us[skip:]), 1),
            "step_us_max": round(max(step_us[skip:]), 1), **metrics}


def _slowest_call_since(stats: Any, counts_before: dict[str, int]) -> list:
    """[call, latency_us] of the slowest driver call since ``counts_before`` (any thread)."""
    slowest = ["", 0.0]
    for call, count in stats.counts().items():
        for latency_us in stats.latencies_us(call)[counts_before.get(call, 0):]:
            if latency_us > slowest[1]:
                slowest = [call, round(latency_us, 1)]
    return slowest


def map_cycle_overhead(driver: Any, cycles: int = 2000) -> dict[str, Any]:
    """Median time of map + set-access + unmap of one page, bare ``cuda.bindings`` vs through the wrapper."""
    drv, success = driver._drv, driver._c["success"]
    va = driver.reserve(PAGE_BYTES, PAGE_BYTES)
    handle = driver.create(PAGE_BYTES)
    bare, wrapped = [], []
    try:
        for _ in range(cycles):
            start_ns = time.perf_counter_ns()
            for err in (drv.cuMemMap(va, PAGE_BYTES, 0, handle, 0)[0],
                        drv.cuMemSetAccess(va, PAGE_BYTES, driver._access, 1)[0],
                        drv.cuMemUnmap(va, PAGE_BYTES)[0]):
                if err != success:
                    raise RuntimeError(err)
            mid_ns = time.perf_counter_ns()
            driver.map(va, PAGE_BYTES, handle)
            driver.set_access(va, PAGE_BYTES)
            driver.unmap(va, PAGE_BYTES)
            end_ns = time.perf_counter_ns()
            bare.append((mid_ns - start_ns) * 1e-3)
            wrapped.append((end_ns - mid_ns) * 1e-3)
    finally:
        driver.release(handle)
        driver.free_address(va, PAGE_BYTES)
    bare_us, wrapped_us = statistics.median(bare), statistics.median(wrapped)
    return {"cycles": cycles, "bare_cycle_p50_us": round(bare_us, 2), "wrapped_cycle_p50_us": round(wrapped_us, 2),
            "overhead_per_call_us": round((wrapped_us - bare_us) / 3, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--emulated", action="store_true", help="no GPU: emulated driver and sleeping compute")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    if args.emulated:
        from hwbackend.vmm.emulated import EmulatedVmmDriver

        driver, compute = EmulatedVmmDriver(capacity_bytes=1 << 40, delay_us=EMULATED_DELAY_US), SleepCompute()
    else:
        from hwbackend.replay.tp.cli import gpu_preflight
        from hwbackend.vmm.driver import CudaVmmDriver, GpuUnavailableError

        problem = gpu_preflight(("cuda:0",), "--emulated runs without a GPU")
        if problem is None:
            try:
                driver = CudaVmmDriver(0)
            except GpuUnavailableError as exc:
                problem = f"{exc}; --emulated runs without a GPU"
        if problem:
            print(f"bench_hw: error: {problem}", file=sys.stderr)
            return 2
        from hwbackend.calibration.vmm import measure_wrapper_overhead

        compute = TorchCompute()
        results["wrapper_overhead_query"] = measure_wrapper_overhead(driver)
        results["wrapper_overhead_map_cycle"] = map_cycle_overhead(driver)
    gc.disable()  # a collection pause would be misread as a driver stall
    for mode in ("baseline", "sync", "async", "sync", "async"):
        results.setdefault("growth", []).append(serving_loop(driver, compute, mode, args.iterations))
    gc.enable()
    driver.close()
    report(results)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


def report(results: dict[str, Any]) -> None:
    """Print a short table (the tail of the output)."""
    for key in ("wrapper_overhead_query", "wrapper_overhead_map_cycle"):
        if key in results:
            print(key, {k: v for k, v in results[key].items() if "us" in k})
    by_mode: dict[str, list[dict]] = {}
    for run in results["growth"]:
        by_mode.setdefault(run["mode"], []).append(run)
    print(f"{'mode':9} {'wall ms p50':>12} {'step us p50':>12} {'step us max':>12} {'sync PG':>8} {'bg PG':>6}")
    for mode, runs in by_mode.items():
        for run in runs:
            print(f"{mode:9} {run['wall_ms_p50']:12.3f} {run['step_us_p50']:12.1f} {run['step_us_max']:12.1f} "
                  f"{run['sync_page_groups']:8d} {run['background_page_groups']:6d}")
            for i, wall in enumerate(run["wall_ms"]):
                if i and wall > 2 * run["wall_ms_p50"]:
                    print(f"   stall: iteration {i} wall {wall:.1f} ms, GPU {run['gpu_ms'][i]:.1f} ms, "
                          f"step {run['step_us'][i] if i < len(run['step_us']) else float('nan'):.0f} us, "
                          f"slowest call {run['slowest_call_us'][i]}")
    base = by_mode["baseline"][0]["wall_ms_p50"]
    sync = statistics.median(r["wall_ms_p50"] for r in by_mode["sync"])
    asyn = statistics.median(r["wall_ms_p50"] for r in by_mode["async"])
    hidden = (sync - asyn) / (sync - base) if sync > base else float("nan")
    results["summary"] = {"baseline_wall_ms": base, "sync_wall_ms": sync, "async_wall_ms": asyn,
                          "hidden_fraction": round(hidden, 3)}
    print("summary", results["summary"])


if __name__ == "__main__":
    sys.exit(main())
