"""Concurrent requests of L tokens the KV pool holds, with and without window-aware allocation (docs/hybrid.md).

``python bench/hybrid_capacity.py [--tokens 8192 32768] [--models models/gpt-oss-20b.json models/gemma-3-12b.json]``

Rule (per worker, H200, ``memory_util 0.9``, the default slot length): requests = pool units // units one
request of L tokens holds at most. Without window-aware allocation every layer holds all L tokens (one page group
or block per page of tokens). With it: vAttention's units per request are each group's
:meth:`sim.memory.layer_groups.LayerGroup.max_pages_held` (a sliding group ``ceil(W / p) + 1`` pages) times its
layers; paged follows vLLM's ``get_max_concurrency_for_kv_cache_config`` (vllm/v1/core/kv_cache_utils.py) with
``SlidingWindowSpec.max_memory_usage_bytes`` (vllm/v1/kv_cache_interface.py): a sliding group holds
``min(ceil(L / b), ceil((W - 1 + token_budget) / b) + 1)`` blocks (the prefill chunk counts), a full one
``ceil(L / b)``. Static (``max_len = L``): one reservation per request, every layer ``L`` tokens without,
:func:`sim.memory.hybrid_sizing.static_reserved_tokens` per group with ``window=reserve``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from anywhere, as bench/readme_hashes.py

from sim.setup.config import SimConfig
from sim.frontend.policy_spec import parse_policy


def _paged_units(config: SimConfig, tokens: int) -> int:
    block, total = config.tokens_per_page, 0
    for group, units in zip(config.layer_groups, config.group_units):
        if group.kind == "sliding":
            pages = min(-(-tokens // block), -(-(group.window_tokens - 1 + config.token_budget) // block) + 1)
        elif group.grows:
            pages = group.max_pages_held(tokens, block)
        else:
            pages = 1
        total += units * pages
    return total


def capacity(model: str, policy: str, tokens: int) -> tuple[int, int]:
    """(requests without, requests with window-aware allocation) of ``tokens`` tokens each."""
    if policy == "static":
        off = SimConfig(model=model, **parse_policy(f"static:max_len={tokens}"), allow_long_context=True)
        on = SimConfig(model=model, **parse_policy(f"static:max_len={tokens},window=reserve"), allow_long_context=True)
        return off.pool_page_groups, on.pool_page_groups
    off = SimConfig(model=model, **parse_policy(policy), allow_long_context=True)
    window = "free" if policy == "paged" else "unmap"
    on = SimConfig(model=model, **parse_policy(f"{policy}:window={window}"), allow_long_context=True)
    without = off.pool_page_groups // -(-tokens // off.tokens_per_page)
    units = _paged_units(on, tokens) if policy == "paged" else on.hybrid.units_per_request(tokens, on.tokens_per_page)
    return without, on.pool_page_groups // units


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/hybrid_capacity.py", description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--models", nargs="+", default=["models/gpt-oss-20b.json", "models/gemma-3-12b.json"])
    args = parser.parse_args(argv)
    print("| model | policy | tokens per request | requests, every layer full | requests, window-aware | ratio |")
    print("|---|---|---|---|---|---|")
    for model in args.models:
        for policy in ("vattention", "paged", "static"):
            for tokens in args.tokens:
                without, with_window = capacity(model, policy, tokens)
                print(f"| {model} | {policy} | {tokens:,} | {without:,} | {with_window:,} | {with_window / without:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
