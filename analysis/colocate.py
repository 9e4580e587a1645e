"""``kvsim colocate`` and ``kvsim capacity --colocate``: several models on one GPU (:mod:`sim.cluster.colocate`).

A run directory holds ``summary.json`` (``sharing``, ``pool_bytes``, ``tenants: [...]``: each tenant's summary
with its co-location figures), ``memory.parquet`` (mapped KV per tenant over time), and one ordinary run
directory per tenant under ``tenants/<name>/`` (``requests.parquet``, ``iterations.parquet``, ``summary.json``,
``config.json``). ``register(subparsers)`` adds the ``colocate`` sub-command (cli.build_parser's discovery list).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from sim.results.json_text import strict_json_text


TABLE_COLUMNS = (("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p99_ms", "TTFT p99 ms"), ("tpot_p50_ms", "TPOT p50 ms"),
                 ("tpot_p99_ms", "TPOT p99 ms"), ("e2e_p50_s", "E2E p50 s"), ("e2e_p99_s", "E2E p99 s"),
                 ("preemptions", "preempt"), ("peak_kv_gib", "peak KV GiB"), ("mean_kv_gib", "mean KV GiB"),
                 ("moved_in_gib", "moved in GiB"), ("gpu_wait_s", "GPU wait s"))


def build_tenants(args) -> list:
    """The :class:`sim.cluster.colocate.Tenant` list of ``args.tenant`` (specs) with the shared flags of ``args``.

    Raises:
        ConfigError / TraceError / CatalogError: no ``--tenant``; a bad key, value, model or trace (naming the
            tenant). ValueError: a tenant's ``slo=`` that :func:`analysis.planning.slo.parse_slos` refuses
            (checked here, before any simulation, by ``colocate`` and ``capacity --colocate`` alike).
    """
    from analysis.planning.slo import parse_slos
    from sim.cluster.colocate import Tenant
    from sim.frontend.colocate_options import parse_tenant_spec, tenant_extras
    from sim.frontend.options import config_from_args
    from sim.setup.config import ConfigError
    from traces.workload import load_workload

    tenants = []
    if not args.tenant:
        raise ConfigError("no --tenant given: co-location needs at least one, e.g. --tenant "
                          "model=llama-3-8b,trace=TRACE (repeat per model; keys: docs/colocate.md)")
    specs = [parse_tenant_spec(text, i) for i, text in enumerate(args.tenant)]
    names = [s["name"] for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"--tenant names must differ, got {names}")
    from sim.setup.catalog import get_gpu
    get_gpu(args.gpu)          # a bad shared --gpu (name or file) is the flag's error, not the first tenant's
    for values in specs:
        targs = tenant_args(values, args)
        try:
            config = config_from_args(targs)
            trace, notes = load_workload(targs, config.seed, config.slot_max_tokens)
        except ValueError as exc:
            fields = tuple(getattr(exc, "fields", ()))
            if isinstance(exc, ConfigError) and _shared_fault(fields, values):
                raise     # a shared flag's value (--page-size, --tp, --memory-util): the command line names the flag
            text = str(exc).replace("set allow_long_context to simulate it anyway",
                                    "add allow-long-context=yes to the tenant to simulate it anyway")
            raise type(exc)(f"--tenant {values['name']}: {text}") from None
        extras = tenant_extras(values)
        if extras["slo"] is not None:
            try:
                per_request = [str(slo) for slo in parse_slos(extras["slo"]) if slo.per_request]
            except ValueError as exc:
                raise ValueError(f"--tenant {values['name']}: slo={values['slo']}: "
                                 f"{str(exc).removeprefix('--slo: ').removeprefix('--slo ')}") from None
            if per_request:     # judged as a percentile it was never found: every scale failed (helper-61)
                raise ValueError(f"--tenant {values['name']}: slo={values['slo']}: {', '.join(per_request)} is a "
                                 "per-request objective, which needs an attainment (--slo-attainment) that "
                                 "co-located tenants do not take; give a percentile instead, e.g. ttft_p99=2s")
        for note in notes:
            print(f"kvsim: warning: tenant {values['name']}: {note}", file=sys.stderr)
        sharing_text = str(getattr(args, "sharing", "") or "")
        static_only = sharing_text.startswith("static")
        for note in _tenant_notes(values, searching=bool(getattr(args, "colocate", False)), static=static_only):
            print(f"kvsim: note: tenant {values['name']}: {note}", file=sys.stderr)
        tenants.append(Tenant(values["name"], config, trace, **extras))
    return tenants


SHARED_FIELDS = {"page_size_bytes": "page", "tp": None, "memory_util_frac": None}
"""Configuration fields that only colocate's shared flags set (-> the policy key with which a tenant can set its
own, or None)."""


def _shared_fault(fields: tuple, values: dict) -> bool:
    """Whether an error naming ``fields`` is about a shared flag's value the tenant (``values``) did not replace."""
    from sim.frontend.policy_spec import _spec_values
    own = _spec_values(values.get("policy", "")) if values.get("policy") else {}
    return any(field in SHARED_FIELDS and (SHARED_FIELDS[field] is None or SHARED_FIELDS[field] not in own)
               for field in fields)


def _tenant_notes(values: dict, searching: bool, static: bool = False) -> list[str]:
    """Keys of one ``--tenant`` that change nothing in this command (said, not silently dropped): ``sleep-weights``
    without ``sleep-after``, ``slo=`` outside ``capacity --colocate`` (only the search judges it), ``floor`` and
    ``ceiling`` under ``--sharing static`` (``static``); and a tenant without ``trace=`` runs the built-in synthetic
    workload."""
    notes = []
    if values.get("sleep-weights") == "yes" and "sleep-after" not in values:
        notes.append("sleep-weights=yes has no effect without sleep-after= (the tenant never sleeps)")
    if "slo" in values and not searching:
        notes.append("slo= is judged by kvsim capacity --colocate only; kvsim colocate reports the latencies")
    if "trace" not in values:
        notes.append("no trace=: the built-in synthetic workload")
    unused = [key for key in ("floor", "ceiling") if key in values]
    if static and unused:       # (a static share is --sharing static:split=...; floors and ceilings bound elastic)
        notes.append(f"{'= and '.join(unused)}= bound{'s' if len(unused) == 1 else ''} elastic sharing only; under "
                     "--sharing static the tenant's share is static:split=")
    return notes


def sharing_of(args, num_tenants: int):
    """The :class:`sim.cluster.colocate.Sharing` of ``--sharing`` and ``--compute``."""
    from dataclasses import replace
    from sim.frontend.colocate_options import parse_sharing
    return replace(parse_sharing(args.sharing, num_tenants), compute=args.compute)


def tenant_rows(run) -> list[dict]:
    """One record per tenant: its summary, its co-location figures and the table's GiB columns."""
    rows = []
    for tenant, result, stats in zip(run.tenants, run.results, run.stats):
        row = {"tenant": tenant.name, "model": tenant.config.model, **result.summary, **stats}
        row.update(peak_kv_gib=stats["peak_kv_bytes"] / 2**30, mean_kv_gib=stats["mean_kv_bytes"] / 2**30,
                   moved_in_gib=stats["moved_in_bytes"] / 2**30)
        rows.append(row)
    return rows


def format_table(rows: list[dict], label: str = "") -> str:
    """The comparison table: one line per tenant (and sharing, when ``label``)."""
    head = ["sharing", "tenant"] if label else ["tenant"]
    header = head + [title for _, title in TABLE_COLUMNS]
    lines = [header]
    for row in rows:
        cells = [label, row["tenant"]] if label else [row["tenant"]]
        for key, _ in TABLE_COLUMNS:
            value = row.get(key, float("nan"))
            cells.append(f"{value:,}" if isinstance(value, int) else f"{value:.2f}")
        lines.append(cells)
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(str(c).rjust(w) for c, w in zip(line, widths)) for line in lines)


def write_colocated(run, out: Path) -> Path:
    """Write the run directory (module docstring) into ``out`` (created; must be new or empty)."""
    from analysis.results import write_run
    out.mkdir(parents=True, exist_ok=True)
    for tenant, result in zip(run.tenants, run.results):
        write_run(result, out / "tenants" / tenant.name)
    run.memory.to_parquet(out / "memory.parquet", index=False)
    sharing = {"mode": run.sharing.mode, "split": run.sharing.split, "trim_delay_us": run.sharing.trim_delay_us,
               "compute": run.sharing.compute}
    summary = {"sharing": sharing, "pool_bytes": run.pool_bytes, "tenants": tenant_rows(run)}
    (out / "summary.json").write_text(strict_json_text(summary, indent=2, default=str) + "\n")
    return out


def memory_figure(memory, title: str):
    """Each tenant's mapped KV (GiB) over time, stacked (a plotly figure)."""
    import plotly.graph_objects as go
    fig = go.Figure()
    for column in memory.columns[1:]:
        fig.add_trace(go.Scatter(x=memory["time_s"], y=memory[column] / 2**30, name=column.removesuffix("_bytes"),
                                 stackgroup="kv", mode="lines"))
    fig.update_layout(title=title, xaxis_title="time (s)", yaxis_title="mapped KV (GiB)")
    return fig


def cmd_colocate(args) -> int:
    """``kvsim colocate``: simulate, write the run directory (and ``report.html``), print the table. ``--out`` is
    an :class:`analysis.output.OutputDir`: checked before any work, written as a whole, and with ``--force`` a
    previous kvsim result is replaced entirely (it failed at the first tenant folder, and left stale files)."""
    from analysis.output import OutputDir, command_inputs, default_out_dir
    from sim.cluster.colocate import simulate_colocated
    from sim.frontend.colocate_options import parse_tenant_spec
    tenants = build_tenants(args)
    traces_read = [Path(spec["trace"]) for spec in (parse_tenant_spec(text, i) for i, text in
                                                     enumerate(args.tenant or [])) if spec.get("trace")]
    out = OutputDir(args.out if args.out is not None else default_out_dir("colocate"), args.force,
                    inputs=[*command_inputs(args), *(p for p in traces_read if p.exists())])
    modes = ["static", "elastic"] if args.sharing == "both" else [args.sharing]
    sharings = [sharing_of(type(args)(**{**vars(args), "sharing": mode}), len(tenants)) for mode in modes]
    from sim.cluster.colocate import elastic_pool, tenant_configs
    for sharing in sharings:    # every mode's configuration refused before any runs (both: elastic after static)
        configs = tenant_configs(tenants, sharing)
        if sharing.mode == "elastic":
            elastic_pool(tenants, configs)
    print_compute_models(tenants, args.profile)
    with out.writing() as stage:
        for sharing in sharings:
            started = time.time()
            run = simulate_colocated(tenants, sharing, args.profile)
            target = stage / sharing.mode if len(modes) > 1 else stage
            write_colocated(run, target)
            if not args.no_report:
                memory_figure(run.memory, f"mapped KV per tenant ({sharing.mode} sharing)").write_html(
                    target / "report.html", include_plotlyjs="cdn")
            shown = out.path / sharing.mode if len(modes) > 1 else out.path
            print(f"kvsim colocate: {len(tenants)} tenant{'' if len(tenants) == 1 else 's'}, {sharing.mode} sharing, compute {sharing.compute}, "
                  f"KV pool {run.pool_bytes / 2**30:.1f} GiB ({time.time() - started:.1f} s) -> {shown}")
            print(format_table(tenant_rows(run), sharing.mode))
    return 0


def print_compute_models(tenants: list, profile_path: str | None) -> None:
    """One ``compute model of NAME: ...`` line per tenant (as ``simulate`` and ``capacity`` print theirs): a
    profile may cover one tenant's model only, and the other then runs on the built-in roofline. A compute fit timed
    on the replay harness (:func:`sim.core.runner.harness_compute_warning`) adds one ``kvsim: warning:`` line on
    stderr (one for the profile, however many tenants use it)."""
    from sim.core.runner import compute_model_source, harness_compute_warning
    from sim.results.summary import compute_model_text
    warnings = []
    for tenant in tenants:
        print(f"compute model of {tenant.name}: "
              f"{compute_model_text(compute_model_source(tenant.config, profile_path)[1], tenant.config.gpu)}")
        warnings += [w for w in harness_compute_warning(tenant.config, profile_path) if w not in warnings]
    for warning in warnings:
        print(f"kvsim: warning: {warning}", file=sys.stderr)


def tenant_args(values: dict, shared: argparse.Namespace) -> argparse.Namespace:
    """The ``simulate`` options of one tenant: the shared flags (GPU, memory-util, seed, page size, tp, profile)
    overridden by the tenant's keys, parsed by the ordinary parsers (so every value is checked as the flag is).

    Raises:
        ConfigError: a value the flag's parser refuses (the message names the tenant and key).
    """
    import argparse
    from sim.frontend.colocate_options import FLAG_KEYS, policy_spec
    from sim.frontend.options import add_config_args
    from sim.setup.config import ConfigError
    from traces.workload import add_trace_args

    parser = argparse.ArgumentParser(prog=f"--tenant {values['name']}", add_help=False, exit_on_error=False)
    add_config_args(parser)
    add_trace_args(parser)
    parser.add_argument("--policy", default=None)
    argv = ["--gpu", shared.gpu, "--memory-util", str(shared.memory_util), "--seed", str(shared.seed),
            "--page-size", str(shared.page_size), "--tp", str(shared.tp)]
    for key, flag in FLAG_KEYS.items():
        if key in values:
            argv += [flag, values[key]]
    long_context = values.get("allow-long-context", "no")
    if long_context not in ("yes", "no"):
        raise ConfigError(f"--tenant {values['name']}: allow-long-context={long_context!r}: yes or no")
    if long_context == "yes":      # a max-context beyond the model's native one (as --allow-long-context)
        argv.append("--allow-long-context")
    try:
        args, extra = parser.parse_known_args(argv)
    except (argparse.ArgumentError, SystemExit) as exc:
        raise ConfigError(f"--tenant {values['name']}: {exc}") from None
    if extra:
        raise ConfigError(f"--tenant {values['name']}: unexpected {' '.join(extra)}")
    if args.policy:
        args.policy = policy_spec(args.policy)
    return args


# ---- capacity --------------------------------------------------------------------------------------------
def judge_colocated(run, scale: float):
    """One :class:`analysis.planning.capacity.Evaluation` of a co-located run: every tenant's SLOs (and its
    stability and rejections) must hold; the failures are named ``<tenant>:<metric>``."""
    from analysis.planning.capacity import Evaluation, judge, base_rate_per_s
    from analysis.planning.slo import parse_slos
    from sim.results.summary import ttft_growth
    failed, values, rate = [], {}, 0.0
    for tenant, result in zip(run.tenants, run.results):
        slos = parse_slos(tenant.slo) if tenant.slo else ()
        one = judge(scale, 0.0, result.summary, ttft_growth(result.requests), slos, requests=result.requests)
        failed += [f"{tenant.name}:{name}" for name in one.failed]
        values.update({f"{tenant.name}:{k}": v for k, v in one.values_us.items()})
        rate += base_rate_per_s(tenant.trace) if len(tenant.trace) > 1 else 0.0   # the trace is already scaled
    return Evaluation(scale, rate, values, 0.0, tuple(failed), {"tenants": tenant_rows(run)})


class ColocatedEvaluator:
    """``scale -> Evaluation``: every tenant's trace at ``scale`` times its rate, co-simulated."""

    def __init__(self, tenants: list, sharing, profile_path: str | None):
        self.tenants, self.sharing, self.profile_path = tenants, sharing, profile_path

    def __call__(self, scale: float):
        from dataclasses import replace
        import traces
        from sim.cluster.colocate import simulate_colocated
        scaled = [replace(t, trace=traces.scale_rate(t.trace, scale)) if scale != 1.0 else t for t in self.tenants]
        return judge_colocated(simulate_colocated(scaled, self.sharing, self.profile_path), scale)


def colocated_capacity(tenants: list, sharing, profile_path: str | None = None, tolerance: float = 0.02,
                       on_step=None):
    """The highest common rate scale at which every tenant's SLOs hold
    (:func:`analysis.planning.capacity.search_capacity`: exponential bracket, then bisection).

    Raises:
        ValueError: no tenant has an ``slo``.
    """
    from analysis.planning.capacity import search_capacity
    if not any(t.slo for t in tenants):
        raise ValueError("capacity --colocate needs slo= on at least one --tenant")
    return search_capacity(ColocatedEvaluator(tenants, sharing, profile_path), (), tolerance, on_step=on_step)


def cmd_capacity_colocate(args) -> int:
    """``kvsim capacity --colocate``: the common capacity scale for static and elastic sharing."""
    tenants = build_tenants(args)
    if not any(t.slo for t in tenants):           # before the table's header: the error is the only output
        raise ValueError("capacity --colocate needs slo= on at least one --tenant")
    print_compute_models(tenants, args.profile)
    print(f"{'sharing':>8}  {'scale':>7}  {'req/s (all)':>11}  binding")
    none = []
    for mode in ("static", "elastic"):
        sharing = sharing_of(type(args)(**{**vars(args), "sharing": mode}), len(tenants))
        step = None if args.quiet else (lambda e, m=mode: print(f"  {m} scale {e.scale:.3f}: "
                                                                f"{'pass' if e.passed else ', '.join(e.failed)}"))
        result = colocated_capacity(tenants, sharing, args.profile, args.tolerance, step)
        if result.best is None:
            lowest = min((e.scale for e in result.steps), default=float("nan"))
            print(f"{mode:>8}  {'none':>7}  {'-':>11}  {result.binding}")
            none.append(f"{mode}: the SLOs fail even at scale {lowest:.3g} (binding: {result.binding})")
            continue
        print(f"{mode:>8}  {result.best.scale:7.3f}  {result.rate_per_s:11.2f}  {result.binding}")
    if none:        # as kvsim capacity: no capacity is a failed search, not a capacity of 0
        print(f"capacity: none for {'; '.join(none)}; relax the SLOs or change the configuration", file=sys.stderr)
        return 1
    return 0


def add_colocate_args(parser) -> None:
    """The flags ``colocate`` and ``capacity --colocate`` share."""
    from analysis.flags import add_profile
    from sim.frontend.argtypes import int_at_least, positive_float, size_arg
    parser.add_argument("--tenant", action="append", metavar="SPEC",
                        help="one model on the GPU: model=M,trace=T[,rate-scale=X,num-requests=N,policy=SPEC,"
                             "slo=ttft_p99=2s+tpot_p99=100ms,floor=F,ceiling=F,sleep-after=30s,sleep-weights=yes] "
                             "(repeat per tenant; keys: docs/colocate.md)")
    parser.add_argument("--compute", choices=("serial", "isolated"), default="serial",
                        help="serial: the tenants' iterations take turns on the GPU (separate processes without "
                             "MPS); isolated: each computes as if alone (default: serial)")
    parser.add_argument("--gpu", default="h200", help="GPU: a catalogue name or a GPU TOML file (docs/models.md; default: h200)")
    parser.add_argument("--memory-util", type=positive_float, default=0.9,
                        help="share of HBM for weights + KV of all tenants (default 0.9)")
    parser.add_argument("--page-size", type=size_arg, default="2MiB", help="VMM page size (default 2MiB)")
    parser.add_argument("--tp", type=int_at_least(1), default=1, help="tensor-parallel degree of every tenant")
    parser.add_argument("--seed", type=int_at_least(0), default=0, help="seed of every tenant's generator")
    add_profile(parser)


def register(subparsers) -> None:
    """Add the ``colocate`` sub-command."""
    sub = subparsers.add_parser("colocate", help="several models on one GPU: static KV shares vs one elastic pool",
                                description="Co-simulate several models on one GPU (docs/colocate.md).")
    add_colocate_args(sub)
    sub.add_argument("--sharing", default="static",
                     help="static[:split=a/b/...] | elastic[:trim-delay=1s] | both (default: static); split: "
                          "relative shares of the KV pool, one per tenant, normalised to sum 1 (1/2 and 0.9/1.8 "
                          "are the same split; default equal)")
    sub.add_argument("--out", default=None, help="run directory, new or empty (default: runs/colocate-<UTC time>)")
    sub.add_argument("--force", action="store_true",
                     help="replace an --out that holds an earlier kvsim result (never a directory holding anything "
                          "else)")
    sub.add_argument("--no-report", action="store_true", help="no report.html (the stacked mapped-KV plot)")
    sub.set_defaults(func=cmd_colocate)


__all__ = ["build_tenants", "colocated_capacity", "format_table", "judge_colocated", "memory_figure", "register",
           "tenant_rows", "write_colocated"]
