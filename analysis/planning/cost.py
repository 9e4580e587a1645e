"""Cost of serving: requests per dollar from a capacity (or a throughput) and the replica's GPU price, and the
cheapest configuration of a sweep that meets the SLOs.

    GPUs per replica      = tp x pp
    replica $/hour        = GPUs per replica x $/GPU-hour        (the GPU's catalogue price or --usd-per-gpu-hour)
    requests per $        = capacity req/s x 3600 / replica $/hour

Prices come from ``sim/setup/catalog.toml`` (``usd_per_gpu_hour`` with ``price_source``: public on-demand prices with
their date) or a GPU TOML; a GPU without a price gives no cost figure (``None``), never a guess.
"""
from __future__ import annotations

import math

import pandas as pd

S_PER_HOUR = 3600.0

COST_COLUMNS = ("gpus_per_replica", "usd_per_gpu_hour", "replica_usd_per_hour", "requests_per_usd", "passes_slos",
                "cheapest_passing")
"""Columns :func:`add_cost_columns` adds to a sweep table."""


def replica_usd_per_hour(config, gpus: int | None = None) -> float | None:
    """Dollars per hour of one replica of ``config`` (:class:`sim.setup.config.SimConfig`): ``tp x pp x $/GPU-hour``,
    or ``gpus x $/GPU-hour`` for a deployment that states its GPUs (a disaggregated P:D one); ``None`` when
    the GPU has no price."""
    price = config.gpu_spec.usd_per_gpu_hour
    return None if price is None else (gpus if gpus is not None else config.gpus_per_replica) * price


def requests_per_usd(rate_per_s: float, config, gpus: int | None = None) -> float | None:
    """Requests one dollar buys at ``rate_per_s`` requests/s per replica (or deployment of ``gpus`` GPUs):
    ``rate x 3600 / replica $/hour`` (``None`` without a price; 0 for a zero rate)."""
    per_hour = replica_usd_per_hour(config, gpus)
    if per_hour is None or not rate_per_s or not math.isfinite(rate_per_s):
        return None if per_hour is None else 0.0
    return rate_per_s * S_PER_HOUR / per_hour


def cost_line(rate_per_s: float, config, gpus: int | None = None, unit: str = "replica") -> str:
    """The printed cost of a capacity: ``cost: 2 x h100 at $4.76/GPU-hour = $9.52 per replica-hour; 1,234
    requests per $`` (or why there is none); ``gpus`` for a deployment that states its GPUs (a P:D one, priced
    at ``config``'s GPU), named ``unit`` (``"deployment"``)."""
    gpu = config.gpu_spec
    count = gpus if gpus is not None else config.gpus_per_replica
    layout = f"{count} x {config.gpu}" + (f" (tp={config.tp}, pp={config.pp})" if gpus is None and config.pp > 1 else "")
    if gpu.usd_per_gpu_hour is None:
        return (f"cost: {layout}: no $/GPU-hour for {config.gpu} ({gpu.price_source or 'none recorded'}); pass "
                "--usd-per-gpu-hour to get requests per $")
    per_hour = replica_usd_per_hour(config, gpus)
    value = requests_per_usd(rate_per_s, config, gpus)
    return (f"cost: {layout} at ${gpu.usd_per_gpu_hour:g}/GPU-hour = ${per_hour:,.2f} per {unit}-hour; "
            f"{value:,.0f} requests per $ (price: {gpu.price_source})")


def add_cost_columns(table: pd.DataFrame, jobs, point_args) -> pd.DataFrame:
    """Add :data:`COST_COLUMNS` to a sweep table (one row per :class:`analysis.planning.sweep.PointJob`, in order):
    the point's GPUs and price, its requests per $ (capacity jobs: at capacity; simulate jobs: at the run's
    throughput), whether it passes (capacity: a capacity > 0 was found; simulate: ``--slo`` was given, and as a
    capacity step judges a rate: every objective with the default bounds
    (:func:`analysis.planning.slo.search_objectives`) holds, the TTFT growth is within the stability tolerance,
    and no request was rejected) and which passing row buys the most requests per $ (``cheapest_passing``).
    ``point_args``: :func:`analysis.planning.sweep.point_args` (a job's options and SimConfig overrides)."""
    if table.empty:
        return table
    import argparse

    from analysis.planning.slo import DEFAULT_STABILITY_TOL, search_objectives
    from sim.frontend.options import config_from_args
    values = {name: [] for name in COST_COLUMNS[:-1]}
    for job, (_, row) in zip(jobs, table.iterrows()):
        try:
            args, overrides = point_args(job)
            config = config_from_args(args, **overrides)
        except ValueError:          # the point failed on its configuration: its error is in the table
            config = None
        ok = row.get("status") == "ok" and config is not None
        if job.job == "capacity":
            rate = float(row.get("capacity_req_per_s", 0.0) or 0.0) if ok else 0.0
            passes = ok and rate > 0
        else:
            rate = float(row.get("throughput_req_per_s", 0.0) or 0.0) if ok else 0.0
            slos = search_objectives(argparse.Namespace(**job.base)) if job.base.get("slo") else ()
            summary = row.to_dict()
            # without --slo a simulate point is not judged: it does not pass (its requests per $ are at the
            # trace's offered rate, so the cheapest would be the cheapest GPU that keeps up, not a capacity).
            # With it, a point passes as a capacity step does: every objective (the default scheduling-delay
            # bound included), a stable queue, nothing rejected
            growth = summary.get("ttft_growth_s_per_s", 0.0)
            stable = not (growth == growth and growth > job.base.get("stability_tol", DEFAULT_STABILITY_TOL))
            passes = (ok and bool(slos) and stable and all(slo.holds(summary) for slo in slos)
                      and not row.get("rejected", 0))
        # a disaggregated point states its deployment's GPUs (P x prefill tp + D x decode tp), whether --pd is
        # a grid axis or a base option
        stated = row.get("gpus")
        pd_spec = row.get("pd") if "pd" in row else job.base.get("pd")
        gpus = (int(stated) if stated is not None and pd.notna(stated) and pd_spec not in (None, "none", "")
                else None)
        values["gpus_per_replica"].append((gpus or config.gpus_per_replica) if config else None)
        values["usd_per_gpu_hour"].append(config.gpu_spec.usd_per_gpu_hour if config else None)
        values["replica_usd_per_hour"].append(replica_usd_per_hour(config, gpus) if config else None)
        values["requests_per_usd"].append(requests_per_usd(rate, config, gpus) if ok else None)
        values["passes_slos"].append(bool(passes))
    out = table.assign(**{name: pd.Series(column, index=table.index, dtype=object if name != "passes_slos" else bool)
                          for name, column in values.items()})
    for name in ("gpus_per_replica", "usd_per_gpu_hour", "replica_usd_per_hour", "requests_per_usd"):
        out[name] = pd.to_numeric(out[name], errors="coerce")
    candidates = out[out["passes_slos"] & out["requests_per_usd"].notna()]
    out["cheapest_passing"] = False
    if len(candidates):
        out.loc[candidates["requests_per_usd"].idxmax(), "cheapest_passing"] = True
    return out


def cheapest_line(table: pd.DataFrame, axes, judged: bool = True) -> str:
    """``cheapest passing: gpu=h100 tp=2: 1,234 requests per $ (2 GPUs at $4.76/GPU-hour)``, or why there is
    none (no passing point, no prices, or, ``judged`` False, a simulate sweep without SLOs)."""
    if "cheapest_passing" not in table or table.empty:
        return "cheapest passing: none (no point ran)"
    chosen = table[table["cheapest_passing"]]
    if chosen.empty and not judged:
        return ("cheapest passing: none: no --slo was given, so no point is judged (requests_per_usd is at the "
                "trace's rate; give --slo, or --job capacity for requests per $ at capacity)")
    if chosen.empty:
        if not table["passes_slos"].any():
            return "cheapest passing: none: no point meets the SLOs"
        return "cheapest passing: none: the passing points' GPUs have no $/GPU-hour (pass --usd-per-gpu-hour)"
    row = chosen.iloc[0]
    point = " ".join(f"{axis}={row[axis]}" for axis in axes)
    return (f"cheapest passing: {point}: {row['requests_per_usd']:,.0f} requests per $ ({int(row['gpus_per_replica'])} "
            f"GPU(s) at ${row['usd_per_gpu_hour']:g}/GPU-hour)")
