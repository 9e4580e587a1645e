"""``kvsim report RUN_DIR [RUN_DIR ...] --out report.html [--force]``: the HTML report of one or more runs.

Errors (a directory that is not a run, an unreadable table, an existing --out) raise ``ValueError`` or
``OSError`` naming the path; ``cli.main`` prints them as one ``kvsim: error: ...`` line and exits 2.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def register(subparsers) -> argparse.ArgumentParser:
    """Adds the ``report`` command to ``subparsers`` (the object ``ArgumentParser.add_subparsers()`` returns).

    Returns:
        The ``report`` parser.
    """
    parser = subparsers.add_parser(
        "report", help="write an interactive HTML report of one or more run directories",
        description="One self-contained HTML file (plotly.js embedded, works offline): latency with "
                    "synchronous-mapping stalls, batch size, page pool, tail waste, TTFT/TPOT/E2E CDFs, "
                    "map/unmap operations and the summary. Several run directories are compared side by side.")
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", type=Path,
                        help="run directory written by 'kvsim simulate --out' (one colour each)")
    parser.add_argument("--out", required=True, help="HTML file to write, e.g. report.html")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing --out file that is a kvsim report (any other file is refused)")
    parser.set_defaults(func=cmd_report)
    return parser


def load_runs(paths: list[Path]) -> list:
    """Load each run directory; a damaged one raises ``ValueError`` naming it.

    Raises:
        FileNotFoundError: a path is not a run directory (names the missing file).
        ValueError: a run's files cannot be read or lack a column or key the report needs.
    """
    from analysis.results import load_run
    seen: dict = {}
    for path in paths:                # the same run twice would be drawn twice under two labels
        key = os.path.realpath(path)
        if key in seen:
            raise ValueError(f"{path}: the same run as {seen[key]}, given twice; give each run once")
        seen[key] = path
    runs = []
    for path in paths:
        try:
            runs.append(load_run(path))
        except OSError:
            raise
        except Exception as exc:  # pyarrow / json errors: name the run, not the library
            raise ValueError(f"{path}: cannot read the run ({type(exc).__name__}: {exc})") from None
        check_report_run(Path(path), runs[-1])
    return runs


# what the report's figures read (analysis.figures): column -> the values it must hold
REPORT_ITERATION_COLUMNS = {
    "iteration": "count", "start_at_us": "time", "duration_us": "time", "sync_stall_us": "time",
    "sync_map_page_groups": "count", "bg_map_page_groups": "count", "unmap_page_groups": "count",
    "batch_size": "count", "mapped_page_groups": "count", "used_page_groups": "count", "free_page_groups": "count",
    "deferred_page_groups": "count", "tail_waste_bytes": "count"}
REPORT_REQUEST_COLUMNS = {"ttft_us": "latency", "tpot_us": "latency", "e2e_us": "latency", "status": "text"}
REPORT_SUMMARY_COUNTS = ("requests", "iterations", "rejected")


def check_report_run(path: Path, run) -> None:
    """The columns and summary figures the report draws, each present and of its kind: counts and times finite
    numbers >= 0 (us), latencies numbers >= 0 or NaN (a request not finished), ``status`` text; the summary's
    ``requests``, ``iterations`` and ``rejected`` whole numbers >= 0.

    Raises:
        ValueError: one line naming the run's file, the column or field, and the first bad row and value.
    """
    import numpy as np
    import pandas as pd

    for name, table, columns in (("iterations.parquet", run.iterations, REPORT_ITERATION_COLUMNS),
                                 ("requests.parquet", run.requests, REPORT_REQUEST_COLUMNS)):
        missing = [column for column in columns if column not in table.columns]
        if missing:
            raise ValueError(f"{path / name}: missing column(s) {', '.join(missing)} that the report draws (written "
                             "by an older kvsim?)")
        for column, kind in columns.items():
            values = table[column]
            if kind == "text":
                if not all(isinstance(v, str) for v in values):
                    raise ValueError(f"{path / name}: column {column} must hold text")
                continue
            if not pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
                raise ValueError(f"{path / name}: column {column} must hold numbers, got {values.dtype} values")
            numbers = values.to_numpy(dtype=np.float64)
            bad = (numbers < 0) | (np.isinf(numbers) if kind == "latency" else ~np.isfinite(numbers))
            if bad.any():
                row = int(np.argmax(bad))
                what = "numbers >= 0 or NaN" if kind == "latency" else "finite numbers >= 0"
                value = values.iloc[row]
                raise ValueError(f"{path / name}: row {row + 1}: column {column} must hold {what}, got "
                                 f"{value.item() if hasattr(value, 'item') else value!r}")
    for key in REPORT_SUMMARY_COUNTS:
        value = run.summary.get(key)
        if key in run.summary and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"{path / 'summary.json'}: field {key!r} must be a whole number >= 0, got {value!r}")


def cmd_report(args: argparse.Namespace) -> int:
    """Write the report of ``args.runs`` to ``args.out``; ``--out`` is checked before any run is read (not
    empty, not one of the files read from the runs, not a directory, creatable, an existing file only with
    ``--force``); the file is replaced atomically."""
    from analysis.report import write_report
    from analysis.output import check_out_file, command_inputs, is_report_file
    out = check_out_file(args.out, args.force, "--out", inputs=command_inputs(args),
                         replaceable=(is_report_file, "a kvsim report"))
    runs = load_runs(args.runs)
    for path_given, run in zip(args.runs, runs):     # a tiered run without its occupancy table: said, not skipped
        if run.config.get("kv_tiers") and run.tiers is None:
            print(f"kvsim: note: {path_given}: a run with KV tiers but no tiers.parquet: the report leaves out its "
                  "tier occupancy figure", file=sys.stderr)
    try:
        path = write_report(runs, out)
    except KeyError as exc:
        raise ValueError(f"a run lacks the column or key {exc} the report needs (written by an older kvsim?)") \
            from None
    print(f"report of {len(runs)} run(s): {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0
