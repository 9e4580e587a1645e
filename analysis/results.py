"""Run results: per-request and per-iteration tables, the summary, and the run directory on disk.

Run directory layout (``kvsim simulate --out DIR``)::

    DIR/requests.parquet    one row per request   (sim.request.REQUEST_COLUMNS; times in us)
    DIR/iterations.parquet  one row per iteration (sim.engine.ITERATION_COLUMNS; times in us)
    DIR/summary.json        the summary below (units in every key)
    DIR/config.json         the run configuration, derived sizes and the trace/profile sources

Percentiles are linear-interpolated (numpy default) over finished requests.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.planning.slo import ttft_growth
from sim.units import US_PER_MS, US_PER_S

RUN_FILES = ("requests.parquet", "iterations.parquet", "summary.json", "config.json")


class RunResult:
    """One run: ``requests`` and ``iterations`` DataFrames, the ``summary`` dict and the ``config`` dict.

    ``iterations`` may be given as a DataFrame or as the path of its Parquet file (a streamed run, or
    :func:`load_run`): the table is then read on first access, so that a summary, a comparison or a capacity
    step never holds the per-iteration table of a long run in memory. ``requests`` likewise (a replica
    simulated to files, :mod:`sim.replica_merge`).
    """

    def __init__(self, requests: pd.DataFrame | str | Path, iterations: pd.DataFrame | str | Path, summary: dict,
                 config: dict | None = None, path: Path | None = None, tbt_samples: tuple | None = None):
        self._requests, self._iterations, self.summary = requests, iterations, summary
        self.config = config if config is not None else {}
        self.path = path
        self.tbt_samples = tbt_samples   # (single gaps, run gaps, run weights) of a fresh run, to merge replicas
        self.parts = None                # a replica simulated to files: sim.replica_merge.save_replica_parts

    @property
    def requests(self) -> pd.DataFrame:
        """The per-request table (read from its Parquet file on first access when given as a path)."""
        if isinstance(self._requests, (str, Path)):
            self._requests = pd.read_parquet(self._requests)
        return self._requests

    @requests.setter
    def requests(self, table: pd.DataFrame) -> None:
        self._requests = table

    @property
    def iterations(self) -> pd.DataFrame:
        """The per-iteration table (read from its Parquet file on first access)."""
        if isinstance(self._iterations, (str, Path)):
            self._iterations = pd.read_parquet(self._iterations)
        return self._iterations

    @iterations.setter
    def iterations(self, table: pd.DataFrame) -> None:
        self._iterations = table

    @property
    def iterations_file(self) -> Path | None:
        """The Parquet file the iterations are read from, while they have not been read."""
        return Path(self._iterations) if isinstance(self._iterations, (str, Path)) else None

    def relocate(self, directory: str | Path) -> None:
        """The run's files moved to ``directory`` (a staged output renamed into place): follow them."""
        self.path = Path(directory)
        if self.iterations_file is not None:
            self._iterations = self.path / "iterations.parquet"
        if isinstance(self._requests, (str, Path)):
            self._requests = self.path / "requests.parquet"

    def __repr__(self) -> str:
        requests = self._requests if isinstance(self._requests, (str, Path)) else f"{len(self._requests):,} requests"
        return (f"RunResult({requests}, iterations "
                f"{self.iterations_file or f'{len(self._iterations):,} rows'}, path={self.path})")


def _percentiles(values: pd.Series, name: str, scale: float, unit: str) -> dict:
    finite = values.to_numpy(dtype=float)
    finite = finite[np.isfinite(finite)]
    out = {}
    for q in (50, 90, 99):
        out[f"{name}_p{q}_{unit}"] = float(np.percentile(finite, q) / scale) if len(finite) else float("nan")
    out[f"{name}_mean_{unit}"] = float(finite.mean() / scale) if len(finite) else float("nan")
    return out


def iteration_counts(iterations: pd.DataFrame) -> dict:
    """Iteration count and the batch / pool / tail-waste figures of the summary, from the whole table."""
    if not len(iterations):
        return {"iterations": 0, "batch_sum": 0, "batch_max": 0, "mapped_max": 0, "waste_sum": 0, "waste_max": 0}
    return {"iterations": len(iterations), "batch_sum": int(iterations["batch_size"].sum()),
            "batch_max": int(iterations["batch_size"].max()), "mapped_max": int(iterations["mapped_page_groups"].max()),
            "waste_sum": int(iterations["tail_waste_bytes"].sum()), "waste_max": int(iterations["tail_waste_bytes"].max())}


def iteration_counts_of_file(path: str | Path) -> dict:
    """:func:`iteration_counts` of a streamed ``iterations.parquet``, one row group at a time (exact integer
    sums), plus the block-table and clearing totals (``block_table_sum_us``, ``clear_copy_sum_us``, each read
    as one column), so that a long run's summary never holds these columns together."""
    import pyarrow.parquet as pq

    from sim.columns import column_sum

    figures = iteration_counts(pd.DataFrame())
    parquet = pq.ParquetFile(path)
    for group in range(parquet.num_row_groups):
        part = iteration_counts(parquet.read_row_group(group, columns=["batch_size", "mapped_page_groups",
                                                                     "tail_waste_bytes"]).to_pandas())
        if not part["iterations"]:
            continue
        figures = {"iterations": figures["iterations"] + part["iterations"],
                   "batch_sum": figures["batch_sum"] + part["batch_sum"],
                   "batch_max": max(figures["batch_max"], part["batch_max"]),
                   "mapped_max": max(figures["mapped_max"], part["mapped_max"]),
                   "waste_sum": figures["waste_sum"] + part["waste_sum"],
                   "waste_max": max(figures["waste_max"], part["waste_max"])}
    for column in ("block_table_us", "clear_copy_us"):    # whole-column sums (pandas' bits), row group by row group
        figures[column.replace("_us", "_sum_us")] = column_sum(path, column)
    return figures


def summarize(requests: pd.DataFrame, iterations: pd.DataFrame, counters: dict, config: dict,
              count_figures: dict | None = None) -> dict:
    """The run summary (flat dict, units in keys).

    Args:
        requests / iterations: the run's tables (times in us); with ``count_figures``, ``iterations`` needs only
            ``duration_us`` and ``sync_stall_us``.
        counters: :attr:`sim.engine.SimOutput.counters`.
        config: :meth:`sim.config.SimConfig.to_dict` output (page_group_bytes, num_sub_tensors used).
        count_figures: :func:`iteration_counts_of_file` of a streamed run (else computed from ``iterations``).
    """
    counts = count_figures if count_figures is not None else iteration_counts(iterations)
    runs = counts["iterations"]
    finished = requests[requests["status"] == "finished"]
    start_us = float(requests["arrival_at_us"].min()) if len(requests) else 0.0
    end_us = float(finished["completion_at_us"].max()) if len(finished) else start_us
    span_s = max(end_us - start_us, 1e-9) / US_PER_S
    group_bytes = config["page_group_bytes"]
    # a vAttention page group is 2N' cuMemMap + cuMemSetAccess calls; blocks and reservations make none
    calls_per_group = config["num_sub_tensors"] if config.get("policy", "vattention") == "vattention" else 0
    maps = counters["sync_map_page_groups"] + counters["bg_map_page_groups"]
    unmaps = counters["sync_unmap_page_groups"] + counters["bg_unmap_page_groups"]
    stalls = iterations["sync_stall_us"] if len(iterations) else pd.Series(dtype=float)
    summary = {
        "requests": int(len(requests)), "finished": int(len(finished)),
        "rejected": int((requests["status"] == "rejected").sum()),
        "makespan_s": span_s,
        "throughput_req_per_s": len(finished) / span_s,
        "output_tokens_per_s": float(finished["output_tokens"].sum()) / span_s,
        "total_tokens_per_s": float((finished["prompt_tokens"] + finished["output_tokens"]).sum()) / span_s,
        **_percentiles(finished["ttft_us"], "ttft", US_PER_MS, "ms"),
        **_percentiles(finished["tpot_us"], "tpot", US_PER_MS, "ms"),
        **_percentiles(finished["e2e_us"], "e2e", US_PER_S, "s"),
        **_tbt_summary(counters),
        **_percentiles(_column(finished, "sched_delay_us"), "sched_delay", US_PER_MS, "ms"),
        # normalized latency (Vidur, Orca): E2E per output token, ms
        **_percentiles(finished["e2e_us"] / finished["output_tokens"], "e2e_per_token", US_PER_MS, "ms"),
        **_percentiles(iterations["duration_us"], "iteration", US_PER_MS, "ms"),
        "iterations": int(runs),
        "mean_batch_size": counts["batch_sum"] / runs if runs else 0.0,
        "max_batch_size": counts["batch_max"],
        "peak_mapped_bytes": counts["mapped_max"] * group_bytes,
        "pool_bytes": int(counters["pool_page_groups"] * group_bytes),
        "mean_tail_waste_bytes": counts["waste_sum"] / runs if runs else 0.0,
        "max_tail_waste_bytes": counts["waste_max"],
        "map_page_groups": int(maps), "unmap_page_groups": int(unmaps),
        "map_calls": int(maps * calls_per_group), "unmap_calls": int(unmaps * calls_per_group),
        "background_map_share": counters["bg_map_page_groups"] / maps if maps else float("nan"),
        "sync_stall_total_ms": float(stalls.sum() / US_PER_MS),
        "iterations_with_stall": int((stalls > 0).sum()),
        "preemptions": int(requests["preemptions"].sum()),
        "recomputed_tokens": int(_column(requests, "recomputed_tokens").sum()),
        # queueing trend (analysis.planning.slo): > 0.05 s/s means the queue grows through the run (overloaded)
        "ttft_growth_s_per_s": ttft_growth(requests),
        "rejected_by_reason": {str(k): int(v) for k, v in
                               requests.loc[requests["status"] == "rejected", "reject_reason"].value_counts().items()}
        if "reject_reason" in requests else {},
        "swap_out_bytes": int(counters.get("swap_out_bytes", 0)), "swap_in_bytes": int(counters.get("swap_in_bytes", 0)),
        "swap_total_ms": float(counters.get("swap_total_us", 0.0) / US_PER_MS),
        "block_table_total_ms": float((counts["block_table_sum_us"] if "block_table_sum_us" in counts
                                       else iterations["block_table_us"].sum() if runs else 0.0) / US_PER_MS),
        # VMM time of every map/unmap, background included: per tensor-parallel worker, and the critical
        # path (per operation, the slowest worker)
        "mapping_worker_ms": [us / US_PER_MS for us in counters.get("mapping_worker_us", [])],
        "mapping_critical_ms": float(counters.get("mapping_critical_us", 0.0) / US_PER_MS),
        "zero_critical_bytes": int(counters.get("zero_critical_bytes", 0)),
        "zero_background_bytes": int(counters.get("zero_background_bytes", 0)),
        "clear_copy_total_ms": float((counts["clear_copy_sum_us"] if "clear_copy_sum_us" in counts
                                      else iterations["clear_copy_us"].sum() if "clear_copy_us" in iterations
                                      else 0.0) / US_PER_MS),
        **_prefix_summary(requests, finished, counters, calls_per_group),
    }
    if "kv_groups" in counters:      # window-aware allocation (sim.memory.hybrid): page groups differ per group
        state_bytes = int(counters["kv_groups"].get("state_reserved_bytes", 0))   # vAttention's per-slot state
        summary["peak_mapped_bytes"] += state_bytes
        summary["pool_bytes"] += state_bytes
        summary.update(kv_groups=counters["kv_groups"], window_crossings=int(counters["window_crossings"]),
                       map_calls=int(counters.get("map_calls", 0)), unmap_calls=int(counters.get("unmap_calls", 0)))
    return summary


def _column(table: pd.DataFrame, name: str) -> pd.Series:
    """A column, or NaN/0 for runs written before it existed."""
    return table[name] if name in table else pd.Series(np.nan, index=table.index)


def _tbt_summary(counters: dict) -> dict:
    """TBT percentiles (ms) over all output tokens after each request's first (:func:`sim.records.tbt_stats_us`)."""
    if "tbt_p50_us" not in counters:
        return {}
    out = {f"tbt_{stat}_ms": float(counters[f"tbt_{stat}_us"]) / US_PER_MS for stat in ("p50", "p90", "p99", "max", "mean")}
    out["tbt_tokens"] = int(counters["tbt_tokens"])
    return out


def _prefix_summary(requests: pd.DataFrame, finished: pd.DataFrame, counters: dict, calls_per_group: int) -> dict:
    """Prefix-cache figures (present only when the run used one).

    The hit ratio counts first admissions only: prompt tokens served from the cache over the prompt tokens of
    requests admitted at least once (at most 1: a hit never covers a whole prompt). Hits of re-admissions
    after a preemption (mostly the request's own earlier blocks) are reported apart, as vLLM v1's prefix-cache
    statistics do (``preempted_hits``)."""
    if "prefix_lookups" not in counters:
        return {}
    hit = int(requests["prefix_hit_tokens"].sum())
    admitted = requests[requests["first_scheduled_at_us"].notna()] if "first_scheduled_at_us" in requests else finished
    prompt = int(admitted["prompt_tokens"].sum())
    return {"prefix_hit_ratio": hit / prompt if prompt else float("nan"),
            "prefill_tokens_saved": hit,
            "prefill_tokens_saved_preempted": int(_column(requests, "prefix_hit_tokens_preempted").fillna(0).sum()),
            "prefix_pages_shared": int(counters["prefix_shared_pages"]),
            "prefix_map_calls_added": int(counters["prefix_shared_maps"] * calls_per_group),
            "prefix_cow_tokens": int(counters["prefix_cow_tokens"]), "cow_copy_bytes": int(counters.get("cow_bytes", 0)),
            "prefix_evictions": int(counters["prefix_evictions"])}


SUMMARY_ITERATION_COLUMNS = ["duration_us", "sync_stall_us"]
"""The per-iteration columns :func:`summarize` reads whole (a streamed run reads only these back; its integer
figures come from :func:`iteration_counts_of_file`)."""


def build_result(output, config: dict) -> RunResult:
    """Turn :class:`sim.engine.SimOutput` into a :class:`RunResult` (a streamed run's iterations stay in
    their Parquet file; its summary reads back only :data:`SUMMARY_ITERATION_COLUMNS`)."""
    requests = output.requests_frame()
    streamed = output.recorder.path
    if streamed is None:
        iterations = output.iterations_frame()
        return RunResult(requests, iterations, summarize(requests, iterations, output.counters, config), config,
                         tbt_samples=output.counters.get("tbt_samples"))
    from sim.columns import read_column

    output.recorder.close()
    counts = iteration_counts_of_file(streamed)
    # the two columns read into one array each (reading the table and converting it held them twice)
    columns = pd.DataFrame({name: read_column(streamed, name) for name in SUMMARY_ITERATION_COLUMNS}, copy=False)
    summary = summarize(requests, columns, output.counters, config, counts)
    del columns
    return RunResult(requests, streamed, summary, config, tbt_samples=output.counters.get("tbt_samples"))


def write_run(result: RunResult, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Write a run directory (layout in the module docstring).

    Raises:
        FileExistsError: if ``out_dir`` already holds run files and ``overwrite`` is false.
    """
    out = Path(out_dir)
    streamed = result.iterations_file
    own = streamed is not None and streamed.exists() and streamed.resolve() == (out / "iterations.parquet").resolve()
    own_requests = (isinstance(result._requests, (str, Path)) and Path(result._requests).exists()
                    and Path(result._requests).resolve() == (out / "requests.parquet").resolve())
    existing = [name for name in RUN_FILES if (out / name).exists() and not (own and name == "iterations.parquet")
                and not (own_requests and name == "requests.parquet")]
    if existing and not overwrite:
        raise FileExistsError(f"{out} already holds a run ({', '.join(existing)}); choose another --out or pass --force")
    out.mkdir(parents=True, exist_ok=True)
    if not own_requests:        # a merged run's requests are already there (sim.replica_merge.write_merged_requests)
        result.requests.to_parquet(out / "requests.parquet", index=False)
    if not own:        # a streamed run's records are already there
        result.iterations.to_parquet(out / "iterations.parquet", index=False)
    (out / "summary.json").write_text(json.dumps(result.summary, indent=2, allow_nan=True) + "\n")
    (out / "config.json").write_text(json.dumps(result.config, indent=2, default=str) + "\n")
    result.path = out
    return out


def load_run(path: str | Path) -> RunResult:
    """Read a run directory written by :func:`write_run` (or ``kvsim simulate``); the per-request and
    per-iteration tables are read when first used (:attr:`RunResult.requests`, :attr:`RunResult.iterations`).

    Raises:
        FileNotFoundError: naming the missing file.
        ValueError: naming a file that cannot be read (not JSON, truncated or corrupt Parquet, unreadable), or
            a ``summary.json`` / ``config.json`` that is not a JSON object.
    """
    run = Path(path)
    if not run.is_dir():
        raise FileNotFoundError(f"{run}: {'not a directory' if run.exists() else 'does not exist'} (a kvsim run "
                                "directory is needed)")
    for name in RUN_FILES:
        if not (run / name).is_file():
            raise FileNotFoundError(f"{run}: not a kvsim run directory ({name} is missing)")
    tables = {}
    for name in RUN_FILES:
        try:
            if name in ("requests.parquet", "iterations.parquet"):   # read on first access; checked now
                import pyarrow.parquet as pq
                pq.read_metadata(run / name)
                tables[name] = run / name
            else:
                tables[name] = (pd.read_parquet(run / name) if name.endswith(".parquet")
                                else json.loads((run / name).read_text()))
        except (ValueError, OSError) as exc:     # JSONDecodeError and Arrow errors are ValueErrors/OSErrors
            raise ValueError(f"{run / name}: unreadable or corrupt ({exc})") from None
        if name.endswith(".json") and not isinstance(tables[name], dict):
            raise ValueError(f"{run / name}: expected a JSON object, got a JSON {type(tables[name]).__name__}")
    return RunResult(tables["requests.parquet"], tables["iterations.parquet"], tables["summary.json"],
                     tables["config.json"], run)
