"""Benchmark: a week of Azure-2024-scale traffic over many replicas (issue 18): ``--requests`` requests
(default 27,000,000, the Azure 2024 conversation week) arriving as a Poisson process over seven days, lengths
of the Azure 2023 conversation trace (``traces.synthetic_default``'s targets), Llama-3-8B on H200 replicas
behind round-robin routing; replicas simulated on ``--executor`` (``ray`` or ``local``) with ``--workers``
CPUs, iteration records streamed to a temporary directory. Prints the generation, simulation and merge wall
times, iterations/s and peak RSS (this process, and the largest worker for the local executor).

    python bench/bench_week.py --requests 27000000 --replicas 100 --executor ray --workers 2
    python bench/bench_week.py --requests 270000 --replicas 10 --workers 1     # a 1% slice
"""
from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WEEK_S = 7 * 24 * 3600.0
WEEK_REQUESTS = 27_000_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=WEEK_REQUESTS)
    parser.add_argument("--replicas", type=int, default=100)
    parser.add_argument("--executor", choices=("local", "ray"), default="ray")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import traces
    from sim.config import SimConfig
    from sim.routing import run_routed

    started = time.perf_counter()
    # the week's rate, kept for a slice: a slice is the first --requests requests of the week
    rate_per_s = WEEK_REQUESTS / WEEK_S
    trace = traces.synthesize(args.requests, f"poisson:{rate_per_s}", args.seed,
                              source=f"synthetic week slice: {args.requests:,} requests at {rate_per_s:.2f} req/s")
    config = SimConfig()
    trace, _ = traces.clip_context(trace, config.slot_max_tokens)
    generated_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as records:
        started = time.perf_counter()
        routed = run_routed(config, trace, args.replicas, "round-robin", executor=args.executor,
                            workers=args.workers, records_dir=records)
        simulated_s = time.perf_counter() - started
    iterations = sum(r.summary["iterations"] for r in routed.replicas if r is not None)
    own_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    span_h = float(trace["arrival_s"].max()) / 3600
    print(f"{args.requests:,} requests over {span_h:.1f} h, {args.replicas} replicas, {args.executor} x{args.workers}: "
          f"generated in {generated_s:.1f} s; simulated and merged in {simulated_s:.1f} s wall "
          f"({iterations:,} iterations, {iterations / simulated_s:,.0f} iterations/s); finished "
          f"{routed.summary['finished']:,}; peak RSS {own_mib:,.0f} MiB here, {children_mib:,.0f} MiB largest child "
          f"(local executor; Ray workers are not children)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
