"""``kvsim``: the command line. Subcommands: simulate, traces, calibrate.

Every user error (bad trace, impossible configuration, unknown model, unreadable profile, existing
output) prints one ``kvsim: error: ...`` line naming the file, field or value, and exits with status 2.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

from sim import __version__


def _size(text: str) -> int:
    from sim.units import parse_size_bytes
    try:
        return parse_size_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """Options shared by every command that builds a :class:`sim.config.SimConfig`."""
    from sim.catalog import gpu_names, model_names
    parser.add_argument("--model", default="llama-3-8b", help=f"model ({', '.join(model_names())}); default llama-3-8b")
    parser.add_argument("--gpu", default="h200", help=f"GPU ({', '.join(gpu_names())}); default h200")
    parser.add_argument("--tp", type=_int_at_least(1), default=1, help="tensor-parallel degree (divides KV heads); default 1")
    parser.add_argument("--page-size", type=_size, default="2MiB",
                        help="vAttention page size per K/V sub-tensor, e.g. 2MiB, 256KiB (< 2MiB needs a modified "
                             "driver); default 2MiB")
    parser.add_argument("--max-batch", type=_int_at_least(1), default=256, help="request slots B (max concurrent requests); default 256")
    parser.add_argument("--scheduler", choices=("sarathi", "vllm"), default="sarathi",
                        help="sarathi: chunked prefill with a token budget; vllm: prefill-first; default sarathi")
    parser.add_argument("--token-budget", type=_int_at_least(1), default=2048, help="tokens per iteration (chunked prefill); default 2048")
    parser.add_argument("--max-context", type=_int_at_least(2), default=None,
                        help="tokens per slot L_max (default: the model's context); longer requests are clipped")
    parser.add_argument("--sync-mapping", action="store_true", help="map on the critical path (no background mapper)")
    parser.add_argument("--no-deferred-reclaim", action="store_true",
                        help="unmap a finished request's pages at once instead of keeping them on its slot")
    parser.add_argument("--memory-util", type=_positive_float, default=0.9,
                        help="share of GPU memory for weights + KV cache (vLLM gpu_memory_utilization); default 0.9")
    parser.add_argument("--preemption", choices=("recompute", "swap"), default="recompute",
                        help="when memory runs out: recompute (drop KV) or swap (copy KV to host over PCIe)")
    parser.add_argument("--host-swap", type=_size, default="4GiB",
                        help="host memory for swapped KV (vLLM swap_space default 4GiB); default 4GiB")
    parser.add_argument("--seed", type=_int_at_least(0), default=0, help="seed of the run's random generator; default 0")


def config_from_args(args: argparse.Namespace, **overrides):
    """Build the :class:`SimConfig` from parsed options (raises ConfigError / CatalogError on bad values)."""
    from sim.config import SimConfig
    values = dict(model=args.model, gpu=args.gpu, tp=args.tp, page_size_bytes=args.page_size,
                  max_batch_slots=args.max_batch, scheduler=args.scheduler, token_budget=args.token_budget,
                  max_context_tokens=args.max_context, sync_mapping=args.sync_mapping,
                  deferred_reclaim=not args.no_deferred_reclaim, memory_util_frac=args.memory_util, seed=args.seed,
                  preemption=args.preemption, host_swap_bytes=args.host_swap)
    values.update(overrides)
    if isinstance(getattr(args, "policy", None), str):   # simulate --policy (compare takes a list)
        values.update(policy_overrides(args.policy, values))
    return SimConfig(**values)


# SimConfig field -> (the flag that also sets it, its default) for conflict checks with --policy specs
_FLAG_OF_FIELD = {"page_size_bytes": ("--page-size", 2 * 1024 * 1024), "sync_mapping": ("--sync-mapping", False),
                  "deferred_reclaim": ("--no-deferred-reclaim", True), "preemption": ("--preemption", "recompute")}


def policy_overrides(spec: str, values: dict) -> dict:
    """The fields a ``--policy`` spec sets; a spec that contradicts an explicit flag is an error.

    Raises:
        ConfigError: naming the spec and the flag.
    """
    from analysis.compare import parse_policy
    from sim.config import ConfigError
    overrides = parse_policy(spec)
    for field_name, value in overrides.items():
        flag, default = _FLAG_OF_FIELD.get(field_name, (None, None))
        if flag and values.get(field_name, default) != default and values[field_name] != value:
            raise ConfigError(f"policy {spec!r} contradicts {flag}; set it in one place")
    return overrides


def add_trace_args(parser: argparse.ArgumentParser) -> None:
    """Options that choose the workload."""
    parser.add_argument("--trace", help="trace file (Azure, Splitwise/Vidur, length-only CSV, Mooncake JSONL, "
                                        "BurstGPT, canonical Parquet) or a public trace name (e.g. azure-conv-2023, "
                                        "see 'kvsim traces fetch'); default: built-in synthetic workload")
    parser.add_argument("--format", dest="trace_format", default=None, help="trace format (default: detect)")
    parser.add_argument("--arrival", default=None,
                        help="arrival process for length-only traces: poisson:RATE or gamma:RATE,CV")
    parser.add_argument("--skip-requests", type=_int_at_least(0), default=0,
                        help="drop the first N requests (before --num-requests; the next one arrives at 0 s); default 0")
    parser.add_argument("--num-requests", type=_int_at_least(1), default=None,
                        help="use the first N requests (default: all; synthetic default: 1000)")
    parser.add_argument("--rate-scale", type=_positive_float, default=1.0,
                        help="multiply the arrival rate (divide inter-arrival times) by X; default 1")


def load_workload(args: argparse.Namespace, seed: int, max_context_tokens: int):
    """Load (or synthesise) the trace, apply --skip-requests / --num-requests / --rate-scale, clip to the slot
    length.

    Returns:
        ``(trace, notes)``: the canonical table and human-readable notes (warnings) to print.
    """
    import traces
    notes = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", traces.TraceWarning)
        if args.trace:
            path = traces.resolve_trace(args.trace)  # a file, or a public trace name (kvsim traces fetch)
            trace = traces.load_trace(path, fmt=args.trace_format, arrival=args.arrival, seed=seed)
        else:
            unused = [flag for flag, value in (("--format", args.trace_format), ("--arrival", args.arrival)) if value]
            if unused:
                raise traces.TraceError(f"{' and '.join(unused)} appl{'y' if len(unused) > 1 else 'ies'} to a --trace; the built-in synthetic "
                                        "workload has its own arrivals and lengths")
            trace = traces.synthetic_default(seed, num_requests=(args.num_requests or 1000)
                                             + getattr(args, "skip_requests", 0))
    notes += [str(w.message) for w in caught if issubclass(w.category, traces.TraceWarning)]
    if getattr(args, "skip_requests", 0):
        if args.skip_requests >= len(trace):
            raise traces.TraceError(f"--skip-requests {args.skip_requests}: the trace has only {len(trace)} requests")
        trace = traces.skip_n(trace, args.skip_requests)
    if args.num_requests:
        trace = traces.first_n(trace, args.num_requests)
    if args.rate_scale != 1.0:
        trace = traces.scale_rate(trace, args.rate_scale)
    trace, clipped = traces.clip_context(trace, max_context_tokens)
    if clipped:
        notes.append(f"{clipped} request(s) longer than the slot length ({max_context_tokens} tokens) were clipped")
    return trace, notes


def _default_out_dir(kind: str = "sim") -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = Path("runs") / f"{kind}-{stamp}"
    suffix = 1
    while out.exists():
        out = Path("runs") / f"{kind}-{stamp}-{suffix}"
        suffix += 1
    return out


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"--out {out_dir} is a file, not a directory")


def _check_profile_first(profile_path: str | None) -> None:
    """Read and check ``--profile`` before the trace, so that a bad profile is the only message.

    Raises:
        ProfileError: from :func:`sim.latency.read_profile`, naming the file and field.
    """
    if profile_path is not None:
        from sim.latency import read_profile
        read_profile(profile_path)


def cmd_compare(args: argparse.Namespace) -> int:
    from analysis.compare import comparison_table, run_policies
    from analysis.summary import print_comparison

    base = config_from_args(args)
    from analysis.compare import parse_policy
    from sim.config import ConfigError
    for spec in args.policy:          # every spec is checked before the trace is read
        try:
            base.with_overrides(parse_policy(spec))
        except ConfigError as exc:
            raise ConfigError(f"policy {spec!r}: {exc}" if spec not in str(exc) else str(exc)) from None
    out_dir = Path(args.out) if args.out else _default_out_dir("compare")
    _check_out_dir(out_dir)
    table_files = [out_dir / "compare.csv", out_dir / "compare.parquet"]
    if not args.force and any(f.exists() for f in table_files):
        raise FileExistsError(f"{out_dir} already holds a comparison; choose another --out or pass --force")
    _check_profile_first(args.profile)
    trace, notes = load_workload(args, base.seed, base.slot_max_tokens)
    for note in notes:
        print(f"kvsim: warning: {note}", file=sys.stderr)
    started = time.perf_counter()
    runs = run_policies(base, args.policy, trace, args.profile, workers=args.workers, keep_tables=args.save_runs)
    table = comparison_table({label: run.summary for label, run in runs.items()})
    out_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(table_files[0])
    table.to_parquet(table_files[1])
    if args.save_runs:
        from analysis.results import write_run
        for index, run in enumerate(runs.values()):
            write_run(run, out_dir / f"run{index}", overwrite=args.force)
    print_comparison(table, trace.attrs.get("source", ""), base, time.perf_counter() - started, out_dir)
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from analysis.results import write_run
    from analysis.runner import run_simulation
    from analysis.summary import print_summary

    config = config_from_args(args)
    out_dir = Path(args.out) if args.out else _default_out_dir()
    _check_out_dir(out_dir)
    if not args.force and any((out_dir / f).exists() for f in ("summary.json", "requests.parquet")):
        raise FileExistsError(f"{out_dir} already holds a run; choose another --out or pass --force")
    _check_profile_first(args.profile)
    trace, notes = load_workload(args, config.seed, config.slot_max_tokens)
    for note in notes:
        print(f"kvsim: warning: {note}", file=sys.stderr)
    if config.needs_modified_driver:
        from sim.units import format_bytes
        print(f"kvsim: note: page size {format_bytes(config.page_size_bytes)} is below the 2 MiB VMM granularity: "
              "a what-if that needs a modified NVIDIA driver (vAttention's 64-256 KiB pages used one)", file=sys.stderr)
    started = time.perf_counter()
    with _progress(len(trace), args.quiet) as progress:
        result = run_simulation(config, trace, args.profile, progress=progress)
    wall_s = time.perf_counter() - started
    write_run(result, out_dir, overwrite=args.force)
    if args.report:
        from analysis.report import write_report
        write_report([result], out_dir / "report.html")
    print_summary(result, wall_s=wall_s, out_dir=out_dir)
    if args.report:
        print(f"report: {out_dir / 'report.html'}")
    return 0


class _progress:
    """A rich progress bar on a terminal for runs of more than 2,000 requests; silent otherwise."""

    def __init__(self, total: int, quiet: bool):
        self.total, self.bar, self.task = total, None, None
        if not quiet and total > 2000 and sys.stderr.isatty():
            from rich.progress import Progress
            self.bar = Progress(transient=True)

    def __enter__(self):
        if self.bar is None:
            return None
        self.bar.start()
        self.task = self.bar.add_task("simulating", total=self.total)
        return lambda done, total: self.bar.update(self.task, completed=done)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False


def _policy_keys_help() -> str:
    from analysis.compare import POLICY_KEYS
    keys = "; ".join(f"{name} keys: {', '.join(spec)}" for name, spec in POLICY_KEYS.items())
    return f"policy specs: NAME[:key=value,...]; {keys}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvsim", description="Trace-driven simulator of LLM-serving KV-cache memory management (vAttention, "
                                  "PagedAttention, static reservation) with a CUDA VMM hardware backend.")
    parser.add_argument("--version", action="version", version=f"kvsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sim = sub.add_parser("simulate", help="replay a trace through a KV-cache memory policy (default vAttention)",
                         description="Replay a trace (or the built-in synthetic workload) and print the summary.")
    add_trace_args(sim)
    add_config_args(sim)
    sim.add_argument("--profile", default=None, help="calibration profile JSON (kvsim calibrate) for VMM latencies")
    sim.add_argument("--out", default=None, help="run directory (default: runs/sim-<UTC time>)")
    sim.add_argument("--force", action="store_true", help="overwrite the run files in an existing --out")
    sim.add_argument("--report", action="store_true", help="also write report.html into the run directory")
    sim.add_argument("--quiet", action="store_true", help="no progress display")
    sim.add_argument("--policy", default=None,
                     help="memory policy spec, e.g. vattention:page=256KiB,sync | paged:block=16 | static:max_len=4096 "
                          "(see 'kvsim compare --help'); default vattention")
    sim.set_defaults(func=cmd_simulate)
    comp = sub.add_parser("compare", help="run several memory policies on one trace and print one table",
                          description="Run several memory policies on one trace, model and GPU; print and save "
                                      "one comparison table (CSV and Parquet).",
                          epilog=_policy_keys_help())
    comp.add_argument("--policy", action="append", required=True, metavar="SPEC",
                      help="a policy to run (repeat), e.g. --policy vattention:page=2MiB --policy paged:block=16")
    add_trace_args(comp)
    add_config_args(comp)
    comp.add_argument("--profile", default=None, help="calibration profile JSON for VMM latencies")
    comp.add_argument("--out", default=None, help="output directory for compare.csv / compare.parquet")
    comp.add_argument("--force", action="store_true", help="overwrite an existing comparison in --out")
    comp.add_argument("--save-runs", action="store_true", help="also write each policy's run directory (run0, run1, ...)")
    comp.add_argument("--workers", type=int, default=None, help="parallel processes (default: one per core)")
    comp.set_defaults(func=cmd_compare)
    for module in ("traces.cli", "hwbackend.cli", "analysis.cli", "analysis.cli_capacity"):
        try:
            register = __import__(module, fromlist=["register"]).register
        except (ImportError, AttributeError):
            continue
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kvsim`` console command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # output piped into e.g. head, which stopped reading: not an error of the run
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, OSError) as exc:
        print(f"kvsim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvsim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
