"""Run results: per-request and per-iteration tables, the summary, and the run directory on disk.

Run directory layout (``kvsim simulate --out DIR``)::

    DIR/requests.parquet    one row per request   (sim.core.request.REQUEST_COLUMNS; times in us)
    DIR/iterations.parquet  one row per iteration (sim.core.engine.ITERATION_COLUMNS; times in us)
    DIR/summary.json        the summary below (units in every key)
    DIR/config.json         the run configuration, derived sizes and the trace/profile sources

Percentiles are linear-interpolated (numpy default) over finished requests.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from sim.results.summary import (SUMMARY_ITERATION_COLUMNS, RunResult, _column, _percentiles,  # noqa: F401
                                 _prefix_summary, _tbt_summary, build_result, iteration_counts,
                                 iteration_counts_of_file, summarize)

RUN_FILES = ("requests.parquet", "iterations.parquet", "summary.json", "config.json")


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
    if not own_requests:        # a merged run's requests are already there (sim.cluster.replica_merge.write_merged_requests)
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
