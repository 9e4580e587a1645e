"""``kvsim capacity`` and ``kvsim sweep``: capacity planning under SLOs, and parameter grids.

``register(subparsers)`` adds both subcommands to the ``kvsim`` parser (cli.build_parser's discovery list).
"""
from __future__ import annotations

import argparse
import itertools
import re
import sys
import time
from pathlib import Path

from sim.results.json_text import strict_json_text


def _share(text: str) -> float:
    """A share in (0, 1] (``--slo-attainment``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1], got {text!r}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1), got {text!r}")
    return value


def _add_common(parser: argparse.ArgumentParser) -> None:
    from sim.frontend.options import add_config_args
    from traces.workload import add_trace_args
    add_trace_args(parser)
    add_config_args(parser)
    parser.add_argument("--allow-rejected", action="store_true",
                        help="accept a workload with requests that can never fit one replica: the capacity then "
                             "counts served requests only (default: refuse, naming how many and why)")
    parser.add_argument("--policy", default=None, help="memory policy spec, e.g. vattention:page=256KiB | paged:block=16 "
                                                       "| static (keys: 'kvsim compare --help') (default: vattention)")
    from analysis.flags import add_profile, add_quiet
    add_profile(parser)
    parser.add_argument("--slo", default=None, help="objectives METRIC=DURATION,...: metrics ttft|tpot|e2e|tbt|"
                                                    "sched_delay _p50|_p90|_p99|_mean and tbt_max, durations with a "
                                                    "unit, e.g. ttft_p99=2s,tbt_p99=100ms; ttft|tpot|e2e alone bound each "
                                                    "request (with --slo-attainment); sched_delay_p50=2s is added "
                                                    "unless one is given (Sarathi-Serve's capacity definition) "
                                                    "(default: none; capacity and --job capacity need it)")
    parser.add_argument("--slo-attainment", type=_share, default=None, metavar="F",
                        help="with per-request objectives in --slo (ttft=, tpot=, e2e= without a statistic): at least "
                             "a share F of the requests must meet every one of them (DistServe's SLO attainment, "
                             "e.g. 0.9; rejected and unfinished requests are misses; docs/capacity.md) (default: none)")
    parser.add_argument("--tolerance", type=_fraction, default=0.02,
                        help="relative precision of the capacity (bisection stops at hi/lo - 1 <= X)")
    parser.add_argument("--stability-tol", type=_fraction, default=0.05,
                        help="max TTFT growth per second of trace time in the steady state (0.05 = the server keeps "
                             "up with >= 95%% of the offered rate)")
    add_quiet(parser)


class _OutFile(argparse.Action):
    """``capacity --out FILE``: given once; with the old name ``--json`` as well (or twice) it is refused, since
    only one file would be written."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"{option_string} {values}: the result file was already given "
                         f"({getattr(namespace, self.dest)}; --json is the old name of --out): give one --out")
        setattr(namespace, self.dest, values)


class _DeprecatedJson(_OutFile):
    """``capacity --json FILE``: the old name of ``--out FILE``; works, and says so once (docs/cli.md)."""

    def __call__(self, parser, namespace, values, option_string=None):
        print("kvsim: warning: capacity --json is deprecated: write --out FILE (the same file)", file=sys.stderr)
        super().__call__(parser, namespace, values, option_string)


def register(subparsers) -> None:
    """Add the ``capacity`` and ``sweep`` subcommands."""
    from sim.cluster.routers import EXECUTORS, ROUTERS
    cap = subparsers.add_parser(
        "capacity", help="highest request rate per GPU replica under latency SLOs; replicas for a target rate",
        description="Search the arrival-rate scale of a trace (exponential bracket, then bisection) for the highest "
                    "rate one replica serves with every SLO met and a stable queue (docs/capacity.md).")
    _add_common(cap)
    cap.add_argument("--target-rate", type=float, default=None, metavar="R",
                     help="requests/s to serve: print the replicas needed, ceil(R / capacity) (default: none)")
    cap.add_argument("--check-replicas", action="store_true",
                     help="with --target-rate: simulate R req/s routed over that many replicas and check the SLOs")
    cap.add_argument("--routing", choices=ROUTERS, default=None,
                     help="routing for --check-replicas; without --check-replicas it is refused (default: round-robin)")
    cap.add_argument("--workers", type=int, default=1, metavar="N",
                     help="evaluate up to N candidate rates at once on a local process pool (the same answer and "
                          "steps as the serial search; points off its path are computed and discarded)")
    from analysis.flags import FORCE_HELP, add_out
    cap.add_argument("--out", dest="json", default=None, metavar="FILE", action=_OutFile,
                     help="also write the result (and every step) as a JSON file (default: none)")
    cap.add_argument("--json", dest="json", default=argparse.SUPPRESS, help=argparse.SUPPRESS,  # deprecated: --out
                     action=_DeprecatedJson)
    cap.add_argument("--force", action="store_true", help=FORCE_HELP + "; here a JSON file kvsim capacity wrote")
    from sim.frontend.disagg_options import add_disagg_args
    add_disagg_args(cap, search=True)
    cap.add_argument("--colocate", action="store_true",
                     help="several models on one GPU (--tenant ... with slo=): the highest common rate scale at which "
                          "every tenant's SLOs hold, for static and elastic sharing (docs/colocate.md)")
    cap.add_argument("--tenant", action="append", metavar="SPEC", help="with --colocate: a tenant (as kvsim colocate; repeat) (default: none)")
    cap.add_argument("--compute", choices=("serial", "isolated"), default="serial",
                     help="with --colocate: the tenants' compute (as kvsim colocate) (default: serial)")
    cap.set_defaults(func=cmd_capacity, option_defaults=tuple(
        (action.dest, action.option_strings[-1], _parsed_default(action)) for action in cap._actions
        if action.option_strings and action.dest != "help" and action.default is not argparse.SUPPRESS))
    sweep = subparsers.add_parser(
        "sweep", help="run a Cartesian grid of simulate (or capacity) runs into one table and figure",
        description="Run every point of --grid (any simulate option or SimConfig field as an axis) and write "
                    "DIR/sweep.parquet, sweep.csv and sweep.html; points already in DIR/points are skipped.")
    sweep.add_argument("--grid", action="append", required=True, metavar="AXIS=V1,V2,...",
                       help="a grid axis (repeat), e.g. --grid page_size=64KiB,2MiB --grid policy=vattention,paged")
    sweep.add_argument("--job", choices=("simulate", "capacity"), default="simulate",
                       help="per-point job: simulate (summary) or capacity (needs --slo)")
    sweep.add_argument("--executor", choices=EXECUTORS, default="local",
                       help="local: process pool on this machine; ray: Ray tasks")
    sweep.add_argument("--ray-address", default=None, help="Ray cluster address (default: start a local instance)")
    sweep.add_argument("--workers", type=int, default=None, help="parallel processes / local Ray CPUs (default: all cores)")
    add_out(sweep, "output directory: new, empty, or a sweep to resume (its finished points are kept and reused)",
            required=True, force_extra="start afresh, once the sweep is done (no point is reused)")
    _add_common(sweep)
    add_disagg_args(sweep)
    sweep.set_defaults(func=cmd_sweep)


# ---- capacity ------------------------------------------------------------------------------------------
ROOFLINE_CAPACITY_NOTE = (
    "{gpu} has no measured compute profile, so the built-in roofline times it: faster than a serving engine runs, "
    "so its capacity reads high (on the H200, whose default is its engine profile, the roofline gives 25.80 req/s "
    "where the profile gives 20.78, +24%: README, 'Capacity planning'); compare GPUs under one compute model "
    "(--profile roofline for each)")
"""Said by ``capacity`` when a GPU's default timing is the roofline (helper-63 found an H100 and an H200 equal at
16.87 req/s on the whole conversation trace, each under a different compute model; the figures are the README's
2,000-request capacity search on the H200, re-run this stop: 25.802 req/s with ``--profile roofline``)."""
COLOCATE_SHARED = frozenset({"colocate", "tenant", "compute", "gpu", "memory_util", "seed", "page_size", "tp",
                             "profile", "quiet", "tolerance"})
"""The ``capacity`` options ``--colocate`` reads (``analysis.colocate.tenant_args`` shares gpu, memory-util, seed,
page size, tp and profile with every tenant); every other option set is refused, not dropped."""


def _per_tenant_dests() -> frozenset:
    """Of the others, the options a ``--tenant`` key sets instead (:data:`sim.frontend.colocate_options.FLAG_KEYS`
    and ``slo``; docs/colocate.md)."""
    from sim.frontend.colocate_options import FLAG_KEYS
    return frozenset({flag.removeprefix("--").replace("-", "_") for flag in FLAG_KEYS.values()} | {"slo"})


def _parsed_default(action: argparse.Action):
    """An option's default as the parsed namespace holds it (argparse passes a string default through the type)."""
    if isinstance(action.default, str) and action.type is not None:
        try:
            return action.type(action.default)
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            return action.default
    return action.default


def _refuse_unshared_flags(args: argparse.Namespace) -> None:
    """``capacity --colocate``: refuse any option it does not read (an option is set when its value differs from its
    default, however it was spelled; helper-61 found 17 flags such as --kv-dtype or --engine silently dropped).

    Raises:
        ValueError: naming the first such flag, and the tenant key or the shared flags to use instead.
    """
    per_tenant = _per_tenant_dests()
    for dest, flag, default in args.option_defaults:
        if dest in COLOCATE_SHARED or getattr(args, dest, default) == default:
            continue
        if dest in per_tenant:
            raise ValueError(f"{flag} does not apply to capacity --colocate: give it per tenant in --tenant (keys: "
                             "docs/colocate.md; slo=ttft_p99=2s+tpot_p99=100ms); only --gpu, --memory-util, "
                             "--seed, --page-size, --tp and --profile are shared")
        raise ValueError(f"{flag} does not apply to capacity --colocate (it prints the common rate scale per sharing; "
                         "only --gpu, --memory-util, --seed, --page-size, --tp, --profile, --compute and --tolerance "
                         "are read besides --tenant)")


def cmd_capacity(args: argparse.Namespace) -> int:
    """``kvsim capacity``: search, print the steps and the answer, optionally check the replica count."""
    from analysis.planning.capacity import check_servable, find_capacity
    from analysis.planning.slo import search_objectives
    from sim.frontend.options import config_from_args
    from traces.workload import load_workload
    if not args.colocate and "--compute" in getattr(args, "given_options", ()):
        raise ValueError(f"--compute {args.compute} belongs to --colocate (how co-located tenants share the GPU's "
                         "compute); leave it out, or add --colocate --tenant ...")
    if args.colocate or args.tenant:
        from analysis.colocate import cmd_capacity_colocate
        if not args.colocate:
            raise ValueError("--tenant belongs to --colocate")
        _refuse_unshared_flags(args)
        return cmd_capacity_colocate(args)
    if not args.slo:
        raise ValueError("capacity needs --slo, e.g. --slo ttft_p99=2s,tpot_p99=100ms")
    if args.check_replicas and args.target_rate is None:
        raise ValueError("--check-replicas needs --target-rate R")
    if args.routing is not None and not args.check_replicas:
        raise ValueError(f"--routing {args.routing} applies to --check-replicas; add --check-replicas --target-rate R "
                         "or leave --routing out")
    args.routing = args.routing or "round-robin"
    if args.target_rate is not None and not 0 < args.target_rate < float("inf"):
        raise ValueError(f"--target-rate must be a finite rate > 0 req/s, got {args.target_rate}")
    if args.target_rate is not None and args.target_rate > MAX_TARGET_RATE_PER_S:     # (1e300: 300-digit replicas)
        raise ValueError(f"--target-rate must be at most {MAX_TARGET_RATE_PER_S:g} req/s, got {args.target_rate:g}")
    from sim.frontend.disagg_options import check_disagg_flags
    check_disagg_flags(args)
    if args.pd is not None or args.pd_search is not None:      # disaggregated (docs/disaggregated.md)
        from analysis.planning.disagg_cli import cmd_capacity_disagg
        return cmd_capacity_disagg(args)
    if args.json is not None:
        from analysis.output import CAPACITY_REPLACEABLE, check_out_file, command_inputs
        check_out_file(args.json, args.force, "--out", inputs=command_inputs(args), replaceable=CAPACITY_REPLACEABLE)
    slos = search_objectives(args)
    config = config_from_args(args)
    trace, notes = load_workload(args, config.seed, config.slot_max_tokens)
    from traces.workload import static_note
    for note in filter(None, notes + [static_note(config, trace)]):
        print(f"kvsim: warning: {note}", file=sys.stderr)
    if (args.arrival or "").strip().lower() == "offline":
        raise ValueError("--arrival offline puts every request at 0 s: capacity scales an arrival rate, which an "
                         "offline workload has not; use kvsim simulate for its throughput")
    check_servable(config, trace, args.allow_rejected)        # refuse before printing anything else
    started = time.perf_counter()
    from sim.core.runner import compute_gpu_note, harness_compute_warning
    # a borrowed VMM profile, sliding windows (sim.setup.config.SimConfig.notes), compute fits of another GPU
    for note in config.notes + compute_gpu_note(config, getattr(args, "profile", None)):
        print(f"kvsim: note: {note}", file=sys.stderr)
    for warning in harness_compute_warning(config, getattr(args, "profile", None)):    # compute timed on the harness
        print(f"kvsim: warning: {warning}", file=sys.stderr)
    print(f"capacity search: {config.model} on {config.gpu} (tp={config.tp}{f', pp={config.pp}' if config.pp > 1 else ''}), {config.label}, "
          f"{len(trace):,} requests of {trace.attrs.get('source', 'trace')}")
    from analysis.results import compute_model_text
    from sim.core.runner import compute_model_source
    described = compute_model_source(config, args.profile)[1]
    print(f"compute model: {compute_model_text(described, config.gpu)}")
    if described.startswith("roofline") and not args.profile:
        print(f"kvsim: note: {ROOFLINE_CAPACITY_NOTE.format(gpu=config.gpu)}", file=sys.stderr)
    print(f"SLOs: {', '.join(map(str, slos))}; stable: TTFT growth <= {args.stability_tol:g} s/s; "
          f"tolerance {args.tolerance:.1%}")
    if slos[-1].metric == "sched_delay_p50" and "sched_delay" not in args.slo:
        print("(sched_delay_p50<=2s is the default bound: Sarathi-Serve's capacity definition; set any "
              "sched_delay_* objective in --slo to replace it)")
    if not args.quiet:                # --quiet: no per-step lines, so no header for them either
        print(_step_header(slos))
    numbers = itertools.count(1)
    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    from analysis.flags import Progress
    with Progress(None, args.quiet, "capacity search: simulations done") as progress:
        def on_step(evaluation) -> None:
            number = next(numbers)
            if not args.quiet:
                print(_step_line(number, evaluation, slos), flush=True)
            if progress is not None:
                progress(number)
        result = find_capacity(config, trace, slos, args.tolerance, args.profile, args.stability_tol,
                               None if args.quiet else on_step, allow_rejected=args.allow_rejected,
                               workers=args.workers)
    for line in capacity_lines(result, args.target_rate):
        print(line)
    if result.best is not None:
        from analysis.planning.cost import cost_line
        print(cost_line(result.rate_per_s, config))
    check = _check_replicas(args, config, trace, result) if args.check_replicas else None
    print(f"searched in {time.perf_counter() - started:.1f} s wall ({len(result.steps)} simulations)")
    if args.json is not None:
        _write_json(Path(args.json), result, args.target_rate, check, config,
                    described={"trace": trace.attrs.get("source", args.trace), "profile": args.profile,
                               "compute_model": compute_model_text(compute_model_source(config, args.profile)[1],
                                                                   config.gpu)})
    return 0 if result.rate_per_s else 1


def _points_of(table, column: str, value, axes: list[str], shown: int = 3) -> str:
    """The grid points (``axis=value ...``) of ``table`` whose ``column`` is ``value``: the first ``shown`` and a count."""
    rows = table[table[column] == value]
    points = [" ".join(f"{axis}={row[axis]}" for axis in axes) for _, row in rows.iterrows()]
    return ", ".join(points[:shown]) + (f" and {len(points) - shown} more" if len(points) > shown else "")


def short_span_line(table, axes: list[str]) -> str | None:
    """A ``WARNING:`` line when some capacity points rest on fewer requests than last
    :data:`analysis.planning.capacity.MIN_STEADY_SPAN_S` at their capacity (as ``kvsim capacity`` warns for one):
    how many, the shortest and the cheapest passing point's span; None when every point's span is long enough
    (or the table has no spans: a simulate sweep)."""
    import pandas as pd

    from analysis.planning.capacity import MIN_STEADY_SPAN_S
    if "span_at_capacity_s" not in table or table.empty:
        return None
    spans = pd.to_numeric(table["span_at_capacity_s"], errors="coerce")
    short = table[spans < MIN_STEADY_SPAN_S]
    if short.empty:
        return None
    shortest = short.loc[spans[short.index].idxmin()]
    point = " ".join(f"{axis}={shortest[axis]}" for axis in axes)
    cheapest = table[table["cheapest_passing"]] if "cheapest_passing" in table else table.iloc[:0]
    chosen = (f"; the cheapest passing point's is {float(spans[cheapest.index[0]]):,.0f} s"
              if len(cheapest) and spans[cheapest.index[0]] < MIN_STEADY_SPAN_S else "")
    return (f"WARNING: {len(short)} of {len(table)} points' capacities rest on requests spanning less than "
            f"{MIN_STEADY_SPAN_S:.0f} s at that rate (shortest {float(spans[shortest.name]):,.0f} s, {point}{chosen}): "
            "a queue that builds more slowly goes unseen and those capacities read high (docs/capacity.md, "
            "\"Short traces\"); give more requests (--num-requests) before planning on them")


MAX_TARGET_RATE_PER_S = 1e15
"""The largest ``--target-rate`` accepted (req/s; 1e300 printed a 300-digit replica count)."""


def compute_model_source_key(text: str) -> str:
    """The source of a compute-model description (``summary.json``'s ``compute_model``, see
    :func:`sim.core.runner.compute_model_source`): its kind and the fit it reads, e.g. ``"roofline (built-in
    defaults)"`` or ``"in-loop (compute_in_loop of profiles/h200.json)"``, without the per-point details (why a
    profile's fit did not apply, what it still supplies) and the per-GPU :data:`ROOFLINE_CAVEAT`. Two points with
    one key take their compute times from the same formula and coefficients."""
    kind, _, rest = text.partition(" (")
    if not rest:
        return kind.split(";")[0]
    return f"{kind} ({re.split(r'[;:)]', rest, maxsplit=1)[0]})"


def compute_model_lines(table, column: str, axes: list[str], profile: str | None) -> list[str]:
    """The lines a sweep prints about its compute models: one per source (:func:`compute_model_source_key`) with
    its points when there are several, the roofline caveat once with the GPUs it applies to, a pointer to the
    per-point details in the table, and a warning (a line starting ``kvsim: warning:``) when the points are timed
    by more than one source."""
    texts = table[column].dropna()
    if texts.empty:
        return []
    keys = texts.map(compute_model_source_key)
    sources = list(dict.fromkeys(keys))
    keyed = table.loc[texts.index].assign(_source=keys)
    lines = []
    for source in sources:
        count = int((keys == source).sum())
        points = f": {_points_of(keyed, '_source', source, axes)}" if len(sources) > 1 else ""
        lines.append(f"compute model: {source} ({count} point{'s' if count != 1 else ''}{points})")
    from sim.results.summary import ROOFLINE_CAVEAT
    caveated = [str(gpu) for text, gpu in zip(texts, table.loc[texts.index, "gpu"] if "gpu" in table
                                              else ["this GPU"] * len(texts))
                if ROOFLINE_CAVEAT.format(gpu=gpu) in text]
    if caveated:
        lines.append("  roofline points: " + ROOFLINE_CAVEAT.format(gpu=", ".join(dict.fromkeys(caveated))))
    if any(text != source and not text.startswith(source + "; not validated") for text, source in zip(texts, keys)):
        lines.append(f"  (each point's full compute-model note: the {column} column of sweep.csv)")
    if len(sources) > 1:
        same = ("" if profile == "roofline" else "; --profile roofline times every point alike")
        lines.append(f"kvsim: warning: the points are timed by {len(sources)} different compute models (above): a "
                     "difference between them is partly the models' (e.g. a measured profile against the datasheet "
                     f"roofline){same}")
    return lines


def _step_header(slos) -> str:
    columns = "".join(f" {slo.header():>15}" for slo in slos)
    return f"{'step':>4} {'scale':>8} {'rate req/s':>11}{columns} {'TTFT growth':>11}  result"


def _step_line(number: int, evaluation, slos) -> str:
    values = "".join(f" {slo.cell(evaluation.values_us[slo.metric]):>15}" for slo in slos)
    verdict = "pass" if evaluation.passed else "FAIL " + ",".join(evaluation.failed)
    return (f"{number:>4} {evaluation.scale:>8.4g} {evaluation.rate_per_s:>11.3f}{values} "
            f"{evaluation.ttft_growth:>11.3f}  {verdict}")


def capacity_lines(result, target_rate: float | None) -> list[str]:
    """The printed answer: unservable requests (loudly), capacity per replica in served requests, binding
    constraint, replicas for the target."""
    from analysis.planning.capacity import unservable_line

    if result.best is None:
        from analysis.planning.capacity import zero_load_line
        why = zero_load_line(result.steps)
        return [f"capacity: none: the SLOs fail even at {result.above.rate_per_s:.4g} req/s "
                f"(binding: {result.binding}); " + (f"{why}; " if why else "")
                + "relax the SLOs or change the configuration"]
    lines = [f"WARNING: {unservable_line(result.unservable, result.num_requests)}; the capacity below counts served "
             "requests only (--allow-rejected)"] if result.unservable else []
    bound = "at least " if result.above is None else ""      # no rate tried failed: a lower bound only
    lines += [f"capacity per replica: {bound}{result.rate_per_s:.3f} served req/s = {result.output_tokens_per_s:,.0f} output tokens/s "
             f"({result.total_tokens_per_s:,.0f} prompt+output tokens/s) at scale x{result.best.scale:.4g} "
             f"of the trace's {result.base_rate_per_s:.3f} req/s",
             f"binding constraint: {result.binding}" + (
                 f" (fails at {result.above.rate_per_s:.3f} req/s)" if result.above else "")]
    if result.above is None:
        lines.append(f"WARNING: no rate tried failed the SLOs, so the capacity is a lower bound, not a measurement: "
                     f"{result.num_requests:,} requests are too few to load a replica at any rate (give more with "
                     "--num-requests or a longer trace)")
    elif result.short_span_warning:
        lines.append(f"WARNING: {result.short_span_warning}")
    if target_rate is not None:
        lines.append(f"replicas for {target_rate:g} req/s: {'at most ' if bound else ''}"
                     f"{result.replicas_for(target_rate)}")
    return lines


CHECK_MIN_REQUESTS_PER_REPLICA = 100
"""Requests per replica below which ``--check-replicas`` warns: a p99 of fewer than 100 requests is their
maximum, and the TTFT growth of a handful is noise."""


def _check_replicas(args, config, trace, result) -> dict | None:
    """Simulate the target rate routed over the computed replica count; print whether the SLOs hold."""
    import traces
    from analysis.planning.capacity import base_rate_per_s, judge
    from sim.cluster.routing import run_routed
    from analysis.planning.slo import search_objectives, ttft_growth
    replicas = result.replicas_for(args.target_rate)
    if replicas is None:
        print("check: skipped (no capacity)")
        return None
    if replicas > len(trace):          # every replica past the trace's length would serve nothing
        raise ValueError(f"--check-replicas: {args.target_rate:g} req/s needs {replicas:,} replicas, more than the "
                         f"trace's {len(trace):,} requests: the check would give most replicas none; lower "
                         "--target-rate or give a longer trace (--num-requests)")
    if len(trace) < CHECK_MIN_REQUESTS_PER_REPLICA * replicas:
        print(f"kvsim: warning: --check-replicas: {len(trace):,} requests over {replicas:,} replicas, about "
              f"{len(trace) / replicas:.0f} each: the check's percentiles and TTFT growth rest on few requests "
              f"(give at least {CHECK_MIN_REQUESTS_PER_REPLICA} per replica with --num-requests)", file=sys.stderr)
    if args.routing == "session-hash":        # as kvsim simulate --replicas warns
        from sim.cluster.routing import session_key_note
        note = session_key_note(trace, replicas)
        if note:
            print(f"kvsim: warning: --check-replicas: {note}", file=sys.stderr)
    # the target counts served requests: offer target / served fraction (unservable requests are rejected)
    scale = args.target_rate / (base_rate_per_s(trace) * result.served_fraction)
    scaled = traces.scale_rate(trace, scale)
    slos = search_objectives(args)

    def check(count: int):
        routed = run_routed(config, scaled, count, args.routing, args.profile)
        verdict = judge(scale, args.target_rate, routed.summary, ttft_growth(routed.requests), slos,
                        args.stability_tol, sum(result.unservable.values()), routed.requests)
        values = ", ".join(f"{slo.metric}={slo.cell(verdict.values_us[slo.metric])}{slo.header().split()[-1][1:-1]}"
                           for slo in slos)
        print(f"check: {args.target_rate:g} req/s over {count} replicas ({args.routing}): {values}, "
              f"TTFT growth {verdict.ttft_growth:.3f}: " + ("SLOs hold" if verdict.passed else
                                                             "FAIL " + ", ".join(verdict.failed)))
        return verdict

    verdict = check(replicas)
    # replicas pooled behind a router may serve more than the count x one replica's capacity (helper-63: 10 computed,
    # 8 held under least-outstanding): while the count holds, one fewer is tried, down to the first that fails
    fewest, tried = (replicas if verdict.passed else None), []
    while fewest is not None and fewest > 1:
        fewer = check(fewest - 1)
        tried.append({"replicas": fewest - 1, "passed": fewer.passed, "failed": list(fewer.failed)})
        if not fewer.passed:
            break
        fewest -= 1
    if fewest is not None and fewest < replicas:
        from analysis.planning.capacity import MIN_STEADY_SPAN_S
        span_s = float(scaled["arrival_s"].max() - scaled["arrival_s"].min()) if len(scaled) > 1 else 0.0
        short = (f"; the check's traffic spans only {span_s:.0f} s, under the {MIN_STEADY_SPAN_S:.0f} s in which a "
                 "slowly building queue shows: give more requests before planning on fewer" if span_s < MIN_STEADY_SPAN_S
                 else "")
        print(f"fewest replicas that hold {args.target_rate:g} req/s in the check ({args.routing}): {fewest}, not the "
              f"{replicas} the per-replica capacity gives{short}")
    return {"replicas": replicas, "routing": args.routing, "passed": verdict.passed, "failed": list(verdict.failed),
            "values_us": verdict.values_us, "ttft_growth": verdict.ttft_growth, "fewest_replicas": fewest,
            "fewer_tried": tried}


def _write_json(path: Path, result, target_rate, check, config=None, described: dict | None = None) -> None:
    """The ``--out`` record: the search's result and steps and, so that the file stands on its own, what was
    searched (model, GPU, parallelism, policy, engine, scheduler, trace, compute model: ``described``)."""
    steps = [{"scale": e.scale, "rate_per_s": e.rate_per_s, "values_us": e.values_us, "ttft_growth": e.ttft_growth,
              "failed": list(e.failed)} for e in result.steps]
    from analysis.output import CAPACITY_FILE_MARK
    record = {**CAPACITY_FILE_MARK, **result.to_dict(), "slos": [str(s) for s in result.slos],
              "tolerance": result.tolerance, "target_rate_per_s": target_rate,
              "replicas": result.replicas_for(target_rate) if target_rate else None, "check": check, "steps": steps}
    if config is not None:
        record.update(model=config.model, gpu=config.gpu, tp=config.tp, pp=config.pp, policy=config.label,
                      engine=config.engine, scheduler=config.scheduler, token_budget=config.token_budget,
                      max_batch=config.max_batch_slots, max_context_tokens=config.slot_max_tokens,
                      **(described or {}))
        from analysis.planning.cost import replica_usd_per_hour, requests_per_usd
        record.update(gpus_per_replica=config.gpus_per_replica, usd_per_gpu_hour=config.gpu_spec.usd_per_gpu_hour,
                      price_source=config.gpu_spec.price_source, replica_usd_per_hour=replica_usd_per_hour(config),
                      requests_per_usd=requests_per_usd(result.rate_per_s, config))
    from analysis.output import write_file_atomic
    text = strict_json_text(record, indent=2, default=str) + "\n"    # NaN as null
    write_file_atomic(path, lambda temporary: temporary.write_text(text))


# ---- sweep ---------------------------------------------------------------------------------------------
def _check_long_context(jobs) -> None:
    """Refuse the sweep (before anything runs) when a point sets a --max-context beyond its model's native
    context without --allow-long-context: an option error, not a failed point."""
    from analysis.planning.sweep import point_args
    from sim.setup.catalog import CatalogError, get_model
    from sim.setup.config import ConfigError
    for job in jobs:
        args, fields = point_args(job)
        model = fields.get("model", args.model)
        tokens = fields.get("max_context_tokens", args.max_context)
        allowed = fields.get("allow_long_context", getattr(args, "allow_long_context", False))
        try:
            native = get_model(model).max_context_tokens
        except CatalogError:
            continue          # that point fails with its own message
        if tokens and tokens > native and not allowed:
            point = " ".join(f"{a}={v}" for a, v in job.point.items())
            raise ConfigError(f"--max-context {tokens}: beyond {model}'s native context of {native:,} tokens (grid "
                              f"point {point}); pass --allow-long-context to simulate it anyway")


def _inert_page_size_notes(jobs: list) -> list[str]:
    """Notes for grid points that differ only in ``page_size`` under a policy that maps no VMM pages (``paged``
    block tables take their block size, ``paged:block=N``; ``static`` reserves whole slots): such points run the
    same configuration, so their rows are equal. One note per policy, naming the repeated points."""
    from analysis.planning.sweep import point_args, resolve_axis
    from sim.frontend.options import config_from_args
    groups: dict[tuple, list[str]] = {}
    for job in jobs:
        axes = dict(job.point)
        page_axis = next((name for name in axes if resolve_axis(name).dest == "page_size"), None)
        if page_axis is None:
            continue
        try:
            args, overrides = point_args(job)
            config = config_from_args(args, **overrides)
        except (ValueError, KeyError):      # that point fails with its own message
            continue
        if config.uses_vmm:
            continue
        rest = tuple((name, value) for name, value in axes.items() if name != page_axis)
        groups.setdefault((config.policy, rest), []).append(" ".join(f"{a}={v}" for a, v in axes.items()))
    notes: dict[str, str] = {}
    for (policy, _), points in groups.items():
        if len(points) > 1 and policy not in notes:
            notes[policy] = (f"page_size does not apply to policy {policy} (it maps no VMM pages"
                             + ("; its block size is paged:block=N" if policy == "paged" else "")
                             + f"): {' and '.join(points[:2])}{' ...' if len(points) > 2 else ''} run the same "
                             "configuration and give equal rows")
    return list(notes.values())


def _point_config_error(job) -> str | None:
    """Why the point's configuration cannot be built (an unknown GPU or model, a tp that does not divide the heads,
    a value out of range), or None; a P/D point is built as a deployment. The trace is not read here."""
    from analysis.planning.sweep import point_args
    from sim.frontend.disagg_options import disagg_config_from_args, pd_of
    from sim.frontend.options import config_from_args
    args, overrides = point_args(job)
    try:
        (disagg_config_from_args if pd_of(args) is not None else config_from_args)(args, **overrides)
    except (ValueError, KeyError, OSError) as exc:      # ConfigError and CatalogError are ValueErrors
        return str(exc) or type(exc).__name__
    trace = getattr(args, "trace", None)
    if trace and not Path(trace).exists():    # (read by the point itself; a missing file is wrong at every point)
        return f"--trace {trace}: no such file"
    return None


def _inert_rate_scale_notes(jobs: list) -> list[str]:
    """A note when grid points differ in ``rate_scale`` under ``--arrival offline`` (every request arrives at 0 s:
    the points are one configuration and their rows equal, as ``kvsim simulate`` says for one run)."""
    from analysis.planning.sweep import point_args
    if not any(str(getattr(point_args(job)[0], "arrival", None) or "").strip().lower() == "offline"
               and any(axis in ("rate_scale", "rate-scale") for axis in job.point) for job in jobs):
        return []
    return ["--grid rate_scale changes nothing with --arrival offline (every request arrives at 0 s): those "
            "points run one configuration and their rows are equal"]


def _refuse_bad_axis_values(jobs: list) -> None:
    """Refuse, before any point runs, an axis value whose every point cannot be configured (``gpu=h999``, a
    misspelt model, ``tp=3`` for 8 KV heads): it is wrong whatever the other axes hold. A value that fails only
    beside some other axis' values (``tp=8`` with a model of 4 KV heads) stays a failed row, as documented, and
    the other points run.

    Raises:
        ValueError: naming the axis value and the first of its points' errors.
    """
    errors = {job.key: _point_config_error(job) for job in jobs}
    by_value: dict[tuple[str, str], list] = {}
    for job in jobs:
        for axis, value in job.point.items():
            by_value.setdefault((axis, value), []).append(job)
    for (axis, value), points in by_value.items():
        if all(errors[job.key] for job in points):
            raise ValueError(f"--grid {axis}={value}: {errors[points[0].key]}")


def _sweep_harness_warnings(jobs: list, profile: str | None) -> list[str]:
    """The distinct :func:`sim.core.runner.harness_compute_warning` lines of the sweep's points (as ``kvsim
    simulate`` and ``kvsim capacity`` print them), in grid order; a point whose settings are refused is left to
    fail on its own (its error is in the table)."""
    from analysis.planning.sweep import point_args
    from sim.core.runner import harness_compute_warning
    from sim.frontend.options import config_from_args
    warnings: list[str] = []
    for job in jobs:
        point, overrides = point_args(job)
        try:
            config = config_from_args(point, **overrides)
        except Exception:  # noqa: BLE001 - the point reports its own error when it runs
            continue
        warnings += [w for w in harness_compute_warning(config, getattr(point, "profile", profile))
                     if w not in warnings]
    return warnings


def _note_other_points(out_dir: Path, jobs: list) -> None:
    """A sweep directory is a cache of points: a grid run into it reuses the points it shares and tables only its
    own. Finished points of another grid stay under ``points/`` but leave the rewritten table: said, with how to
    table them again (their own command reruns nothing)."""
    stored = {path.stem for path in (out_dir / "points").glob("*.json")}
    other = stored - {job.key for job in jobs}
    if other:
        print(f"kvsim: note: --out {out_dir} holds {len(other):,} finished point{'s' if len(other) != 1 else ''} "
              f"of another grid; they stay under {out_dir / 'points'} but not in the sweep.csv / sweep.parquet / sweep.html written now (rerun their "
              "own command to table them again: it simulates nothing; --force clears them)", file=sys.stderr)


def cmd_sweep(args: argparse.Namespace) -> int:
    """``kvsim sweep``: run the missing points, write the table and the figure, print a short report."""
    from analysis.planning.sweep import base_settings, make_jobs, parse_grid, sweep_table, write_table
    from analysis.planning.sweep_figure import write_figure
    from analysis.planning.sweep_run import run_sweep
    grid = parse_grid(args.grid)
    if isinstance(getattr(args, "trace", None), str) and not args.trace.strip():
        raise ValueError(f"--trace {args.trace!r}: an empty path; name a trace file, or leave --trace out for the "
                         "built-in synthetic workload")
    if isinstance(getattr(args, "trace", None), str) and not Path(args.trace).exists():
        from traces.named import resolve_trace
        resolve_trace(args.trace)      # a missing file (or an unknown name) is refused before any point runs
    if args.job == "capacity" or args.slo or args.slo_attainment is not None:    # refused before any point runs
        from analysis.planning.slo import objectives
        objectives(args.slo or "", args.slo_attainment)
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    if args.ray_address is not None and args.executor != "ray":
        raise ValueError(f"--ray-address {args.ray_address} applies to --executor ray; add it, or leave "
                         "--ray-address out")
    if args.job != "capacity" and "--tolerance" in getattr(args, "given_options", ()):
        raise ValueError("--tolerance is the capacity search's; a simulate sweep searches nothing (add --job "
                         "capacity, or leave --tolerance out)")
    from sim.timing.latency import check_profile_option
    check_profile_option(getattr(args, "profile", None))   # a bad profile is refused once, before any point runs
    jobs = make_jobs(grid, base_settings(args), args.job, getattr(args, "given_options", ()))
    _check_long_context(jobs)
    from analysis.planning.sweep import point_args
    from sim.frontend.disagg_options import check_disagg_flags
    for job in jobs:                  # a bad --pd, --kv-link, ... value is refused before any point runs
        check_disagg_flags(point_args(job)[0], allow_unused=True)
    _refuse_bad_axis_values(jobs)
    for note in _inert_page_size_notes(jobs) + _inert_rate_scale_notes(jobs):
        print(f"kvsim: note: {note}", file=sys.stderr)
    for warning in _sweep_harness_warnings(jobs, getattr(args, "profile", None)):   # compute timed on the harness
        print(f"kvsim: warning: {warning}", file=sys.stderr)
    from analysis.output import OutputDir, command_inputs
    out = OutputDir(args.out, args.force, resumable=True, inputs=command_inputs(args))
    out_dir = out.path
    # resuming rewrites the table from the stored points; a kvsim result that is not a sweep is not mixed into
    if out.existing and not args.force and not (out_dir / "points").is_dir():
        raise FileExistsError(f"--out {out_dir} holds a kvsim result that is not a sweep; choose another --out or "
                              "pass --force to replace it")
    if out.existing and not args.force and (out_dir / "points").is_dir():
        _note_other_points(out_dir, jobs)
    started = time.perf_counter()
    if out.replaces:   # --force: a fresh sweep, written beside the old result and renamed over it at the end
        with out.writing() as stage:
            records, ran = run_sweep(jobs, stage, args.executor, args.workers, args.ray_address, args.quiet)
            table = sweep_table(jobs, records)
            files = [out_dir / f.name for f in write_table(table, stage)]
            write_figure(table, list(grid), stage / "sweep.html", args.job)
    else:
        out_dir.mkdir(parents=True, exist_ok=True)
        out.mark()                    # a sweep written in place (and resumable) is a kvsim result from its start
        records, ran = run_sweep(jobs, out_dir, args.executor, args.workers, args.ray_address, args.quiet)
        table = sweep_table(jobs, records)
        write_table(table, out_dir)
        files = [out_dir / "sweep.parquet", out_dir / "sweep.csv"]
        write_figure(table, list(grid), out_dir / "sweep.html", args.job)
    files.append(out_dir / "sweep.html")
    failed = int((table["status"] != "ok").sum())
    print(f"sweep: {len(jobs)} points ({ran} run now, {len(jobs) - ran} already in {out_dir / 'points'}), "
          f"{failed} failed, {time.perf_counter() - started:.1f} s wall ({args.executor})")
    for _, row in table[table["status"] != "ok"].iterrows():
        print(f"  failed: {' '.join(f'{a}={row[a]}' for a in grid)}: {row['error']}")
    column = next((c for c in ("compute_model", "at_capacity_compute_model") if c in table), None)
    if column is not None:            # which compute model produced the points' times (one line per source)
        for line in compute_model_lines(table, column, list(grid), getattr(args, "profile", None)):
            print(line, file=sys.stderr if line.startswith("kvsim: warning:") else sys.stdout)
    from analysis.planning.cost import cheapest_line
    print(cheapest_line(table, list(grid), judged=args.job == "capacity" or bool(args.slo)))
    span_warning = short_span_line(table, list(grid))
    if span_warning:
        print(span_warning)
    print("wrote " + ", ".join(str(f) for f in files))
    return 1 if failed else 0
