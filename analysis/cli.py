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
    return runs


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
