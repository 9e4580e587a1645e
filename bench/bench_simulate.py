"""Benchmark: replay the 19,366-request Azure 2023 conversation trace (Llama-3-8B, H200, defaults) and print
wall seconds, simulated iterations per second and requests per second. Not a test: speed targets live here.

    python bench/bench_simulate.py [--trace PATH] [--repeat N]

Target (issue "Simulator core"): under 3 s on the project's 2-core machine. Reference: the Vidur simulator
needs about 26 s for this trace with block counters only.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import traces
from sim.core.runner import run_simulation
from sim.setup.config import SimConfig

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(DEFAULT_TRACE))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    config = SimConfig()
    for attempt in range(args.repeat):
        started = time.perf_counter()
        trace, _ = traces.clip_context(traces.load_trace(args.trace), config.slot_max_tokens)
        loaded = time.perf_counter()
        result = run_simulation(config, trace)
        wall_s = time.perf_counter() - started
        iterations = len(result.iterations)
        print(f"run {attempt + 1}: wall {wall_s:.2f} s (trace load {loaded - started:.2f} s), "
              f"{iterations:,} iterations -> {iterations / wall_s:,.0f} iterations/s, "
              f"{len(result.requests) / wall_s:,.0f} requests/s")


if __name__ == "__main__":
    main()
