"""Printing a run summary as a table (rich)."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from sim.units import format_bytes

# (label, summary key, format)
SUMMARY_ROWS = (
    ("requests finished / total", None, None),
    ("throughput", "throughput_req_per_s", "{:.3f} req/s"),
    ("output tokens", "output_tokens_per_s", "{:.1f} tok/s"),
    # only with per-request SLOs (analysis.results.goodput_figures): share of all requests meeting every one
    ("SLO attainment / goodput", ("slo_attainment", "slo_met_requests", "goodput_req_per_s"), "goodput"),
    ("TTFT p50 / p90 / p99", ("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms"), "ms"),
    ("TPOT p50 / p90 / p99", ("tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms"), "ms"),
    ("TBT p50 / p99 / max", ("tbt_p50_ms", "tbt_p99_ms", "tbt_max_ms"), "ms"),
    ("scheduling delay p50 / p99", ("sched_delay_p50_ms", "sched_delay_p99_ms"), "ms"),
    ("E2E p50 / p90 / p99", ("e2e_p50_s", "e2e_p90_s", "e2e_p99_s"), "{:.2f} / {:.2f} / {:.2f} s"),
    ("iterations", "iterations", "{:,}"),
    ("batch size mean / max", ("mean_batch_size", "max_batch_size"), "{:.1f} / {}"),
    ("peak mapped KV memory", "peak_mapped_bytes", "bytes"),
    ("page pool", "pool_bytes", "bytes"),
    ("tail waste mean / max", ("mean_tail_waste_bytes", "max_tail_waste_bytes"), "bytes2"),
    ("page groups mapped / unmapped", ("map_page_groups", "unmap_page_groups"), "{:,} / {:,}"),
    ("VMM map / unmap calls", ("map_calls", "unmap_calls"), "{:,} / {:,}"),
    ("maps done in background", "background_map_share", "{:.1%}"),
    ("sync mapping stall total", ("sync_stall_total_ms", "iterations_with_stall"), "{:.1f} ms in {:,} iterations"),
    ("preemptions", "preemptions", "{:,}"),
    # only where a request was swapped (preemption=swap; summary_lines leaves the rows out otherwise)
    ("swapped out / in", ("swap_out_bytes", "swap_in_bytes"), "bytes2"),
    ("swap time total", "swap_total_ms", "{:.1f} ms"),
    ("block-table CPU time", "block_table_total_ms", "{:.1f} ms"),
    ("VMM time per TP worker", "mapping_worker_ms", "workers"),
    ("VMM time, critical path", "mapping_critical_ms", "{:.1f} ms"),
)


LATENCY_ROWS = {"TTFT p50 / p90 / p99", "TPOT p50 / p90 / p99", "TBT p50 / p99 / max", "scheduling delay p50 / p99",
                "E2E p50 / p90 / p99"}
"""Rows of per-request latencies: without a served request there is none to give (said, not printed as NaN)."""

SECOND_TOKEN_ROWS = {"TPOT p50 / p90 / p99", "TBT p50 / p99 / max"}
"""Rows measured between output tokens: undefined (NaN) when every served request has one output token (said)."""

VMM_ONLY_ROWS = {"VMM map / unmap calls", "maps done in background", "sync mapping stall total",
                 "VMM time per TP worker", "VMM time, critical path"}
PAGED_ONLY_ROWS = {"block-table CPU time"}


def _pp(pp: int) -> str:
    """``", pp=N"`` for a pipeline-parallel run, nothing otherwise (the tables of pp=1 runs are unchanged)."""
    return f", pp={pp}" if pp and pp > 1 else ""


def _policy_line(config: dict) -> str:
    swap = ", swap preemption" if config.get("preemption") == "swap" else ""
    tokens = config["tokens_per_page"]
    if config.get("policy", "vattention") == "paged":
        return f"PagedAttention blocks of {tokens} token{'s' if tokens != 1 else ''}{swap}"
    if config.get("policy") == "static":
        return f"static reservation of {tokens} tokens per request{swap}"
    return (f"vAttention page {format_bytes(config['page_size_bytes'])} ({tokens} tokens), "
            f"{'synchronous' if config['sync_mapping'] else 'asynchronous'} mapping{swap}")


PER_WORKER_ROWS = {"peak mapped KV memory", "page pool", "page groups mapped / unmapped", "VMM map / unmap calls",
                   "tail waste mean / max"}
"""Rows that count one GPU's KV: one tensor-parallel worker's (every worker holds the same pages of its own heads)
of one pipeline stage (every stage holds the pages of its own layers)."""

SWAP_ROWS = {"swapped out / in", "swap time total"}


def _relabel(label: str, config: dict) -> str:
    if label == "page groups mapped / unmapped" and config.get("policy", "vattention") != "vattention":
        label = "blocks allocated / freed" if config.get("policy") == "paged" else "reservations made / freed"
    tp, pp = int(config.get("tp", 1)), int(config.get("pp", 1) or 1)
    if label in PER_WORKER_ROWS | {"blocks allocated / freed", "reservations made / freed"} and tp * pp > 1:
        label += (" (per worker)" if pp == 1 else " (per stage)" if tp == 1 else " (per worker of one stage)")
    if label == "VMM time per TP worker" and pp > 1:
        label += " (one stage)"
    replicas = int(config.get("replicas", 1) or 1)
    if replicas > 1:       # replicas' figures merged: the peak and pool summed, tail waste and batch per replica
        extra = {"peak mapped KV memory": "sum of the replicas' peaks", "page pool": "all replicas",
                 "tail waste mean / max": "per replica", "batch size mean / max": "per replica",
                 "iterations": "sum over replicas"}.get(label.split(" (")[0], "")
        if extra:          # one parenthesis: "(per worker; sum of the replicas' peaks)" (helper-63)
            label = f"{label[:-1]}; {extra})" if label.endswith(")") else f"{label} ({extra})"
    return label


def format_ms(values_ms: list[float]) -> str:
    """Durations joined by `` / ``, in one unit: ms (two decimals below 10 ms, one below 10 s) while all are below
    10 s, else seconds (three decimals below 10 s, two from 10 s): ``"23.3 / 86.6 / 138.9 ms"``,
    ``"0.038 / 1.637 / 133.31 s"`` (each value with its own unit read as three lines mixed: helper-63)."""
    if all(not (v >= 10_000) for v in values_ms):          # (NaN is below)
        return " / ".join(f"{v:.2f}" if v < 10 else f"{v:.1f}" for v in values_ms) + " ms"
    return " / ".join(f"{v / 1000:.3f}" if v < 10_000 else f"{v / 1000:.2f}" for v in values_ms) + " s"


def attention_lines(summary: dict) -> list[str]:
    """One line each for what a reader must not miss: rejected requests (how many, why) and an overloaded
    run (the queue grows through the run, analysis.planning.slo's TTFT growth above 0.05 s/s; or, without such a
    rise, a median scheduling delay above the capacity search's 2 s bound: a queue that builds mid-run and
    drains, whose TTFT slope after the first quarter can even be negative)."""
    from sim.results.records import REJECT_REASONS

    lines = []
    if summary.get("rejected"):
        reasons = summary.get("rejected_by_reason") or {}
        detail = "; ".join(f"{n:,} need {REJECT_REASONS.get(r, r)}" for r, n in sorted(reasons.items()))
        lines.append(f"{summary['rejected']:,} of {summary['requests']:,} requests rejected"
                     + (f" ({detail})" if detail else "") + "; the latencies cover served requests only")
    refused = summary.get("swap_refused_preemptions", 0)
    if refused:        # --preemption swap said, recompute done: the host swap space was too small (helper-61)
        lines.append(f"{refused:,} of {summary.get('preemptions', 0):,} preemptions recomputed instead of swapped: the "
                     "host swap space (--host-swap) had no room for the victim's KV")
    growth = summary.get("ttft_growth_s_per_s", 0.0)
    if growth == growth and growth > 0.05:
        lines.append(f"overloaded: the queue grows through the run (TTFT rises {growth:.2f} s per s of trace time); "
                     "latencies depend on the trace's length, not a steady state")
    else:
        from sim.results.summary import SCHED_DELAY_P50_BOUND_US
        delay_ms = summary.get("sched_delay_p50_ms", 0.0)
        if delay_ms == delay_ms and delay_ms * 1000 > SCHED_DELAY_P50_BOUND_US:
            # a queue that builds and drains within the run (a burst, a busy hour) has no overall TTFT slope
            lines.append(f"overloaded for part of the run: the median request waits {delay_ms / 1000:.1f} s to be "
                         f"scheduled (above the {SCHED_DELAY_P50_BOUND_US / 1e6:g} s bound of a capacity "
                         "search, Sarathi-Serve's) though TTFT shows no steady rise: the load outruns the server "
                         "for a stretch of the trace (a burst, a busy hour), so the latencies depend on that stretch")
    return lines


def summary_lines(summary: dict) -> list[tuple[str, str]]:
    """(label, value) pairs for printing."""
    rows = []
    served = summary.get("finished", 1) > 0
    for label, key, fmt in SUMMARY_ROWS:
        if label in SWAP_ROWS and not (summary.get("swap_out_bytes") or summary.get("swap_in_bytes")):
            continue
        if not served and label in LATENCY_ROWS and not (label.startswith("TBT") and summary.get("tbt_tokens")):
            # (NaN percentiles of nothing; TBT counts the emitted tokens of a request rejected mid-run too)
            rows.append((label, "none: no request was served"))
            continue
        if key is None:
            value = f"{summary['finished']:,} / {summary['requests']:,}" + (
                f" ({summary['rejected']} rejected)" if summary["rejected"] else "")
        elif fmt == "bytes":
            value = format_bytes(summary[key])
        elif fmt == "workers":
            value = " / ".join(f"{ms:.1f}" for ms in summary.get(key, [])) + " ms"
        elif fmt == "bytes2":
            value = f"{format_bytes(summary[key[0]])} / {format_bytes(summary[key[1]])}"
        elif fmt == "ms":
            values_ms = [summary.get(k, float("nan")) for k in key]
            if label in SECOND_TOKEN_ROWS and all(v != v for v in values_ms):
                value = "none: no served request has a second output token"    # (TPOT, TBT of 1-token outputs)
            else:
                value = format_ms(values_ms)
        elif fmt == "goodput":
            if key[0] not in summary:
                continue
            value = (f"{summary[key[0]]:.1%} ({summary[key[1]]:,} of {summary['requests']:,} requests meet every "
                     f"SLO) / {summary[key[2]]:.3f} req/s")
        else:
            values = [summary[k] for k in key] if isinstance(key, tuple) else [summary[key]]
            value = fmt.format(*values)
        rows.append((label, value))
    return rows + tier_lines(summary)


def tier_lines(summary: dict) -> list[tuple[str, str]]:
    """One line per KV tier below HBM (``--kv-tier``): hit ratio over prompt tokens, pages loaded (promoted) and
    demoted, bytes read / written and link time each way (analysis.results._tier_summary); with prefix caching
    and no tiers, one ``prefix cache`` line (hit ratio over prompt tokens, prefill tokens saved, evictions)."""
    rows = []
    ratio = summary.get("prefix_hit_ratio")
    hit = ("hit n/a, no request admitted" if ratio is None or ratio != ratio
           else f"hit {ratio:.1%} of prompt tokens")
    if "prefix_hit_ratio" in summary and any(k.startswith("tier_") for k in summary):
        rows.append(("tier hbm", f"{hit}, {summary.get('tier_hbm_demotions', 0):,} pages evicted down"))
    elif "prefix_hit_ratio" in summary:   # prefix caching without tiers: the cache's own line
        again = summary.get("prefill_tokens_saved_preempted", 0)
        again = f"; {again:,} re-hit after preemption" if again else ""
        rows.append(("prefix cache", f"{hit} ({summary.get('prefill_tokens_saved', 0):,} prefill tokens "
                                     f"saved{again}), {summary.get('prefix_evictions', 0):,} evictions"))
    for kind in ("dram", "ssd"):
        if f"tier_{kind}_hit_tokens" not in summary:
            continue
        get = lambda name: summary.get(f"tier_{kind}_{name}", 0)   # noqa: E731
        rows.append((f"tier {kind}", f"hit {get('hit_ratio'):.1%}, loaded {get('promotions'):,} / stored "
                                     f"{get('inserted'):,} / demoted {get('demotions'):,} pages, read "
                                     f"{format_bytes(get('bytes_read'))} {get('read_ms'):.0f} ms, written "
                                     f"{format_bytes(get('bytes_written'))} {get('write_ms'):.0f} ms"))
    return rows


def print_summary(result, wall_s: float | None = None, out_dir: Path | None = None) -> None:
    """Print the run's workload line, its summary table and where the files went."""
    console = Console(width=120, soft_wrap=True)
    config = result.config
    console.print(f"trace: {config.get('trace_source')}")
    console.print(f"model {config['model']} on {config['gpu']} (tp={config['tp']}{_pp(config.get('pp', 1))}), {_policy_line(config)}, "
                  f"scheduler {config['scheduler']} (budget {config['token_budget']}), seed {config['seed']}")
    compute_line(console, result.summary)
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    vmm = config.get("policy", "vattention") == "vattention"
    for label, value in summary_lines(result.summary):
        if not vmm and label in VMM_ONLY_ROWS:
            continue
        if vmm and label in PAGED_ONLY_ROWS:
            continue
        table.add_row(_relabel(label, config), value)
    console.print(table)
    for line in attention_lines(result.summary):
        console.print(f"[bold]WARNING:[/bold] {line}", highlight=False)
    if wall_s is not None:
        console.print(f"simulated in {wall_s:.2f} s wall" + (f"; results in {out_dir}/" if out_dir else ""))


def compute_line(console: Console, summary: dict) -> None:
    """Print which compute model produced the times (the summary's ``compute_model``, with the roofline's
    caveat: :func:`analysis.results.compute_model_text`), when the summary records it."""
    if summary.get("compute_model"):
        console.print(f"compute model: {summary['compute_model']}", highlight=False)


def print_comparison(table, trace_source: str, base, wall_s: float, out_dir: Path,
                     summary: dict | None = None, summaries: dict[str, dict] | None = None) -> None:
    """Print the comparison table with metrics as rows and policies as columns; ``summary`` (one run's) names
    the compute model every run used; ``summaries`` (label -> summary) adds each run's warnings
    (:func:`attention_lines`: rejected requests, an overloaded run) under the table, as ``kvsim simulate`` does."""
    # wide enough for every label in full (a column of 26 characters each, more for a longer label)
    console = Console(width=max(100, 34 + sum(max(len(str(label)), 24) + 2 for label in table.index)))
    console.print(f"trace: {trace_source}")
    console.print(f"model {base.model} on {base.gpu} (tp={base.tp}{_pp(base.pp)}), scheduler {base.scheduler} "
                  f"(budget {base.token_budget}), max batch {base.max_batch_slots}, seed {base.seed}")
    compute_line(Console(width=120, soft_wrap=True), summary or {})
    grid = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    grid.add_column("metric")
    for label in table.index:
        grid.add_column(label, justify="right")
    for column in table.columns:
        values = list(table[column])
        # a count column that also holds NaN ("-": not applicable) is float: printed as the whole numbers it holds
        counts = any(v != v for v in values if isinstance(v, float)) and all(
            not isinstance(v, float) or v != v or v.is_integer() for v in values)
        grid.add_row(column, *(_cell(int(v) if counts and isinstance(v, float) and v == v else v) for v in values))
    console.print(grid)
    unwrapped = Console(width=console.width, soft_wrap=True)
    for label, run_summary in (summaries or {}).items():
        for line in attention_lines(run_summary):
            unwrapped.print(f"[bold]WARNING:[/bold] {label}: {line}", highlight=False)
    console.print(f"{len(table)} runs in {wall_s:.1f} s wall; table in {out_dir}/compare.csv and compare.parquet")


def _cell(value) -> str:
    if isinstance(value, float):
        if value != value:
            return "-"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}" if abs(value) < 10 else f"{value:,.1f}"
    return f"{value:,}"
