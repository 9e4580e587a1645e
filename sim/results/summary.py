"""The run result and its summary statistics, computed inside ``sim`` (no import of ``analysis``).

:class:`RunResult` (the per-request and per-iteration tables, the summary, the configuration),
:func:`summarize` (the flat summary dict, units in keys), :func:`build_result` (a run's
:class:`sim.core.engine.SimOutput` -> :class:`RunResult`), :func:`iteration_counts` /
:func:`iteration_counts_of_file` (integer figures of the iteration table, in memory or streamed) and the
queueing trend :func:`ttft_growth` (the stability criterion of :mod:`analysis.planning.slo`, whose module
docstring derives it). Run directories on disk (:func:`analysis.results.write_run`, ``load_run``) and every
report stay in :mod:`analysis`, which re-exports these names.

Percentiles are linear-interpolated (numpy default) over finished requests.

:func:`summarize` reads its tables' columns as numpy arrays, so it takes DataFrames or
:class:`sim.results.columns.ColumnTable` alike (a fresh streamed run's, which ``kvsim simulate`` summarises and
writes without importing pandas: :func:`build_result`); float totals are pandas' (NaN as 0, numpy's pairwise sum).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sim.units import US_PER_MS, US_PER_S
from sim.results.columns import ColumnTable
from sim.results.recorder import KEPT_COLUMNS

if TYPE_CHECKING:
    import pandas as pd


class RunResult:
    """One run: ``requests`` and ``iterations`` DataFrames, the ``summary`` dict and the ``config`` dict.

    ``iterations`` may be given as a DataFrame or as the path of its Parquet file (a streamed run, or
    :func:`load_run`): the table is then read on first access, so that a summary, a comparison or a capacity
    step never holds the per-iteration table of a long run in memory. ``requests`` likewise (a replica
    simulated to files, :mod:`sim.cluster.replica_merge`). ``tiers``: the KV-tier occupancy table of a run with
    ``kv_tiers`` (:meth:`sim.core.tier_charges.TierCharges.occupancy_columns`; a DataFrame or its Parquet file),
    None for every other run.
    """

    def __init__(self, requests: pd.DataFrame | ColumnTable | str | Path, iterations: pd.DataFrame | str | Path,
                 summary: dict,
                 config: dict | None = None, path: Path | None = None, tbt_samples: tuple | None = None,
                 tiers: pd.DataFrame | str | Path | None = None):
        self._requests, self._iterations, self.summary = requests, iterations, summary
        self._tiers = tiers
        self.config = config if config is not None else {}
        self.path = path
        self.tbt_samples = tbt_samples   # (single gaps, run gaps, run weights) of a fresh run, to merge replicas
        self.parts = None                # a replica simulated to files: sim.cluster.replica_merge.save_replica_parts

    @property
    def requests(self) -> pd.DataFrame:
        """The per-request table (read from its Parquet file on first access when given as a path; a
        :class:`sim.results.columns.ColumnTable` made a DataFrame on first access)."""
        if isinstance(self._requests, (str, Path)):
            import pandas as pd
            self._requests = pd.read_parquet(self._requests)
        elif isinstance(self._requests, ColumnTable):
            self._requests = self._requests.to_frame()
        return self._requests

    @requests.setter
    def requests(self, table: pd.DataFrame) -> None:
        self._requests = table

    @property
    def iterations(self) -> pd.DataFrame:
        """The per-iteration table (read from its Parquet file on first access)."""
        if isinstance(self._iterations, (str, Path)):
            import pandas as pd
            self._iterations = pd.read_parquet(self._iterations)
        return self._iterations

    @iterations.setter
    def iterations(self, table: pd.DataFrame) -> None:
        self._iterations = table

    @property
    def tiers(self) -> pd.DataFrame | None:
        """The KV-tier occupancy table (read from ``tiers.parquet`` on first access), None without tiers."""
        if isinstance(self._tiers, (str, Path)):
            import pandas as pd
            self._tiers = pd.read_parquet(self._tiers)
        return self._tiers

    @tiers.setter
    def tiers(self, table: pd.DataFrame | None) -> None:
        self._tiers = table

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
        if isinstance(self._tiers, (str, Path)):
            self._tiers = self.path / "tiers.parquet"

    def __repr__(self) -> str:
        requests = self._requests if isinstance(self._requests, (str, Path)) else f"{len(self._requests):,} requests"
        return (f"RunResult({requests}, iterations "
                f"{self.iterations_file or f'{len(self._iterations):,} rows'}, path={self.path})")


def _array(table, name: str) -> np.ndarray:
    """Column ``name`` of a DataFrame or a :class:`ColumnTable` as a numpy array."""
    values = table[name]
    return values if isinstance(values, np.ndarray) else values.to_numpy()


def _nan_sum(values: np.ndarray) -> float:
    """pandas' ``Series.sum()`` of float64 values, bit for bit: NaN as 0, then numpy's pairwise sum."""
    values = np.asarray(values, dtype=np.float64)
    nan = np.isnan(values)
    return float(np.where(nan, 0.0, values).sum() if nan.any() else values.sum())


def _total(values: np.ndarray):
    """pandas' ``Series.sum()`` of a column: :func:`_nan_sum` of floats, numpy's sum of integers."""
    return _nan_sum(values) if values.dtype.kind == "f" else values.sum()


def _percentiles(values, name: str, scale: float, unit: str) -> dict:
    finite = values.to_numpy(dtype=float) if hasattr(values, "to_numpy") else np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    out = {}
    for q, value in zip((50, 90, 99), _linear_percentiles(finite, (50, 90, 99))):
        out[f"{name}_p{q}_{unit}"] = float(value / scale) if len(finite) else float("nan")
    out[f"{name}_mean_{unit}"] = float(finite.mean() / scale) if len(finite) else float("nan")
    return out


def _linear_percentiles(finite: np.ndarray, qs: tuple) -> list:
    """``np.percentile(finite, q)`` for each q, bit for bit, from one sort (:func:`sim.results.columns.linear_percentile`:
    numpy's interpolation; ``np.percentile`` itself imports ``numpy.ma``, ~10 ms a start). A zero takes
    ``np.percentile`` where a -0.0 is among them: sorting and numpy's partition may place it and 0.0 differently."""
    if not len(finite):
        return [float("nan")] * len(qs)
    if not finite.all() and np.signbit(finite[finite == 0]).any():
        return [np.percentile(finite, q) for q in qs]
    from sim.results.columns import linear_percentile

    ordered = np.sort(finite)
    return [linear_percentile(len(ordered), q, ordered.__getitem__) for q in qs]


NO_ITERATION_COUNTS = {"iterations": 0, "batch_sum": 0, "batch_max": 0, "mapped_max": 0, "waste_sum": 0,
                       "waste_max": 0}
""":func:`iteration_counts` of a run without iterations (copied, never changed in place)."""


def iteration_counts(iterations: pd.DataFrame) -> dict:
    """Iteration count and the batch / pool / tail-waste figures of the summary, from the whole table."""
    if not len(iterations):
        return dict(NO_ITERATION_COUNTS)
    return {"iterations": len(iterations), "batch_sum": int(iterations["batch_size"].sum()),
            "batch_max": int(iterations["batch_size"].max()), "mapped_max": int(iterations["mapped_page_groups"].max()),
            "waste_sum": int(iterations["tail_waste_bytes"].sum()), "waste_max": int(iterations["tail_waste_bytes"].max())}


def iteration_counts_of_file(path: str | Path) -> dict:
    """:func:`iteration_counts` of a streamed ``iterations.parquet``, one row group at a time (exact integer
    sums), plus the block-table and clearing totals (``block_table_sum_us``, ``clear_copy_sum_us``, each read
    as one column), so that a long run's summary never holds these columns together."""
    import pyarrow.parquet as pq

    from sim.results.columns import column_sum

    figures = dict(NO_ITERATION_COUNTS)
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
        counters: :attr:`sim.core.engine.SimOutput.counters`.
        config: :meth:`sim.setup.config.SimConfig.to_dict` output (page_group_bytes, num_sub_tensors used).
        count_figures: :func:`iteration_counts_of_file` of a streamed run (else computed from ``iterations``).
    """
    counts = count_figures if count_figures is not None else iteration_counts(iterations)
    runs = counts["iterations"]
    status = _array(requests, "status")
    finished = status == "finished"
    n_finished = int(np.count_nonzero(finished))
    arrivals_us = _array(requests, "arrival_at_us")
    # pandas' min and max skip NaN (fmin / fmax do)
    start_us = float(np.fmin.reduce(arrivals_us)) if len(arrivals_us) else 0.0
    end_us = float(np.fmax.reduce(_array(requests, "completion_at_us")[finished])) if n_finished else start_us
    span_s = max(end_us - start_us, 1e-9) / US_PER_S
    group_bytes = config["page_group_bytes"]
    # a vAttention page group is 2N' cuMemMap + cuMemSetAccess calls; blocks and reservations make none
    calls_per_group = config["num_sub_tensors"] if config.get("policy", "vattention") == "vattention" else 0
    maps = counters["sync_map_page_groups"] + counters["bg_map_page_groups"]
    unmaps = counters["sync_unmap_page_groups"] + counters["bg_unmap_page_groups"]
    stalls = _array(iterations, "sync_stall_us") if len(iterations) else np.zeros(0)
    output_tokens = _array(requests, "output_tokens")[finished]
    prompt_tokens = _array(requests, "prompt_tokens")[finished]
    e2e_us = _array(requests, "e2e_us")[finished]
    with np.errstate(divide="ignore", invalid="ignore"):      # pandas' division: x / 0 = inf, 0 / 0 = NaN
        e2e_per_token_us = e2e_us / output_tokens
    summary = {
        "requests": int(len(status)), "finished": n_finished,
        "rejected": int(np.count_nonzero(status == "rejected")),
        "makespan_s": span_s,
        "throughput_req_per_s": n_finished / span_s,
        "output_tokens_per_s": float(_total(output_tokens)) / span_s,
        "total_tokens_per_s": float(_total(prompt_tokens + output_tokens)) / span_s,
        **_percentiles(_array(requests, "ttft_us")[finished], "ttft", US_PER_MS, "ms"),
        **_percentiles(_array(requests, "tpot_us")[finished], "tpot", US_PER_MS, "ms"),
        **_percentiles(e2e_us, "e2e", US_PER_S, "s"),
        **_tbt_summary(counters),
        **_percentiles(_array_or_nan(requests, "sched_delay_us")[finished], "sched_delay", US_PER_MS, "ms"),
        # normalized latency (Vidur, Orca): E2E per output token, ms
        **_percentiles(e2e_per_token_us, "e2e_per_token", US_PER_MS, "ms"),
        **_percentiles(_array(iterations, "duration_us") if len(iterations) else np.zeros(0), "iteration",
                       US_PER_MS, "ms"),
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
        "sync_stall_total_ms": _nan_sum(stalls) / US_PER_MS,
        "iterations_with_stall": int(np.count_nonzero(stalls > 0)),
        "preemptions": int(_total(_array(requests, "preemptions"))),
        "recomputed_tokens": int(_total(_array_or_nan(requests, "recomputed_tokens"))),
        # queueing trend (analysis.planning.slo): > 0.05 s/s means the queue grows through the run (overloaded)
        "ttft_growth_s_per_s": ttft_growth(requests),
        "rejected_by_reason": _rejected_by_reason(requests, status),
        "swap_out_bytes": int(counters.get("swap_out_bytes", 0)), "swap_in_bytes": int(counters.get("swap_in_bytes", 0)),
        # swap preemptions the host swap space had no room for (recomputed instead; 0 without swap)
        "swap_refused_preemptions": int(counters.get("swap_refused_preemptions", 0)),
        "swap_total_ms": float(counters.get("swap_total_us", 0.0) / US_PER_MS),
        "block_table_total_ms": float((counts["block_table_sum_us"] if "block_table_sum_us" in counts
                                       else _nan_sum(_array(iterations, "block_table_us")) if runs else 0.0)
                                      / US_PER_MS),
        # VMM time of every map/unmap, background included: per tensor-parallel worker, and the critical
        # path (per operation, the slowest worker)
        "mapping_worker_ms": [us / US_PER_MS for us in counters.get("mapping_worker_us", [])],
        "mapping_critical_ms": float(counters.get("mapping_critical_us", 0.0) / US_PER_MS),
        "zero_critical_bytes": int(counters.get("zero_critical_bytes", 0)),
        "zero_background_bytes": int(counters.get("zero_background_bytes", 0)),
        "clear_copy_total_ms": float((counts["clear_copy_sum_us"] if "clear_copy_sum_us" in counts
                                      else _nan_sum(_array(iterations, "clear_copy_us"))
                                      if "clear_copy_us" in iterations else 0.0) / US_PER_MS),
        **_prefix_summary(requests, finished, counters, calls_per_group),
        **_tier_summary(requests, counters),
    }
    if "kv_groups" in counters:      # window-aware allocation (sim.memory.hybrid): page groups differ per group
        state_bytes = int(counters["kv_groups"].get("state_reserved_bytes", 0))   # vAttention's per-slot state
        summary["peak_mapped_bytes"] += state_bytes
        summary["pool_bytes"] += state_bytes
        summary.update(kv_groups=counters["kv_groups"], window_crossings=int(counters["window_crossings"]),
                       map_calls=int(counters.get("map_calls", 0)), unmap_calls=int(counters.get("unmap_calls", 0)))
    summary.update(compute_model_entry(config))     # which compute model produced the times (issue 36)
    return summary


def _column(table: pd.DataFrame, name: str) -> pd.Series:
    """A column, or NaN/0 for runs written before it existed."""
    import pandas as pd
    return table[name] if name in table else pd.Series(np.nan, index=table.index)


def _array_or_nan(table, name: str) -> np.ndarray:
    """:func:`_column` as a numpy array (NaN for runs written before the column existed)."""
    return _array(table, name) if name in table else np.full(len(table), np.nan)


def _rejected_by_reason(requests, status: np.ndarray) -> dict:
    """``{reason: count}`` of the rejected requests in pandas' ``value_counts`` order (no rejection: no pandas)."""
    if "reject_reason" not in requests:
        return {}
    rejected = status == "rejected"
    if not rejected.any():
        return {}
    import pandas as pd
    if isinstance(requests, ColumnTable):
        requests = pd.DataFrame({"status": status, "reject_reason": requests["reject_reason"]})
    return {str(k): int(v) for k, v in
            requests.loc[requests["status"] == "rejected", "reject_reason"].value_counts().items()}


def _tbt_summary(counters: dict) -> dict:
    """TBT percentiles (ms) over all output tokens after each request's first (:func:`sim.results.records.tbt_stats_us`)."""
    if "tbt_p50_us" not in counters:
        return {}
    out = {f"tbt_{stat}_ms": float(counters[f"tbt_{stat}_us"]) / US_PER_MS for stat in ("p50", "p90", "p99", "max", "mean")}
    out["tbt_tokens"] = int(counters["tbt_tokens"])
    return out


def _prefix_summary(requests, finished: np.ndarray, counters: dict, calls_per_group: int) -> dict:
    """Prefix-cache figures (present only when the run used one).

    The hit ratio counts first admissions only: prompt tokens served from the cache over the prompt tokens of
    requests admitted at least once (at most 1: a hit never covers a whole prompt). Hits of re-admissions
    after a preemption (mostly the request's own earlier blocks) are reported apart, as vLLM v1's prefix-cache
    statistics do (``preempted_hits``)."""
    if "prefix_lookups" not in counters:
        return {}
    hit = int(_total(_array(requests, "prefix_hit_tokens")))
    prompt = int(_total(_array(requests, "prompt_tokens")[_admitted(requests, finished)]))
    preempted = _total(_array_or_nan(requests, "prefix_hit_tokens_preempted"))
    return {"prefix_hit_ratio": hit / prompt if prompt else float("nan"),
            "prefill_tokens_saved": hit,
            "prefill_tokens_saved_preempted": int(preempted),
            "prefix_pages_shared": int(counters["prefix_shared_pages"]),
            "prefix_map_calls_added": int(counters["prefix_shared_maps"] * calls_per_group),
            "prefix_cow_tokens": int(counters["prefix_cow_tokens"]), "cow_copy_bytes": int(counters.get("cow_bytes", 0)),
            "prefix_evictions": int(counters["prefix_evictions"])}


SCHED_DELAY_P50_BOUND_US = 2e6
"""Median scheduling delay beyond which a served load is overloaded (us): Sarathi-Serve (Agrawal et al., OSDI'24,
section 5) defines capacity as the highest load whose median scheduling delay stays under 2 s. The capacity search's
default bound (``analysis.planning.slo.DEFAULT_SCHED_DELAY_P50_US``) and ``kvsim simulate``'s part-run overload
warning (``analysis.summary.attention_lines``) both use it."""

ROOFLINE_CAVEAT = "not validated for {gpu} with a serving engine (docs/validation/README.md; a calibration profile for a fit)"
"""Said beside a roofline's times: the built-in roofline's efficiencies come from four H200 decode iterations
(domain.md), and a profile's ``compute.roofline`` from an isolated grid, neither from an engine's iterations."""


def compute_model_text(description: str, gpu: str) -> str:
    """The summary's ``compute_model``: ``description`` (``config.json``'s ``compute_model``, as
    :func:`sim.core.runner.compute_model_source` writes it) with :data:`ROOFLINE_CAVEAT` for a roofline."""
    caveat = ROOFLINE_CAVEAT.format(gpu=gpu)
    if not description.startswith("roofline") or caveat in description:     # (said once, however often applied)
        return description
    return f"{description}; {caveat}"


def compute_model_entry(config: dict) -> dict:
    """``{"compute_model": text}`` (:func:`compute_model_text`) when ``config`` records its compute model
    (``config.json`` of :func:`sim.core.runner.run_simulation`), else ``{}``."""
    if not isinstance(config.get("compute_model"), str):
        return {}
    return {"compute_model": compute_model_text(config["compute_model"], str(config.get("gpu", "this GPU")))}


def _admitted(requests, otherwise: np.ndarray | None = None) -> np.ndarray:
    """Rows of the requests admitted at least once (``first_scheduled_at_us`` not NaN), or ``otherwise`` (all
    rows when None) for tables written before that column existed."""
    if "first_scheduled_at_us" in requests:
        return ~np.isnan(_array(requests, "first_scheduled_at_us").astype(np.float64))
    return np.ones(len(requests), dtype=bool) if otherwise is None else otherwise


def _tier_summary(requests, counters: dict) -> dict:
    """KV-tier figures (present only with ``kv_tiers``): the tier store's counters (``tier_<kind>_*``:
    hit and miss tokens, promotions, demotions, bytes and time each way, resident pages; sim.memory.tiers) and
    each tier's hit ratio over the prompt tokens of first admissions (``tier_<kind>_hit_ratio``)."""
    out = {key: value for key, value in counters.items() if key.startswith("tier_")}
    if not out:
        return {}
    # the ratios' denominator (replica merges)
    out["tier_prompt_tokens"] = int(_total(_array(requests, "prompt_tokens")[_admitted(requests)]))
    for kind in ("dram", "ssd"):
        if f"{kind}_hit_tokens" in requests:
            out[f"tier_{kind}_request_hit_tokens"] = int(_total(_array(requests, f"{kind}_hit_tokens")))
    return {**out, **tier_hit_ratios(requests, with_hbm=False)}


def tier_hit_ratios(requests: pd.DataFrame, with_hbm: bool = True) -> dict:
    """Hit ratio of each KV tier over the prompt tokens of first admissions: ``tier_<kind>_hit_ratio`` from the
    ``<kind>_hit_tokens`` columns, and (``with_hbm``) ``prefix_hit_ratio`` from ``prefix_hit_tokens`` (the
    merged table of routed replicas, whose summary has no prefix counters)."""
    columns = [c for c in requests.columns if c in ("dram_hit_tokens", "ssd_hit_tokens")]
    if with_hbm and "prefix_hit_tokens" in requests and (columns or requests["prefix_hit_tokens"].any()):
        columns.append("prefix_hit_tokens")
    admitted = requests[requests["first_scheduled_at_us"].notna()] if "first_scheduled_at_us" in requests else requests
    prompt = int(admitted["prompt_tokens"].sum())
    return {("prefix_hit_ratio" if c == "prefix_hit_tokens" else f"tier_{c.removesuffix('_hit_tokens')}_hit_ratio"):
            int(requests[c].sum()) / prompt if prompt else float("nan") for c in columns}


SUMMARY_ITERATION_COLUMNS = list(KEPT_COLUMNS)
"""The per-iteration columns :func:`summarize` reads whole (a streamed run reads only these back; its integer
figures come from :func:`iteration_counts_of_file`)."""


def build_result(output, config: dict) -> RunResult:
    """Turn :class:`sim.core.engine.SimOutput` into a :class:`RunResult` (a streamed run's iterations stay in
    their Parquet file; its summary comes from what the recorder kept of them in memory: the integer figures
    and totals, and :data:`SUMMARY_ITERATION_COLUMNS` whole, :class:`sim.results.recorder.IterationRecorder`).

    A streamed run without KV tiers keeps its requests as a :class:`sim.results.columns.ColumnTable`
    (:meth:`sim.core.engine.SimOutput.request_table`, where its records allow): neither the summary nor
    :func:`analysis.results.write_run` then imports pandas (issue 32); :attr:`RunResult.requests` is the
    DataFrame :meth:`sim.core.engine.SimOutput.requests_frame` gives."""
    streamed = output.recorder.path
    tier_occupancy = getattr(output, "tier_occupancy", None)
    requests = (output.request_table() if streamed is not None and not tier_occupancy
                and hasattr(output, "request_table") else None)
    if requests is None:
        requests = output.requests_frame()
    tiers = None
    if tier_occupancy:
        import pandas as pd
        tiers = pd.DataFrame(tier_occupancy)
    if streamed is None:
        iterations = output.iterations_frame()
        return RunResult(requests, iterations, summarize(requests, iterations, output.counters, config), config,
                         tbt_samples=output.counters.get("tbt_samples"), tiers=tiers)
    # the file's figures as the recorder kept them while writing it (iteration_counts_of_file's values, and
    # read_column's arrays, without reading the file back)
    recorder = output.recorder
    counts = recorder.summary_figures()
    columns = ColumnTable({name: recorder.column(name) for name in SUMMARY_ITERATION_COLUMNS})
    summary = summarize(requests, columns, output.counters, config, counts)
    del columns
    return RunResult(requests, streamed, summary, config, tbt_samples=output.counters.get("tbt_samples"), tiers=tiers)


def ttft_growth(requests: pd.DataFrame) -> float:
    """Slope of TTFT over arrival time in the steady-state window (s/s, module docstring); 0.0 for tiny runs.

    Args:
        requests: per-request table (``arrival_at_us``, ``ttft_us``, ``status``; a DataFrame or a
            :class:`sim.results.columns.ColumnTable`).
    """
    finished = _array(requests, "status") == "finished"
    return ttft_growth_of(_array(requests, "arrival_at_us").astype(float)[finished],
                          _array(requests, "ttft_us").astype(float)[finished])


def ttft_growth_of(arrivals_us: np.ndarray, ttft_us: np.ndarray) -> float:
    """:func:`ttft_growth` of the finished requests' arrivals and TTFTs (us, in request order)."""
    arrivals_us = np.asarray(arrivals_us, dtype=float)
    ttft_us = np.asarray(ttft_us, dtype=float)
    defined = np.isfinite(ttft_us)
    arrivals_us, ttft_us = arrivals_us[defined], ttft_us[defined]
    if len(arrivals_us) < 8:
        return 0.0
    steady = arrivals_us >= np.sort(arrivals_us)[len(arrivals_us) // 4]
    x_us, y_us = arrivals_us[steady], ttft_us[steady]
    spread = x_us - x_us.mean()
    # exactly rounded sums (math.fsum), not np.dot: BLAS splits a dot product over its threads, so its last
    # bits depend on the machine's core count (OpenBLAS, 14,000 terms: 1 vs 2 threads differ)
    denominator = math.fsum(spread * spread)
    return math.fsum(spread * (y_us - y_us.mean())) / denominator if denominator > 0 else 0.0
