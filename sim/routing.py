"""Multi-replica routing: one trace over R replicas, each with its own simulator and memory manager.

* **round-robin**: request i (in arrival order) goes to replica ``i mod R``; the trace is split, each
  replica simulated alone, the per-request records merged. Exact.
* **least-outstanding**: each arrival goes to the replica with the fewest outstanding requests (arrived,
  not finished) at its arrival time; ties go to the replica with fewer requests so far, then the lower
  index. Exact: the replicas are co-simulated in one SimPy environment and a router process submits each
  request at its arrival time (:meth:`sim.engine.Simulator.submit`), reading every replica's state then.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from sim import runner
import simpy

from analysis.results import RunResult, build_result, summarize
from sim.config import SimConfig
from sim.engine import ARRIVAL_TICK_US, ARRIVAL_TICKS_PER_S, Simulator

ROUTERS = ("round-robin", "least-outstanding")
# summary keys that add up over replicas (the rest is recomputed from the merged records)
_ADDITIVE_KEYS = ("map_page_groups", "unmap_page_groups", "map_calls", "unmap_calls", "swap_out_bytes",
                  "swap_in_bytes", "swap_total_ms", "pool_bytes")


@dataclass
class RoutedRun:
    """One routed simulation.

    Attributes:
        routing: ``round-robin`` or ``least-outstanding``.
        assignment: replica index per request, in trace row order.
        requests: merged per-request table (times in us on the trace's clock) with a ``replica`` column.
        summary: the summary of the merged records (rates are totals over the replicas).
        replicas: each replica's own :class:`RunResult` (None for a replica that received no request).
    """

    routing: str
    assignment: np.ndarray
    requests: pd.DataFrame
    summary: dict
    replicas: list = field(default_factory=list, repr=False)


def round_robin(num_requests: int, num_replicas: int) -> np.ndarray:
    """Replica index per request: ``0, 1, ..., R-1, 0, 1, ...``."""
    return np.arange(num_requests, dtype=np.int64) % num_replicas


def split_trace(trace: pd.DataFrame, assignment: np.ndarray, num_replicas: int) -> list[pd.DataFrame]:
    """Each replica's rows, keeping the global ``request_id`` and the original ``arrival_s`` (one clock)."""
    parts = []
    for replica in range(num_replicas):
        part = trace[assignment == replica].reset_index(drop=True)
        part.attrs = {**trace.attrs, "source": f"{trace.attrs.get('source', 'trace')} | replica {replica}"}
        parts.append(part)
    return parts


def simulate_replicas(config: SimConfig, trace: pd.DataFrame, assignment: np.ndarray, num_replicas: int,
                      profile_path: str | None = None) -> list[RunResult | None]:
    """Simulate each replica's share of the trace (replica r uses seed ``config.seed + r``)."""
    results = []
    for replica, part in enumerate(split_trace(trace, assignment, num_replicas)):
        replica_config = replace(config, seed=config.seed + replica)
        results.append(runner.run_simulation(replica_config, part, profile_path) if len(part) else None)
    return results


def merge_replicas(results: list[RunResult | None], config: SimConfig) -> tuple[pd.DataFrame, dict]:
    """The merged per-request table (with ``replica``) and its summary (additive counters summed)."""
    present = [(r, result) for r, result in enumerate(results) if result is not None]
    requests = pd.concat([res.requests.assign(replica=r) for r, res in present], ignore_index=True)
    requests = requests.sort_values("request_id", kind="stable", ignore_index=True)
    iterations = pd.concat([res.iterations for _, res in present], ignore_index=True)
    zero = {"sync_map_page_groups": 0, "sync_unmap_page_groups": 0, "bg_map_page_groups": 0,
            "bg_unmap_page_groups": 0, "pool_page_groups": 0}
    summary = summarize(requests, iterations, zero, config.to_dict())
    for key in _ADDITIVE_KEYS:
        summary[key] = sum(res.summary.get(key, 0) for _, res in present)
    maps = summary["map_page_groups"]
    background = sum(res.summary["map_page_groups"] * np.nan_to_num(res.summary["background_map_share"])
                     for _, res in present)
    summary.update(background_map_share=background / maps if maps else float("nan"), replicas=len(results))
    return requests, summary


def co_simulate_least_outstanding(config: SimConfig, trace: pd.DataFrame, num_replicas: int,
                                  profile_path: str | None = None) -> tuple[np.ndarray, list[RunResult | None]]:
    """Least-outstanding routing, co-simulated: one environment, R open-arrival simulators (replica r with
    seed ``config.seed + r``) and a router process that submits each request at its arrival time.

    Returns:
        ``(assignment, results)``: replica index per request and each replica's :class:`RunResult`.
    """
    env = simpy.Environment()
    empty = trace.iloc[:0]
    replicas = []
    for replica in range(num_replicas):
        replica_config = runner.profile_config_overrides(replace(config, seed=config.seed + replica), profile_path)
        vmm, compute = runner.load_models(replica_config, profile_path)
        simulator = Simulator(replica_config, empty, vmm=vmm, compute=compute, env=env)
        simulator.open_arrivals()
        simulator.start()
        replicas.append((replica_config, vmm, simulator))
    assignment = np.empty(len(trace), dtype=np.int64)
    env.process(_router(env, trace, [s for _, _, s in replicas], assignment))
    env.run()
    results = []
    for replica, (replica_config, vmm, simulator) in enumerate(replicas):
        if not simulator.requests:
            results.append(None)
            continue
        meta = {**replica_config.to_dict(), "trace_source": f"{trace.attrs.get('source', 'trace')} | replica {replica}",
                "vmm_latency_source": vmm.source}
        results.append(build_result(simulator.output(), meta))
    return assignment, results


def _router(env: simpy.Environment, trace: pd.DataFrame, simulators: list, assignment: np.ndarray):
    arrivals_us = np.round(trace["arrival_s"].to_numpy(dtype=float) * ARRIVAL_TICKS_PER_S) * ARRIVAL_TICK_US
    hash_ids = trace["hash_ids"] if "hash_ids" in trace.columns else [None] * len(trace)
    assigned = [0] * len(simulators)
    rows = zip(arrivals_us, trace["request_id"], trace["prompt_tokens"], trace["output_tokens"], hash_ids)
    for index, (arrival_us, request_id, prompt, output, ids) in enumerate(rows):
        for simulator in simulators:      # no replica fast-forwards past an arrival it might receive
            simulator.arrival_horizon_us = arrival_us
        if arrival_us > env.now:
            yield env.timeout(arrival_us - env.now)
        choice = min(range(len(simulators)), key=lambda r: (simulators[r].outstanding, assigned[r], r))
        simulators[choice].submit(int(request_id), int(prompt), int(output), ids)
        assigned[choice] += 1
        assignment[index] = choice
    for simulator in simulators:
        simulator.arrival_horizon_us = float("inf")
        simulator.close()


def run_routed(config: SimConfig, trace: pd.DataFrame, num_replicas: int, routing: str = "round-robin",
               profile_path: str | None = None) -> RoutedRun:
    """Route ``trace`` over ``num_replicas`` replicas of ``config`` and simulate them.

    Args:
        config: every replica's configuration.
        trace: canonical table (``request_id`` = row number, as every loader returns).
        num_replicas: R >= 1.
        routing: one of :data:`ROUTERS`.
        profile_path: calibration profile for VMM latencies.

    Raises:
        ValueError: for an unknown routing, R < 1, or request ids that are not row numbers.
    """
    if routing not in ROUTERS:
        raise ValueError(f"--routing {routing!r}: choose one of {', '.join(ROUTERS)}")
    if num_replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {num_replicas}")
    if not np.array_equal(trace["request_id"].to_numpy(), np.arange(len(trace))):
        raise ValueError("routing needs request ids 0..n-1 in arrival order (renumber the trace)")
    if routing == "least-outstanding":
        assignment, results = co_simulate_least_outstanding(config, trace, num_replicas, profile_path)
    else:
        assignment = round_robin(len(trace), num_replicas)
        results = simulate_replicas(config, trace, assignment, num_replicas, profile_path)
    requests, summary = merge_replicas(results, config)
    return RoutedRun(routing, assignment, requests, summary, results)
