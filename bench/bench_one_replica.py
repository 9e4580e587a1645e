"""Benchmark: one week-long replica of ``bench/bench_week.py`` alone (270,000 requests at the week's per-replica
rate, 0.45 req/s, Llama-3-8B on an H200), simulated in this process with its records streamed to a temporary
directory under ``--tmp`` (the two summary columns only, as ``--summary-columns-only``); prints wall and CPU
seconds and the peak RSS (``ru_maxrss``), the figure that bounds each worker of the week. ``--root DIR`` runs
another checkout (e.g. a ``git worktree`` of an earlier commit) on the same trace.

    python bench/bench_one_replica.py [--root DIR] [--tmp DIR]
"""
from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WEEK_S = 7 * 24 * 3600.0
WEEK_REQUESTS = 27_000_000
REPLICAS = 100


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout to import the simulator from")
    parser.add_argument("--tmp", type=Path, default=None, help="directory for the records (default: the system's)")
    args = parser.parse_args()
    sys.path.insert(0, str(args.root.resolve()))
    import numpy as np

    import traces
    from sim.setup.config import SimConfig
    from sim.cluster.routing import simulate_replicas

    config = SimConfig()
    requests = WEEK_REQUESTS // REPLICAS
    rate_per_s = WEEK_REQUESTS / WEEK_S / REPLICAS
    trace = traces.synthesize(requests, f"poisson:{rate_per_s}", 0, source="one week-long replica")
    trace, _ = traces.clip_context(trace, config.slot_max_tokens)
    with tempfile.TemporaryDirectory(dir=args.tmp) as records:
        wall, cpu = time.perf_counter(), time.process_time()
        result = simulate_replicas(config, trace, np.zeros(len(trace), dtype=np.int64), 1, executor="local",
                                   workers=1, records_dir=records, keep_iterations=False)[0]
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"{requests:,} requests at {rate_per_s:.3f} req/s: {result.summary['iterations']:,} iterations; wall "
          f"{wall:.1f} s, CPU {cpu:.1f} s; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} "
          f"MiB; TBT mean {result.summary.get('tbt_mean_ms')} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
