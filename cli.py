"""``kvsim``: the command line. Subcommands: simulate, traces, calibrate.

Every user error (bad trace, impossible configuration, unknown model, unreadable profile, existing
output) prints one ``kvsim: error: ...`` line naming the file, field or value, and exits with status 2.
"""
from __future__ import annotations

import argparse
import os
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
    parser.add_argument("--model", default="llama-3-8b", help=f"model ({', '.join(model_names())})")
    parser.add_argument("--gpu", default="h200", help=f"GPU ({', '.join(gpu_names())})")
    parser.add_argument("--tp", type=_int_at_least(1), default=1, help="tensor-parallel degree (divides KV heads)")
    parser.add_argument("--page-size", type=_size, default="2MiB",
                        help="vAttention page size per K/V sub-tensor, e.g. 2MiB, 256KiB (< 2MiB needs a modified "
                             "driver)")
    parser.add_argument("--max-batch", type=_int_at_least(1), default=256, help="request slots B (max concurrent requests)")
    parser.add_argument("--scheduler", choices=("sarathi", "vllm"), default="sarathi",
                        help="sarathi: chunked prefill with a token budget; vllm: prefill-first")
    parser.add_argument("--token-budget", type=_int_at_least(1), default=2048, help="tokens per iteration (chunked prefill)")
    parser.add_argument("--max-context", type=_int_at_least(2), default=None,
                        help="tokens per slot L_max; longer requests are clipped; more than the model's native "
                             "context is refused unless --allow-long-context (default: the model's native context)")
    parser.add_argument("--allow-long-context", action="store_true",
                        help="accept a --max-context beyond the model's native context (like vLLM's "
                             "VLLM_ALLOW_LONG_MAX_MODEL_LEN; the model was not trained for it); recorded in "
                             "config.json as allow_long_context")
    parser.add_argument("--sync-mapping", action="store_true", help="map on the critical path (no background mapper)")
    parser.add_argument("--no-deferred-reclaim", action="store_true",
                        help="unmap a finished request's pages at once instead of keeping them on its slot")
    parser.add_argument("--memory-util", type=_positive_float, default=0.9,
                        help="share of GPU memory for weights + KV cache (vLLM gpu_memory_utilization)")
    parser.add_argument("--preemption", choices=("recompute", "swap"), default="recompute",
                        help="when memory runs out: recompute (drop KV) or swap (copy KV to host over PCIe)")
    parser.add_argument("--host-swap", type=_size, default="4GiB",
                        help="host memory for swapped KV (vLLM swap_space)")
    parser.add_argument("--seed", type=_int_at_least(0), default=0, help="seed of the run's random generator")


def config_from_args(args: argparse.Namespace, **overrides):
    """Build the :class:`SimConfig` from parsed options (raises ConfigError / CatalogError on bad values)."""
    from sim.config import SimConfig
    values = dict(model=args.model, gpu=args.gpu, tp=args.tp, page_size_bytes=args.page_size,
                  max_batch_slots=args.max_batch, scheduler=args.scheduler, token_budget=args.token_budget,
                  max_context_tokens=args.max_context, sync_mapping=args.sync_mapping,
                  deferred_reclaim=not args.no_deferred_reclaim, memory_util_frac=args.memory_util, seed=args.seed,
                  preemption=args.preemption, host_swap_bytes=args.host_swap,
                  allow_long_context=bool(getattr(args, "allow_long_context", False)))
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
                                        "see 'kvsim traces fetch') (default: the built-in synthetic workload)")
    parser.add_argument("--format", dest="trace_format", default=None, help="trace format (default: detect)")
    parser.add_argument("--arrival", default=None,
                        help="arrival process for length-only traces: poisson:RATE or gamma:RATE,CV (default: "
                             "the trace's own arrival times)")
    parser.add_argument("--skip-requests", type=_int_at_least(0), default=0,
                        help="drop the first N requests (before --num-requests; the next one arrives at 0 s)")
    parser.add_argument("--num-requests", type=_int_at_least(1), default=None,
                        help="use the first N requests (default: all; synthetic: 1000)")
    parser.add_argument("--rate-scale", type=_positive_float, default=1.0,
                        help="multiply the arrival rate (divide inter-arrival times) by X")


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
    if len(trace) == 0:
        filters = [flag for flag, used in (("--skip-requests", getattr(args, "skip_requests", 0)),
                                           ("--num-requests", args.num_requests)) if used]
        raise traces.TraceError(f"{trace.attrs.get('source', args.trace or 'the workload')}: no requests left"
                                + (f" after {' and '.join(filters)}" if filters else "") + "; nothing to simulate")
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


# ---- output paths: checked before any work; --force replaces a kvsim result as a whole ----------------------
# What kvsim writes into a result directory (simulate, compare, sweep). ``--force`` replaces a directory only
# if everything in it is one of these, so a folder holding anything else (a user's files, a hardware replay's
# shapes.parquet) is never deleted.
RESULT_FILES = frozenset({"requests.parquet", "iterations.parquet", "summary.json", "config.json", "report.html",
                          "compare.csv", "compare.parquet", "sweep.parquet", "sweep.csv", "sweep.html"})
_RUN_FILES = frozenset({"requests.parquet", "iterations.parquet", "summary.json", "config.json", "report.html"})
OUT_RULE = ("--out must be a new or empty directory; --force replaces one that holds only a kvsim result (run, "
            "comparison or sweep) as a whole, atomically (written beside it, then renamed over it); a directory "
            "holding anything else is refused even with --force")


def _is_result_entry(entry: Path) -> bool:
    """Whether ``entry`` (inside an output directory) is something kvsim writes."""
    import re
    if entry.is_symlink():
        return False
    if entry.is_file():
        return entry.name in RESULT_FILES
    if not entry.is_dir():
        return False
    if entry.name == "points":               # sweep points: <key>.json (and <key>.tmp while being written)
        return all(p.is_file() and p.suffix in (".json", ".tmp") for p in entry.iterdir())
    if re.fullmatch(r"run\d+", entry.name):   # compare --save-runs
        return all(p.is_file() and p.name in _RUN_FILES for p in entry.iterdir())
    return False


def _nearest_existing(path: Path) -> Path:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def _check_can_create(path: Path, flag: str, shown: str) -> None:
    """Refuse (OSError naming ``flag``) unless entries can be created beside ``path``: its nearest existing
    ancestor must be a directory in which kvsim can make a (probe) directory."""
    import tempfile
    parent = _nearest_existing(path.parent if path.name else path)
    if not parent.is_dir():
        raise NotADirectoryError(f"{flag} {shown}: {parent} is not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".kvsim-probe-"))
    except OSError as exc:
        raise PermissionError(f"{flag} {shown}: cannot write in {parent} ({exc.strerror or exc})") from None


def _out_text(value) -> str:
    return repr(str(value)) if str(value).strip() != str(value) or not str(value) else str(value)


def _non_empty_path(value, flag: str) -> Path:
    if value is None or not str(value).strip():
        raise ValueError(f"{flag} {_out_text(value or '')}: an empty path; name the file or directory to write")
    return Path(value)


class OutputDir:
    """The result directory of a command (``--out``), checked before any work and written as a whole.

    * ``--out ''``, a path under a file or where nothing can be created (``/proc/x``), and an existing file
      are refused at once (``OSError`` / ``ValueError`` naming ``flag``).
    * An existing directory must be empty, or hold only a kvsim result and come with ``force``; a directory
      with anything else in it is refused even with ``force`` (:data:`OUT_RULE`).
    * :meth:`writing` yields the folder to write into: a fresh sibling temporary directory, renamed over
      ``path`` when the block ends without an exception (nothing stale survives: an old report.html, saved
      runs of a compare, points of another sweep grid); removed, with the old result intact, on failure.
    """

    def __init__(self, path, force: bool = False, flag: str = "--out", resumable: bool = False):
        self.path = _non_empty_path(path, flag)
        self.flag, self.force = flag, force
        shown = str(self.path)
        if self.path.exists() and not self.path.is_dir():
            raise FileExistsError(f"{flag} {shown} is a file, not a directory")
        self.existing = self.path.is_dir() and any(self.path.iterdir())
        if self.existing:
            foreign = sorted(e.name for e in self.path.iterdir() if not _is_result_entry(e))
            if foreign:
                listed = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
                raise FileExistsError(f"{flag} {shown} is not empty and is not a kvsim result (it holds {listed}); "
                                      f"choose a new or empty directory (--force replaces only a kvsim result)")
            if not force and not resumable:
                raise FileExistsError(f"{flag} {shown} already holds a kvsim result; choose another {flag} or pass "
                                      "--force to replace it")
        _check_can_create(self.path, flag, shown)

    @property
    def replaces(self) -> bool:
        """Whether writing replaces an existing result (``force`` on a non-empty directory)."""
        return self.existing and self.force

    def writing(self):
        """Context manager: the directory to write into (see the class docstring)."""
        import contextlib
        import shutil
        import tempfile

        @contextlib.contextmanager
        def staged():
            target = Path(os.path.realpath(self.path)) if self.path.is_symlink() else self.path
            target.parent.mkdir(parents=True, exist_ok=True)
            stage = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.kvsim-new-"))
            try:
                yield stage
            except BaseException:
                shutil.rmtree(stage, ignore_errors=True)
                raise
            os.chmod(stage, 0o777 & ~_umask())
            old = None
            if target.is_dir() and any(target.iterdir()):
                old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.kvsim-old-"))
                os.replace(target, old / "result")
            elif target.is_dir():
                target.rmdir()
            os.replace(stage, target)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        return staged()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_out_file(path, force: bool, flag: str = "--out") -> Path:
    """Check a file that a command will write (``report --out``, ``capacity --json``, ``traces convert --out``)
    before any work: not empty, not a directory, not existing unless ``force``, creatable.

    Raises:
        ValueError / OSError: one line naming ``flag`` and the path.
    """
    out = _non_empty_path(path, flag)
    if out.is_dir():
        raise IsADirectoryError(f"{flag} {out} is a directory; {flag} names the file to write")
    if out.exists() and not force:
        raise FileExistsError(f"{flag} {out} already exists; choose another {flag} or pass --force to replace it")
    _check_can_create(out, flag, str(out))
    return out


def write_file_atomic(path, write) -> Path:
    """Call ``write(temporary_path)``, then rename the temporary file over ``path`` (same directory), so
    that ``path`` is either the old file or the whole new one."""
    import tempfile
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".kvsim-new")
    os.close(handle)
    try:
        write(Path(temporary))
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, out)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return out


class DeprecatedAlias(argparse.Action):
    """A hidden old spelling of an option (``add_argument("--first", dest="num_requests", action=DeprecatedAlias,
    new="--num-requests", type=...)``): stores the value and prints a one-line deprecation warning."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        kwargs["help"] = argparse.SUPPRESS
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"kvsim: warning: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


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
    out = OutputDir(args.out if args.out is not None else _default_out_dir("compare"), args.force)
    _check_profile_first(args.profile)
    trace, notes = load_workload(args, base.seed, base.slot_max_tokens)
    for note in notes:
        print(f"kvsim: warning: {note}", file=sys.stderr)
    _note_long_context(base)
    started = time.perf_counter()
    runs = run_policies(base, args.policy, trace, args.profile, workers=args.workers, keep_tables=args.save_runs)
    table = comparison_table({label: run.summary for label, run in runs.items()})
    with out.writing() as stage:
        table.to_csv(stage / "compare.csv")
        table.to_parquet(stage / "compare.parquet")
        if args.save_runs:
            from analysis.results import write_run
            for index, run in enumerate(runs.values()):
                write_run(run, stage / f"run{index}")
                run.path = out.path / f"run{index}"
    print_comparison(table, trace.attrs.get("source", ""), base, time.perf_counter() - started, out.path)
    return 0


def _note_long_context(config) -> None:
    native = config.model_spec.max_context_tokens
    if config.max_context_tokens and config.max_context_tokens > native:
        print(f"kvsim: note: --max-context {config.max_context_tokens:,} is beyond {config.model}'s native context "
              f"of {native:,} tokens (--allow-long-context; recorded in config.json)", file=sys.stderr)


def cmd_simulate(args: argparse.Namespace) -> int:
    from analysis.results import write_run
    from analysis.runner import run_simulation
    from analysis.summary import print_summary

    config = config_from_args(args)
    out = OutputDir(args.out if args.out is not None else _default_out_dir(), args.force)
    _check_profile_first(args.profile)
    trace, notes = load_workload(args, config.seed, config.slot_max_tokens)
    for note in notes:
        print(f"kvsim: warning: {note}", file=sys.stderr)
    _note_long_context(config)
    if config.needs_modified_driver:
        from sim.units import format_bytes
        print(f"kvsim: note: page size {format_bytes(config.page_size_bytes)} is below the 2 MiB VMM granularity: "
              "a what-if that needs a modified NVIDIA driver (vAttention's 64-256 KiB pages used one)", file=sys.stderr)
    started = time.perf_counter()
    with _progress(len(trace), args.quiet) as progress:
        result = run_simulation(config, trace, args.profile, progress=progress)
    wall_s = time.perf_counter() - started
    with out.writing() as stage:
        write_run(result, stage)
        result.path = out.path          # the report names the run's final directory, not the staging one
        if args.report:
            from analysis.report import write_report
            write_report([result], stage / "report.html")
    print_summary(result, wall_s=wall_s, out_dir=out.path)
    if args.report:
        print(f"report: {out.path / 'report.html'}")
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


# key -> (values, meaning, default as written in a spec or None: the SimConfig field's default). The keys listed
# in 'kvsim compare --help' come from the parser's own table (analysis.compare.POLICY_KEYS): a key without an
# entry here still appears, with its SimConfig field and default.
_POLICY_KEY_HELP = {
    "page": ("SIZE", "vAttention page size per K/V sub-tensor, a power of two >= 64KiB (< 2MiB needs a modified "
                     "driver); same as --page-size", "2MiB"),
    "sync": ("[on|off]", "map on the critical path, no background mapper ('sync' alone = on); same as --sync-mapping",
             "off"),
    "mapping": ("sync|async", "where pages are mapped: on the critical path or by the background mapper "
                              "(another spelling of sync)", "async"),
    "deferred": ("on|off", "deferred reclamation: keep a finished request's pages mapped on its slot", "on"),
    "lookahead": ("N", "eager mapping: decode steps mapped ahead for running requests", None),
    "eager": ("N", "page groups pre-mapped on idle slots", None),
    "eager_slots": ("N", "idle slots kept pre-mapped", None),
    "watermark": ("FRACTION", "below this share of free page groups, idle slots' pages are reclaimed in the "
                              "background", None),
    "create": ("startup|ondemand", "physical pages created from a pool at start-up, or on the mapping path "
                                   "(cuMemCreate per page)", "startup"),
    "layout": ("per-layer|cross-layer", "KV layout: 2N' per-layer tensors, or one K and one V tensor holding every "
                                        "layer", None),
    "layout_factor": ("X", "attention-time multiplier of the cross-layer layout's strided view", None),
    "batched": ("on|off", "one cuMemSetAccess over a range of adjacent pages instead of one per page", "off"),
    "block": ("TOKENS", "PagedAttention block size", None),
    "factor": ("X", "attention-time multiplier of the paged kernel", None),
    "bt_base_us": ("US", "block-table CPU time per iteration, fixed part (microseconds)", None),
    "bt_per_block_us": ("US", "block-table CPU time per block in the batch (microseconds)", None),
    "max_len": ("TOKENS", "tokens reserved per request at admission", "the slot length L_max, --max-context"),
    "preempt": ("recompute|swap", "when memory runs out: drop the KV and re-prefill, or copy it to host memory; same "
                                  "as --preemption", None),
    "zero": ("off|on-reuse|on-free", "clear reused pages for tenant isolation: not at all, when a request takes them "
                                     "(critical path) or when the previous one frees them (background)", None),
    "prefix": ("on|off", "prefix caching: share the pages of matching prompt prefixes (trace hash_ids); vattention "
                         "and paged", "off"),
    "admission": ("whole-prompt|chunk", "admit a waiting request only when its whole prompt's KV fits, or as soon as "
                                        "its first scheduled chunk fits", "the scheduler's rule, whole-prompt"),
}


def _key_default(field_name: str) -> str:
    from sim.config import SimConfig
    from sim.units import format_bytes
    default = SimConfig.__dataclass_fields__[field_name].default
    if isinstance(default, bool):
        return "on" if default else "off"
    if field_name.endswith("_bytes") and isinstance(default, int):
        return format_bytes(default).replace(" ", "")
    return str(default)


def _key_values(parse) -> str:
    """``a|b`` for a key parsed by analysis.compare's ``_choice``, else ``VALUE``."""
    for cell in getattr(parse, "__closure__", None) or ():
        if isinstance(cell.cell_contents, tuple) and all(isinstance(c, str) for c in cell.cell_contents):
            return "|".join(cell.cell_contents)
    return "VALUE"


def policy_keys_help() -> str:
    """The policy-spec reference of 'kvsim compare --help', one line per key of the parser's table."""
    from analysis.compare import POLICY_KEYS
    tables = list(POLICY_KEYS.values())
    common = [k for k in tables[0] if all(k in t for t in tables)]

    def line(key: str, entry) -> str:
        field_name, parse = entry[0], entry[1]
        values, meaning, default = _POLICY_KEY_HELP.get(key, (_key_values(parse), f"sets {field_name}", None))
        import textwrap
        head = f"  {key}={values}"
        text = f"{meaning} (default: {default or _key_default(field_name)})"
        return textwrap.fill(text, 100, initial_indent=head.ljust(32) if len(head) < 32 else head + "\n" + " " * 32,
                             subsequent_indent=" " * 32)

    lines = ["policy specs: NAME[:key=value,...], e.g. vattention:page=256KiB,sync  paged:block=16,prefix=on",
             "static:max_len=4096. Each key may be given once (sync and mapping are one key).", ""]
    for name, table in POLICY_KEYS.items():
        own = [k for k in table if k not in common]
        lines.append(f"{name} keys:")
        lines += [line(k, table[k]) for k in own] or ["  (none of its own)"]
    lines.append("keys of every policy:")
    lines += [line(k, tables[0][k]) for k in common]
    return "\n".join(lines)


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help shows its default, as ``(default: X)``: added from the option's default unless the
    text already states it (options whose default is "none" explain it in their text). Text with line breaks
    (the policy-key reference) is kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("default" in text or not action.option_strings or action.required
                or action.default in (argparse.SUPPRESS, None)):
            return text
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            return f"{text} (default: {'on' if action.default else 'off'})"
        if action.nargs == 0:    # --help, --version
            return text
        return f"{text} (default: %(default)s)"

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "\n".join(indent + line for line in text.splitlines())
        return super()._fill_text(text, width, indent)


class Parser(argparse.ArgumentParser):
    """argparse with :class:`HelpFormatter`, also for every subcommand (add_subparsers uses this class)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="kvsim", description="Trace-driven simulator of LLM-serving KV-cache memory management (vAttention, "
                                  "PagedAttention, static reservation) with a CUDA VMM hardware backend.")
    parser.add_argument("--version", action="version", version=f"kvsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sim = sub.add_parser("simulate", help="replay a trace through a KV-cache memory policy (default vAttention)",
                         description="Replay a trace (or the built-in synthetic workload) and print the summary.",
                         epilog=OUT_RULE + ".")
    add_trace_args(sim)
    add_config_args(sim)
    sim.add_argument("--profile", default=None,
                     help="calibration profile JSON (kvsim calibrate) for VMM latencies (default: the built-in "
                          "H200 latencies)")
    sim.add_argument("--out", default=None, help="run directory, new or empty (default: runs/sim-<UTC time>)")
    sim.add_argument("--force", action="store_true",
                     help="replace the kvsim result in --out as a whole (nothing else is ever deleted)")
    sim.add_argument("--report", action="store_true", help="also write report.html into the run directory")
    sim.add_argument("--quiet", action="store_true", help="no progress display")
    sim.add_argument("--policy", default=None,
                     help="memory policy spec, e.g. vattention:page=256KiB,sync | paged:block=16 | static:max_len=4096 "
                          "(keys: 'kvsim compare --help') (default: vattention)")
    sim.set_defaults(func=cmd_simulate)
    comp = sub.add_parser("compare", help="run several memory policies on one trace and print one table",
                          description="Run several memory policies on one trace, model and GPU; print and save "
                                      "one comparison table (CSV and Parquet). " + OUT_RULE + ".",
                          epilog=policy_keys_help())
    comp.add_argument("--policy", action="append", required=True, metavar="SPEC",
                      help="a policy to run (repeat), e.g. --policy vattention:page=2MiB --policy paged:block=16")
    add_trace_args(comp)
    add_config_args(comp)
    comp.add_argument("--profile", default=None,
                      help="calibration profile JSON for VMM latencies (default: the built-in H200 latencies)")
    comp.add_argument("--out", default=None,
                      help="directory for compare.csv / compare.parquet, new or empty (default: runs/compare-<UTC time>)")
    comp.add_argument("--force", action="store_true",
                      help="replace the kvsim result in --out as a whole, saved runs included")
    comp.add_argument("--save-runs", action="store_true", help="also write each policy's run directory (run0, run1, ...)")
    comp.add_argument("--workers", type=_int_at_least(1), default=None, help="parallel processes (default: one per core)")
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
