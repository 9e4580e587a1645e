"""``kvsim simulate --pd P:D``: run a disaggregated deployment (:mod:`sim.cluster.disagg`), write its run directory
and print its summary: the request latencies over the deployment, the KV transfers, and one row per role
(and per instance) with utilisation, queueing and memory."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sim.units import format_bytes


def _ms(value: float) -> str:
    if value != value:
        return "-"
    return f"{value:.2f}" if value < 10 else f"{value:,.1f}"


def kv_lines(summary: dict) -> list[tuple[str, str]]:
    """(label, value) rows of the KV transfers."""
    return [
        ("KV transferred", f"{format_bytes(summary['kv_transfer_bytes'])} in {summary['kv_transfers']:,} transfers "
                           f"over {summary['kv_link']}" + (", layer-wise" if summary["kv_stream"] == "layerwise" else "")),
        ("KV transfer p50 / p99 / max", " / ".join(_ms(summary[f"kv_transfer_{s}_ms"]) for s in ("p50", "p99", "max"))
         + " ms"),
        ("hand-over p50 / p99", f"{_ms(summary['kv_handover_p50_ms'])} / {_ms(summary['kv_handover_p99_ms'])} ms "
                                "(prefill done to KV landed)"),
    ]


ROLE_HEADER = ("role", "instances", "policy", "util.", "queue p50 / p99 ms", "waiting", "peak mapped / pool per GPU",
               "preempt.", "batch")


def role_rows(summary: dict) -> list[tuple[str, ...]]:
    """One row per role, then one per instance when there are at most 8 (``summary['roles']``,
    ``summary['instances']``); memory per tensor-parallel worker."""
    rows = []
    for role, table in summary["roles"].items():
        rows.append((role, f"{table['instances']} x tp{table['tp']}", table["policy"], f"{table['utilisation_mean']:.0%}",
                     f"{_ms(table['queue_delay_p50_ms'])} / {_ms(table['queue_delay_p99_ms'])}",
                     f"{table['mean_waiting']:.2f}",
                     f"{format_bytes(table['peak_mapped_bytes_max'])} / {format_bytes(table['pool_bytes_per_instance'])}",
                     f"{table['preemptions']:,}", f"{table['mean_batch_size']:.1f}"))
    instances = summary.get("instances", {})
    if len(instances) <= 8:
        for name, row in instances.items():
            rows.append((f"  {name}", f"{row['requests']:,} req", "", f"{row['utilisation']:.0%}",
                         f"{_ms(row['queue_delay_p50_ms'])} / {_ms(row['queue_delay_p99_ms'])}",
                         f"{row['mean_waiting']:.2f}",
                         f"{format_bytes(row['peak_mapped_bytes'])} / {format_bytes(row['pool_bytes'])}",
                         f"{row['preemptions']:,}", f"{row['mean_batch_size']:.1f}"))
    return rows


def format_table(header: tuple, rows: list[tuple]) -> list[str]:
    """Plain aligned text columns (first column left-aligned, the others right-aligned)."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [str(row[0]).ljust(widths[0])] + [str(c).rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
    return lines


def print_disagg_summary(summary: dict, label: str, source: str, wall_s: float | None = None,
                         out_dir: Path | None = None) -> None:
    """Print the workload line, the latency rows, the KV transfers and the role table."""
    from analysis.summary import attention_lines, summary_lines

    print(f"trace: {source}")
    print(label)
    if summary.get("compute_model"):
        print(f"compute model: {summary['compute_model']}")
    for line in attention_lines(summary):
        print(f"WARNING: {line}")
    keep = {"requests finished / total", "throughput", "output tokens", "TTFT p50 / p90 / p99", "TPOT p50 / p90 / p99",
            "TBT p50 / p99 / max", "scheduling delay p50 / p99", "E2E p50 / p90 / p99", "preemptions"}
    rows = [(name, value) for name, value in summary_lines(summary) if name in keep]
    rows.insert(3, ("throughput per GPU", f"{summary['throughput_req_per_s_per_gpu']:.3f} req/s on {summary['gpus']} GPUs"))
    rows += kv_lines(summary)
    width = max(len(name) for name, _ in rows) + 3
    for name, value in rows:
        print(f"{name.ljust(width)}{value}")
    print("(TTFT counts the KV transfer: the first token reaches the user when the KV has landed; scheduling delay "
          "is the prefill instance's)")
    for line in format_table(ROLE_HEADER, role_rows(summary)):
        print(line)
    if wall_s is not None:
        print(f"simulated in {wall_s:.2f} s wall" + (f"; results in {out_dir}/" if out_dir else ""))


def cmd_simulate_disagg(args: argparse.Namespace) -> int:
    """``kvsim simulate --pd P:D ...``: simulate, write the run directory, print the summary."""
    from analysis.output import OutputDir, command_inputs, default_out_dir
    from analysis.results import write_run
    from sim.cluster.disagg import DisaggStallError, disagg_run_result, run_disagg
    from sim.frontend.disagg_options import disagg_config_from_args
    from traces.workload import load_workload

    config = disagg_config_from_args(args)
    out = OutputDir(args.out if args.out is not None else default_out_dir(), args.force, inputs=command_inputs(args))
    from sim.timing.latency import check_profile_option
    check_profile_option(args.profile)
    trace, notes = load_workload(args, config.seed, config.slot_max_tokens)
    from traces.workload import instances_note
    notes.append(instances_note(config.num_prefill, config.num_decode, len(trace)))
    from sim.core.runner import harness_compute_warning
    notes += harness_compute_warning(config.prefill, args.profile)       # compute timed on the replay harness
    for note in filter(None, notes):
        print(f"kvsim: warning: {note}", file=sys.stderr)
    prefill_notes, decode_notes = config.prefill.notes, config.decode.notes   # (a co-located run prints its own)
    for note in prefill_notes + [n for n in decode_notes if n not in prefill_notes]:
        role = "" if note in prefill_notes and note in decode_notes else \
            "prefill role: " if note in prefill_notes else "decode role: "
        print(f"kvsim: note: {role}{note}", file=sys.stderr)
    started = time.perf_counter()
    try:
        run = run_disagg(config, trace, args.profile)
    except DisaggStallError as exc:    # a modelled outcome of this deployment: one line, no traceback
        from sim.setup.specs import FieldError
        raise FieldError(str(exc), *exc.fields) from None      # the front end names the flag of kv_stream
    wall_s = time.perf_counter() - started
    source = trace.attrs.get("source", "in-memory table")
    from analysis.results import compute_model_entry
    from sim.core.runner import compute_model_source
    run.summary.update(compute_model_entry({"compute_model": compute_model_source(config.prefill, args.profile)[1],
                                            "gpu": config.prefill.gpu}))
    result = disagg_run_result(run, source)
    with out.writing() as stage:
        write_run(result, stage)
        result.path = out.path          # the report names the run's final directory, not the staging one
        if getattr(args, "report", False):   # one series per prefill and decode instance (analysis.figures)
            from analysis.report import write_report
            write_report([result], stage / "report.html")
    result.path = out.path
    print_disagg_summary(run.summary, f"{config.prefill.model} on {config.prefill.gpu}: {config.label}, seed {config.seed}",
                         source, wall_s, out.path)
    if getattr(args, "report", False):
        print(f"report: {out.path / 'report.html'}")
    return 0


__all__ = ["cmd_simulate_disagg", "format_table", "kv_lines", "print_disagg_summary", "role_rows"]
