"""Benchmark: a week of Azure-2024-scale traffic over many replicas (issue 18): ``--requests`` requests
(default 27,000,000, the Azure 2024 conversation week) arriving as a Poisson process over seven days, lengths
of the Azure 2023 conversation trace (``traces.synthetic_default``'s targets), Llama-3-8B on H200 replicas
behind round-robin routing; replicas simulated on ``--executor`` (``ray`` or ``local``) with ``--workers``
CPUs, each leaving its records in a records directory (``--records``, default a temporary one), merged with
bounded memory (``sim.cluster.replica_merge``).

Prints the generation, simulation and merge wall times, the CPU seconds of the whole process tree (this
process, pool or Ray processes), iterations/s, the peak RSS and PSS of the whole process tree (sampled every
second from /proc; PSS splits shared pages such as Ray's object store between the processes mapping them),
and a hash of the merged summary and of the per-request tables (equal for any --workers / --executor).
``--log-every S`` prints a progress line (replicas done, tree RSS) every S seconds. The week's records take
about 104 GB with every iteration record kept; ``--summary-columns-only`` keeps the two columns the merge reads
(about 11 GB). ``--records DIR --resume`` goes on after a stop: replicas complete in DIR are read back, the rest
simulated (the week's wall time is then the sum of the runs' simulation times, each printed).

    python bench/bench_week.py --requests 27000000 --replicas 100 --executor ray --workers 2 --summary-columns-only
    python bench/bench_week.py --requests 2700000 --replicas 10 --executor local --workers 1   # a 10% slice
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WEEK_S = 7 * 24 * 3600.0
WEEK_REQUESTS = 27_000_000
PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


def _tree() -> list[int]:
    """This process and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [os.getpid()]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


class TreeSampler(threading.Thread):
    """Peak RSS and PSS (sums over the process tree) and the CPU seconds of every process seen, sampled."""

    def __init__(self, interval_s: float = 1.0, log_every_s: float = 0.0, records: Path | None = None,
                 replicas: int = 0):
        super().__init__(daemon=True)
        self.interval_s, self.log_every_s, self.records, self.replicas = interval_s, log_every_s, records, replicas
        self.peak_rss = self.peak_pss = 0
        self.cpu_ticks: dict[tuple[int, int], int] = {}     # (pid, start time) -> utime + stime
        self.started = time.perf_counter()
        self._halt = threading.Event()

    def sample(self) -> tuple[int, int]:
        rss = pss = 0
        for pid in _tree():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                self.cpu_ticks[(pid, int(fields[19]))] = int(fields[11]) + int(fields[12])
                rss += int(fields[21]) * PAGE
                with open(f"/proc/{pid}/smaps_rollup") as f:
                    for line in f:
                        if line.startswith("Pss:"):
                            pss += int(line.split()[1]) * 1024
                            break
            except (OSError, IndexError, ValueError):
                continue
        self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
        return rss, pss

    def run(self) -> None:
        last_log = time.perf_counter()
        while not self._halt.wait(self.interval_s):
            rss, pss = self.sample()
            now = time.perf_counter()
            if self.log_every_s and now - last_log >= self.log_every_s:
                last_log = now
                done = len(list(self.records.glob("replica-*.requests.parquet"))) if self.records else 0
                print(f"[{now - self.started:8.0f} s] replicas done {done}/{self.replicas}; tree RSS "
                      f"{rss / 2**20:,.0f} MiB, PSS {pss / 2**20:,.0f} MiB; peak RSS {self.peak_rss / 2**20:,.0f} "
                      f"MiB, PSS {self.peak_pss / 2**20:,.0f} MiB; CPU {self.cpu_s():,.0f} s", flush=True)

    def cpu_s(self) -> float:
        return sum(self.cpu_ticks.values()) / TICK

    def stop(self) -> None:
        self.sample()
        self._halt.set()


def outputs_hash(routed) -> str:
    """SHA-256 of the merged summary (JSON) and of every replica's per-request table (pandas row hashes)."""
    import pandas as pd

    digest = hashlib.sha256(json.dumps(routed.summary, sort_keys=True, default=str).encode())
    for result in routed.replicas:
        if result is not None:
            digest.update(pd.util.hash_pandas_object(result.requests, index=False).to_numpy().tobytes())
            result.requests = None      # read one replica's table at a time
    return digest.hexdigest()[:16]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=WEEK_REQUESTS)
    parser.add_argument("--replicas", type=int, default=100)
    parser.add_argument("--executor", choices=("local", "ray"), default="ray")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--records", help="keep the replicas' records in this directory (default: a temporary one)")
    parser.add_argument("--log-every", type=float, default=0.0, help="progress line every S seconds")
    parser.add_argument("--no-hash", action="store_true", help="skip hashing the per-request tables")
    parser.add_argument("--summary-columns-only", action="store_true",
                        help="keep of each replica's iteration records only the two columns the merge reads "
                             "(a week-long replica: about 1 GB of records otherwise)")
    parser.add_argument("--merge-only", action="store_true",
                        help="merge the replicas already simulated into --records (no simulation)")
    parser.add_argument("--resume", action="store_true",
                        help="with --records: read back the replicas already complete there and simulate the rest "
                             "(a run stopped part-way goes on; same --requests, --replicas and --seed)")
    args = parser.parse_args()
    import traces
    from sim.setup.config import SimConfig
    from sim.cluster.routing import assign, simulate_replicas, merged_summary

    sampler = TreeSampler(log_every_s=args.log_every, replicas=args.replicas)
    sampler.start()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    # the week's rate, kept for a slice: a slice is the first --requests requests of the week
    rate_per_s = WEEK_REQUESTS / WEEK_S
    config = SimConfig()
    trace, span_h = None, float("nan")
    if not args.merge_only:
        trace = traces.synthesize(args.requests, f"poisson:{rate_per_s}", args.seed,
                                  source=f"synthetic week slice: {args.requests:,} requests at {rate_per_s:.2f} req/s")
        trace, _ = traces.clip_context(trace, config.slot_max_tokens)
        span_h = float(trace["arrival_s"].max()) / 3600
        print(f"generated {len(trace):,} requests over {span_h:.1f} h in {time.perf_counter() - wall0:.1f} s",
              flush=True)
    generated_s = time.perf_counter() - wall0
    with tempfile.TemporaryDirectory() as temporary:
        records = Path(args.records) if args.records else Path(temporary)
        records.mkdir(parents=True, exist_ok=True)
        sampler.records = records
        started = time.perf_counter()
        if args.merge_only:
            from sim.cluster.routing import load_replica_results
            results = load_replica_results(str(records), args.replicas)
        else:
            if args.resume:
                before = len(list(records.glob("replica-*.parts.json")))
                print(f"resume: {before} of {args.replicas} replicas already complete in {records}", flush=True)
            # hand the trace over: simulate_replicas frees it once every replica's rows are split off
            held = [trace, assign(trace, args.replicas, "round-robin", config.seed)]
            del trace
            results = simulate_replicas(config, held.pop(0), held.pop(0), args.replicas, executor=args.executor,
                                        workers=args.workers, records_dir=str(records),
                                        keep_iterations=not args.summary_columns_only, resume=args.resume)
        simulated_s = time.perf_counter() - started
        print(f"simulated in {simulated_s:.1f} s", flush=True)
        started = time.perf_counter()
        from sim.cluster.routing import RoutedRun
        routed = RoutedRun("round-robin", None, None, merged_summary(results, config), results)
        merged_s = time.perf_counter() - started
        print(f"merged in {merged_s:.1f} s", flush=True)
        digest = "skipped" if args.no_hash else outputs_hash(routed)
        disk = sum(f.stat().st_size for f in records.iterdir())
    wall_s = time.perf_counter() - wall0
    sampler.stop()
    summary = routed.summary
    iterations = summary["iterations"]
    children_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"{args.requests:,} requests over {span_h:.1f} h, {args.replicas} replicas, {args.executor} x{args.workers}: "
          f"generated {generated_s:.1f} s, simulated {simulated_s:.1f} s, merged {merged_s:.1f} s; total "
          f"{wall_s:.1f} s wall, {sampler.cpu_s():,.1f} s CPU (process tree; this process "
          f"{time.process_time() - cpu0:,.1f} s); {iterations:,} iterations, "
          f"{iterations / (simulated_s + merged_s):,.0f} iterations/s (simulated and merged); finished "
          f"{summary['finished']:,}; peak RSS {sampler.peak_rss / 2**20:,.0f} MiB (process tree, sum), "
          f"PSS {sampler.peak_pss / 2**20:,.0f} MiB; this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} "
          f"MiB, largest child {children_mib:,.0f} MiB; records {disk / 2**30:,.1f} GiB; outputs hash {digest}")
    print("summary: " + json.dumps({k: summary[k] for k in ("ttft_p99_ms", "tpot_p99_ms", "tbt_p99_ms", "tbt_mean_ms",
                                                            "iteration_p99_ms", "iteration_mean_ms", "makespan_s",
                                                            "throughput_req_per_s", "sync_stall_total_ms")}))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as exc:   # a records directory of another run, an unreadable record: one line, exit 2
        print(f"bench_week.py: {exc}", file=sys.stderr)
        sys.exit(2)
