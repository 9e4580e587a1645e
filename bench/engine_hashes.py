"""Hashes of the request and iteration tables (and the summary) of engine runs that the README's runs do not
reach: memory pressure with preemption (recompute and swap), synchronous mapping, no deferred reclamation,
small pages, the paged and static baselines, prefix caching on vAttention, the vLLM scheduler, chunk
admission, a block-form compute profile, and a least-outstanding co-simulation of three replicas. To prove that an engine change altered no output::

    python bench/engine_hashes.py > before.txt   (after the change)   python bench/engine_hashes.py | diff before.txt -

``--root DIR`` imports the simulator from another checkout (e.g. a ``git worktree`` of the base commit), so
both sides run the same configurations. Each line: ``label requests-hash iterations-hash summary-hash``.
Needs ../shared/traces; about a minute.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
CONV = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
CODE = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
ARXIV = TRACES / "vidur_processed_traces" / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"
SPLITWISE = TRACES / "vidur_processed_traces" / "splitwise_conv.csv"
MOONCAKE = TRACES / "mooncake_fast25" / "conversation_trace.jsonl"
A100_7B = {"model": "llama-2-7b", "gpu": "a100"}

# label, SimConfig kwargs, trace, load_trace kwargs, first N requests, profile (relative to the root)
RUNS = [
    ("splitwise-vllm", {**A100_7B, "scheduler": "vllm"}, SPLITWISE, {}, None, None),
    ("splitwise-sarathi-sync", {**A100_7B, "sync_mapping": True}, SPLITWISE, {}, 6000, None),
    ("splitwise-swap", {**A100_7B, "preemption": "swap", "host_swap_bytes": 2 << 30}, SPLITWISE, {}, 6000, None),
    ("splitwise-nodefer-64k", {**A100_7B, "deferred_reclaim": False, "page_size_bytes": 64 << 10}, SPLITWISE, {},
     4000, None),
    ("splitwise-paged", {**A100_7B, "policy": "paged"}, SPLITWISE, {}, 6000, None),
    ("splitwise-static", {**A100_7B, "policy": "static"}, SPLITWISE, {}, 3000, None),
    ("splitwise-chunk-admission", {**A100_7B, "admission": "chunk"}, SPLITWISE, {}, 6000, None),
    ("arxiv32-zero-eager0", {"zero_on_reuse": "on-reuse", "eager_lookahead_steps": 0}, ARXIV,
     {"arrival": "poisson:32", "seed": 1}, 2000, None),
    ("code-cross-workload", {}, CODE, {}, 4000, "profiles/h200-cross-workload.json"),
    ("mooncake-prefix-vattention", {"model": "llama-3.1-8b", "prefix_caching": True}, MOONCAKE,
     {}, 1500, None),
]


def _hash(frame) -> str:
    import pandas as pd
    digest = hashlib.sha256(",".join(map(str, frame.columns)).encode())
    digest.update(pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes())
    return digest.hexdigest()[:16]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout to import the simulator from")
    parser.add_argument("--only", default=None, help="run only labels containing this text")
    args = parser.parse_args()
    sys.path.insert(0, str(args.root.resolve()))
    import traces
    from sim.setup.config import SimConfig
    from sim.core.runner import run_simulation
    for label, config_kwargs, trace_path, load_kwargs, first, profile in RUNS:
        if args.only and args.only not in label:
            continue
        config = SimConfig(**config_kwargs)
        trace = traces.load_trace(str(trace_path), **load_kwargs)
        if first:
            trace = traces.first_n(trace, first)
        if "mooncake" in label:
            trace = traces.scale_rate(trace, 0.3)
        trace, _ = traces.clip_context(trace, config.slot_max_tokens)
        kwargs = {"profile_path": str(args.root / profile)} if profile else {}
        result = run_simulation(config, trace, **kwargs)
        summary = json.dumps(result.summary, sort_keys=True, default=str)
        print(label, _hash(result.requests), _hash(result.iterations),
              hashlib.sha256(summary.encode()).hexdigest()[:16], flush=True)
    if not args.only or args.only in "cosim-least-outstanding":
        # three open-arrival replicas in one environment behind a least-outstanding router
        from sim.cluster.routing import co_simulate_least_outstanding
        config = SimConfig()
        trace = traces.first_n(traces.load_trace(str(ARXIV), arrival="poisson:24", seed=2), 1500)
        trace, _ = traces.clip_context(trace, config.slot_max_tokens)
        assignment, results = co_simulate_least_outstanding(config, trace, 3)
        print("cosim-least-outstanding", hashlib.sha256(assignment.tobytes()).hexdigest()[:16],
              *(f"{_hash(r.requests)}/{_hash(r.iterations)}" for r in results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
