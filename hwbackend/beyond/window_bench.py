"""Micro-benchmark: the cost per decode step of sliding-window page traffic through the executor (issue 33, item 5).

``python -m hwbackend.beyond.window_bench --out window.json [--model models/gpt-oss-20b.json] [--emulated]``

For each variant (``vattention:window=off|unmap|recycle``, synchronous mapping, 2 MiB pages) ``--slots`` requests
are admitted at ``--prompt`` tokens and decoded ``--steps`` tokens, one token per request per step; the executor's
:meth:`~hwbackend.vmm.executor.Executor.step` is called for the slots whose target passes their mapped pages, as
``sim.core.engine`` does, with real cuMemMap / cuMemUnmap / cuMemSetAccess calls (``CudaVmmDriver``) or the strict
emulated driver (``--emulated``, for CPU-only checks: times are then the Python overhead only). Written per
variant: wall time of every ``step`` call (us), decode steps, window crossings, page groups mapped / unmapped, and
``us_per_decode_step`` = total foreground step time / decode steps; plus the simulator's modelled cost of the
same plans (``sim.core.engine.VmmCost`` on the built-in H200 latency profile) for comparison.

No GPU kernel runs: the benchmark isolates the VMM calls a window crossing makes (the iteration's compute is
the same in every variant).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from hwbackend.vmm.executor import Executor
from hwbackend.vmm.grouped import GroupedKVCache
from sim.setup.config import ConfigError, SimConfig
from sim.timing.latency import VmmLatencyModel
from sim.memory import build_policy
from sim.frontend.policy_spec import parse_policy

VARIANTS = ("off", "unmap", "recycle")


def bench_config(model: str, window: str, slots: int, context_tokens: int, memory_util: float) -> SimConfig:
    """The benchmark's configuration: synchronous vAttention, 2 MiB pages, no eager or deferred pages."""
    return SimConfig(model=model, **parse_policy(f"vattention:window={window},sync,deferred=off"),
                     max_batch_slots=slots, max_context_tokens=context_tokens, memory_util_frac=memory_util,
                     eager_page_groups=0, eager_idle_slots=0, eager_lookahead_steps=0, low_watermark_frac=0.0)


def run_variant(driver, config: SimConfig, prompt_tokens: int, steps: int) -> dict:
    """Admit ``config.max_batch_slots`` requests at ``prompt_tokens`` and decode ``steps`` tokens each; the
    foreground step times (us) and the plans' modelled cost (us) on the built-in H200 profile."""
    from sim.core.engine import VmmCost
    hybrid = config.hybrid_alloc
    if hybrid:
        cache = GroupedKVCache.for_config(driver, config)
    else:
        from hwbackend.vmm.kvcache import KVCache, KVCacheLayout
        cache = KVCache(driver, KVCacheLayout.for_model(config.model_spec, config.max_batch_slots,
                                                        config.slot_max_tokens, config.page_size_bytes, config.tp),
                        config.pool_page_groups)
    cost = VmmCost(VmmLatencyModel.builtin(), config, np.random.default_rng(0))
    per_page = config.tokens_per_page
    with cache:
        executor = Executor(build_policy(config), cache, background=False)
        policy = executor.policy
        step_us, modelled_us, tokens = [], 0.0, {}
        original_step = policy.step

        def costed_step(targets):
            plan = original_step(targets)
            nonlocal modelled_us
            if plan is not None:
                modelled_us += cost.plan_us(plan)
            return plan
        policy.step = costed_step
        for _ in range(config.max_batch_slots):
            slot = executor.alloc_slot(prompt_tokens)
            if hybrid:
                policy.computed[slot] = 0
            executor.step({slot: prompt_tokens})
            tokens[slot] = prompt_tokens
        admitted_modelled_us, modelled_us = modelled_us, 0.0
        crossings_before = getattr(policy, "window_crossings", 0)
        for _ in range(steps):
            short = {s: t + 1 for s, t in tokens.items() if t + 1 > policy.mapped[s] * per_page}
            if short:
                if hybrid:
                    for slot in short:
                        policy.computed[slot] = tokens[slot]
                start_ns = time.perf_counter_ns()
                if not executor.step(short):
                    raise RuntimeError("the pool cannot hold the benchmark's requests: lower --slots")
                step_us.append((time.perf_counter_ns() - start_ns) * 1e-3)
            for slot in tokens:
                tokens[slot] += 1
    return {"window": config.window_alloc, "model": config.model, "slots": config.max_batch_slots,
            "prompt_tokens": prompt_tokens, "decode_steps": steps, "tokens_per_page": per_page,
            "page_size_bytes": config.page_size_bytes, "stepped_calls": len(step_us),
            "step_us": step_us, "us_per_decode_step": sum(step_us) / steps,
            "window_crossings": getattr(policy, "window_crossings", 0) - crossings_before,
            "modelled_us_per_decode_step": modelled_us / steps, "modelled_admission_us": admitted_modelled_us}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hwbackend.beyond.window_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--model", default="models/gpt-oss-20b.json")
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=1024, help="prompt tokens per request")
    parser.add_argument("--steps", type=int, default=8192, help="decode steps")
    parser.add_argument("--context", type=int, default=16384, help="slot length L_max (tokens)")
    parser.add_argument("--memory-util", type=float, default=0.9)
    parser.add_argument("--emulated", action="store_true", help="the emulated driver (CPU only)")
    args = parser.parse_args(argv)
    if args.prompt + args.steps > args.context:
        print(f"window_bench: error: --prompt + --steps ({args.prompt + args.steps}) exceed --context "
              f"{args.context}", file=sys.stderr)
        return 2
    try:
        if args.emulated:
            from hwbackend.vmm.emulated import EmulatedVmmDriver
            driver = EmulatedVmmDriver(capacity_bytes=1 << 42)
        else:
            from hwbackend.vmm.driver import CudaVmmDriver
            driver = CudaVmmDriver()
        results = [run_variant(driver, bench_config(args.model, window, args.slots, args.context, args.memory_util),
                               args.prompt, args.steps) for window in VARIANTS]
    except (ConfigError, RuntimeError) as exc:
        print(f"window_bench: error: {exc}", file=sys.stderr)
        return 1
    Path(args.out).write_text(json.dumps({"driver": "emulated" if args.emulated else "cuda", "variants": results},
                                         indent=1) + "\n")
    for r in results:
        print(f"window={r['window']:8s} {r['us_per_decode_step']:9.2f} us/decode step measured, "
              f"{r['modelled_us_per_decode_step']:9.2f} modelled, {r['window_crossings']} crossings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
