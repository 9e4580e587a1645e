"""``kvsim traces ...`` commands: ``stats``, ``convert`` and ``fetch``.

The root ``cli.py`` calls :func:`register` with its argparse subparsers object; each
leaf parser sets ``func(args) -> int`` (the exit code).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from typing import TYPE_CHECKING

from traces.errors import TraceError, TraceWarning
from traces.named import NAMED_TRACES, fetch_trace, resolve_trace
from traces.names import FORMAT_NAMES

if TYPE_CHECKING:          # pandas and the loaders load when a command runs, not for --help
    import pandas as pd


def register(subparsers) -> argparse.ArgumentParser:
    """Adds the ``traces`` command group (``stats``, ``convert``) to ``subparsers``.

    Args:
        subparsers: The object returned by ``ArgumentParser.add_subparsers()``.

    Returns:
        The ``traces`` parser.
    """
    group = subparsers.add_parser("traces", help="inspect and convert request traces")
    sub = group.add_subparsers(dest="traces_command", required=True)
    stats = sub.add_parser("stats", help="print rows, span, rate, burstiness, lengths")
    _add_input_args(stats)
    stats.set_defaults(func=cmd_stats)
    convert = sub.add_parser("convert", help="write a trace as canonical Parquet")
    _add_input_args(convert)
    convert.add_argument("--out", required=True, help="output .parquet file")
    convert.add_argument("--force", action="store_true", help="replace an existing --out file")
    convert.set_defaults(func=cmd_convert)
    fetch = sub.add_parser("fetch", help="download a named public trace (SHA-256 checked)",
                           description="Download a named public trace into the data directory, $KVSIM_DATA "
                                       "(default: ~/.cache/kvsim/traces), and check its SHA-256. Simulate it with "
                                       "--trace NAME.")
    fetch.add_argument("name", choices=sorted(NAMED_TRACES))
    fetch.set_defaults(func=cmd_fetch)
    return group


def _add_input_args(parser: argparse.ArgumentParser) -> None:
    from sim.frontend.argtypes import DeprecatedAlias, int_at_least, positive_float
    parser.add_argument("file", help="trace file (CSV, JSONL, Parquet) or trace name")
    parser.add_argument("--format", choices=FORMAT_NAMES, default=None,
                        help="trace format (default: detect from the header)")
    parser.add_argument("--arrival", default=None,
                        help="'poisson:RATE' or 'gamma:RATE,CV' (RATE in req/s) (default: the trace's own arrival "
                             "times)")
    parser.add_argument("--seed", type=int_at_least(0), default=0, help="seed for arrivals/sampling")
    parser.add_argument("--rate-scale", type=positive_float, default=None, metavar="X",
                        help="multiply the arrival rate by X (default: 1, unchanged)")
    parser.add_argument("--scale-rate", dest="rate_scale", type=positive_float, action=DeprecatedAlias,
                        new="--rate-scale")
    parser.add_argument("--window", default=None, metavar="START_S:END_S",
                        help="keep arrivals in [START_S, END_S) seconds (default: the whole trace)")
    parser.add_argument("--num-requests", type=int_at_least(1), default=None, metavar="N",
                        help="keep the first N requests (default: all)")
    parser.add_argument("--first", dest="num_requests", type=int_at_least(1), action=DeprecatedAlias,
                        new="--num-requests")
    parser.add_argument("--sample", type=int_at_least(1), default=None, metavar="N",
                        help="keep N requests drawn at random (seeded) (default: all)")
    parser.add_argument("--max-context", type=int_at_least(1), default=None, metavar="TOKENS",
                        help="clip prompt+output to TOKENS (default: no clipping)")


def load_with_transforms(args: argparse.Namespace) -> pd.DataFrame:
    """Loads ``args.file`` and applies the transformation flags in a fixed order.

    Order: window, rate-scale, num-requests, sample, max-context. The number of clipped
    requests is reported on stderr; a selection that leaves no request is refused.
    """
    from traces.loader import load_trace
    from traces.transforms import clip_context, first_n, sample_n, scale_rate, time_window

    df = load_trace(resolve_trace(args.file), fmt=args.format, arrival=args.arrival,
                    seed=args.seed)
    if args.window:
        start_s, _, end_s = args.window.partition(":")
        try:
            df = time_window(df, float(start_s), float(end_s))
        except ValueError as err:
            raise TraceError(f"--window: expected START_S:END_S ({err})") from None
    if args.window and len(df) == 0:
        raise TraceError(f"--window {args.window}: no request of {args.file} arrives in it")
    if args.rate_scale is not None:
        df = scale_rate(df, args.rate_scale, "--rate-scale")
    if args.num_requests is not None:
        df = first_n(df, args.num_requests)
    if args.sample is not None:
        df = sample_n(df, args.sample, args.seed)
    if args.max_context is not None:
        df, clipped = clip_context(df, args.max_context)
        print(f"kvsim: warning: clipped {clipped} requests to {args.max_context} tokens", file=sys.stderr)
    return df


def _run(body, args: argparse.Namespace) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TraceWarning)
        try:
            code = body(args)
        except TraceError as err:
            print(f"kvsim: error: {err}", file=sys.stderr)
            code = 2
    for w in caught:
        print(f"kvsim: warning: {w.message}", file=sys.stderr)
    return code


def cmd_stats(args: argparse.Namespace) -> int:
    """``kvsim traces stats FILE``: prints :func:`trace_stats` as a table."""
    from traces.loader import detect_format
    from traces.stats import format_stats, trace_stats

    def body(a):
        if not str(a.file).strip():
            raise TraceError(f"{str(a.file)!r}: an empty path; name a trace file or a trace name")
        # A length-only file without --arrival: lengths only, on placeholder arrivals.
        no_times = a.arrival is None and (
            a.format or detect_format(resolve_trace(a.file))) == "lengths"
        if no_times:
            for flag, value in (("--window", a.window), ("--rate-scale", a.rate_scale)):
                if value is not None:
                    raise TraceError(f"{flag} needs arrival times; {a.file} is a length-only "
                                     "trace: pass --arrival poisson:RATE or gamma:RATE,CV")
            a = argparse.Namespace(**{**vars(a), "arrival": "poisson:1"})
        df = load_with_transforms(a)
        source = str(df.attrs.get('source', a.file))
        if no_times:        # the placeholder arrivals are no part of the file's description
            from traces.generators import arrival_note
            source = source.replace(f" | {arrival_note(a.arrival, a.seed)}", "")
        print(f"source           {source}")
        if no_times:
            print("arrival times    none in the file (length-only trace); pass --arrival "
                  "for span, rate and burstiness")
        print(format_stats(trace_stats(df, arrivals=not no_times)))
        return 0
    return _run(body, args)


def cmd_convert(args: argparse.Namespace) -> int:
    """``kvsim traces convert FILE --out F.parquet [--force]``."""
    from analysis.output import check_out_file, command_inputs, write_file_atomic
    from traces.loader import is_trace_file, write_parquet

    def body(a):
        try:         # before reading the trace; --force replaces only a trace this command wrote
            out = check_out_file(a.out, a.force, "--out", inputs=command_inputs(a),
                                 replaceable=(is_trace_file, "a trace kvsim traces convert wrote"))
        except (ValueError, OSError) as err:
            print(f"kvsim: error: {err}", file=sys.stderr)
            return 2
        if out.suffix.lower() not in (".parquet", ".pq"):   # the file is Parquet whatever its name: never mislabelled
            print(f"kvsim: error: --out {a.out}: traces convert writes Parquet; name the file *.parquet",
                  file=sys.stderr)
            return 2
        df = load_with_transforms(a)
        write_file_atomic(out, lambda temporary: write_parquet(df, temporary))
        print(f"wrote {len(df):,} requests to {out}")
        return 0
    return _run(body, args)


def cmd_fetch(args: argparse.Namespace) -> int:
    """``kvsim traces fetch NAME``: download into the data directory, verify SHA-256."""
    def body(a):
        print(f"{a.name}: {fetch_trace(a.name)} (SHA-256 verified)")
        return 0
    return _run(body, args)
