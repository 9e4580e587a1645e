"""Benchmark: memory and time of long traces. The Azure 2023 conversation trace repeated N times back to back
(each copy shifted by the trace's span plus 1 s), Llama-3-8B on one H200, defaults; iterations streamed to
Parquet as ``kvsim simulate`` does. Prints wall and CPU seconds, iterations/s and peak RSS.

    python bench/bench_scale.py [--repeat-trace 10] [--out DIR]

Targets (issue 18): 10x: peak RSS <= 1 GiB and wall time <= 11x the 1x run.
"""
from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CONV = ROOT.parent / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"


def repeated_trace(times: int) -> pd.DataFrame:
    """The conversation trace ``times`` times back to back, request ids renumbered."""
    import traces
    from sim.setup.config import SimConfig

    base, _ = traces.clip_context(traces.load_trace(CONV), SimConfig().slot_max_tokens)
    span_s = float(base["arrival_s"].max()) + 1.0
    copies = [base.assign(arrival_s=base["arrival_s"] + k * span_s) for k in range(times)]
    trace = pd.concat(copies, ignore_index=True)
    trace["request_id"] = range(len(trace))
    trace.attrs["source"] = f"{CONV.name} x{times}"
    return trace


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat-trace", type=int, default=10)
    parser.add_argument("--out", default=None, help="directory for the streamed iterations (default: a temporary one)")
    args = parser.parse_args()
    from sim.setup.config import SimConfig
    from sim.core.runner import run_simulation

    trace = repeated_trace(args.repeat_trace)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        started, cpu = time.perf_counter(), time.process_time()
        result = run_simulation(SimConfig(), trace, records_path=str(out / "iterations.parquet"))
        wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu
        iterations = result.summary["iterations"]
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"conversation trace x{args.repeat_trace}: {len(trace):,} requests, {iterations:,} iterations; "
          f"wall {wall_s:.2f} s, CPU {cpu_s:.2f} s, {iterations / wall_s:,.0f} iterations/s; peak RSS {peak_mib:,.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
