"""Bounded-memory merge of replicas simulated to files (issue 18: a week of traffic over 100 replicas).

A replica simulated with a records directory (:func:`sim.cluster.routing.simulate_replicas`) leaves its records on disk
and hands back only its summary and the paths of its *parts* (:func:`save_replica_parts`):

* ``replica-R.parquet``: its iteration records (streamed by :class:`sim.results.recorder.IterationRecorder`);
* ``replica-R.requests.parquet``: its per-request table;
* ``replica-R.duration-values.npy`` / ``replica-R.duration-cum.npy``: its distinct finite iteration durations,
  sorted, and the cumulative count up to each (a replica's tens of millions of iterations take a few
  hundred thousand distinct durations);
* ``replica-R.tbt-gaps.npy`` / ``replica-R.tbt-cum.npy``: its distinct TBT gaps, sorted, and the cumulative
  token count up to each (a gap of a fast-forwarded decode run stands for one token per request of its batch);
* small figures: iteration counts and totals, finite durations, iterations with a stall, TBT tokens and the
  exactly rounded sum of its TBT gaps over tokens.

:func:`merge_replica_parts` computes the merged summary from these without concatenating the replicas'
tables, and gives exactly the numbers of :func:`sim.cluster.routing.merge_replicas` on the same replicas in memory:

* **percentiles** of the iteration time (numpy's linear interpolation, as :func:`analysis.results.summarize`)
  and of TBT (nearest rank over tokens, as :func:`sim.results.records.tbt_stats_us`) need one or two order statistics
  of the union of the replicas' values: :func:`kth_smallest` finds the k-th smallest value across the sorted
  per-replica arrays (memory-mapped) by a binary search over the ordered 64-bit keys of the float values,
  counting values at most a candidate with ``np.searchsorted`` in each array (about 64 rounds of R searches);
  :func:`linear_percentile` applies numpy's interpolation to them;
* **the iteration-time mean and the stall total** are numpy's pairwise sums over the replicas' columns
  concatenated in replica order: :func:`pairwise_sum` walks the same summation tree and hands each subtree of
  up to 2^16 values to ``np.add.reduce``, reading the columns one replica at a time;
* **request figures** read a few columns at a time from the replicas' request files, in request-id order (as
  the merged table is sorted), never the whole table;
* counts, totals and maxima add up or take the largest.

The merged TBT mean is ``fsum over replicas of (fsum over the replica's distinct gaps of gap x tokens) / tokens``
in both merges (:func:`sim.results.records.tbt_gap_token_sum_us`; the dot product over the concatenated gaps it replaced
rounded differently with the BLAS thread count).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from sim.results.columns import (Concatenation, _key, _value, distinct_counts, kth_smallest,  # noqa: F401 (re-exported)
                                 linear_percentile, pairwise_sum, read_column, row_groups)
from sim.results.records import tbt_distinct_us, tbt_gap_token_sum_us
from sim.results.json_text import strict_json_text
from sim.units import US_PER_MS, US_PER_S

# ---- a replica's parts ---------------------------------------------------------------------------------

def tbt_token_sum(samples) -> float:
    """Sum over a replica's TBT tokens of their gaps (us), :func:`sim.results.records.tbt_gap_token_sum_us` over its
    distinct gaps: ``(single gaps, run gaps, run weights)`` as :attr:`analysis.results.RunResult.tbt_samples`."""
    singles, gaps, weights = samples
    return tbt_gap_token_sum_us(*tbt_distinct_us(singles, [(gaps, weights)]))


def merged_tbt_mean(sums: list[float], tokens: int) -> float:
    """The merged TBT mean (us) from the replicas' :func:`tbt_token_sum`."""
    return math.fsum(sums) / tokens if tokens else float("nan")


RECORD_FILE_KEYS = ("requests", "iterations", "duration_values", "duration_cum", "tbt_gaps", "tbt_cum")
"""The entries of a replica's parts that are files (written into ``parts.json`` relative to its directory)."""


def check_replica_parts(parts: dict, directory: str | Path, label: str) -> dict:
    """A replica's parts as read from ``parts.json`` with its files resolved against ``directory`` (absolute
    paths, from records written before names were relative, are kept) and checked readable: every figure the
    merge needs present, the Parquet files' footers and the ``.npy`` headers read.

    Raises:
        ValueError: a missing entry or file, or an unreadable one; the message names ``label`` and the file.
    """
    import pyarrow.parquet as pq

    required = RECORD_FILE_KEYS + ("requests_count", "counts", "durations_finite", "stall_positive", "tbt")
    missing = [key for key in required if key not in parts]
    if missing:
        raise ValueError(f"{label}: not a complete replica record (no {', '.join(missing)}); delete it to simulate "
                         "that replica again")
    resolved = dict(parts)
    for key in RECORD_FILE_KEYS:
        if key.startswith("tbt_") and not parts["tbt"]:
            continue
        path = Path(parts[key])
        path = path if path.is_absolute() else Path(directory) / path
        resolved[key] = str(path)
        try:
            if path.suffix == ".npy":
                np.load(path, mmap_mode="r")
            else:
                pq.read_metadata(path)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{label}: its file {path} cannot be read ({type(exc).__name__}: {exc}); delete "
                             f"{label} to simulate that replica again") from None
    return resolved


def save_replica_parts(result, prefix: str | Path, keep_iterations: bool = True,
                       trace_digest: str | None = None) -> dict:
    """Write a replica's parts next to its streamed iteration file (module docstring) and return their paths
    and figures. ``result``: the replica's :class:`analysis.results.RunResult` with ``iterations_file`` and
    ``tbt_samples``; ``keep_iterations`` false: the iteration file is replaced by ``PREFIX.columns.parquet``
    holding only the columns the merge reads (``duration_us``, ``sync_stall_us``); ``trace_digest``
    (:func:`sim.cluster.routing.trace_digest` of the replica's rows) is kept so that a resumed run can tell its own records."""
    from sim.results.summary import iteration_counts_of_file

    prefix = str(prefix)
    parts = {"requests": f"{prefix}.requests.parquet", "iterations": str(result.iterations_file),
             "duration_values": f"{prefix}.duration-values.npy", "duration_cum": f"{prefix}.duration-cum.npy",
             "tbt_gaps": f"{prefix}.tbt-gaps.npy",
             "tbt_cum": f"{prefix}.tbt-cum.npy", "requests_count": len(result.requests), "trace_digest": trace_digest}
    requests = result.requests
    if not requests["request_id"].is_monotonic_increasing:      # the merged table is read in request-id order
        requests = requests.sort_values("request_id", kind="stable", ignore_index=True)
    requests.to_parquet(parts["requests"], index=False)
    del requests
    result.requests = None          # the caller keeps the light result only: memory back before the TBT sort
    parts["counts"] = iteration_counts_of_file(result.iterations_file)
    durations = read_column(result.iterations_file, "duration_us")
    finite = durations[np.isfinite(durations)] if not np.isfinite(durations).all() else durations
    del durations
    parts["durations_finite"] = len(finite)
    finite.sort()
    distinct, cumulative = distinct_counts(finite)
    del finite
    np.save(parts["duration_values"], distinct)
    np.save(parts["duration_cum"], cumulative)
    del distinct, cumulative
    stalls = read_column(result.iterations_file, "sync_stall_us")
    parts["stall_positive"] = int((stalls > 0).sum())
    del stalls
    samples, result.tbt_samples = result.tbt_samples, None
    parts["tbt"] = samples is not None
    if samples is not None:
        singles, gaps, weights = samples
        distinct, tokens = tbt_distinct_us(singles, [(gaps, weights)])    # one sort for the sum and the files
        del samples, singles, gaps, weights
        parts["tbt_sum_us"] = tbt_gap_token_sum_us(distinct, tokens)
        parts["tbt_tokens"] = int(tokens.sum())
        np.save(parts["tbt_gaps"], distinct)
        np.save(parts["tbt_cum"], np.cumsum(tokens))
        del distinct, tokens
    if not keep_iterations:
        parts["iterations"] = _keep_columns(result.iterations_file, f"{prefix}.columns.parquet",
                                            ["duration_us", "sync_stall_us"])
    # the parts, summary and config (strict JSON: NaN as null): a merge can be redone from the directory alone
    # written last, and whole or not at all: a run resumed after a stop (sim.cluster.routing) trusts a record that has it
    partial = Path(f"{prefix}.parts.json.partial")
    # file names relative to the records directory: the directory can be moved or copied and resumed
    saved = {key: (Path(value).name if key in RECORD_FILE_KEYS else value) for key, value in parts.items()}
    partial.write_text(strict_json_text({"parts": saved, "summary": result.summary, "config": result.config},
                                        default=str))
    partial.replace(f"{prefix}.parts.json")
    return parts


def _keep_columns(path: str | Path, target: str, columns: list[str]) -> str:
    """Copy ``columns`` of a Parquet file to ``target`` row group by row group and remove the file."""
    import pyarrow.parquet as pq

    source = pq.ParquetFile(path)
    writer = None
    try:
        for group in range(source.num_row_groups):
            table = source.read_row_group(group, columns=columns)
            writer = writer or pq.ParquetWriter(target, table.schema)
            writer.write_table(table)
        if writer is None:
            source.schema_arrow.empty_table().select(columns).to_pandas().to_parquet(target, index=False)
    finally:
        if writer is not None:
            writer.close()
    Path(path).unlink()
    return target


# ---- the merge -----------------------------------------------------------------------------------------

def merged_counts(parts: list[dict]) -> dict:
    """Replicas' iteration figures (:func:`analysis.results.iteration_counts_of_file`) merged: counts and
    totals add up, maxima take the largest."""
    merged = dict(parts[0])
    for part in parts[1:]:
        for key, value in part.items():
            merged[key] = max(merged[key], value) if key.endswith("_max") else merged[key] + value
    return merged


def _positions(parts: list[dict]) -> list[np.ndarray]:
    """Per replica, the rows of the merged request table (sorted by request id) its rows go to: the request
    id itself when the ids are 0..n-1 over the replicas (a whole trace), else its rank among them (a merge of
    some of a run's replicas)."""
    ids = [pd.read_parquet(p["requests"], columns=["request_id"])["request_id"].to_numpy() for p in parts]
    total = sum(len(i) for i in ids)
    seen = np.zeros(total, dtype=bool)
    dense = all(not len(i) or (i.min() >= 0 and i.max() < total) for i in ids)
    if dense:
        for index in ids:
            seen[index] = True
    if dense and seen.all():
        return ids
    union = np.sort(np.concatenate(ids))
    if len(union) > 1 and (union[1:] == union[:-1]).any():
        raise ValueError("a request id appears in more than one replica's requests")
    return [np.searchsorted(union, index) for index in ids]


def _request_columns(parts: list[dict], names: list[str], positions: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Columns of the merged request table in request-id order, read one replica at a time; a column a
    replica's table lacks is absent from the result."""
    import pyarrow.parquet as pq

    present = set(pq.read_schema(parts[0]["requests"]).names)
    total = sum(len(i) for i in positions)
    out = {}
    for name in (n for n in names if n in present):
        column = None
        for part, index in zip(parts, positions):
            values = pd.read_parquet(part["requests"], columns=[name])[name].to_numpy()
            if column is None:
                column = np.empty(total, dtype=values.dtype if values.dtype != object else object)
            elif column.dtype != values.dtype:
                column = column.astype(np.result_type(column.dtype, values.dtype)
                                       if values.dtype != object and column.dtype != object else object)
            column[index] = values
        out[name] = column if column is not None else np.empty(0)
    return out


def _status_masks(parts: list[dict], positions: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Finished and rejected requests of the merged table (request-id order), one replica's status at a time."""
    total = sum(len(i) for i in positions)
    finished, rejected = np.zeros(total, dtype=bool), np.zeros(total, dtype=bool)
    for part, index in zip(parts, positions):
        status = pd.read_parquet(part["requests"], columns=["status"])["status"]
        finished[index] = (status == "finished").to_numpy(dtype=bool)
        rejected[index] = (status == "rejected").to_numpy(dtype=bool)
    return finished, rejected


def merge_replica_parts(results: list, parts: list[dict], config) -> dict:
    """The merged summary of replicas simulated to files, exactly :func:`sim.cluster.routing.merge_replicas`'s
    (module docstring). ``results``: the replicas' light :class:`analysis.results.RunResult` (summary and
    config), ``parts``: their :func:`save_replica_parts`, both for the replicas that received requests, in
    replica order."""
    from sim.results.summary import ttft_growth_of
    from sim.results.summary import _column, _percentiles, summarize

    total = sum(p["requests_count"] for p in parts)
    counts = merged_counts([p["counts"] for p in parts])
    zero = {"sync_map_page_groups": 0, "sync_unmap_page_groups": 0, "bg_map_page_groups": 0,
            "bg_unmap_page_groups": 0, "pool_page_groups": 0}
    if all(p["tbt"] for p in parts):
        zero.update(_merged_tbt(parts))
    import pyarrow.parquet as pq
    schema = pq.read_schema(parts[0]["requests"])
    empty_requests = schema.empty_table().to_pandas()
    empty_iterations = pd.DataFrame({"duration_us": np.zeros(0), "sync_stall_us": np.zeros(0)})
    # key order and the figures of counters and counts; request and iteration figures replaced below
    summary = summarize(empty_requests, empty_iterations, zero, config.to_dict(), counts)

    positions = _positions(parts)
    finished, rejected = _status_masks(parts, positions)
    columns = _request_columns(parts, ["arrival_at_us", "completion_at_us", "output_tokens", "prompt_tokens"],
                               positions)
    arrival, completion = columns["arrival_at_us"], columns["completion_at_us"]
    n_finished = int(finished.sum())
    start_us = float(pd.Series(arrival).min()) if total else 0.0
    end_us = float(pd.Series(completion[finished]).max()) if n_finished else start_us
    span_s = max(end_us - start_us, 1e-9) / US_PER_S
    output = pd.Series(columns["output_tokens"][finished])
    prompt = pd.Series(columns["prompt_tokens"][finished])
    del columns, completion
    summary.update({"requests": int(total), "finished": n_finished, "rejected": int(rejected.sum()),
                    "makespan_s": span_s, "throughput_req_per_s": n_finished / span_s,
                    "output_tokens_per_s": float(output.sum()) / span_s,
                    "total_tokens_per_s": float((prompt + output).sum()) / span_s})
    del prompt
    figures = {}
    for name, scale, unit in (("ttft", US_PER_MS, "ms"), ("tpot", US_PER_MS, "ms"), ("e2e", US_PER_S, "s"),
                              ("sched_delay", US_PER_MS, "ms")):
        column = _request_columns(parts, [f"{name}_us"], positions).get(f"{name}_us")
        values = pd.Series(column[finished]) if column is not None else _column(pd.DataFrame(index=range(n_finished)),
                                                                                f"{name}_us")
        figures.update(_percentiles(values, name, scale, unit))
        if name == "ttft":
            summary["ttft_growth_s_per_s"] = ttft_growth_of(arrival[finished], column[finished])
        if name == "e2e":
            figures.update(_percentiles(values / output, "e2e_per_token", US_PER_MS, "ms"))
        del column, values
    del arrival, output
    summary.update(figures)
    summary.update(_iteration_figures(parts))
    columns = _request_columns(parts, ["preemptions", "recomputed_tokens"], positions)
    summary["preemptions"] = int(pd.Series(columns["preemptions"]).sum())
    summary["recomputed_tokens"] = int(pd.Series(columns["recomputed_tokens"]).sum()) \
        if "recomputed_tokens" in columns else 0
    del columns
    if "reject_reason" in schema.names:
        reasons = _rejected_reasons(parts, rejected, positions)
        summary["rejected_by_reason"] = {str(k): int(v) for k, v in reasons.value_counts().items()}
    if config.prefix_caching:     # the prefix cache's hit ratio over every replica's first admissions, as in memory
        from sim.results.summary import tier_hit_ratios
        summary.update(tier_hit_ratios(pd.DataFrame(_request_columns(
            parts, ["prefix_hit_tokens", "dram_hit_tokens", "ssd_hit_tokens", "prompt_tokens",
                    "first_scheduled_at_us"], positions))))
    return summary


def _rejected_reasons(parts: list[dict], rejected: np.ndarray, positions: list[np.ndarray]) -> pd.Series:
    """The ``reject_reason`` of the rejected requests, in request-id order, as the merged table holds it."""
    pieces = []
    for part, index in zip(parts, positions):
        table = pd.read_parquet(part["requests"], columns=["request_id", "reject_reason"])
        pieces.append(table[rejected[index]])
    merged = pd.concat(pieces, ignore_index=True).sort_values("request_id", kind="stable", ignore_index=True)
    return merged["reject_reason"]


def _iteration_figures(parts: list[dict]) -> dict:
    """Iteration-time percentiles and mean, stall total and count over every replica's iterations."""
    out = {}
    finite = sum(p["durations_finite"] for p in parts)
    if finite:
        values = [np.load(p["duration_values"], mmap_mode="r") for p in parts]
        cumulative = [np.load(p["duration_cum"], mmap_mode="r") for p in parts]
        kth = lambda index: kth_smallest(values, index + 1, cumulative)     # noqa: E731
        for q in (50, 90, 99):
            out[f"iteration_p{q}_ms"] = float(linear_percentile(finite, q, kth) / US_PER_MS)
        del values, cumulative
        if all(p["durations_finite"] == p["counts"]["iterations"] for p in parts):     # row group by row group
            durations = _chained([row_groups(p["iterations"], "duration_us") for p in parts])
        else:
            def finite_durations(path):
                def load():
                    values = read_column(path, "duration_us")
                    return values[np.isfinite(values)]
                return load
            durations = Concatenation([finite_durations(p["iterations"]) for p in parts],
                                      [p["durations_finite"] for p in parts])
        out["iteration_mean_ms"] = float(np.float64(pairwise_sum(finite, durations.take)) / finite / US_PER_MS)
        del durations
    else:
        out.update({f"iteration_{s}_ms": float("nan") for s in ("p50", "p90", "p99", "mean")})
    column = _chained([row_groups(p["iterations"], "sync_stall_us", nan_as_zero=True) for p in parts])
    out["sync_stall_total_ms"] = float(pairwise_sum(column.length, column.take) / US_PER_MS)
    out["iterations_with_stall"] = int(sum(p["stall_positive"] for p in parts))
    return out


def _chained(columns: list[Concatenation]) -> Concatenation:
    """Several concatenations laid end to end (the replicas' row groups, in replica order)."""
    return Concatenation([loader for c in columns for loader in c.loaders], [n for c in columns for n in c.lengths])


def _merged_tbt(parts: list[dict]) -> dict:
    """:func:`sim.results.records.tbt_stats_us` of every replica's TBT tokens (the mean as :func:`merged_tbt_mean`)."""
    keys = ("tbt_p50_us", "tbt_p90_us", "tbt_p99_us", "tbt_max_us", "tbt_mean_us")
    total = sum(p["tbt_tokens"] for p in parts)
    if not total:
        return {**dict.fromkeys(keys, float("nan")), "tbt_tokens": 0}
    gaps = [np.load(p["tbt_gaps"], mmap_mode="r") for p in parts]
    cumulative = [np.load(p["tbt_cum"], mmap_mode="r") for p in parts]
    out = {}
    for q in (50, 90, 99):         # the smallest gap whose cumulative token count reaches q / 100 * total
        out[f"tbt_p{q}_us"] = kth_smallest(gaps, max(1, math.ceil(q / 100 * total)), cumulative)
    out["tbt_max_us"] = max(float(g[-1]) for g in gaps if len(g))
    out["tbt_mean_us"] = merged_tbt_mean([p["tbt_sum_us"] for p in parts], total)
    out["tbt_tokens"] = total
    return out


# ---- merged tables on disk -----------------------------------------------------------------------------

def _common_schema(schemas: list):
    """One schema for the replicas' tables (same columns, in the same order): a column that is integer in one
    replica and floating in another becomes float64 (``first_scheduled_at_us`` is int64 in a replica whose only
    request was scheduled at the clock's integer start, 0, and double elsewhere), and a column of nulls only (a
    replica without requests) takes the type of the others. Raises ``ValueError`` naming a column whose types
    cannot be reconciled."""
    import pyarrow as pa

    fields = []
    for position, field in enumerate(schemas[0]):
        types = {schema.field(position).type for schema in schemas} - {pa.null()}
        if len(types) > 1 and all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in types):
            types = {pa.float64()}
        if len(types) > 1:
            raise ValueError(f"replica tables disagree on the type of column {field.name!r}: "
                             f"{', '.join(sorted(map(str, types)))}")
        fields.append(field.with_type(types.pop() if types else pa.null()))
    return pa.schema(fields)


def write_merged_iterations(results: list, path: str | Path) -> Path:
    """Every replica's iteration table with a ``replica`` column, copied into ``path`` row group by row group
    (the values of :func:`sim.cluster.routing.merged_requests`' iteration counterpart; memory: one row group)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def schema_of(result):
        if result.iterations_file is None:
            return pa.Schema.from_pandas(result.iterations, preserve_index=False).remove_metadata()
        return pq.read_schema(result.iterations_file).remove_metadata()

    present = [(replica, result) for replica, result in enumerate(results) if result is not None]
    schema = _common_schema([schema_of(result) for _, result in present]) if present else None
    writer = None
    try:
        for replica, result in present:
            source = result.iterations_file
            if source is None:          # in memory
                tables = [pa.Table.from_pandas(result.iterations, preserve_index=False)]
            else:
                parquet = pq.ParquetFile(source)
                tables = (parquet.read_row_group(group) for group in range(parquet.num_row_groups))
            for table in tables:
                table = _with_replica(table.replace_schema_metadata(None).cast(schema), replica)
                writer = writer or pq.ParquetWriter(path, table.schema)
                writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()
    return Path(path)


def _with_replica(table, replica: int):
    """``table`` (a pyarrow Table) with an int64 ``replica`` column of ``replica`` appended."""
    import pyarrow as pa
    return table.append_column("replica", pa.array(np.full(len(table), replica, dtype=np.int64)))


def write_merged_requests(results: list, path: str | Path, window: int = 1 << 20) -> Path:
    """The merged per-request table (:func:`sim.cluster.routing.merged_requests`: every replica's rows with a
    ``replica`` column, sorted by request id) written to ``path`` one window of request ids at a time, from
    the replicas' request files (each sorted by request id), never whole."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    present = [(r, res) for r, res in enumerate(results) if res is not None]
    schema = _common_schema([pq.read_schema(res.parts["requests"]).remove_metadata() for _, res in present]) \
        if present else None
    batches = [pq.ParquetFile(res.parts["requests"]).iter_batches(batch_size=1 << 14) for _, res in present]
    pending = [None] * len(present)
    total = sum(res.parts["requests_count"] for _, res in present)
    writer = None
    try:
        for start in range(0, max(total, 1), window):
            end, pieces = start + window, []
            for i, (replica, _) in enumerate(present):
                taken = []
                while True:
                    if pending[i] is None:
                        batch = next(batches[i], None)
                        if batch is None:
                            break
                        pending[i] = pa.Table.from_batches([batch]).replace_schema_metadata(None).cast(schema)
                    ids = pending[i]["request_id"].to_numpy()
                    inside = int(np.searchsorted(ids, end, side="left"))
                    taken.append(pending[i].slice(0, inside))
                    pending[i] = pending[i].slice(inside) if inside < len(ids) else None
                    if pending[i] is not None:
                        break
                pieces.extend(_with_replica(piece, replica) for piece in taken)
            table = pa.concat_tables(pieces).replace_schema_metadata(None)
            table = table.take(pc.sort_indices(table, sort_keys=[("request_id", "ascending")]))
            writer = writer or pq.ParquetWriter(path, table.schema)
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()
    return Path(path)
