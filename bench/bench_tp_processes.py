"""Tensor-parallel mapping latency with one *process* per worker (issue 9, point 3).

``bench/bench_tp.py`` runs the TP workers as threads of one process (``hwbackend.vmm.tp``). On two H200s it
measured a page-group map at 2.00x its one-worker time when both workers map at once (docs/tp2/README.md):
the two devices did not map independently. This script asks whether that comes from sharing one process
(the driver's or the interpreter's locks) or from the devices: each worker is a process of its own
(``multiprocessing`` spawn, as vLLM runs one process per GPU), with its own driver on its own device, its own
:class:`hwbackend.vmm.kvcache.KVCache` (Llama-3-8B at TP=2: 64 sub-tensors of 4 KV heads, 2 MiB pages) and its own
copy of the same :class:`sim.memory.vattention.VAttentionPolicy`, so every worker applies the same plans.

Each round grows one slot page group by page group to ``L_max`` (one plan per page group), then frees it
(one unmap plan). Before every plan the workers meet at a barrier; each times its own ``KVCache.apply``.
Modes: ``alone`` (only worker 0 applies; the other waits at the barriers) and ``both``; rounds alternate
after one warm-up round each. The critical path of a plan is the slower worker's time.

Run on a GPU machine: ``python bench/bench_tp_processes.py --devices 0,1 --rounds 8 --out tp.json``
(``--emulated`` without a GPU: drivers that sleep domain.md's H200 medians per call); then
``--from-result tp.json --add-to-profile PROFILE`` writes the per-worker slowdown as the profile section
``vmm_tp`` (on CPU).
"""
from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_tp import both_over_alone_p50, bench_layout, bench_policy, make_drivers, summary_us  # noqa: E402



def _worker(rank: int, device: int, emulated: bool, rounds: int, max_pages: int, barrier: Any,
            results: Any) -> None:
    """One TP worker process: returns ``{"rank", "alone": [...], "both": [...], "environment"}`` through
    ``results`` (per-plan apply times in microseconds, ``("map" | "unmap", us)``), or ``{"rank", "error"}``."""
    try:
        from hwbackend.vmm.kvcache import KVCache

        driver = make_drivers([device], emulated)[0]
        driver.make_current()
        layout = bench_layout(2, max_pages)
        out: dict[str, Any] = {"rank": rank, "alone": [], "both": [], "environment": driver.environment()}
        schedule = ["alone", "both"] + ["alone", "both"] * rounds  # the first two are warm-up rounds
        gc.collect()
        gc.disable()
        for index, mode in enumerate(schedule):
            active = mode == "both" or rank == 0
            with KVCache(driver, layout, pool_page_groups=layout.max_pages_per_slot) as cache:
                policy = bench_policy(cache)
                slot = policy.alloc_slot(1)
                plans = []
                for pages in range(1, layout.max_pages_per_slot + 1):
                    plan = policy.step({slot: pages * layout.tokens_per_page})
                    if plan is None:
                        raise RuntimeError(f"pool short at {pages} page groups")
                    plans.append(("map", plan))
                policy.iteration_completed(0)
                plans.append(("unmap", policy.free_slot(slot, 0)))
                for kind, plan in plans:
                    barrier.wait()
                    if active:
                        started = time.perf_counter()
                        cache.apply(plan)
                        elapsed_us = (time.perf_counter() - started) * 1e6
                        if index >= 2:
                            out[mode].append((kind, elapsed_us))
                barrier.wait()
        gc.enable()
        driver.close()
        results.put(out)
    except BaseException as exc:  # reported by the parent with the worker's rank
        results.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}"})
        barrier.abort()


def measure(devices: list[int], emulated: bool, rounds: int, max_pages: int) -> dict[str, Any]:
    """Start one process per device, collect their per-plan times, summarise per worker and critical path.

    Raises:
        RuntimeError: naming the worker that failed and its error.
    """
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(len(devices)), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(rank, device, emulated, rounds, max_pages, barrier, results))
             for rank, device in enumerate(devices)]
    for proc in procs:
        proc.start()
    outs = sorted((results.get(timeout=600) for _ in procs), key=lambda o: o["rank"])
    for proc in procs:
        proc.join()
    errors = [f"worker {o['rank']}: {o['error']}" for o in outs if "error" in o]
    if errors:
        raise RuntimeError("; ".join(errors))
    modes: dict[str, Any] = {}
    for mode in ("alone", "both"):
        workers = [o for o in outs if o[mode]]
        modes[mode] = {}
        for kind, name in (("map", "map_page_group"), ("unmap", "unmap_slot")):
            per_worker = [[us for k, us in o[mode] if k == kind] for o in workers]
            critical = [max(values) for values in zip(*per_worker)]
            modes[mode][name] = {"per_worker": [summary_us(v) for v in per_worker],
                                 "critical_path": summary_us(critical)}
    return {"environment": outs[0]["environment"], "modes": modes}


def tp_section(result: dict[str, Any], source: str) -> dict[str, Any]:
    """The profile section ``vmm_tp`` from a result of :func:`measure` (``docs/profile-format.md``):
    ``worker_scale[tp]`` = mean per-worker page-group map time with every worker mapping at once over worker
    0's mean alone (both workers' plans: 256 maps each in the committed run). The simulator multiplies each
    worker's drawn VMM time by it (``sim/core/engine.py`` ``VmmCost``)."""
    alone = result["modes"]["alone"]["map_page_group"]["per_worker"][0]["mean_us"]
    both = result["modes"]["both"]["map_page_group"]
    scale = statistics.fmean(w["mean_us"] for w in both["per_worker"]) / alone
    return {"worker_scale": {str(result["tp"]): round(scale, 3)},
            "workers": result.get("workers", "one process per worker"), "devices": result["devices"],
            "alone_map_page_group_us": {k: result["modes"]["alone"]["map_page_group"]["per_worker"][0][k]
                                        for k in ("mean_us", "p50_us", "p90_us")},
            "both_map_page_group_critical_path_us": {k: both["critical_path"][k] for k in ("mean_us", "p50_us", "p90_us")},
            "source": source, "command": f"python bench/bench_tp_processes.py {' '.join(result['argv'])}",
            "gpu_name": result["environment"].get("gpu_name"), "measured_at": result["started_at"]}


def check_profile_target(profile_path: Path, force: bool) -> tuple[dict | None, str | None, int]:
    """The profile ``--add-to-profile`` will write into, read and checked before any measurement: a JSON
    object, without ``vmm_tp`` unless ``force``. Returns ``(profile, problem, exit status)``."""
    try:
        profile = json.loads(profile_path.read_text())
    except (OSError, ValueError) as exc:
        return None, f"--add-to-profile {profile_path}: cannot read the profile ({exc})", 2
    if not isinstance(profile, dict) or profile.get("format") != "kvsim-profile/1":
        return None, f"--add-to-profile {profile_path}: not a kvsim-profile/1 profile (docs/profile-format.md)", 2
    if "vmm_tp" in profile and not force:
        return None, f"--add-to-profile {profile_path}: already holds vmm_tp; pass --force to replace it", 1
    return profile, None, 0


def add_to_profile(result_path: Path, profile_path: Path, force: bool) -> int:
    """Write :func:`tp_section` of a saved result into an existing profile (refuses to replace a ``vmm_tp``
    without ``force``). Only a result of this script, measured on real GPUs (not ``--emulated``), is taken.
    Returns the exit status (0, 1 refused, 2 unusable input), printing one line."""
    profile, problem, status = check_profile_target(profile_path, force)
    if problem:
        print(f"bench_tp_processes: {problem}", file=sys.stderr)
        return status
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError) as exc:
        print(f"bench_tp_processes: --from-result {result_path}: cannot read it ({exc})", file=sys.stderr)
        return 2
    if not isinstance(result, dict) or result.get("bench") != "bench/bench_tp_processes.py":
        print(f"bench_tp_processes: {result_path}: not a result of bench/bench_tp_processes.py (field bench is "
              f"{result.get('bench') if isinstance(result, dict) else None!r}); only one-process-per-worker "
              "measurements go into vmm_tp", file=sys.stderr)
        return 2
    if result.get("emulated"):
        print(f"bench_tp_processes: {result_path}: measured with --emulated drivers; only GPU measurements go into "
              "a profile", file=sys.stderr)
        return 2
    try:
        section = tp_section(result, str(result_path))
    except (KeyError, TypeError, IndexError, ZeroDivisionError) as exc:
        print(f"bench_tp_processes: {result_path}: incomplete result (missing or malformed {exc})", file=sys.stderr)
        return 2
    profile["vmm_tp"] = section
    profile_path.write_text(json.dumps(profile, indent=1) + "\n")
    print(f"wrote {profile_path}: vmm_tp.worker_scale {section['worker_scale']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="0,1", help="device of each worker process (default 0,1)")
    parser.add_argument("--rounds", type=int, default=4, help="measured rounds per mode")
    parser.add_argument("--max-pages", type=int, default=32, help="page groups per slot")
    parser.add_argument("--emulated", action="store_true", help="emulated drivers (no GPU)")
    parser.add_argument("--out", type=Path, help="write the JSON result here")
    parser.add_argument("--from-result", type=Path, help="no measurement: read a saved result (with --add-to-profile)")
    parser.add_argument("--add-to-profile", type=Path, help="write the result's vmm_tp section into this profile")
    parser.add_argument("--force", action="store_true", help="replace the profile's vmm_tp")
    args = parser.parse_args(argv)
    if args.from_result:
        if not args.add_to_profile:
            parser.error("--from-result needs --add-to-profile PROFILE")
        return add_to_profile(args.from_result, args.add_to_profile, args.force)
    if args.from_result and (args.out or args.emulated):
        parser.error("--from-result reads a saved result: leave out --out and --emulated")
    try:
        devices = [int(d) for d in args.devices.split(",")]
    except ValueError:
        parser.error(f"--devices must be comma-separated device ordinals, got {args.devices!r}")
    if len(devices) != 2 or min(devices) < 0:
        parser.error(f"--devices needs two workers (TP=2) on device ordinals >= 0, got {devices}")
    if args.rounds < 1 or args.max_pages < 1:
        parser.error("--rounds and --max-pages must be >= 1")
    if args.out and not args.out.parent.is_dir():
        parser.error(f"--out {args.out}: the directory {args.out.parent} does not exist")
    if args.add_to_profile:  # checked before minutes of measurement
        if not args.out:
            parser.error("--add-to-profile needs --out (the profile records the result file it came from)")
        if args.emulated:
            parser.error("--add-to-profile takes GPU measurements only, not --emulated")
        _, problem, status = check_profile_target(args.add_to_profile, args.force)
        if problem:
            print(f"bench_tp_processes: {problem}", file=sys.stderr)
            return status
    result = {"bench": "bench/bench_tp_processes.py", "argv": sys.argv[1:] if argv is None else argv,
              "started_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "model": "llama-3-8b", "tp": 2,
              "devices": devices, "emulated": args.emulated, "workers": "one process per worker (spawn)"}
    try:
        result.update(measure(devices, args.emulated, args.rounds, args.max_pages))
    except RuntimeError as exc:
        print(f"bench_tp_processes: {exc}", file=sys.stderr)
        return 1
    result["both_over_alone_p50"] = both_over_alone_p50(result["modes"])
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    if args.add_to_profile:
        return add_to_profile(args.out, args.add_to_profile, args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
