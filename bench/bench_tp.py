"""Tensor-parallel mapping latency (issue 9, point 3, the part one GPU allows).

Per-worker map latency of one Llama-3-8B page group (TP=2 layout: 64 sub-tensors of 4 KV heads, 2 MiB
pages, so 64 ``cuMemMap`` + 64 ``cuMemSetAccess`` per worker) with
    * ``alone``: one worker mapping, no other worker;
    * ``both``: two workers mapping the same plan at once, each in its own thread, reservations and pool.
On one GPU both workers share the device (and its primary context), so ``both`` shows how far the driver
serialises concurrent VMM calls; on two GPUs (kind ``nvidia-h200-x2``) the same script measures what
issue 9 asks to calibrate. Each round grows one slot page group by page group to ``L_max`` (one
foreground step each), then frees it (one unmap plan of all its page groups); rounds alternate modes.
Every step also checks that all workers map the same pages as the policy.

Run: ``python bench/bench_tp.py --out tp.json`` on a GPU (``--devices 0,1`` for two GPUs);
``--emulated`` without one (the driver sleeps the domain.md H200 medians per call).
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

from hwbackend.vmm.executor import policy_config_for  # noqa: E402
from hwbackend.vmm.kvcache import KVCacheLayout  # noqa: E402
from hwbackend.vmm.tp import TPExecutor, TPStepTiming, make_tp_caches  # noqa: E402
from sim.setup.catalog import get_model  # noqa: E402
from sim.memory.vattention import VAttentionPolicy  # noqa: E402

MIB = 1 << 20
EMULATED_DELAY_US = {"cuMemMap": 5.0, "cuMemSetAccess": 49.6, "cuMemUnmap": 32.7}  # domain.md H200 p50


def make_drivers(devices: list[int], emulated: bool) -> list[Any]:
    """One driver instance per worker (on one GPU: two instances retaining the same primary context)."""
    if emulated:
        from hwbackend.vmm.emulated import EmulatedVmmDriver
        return [EmulatedVmmDriver(capacity_bytes=1 << 40, delay_us=EMULATED_DELAY_US, device_ordinal=d)
                for d in devices]
    from hwbackend.vmm.driver import CudaVmmDriver
    return [CudaVmmDriver(d) for d in devices]


def bench_layout(tp: int, max_pages: int) -> KVCacheLayout:
    """One slot of Llama-3-8B's per-worker KV at ``tp`` with 2 MiB pages, ``max_pages`` page groups long."""
    model = get_model("llama-3-8b")
    return KVCacheLayout.for_model(model, num_slots=1, page_size_bytes=2 * MIB, tp=tp,
                                   max_context_tokens=max_pages * (2 * MIB // model.sub_tensor_bytes_per_token(tp)))


def bench_policy(cache: Any) -> VAttentionPolicy:
    """The policy of one round: no deferred reclamation, no eager or look-ahead maps, no admission watermark,
    so that each step maps exactly one page group and the free unmaps the slot at once."""
    return VAttentionPolicy(policy_config_for(cache, deferred_reclaim=False, eager_idle_slots=0,
                                              eager_lookahead_steps=0, admission_watermark_frac=0.0))


def both_over_alone_p50(modes: dict[str, Any]) -> dict[str, float]:
    """Worker 0's and the critical path's page-group map p50 with both workers mapping, over worker 0's alone."""
    alone = modes["alone"]["map_page_group"]["per_worker"][0]["p50_us"]
    both = modes["both"]["map_page_group"]
    return {"worker_0": round(both["per_worker"][0]["p50_us"] / alone, 3),
            "critical_path": round(both["critical_path"]["p50_us"] / alone, 3)}


def run_round(drivers: list[Any], layout: KVCacheLayout) -> list[TPStepTiming]:
    """Grow one slot page group by page group to L_max, then free it; returns the per-plan timings."""
    caches = make_tp_caches(drivers, layout, pool_page_groups=layout.max_pages_per_slot)
    policy = bench_policy(caches[0])
    with TPExecutor(policy, caches, background=False) as ex:
        slot = ex.alloc_slot(1)
        for pages in range(1, layout.max_pages_per_slot + 1):
            if not ex.step({slot: pages * layout.tokens_per_page}):
                raise RuntimeError(f"pool short at {pages} page groups")
            ex.check_consistent()
        ex.iteration_launched(0)
        ex.free_slot(slot, last_read_iteration=0)
        ex.check_consistent()
        return list(ex.timings)


def summary_us(values_us: list[float]) -> dict[str, float]:
    """n, mean, p10, p50, p90, max of a list of microseconds."""
    ordered = sorted(values_us)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"n": len(ordered), "mean_us": round(statistics.fmean(ordered), 1), "p10_us": round(pick(0.1), 1),
            "p50_us": round(statistics.median(ordered), 1), "p90_us": round(pick(0.9), 1),
            "max_us": round(ordered[-1], 1)}


def summarise(timings: list[TPStepTiming], num_workers: int) -> dict[str, Any]:
    """Per-worker, critical-path and wall summaries of map plans (one page group) and unmap plans."""
    result = {}
    for name, chosen in (("map_page_group", [t for t in timings if t.page_groups_mapped == 1]),
                         ("unmap_slot", [t for t in timings if t.page_groups_unmapped])):
        result[name] = {"per_worker": [summary_us([t.worker_mapping_us[r] for t in chosen])
                                       for r in range(num_workers)],
                        "critical_path": summary_us([t.critical_path_us for t in chosen]),
                        "wall": summary_us([t.wall_us for t in chosen])}
    return result


def measure(devices: list[int], emulated: bool, rounds: int, layout: KVCacheLayout) -> dict[str, Any]:
    """Alternate ``alone`` (worker 0 only) and ``both`` rounds after one warm-up round each."""
    drivers = make_drivers(devices, emulated)
    timings: dict[str, list[TPStepTiming]] = {"alone": [], "both": []}
    modes = {"alone": drivers[:1], "both": drivers}
    gc.collect()
    gc.disable()
    try:
        for mode, mode_drivers in modes.items():
            run_round(mode_drivers, layout)  # warm-up
        for _ in range(rounds):
            for mode, mode_drivers in modes.items():
                timings[mode] += run_round(mode_drivers, layout)
    finally:
        gc.enable()
        environment = drivers[0].environment()
        for driver in drivers:
            driver.close()
    return {"environment": environment,
            "modes": {mode: summarise(timings[mode], len(modes[mode])) for mode in modes}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="0,0", help="device of each worker (default 0,0: two workers, one GPU)")
    parser.add_argument("--rounds", type=int, default=4, help="measured rounds per mode")
    parser.add_argument("--max-pages", type=int, default=32, help="page groups per slot (L_max / tokens per page)")
    parser.add_argument("--emulated", action="store_true", help="emulated drivers (no GPU)")
    parser.add_argument("--out", type=Path, help="JSON output file")
    args = parser.parse_args(argv)
    devices = [int(d) for d in args.devices.split(",")]
    layout = bench_layout(len(devices), args.max_pages)
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S")
    result = {"bench": "bench/bench_tp.py", "argv": sys.argv[1:], "started_at": started_at,
              "model": "llama-3-8b", "tp": len(devices), "devices": devices, "emulated": args.emulated,
              "layout": {"num_sub_tensors": layout.num_sub_tensors, "num_kv_heads_per_worker": layout.num_kv_heads,
                         "page_size_bytes": layout.page_size_bytes, "max_pages_per_slot": layout.max_pages_per_slot},
              **measure(devices, args.emulated, args.rounds, layout)}
    result["both_over_alone_p50"] = both_over_alone_p50(result["modes"])
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
