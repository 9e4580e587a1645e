"""Running sweep points: the per-point job, and the local-process-pool and Ray executors.

Both executors call the same :func:`run_point` on the same :class:`analysis.planning.sweep.PointJob` values and the
simulator is deterministic for a fixed seed, so a sweep gives identical tables on either. The parent
process writes each point's JSON as soon as it arrives, so an interrupted sweep resumes where it stopped.
"""
from __future__ import annotations

import functools
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from analysis.planning.sweep import PointJob, load_point, point_args, save_point

from sim.cluster.routers import EXECUTORS  # noqa: E402  (re-exported)


@functools.lru_cache(maxsize=8)
def _workload(trace, trace_format, arrival, num_requests, rate_scale, seed: int, max_context_tokens: int,
              sample=None):
    """The point's trace, cached per process: points that share a workload load it once."""
    import argparse

    from traces.workload import load_workload
    args = argparse.Namespace(trace=trace, trace_format=trace_format, arrival=arrival, num_requests=num_requests,
                              rate_scale=rate_scale, sample=sample)
    return load_workload(args, seed, max_context_tokens)[0]


def _point_config_and_trace(job: PointJob):
    from sim.frontend.options import config_from_args
    args, overrides = point_args(job)
    config = config_from_args(args, **overrides)
    trace = _workload(args.trace, args.trace_format, args.arrival, args.num_requests, args.rate_scale,
                      config.seed, config.slot_max_tokens, getattr(args, "sample", None))
    return args, config, trace


def _disagg_point(job: PointJob, kind: str) -> tuple[str, dict] | None:
    """A point of a disaggregated deployment (a ``pd`` axis or ``--pd``): ``simulate`` or ``capacity``
    (:mod:`analysis.planning.disagg_cli`); None for a co-located point (``pd`` unset or ``none``)."""
    from sim.frontend.disagg_options import pd_of
    args, overrides = point_args(job)
    if pd_of(args) is None:
        return None
    from analysis.planning import disagg_cli

    def load(seed: int, slot_max_tokens: int):
        return _workload(args.trace, args.trace_format, args.arrival, args.num_requests, args.rate_scale, seed,
                         slot_max_tokens)
    return (disagg_cli.capacity_point if kind == "capacity" else disagg_cli.simulate_point)(args, overrides, load)


def _simulate(job: PointJob) -> tuple[str, dict]:
    from analysis.planning.slo import point_objectives
    from analysis.results import with_goodput
    from sim.core.runner import run_simulation
    if (point := _disagg_point(job, "simulate")) is not None:
        return point
    args, config, trace = _point_config_and_trace(job)
    result = run_simulation(config, trace, args.profile)
    return config.label, with_goodput(result.summary, result.requests, point_objectives(args))


def _capacity(job: PointJob) -> tuple[str, dict]:
    from analysis.planning.capacity import find_capacity
    from analysis.planning.slo import search_objectives
    if (point := _disagg_point(job, "capacity")) is not None:
        return point
    args, config, trace = _point_config_and_trace(job)
    if not args.slo:
        raise ValueError("--job capacity needs --slo (e.g. ttft_p99=2s,tpot_p99=100ms)")
    result = find_capacity(config, trace, search_objectives(args), args.tolerance, args.profile, args.stability_tol,
                           allow_rejected=getattr(args, "allow_rejected", False))
    gpus = config.gpus_per_replica                      # tp x pp
    return config.label, {**result.to_dict(), "gpus": gpus, "capacity_req_per_s_per_gpu": result.rate_per_s / gpus}


def run_point(job: PointJob) -> dict:
    """Run one point; never raises: a failure becomes a record with ``status="error"`` and the message.

    Returns:
        ``{"key", "index", "point", "job", "status", "error", "label", "result", "wall_s"}``; ``result``
        is the run summary (simulate) or :meth:`CapacityResult.to_dict` (capacity).
    """
    started = time.perf_counter()
    record = {"key": job.key, "index": job.index, "point": job.point, "job": job.job}
    try:
        label, result = (_capacity if job.job == "capacity" else _simulate)(job)
        record.update(status="ok", error="", label=label, result=result)
    except Exception as exc:   # one failing point must not kill the sweep: report it in the table
        record.update(status="error", error=f"{type(exc).__name__}: {exc}", label="", result={},
                      traceback=traceback.format_exc(limit=4))
    record["wall_s"] = time.perf_counter() - started
    return record


def error_record(job: PointJob, exc: BaseException) -> dict:
    """A record for a point whose worker died (the executor, not the point, raised)."""
    return {"key": job.key, "index": job.index, "point": job.point, "job": job.job, "status": "error",
            "error": f"{type(exc).__name__}: {exc}", "label": "", "result": {}, "wall_s": float("nan")}


def run_local(jobs: list[PointJob], workers: int | None, on_done: Callable[[dict], None]) -> None:
    """Run ``jobs`` in a process pool (``workers`` processes, default one per core; 1 = in this process)."""
    workers = min(workers or os.cpu_count() or 1, max(len(jobs), 1))
    if workers <= 1:
        for job in jobs:
            on_done(run_point(job))
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_point, job): job for job in jobs}
        for future in as_completed(futures):
            try:
                on_done(future.result())
            except Exception as exc:   # a worker process died (e.g. killed for memory)
                on_done(error_record(futures[future], exc))


def run_ray(jobs: list[PointJob], address: str | None, workers: int | None,
            on_done: Callable[[dict], None]) -> None:
    """Run ``jobs`` as Ray tasks: on the cluster at ``address`` (``auto`` = the one this host belongs to),
    in an already initialised Ray, or in a local instance started (and stopped) here.

    Raises:
        ImportError: when Ray is not installed (``pip install 'kvsim[ray]'``).
    """
    try:
        import ray
    except ImportError:
        raise ImportError("--executor ray needs Ray: pip install 'ray>=2.9' (or the kvsim[ray] extra)") from None
    started_here = not ray.is_initialized()
    if started_here:
        options = {"address": address} if address else {"num_cpus": workers, "include_dashboard": False}
        ray.init(**options, log_to_driver=False)
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(run_point)
        pending = {remote.remote(job): job for job in jobs}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                job = pending.pop(ref)
                try:
                    on_done(ray.get(ref))
                except Exception as exc:   # the task's worker died
                    on_done(error_record(job, exc))
    finally:
        if started_here:
            ray.shutdown()


class _Display:
    """A rich progress bar on a terminal (none with ``quiet`` or when stderr is not a terminal, as every command's
    progress, :class:`analysis.flags.Progress`); a failed point is always said, in one line."""

    def __init__(self, total: int, quiet: bool):
        self.total, self.done, self.quiet, self.bar = total, 0, quiet, None
        if not quiet and sys.stderr.isatty() and total:
            from rich.console import Console
            from rich.progress import Progress
            self.bar = Progress(console=Console(stderr=True), transient=True)
            self.task = self.bar.add_task("sweep", total=total)
            self.bar.start()

    def update(self, record: dict) -> None:
        self.done += 1
        point = " ".join(f"{k}={v}" for k, v in record["point"].items())
        if record["status"] != "ok":
            message = f"point {point}: {record['error']}"
            (self.bar.console.print if self.bar else lambda m: print(m, file=sys.stderr))(f"kvsim: failed {message}")
        if self.bar:
            self.bar.update(self.task, completed=self.done)

    def close(self) -> None:
        if self.bar:
            self.bar.stop()


def run_sweep(jobs: list[PointJob], out_dir: Path, executor: str = "local", workers: int | None = None,
              ray_address: str | None = None, quiet: bool = True) -> tuple[dict[str, dict], int]:
    """Run the points not yet stored under ``out_dir/points`` (or stored as failed) and return every point's
    record.

    Returns:
        ``({key: record}, number of points run now)``.

    Raises:
        ValueError: for an unknown executor.
    """
    if executor not in EXECUTORS:
        raise ValueError(f"--executor {executor!r}: choose one of {', '.join(EXECUTORS)}")
    # a stored failed point runs again (its cause, e.g. a GPU file since fixed, may be gone)
    records = {job.key: rec for job in jobs
               if (rec := load_point(out_dir, job)) is not None and rec.get("status") == "ok"}
    todo = _unique([job for job in jobs if job.key not in records])
    display = _Display(len(todo), quiet)

    def on_done(record: dict) -> None:
        save_point(out_dir, record)
        records[record["key"]] = record
        display.update(record)

    try:
        if executor == "ray":
            run_ray(todo, ray_address, workers, on_done)
        else:
            run_local(todo, workers, on_done)
    finally:
        display.close()
    return records, len(todo)


def _unique(jobs: Iterable[PointJob]) -> list[PointJob]:
    """Drop points whose key repeats (a grid value given twice in different spellings)."""
    seen: dict[str, PointJob] = {}
    for job in jobs:
        seen.setdefault(job.key, job)
    return list(seen.values())
