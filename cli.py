"""``kvsim``: the command line. Subcommands: simulate, traces, calibrate.

Every user error (bad trace, impossible configuration, unknown model, unreadable profile, existing
output) prints one ``kvsim: error: ...`` line naming the file, field or value, and exits with status 2.
"""
from __future__ import annotations

import argparse
import sys
import time

from analysis.output import OUT_RULE, OutputDir, command_inputs, default_out_dir
from sim import __version__
from sim.frontend.argtypes import int_at_least
from sim.frontend.options import add_config_args, config_from_args
from sim.cluster.routers import EXECUTORS, ROUTERS, routing_spec
from traces.workload import add_trace_args, load_workload, prefix_note, static_note


def _check_profile_first(profile_path: str | None) -> None:
    """Read and check ``--profile`` before the trace, so that a bad profile is the only message.

    Raises:
        ProfileError: from :func:`sim.timing.latency.read_profile`, naming the file and field.
    """
    from sim.timing.latency import check_profile_option

    check_profile_option(profile_path)


def cmd_compare(args: argparse.Namespace) -> int:
    from analysis.comparison import comparison_table, run_policies
    from analysis.summary import print_comparison

    # KV tiers hold prefix-cache pages: the base carries the cache for them, and each spec says whether it has one
    # (a spec without prefix=on is then refused by name, not the base for lacking a cache no spec gave it)
    tiered = bool(getattr(args, "kv_tier", None))
    base = config_from_args(args, **({"prefix_caching": True} if tiered else {}))
    from sim.frontend.options import policy_overrides
    from sim.frontend.policy_spec import parse_policy, policy_config_error
    from sim.setup.config import ConfigError
    flag_values = {name: getattr(base, name) for name in ("page_size_bytes", "sync_mapping", "deferred_reclaim",
                                                           "preemption")}
    for spec in args.policy:          # every spec is checked before the trace is read
        # a spec that contradicts an explicit flag, as simulate refuses it
        policy_overrides(spec, flag_values, getattr(args, "given_options", ()))
        try:
            base.with_overrides({"prefix_caching": False, **parse_policy(spec)} if tiered else parse_policy(spec))
        except ConfigError as exc:
            raise policy_config_error(spec, exc) from None
    out = OutputDir(args.out if args.out is not None else default_out_dir("compare"), args.force,
                    inputs=command_inputs(args))
    _check_profile_first(args.profile)
    trace, notes = load_workload(args, base.seed, base.slot_max_tokens)
    notes.append(prefix_note(trace, [spec for spec in args.policy
                                     if base.with_overrides(parse_policy(spec)).prefix_caching]))
    notes += [f"{spec}: {note}" for spec in args.policy
              if (note := static_note(base.with_overrides(parse_policy(spec)), trace))]
    for note in filter(None, notes):
        print(f"kvsim: warning: {note}", file=sys.stderr)
    _note_long_context(base)
    print_config_notes(base, args.profile)
    configs = [base.with_overrides(parse_policy(spec)) for spec in args.policy]
    if not any(config.uses_vmm for config in configs):    # vAttention-only flags that no compared policy reads
        from sim.frontend.options import ignored_flag_notes
        for note in ignored_flag_notes(args, configs[0]):
            note = note.replace(f"the {configs[0].policy} policy maps no pages", "no compared policy maps pages")
            print(f"kvsim: note: {note}", file=sys.stderr)
    started = time.perf_counter()
    from analysis.flags import Progress
    with Progress(len(args.policy), args.quiet, "policies run") as progress:
        runs = run_policies(base, args.policy, trace, args.profile, workers=args.workers,
                            keep_tables=args.save_runs, on_done=progress)
    table = comparison_table({label: run.summary for label, run in runs.items()})
    with out.writing() as stage:
        table.to_csv(stage / "compare.csv")
        table.to_parquet(stage / "compare.parquet")
        if args.save_runs:
            from analysis.results import write_run
            for index, run in enumerate(runs.values()):
                write_run(run, stage / f"run{index}")
                run.path = out.path / f"run{index}"
    print_comparison(table, trace.attrs.get("source", ""), base, time.perf_counter() - started, out.path,
                     next(iter(runs.values())).summary, {label: run.summary for label, run in runs.items()})
    return 0


def print_config_notes(config, profile_path: str | None = None) -> None:
    """Print the configuration's notes (:attr:`sim.setup.config.SimConfig.notes`: a borrowed VMM profile, sliding
    windows; a profile whose compute fits were measured on another GPU) as ``kvsim: note:`` lines on stderr, and a
    profile whose compute fit was timed on the replay harness (:func:`sim.core.runner.harness_compute_warning`)
    as a ``kvsim: warning:`` line."""
    from sim.core.runner import compute_gpu_note, harness_compute_warning

    for note in config.notes + compute_gpu_note(config, profile_path):
        print(f"kvsim: note: {note}", file=sys.stderr)
    for warning in harness_compute_warning(config, profile_path):
        print(f"kvsim: warning: {warning}", file=sys.stderr)


def _note_long_context(config) -> None:
    native = config.model_spec.max_context_tokens
    if config.max_context_tokens and config.max_context_tokens > native:
        print(f"kvsim: note: --max-context {config.max_context_tokens:,} is beyond {config.model}'s native context "
              f"of {native:,} tokens (--allow-long-context; recorded in config.json)", file=sys.stderr)


def cmd_simulate(args: argparse.Namespace) -> int:
    from sim.core.runner import run_simulation
    from sim.frontend.disagg_options import check_disagg_flags

    check_disagg_flags(args)
    if args.pd is not None:             # disaggregated prefill and decode (docs/disaggregated.md)
        for flag, value, default in (("--routing", args.routing, "round-robin"), ("--executor", args.executor, "local"),
                                     ("--workers", args.workers, None)):
            if value != default:        # they spread co-located replicas; P/D routes by least outstanding
                raise ValueError(f"{flag} {value} applies to co-located replicas (--replicas N); a --pd P:D "
                                 "deployment sends each request to the prefill and then the decode instance with the "
                                 "fewest outstanding requests (docs/disaggregated.md): leave it out")
        from analysis.disagg_report import cmd_simulate_disagg
        return cmd_simulate_disagg(args)
    config = config_from_args(args)
    out = OutputDir(args.out if args.out is not None else default_out_dir(), args.force, inputs=command_inputs(args))
    _check_profile_first(args.profile)
    # one replica: a CSV trace read without pandas where it can be (pandas is imported once there are results)
    single = not (args.replicas > 1 or args.routing != "round-robin" or args.executor != "local" or args.workers)
    trace, notes = load_workload(args, config.seed, config.slot_max_tokens, light=single)
    prefix_label = args.policy or config.policy
    if config.prefix_caching and getattr(args, "engine", None) and "prefix" not in (args.policy or ""):
        prefix_label = f"--engine {args.engine} (its preset turns prefix caching on; paged:prefix=off turns it off)"
    notes.append(prefix_note(trace, [prefix_label] if config.prefix_caching else []))
    notes.append(static_note(config, trace))
    for note in filter(None, notes):
        print(f"kvsim: warning: {note}", file=sys.stderr)
    _note_long_context(config)
    print_config_notes(config, args.profile)
    from sim.frontend.options import ignored_flag_notes
    for note in ignored_flag_notes(args, config):
        print(f"kvsim: note: {note}", file=sys.stderr)
    if config.needs_modified_driver:
        from sim.units import format_bytes
        print(f"kvsim: note: page size {format_bytes(config.page_size_bytes)} is below the 2 MiB VMM granularity: "
              "a what-if that needs a modified NVIDIA driver (vAttention's 64-256 KiB pages used one)", file=sys.stderr)
    for note in _routing_notes(args.routing, config, trace):
        print(f"kvsim: warning: {note}", file=sys.stderr)
    for flag, value, default in (("--executor", args.executor, "local"), ("--workers", args.workers, None)):
        if args.replicas == 1 and value != default:
            print(f"kvsim: note: {flag} {value} spreads replicas over processes; one replica runs in this process "
                  "(add --replicas N to simulate N)", file=sys.stderr)
    if args.replicas == 1 and args.routing != "round-robin":
        print(f"kvsim: note: --routing {args.routing} over one replica sends every request to it (the run is a plain "
              "one); add --replicas N to route over N", file=sys.stderr)
    if not single:
        return _simulate_replicas(args, config, trace, out)
    with out.writing() as stage:
        started = time.perf_counter()
        with _progress(len(trace), args.quiet) as progress:     # iterations stream into the staged run
            result = run_simulation(config, trace, args.profile, progress=progress,
                                    records_path=stage / "iterations.parquet")
        wall_s = time.perf_counter() - started
        from analysis.results import write_run      # the writers and printers (pandas) once there are results
        from analysis.summary import print_summary
        write_run(result, stage)
        result.path = out.path          # the report names the run's final directory, not the staging one
        if args.report:
            from analysis.report import write_report
            write_report([result], stage / "report.html")
    result.relocate(out.path)
    print_summary(result, wall_s=wall_s, out_dir=out.path)
    if args.report:
        print(f"report: {out.path / 'report.html'}")
    return 0


def _routing_notes(routing: str, config, trace) -> list[str]:
    """Why a cache-aware router can match no prefix on this run (it then places requests by load alone):
    ``prefix-aware`` reads each replica's prefix cache (off without ``prefix=on``); both it and ``prefix-approx``
    match the requests' ``hash_ids`` (none in this trace)."""
    router = routing.partition(":")[0]
    if router not in ("prefix-aware", "prefix-approx"):
        return []
    if router == "prefix-aware" and not config.prefix_caching:
        return [f"--routing {router} matches each replica's prefix cache, which is off (the policy key prefix=on "
                "turns it on): requests are placed by load alone"]
    if "hash_ids" not in trace.columns:
        return [f"--routing {router} matches the requests' hash_ids and this trace has none: requests are placed "
                "by load alone"]
    return []


def _simulate_replicas(args: argparse.Namespace, config, trace, out) -> int:
    """``simulate --replicas N``: route, simulate the replicas (in parallel where the router is state-free),
    write the merged run (a ``replica`` column in both tables) and print its summary."""
    import os

    from analysis.results import RunResult, write_run
    from analysis.summary import print_summary
    from sim.cluster.replica_merge import write_merged_iterations, write_merged_requests
    from sim.cluster.routing import run_routed
    from analysis.results import compute_model_entry
    from sim.core.runner import compute_model_source, profile_config_overrides

    if args.report:
        raise ValueError("--report covers one replica's run; leave it out with --replicas (kvsim report DIR "
                         "reads the merged run)")
    if args.routing == "session-hash":
        from sim.cluster.routing import session_key_note
        note = session_key_note(trace, args.replicas)
        if note:
            print(f"kvsim: warning: {note}", file=sys.stderr)
    if args.replicas > len(trace):
        print(f"kvsim: warning: {args.replicas:,} replicas for {len(trace):,} requests: at least "
              f"{args.replicas - len(trace):,} replicas receive none (a co-simulating router still simulates each)",
              file=sys.stderr)
    with out.writing() as stage:
        started = time.perf_counter()
        records = stage / ".replicas"
        routed = run_routed(config, trace, args.replicas, args.routing, args.profile, args.executor,
                            args.workers or os.cpu_count() or 1, str(records))
        wall_s = time.perf_counter() - started
        # the merged tables written one row group / one window of request ids at a time (bounded memory)
        iterations = write_merged_iterations(routed.replicas, stage / "iterations.parquet")
        on_disk = all(res is None or res.parts is not None for res in routed.replicas)
        requests = write_merged_requests(routed.replicas, stage / "requests.parquet") if on_disk else routed.requests
        meta = {**profile_config_overrides(config, args.profile).to_dict(),
                "trace_source": trace.attrs.get("source", "trace"), "replicas": args.replicas,
                "routing": args.routing, "executor": args.executor,
                "compute_model": compute_model_source(config, args.profile)[1]}
        routed.summary.update(compute_model_entry(meta))
        result = RunResult(requests, iterations, routed.summary, meta)
        write_run(result, stage)
        if records.exists():
            import shutil
            shutil.rmtree(records)
    result.relocate(out.path)
    print_summary(result, wall_s=wall_s, out_dir=out.path)
    how = ("co-simulated" if args.routing.partition(":")[0] in ("least-outstanding", "prefix-aware", "prefix-approx")
           else f"{args.executor} executor")
    import numpy as np
    counts = np.bincount(np.asarray(routed.assignment, dtype=np.int64), minlength=args.replicas).tolist()
    shown = ", ".join(map(str, counts[:REPLICA_COUNTS_SHOWN])) + (
        f", ... ({len(counts) - REPLICA_COUNTS_SHOWN:,} more; {sum(c == 0 for c in counts):,} replicas with none)"
        if len(counts) > REPLICA_COUNTS_SHOWN else "")
    print(f"{args.replicas} replica{'s' if args.replicas != 1 else ''} ({args.routing}, {how}): requests per replica "
          f"{shown}")
    return 0


REPLICA_COUNTS_SHOWN = 32
"""Replicas whose request counts the summary line lists (the rest are counted)."""


def _progress(total: int, quiet: bool):
    """The simulate progress bar (:class:`analysis.flags.Progress`): on a terminal, for runs of more than 2,000
    requests; silent otherwise."""
    from analysis.flags import Progress
    return Progress(total, quiet, "simulating", min_total=2000)


# key -> (values, meaning, default as written in a spec or None: the SimConfig field's default). The keys listed
# in 'kvsim compare --help' come from the parser's own table (sim.frontend.policy_spec.POLICY_KEYS): a key without an
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
    "preemption": ("recompute|swap", "another spelling of preempt", "recompute"),
    "preempt": ("recompute|swap", "when memory runs out: drop the KV and re-prefill, or copy it to host memory; same "
                                  "as --preemption", None),
    "zero": ("off|on-reuse|on-free", "clear reused pages for tenant isolation: not at all, when a request takes them "
                                     "(critical path) or when the previous one frees them (background)", None),
    "prefix": ("on|off", "prefix caching: share the pages of matching prompt prefixes (trace hash_ids); vattention "
                         "and paged", "off"),
    "admission": ("whole-prompt|chunk", "admit a waiting request only when its whole prompt's KV fits, or as soon as "
                                        "its first scheduled chunk fits", "the scheduler's rule, whole-prompt"),
    "driver": ("stock|modified", "how pages below 2MiB are mapped: refused by the stock CUDA VMM API, or vAttention's "
                                 "modified UVM driver", "modified for pages below 2MiB"),
    "kernel": (None, "the paged kernel whose per-phase attention factors apply", "factor= for both phases"),
    "prefill_factor": ("X", "replaces the paged kernel's prefill attention factor (>= 1)", "the kernel's"),
    "decode_factor": ("X", "replaces the paged kernel's decode attention factor (>= 1)", "the kernel's"),
    "evict": (None, "the prefix cache's eviction policy: vLLM v1's LRU, SGLang's radix-tree leaves, or whole pages",
              None),
}

_WINDOW_KEY_HELP = {
    "vattention": "window-aware allocation for hybrid models (docs/hybrid.md): pages below a sliding window are "
                  "unmapped, or moved to the new end; off: every layer holds every token",
    "paged": "window-aware allocation for hybrid models (docs/hybrid.md): blocks out of a sliding window are freed, "
             "as vLLM v1's hybrid KV-cache manager; off: every layer holds every token",
    "static": "window-aware allocation for hybrid models (docs/hybrid.md): one reservation per layer group at "
              "admission, a window group's its window; off: every layer holds every token",
}
"""The ``window`` key's meaning per policy (its values differ: each policy's table lists them)."""


def _key_default(field_name: str) -> str:
    from sim.setup.config import SimConfig
    from sim.units import format_bytes
    default = SimConfig.__dataclass_fields__[field_name].default
    if isinstance(default, bool):
        return "on" if default else "off"
    if field_name.endswith("_bytes") and isinstance(default, int):
        return format_bytes(default).replace(" ", "")
    return str(default)


def _key_values(parse) -> str:
    """``a|b`` for a key parsed by analysis.comparison's ``_choice``, else ``VALUE``."""
    for cell in getattr(parse, "__closure__", None) or ():
        if isinstance(cell.cell_contents, tuple) and all(isinstance(c, str) for c in cell.cell_contents):
            return "|".join(cell.cell_contents)
    return "VALUE"


def policy_keys_help() -> str:
    """The policy-spec reference of 'kvsim compare --help', one line per key of the parser's table."""
    from sim.frontend.policy_spec import POLICY_KEYS
    tables = list(POLICY_KEYS.values())
    # a key common to every policy with the same values (window= takes different values in each)
    common = [k for k in tables[0] if all(k in t and _key_values(t[k][1]) == _key_values(tables[0][k][1])
                                          for t in tables)]

    def line(key: str, entry, policy: str | None = None) -> str:
        field_name, parse = entry[0], entry[1]
        values, meaning, default = _POLICY_KEY_HELP.get(key, (_key_values(parse), f"sets {field_name}", None))
        if key == "kernel":
            from sim.timing.paged_kernels import PAGED_KERNELS
            values = "|".join(PAGED_KERNELS)
        values = values or _key_values(parse)
        if key == "window" and policy in _WINDOW_KEY_HELP:
            meaning = _WINDOW_KEY_HELP[policy]
        import textwrap
        head = f"  {key}={values}"
        text = f"{meaning} (default: {default or _key_default(field_name)})"
        if len(head) >= 32:                  # a long head on its own line, the text below it
            return head + "\n" + textwrap.fill(text, 100, initial_indent=" " * 32, subsequent_indent=" " * 32)
        return textwrap.fill(text, 100, initial_indent=head.ljust(32), subsequent_indent=" " * 32)

    lines = ["policy specs: NAME[:key=value,...], e.g. vattention:page=256KiB,sync  paged:block=16,prefix=on",
             "static:max_len=4096. Each key may be given once (sync and mapping are one key).", ""]
    for name, table in POLICY_KEYS.items():
        own = [k for k in table if k not in common]
        lines.append(f"{name} keys:")
        lines += [line(k, table[k], name) for k in own] or ["  (none of its own)"]
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

    @property
    def epilog(self) -> str | None:
        """The epilog; one given as a function (``compare``'s policy-key reference, which imports the
        configuration and so numpy) is called only when the help is printed."""
        return self._epilog() if callable(self._epilog) else self._epilog

    @epilog.setter
    def epilog(self, value) -> None:
        self._epilog = value

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)     # for error()'s hint
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        """A bad argument: one line naming it (and where the usage is), exit status 2; argparse's usage dump
        of every option would bury it. A value that starts with ``-`` (``--page-size -2MiB``) reads to argparse as
        another option ("expected one argument"): the line says so."""
        import re

        option = re.fullmatch(r"argument (\S+?)(?:/\S+)?: expected one argument", message)
        argv = getattr(self, "_argv", [])
        if option and option.group(1) in argv:
            after = argv[argv.index(option.group(1)) + 1:][:1]      # the word after the option, if any
            if after and re.match(r"-[0-9.]", after[0]):
                message += (f" ({after[0]!r} starts with '-', so it reads as an option; "
                            f"write {option.group(1)}={after[0]} to pass it as a value)")
        self.exit(2, f"kvsim: error: {self.prog.removeprefix('kvsim ')}: {message} (see {self.prog} --help)\n"
                     if self.prog != "kvsim" else f"kvsim: error: {message} (see kvsim --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``kvsim`` parser with every sub-command; ``only="simulate"``: the same top-level parser with only the
    ``simulate`` sub-command, which parses ``kvsim simulate ...`` as the whole parser does (the same options,
    help, usage and error lines) without building the others (their option modules cost ~30 ms at every start:
    issue 32)."""
    from analysis.flags import add_out, add_profile, add_quiet
    parser = Parser(
        prog="kvsim", description="Trace-driven simulator of LLM-serving KV-cache memory management (vAttention, "
                                  "PagedAttention, static reservation) with a CUDA VMM hardware backend.")
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sim = sub.add_parser("simulate", help="replay a trace through a KV-cache memory policy (default vAttention)",
                         description="Replay a trace (or the built-in synthetic workload) and print the summary.",
                         epilog=OUT_RULE + ".")
    add_trace_args(sim)
    add_config_args(sim)
    add_profile(sim)
    add_out(sim, "run directory, new or empty (default: runs/sim-<UTC time>)")
    sim.add_argument("--report", action="store_true", help="also write report.html into the run directory")
    add_quiet(sim)
    sim.add_argument("--replicas", type=int_at_least(1), default=1,
                     help="serve the trace on N replicas behind --routing; state-free routings simulate the replicas "
                          "apart, in parallel, and merge their records (exactly as co-simulated)")
    sim.add_argument("--routing", type=routing_spec, metavar="ROUTER[:key=value,...]",
                     default="round-robin", help=f"request router over --replicas: {', '.join(ROUTERS)}; "
                     "least-outstanding and the cache-aware prefix-aware[:overlap_weight=W,load_weight=V] / "
                     "prefix-approx[:...,ttl_s=S] co-simulate (docs/tiers.md)")
    sim.add_argument("--executor", choices=EXECUTORS, default="local",
                     help="where the replicas run: a local process pool or Ray")
    sim.add_argument("--workers", type=int_at_least(1), default=None,
                     help="parallel processes or Ray CPUs for --replicas (default: one per core)")
    sim.add_argument("--policy", default=None,
                     help="memory policy spec, e.g. vattention:page=256KiB,sync | paged:block=16 | static:max_len=4096 "
                          "(keys: 'kvsim compare --help') (default: vattention)")
    from sim.frontend.disagg_options import add_disagg_args
    add_disagg_args(sim)
    sim.set_defaults(func=cmd_simulate)
    if only == "simulate":
        return parser
    comp = sub.add_parser("compare", help="run several memory policies on one trace and print one table",
                          description="Run several memory policies on one trace, model and GPU; print and save "
                                      "one comparison table (CSV and Parquet). " + OUT_RULE + ".",
                          epilog=policy_keys_help)
    comp.add_argument("--policy", action="append", required=True, metavar="SPEC",
                      help="a policy to run (repeat), e.g. --policy vattention:page=2MiB --policy paged:block=16")
    add_trace_args(comp)
    add_config_args(comp)
    add_profile(comp)
    add_out(comp, "directory for compare.csv / compare.parquet, new or empty (default: runs/compare-<UTC time>)",
            force_extra="saved runs included")
    add_quiet(comp)
    comp.add_argument("--save-runs", action="store_true", help="also write each policy's run directory (run0, run1, ...)")
    comp.add_argument("--workers", type=int_at_least(1), default=None, help="parallel processes (default: one per core)")
    comp.set_defaults(func=cmd_compare)
    for module in ("traces.cli", "hwbackend.cli", "analysis.cli", "analysis.planning.cli", "analysis.colocate"):
        try:
            register = __import__(module, fromlist=["register"]).register
        except (ImportError, AttributeError):
            continue
        register(sub)
    return parser


def version_line() -> str:
    """``kvsim VERSION; compiled: N of M simulator modules ...`` (:func:`sim.compiled.status`)."""
    from sim.compiled import status
    return f"kvsim {__version__}; {status()}"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kvsim`` console command; returns the exit status."""
    given = sys.argv[1:] if argv is None else argv
    if given == ["--version"]:
        # answered before the parser is built: its subcommands' options import the catalogue (as argparse's
        # own version action would, the line goes to stdout and the exit is SystemExit(0))
        print(version_line())
        sys.exit(0)
    only = "simulate" if given[:1] == ["simulate"] else None       # the sub-command named first: only its parser
    parser = build_parser(only)
    args = parser.parse_args(argv)
    # the long options written on the command line (a flag given at its default value is still given: a
    # --policy key or a grid axis that contradicts it is refused, sim.frontend.options.policy_overrides)
    args.given_options = tuple(token.split("=", 1)[0] for token in given if token.startswith("--"))
    previous = _on_sigterm()
    try:
        return args.func(args)
    except BrokenPipeError:  # output piped into e.g. head, which stopped reading: not an error of the run
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, OSError) as exc:     # an error of the core names its fields: show the flags instead
        from analysis.flags import ERROR_PREFIX
        from sim.frontend.flags import flag_message, parser_flags
        # the flags of every sub-command, as the whole parser names them
        print(f"{ERROR_PREFIX}{flag_message(exc, parser_flags(build_parser() if only else parser))}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        print(f"kvsim: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130
    finally:
        if previous is not None:
            import signal
            signal.signal(signal.SIGTERM, previous)


class Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, a batch system, ``kill``) in the command's process: unwound as Ctrl-C is, so that a run
    being written leaves no partial directory behind (helper-61: ``.OUT.kvsim-new-*`` folders were left)."""


def _on_sigterm():
    """Turn SIGTERM into :class:`Terminated` in this process (worker processes it forks keep the default: they are
    ended as before); returns the handler it replaced, None where no handler can be set (not the main thread)."""
    import os
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        return None
    pid = os.getpid()

    def terminate(signum, frame):
        if os.getpid() != pid:           # a forked worker: die as the default handler would
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Terminated()

    return signal.signal(signal.SIGTERM, terminate)


if __name__ == "__main__":
    sys.exit(main())
