"""Multi-replica routing: one trace over R replicas, each with its own simulator and memory manager.

State-free routers decide every request's replica from the trace alone, so the trace is split and each
replica simulated alone (in parallel on a local process pool or on Ray), then the records merged; this equals
co-simulating the replicas in one environment exactly (``tests/test_routing.py``):

* **round-robin**: request i (in arrival order) goes to replica ``i mod R``;
* **random**: replica drawn uniformly per request from ``numpy.random.default_rng(seed)``;
* **session-hash**: requests of one session go to one replica, ``session mod R`` after a 64-bit mix
  (splitmix64) of the session key: the trace's ``session_id`` column, else the first prefix-block id
  (Mooncake ``hash_ids[0]``: requests sharing a first block share a conversation prefix), else the request id.

State-dependent routers keep co-simulation:

* **least-outstanding**: each arrival goes to the replica with the fewest outstanding requests (arrived,
  not finished) at its arrival time; ties go to the replica with fewer requests so far, then the lower
  index. Exact: the replicas are co-simulated in one SimPy environment and a router process submits each
  request at its arrival time (:meth:`sim.core.engine.Simulator.submit`), reading every replica's state then.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from sim.core import runner
import simpy

from sim.results.summary import (SUMMARY_ITERATION_COLUMNS, RunResult, build_result, iteration_counts,
                                 iteration_counts_of_file, summarize, tier_hit_ratios)
from sim.setup.config import ConfigError, SimConfig
from sim.core.collector import quiet_collector
from sim.core.engine import ARRIVAL_TICK_US, ARRIVAL_TICKS_PER_S, Simulator
from sim.results.records import tbt_stats_us
from sim.results.json_text import nan_for_null
from sim.cluster.replica_merge import (check_replica_parts, merge_replica_parts, merged_counts as _merged_counts,
                                       merged_tbt_mean, save_replica_parts, tbt_token_sum)

from sim.cluster.routers import EXECUTORS, ROUTERS, STATE_FREE_ROUTERS  # noqa: E402  (names shared with the CLI)
# summary keys that add up over replicas (the rest is recomputed from the merged records)
_ADDITIVE_KEYS = ("map_page_groups", "unmap_page_groups", "map_calls", "unmap_calls", "swap_out_bytes",
                  "swap_in_bytes", "swap_refused_preemptions", "swap_total_ms", "pool_bytes",
                  "peak_mapped_bytes")   # (each replica its own GPU)
PREFIX_ADDITIVE_KEYS = ("prefill_tokens_saved", "prefill_tokens_saved_preempted", "prefix_pages_shared",
                        "prefix_map_calls_added", "prefix_cow_tokens", "cow_copy_bytes", "prefix_evictions")
"""A prefix-cached replica's counters (:func:`sim.results.summary._prefix_summary`) that add up over replicas
(the merged hit ratio is taken from the merged request table)."""


class RoutedRun:
    """One routed simulation.

    Attributes:
        routing: ``round-robin`` or ``least-outstanding``.
        assignment: replica index per request, in trace row order.
        requests: merged per-request table (times in us on the trace's clock) with a ``replica`` column; for
            replicas simulated to files (``records_dir``), built from their request files on first access.
        summary: the summary of the merged records (rates are totals over the replicas).
        replicas: each replica's own :class:`RunResult` (None for a replica that received no request).
    """

    def __init__(self, routing: str, assignment: np.ndarray, requests: pd.DataFrame | None, summary: dict,
                 replicas: list | None = None):
        self.routing, self.assignment, self._requests, self.summary = routing, assignment, requests, summary
        self.replicas = replicas if replicas is not None else []

    @property
    def requests(self) -> pd.DataFrame:
        if self._requests is None:
            self._requests = merged_requests(self.replicas)
        return self._requests

    def __repr__(self) -> str:
        return f"RoutedRun({self.routing}, {len(self.replicas)} replicas, {self.summary.get('requests')} requests)"


def round_robin(num_requests: int, num_replicas: int) -> np.ndarray:
    """Replica index per request: ``0, 1, ..., R-1, 0, 1, ...``."""
    return np.arange(num_requests, dtype=np.int64) % num_replicas


def random_assignment(num_requests: int, num_replicas: int, seed: int) -> np.ndarray:
    """Replica index per request, uniform from ``numpy.random.default_rng(seed)``."""
    return np.random.default_rng(seed).integers(0, num_replicas, num_requests, dtype=np.int64)


def session_keys(trace: pd.DataFrame) -> np.ndarray:
    """One integer session key per request (module docstring: ``session_id``, else ``hash_ids[0]``, else the
    request id)."""
    if "session_id" in trace.columns:
        return pd.factorize(trace["session_id"])[0].astype(np.uint64)
    keys = trace["request_id"].to_numpy().astype(np.uint64)
    if "hash_ids" in trace.columns:
        first = [ids[0] if ids is not None and len(ids) else None for ids in trace["hash_ids"]]
        has = np.array([f is not None for f in first])
        keys = keys.copy()
        # prefix-block ids and request ids live in one key space: offset the block ids past every request id
        keys[has] = np.array([f for f in first if f is not None], dtype=np.uint64) + np.uint64(len(trace))
    return keys


def session_key_note(trace: pd.DataFrame, num_replicas: int) -> str | None:
    """A warning when session-hash routing cannot spread the trace: fewer distinct session keys than replicas
    (e.g. Mooncake traces whose every request starts with the same system-prompt block)."""
    keys = session_keys(trace)
    distinct = len(np.unique(keys))
    if distinct >= num_replicas:
        return None
    source = ("session_id" if "session_id" in trace.columns else
              "hash_ids[0] (the first prefix block)" if "hash_ids" in trace.columns else "request id")
    return (f"session-hash: the {len(trace):,} requests have {distinct} distinct session key(s) ({source}) for "
            f"{num_replicas} replicas, so at most {distinct} replica(s) receive requests; add a session_id column "
            "or choose another routing")


def session_hash(trace: pd.DataFrame, num_replicas: int) -> np.ndarray:
    """Replica index per request: splitmix64 of the session key, modulo R (a fixed 64-bit mix, so the same
    session goes to the same replica on every run and platform)."""
    z = session_keys(trace) + np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(num_replicas)).astype(np.int64)


def assign(trace: pd.DataFrame, num_replicas: int, routing: str, seed: int = 0) -> np.ndarray:
    """Replica index per request for a state-free router (:data:`STATE_FREE_ROUTERS`).

    Raises:
        ValueError: for a router that needs co-simulation or is unknown.
    """
    if routing == "round-robin":
        return round_robin(len(trace), num_replicas)
    if routing == "random":
        return random_assignment(len(trace), num_replicas, seed)
    if routing == "session-hash":
        return session_hash(trace, num_replicas)
    raise ConfigError(f"routing={routing!r} is not state-free; choose one of {', '.join(STATE_FREE_ROUTERS)}",
                      "routing")


def split_trace(trace: pd.DataFrame, assignment: np.ndarray, num_replicas: int) -> list[pd.DataFrame]:
    """Each replica's rows, keeping the global ``request_id`` and the original ``arrival_s`` (one clock)."""
    return [_replica_rows(trace, assignment, replica) for replica in range(num_replicas)]


def _replica_rows(trace: pd.DataFrame, assignment: np.ndarray, replica: int) -> pd.DataFrame:
    part = trace[assignment == replica].reset_index(drop=True)
    part.attrs = {**trace.attrs, "source": f"{trace.attrs.get('source', 'trace')} | replica {replica}"}
    return part


def _simulate_replica(job: tuple) -> RunResult | None:
    """One replica's run (a process-pool or Ray task): ``(config, part, profile, records_path, keep_iterations,
    trace_digest)`` as :func:`_jobs` makes it. With a records path the replica's records stay on disk
    (:func:`sim.cluster.replica_merge.save_replica_parts`; without ``keep_iterations`` only the iteration columns the
    merge reads) and the result holds its summary and their paths only."""
    if job is None:     # a replica already simulated into the records directory (resume)
        return None
    config, part, profile_path, records_path, keep_iterations, digest = job
    if isinstance(part, tuple):         # (Parquet file of the replica's rows, trace attrs): read it here
        path, attrs = part
        part = pd.read_parquet(path)
        part.attrs = attrs
        Path(path).unlink()
    if not len(part):
        return None
    result = runner.run_simulation(config, part, profile_path, records_path=records_path)
    if records_path is None:
        return result
    parts = save_replica_parts(result, str(records_path).removesuffix(".parquet"),
                               keep_iterations=keep_iterations, trace_digest=digest)
    return light_result(parts, result.summary, result.config)


def light_result(parts: dict, summary: dict, config: dict) -> RunResult:
    """A replica's :class:`RunResult` whose records stay in its files (:mod:`sim.cluster.replica_merge`)."""
    light = RunResult(parts["requests"], parts["iterations"], summary, config)
    light.parts = parts
    return light


def load_replica_results(records_dir: str, num_replicas: int) -> list[RunResult | None]:
    """The replicas' light results from a records directory (``replica-R.parts.json``; None for a replica
    without one, which received no request): a merge redone without simulating again.

    Raises:
        ValueError: a record that is not valid JSON, lacks its parts, summary or config, or whose files are
            missing or unreadable (:func:`sim.cluster.replica_merge.check_replica_parts`; names the file).
    """
    import json
    from pathlib import Path

    results = []
    for replica in range(num_replicas):
        path = Path(records_dir) / f"replica-{replica}.parts.json"
        if not path.exists():
            results.append(None)
            continue
        try:
            saved = json.loads(path.read_text())
            parts, summary, config = saved["parts"], nan_for_null(saved["summary"]), saved["config"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a complete replica record ({type(exc).__name__}: {exc}); delete it to "
                             "simulate that replica again") from None
        if not isinstance(parts, dict):
            raise ValueError(f"{path}: not a complete replica record (parts is not an object); delete it to "
                             "simulate that replica again")
        results.append(light_result(check_replica_parts(parts, records_dir, str(path)), summary, config))
    return results


def simulate_replicas(config: SimConfig, trace: pd.DataFrame, assignment: np.ndarray, num_replicas: int,
                      profile_path: str | None = None, executor: str = "local", workers: int | None = None,
                      records_dir: str | None = None, ray_address: str | None = None,
                      keep_iterations: bool = True, resume: bool = False) -> list[RunResult | None]:
    """Simulate each replica's share of the trace (replica r uses seed ``config.seed + r``), in parallel.

    Args:
        executor: ``local`` (a process pool of ``workers`` processes; 1: in this process) or ``ray`` (one
            task per replica on a local Ray instance of ``workers`` CPUs, or the cluster at ``ray_address``).
        records_dir: stream replica r's iteration records to ``records_dir/replica-r.parquet`` and leave its
            other records beside them (:mod:`sim.cluster.replica_merge`; memory stays flat however many replicas and
            requests); default: in memory.
        keep_iterations: with ``records_dir``, false keeps of each replica's iteration records only the two
            columns the merged summary reads (``replica-R.columns.parquet``; a week-long replica: 1 GB of
            records otherwise); the merged iteration table cannot be written then.
        resume: with ``records_dir``, replicas that already left a complete record there
            (``replica-R.parts.json``, written last, with the same seed and trace rows) are read back instead of
            simulated again, so that a run stopped part-way (a week over 100 replicas takes hours) goes on.

    Raises:
        ValueError: for an unknown executor, or (resume) a record that does not belong to this run: another
            seed, or other trace rows for its replica (the message names the file).
    """
    if executor not in EXECUTORS:
        raise ConfigError(f"executor={executor!r}: choose one of {', '.join(EXECUTORS)}", "executor")
    done = _records_done(records_dir, config, trace, assignment, num_replicas) if resume and records_dir else {}
    # each replica's rows are split off when its job is handed out; the generator holds the trace, which is
    # freed once every job is out (if the caller holds no other reference)
    jobs = _jobs(config, trace, assignment, num_replicas, profile_path, records_dir, keep_iterations, set(done))
    del trace, assignment
    results = _run_jobs(jobs, num_replicas, executor, workers, ray_address, records_dir is not None)
    for replica, result in done.items():
        results[replica] = result
    return results


def _records_done(records_dir: str, config: SimConfig, trace: pd.DataFrame, assignment: np.ndarray,
                  num_replicas: int) -> dict[int, RunResult]:
    """The replicas with a complete record in ``records_dir`` (see :func:`simulate_replicas`' ``resume``).

    Raises:
        ValueError: a record of another run (seed, or trace rows by :func:`trace_digest`), naming its file.
    """
    done = {}
    for replica, result in enumerate(load_replica_results(records_dir, num_replicas)):
        if result is None:
            continue
        path = f"{records_dir}/replica-{replica}.parts.json"
        seed = int((result.config or {}).get("seed", -1))
        recorded = result.parts.get("trace_digest")
        expected = trace_digest(_replica_rows(trace, assignment, replica))
        if seed != config.seed + replica or recorded != expected:
            raise ConfigError(f"{path}: a record of another run (seed {seed}, trace rows {recorded}; this run: seed "
                              f"{config.seed + replica}, trace rows {expected}); use another records_dir directory",
                              "records_dir")
        done[replica] = result
    return done


def trace_digest(rows: pd.DataFrame) -> str:
    """A digest of a replica's trace rows (values and column names, not the index): 16 hex digits.

    A column of lists (Mooncake ``hash_ids``) is hashed through one text per row (``L:`` and the ids joined
    by commas, ``N`` for a missing value), so the digest covers every id, in order, and is the same on every
    run and platform; a trace of scalar columns hashes exactly as before (records of earlier runs still match).
    """
    import hashlib

    hashed = pd.util.hash_pandas_object(_hashable_columns(rows), index=False).to_numpy()
    return hashlib.sha1(hashed.tobytes() + ",".join(map(str, rows.columns)).encode()).hexdigest()[:16]


def _hashable_columns(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with each object column holding lists, tuples or arrays replaced by one text per row."""
    def text(value) -> str:
        if value is None or (np.isscalar(value) and pd.isna(value)):
            return "N"
        return "L:" + ",".join(map(str, value)) if isinstance(value, (list, tuple, np.ndarray)) else "S:" + str(value)

    listed = [name for name, dtype in rows.dtypes.items() if dtype == object
              and any(isinstance(v, (list, tuple, np.ndarray)) for v in rows[name])]
    if not listed:
        return rows
    return rows.assign(**{name: [text(v) for v in rows[name]] for name in listed})


def _run_jobs(jobs, num_replicas: int, executor: str, workers: int | None, ray_address: str | None,
              fresh: bool) -> list[RunResult | None]:
    """The jobs' results in replica order (a None job: None) on the chosen executor."""
    if executor == "ray":
        return _on_ray(jobs, workers, ray_address, fresh=fresh)
    workers = min(workers or 1, num_replicas)
    if workers <= 1:
        return [_simulate_replica(job) for job in jobs]
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    results, pending = [None] * num_replicas, {}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for replica, job in enumerate(jobs):       # at most two jobs queued per worker
            if job is None:
                continue
            while len(pending) >= 2 * workers:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    results[pending.pop(future)] = future.result()
            pending[pool.submit(_simulate_replica, job)] = replica
            del job
        for future, replica in pending.items():
            results[replica] = future.result()
    return results


def _jobs(config: SimConfig, trace: pd.DataFrame, assignment: np.ndarray, num_replicas: int,
          profile_path: str | None, records_dir: str | None, keep_iterations: bool = True,
          skip: set[int] = frozenset()):
    """Each replica's job (None for a replica in ``skip``). With a records directory and a trace of plain
    numeric columns, a replica's rows travel as a Parquet file there (``replica-R.trace.parquet``, read and
    removed by the task), so that neither this process nor an object store holds every replica's rows while the
    replicas run."""
    to_files = records_dir is not None and all(dtype.kind in "iuf" for dtype in trace.dtypes)
    if records_dir is not None:
        Path(records_dir).mkdir(parents=True, exist_ok=True)
    for replica in range(num_replicas):
        if replica in skip:
            yield None
            continue
        part = _replica_rows(trace, assignment, replica)
        digest = trace_digest(part) if records_dir is not None else None
        if to_files and len(part):
            path = f"{records_dir}/replica-{replica}.trace.parquet"
            part.to_parquet(path, index=False)
            part = (path, dict(part.attrs))
        yield (replace(config, seed=config.seed + replica), part, profile_path,
               None if records_dir is None else f"{records_dir}/replica-{replica}.parquet", keep_iterations, digest)


def _on_ray(jobs, workers: int | None, address: str | None, fresh: bool = False) -> list[RunResult | None]:
    """Run the replica jobs (an iterable) as Ray tasks (``pip install ray``), results in replica order;
    ``fresh``: each task in a new worker process (a long replica's memory goes back to the system with it)."""
    try:
        import ray
    except ImportError:
        raise ConfigError("executor=ray needs Ray: pip install 'ray>=2.9' (or the kvsim 'ray' extra)",
                          "executor") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, num_cpus=None if address else workers, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    try:
        task = ray.remote(num_cpus=1, max_calls=1 if fresh else 0)(_simulate_replica)
        refs = []
        for job in jobs:            # each job's rows (or their file) go to the object store as it is submitted
            refs.append(None if job is None else task.remote(job))
            del job
        results = ray.get([ref for ref in refs if ref is not None])[::-1]
        return [None if ref is None else results.pop() for ref in refs]
    finally:
        if started:
            ray.shutdown()


def merged_requests(results: list[RunResult | None]) -> pd.DataFrame:
    """Every replica's per-request table with a ``replica`` column, sorted by request id."""
    present = [(r, result) for r, result in enumerate(results) if result is not None]
    requests = pd.concat([res.requests.assign(replica=r) for r, res in present], ignore_index=True)
    return requests.sort_values("request_id", kind="stable", ignore_index=True)


def merged_summary(results: list[RunResult | None], config: SimConfig) -> dict:
    """The summary of the merged records, from replicas simulated to files (:mod:`sim.cluster.replica_merge`: bounded
    memory, exactly :func:`merge_replicas`'s summary) or else from :func:`merge_replicas`."""
    present = [(r, result) for r, result in enumerate(results) if result is not None]
    if present and all(res.parts is not None for _, res in present):
        summary = merge_replica_parts([res for _, res in present], [res.parts for _, res in present], config)
        return _replica_totals(summary, present, results)
    return merge_replicas(results, config)[1]


def merge_replicas(results: list[RunResult | None], config: SimConfig) -> tuple[pd.DataFrame, dict]:
    """The merged per-request table (with ``replica``) and its summary (additive counters summed), in memory."""
    present = [(r, result) for r, result in enumerate(results) if result is not None]
    requests = merged_requests(results)
    # the summary needs two float columns whole (iteration percentiles, stall total) and integer figures that
    # add up over replicas: a streamed replica's table is never read whole here
    columns = [_summary_columns(res) for _, res in present]
    iterations = pd.concat(columns, ignore_index=True)
    del columns
    counts = _merged_counts([_replica_counts(res) for _, res in present])
    zero = {"sync_map_page_groups": 0, "sync_unmap_page_groups": 0, "bg_map_page_groups": 0,
            "bg_unmap_page_groups": 0, "pool_page_groups": 0}
    samples = [res.tbt_samples for _, res in present if res.tbt_samples is not None]
    if samples and len(samples) == len(present):       # TBT over every replica's tokens
        singles = np.concatenate([np.asarray(single, dtype=float) for single, _, _ in samples])
        zero.update(tbt_stats_us(singles, [(gaps, weights) for _, gaps, weights in samples]))
        zero["tbt_mean_us"] = merged_tbt_mean([tbt_token_sum(s) for s in samples], zero["tbt_tokens"])
    summary = summarize(requests, iterations, zero, config.to_dict(), counts)
    summary.update(tier_hit_ratios(requests) if config.prefix_caching else {})
    return requests, _replica_totals(summary, present, results)


def _replica_totals(summary: dict, present: list, results: list) -> dict:
    """The merged summary's counters that add up over replicas (and the replica count)."""
    for key in _ADDITIVE_KEYS + ("mapping_critical_ms",):
        summary[key] = sum(res.summary.get(key, 0) for _, res in present)
    for key in PREFIX_ADDITIVE_KEYS:      # present only when the replicas used a prefix cache
        if any(key in res.summary for _, res in present):
            summary[key] = sum(res.summary.get(key, 0) for _, res in present)
    _tier_totals(summary, present)
    # per tensor-parallel worker, summed over the replicas (every replica has the same TP degree)
    summary["mapping_worker_ms"] = [sum(ms) for ms in zip(*(res.summary.get("mapping_worker_ms", [])
                                                           for _, res in present))]
    maps = summary["map_page_groups"]
    background = sum(res.summary["map_page_groups"] * np.nan_to_num(res.summary["background_map_share"])
                     for _, res in present)
    summary.update(background_map_share=background / maps if maps else float("nan"), replicas=len(results))
    return summary


def _tier_totals(summary: dict, present: list) -> None:
    """KV-tier counters (``tier_*``, numbers) summed over the replicas; text keys (sources, policies) kept."""
    # first-seen order (a set's order follows string hashing, which differs between processes: the merged
    # summary.json must be byte-identical for one seed)
    keys = dict.fromkeys(k for _, res in present for k, v in res.summary.items() if k.startswith("tier_")
                         and isinstance(v, (int, float)) and not k.endswith("_hit_ratio"))
    for key in keys:
        summary[key] = sum(res.summary.get(key, 0) for _, res in present)
    prompt = summary.get("tier_prompt_tokens", 0)
    if prompt:       # hit ratios over every replica's first admissions
        for kind in ("dram", "ssd"):
            if f"tier_{kind}_request_hit_tokens" in summary:
                summary[f"tier_{kind}_hit_ratio"] = summary[f"tier_{kind}_request_hit_tokens"] / prompt
        summary["prefix_hit_ratio"] = sum(res.summary.get("prefill_tokens_saved", 0) for _, res in present) / prompt


def _summary_columns(result: RunResult) -> pd.DataFrame:
    """The per-iteration columns a summary reads whole, without loading a streamed table whole."""
    if result.iterations_file is not None:
        return pd.read_parquet(result.iterations_file, columns=SUMMARY_ITERATION_COLUMNS)
    return result.iterations[SUMMARY_ITERATION_COLUMNS]


def _replica_counts(result: RunResult) -> dict:
    """A replica's integer figures and float totals (:func:`analysis.results.iteration_counts_of_file`)."""
    if result.iterations_file is not None:
        return iteration_counts_of_file(result.iterations_file)
    figures = iteration_counts(result.iterations)
    figures.update(block_table_sum_us=float(result.iterations["block_table_us"].sum()),
                   clear_copy_sum_us=float(result.iterations["clear_copy_us"].sum()))
    return figures


def co_simulate_least_outstanding(config: SimConfig, trace: pd.DataFrame, num_replicas: int,
                                  profile_path: str | None = None,
                                  assignment: np.ndarray | None = None,
                                  chooser=None) -> tuple[np.ndarray, list[RunResult | None]]:
    """Least-outstanding routing, co-simulated: one environment, R open-arrival simulators (replica r with
    seed ``config.seed + r``) and a router process that submits each request at its arrival time. With
    ``assignment`` the router follows it instead (a state-free router co-simulated: the check that splitting
    the trace equals co-simulation). With ``chooser`` (a cache-aware router, :mod:`sim.cluster.routers_prefix`) the
    router asks it instead: ``chooser(simulators, assigned_so_far, now_us, prompt_tokens, hash_ids) -> replica``.

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
    fixed = assignment
    assignment = np.empty(len(trace), dtype=np.int64)
    env.process(_router(env, trace, [s for _, _, s in replicas], assignment, fixed, chooser))
    with quiet_collector():
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


def _router(env: simpy.Environment, trace: pd.DataFrame, simulators: list, assignment: np.ndarray,
            fixed: np.ndarray | None = None, chooser=None):
    arrivals_us = np.round(trace["arrival_s"].to_numpy(dtype=float) * ARRIVAL_TICKS_PER_S) * ARRIVAL_TICK_US
    hash_ids = trace["hash_ids"] if "hash_ids" in trace.columns else [None] * len(trace)
    assigned = [0] * len(simulators)
    rows = zip(arrivals_us, trace["request_id"], trace["prompt_tokens"], trace["output_tokens"], hash_ids)
    for index, (arrival_us, request_id, prompt, output, ids) in enumerate(rows):
        for simulator in simulators:      # no replica fast-forwards past an arrival it might receive
            simulator.arrival_horizon_us = arrival_us
        if arrival_us > env.now:
            yield env.timeout(arrival_us - env.now)
        choice = (int(fixed[index]) if fixed is not None else
                  chooser(simulators, assigned, env.now, int(prompt), ids) if chooser is not None else
                  min(range(len(simulators)), key=lambda r: (simulators[r].outstanding, assigned[r], r)))
        simulators[choice].submit(int(request_id), int(prompt), int(output), ids)
        assigned[choice] += 1
        assignment[index] = choice
    for simulator in simulators:
        simulator.arrival_horizon_us = float("inf")
        simulator.close()


def run_routed(config: SimConfig, trace: pd.DataFrame, num_replicas: int, routing: str = "round-robin",
               profile_path: str | None = None, executor: str = "local", workers: int | None = None,
               records_dir: str | None = None, ray_address: str | None = None) -> RoutedRun:
    """Route ``trace`` over ``num_replicas`` replicas of ``config`` and simulate them.

    Args:
        config: every replica's configuration.
        trace: canonical table (``request_id`` = row number, as every loader returns).
        num_replicas: R >= 1.
        routing: one of :data:`ROUTERS`.
        profile_path: calibration profile for VMM latencies.
        executor, workers, records_dir, ray_address: how state-free routings simulate their replicas
            (:func:`simulate_replicas`); least-outstanding co-simulates in this process.

    Raises:
        ValueError: for an unknown routing or executor, R < 1, or request ids that are not row numbers.
    """
    from sim.cluster.routers_prefix import PREFIX_ROUTERS, make_chooser, parse_routing
    name, params = parse_routing(routing)
    if name not in ROUTERS:
        raise ConfigError(f"routing={routing!r}: choose one of {', '.join(ROUTERS)}", "routing")
    if num_replicas < 1:
        raise ConfigError(f"num_replicas={num_replicas}: must be >= 1", "num_replicas")
    if not np.array_equal(trace["request_id"].to_numpy(), np.arange(len(trace))):
        raise ValueError("routing needs request ids 0..n-1 in arrival order (renumber the trace)")
    if name in PREFIX_ROUTERS:          # cache-aware: co-simulated, the chooser reads the replicas' state
        chooser = make_chooser(name, params, config.prefix_block_tokens)
        assignment, results = co_simulate_least_outstanding(config, trace, num_replicas, profile_path, chooser=chooser)
    elif routing == "least-outstanding":
        assignment, results = co_simulate_least_outstanding(config, trace, num_replicas, profile_path)
    else:
        assignment = assign(trace, num_replicas, routing, config.seed)
        results = simulate_replicas(config, trace, assignment, num_replicas, profile_path, executor, workers,
                                    records_dir, ray_address)
    if any(res is not None and res.parts is not None for res in results):      # simulated to files
        return RoutedRun(routing, assignment, None, merged_summary(results, config), results)
    requests, summary = merge_replicas(results, config)
    return RoutedRun(routing, assignment, requests, summary, results)
