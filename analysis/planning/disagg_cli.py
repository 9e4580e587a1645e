"""``kvsim capacity --pd P:D`` (one disaggregated deployment) and ``kvsim capacity --pd-search GPUS`` (every P:D
and tensor-parallel degree per role within a GPU budget against co-located replicas); the sweep's points with
a ``pd`` axis. Called from :mod:`analysis.planning.cli` and :mod:`analysis.planning.sweep_run`."""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

from sim.results.json_text import strict_json_text


def _step_line(number: int, evaluation, slos, prefix: str = "") -> str:
    values = "".join(f" {slo.cell(evaluation.values_us[slo.metric]):>15}" for slo in slos)
    verdict = "pass" if evaluation.passed else "FAIL " + ",".join(evaluation.failed)
    return (f"{prefix}{number:>4} {evaluation.scale:>8.4g} {evaluation.rate_per_s:>11.3f}{values} "
            f"{evaluation.ttft_growth:>11.3f}  {verdict}")


def _step_header(slos, prefix: str = "") -> str:
    columns = "".join(f" {slo.header():>15}" for slo in slos)
    return f"{prefix}{'step':>4} {'scale':>8} {'rate req/s':>11}{columns} {'TTFT growth':>11}  result"


def cmd_capacity_disagg(args: argparse.Namespace) -> int:
    """Capacity of ``--pd P:D``, or the ``--pd-search`` ranking; exit status 1 when nothing passes."""
    from analysis.planning.slo import search_objectives
    from sim.frontend.disagg_options import disagg_config_from_args, parse_tp_list, role_config
    from traces.workload import load_workload

    if args.check_replicas:
        raise ValueError("--check-replicas applies to co-located replicas; with --pd or --pd-search leave it out")
    if "--workers" in getattr(args, "given_options", ()):
        print("kvsim: note: --workers applies to the co-located search; a --pd or --pd-search search runs its "
              "steps in this process", file=sys.stderr)
    if args.json is not None:
        from analysis.output import CAPACITY_REPLACEABLE, check_out_file, command_inputs
        check_out_file(args.json, args.force, "--out", inputs=command_inputs(args), replaceable=CAPACITY_REPLACEABLE)
    slos = search_objectives(args)
    if args.pd is not None:
        base = role_config(args, "prefill")
        config = disagg_config_from_args(args)
        seed, slot = config.seed, config.slot_max_tokens
    else:      # at the search's largest degree: --pd-tp 4 for a model whose weights need it ran without --tp 4
        base = role_config(args, "prefill", max(parse_tp_list(args.pd_tp, args.tp)))     # (helper-63 was refused)
        seed, slot = base.seed, base.slot_max_tokens
    trace, notes = load_workload(args, seed, slot)
    from sim.core.runner import harness_compute_warning
    notes += harness_compute_warning(base, args.profile)       # compute timed on the replay harness
    for note in notes:
        print(f"kvsim: warning: {note}", file=sys.stderr)
    started = time.perf_counter()
    if args.pd is not None:
        status, record = _one_deployment(args, config, trace, slos)
    else:
        status, record = _search(args, trace, slos, parse_tp_list(args.pd_tp, args.tp))
    print(f"searched in {time.perf_counter() - started:.1f} s wall")
    if args.json is not None:
        from analysis.output import CAPACITY_FILE_MARK, write_file_atomic
        described = {"model": args.model, "gpu": args.gpu, "trace": trace.attrs.get("source", args.trace),
                     "num_requests": len(trace), "profile": args.profile,
                     "kv_link": args.kv_link or "ib"}   # stands alone (the link used: ib unless given)
        text = strict_json_text({**CAPACITY_FILE_MARK, **described, **record}, indent=2, default=str) + "\n"
        write_file_atomic(Path(args.json), lambda temporary: temporary.write_text(text))
    return status


def _one_deployment(args, config, trace, slos) -> tuple[int, dict]:
    from analysis.planning.disagg import find_disagg_capacity

    print(f"capacity search: {config.prefill.model} on {config.prefill.gpu}, {config.label} ({config.gpus} GPUs), "
          f"{len(trace):,} requests of {trace.attrs.get('source', 'trace')}")
    print(f"SLOs: {', '.join(map(str, slos))}; stable: TTFT growth <= {args.stability_tol:g} s/s; "
          f"tolerance {args.tolerance:.1%}")
    print(_step_header(slos))
    numbers = itertools.count(1)
    on_step = None if args.quiet else (lambda e: print(_step_line(next(numbers), e, slos), flush=True))
    result = find_disagg_capacity(config, trace, slos, args.tolerance, args.profile, args.stability_tol, on_step,
                                  args.allow_rejected)
    if result.best is None:
        from analysis.planning.capacity import zero_load_line
        why = zero_load_line(result.steps)
        print(f"capacity: none: the SLOs fail even at {result.above.rate_per_s:.4g} req/s (binding: {result.binding})"
              + (f"; {why}" if why else ""))
        return 1, {**result.to_dict(), "gpus": config.gpus}
    per_gpu = result.rate_per_s / config.gpus
    from analysis.planning.capacity import unservable_line
    if result.unservable:                # as the co-located answer says it (helper-58: it was not printed)
        print(f"WARNING: {unservable_line(result.unservable, result.num_requests).replace('one replica', 'the deployment')}"
              "; the capacity below counts served requests only (--allow-rejected)")
    bound = "at least " if result.above is None else ""      # no rate tried failed: a lower bound only
    print(f"capacity of the deployment: {bound}{result.rate_per_s:.3f} served req/s on {config.gpus} GPUs = {per_gpu:.3f} "
          f"req/s per GPU ({result.output_tokens_per_s:,.0f} output tokens/s) at scale x{result.best.scale:.4g} of "
          f"the trace's {result.base_rate_per_s:.3f} req/s")
    print(f"binding constraint: {result.binding}" + (f" (fails at {result.above.rate_per_s:.3f} req/s)"
                                                     if result.above else ""))
    if result.above is None:
        print(f"WARNING: no rate tried failed the SLOs, so the capacity is a lower bound, not a measurement: "
              f"{result.num_requests:,} requests are too few to load the deployment at any rate (give more with "
              "--num-requests or a longer trace)")
    elif result.short_span_warning:
        print(f"WARNING: {result.short_span_warning}")
    from analysis.planning.cost import cost_line, replica_usd_per_hour, requests_per_usd
    print(cost_line(result.rate_per_s, config.prefill, config.gpus, "deployment"))   # every role on one GPU kind
    prefill, decode = config.prefill, config.decode
    steps = [{"scale": e.scale, "rate_per_s": e.rate_per_s, "values_us": e.values_us, "ttft_growth": e.ttft_growth,
              "failed": list(e.failed)} for e in result.steps]        # (as the co-located --out: every step)
    record = {**result.to_dict(), "steps": steps, "gpus": config.gpus, "capacity_req_per_s_per_gpu": per_gpu,
              "pd": config.pd,
              "slos": [str(s) for s in slos], "tolerance": args.tolerance,
              "prefill_tp": prefill.tp, "decode_tp": decode.tp, "prefill_policy": prefill.label,
              "decode_policy": decode.label, "engine": prefill.engine, "scheduler": prefill.scheduler,
              "compute_model": deployment_compute_model(config, args.profile),
              "usd_per_gpu_hour": prefill.gpu_spec.usd_per_gpu_hour, "price_source": prefill.gpu_spec.price_source,
              "deployment_usd_per_hour": replica_usd_per_hour(config.prefill, config.gpus),
              "requests_per_usd": requests_per_usd(result.rate_per_s, config.prefill, config.gpus)}
    if args.target_rate is not None:
        units = result.replicas_for(args.target_rate)
        copies = "copy" if units == 1 else "copies"
        print(f"for {args.target_rate:g} req/s: {'at most ' if bound else ''}{units} {copies} of the {config.pd} deployment = "
              f"{units * config.prefill_gpus} prefill GPUs + {units * config.decode_gpus} decode GPUs = "
              f"{units * config.gpus} GPUs")
        record.update(target_rate_per_s=args.target_rate, units=units, gpus_for_target=units * config.gpus)
    return 0, record


def _search(args, trace, slos, tps: list[int]) -> tuple[int, dict]:
    from analysis.planning.disagg import ranking_lines, search_deployments

    link = args.kv_link or "ib"
    print(f"P:D search: {args.model} on {args.gpu}, up to {args.pd_search} GPUs per deployment, tp {tps}, kv link "
          f"{link}{', layer-wise' if (args.kv_stream or 'off') == 'layerwise' else ''}; {len(trace):,} requests of "
          f"{trace.attrs.get('source', 'trace')}")
    print(f"SLOs: {', '.join(map(str, slos))}; stable: TTFT growth <= {args.stability_tol:g} s/s; "
          f"tolerance {args.tolerance:.1%}")

    def on_result(result) -> None:
        if args.quiet:
            return
        if result.error:
            print(f"  {result.deployment.label}: skipped ({result.error})", flush=True)
            return
        capacity = result.capacity
        print(f"  {result.deployment.label:<22} {result.deployment.gpus:>2} GPUs  {result.rate_per_s:>8.3f} req/s  "
              f"{result.per_gpu:>7.3f} per GPU  binding {capacity.binding if capacity.best else 'every rate'}  "
              f"({len(capacity.steps)} simulations)", flush=True)

    results = search_deployments(args, trace, slos, args.pd_search, tps, on_result)
    for line in ranking_lines(results, args.target_rate):
        print(line)
    record = {"slos": [str(s) for s in slos], "max_gpus": args.pd_search, "tp": tps,
              "deployments": [r.to_dict(args.target_rate) for r in results]}
    return (0 if any(r.rate_per_s > 0 for r in results) else 1), record


# ---- sweep points ------------------------------------------------------------------------------------------
def simulate_point(args: argparse.Namespace, overrides: dict, trace_loader) -> tuple[str, dict]:
    """A sweep point with ``pd``: the deployment's summary (the nested role tables as JSON text)."""
    from sim.cluster.disagg import run_disagg
    from sim.frontend.disagg_options import disagg_config_from_args

    config = disagg_config_from_args(args, **overrides)
    trace = trace_loader(config.seed, config.slot_max_tokens)
    run = run_disagg(config, trace, args.profile)
    from analysis.planning.slo import point_objectives
    from analysis.results import with_goodput
    summary = {**run.summary, "compute_model": deployment_compute_model(config, args.profile)}
    return config.label, with_goodput(summary, run.requests, point_objectives(args))


def deployment_compute_model(config, profile: str | None) -> str:
    """The compute model a P/D deployment's roles are timed by (:func:`sim.core.runner.compute_model_source`'s
    description): the prefill role's, and the decode role's after it where it differs (another tp, a per-role
    profile), so a sweep's compute-model lines (``analysis.planning.cli.compute_model_lines``) count P/D points as
    they count co-located ones."""
    from sim.core.runner import compute_model_source
    prefill = compute_model_source(config.prefill, profile)[1]
    decode = compute_model_source(config.decode, profile)[1]
    return prefill if decode == prefill else f"{prefill}; decode role: {decode}"


def capacity_point(args: argparse.Namespace, overrides: dict, trace_loader) -> tuple[str, dict]:
    """A capacity sweep point with ``pd``: the deployment's capacity, GPUs and goodput per GPU."""
    from analysis.planning.disagg import find_disagg_capacity
    from analysis.planning.slo import search_objectives
    from sim.frontend.disagg_options import disagg_config_from_args

    if not args.slo:
        raise ValueError("--job capacity needs --slo (e.g. ttft_p99=2s,tpot_p99=100ms)")
    config = disagg_config_from_args(args, **overrides)
    trace = trace_loader(config.seed, config.slot_max_tokens)
    result = find_disagg_capacity(config, trace, search_objectives(args), args.tolerance,
                                  args.profile, args.stability_tol, allow_rejected=getattr(args, "allow_rejected", False))
    return config.label, {**result.to_dict(), "gpus": config.gpus,
                          "capacity_req_per_s_per_gpu": result.rate_per_s / config.gpus,
                          "at_capacity_compute_model": deployment_compute_model(config, args.profile)}


__all__ = ["capacity_point", "cmd_capacity_disagg", "deployment_compute_model", "simulate_point"]
