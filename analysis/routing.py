"""Multi-replica routing: one trace over R replicas, each with its own simulator and memory manager.

* **round-robin**: request i (in arrival order) goes to replica ``i mod R``; the trace is split, each
  replica simulated alone, the per-request records merged. Exact.
* **least-outstanding**: each arrival goes to the replica with the fewest outstanding requests (arrived,
  not finished) at its arrival time; ties go to the replica with fewer requests so far, then the lower
  index. The simulator replays a whole trace and cannot take requests pushed over time, so the routing
  is found by a *causal fixed-point iteration* instead of a co-simulation::

      assignment_0 = round-robin
      repeat: simulate every replica under assignment_k -> completion times c_k
              assignment_k+1 = least-outstanding routing replayed with the completion times c_k
      until assignment_k+1 == assignment_k (or max_passes)

  The simulator is causal (a replica's state at time t depends only on requests arriving by t), so if
  assignment_k+1 and assignment_k agree on the first m arrivals, those m decisions are exactly what a
  co-simulation would make; each pass extends that exact prefix by at least one arrival, and at the fixed
  point the routing *is* the co-simulated one. :attr:`RoutedRun.exact_share` reports the verified prefix
  (1.0 = exact) when the pass limit stops the iteration first.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from analysis import runner
from analysis.results import RunResult, summarize
from sim.config import SimConfig
from sim.engine import ARRIVAL_TICK_US, ARRIVAL_TICKS_PER_S

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
        passes: simulation passes run (1 for round-robin).
        exact_share: share of arrivals whose routing decision is verified exact (see module docstring).
    """

    routing: str
    assignment: np.ndarray
    requests: pd.DataFrame
    summary: dict
    replicas: list = field(default_factory=list, repr=False)
    passes: int = 1
    exact_share: float = 1.0


def round_robin(num_requests: int, num_replicas: int) -> np.ndarray:
    """Replica index per request: ``0, 1, ..., R-1, 0, 1, ...``."""
    return np.arange(num_requests, dtype=np.int64) % num_replicas


def least_outstanding(arrival_us: np.ndarray, completion_us: np.ndarray, num_replicas: int) -> np.ndarray:
    """Least-outstanding routing replayed with known completion times.

    Args:
        arrival_us: arrival times in arrival order (us).
        completion_us: completion time of each request were it routed as before (us; NaN = rejected, never
            outstanding). A request completing exactly at an arrival no longer counts for that arrival.
        num_replicas: R.

    Returns:
        Replica index per request.
    """
    heaps: list[list[float]] = [[] for _ in range(num_replicas)]
    assigned = np.zeros(num_replicas, dtype=np.int64)
    out = np.empty(len(arrival_us), dtype=np.int64)
    for i, (now_us, done_us) in enumerate(zip(arrival_us, completion_us)):
        for heap in heaps:
            while heap and heap[0] <= now_us:
                heapq.heappop(heap)
        choice = min(range(num_replicas), key=lambda r: (len(heaps[r]), assigned[r], r))
        out[i] = choice
        assigned[choice] += 1
        if done_us > now_us:   # False for NaN (rejected)
            heapq.heappush(heaps[choice], done_us)
    return out


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


def _completions_us(requests: pd.DataFrame, num_requests: int) -> np.ndarray:
    """Completion time per request id (NaN for rejected ones)."""
    out = np.full(num_requests, np.nan)
    out[requests["request_id"].to_numpy()] = requests["completion_at_us"].to_numpy(dtype=float)
    return out


def run_routed(config: SimConfig, trace: pd.DataFrame, num_replicas: int, routing: str = "round-robin",
               profile_path: str | None = None, max_passes: int = 4) -> RoutedRun:
    """Route ``trace`` over ``num_replicas`` replicas of ``config`` and simulate them.

    Args:
        config: every replica's configuration.
        trace: canonical table (``request_id`` = row number, as every loader returns).
        num_replicas: R >= 1.
        routing: one of :data:`ROUTERS`.
        profile_path: calibration profile for VMM latencies.
        max_passes: simulation passes for least-outstanding (module docstring).

    Raises:
        ValueError: for an unknown routing, R < 1, or request ids that are not row numbers.
    """
    if routing not in ROUTERS:
        raise ValueError(f"--routing {routing!r}: choose one of {', '.join(ROUTERS)}")
    if num_replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {num_replicas}")
    if not np.array_equal(trace["request_id"].to_numpy(), np.arange(len(trace))):
        raise ValueError("routing needs request ids 0..n-1 in arrival order (renumber the trace)")
    arrival_us = np.round(trace["arrival_s"].to_numpy(dtype=float) * ARRIVAL_TICKS_PER_S) * ARRIVAL_TICK_US
    assignment, passes = round_robin(len(trace), num_replicas), 0
    while True:
        results = simulate_replicas(config, trace, assignment, num_replicas, profile_path)
        requests, summary = merge_replicas(results, config)
        passes += 1
        if routing == "round-robin":
            return RoutedRun(routing, assignment, requests, summary, results, passes, 1.0)
        rerouted = least_outstanding(arrival_us, _completions_us(requests, len(trace)), num_replicas)
        differs = np.flatnonzero(rerouted != assignment)
        if not len(differs) or passes >= max_passes:
            exact = 1.0 if not len(differs) else differs[0] / len(trace)
            return RoutedRun(routing, assignment, requests, summary, results, passes, exact)
        assignment = rerouted
