"""Benchmark: the issue-18 speed targets, each run in a fresh process (clean peak RSS), printing wall and CPU
seconds, iterations per second and peak RSS against its target. Not a test.

    python bench/bench_targets.py [--only conv|arxiv|splitwise]

State the machine's load when quoting the figures (``uptime`` is printed first): the targets are for an idle
2-core machine of the project's class.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
CASES = {
    # name: (target wall s, description, SimConfig kwargs, trace, load kwargs, first N)
    "conv": (1.5, "Azure 2023 conversation trace, Llama-3-8B, H200", {},
             TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv", {}, None),
    "arxiv": (0.6, "arXiv summarization lengths, Poisson 16 req/s, first 4,000, Llama-3-8B, H200", {},
              TRACES / "vidur_processed_traces" / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
              {"arrival": "poisson:16", "seed": 0}, 4000),
    "splitwise": (2.5, "splitwise_conv, Llama-2-7B, A100, vllm scheduler",
                  {"model": "llama-2-7b", "gpu": "a100", "scheduler": "vllm"},
                  TRACES / "vidur_processed_traces" / "splitwise_conv.csv", {}, None),
}

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
import traces
from sim.setup.config import SimConfig
from sim.core.runner import run_simulation
config = SimConfig(**{config!r})
trace = traces.load_trace({trace!r}, **{load!r})
if {first!r}:
    trace = traces.first_n(trace, {first!r})
trace, _ = traces.clip_context(trace, config.slot_max_tokens)
wall, cpu = time.perf_counter(), time.process_time()
result = run_simulation(config, trace)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps({{"wall_s": wall, "cpu_s": cpu, "iterations": result.summary["iterations"],
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(CASES), default=None)
    args = parser.parse_args()
    print("load:", os.getloadavg())
    for name, (target_s, description, config, trace, load, first) in CASES.items():
        if args.only and name != args.only:
            continue
        code = CHILD.format(root=str(ROOT), config=config, trace=str(trace), load=load, first=first)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        verdict = "met" if figures["wall_s"] <= target_s else "NOT met"
        print(f"{name:10s} {description}: wall {figures['wall_s']:.2f} s, CPU {figures['cpu_s']:.2f} s, "
              f"{figures['iterations'] / figures['wall_s']:,.0f} iterations/s, peak RSS {figures['peak_rss_mib']:,.0f} MiB; "
              f"target <= {target_s} s wall: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
