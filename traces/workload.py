"""The workload of a run from command-line options: the options that choose it (:func:`add_trace_args`) and
the trace they describe (:func:`load_workload`: a file or public trace name, or the built-in synthetic
workload; skip / first N / rate scale; clipped to the slot length)."""
from __future__ import annotations

import argparse
import warnings

from sim.frontend.argtypes import int_at_least, positive_float

MAX_SYNTHETIC_REQUESTS = 10_000_000
"""The most requests the built-in synthetic workload generates for one command (``--num-requests`` plus
``--skip-requests``; generating that many took 2.7 s and 655 MiB peak on the 2-core machine); beyond it the
command is refused at once."""


def add_trace_args(parser: argparse.ArgumentParser) -> None:
    """Options that choose the workload."""
    parser.add_argument("--trace", help="trace file (Azure, Splitwise/Vidur, length-only CSV, Mooncake JSONL, "
                                        "BurstGPT, canonical Parquet) or a public trace name (e.g. azure-conv-2023, "
                                        "see 'kvsim traces fetch') (default: the built-in synthetic workload)")
    parser.add_argument("--format", dest="trace_format", default=None, help="trace format (default: detect)")
    parser.add_argument("--arrival", default=None,
                        help="arrival process for length-only traces: poisson:RATE, gamma:RATE,CV or offline (every "
                             "request at 0 s); on a timed trace it replaces the trace's times (default: "
                             "the trace's own arrival times)")
    parser.add_argument("--skip-requests", type=int_at_least(0), default=0,
                        help="drop the first N requests (before --num-requests; the next one arrives at 0 s)")
    parser.add_argument("--num-requests", type=int_at_least(1), default=None,
                        help="use the first N requests (default: all; synthetic: 1000)")
    parser.add_argument("--sample", type=int_at_least(1), default=None, metavar="N",
                        help="N requests drawn at random (seeded by --seed) in shuffled order; with --arrival their "
                             "times are drawn afresh, without it they keep the trace's (default: no sampling)")
    parser.add_argument("--rate-scale", type=positive_float, default=1.0,
                        help="multiply the arrival rate (divide inter-arrival times) by X")


def load_workload(args: argparse.Namespace, seed: int, max_context_tokens: int, light: bool = False):
    """Load (or synthesise) the trace, apply --sample (a seeded shuffled sample, fresh --arrival times) or
    --skip-requests / --num-requests, then --rate-scale; clip to the slot length.

    ``light``: a CSV trace that :mod:`traces.fastcsv` reads stays a :class:`traces.canonical.TraceColumns`
    (no pandas imported; ``kvsim simulate``), unless ``--sample`` draws from it; every other workload is a
    DataFrame, as by default.

    Returns:
        ``(trace, notes)``: the canonical table and human-readable notes (warnings) to print.
    """
    import traces
    notes = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", traces.TraceWarning)
        if args.trace is not None and not str(args.trace).strip():
            raise traces.TraceError(f"--trace {str(args.trace)!r}: an empty path; name a trace file, or leave "
                                    "--trace out for the built-in synthetic workload")
        if args.trace:
            path = traces.resolve_trace(args.trace)  # a file, or a public trace name (kvsim traces fetch)
            trace = traces.load_trace(path, fmt=args.trace_format, arrival=args.arrival, seed=seed, light=light)
        else:
            unused = [flag for flag, value in (("--format", args.trace_format), ("--arrival", args.arrival),
                                               ("--sample", getattr(args, "sample", None))) if value]
            if unused:
                raise traces.TraceError(f"{' and '.join(unused)} appl{'y' if len(unused) > 1 else 'ies'} to a --trace; the built-in synthetic "
                                        "workload has its own arrivals and lengths")
            total = (args.num_requests or 1000) + getattr(args, "skip_requests", 0)
            if total > MAX_SYNTHETIC_REQUESTS:     # generated before anything is skipped: time and memory grow with it
                raise traces.TraceError(
                    f"--num-requests plus --skip-requests is {total:,}: the built-in synthetic workload generates every "
                    f"request it skips, and holds at most {MAX_SYNTHETIC_REQUESTS:,}; for a longer synthetic workload "
                    "build one with traces.synthetic_default in Python, or bench/bench_week.py for week-long traffic")
            trace = traces.synthetic_default(seed, num_requests=total)
    notes += [str(w.message) for w in caught if issubclass(w.category, traces.TraceWarning)]
    if getattr(args, "sample", None):
        clash = [flag for flag, used in (("--skip-requests", getattr(args, "skip_requests", 0)),
                                         ("--num-requests", args.num_requests)) if used]
        if clash:
            raise traces.TraceError(f"--sample draws from the whole trace; leave out {' and '.join(clash)}")
        from traces.canonical import as_frame
        trace = traces.shuffle_sample(as_frame(trace), args.sample, seed, args.arrival)
    if getattr(args, "skip_requests", 0):
        if args.skip_requests >= len(trace):
            raise traces.TraceError(f"--skip-requests {args.skip_requests}: the trace has only {len(trace)} requests")
        trace = traces.skip_n(trace, args.skip_requests)
    if args.num_requests:
        if args.num_requests > len(trace):       # kept, but said: a capacity planner may expect that many
            notes.append(f"--num-requests {args.num_requests:,}: the trace has only {len(trace):,} requests"
                         + (" after --skip-requests" if getattr(args, "skip_requests", 0) else "")
                         + "; all of them are simulated")
        trace = traces.first_n(trace, args.num_requests)
    if args.rate_scale != 1.0:
        if str(getattr(args, "arrival", None) or "").strip().lower() == "offline":
            notes.append(f"--rate-scale {args.rate_scale:g} changes nothing with --arrival offline: every request "
                         "arrives at 0 s")
        trace = traces.scale_rate(trace, args.rate_scale, "--rate-scale")
    if len(trace) == 0:
        filters = [flag for flag, used in (("--skip-requests", getattr(args, "skip_requests", 0)),
                                           ("--num-requests", args.num_requests)) if used]
        raise traces.TraceError(f"{trace.attrs.get('source', args.trace or 'the workload')}: no requests left"
                                + (f" after {' and '.join(filters)}" if filters else "") + "; nothing to simulate")
    trace, clipped = traces.clip_context(trace, max_context_tokens)
    if clipped:
        notes.append(f"{clipped} request(s) longer than the slot length ({max_context_tokens} tokens) were clipped")
    return trace, notes


def has_hash_ids(trace) -> bool:
    """Whether any request of ``trace`` carries prefix-block ids (a non-empty ``hash_ids`` list)."""
    if "hash_ids" not in trace.columns:
        return False
    return any(hasattr(ids, "__len__") and len(ids) > 0 for ids in trace["hash_ids"])


def prefix_note(trace, prefix_labels: list[str]) -> str | None:
    """A warning when prefix caching is on (for the policies ``prefix_labels``) but the trace has no
    ``hash_ids``: prefix matching compares those ids only, so no request can hit the cache, and the run is the
    plain policy's (with cached pages kept until evicted)."""
    if not prefix_labels or has_hash_ids(trace):
        return None
    return (f"{', '.join(prefix_labels)}: prefix caching matches prompts by their hash_ids (Mooncake JSONL, or a "
            "Parquet hash_ids column) and this trace has none, so no request can hit the cache (a request preempted "
            "by recompute under paged prefix caching still re-hits its own blocks, as in vLLM)")


STATIC_SLACK_FACTOR = 4
"""``static_note`` speaks when a static reservation is this many times the trace's longest request or more."""


def static_note(config, trace) -> str | None:
    """A note when a static reservation without ``max_len=`` reserves a whole slot (the model's context, e.g.
    131,072 tokens for Llama-3.1-70B) for every request and the trace's longest request (prompt + output - 1
    tokens) needs :data:`STATIC_SLACK_FACTOR` times less: few requests then fit, and the capacity collapses."""
    if config.policy != "static" or config.max_len_tokens or not len(trace):
        return None
    longest = int((trace["prompt_tokens"] + trace["output_tokens"] - 1).max())
    reserved = config.slot_max_tokens
    if reserved < STATIC_SLACK_FACTOR * longest:
        return None
    return (f"static reserves a whole slot, {reserved:,} tokens ({config.model}'s context or --max-context), per "
            f"request; this trace's longest request needs {longest:,}: static:max_len={longest} (or the engine's "
            "--max-model-len) reserves what a request can use")


def instances_note(num_prefill: int, num_decode: int, num_requests: int) -> str | None:
    """A warning when ``--pd P:D`` asks for more instances of a role than the trace has requests: the extra
    instances never serve one, but each is simulated (time and memory grow with ``P + D``)."""
    idle = [f"{count:,} {role} instances" for role, count in (("prefill", num_prefill), ("decode", num_decode))
            if count > num_requests]
    if not idle:
        return None
    return (f"--pd {num_prefill}:{num_decode}: {' and '.join(idle)} for {num_requests:,} requests: at most "
            f"{num_requests:,} of each role ever serve one, the others are simulated idle (slow); choose fewer")
