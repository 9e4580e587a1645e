"""``python -m hwbackend.replay.colocate``: several models served on one GPU, their KV pages from one physical
pool through real VMM calls (issue 34 item 4), the hardware counterpart of ``kvsim colocate``.

The same tenants, options and sharing as ``kvsim colocate`` (:func:`analysis.colocate.build_tenants`,
:func:`sim.cluster.colocate.tenant_configs`): every tenant is a :class:`hwbackend.replay.loop.ReplayLoop` of its own
model (a real decoder forward, weights resident on the GPU), trace, scheduler and vAttention policy; one driver
(one CUDA context) serves them all::

    tenant A: ReplayLoop ─ Executor(SharedPoolPolicy A) ─ TenantKVCache A (A's 2N' reservations) ─┐
    tenant B: ReplayLoop ─ Executor(SharedPoolPolicy B) ─ TenantKVCache B (B's 2N' reservations) ─┤
                                                              one SharedHandlePool (physical pages)

* **memory**, ``elastic``: the tenants' policies draw from one :class:`sim.memory.shared_pool.SharedPagePool`
  (:func:`sim.cluster.colocate.elastic_pool`, the simulator's own), and their caches take the physical handles
  from one :class:`hwbackend.vmm.shared_pool.SharedHandlePool` of as many pages: a page one tenant unmapped is
  mapped into the other's range (cuMemUnmap there, cuMemMap + cuMemSetAccess here, no cuMemCreate). The
  executors share one lock, so no mapper thread changes the pool while another tenant's policy reads it. An idle
  tenant's mapped-but-unused pages are trimmed after ``trim_delay_us`` (:meth:`Executor.reclaim_idle`, kvcached's
  ``trim()``). ``static``: each tenant has a pool of its own share.
* **compute**: iterations are serialised, first come first served, as the simulator's ``compute=serial``: the
  tenant whose iteration became ready first runs next (after an iteration a tenant with work is ready again at its
  end; an idle tenant becomes ready at the arrival of its first waiting request). Host work (scheduling, the
  foreground mapping step) is serialised too: one process drives both tenants, where co-located engines are
  separate processes whose host work overlaps the other's GPU time (docs/colocate.md says what this changes).
  The background mappers (asynchronous mapping, the default) run on their own threads, as in one engine.
* not on hardware (refused): sleep / wake, ``compute=isolated``, tensor parallelism, prefix caching, window-aware
  allocation.

Run directory, the layout of ``kvsim colocate`` so that ``kvsim validate --hw-run DIR`` can simulate the same
tenants: ``summary.json`` (``backend: hardware``, ``sharing``, ``pool_bytes``, ``tenants: [...]`` with each
tenant's summary, ``moved_in_pages`` on the hardware pool, peak and mean mapped KV, GPU wait), ``memory.parquet``
(mapped KV per tenant after every iteration), ``vmm_calls.json`` (per-call latency percentiles of the shared
driver) and ``tenants/<name>/`` (an ordinary hardware run directory, :func:`hwbackend.replay.cli.write_hw_run`).

Example (the H200 run of ``docs/validation/colocate/``)::

    python -m hwbackend.replay.colocate --sharing elastic --memory-util 0.3 --out $OUT/colocate \\
      --tenant model=llama-3.1-8b,trace=../shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv,num-requests=300,rate-scale=4 \\
      --tenant model=qwen2.5-7b,trace=../shared/traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv,num-requests=300,rate-scale=4
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from hwbackend.replay.loop import ReplayLoop, ReplayOutput, unreplayed_field
from sim.setup.catalog import ModelSpec
from sim.results.json_text import nan_for_null, strict_json_text


def cpu_shape(spec: ModelSpec) -> ModelSpec:
    """A CPU-sized decoder with ``spec``'s KV head shape (2 layers): its page holds as many tokens as the
    model's, so the tenant's policy and its emulated cache agree (:func:`hwbackend.replay.kv.layout_for`)."""
    return ModelSpec(name=f"tiny-{spec.name}", num_layers=2, hidden_size=256, num_q_heads=spec.num_kv_heads,
                     num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, ffn_size=512, vocab_size=1000,
                     max_context_tokens=spec.max_context_tokens)


@dataclass
class ColocatedReplay:
    """What a co-located replay produced.

    Attributes:
        names: the tenants' names; ``outputs``: each one's :class:`ReplayOutput`; ``metas``: each one's run
            metadata (as :func:`hwbackend.replay.cli.replay`'s).
        stats: per tenant: ``moved_in_pages`` (hardware handles it took that another tenant had returned),
            ``policy_moved_in_pages`` (the same count on the policies' pool), ``peak_kv_bytes``, ``mean_kv_bytes``,
            ``gpu_wait_s``, ``trim_unmap_page_groups``.
        memory: mapped KV per tenant after every iteration (``time_s``, ``<name>_bytes``).
        vmm_calls: per-call latency percentiles of the shared driver (us).
        pool_bytes: the KV pool after every tenant's weights; ``wall_s``: the serving loop's wall time.
        extra: elastic sharing: the hardware pool's size and free handles once every cache closed.
    """

    names: list[str]
    outputs: list[ReplayOutput]
    metas: list[dict]
    stats: list[dict]
    memory: pd.DataFrame
    vmm_calls: dict
    pool_bytes: int
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)


def check_replayable(tenants: list, sharing: Any) -> tuple[list, Any]:
    """Refuse what the co-located replay does not implement (one line naming the tenant and key); returns the
    tenants' configurations (:func:`sim.cluster.colocate.tenant_configs`) and, for elastic sharing, the policies'
    page pool (:func:`sim.cluster.colocate.elastic_pool`, else None).

    Raises:
        ValueError: a sleeping tenant, ``compute=isolated``, tensor parallelism, a policy or preemption mode the
            single-model replay refuses (:class:`ReplayLoop`), prefix caching or window-aware allocation (the
            replay's loop implements neither); ``ConfigError``: the tenants' configurations and pool
            (:func:`sim.cluster.colocate.tenant_configs`, ``kv_pool_bytes``, ``elastic_pool``), checked here so that
            a run that cannot start is refused before any model is built.
    """
    from sim.cluster.colocate import elastic_pool, kv_pool_bytes, tenant_configs

    if sharing.compute != "serial":
        raise ValueError(f"--compute {sharing.compute}: the hardware replay serialises the tenants' iterations "
                         "on one GPU (serial) only")
    for tenant in tenants:
        c = tenant.config
        if tenant.sleep_after_us is not None:
            raise ValueError(f"--tenant {tenant.name}: sleep-after: sleep / wake is simulated only, not replayed")
        if c.tp != 1:
            raise ValueError(f"--tp {c.tp}: the co-located replay runs every tenant on one GPU (tp 1)")
        problem = unreplayed_field(c)
        if problem:
            raise ValueError(f"--tenant {tenant.name}: {problem}")
    kv_pool_bytes(tenants)
    configs = tenant_configs(tenants, sharing)
    return configs, (elastic_pool(tenants, configs) if sharing.mode == "elastic" else None)


def serve(loops: list[ReplayLoop], trim_delay_us: float | None, sleep: Callable[[float], None] = time.sleep,
          on_iteration: Callable[[int], None] | None = None) -> tuple[list[float], list[int]]:
    """Drive the tenants' loops on one clock until every request is done (module docstring: first come first
    served at iteration granularity; idle tenants trimmed after ``trim_delay_us``, None: never).

    Returns:
        ``(gpu_wait_us, trim_unmap_page_groups)`` per tenant: the time its ready iterations waited for another
        tenant's, and the page groups its idle trims unmapped.
    """
    n = len(loops)
    t0_ns = time.perf_counter_ns()
    for loop in loops:
        loop.begin(t0_ns)
    ready_since: list[float | None] = [None] * n
    last_busy_us, trimmed = [0.0] * n, [True] * n     # nothing mapped before a tenant's first iteration
    wait_us, trim_groups = [0.0] * n, [0] * n
    clock = loops[0]
    while not all(loop.done for loop in loops):
        now_us = clock.now_us()
        for i, loop in enumerate(loops):
            if not loop.done and loop.accept_arrivals():
                if ready_since[i] is None:      # idle until now: ready since its first waiting request arrived
                    ready_since[i] = min(r.arrival_at_us for r in loop.waiting) if loop.waiting else now_us
            elif trim_delay_us is not None and not trimmed[i] and now_us - last_busy_us[i] >= trim_delay_us:
                trim_groups[i] += loop.executor.reclaim_idle()
                trimmed[i] = True
        ready = [i for i in range(n) if ready_since[i] is not None and not loops[i].done]
        if not ready:
            pending_us = [loop.next_arrival_us for loop in loops if not loop.done]
            if not pending_us:      # the last requests were rejected on arrival (they can never fit the pool)
                break
            wake_us = min(pending_us)
            if trim_delay_us is not None:
                wake_us = min([wake_us, *(last_busy_us[i] + trim_delay_us for i in range(n) if not trimmed[i])])
            sleep(max(0.0, wake_us - clock.now_us()) * 1e-6)
            continue
        i = min(ready, key=lambda j: (ready_since[j], j))
        loop = loops[i]
        start_us = loop.now_us()
        wait_us[i] += max(0.0, start_us - ready_since[i])
        ran = loop.serve_pass(start_us)     # False: nothing schedulable; admission unblocked (drain / reject)
        end_us = loop.now_us()
        last_busy_us[i], trimmed[i] = end_us, False
        ready_since[i] = end_us if (loop.running or loop.waiting) else None   # queued again behind the others
        if ran and on_iteration is not None:
            on_iteration(i)
    return wait_us, trim_groups


def replay_colocated(tenants: list, sharing: Any, device: str = "cuda:0", compute: str = "engine",
                     attention: str = "auto", warmup_s: float = 5.0, cuda_graphs: bool = True,
                     sleep: Callable[[float], None] = time.sleep, tiny_models: bool = False) -> ColocatedReplay:
    """Serve ``tenants`` (:class:`sim.cluster.colocate.Tenant`) on one GPU under ``sharing`` (module docstring).

    ``device``: ``cuda:N`` (real VMM and compute, each tenant's full model shape) or ``cpu`` (emulated driver,
    :func:`cpu_shape` decoders); ``tiny_models``: :func:`cpu_shape` decoders on CUDA too (the GPU test: real VMM
    calls and kernels in seconds). The other arguments as :func:`hwbackend.replay.cli.replay`.

    Raises:
        ValueError: what :func:`check_replayable` refuses; ``ConfigError`` as :func:`sim.cluster.colocate.tenant_configs`.
        VmmError: a driver call the GPU refuses.
    """
    from hwbackend.calibration.colocate_handover import vmm_call_percentiles
    from hwbackend.replay.cli import capture_graphs, prepare_model
    from hwbackend.replay.kv import open_tenant_kv, pin_base_pages
    from hwbackend.vmm.shared_pool import SharedHandlePool
    from sim.cluster.colocate import held_page_groups, kv_pool_bytes
    from sim.memory import build_policy
    from sim.memory.shared_pool import SharedPoolPolicy

    configs, sim_pool = check_replayable(tenants, sharing)
    elastic = sim_pool is not None
    pool_bytes = kv_pool_bytes(tenants)
    shapes = [cpu_shape(c.model_spec) if device == "cpu" or tiny_models else c.model_spec.per_worker(1)
              for c in configs]
    page = configs[0].page_size_bytes
    if device == "cpu":
        from hwbackend.vmm.emulated import EmulatedVmmDriver

        driver = EmulatedVmmDriver(page, capacity_bytes=(pool_bytes // page + 1) * page, va_limit_bytes=1 << 50)
    else:
        import torch

        from hwbackend.vmm.driver import CudaVmmDriver

        torch.cuda.init()        # torch's primary context first; the driver retains the same one
        driver = CudaVmmDriver(int(device.partition(":")[2] or 0))
    lock = threading.Condition()
    kvs, loops, metas, hw_pool = [], [], [], None
    try:
        if elastic:
            ceilings = [c.pool_page_groups * s.num_sub_tensors() for c, s in zip(configs, shapes)]
            hw_pool = SharedHandlePool(driver, page, sim_pool.pool_pages, ceilings).open()
        for index, (tenant, config, shape) in enumerate(zip(tenants, configs, shapes)):
            model, extra = prepare_model(shape, device, config.seed, attention, warmup_s, compute)
            policy = build_policy(config)
            if elastic:
                policy = SharedPoolPolicy(policy.config, sim_pool, index)
            kv = open_tenant_kv(config, shape, device, driver, policy, hw_pool, index, lock)
            kvs.append(kv)
            if compute == "engine" and device != "cpu":     # Triton checks the tensors' base pointers
                extra["anchor_slot"] = pin_base_pages(kv)
            capture_graphs(model, kv, config.max_batch_slots, cuda_graphs, extra)
            loops.append(ReplayLoop(config, tenant.trace, model, kv, sleep=sleep))
            metas.append({"backend": "hardware", "device": device, "compute": compute, "tenant": tenant.name,
                          "kv_share_bytes": config.kv_budget_bytes, "sharing": sharing.mode,
                          "transformer_shape": shape.decoder_shape(), **extra})
        samples: list[tuple] = []
        group_bytes = [c.page_group_bytes for c in configs]

        def held_bytes() -> list[int]:
            return [held_page_groups(loop.policy) * b for loop, b in zip(loops, group_bytes)]

        def sample(_: int) -> None:
            samples.append((clock_loop.now_us() * 1e-6, *held_bytes()))

        clock_loop = loops[0]
        gc.collect()
        gc.freeze()
        gc.disable()  # a full collection mid-run costs ~50 ms (docs/hwbackend.md)
        started = time.perf_counter()
        wait_us, trim_groups = serve(loops, sharing.trim_delay_us if elastic else None, sleep, sample)
        wall_s = time.perf_counter() - started
        outputs = [loop.output() for loop in loops]
    finally:
        gc.enable()
        for kv in kvs:
            kv.close()
        pool_check = {}
        if hw_pool is not None:     # every tenant's cache closed: every handle must be back in the pool
            pool_check = {"hw_pool_pages": hw_pool.num_pages, "hw_pool_free_pages_at_end": hw_pool.free_pages,
                          "hw_pool_conservation_error": hw_pool.conservation_error()}
            hw_pool.close()
    names = [t.name for t in tenants]
    memory = pd.DataFrame(samples, columns=["time_s", *[f"{n}_bytes" for n in names]])
    stats = []
    for i, name in enumerate(names):
        column = memory[f"{name}_bytes"]
        stats.append({"moved_in_pages": int(hw_pool.moved_in_pages[i]) if hw_pool else 0,
                      "policy_moved_in_pages": int(sim_pool.moved_in_pages[i]) if sim_pool else 0,
                      "peak_kv_bytes": int(sim_pool.peak_groups[i] * group_bytes[i]) if sim_pool
                      else int(column.max()) if len(column) else 0,
                      "mean_kv_bytes": float(column.mean()) if len(column) else 0.0,
                      "gpu_wait_s": wait_us[i] * 1e-6, "trim_unmap_page_groups": trim_groups[i]})
        stats[-1]["moved_in_bytes"] = stats[-1]["moved_in_pages"] * page
    calls = vmm_call_percentiles(driver)
    driver.close()
    for meta in metas:
        meta["replay_wall_s"] = wall_s
    return ColocatedReplay(names, outputs, metas, stats, memory, calls, pool_bytes, wall_s, pool_check)


def write_colocated_replay(run: ColocatedReplay, tenants: list, sharing: Any, out: Path, command: str = "") -> Path:
    """Write the run directory (module docstring) into ``out``; returns it."""
    from hwbackend.replay.cli import write_hw_run

    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for tenant, output, meta, stats in zip(tenants, run.outputs, run.metas, run.stats):
        meta = {**meta, "trace_source": tenant.trace.attrs.get("source", "in-memory table"), "command": command}
        target = write_hw_run(output, tenant.config, meta, out / "tenants" / tenant.name, force=True)
        summary = nan_for_null(json.loads((target / "summary.json").read_text()))
        rows.append({"tenant": tenant.name, "model": tenant.config.model, "dir": f"tenants/{tenant.name}",
                     "floor_frac": tenant.floor_frac, "ceiling_frac": tenant.ceiling_frac, **summary, **stats})
    run.memory.to_parquet(out / "memory.parquet", index=False)
    (out / "vmm_calls.json").write_text(json.dumps(run.vmm_calls, indent=1) + "\n")
    summary = {"backend": "hardware", "command": command, "replay_wall_s": run.wall_s,
               "sharing": {"mode": sharing.mode, "split": sharing.split, "trim_delay_us": sharing.trim_delay_us,
                           "compute": sharing.compute},
               "pool_bytes": run.pool_bytes, **run.extra, "tenants": rows}
    (out / "summary.json").write_text(strict_json_text(summary, indent=2, default=str) + "\n")
    return out


def build_parser() -> argparse.ArgumentParser:
    from analysis.colocate import add_colocate_args

    parser = argparse.ArgumentParser(prog="python -m hwbackend.replay.colocate", description=__doc__.splitlines()[0])
    add_colocate_args(parser)
    parser.add_argument("--sharing", default="elastic", help="static[:split=a/b/...] | elastic[:trim-delay=1s] "
                                                             "(default: elastic)")
    parser.add_argument("--out", required=True, help="run directory to write")
    parser.add_argument("--force", action="store_true", help="overwrite the run files in --out")
    parser.add_argument("--device", default="cuda:0", help="cuda:N (real VMM) or cpu (emulated driver, tiny models)")
    parser.add_argument("--compute-kernels", dest="kernels", choices=("engine", "harness"), default="engine",
                        help="decoder kernels, as the replay's --compute (default: engine)")
    parser.add_argument("--attention", default="auto", choices=("auto", "varlen", "gather", "reference"))
    parser.add_argument("--no-cuda-graphs", action="store_true", help="run decode iterations eagerly too")
    parser.add_argument("--warmup-s", type=float, default=5.0,
                        help="seconds of eager warm-up per model before the clock starts (CUDA); default 5")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit 0, or 2 with one line for an option, trace, configuration or machine that cannot be used."""
    from analysis.colocate import build_tenants, sharing_of
    from hwbackend.replay.cli import preflight
    from sim.frontend.flags import flag_message, parser_flags

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.sharing == "both":
        print("replay: error: --sharing both: replay one sharing per run (static or elastic)", file=sys.stderr)
        return 2
    try:
        tenants = build_tenants(args)
        if not tenants:
            raise ValueError("no --tenant given: name at least one (model=M,trace=T)")
        sharing = sharing_of(args, len(tenants))
        check_replayable(tenants, sharing)
    except (ValueError, OSError) as exc:    # the core's fields written as their flags, as kvsim colocate does
        print(f"replay: error: {flag_message(exc, parser_flags(parser))}", file=sys.stderr)
        return 2
    problem = preflight(args.device, args.out, args.force, args.warmup_s)
    if problem:
        print(f"replay: error: {problem}", file=sys.stderr)
        return 2
    command = " ".join(["python -m hwbackend.replay.colocate", *(sys.argv[1:] if argv is None else argv)])
    try:
        run = replay_colocated(tenants, sharing, args.device, args.kernels, args.attention, args.warmup_s,
                               not args.no_cuda_graphs)
    except MemoryError as exc:
        print(f"replay: error: the models or KV pool do not fit this machine's memory ({exc})", file=sys.stderr)
        return 2
    out = write_colocated_replay(run, tenants, sharing, Path(args.out), command)
    print(f"wrote {out}: {len(tenants)} tenants, {sharing.mode} sharing, KV pool {run.pool_bytes / 2**30:.3g} GiB, "
          f"wall {run.wall_s:.1f} s")
    for name, output, stats in zip(run.names, run.outputs, run.stats):
        requests = output.requests_frame()
        finished = requests[requests["status"] == "finished"]
        ttft = f"{np.nanpercentile(finished['ttft_us'], 50) / 1e3:.1f} ms" if len(finished) else "-"
        rejected = int((requests["status"] == "rejected").sum())
        print(f"  {name}: {len(finished)}/{len(requests)} finished ({rejected} rejected), TTFT p50 {ttft}, "
              f"moved in {stats['moved_in_pages']} pages, GPU wait {stats['gpu_wait_s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
