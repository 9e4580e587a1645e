"""Run results: per-request and per-iteration tables, the summary, and the run directory on disk.

Run directory layout (``kvsim simulate --out DIR``)::

    DIR/requests.parquet    one row per request   (sim.core.request.REQUEST_COLUMNS; times in us)
    DIR/iterations.parquet  one row per iteration (sim.core.engine.ITERATION_COLUMNS; times in us)
    DIR/summary.json        the summary below (units in every key), strict JSON: a figure that cannot be computed
                            (a percentile with no request served, a ratio over zero) is null, read back as NaN
                            (sim.results.json_text)
    DIR/config.json         the run configuration, derived sizes and the trace/profile sources
    DIR/tiers.parquet       only with --kv-tier: pages and bytes cached in HBM and resident per tier over time,
                            one row per change (sim.core.tier_charges.TierCharges.occupancy_columns; time in us)

Percentiles are linear-interpolated (numpy default) over finished requests.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from sim.results.columns import ColumnTable, write_parquet
from sim.results.json_text import nan_for_null, strict_json_text
from sim.results.summary import (SUMMARY_ITERATION_COLUMNS, RunResult, _column, _percentiles,  # noqa: F401
                                 _prefix_summary, _tbt_summary, build_result, iteration_counts,
                                 iteration_counts_of_file, summarize, tier_hit_ratios,
                                 ROOFLINE_CAVEAT, compute_model_entry, compute_model_text)

if TYPE_CHECKING:
    import pandas as pd

RUN_FILES = ("requests.parquet", "iterations.parquet", "summary.json", "config.json")
OPTIONAL_RUN_FILES = ("tiers.parquet",)
"""Written only by some runs (a run without them loads as before)."""


def goodput_figures(requests: pd.DataFrame, slos, makespan_s: float, excluded: int = 0) -> dict:
    """SLO attainment and goodput of a run under the per-request objectives of ``slos``
    (:mod:`analysis.planning.slo`: DistServe, OSDI'24; vLLM issue 9338); nothing when there are none.

    Returns:
        ``slo_met_requests``: requests that finished and met every per-request objective;
        ``slo_attainment``: that count over every request of the table less ``excluded`` (rejected and
        unfinished requests count as misses); ``goodput_req_per_s``: that count per second of ``makespan_s``
        (the span of ``throughput_req_per_s``, first arrival to last completion; 0 for an empty span).
    """
    from analysis.planning.slo import attainment_of, per_request_slos

    if not per_request_slos(slos):
        return {}
    met, share = attainment_of(requests, per_request_slos(slos), excluded)
    return {"slo_met_requests": met, "slo_attainment": share,
            "goodput_req_per_s": met / makespan_s if makespan_s > 0 else 0.0}


def with_goodput(summary: dict, requests: pd.DataFrame, slos) -> dict:
    """``summary`` followed by :func:`goodput_figures` of ``requests`` over its ``makespan_s`` (unchanged when
    ``slos`` holds no per-request objective)."""
    return {**summary, **goodput_figures(requests, slos, summary.get("makespan_s", 0.0))}


def write_run(result: RunResult, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Write a run directory (layout in the module docstring). Requests held as a
    :class:`sim.results.columns.ColumnTable` (a fresh streamed run's) are written without pandas
    (:func:`sim.results.columns.write_parquet`: the same table, without pandas' schema metadata).

    The directory is marked as a kvsim result (``analysis.marker.RESULT_MARKER``), as the command line's are, so
    that ``kvsim simulate --out DIR --force`` may replace it.

    Raises:
        FileExistsError: if ``out_dir`` already holds run files and ``overwrite`` is false; or, with
            ``overwrite``, when its ``summary.json`` / ``config.json`` may be a user's own (neither kvsim's marker
            nor the four run files: a hand-written ``summary.json`` is never replaced).
    """
    from analysis.marker import RESULT_MARKER, write_marker
    out = Path(out_dir)
    streamed = result.iterations_file
    own = streamed is not None and streamed.exists() and streamed.resolve() == (out / "iterations.parquet").resolve()
    own_requests = (isinstance(result._requests, (str, Path)) and Path(result._requests).exists()
                    and Path(result._requests).resolve() == (out / "requests.parquet").resolve())
    existing = [name for name in RUN_FILES + OPTIONAL_RUN_FILES if (out / name).exists() and not (own and name == "iterations.parquet")
                and not (own_requests and name == "requests.parquet")]
    ours = (out / RESULT_MARKER).is_file() or all((out / name).exists() for name in RUN_FILES)
    hand_written = [name for name in existing if name.endswith(".json")]   # (a replay streams its tables in first)
    if hand_written and not ours:
        raise FileExistsError(f"{out} holds {', '.join(hand_written)} but is not a kvsim run (no {RESULT_MARKER} "
                              "marker, not the four run files): kvsim does not replace them, overwrite or not; choose "
                              "another directory")
    if existing and not overwrite:
        raise FileExistsError(f"{out} already holds a kvsim run ({', '.join(existing)}); choose another directory or "
                              "replace it (overwrite=True; on the command line --force)")
    out.mkdir(parents=True, exist_ok=True)
    if isinstance(result._requests, ColumnTable):     # a fresh streamed run's (build_result): without pandas
        write_parquet(result._requests, out / "requests.parquet")
    elif not own_requests:   # a merged run's are already there (sim.cluster.replica_merge.write_merged_requests)
        result.requests.to_parquet(out / "requests.parquet", index=False)
    if not own:        # a streamed run's records are already there
        result.iterations.to_parquet(out / "iterations.parquet", index=False)
    _write_tiers(result, out / "tiers.parquet")
    (out / "summary.json").write_text(strict_json_text(result.summary, indent=2) + "\n")   # NaN as null
    (out / "config.json").write_text(json.dumps(result.config, indent=2, default=str) + "\n")
    write_marker(out)
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
                tables[name] = json.loads((run / name).read_text())
                if name == "summary.json":
                    tables[name] = nan_for_null(tables[name])     # a figure written as null for NaN
        except (ValueError, OSError) as exc:     # JSONDecodeError and Arrow errors are ValueErrors/OSErrors
            raise ValueError(f"{run / name}: unreadable or corrupt ({exc})") from None
        if name.endswith(".json") and not isinstance(tables[name], dict):
            raise ValueError(f"{run / name}: expected a JSON object, got a JSON {type(tables[name]).__name__}")
    tiers = run / "tiers.parquet"
    if tiers.is_file():
        try:
            import pyarrow.parquet as pq
            pq.read_metadata(tiers)
        except (ValueError, OSError) as exc:
            raise ValueError(f"{tiers}: unreadable or corrupt ({exc})") from None
    return RunResult(tables["requests.parquet"], tables["iterations.parquet"], tables["summary.json"],
                     tables["config.json"], run, tiers=tiers if tiers.is_file() else None)


def _write_tiers(result: RunResult, target: Path) -> None:
    """Write the run's tier occupancy table to ``target`` (unless it is read from there); a run without one
    leaves no ``tiers.parquet`` behind (an overwritten tiered run's)."""
    source = result._tiers
    if isinstance(source, (str, Path)) and Path(source).exists() and Path(source).resolve() == target.resolve():
        return
    if result.tiers is not None:
        result.tiers.to_parquet(target, index=False)
    elif target.exists():
        target.unlink()
