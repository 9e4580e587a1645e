"""Page hand-over cost between two co-located tenants on one GPU (issue 34), run on the H200 on 2026-12-02
(``docs/device/session5/handover.json``: 5.10 / 5.44 ms per page group A->B / B->A)::

    python -m hwbackend.calibration.colocate_handover --out handover.json

Two tenants' KV caches (Llama-3.1-8B: 64 sub-tensors, Qwen2.5-7B: 56, 2 MiB pages) are reserved on one GPU and
served from one :class:`hwbackend.vmm.shared_pool.SharedHandlePool`. In bursts, tenant A maps ``--burst`` page
groups, unmaps them, and tenant B maps the same physical handles into its own range (and back); every driver
call is timed by :class:`hwbackend.vmm.driver.CudaVmmDriver`. The JSON holds the per-call percentiles and the
hand-over time per page group (A's cuMemUnmap + B's cuMemMap + cuMemSetAccess), to compare with the
simulator's ``VmmLatencyModel`` (``kvsim validate``-style: the simulator charges a hand-over as one unmap of
the giver's group and one page-group map of the taker's). Runs on the emulated driver with ``--emulated``
(for a dry run on a CPU; the latencies are then meaningless).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sim.memory.plan import MapOp, Plan, UnmapOp
from sim.setup.catalog import get_model

MODELS = ("llama-3.1-8b", "qwen2.5-7b")


def _layout(model: str, page_size_bytes: int, max_context_tokens: int):
    from hwbackend.vmm.kvcache import KVCacheLayout
    return KVCacheLayout.for_model(get_model(model), num_slots=4, max_context_tokens=max_context_tokens,
                                   page_size_bytes=page_size_bytes)


def latency_percentiles(values_us: list[float]) -> dict:
    """``n``, ``p50_us``, ``p90_us``, ``p99_us`` (linear, ``np.percentile``) and ``mean_us`` of latencies in us;
    ``{}`` for none."""
    import numpy as np
    if not values_us:
        return {}
    arr = np.asarray(values_us, dtype=float)
    return {"n": int(arr.size), "p50_us": float(np.percentile(arr, 50)), "p90_us": float(np.percentile(arr, 90)),
            "p99_us": float(np.percentile(arr, 99)), "mean_us": float(arr.mean())}


def vmm_call_percentiles(driver) -> dict:
    """:func:`latency_percentiles` of the driver's timed ``cuMemMap``, ``cuMemUnmap`` and ``cuMemSetAccess`` calls
    (:class:`hwbackend.vmm.driver.CallStats`); ``{}`` for a driver without call statistics. Used here and by the
    co-located replay (:mod:`hwbackend.replay.colocate`)."""
    stats = getattr(driver, "stats", None)
    if stats is None:
        return {}
    return {c: latency_percentiles(stats.latencies_us(c)) for c in ("cuMemMap", "cuMemUnmap", "cuMemSetAccess")}


def measure(driver, bursts: int, burst_groups: int, page_size_bytes: int = 2 << 20) -> dict:
    """Hand ``burst_groups`` page groups from tenant A to tenant B and back, ``bursts`` times; per-call and
    per-hand-over latencies (us)."""
    import time
    from hwbackend.vmm.shared_pool import SharedHandlePool, TenantKVCache
    layouts = [_layout(m, page_size_bytes, 32768) for m in MODELS]
    pages = burst_groups * max(lay.num_sub_tensors for lay in layouts)
    # the tenant with fewer sub-tensors takes more page groups of the same pages: its slot must hold them all
    # (first H200 run: Qwen2.5-7B's 56 sub-tensors take 18 groups of Llama's 16 x 64 pages, beyond 16 per slot)
    most_groups = max(-(-pages // lay.num_sub_tensors) for lay in layouts)
    layouts = [_layout(m, page_size_bytes, most_groups * lay.tokens_per_page)
               if most_groups > lay.max_pages_per_slot else lay for m, lay in zip(MODELS, layouts)]
    pool = SharedHandlePool(driver, page_size_bytes, pages, [pages, pages]).open()
    handover_us = {"a_to_b": [], "b_to_a": []}
    try:
        with TenantKVCache(driver, layouts[0], pool, 0) as a, TenantKVCache(driver, layouts[1], pool, 1) as b:
            groups_b = pages // layouts[1].num_sub_tensors
            for _ in range(bursts):
                a.apply(Plan(maps=(MapOp(0, 0, burst_groups),)))
                started = time.perf_counter()
                a.apply(Plan(unmaps=(UnmapOp(0, 0, burst_groups),)))
                b.apply(Plan(maps=(MapOp(0, 0, groups_b),)))
                handover_us["a_to_b"].append((time.perf_counter() - started) * 1e6 / burst_groups)
                started = time.perf_counter()
                b.apply(Plan(unmaps=(UnmapOp(0, 0, groups_b),)))
                a.apply(Plan(maps=(MapOp(0, 0, burst_groups),)))
                handover_us["b_to_a"].append((time.perf_counter() - started) * 1e6 / burst_groups)
                a.apply(Plan(unmaps=(UnmapOp(0, 0, burst_groups),)))
        calls = vmm_call_percentiles(driver)
        return {"models": list(MODELS), "page_size_bytes": page_size_bytes, "bursts": bursts,
                "burst_page_groups": burst_groups, "handed_over_pages": pool.handed_over_pages,
                "handover_per_page_group": {k: latency_percentiles(v) for k, v in handover_us.items()}, "calls": calls}
    finally:
        pool.close()


def main(argv: list[str] | None = None) -> int:
    """Command line (module docstring); exit status 0, or 2 with one message when the GPU is unavailable."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bursts", type=int, default=50, help="hand-over rounds (default: 50)")
    parser.add_argument("--burst-groups", type=int, default=16, help="page groups per burst (default: 16)")
    parser.add_argument("--out", default=None, help="JSON file to write (default: print)")
    parser.add_argument("--emulated", action="store_true", help="emulated driver (dry run) (default: off)")
    args = parser.parse_args(argv)
    if args.emulated:
        from hwbackend.vmm.emulated import EmulatedVmmDriver
        driver = EmulatedVmmDriver(capacity_bytes=1 << 40)
        result = measure(driver, args.bursts, args.burst_groups)
    else:
        from hwbackend.vmm.driver import CudaVmmDriver, GpuUnavailableError
        try:
            with CudaVmmDriver(0) as driver:
                result = measure(driver, args.bursts, args.burst_groups)
        except GpuUnavailableError as exc:
            print(f"colocate_handover: {exc}", file=sys.stderr)
            return 2
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
