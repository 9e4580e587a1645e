"""The report's plotly figures, one builder per figure, each taking every run to compare.

Every builder has the signature ``builder(views: list[RunView]) -> go.Figure``. Runs share the axes; each run
has one colour, one dash style and one marker symbol (:data:`RUN_DASHES`, :data:`RUN_SYMBOLS`), so two runs that
are nearly identical stay apart: a dashed line over a solid one shows both. Dense timelines are drawn as a line
(the mean per time bucket) inside a shaded min/max band (:func:`analysis.downsample.min_max_band`). The two
stacked figures (page pool, map / unmap operations) give each
run its own row on a shared time axis instead, coloured by category, since stacks of several runs cannot
share one set of axes.

Traces per run (:data:`TRACES_PER_RUN`; the browser test checks these counts)::

    latency     3   min/max band + iteration latency line (bucket means) + every sync-mapping stall (markers)
    batch       2   min/max band + batch size line
    pool        4   used / mapped-not-used / deferred / free KV memory, stacked (bucket means)
    tail_waste  2   min/max band + tail waste line of running requests
    cdf         3   TTFT, TPOT, E2E (one column each)
    mapping     3   background maps, critical-path maps, unmaps (negative), summed per time window
    tiers       1 per tier (HBM prefix cache, DRAM, SSD): bytes resident over time; only for runs with a
                tier table (``kvsim simulate --kv-tier``: :data:`TIER_FIGURE`, outside :data:`FIGURES`)

A band trace is empty (no points) when its series was short enough to draw whole.
Times on x axes are seconds since the simulation started (``start_at_us / 1e6``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from analysis.downsample import (BAND_BUCKETS, MAX_POINTS, bin_sums, bucket_mean, cdf_points, min_max, min_max_band,
                                 nice_window)
from analysis.results import RunResult
from sim.units import GIB, US_PER_MS, US_PER_S

RUN_COLOURS = qualitative.Plotly
RUN_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
RUN_SYMBOLS = ("x", "circle-open", "diamond-open", "square-open", "triangle-up-open", "star-open")
POOL_PARTS = (  # (column, legend name, colour)
    ("used_gib", "used by tokens", "#1f77b4"),
    ("slack_gib", "mapped, not used by a running request's tokens", "#aec7e8"),
    ("deferred_gib", "deferred (mapped on idle slots)", "#ff7f0e"),
    ("free_gib", "free (unmapped)", "#d9d9d9"),
)
MAPPING_PARTS = (  # (column, legend name, colour, sign)
    ("bg_map_page_groups", "maps, background", "#2ca02c", 1),
    ("sync_map_page_groups", "maps, critical path", "#d62728", 1),
    ("unmap_page_groups", "unmaps", "#7f7f7f", -1),
)
TRACES_PER_RUN = {"latency": 3, "batch": 2, "pool": len(POOL_PARTS), "tail_waste": 2, "cdf": 3,
                  "mapping": len(MAPPING_PARTS)}
TIME_AXIS = "time since start (s)"
LINE_OPACITY = 0.85  # timelines of several runs overlap: let the one below show through
BAND_OPACITY = 0.07  # fill of a min/max band: light, so that the mean lines drawn over it stay readable


@dataclass
class RunView:
    """One run as the figures see it: its legend label, its colour and its tables."""

    label: str
    colour: str
    result: RunResult
    dash: str = "solid"
    symbol: str = "x"
    width: float = 2.0   # line width: earlier runs (drawn first, underneath) slightly wider, so both show
    replica: int | None = None   # one replica of a multi-replica run (kvsim simulate --replicas); None: all rows
    role: str | None = None      # one instance of a disaggregated run (kvsim simulate --pd): "prefill" / "decode"
    instance: int | None = None  # ... and its number within the role

    @cached_property
    def iterations(self) -> pd.DataFrame:
        """The iteration table (this view's replica's or instance's rows) plus ``time_s`` (start, s),
        ``end_s`` (start + duration, s) and ``duration_ms``."""
        it = self.result.iterations
        if self.replica is not None:
            it = it[it["replica"] == self.replica]
        if self.role is not None:
            it = it[(it["role"] == self.role) & (it["instance"] == self.instance)]
        return it.assign(time_s=it["start_at_us"] / US_PER_S, duration_ms=it["duration_us"] / US_PER_MS,
                         end_s=(it["start_at_us"] + it["duration_us"]) / US_PER_S)

    @cached_property
    def finished(self) -> pd.DataFrame:
        """Finished requests only (this view's replica's, or those its instance served)."""
        req = self.result.requests
        if self.replica is not None and "replica" in req:
            req = req[req["replica"] == self.replica]
        if self.role is not None and f"{self.role}_instance" in req:
            req = req[req[f"{self.role}_instance"] == self.instance]
        return req[req["status"] == "finished"]

    @property
    def page_group_gib(self) -> float:
        """Size of one pool unit (page group, block) in GiB (of this view's instance in a disaggregated run)."""
        config = self.result.config
        if self.role is not None:
            config = next((c for c in config.get("instances", []) if c.get("role") == self.role
                           and c.get("instance") == self.instance), config.get(self.role) or {})
        return float(config.get("page_group_bytes", 0)) / GIB


def _layout(fig: go.Figure, height: int, **axes) -> go.Figure:
    """Common look: white template, legend above the plot (long run labels never squeeze the plot), ``height``
    px (the section heading is the title)."""
    fig.update_layout(height=height, template="plotly_white", hovermode="closest", margin=dict(t=60, b=50, l=70, r=20),
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0), **axes)
    return fig


def _rgba(colour: str, alpha: float) -> str:
    """``#rrggbb`` -> ``rgba(r, g, b, alpha)``."""
    value = colour.lstrip("#")
    r, g, b = (int(value[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r}, {g}, {b}, {alpha})"


def idle_cuts(x: np.ndarray, ends: np.ndarray, gap: float) -> np.ndarray:
    """Positions where a line drawn through ``x`` (sorted) must break: the next point starts more than ``gap``
    after the previous one ended (``ends``, same order), i.e. the instance sat idle in between."""
    if len(x) < 2:
        return np.zeros(0, dtype=int)
    return np.flatnonzero(x[1:] - ends[:-1] > gap) + 1


def _broken(values: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """``values`` (float) with a NaN inserted before each of ``cuts`` (plotly does not join lines across NaN)."""
    return np.insert(np.asarray(values, dtype=float), cuts, np.nan, axis=0)


def add_timeline(fig: go.Figure, view: RunView, x: np.ndarray, y: np.ndarray, unit: str, fmt: str = ".2f",
                 ends: np.ndarray | None = None, **where) -> None:
    """Two traces of one run: the min/max band (:func:`add_band`) and the line (:func:`add_line`)."""
    band = min_max_band(x, y)
    add_band(fig, view, band, **where)
    add_line(fig, view, band, unit, fmt, x, ends, **where)


def add_band(fig: go.Figure, view: RunView, band, **where) -> None:
    """The min/max band of one run (a closed, filled outline, light: :data:`BAND_OPACITY`; empty when every
    point is drawn), one outline per run of adjacent non-empty buckets (None between them: not across gaps)."""
    bx, by = [], []
    if band.downsampled:
        for part in band.segments():
            bx += [*band.x[part], *band.x[part][::-1], None]
            by += [*band.hi[part], *band.lo[part][::-1], None]
    fig.add_scatter(x=bx, y=by, mode="lines", fill="toself", fillcolor=_rgba(view.colour, BAND_OPACITY),
                    line=dict(width=0, color=view.colour), name=f"{view.label}: min-max", legendgroup=view.label,
                    showlegend=False, hoverinfo="skip", **where)


def add_line(fig: go.Figure, view: RunView, band, unit: str, fmt: str, x: np.ndarray | None = None,
             ends: np.ndarray | None = None, **where) -> None:
    """The line of one run (bucket means, or every point), in the run's colour and dash style, broken at idle
    gaps: between buckets with an empty one between them, or, drawn whole, where the next iteration starts more
    than one bucket's width (span / BAND_BUCKETS) after the previous one ended (``ends``: iteration ends of the
    points ``x``, in any order)."""
    if band.downsampled:
        cuts = np.asarray([part.start for part in band.segments()[1:]], dtype=int)
        custom = _broken(np.column_stack([band.lo, band.hi]), cuts)
        hover = (f"t=%{{x:.3f}} s<br>mean %{{y:{fmt}}} {unit}<br>min %{{customdata[0]:{fmt}}}, "
                 f"max %{{customdata[1]:{fmt}}} {unit}<extra>{view.label}</extra>")
    else:
        cuts = np.zeros(0, dtype=int)
        if ends is not None and len(band.x) > 1:
            order = np.argsort(np.asarray(x, dtype=float), kind="stable")
            span = float(band.x[-1] - band.x[0])
            cuts = idle_cuts(band.x, np.asarray(ends, dtype=float)[order], span / BAND_BUCKETS)
        custom, hover = None, f"t=%{{x:.3f}} s<br>%{{y:{fmt}}} {unit}<extra>{view.label}</extra>"
    fig.add_scatter(x=_broken(band.x, cuts), y=_broken(band.mean, cuts), mode="lines", name=view.label,
                    legendgroup=view.label, opacity=LINE_OPACITY, connectgaps=False,
                    line=dict(color=view.colour, width=view.width - 0.5, dash=view.dash),
                    customdata=custom, hovertemplate=hover, **where)


def add_timelines(fig: go.Figure, views: list[RunView], column: str, unit: str, fmt: str = ".2f",
                  scale: float = 1.0) -> None:
    """Every run's band first, then every run's line on top (a band never covers another run's line)."""
    series = []
    for view in views:
        it = view.iterations
        x, y = it["time_s"].to_numpy(), it[column].to_numpy(dtype=float) / scale
        band = min_max_band(x, y)
        add_band(fig, view, band)
        series.append((view, band, x, it["end_s"].to_numpy()))
    for view, band, x, ends in series:
        add_line(fig, view, band, unit, fmt, x, ends)


def latency_figure(views: list[RunView]) -> go.Figure:
    """Iteration latency (ms) over time (line and min/max band); every iteration with a synchronous-mapping
    stall as a marker in the run's colour and symbol."""
    fig = go.Figure()
    add_timelines(fig, views, "duration_ms", "ms")
    for view in views:                         # markers above every band and line
        it = view.iterations
        stalls = it[it["sync_stall_us"] > 0]   # never downsampled: each stall is one marker
        fig.add_scatter(x=stalls["time_s"], y=stalls["duration_ms"], mode="markers",
                        name=f"{view.label}: sync-mapping stalls ({len(stalls):,})", legendgroup=view.label,
                        marker=dict(color=view.colour, symbol=view.symbol, size=9,
                                    line=dict(width=1.5, color=view.colour)),
                        customdata=np.column_stack([stalls["sync_stall_us"] / US_PER_MS, stalls["iteration"]]),
                        hovertemplate="iteration %{customdata[1]}<br>t=%{x:.3f} s<br>latency %{y:.2f} ms<br>"
                                      "stall %{customdata[0]:.3f} ms<extra></extra>")
    return _layout(fig, 420,
                   xaxis_title=TIME_AXIS, yaxis_title="iteration latency (ms)")


def batch_figure(views: list[RunView]) -> go.Figure:
    """Requests in each iteration's batch over time."""
    fig = go.Figure()
    add_timelines(fig, views, "batch_size", "requests", ".1f")
    return _layout(fig, 380,
                   xaxis_title=TIME_AXIS, yaxis_title="batch size (requests)")


def pool_parts(view: RunView, max_points: int = MAX_POINTS) -> pd.DataFrame:
    """The page pool split into :data:`POOL_PARTS` (GiB), averaged per time bucket.

    ``mapped`` counts active and idle slots; ``deferred`` is the idle part, ``used`` the pages holding tokens
    of running requests, so ``mapped - deferred - used`` is mapped ahead of need (clipped at 0).
    """
    cols = ["used_page_groups", "mapped_page_groups", "deferred_page_groups", "free_page_groups"]
    means = bucket_mean(view.iterations, "time_s", cols, max_points)
    gib = view.page_group_gib
    slack = (means["mapped_page_groups"] - means["deferred_page_groups"] - means["used_page_groups"]).clip(lower=0)
    return pd.DataFrame({"time_s": means["time_s"], "used_gib": means["used_page_groups"] * gib,
                         "slack_gib": slack * gib, "deferred_gib": means["deferred_page_groups"] * gib,
                         "free_gib": means["free_page_groups"] * gib})


def _rows(views: list[RunView]) -> go.Figure:
    """One row per run on a shared time axis, each titled with the run's label."""
    return make_subplots(rows=len(views), cols=1, shared_xaxes=True, vertical_spacing=0.3 / max(len(views), 1),
                         subplot_titles=[view.label for view in views])


def pool_figure(views: list[RunView]) -> go.Figure:
    """KV-cache pool over time, stacked (GiB): one row per run."""
    fig = _rows(views)
    for row, view in enumerate(views, start=1):
        parts = pool_parts(view)
        for column, name, colour in POOL_PARTS:
            fig.add_scatter(x=parts["time_s"], y=parts[column], mode="lines", name=name, legendgroup=name,
                            stackgroup=f"pool{row}", line=dict(width=0.5, color=colour), fillcolor=colour,
                            showlegend=row == 1, row=row, col=1)
        fig.update_yaxes(title_text="KV memory (GiB)", row=row, col=1)
    fig.update_xaxes(title_text=TIME_AXIS, row=len(views), col=1)
    return _layout(fig, 80 + 300 * len(views))


def tail_waste_figure(views: list[RunView]) -> go.Figure:
    """Tail waste of running requests (GiB): mapped memory past each request's last token."""
    fig = go.Figure()
    add_timelines(fig, views, "tail_waste_bytes", "GiB", ".3f", scale=GIB)
    return _layout(fig, 380, xaxis_title=TIME_AXIS, yaxis_title="tail waste (GiB)")


CDF_METRICS = (  # (column, scale, axis title, log x)
    ("ttft_us", US_PER_MS, "TTFT (ms)", True),
    ("tpot_us", US_PER_MS, "TPOT (ms)", False),
    ("e2e_us", US_PER_S, "E2E latency (s)", True),
)


def cdf_figure(views: list[RunView]) -> go.Figure:
    """CDFs of TTFT, TPOT and E2E latency over finished requests, one column each."""
    fig = make_subplots(rows=1, cols=len(CDF_METRICS), horizontal_spacing=0.06)
    for view in views:
        for col, (column, scale, title, log_x) in enumerate(CDF_METRICS, start=1):
            values = view.finished[column].to_numpy(dtype=float) / scale
            x, p = cdf_points(values[values > 0] if log_x else values)
            fig.add_scatter(x=x, y=p, mode="lines", name=view.label, legendgroup=view.label,
                            line=dict(color=view.colour, dash=view.dash, width=view.width), showlegend=col == 1,
                            row=1, col=col)
    for col, (_, _, title, log_x) in enumerate(CDF_METRICS, start=1):
        fig.update_xaxes(title_text=title, type="log" if log_x else "linear", row=1, col=col)
    fig.update_yaxes(title_text="share of finished requests", range=[0, 1.02], row=1, col=1)
    return _layout(fig, 420)


def mapping_window_s(views: list[RunView]) -> float:
    """The map/unmap window (s): a 1-2-5 width giving at most 200 windows over the longest run."""
    spans = [float(v.iterations["time_s"].max() - v.iterations["time_s"].min()) for v in views
             if len(v.iterations)]
    return nice_window(max(spans, default=0.0))


def mapping_bins(view: RunView, window_s: float) -> pd.DataFrame:
    """Page groups mapped (background, critical path) and unmapped per ``window_s`` window."""
    it = view.iterations
    return bin_sums(it["time_s"].to_numpy(), {c: it[c].to_numpy() for c, _, _, _ in MAPPING_PARTS}, window_s)


def mapping_figure(views: list[RunView]) -> go.Figure:
    """Map and unmap operations per time window (page groups; unmaps below zero): one row per run."""
    window_s = mapping_window_s(views)
    fig = _rows(views)
    for row, view in enumerate(views, start=1):
        bins = mapping_bins(view, window_s)
        for column, name, colour, sign in MAPPING_PARTS:
            fig.add_bar(x=bins["x"], y=sign * bins[column], name=name, legendgroup=name, marker_color=colour,
                        width=window_s, showlegend=row == 1, row=row, col=1)
        unit = {"paged": "blocks", "static": "reservations"}.get((view.result.config or {}).get("policy"),
                                                                  "page groups")
        fig.update_yaxes(title_text=f"{unit} per {window_s:g} s", row=row, col=1)
    fig.update_xaxes(title_text=TIME_AXIS, row=len(views), col=1)
    fig.update_layout(barmode="relative", bargap=0)
    return _layout(fig, 80 + 280 * len(views))


FIGURES = (  # (id, section heading, note under the heading, builder)
    ("latency", "Iteration latency and synchronous-mapping stalls",
     "Line: the mean iteration latency of each time bucket, inside a shaded band from the bucket's shortest to "
     "its longest iteration (every point is drawn when a run has few). Markers: every iteration that waited for "
     "synchronous mapping (sync_stall_us > 0), none left out, one symbol per run; hover for the stall time.",
     latency_figure),
    ("batch", "Batch size", "Requests per iteration: the mean of each time bucket, in a band from its smallest to its "
     "largest.", batch_figure),
    ("pool", "Page pool",
     "KV-cache pool, stacked, averaged per time bucket: pages holding running requests' tokens, other mapped "
     "pages not on idle slots (pages mapped ahead for running requests; with prefix caching also cached pages no "
     "request holds; static: the unused part of each reservation is in the first layer, as a reservation is one "
     "unit), pages kept mapped on idle slots (deferred reclamation, eager mapping), and unmapped pages. "
     "Click a legend entry to hide a layer.", pool_figure),
    ("tail_waste", "Tail waste",
     "Mapped memory past the last token of each running request, summed: the mean of each time bucket, in a band "
     "from its min to its max.",
     tail_waste_figure),
    ("cdf", "TTFT, TPOT and E2E latency", "Empirical CDFs over finished requests (TTFT and E2E on log axes).",
     cdf_figure),
    ("mapping", "Map and unmap operations: background vs critical path",
     "Page groups mapped by the background mapper, mapped on the critical path (the iteration waits), and "
     "unmapped (drawn below zero), summed per time window; for paged runs the blocks allocated and freed, for "
     "static runs the reservations made and freed (no VMM call: all on the critical path).", mapping_figure),
)


TIER_COLOURS = {"hbm": "#1f77b4", "dram": "#ff7f0e", "ssd": "#2ca02c"}
TIER_NAMES = {"hbm": "HBM prefix cache", "dram": "DRAM", "ssd": "SSD"}


def tier_kinds(table: pd.DataFrame) -> list[str]:
    """The tiers of an occupancy table (``tiers.parquet``), from HBM down: each ``<kind>_bytes`` column's kind."""
    return [column.removesuffix("_bytes") for column in table.columns if column.endswith("_bytes")]


def tier_views(views: list[RunView]) -> list[RunView]:
    """The views whose run has a non-empty tier occupancy table (whole runs only: a replica's or an
    instance's view of a split run is left out)."""
    return [view for view in views if view.replica is None and view.role is None
            and view.result.tiers is not None and len(view.result.tiers)]


def tier_figure(views: list[RunView]) -> go.Figure:
    """KV bytes resident per tier over time (GiB): one step line per tier and run, coloured by tier
    (:data:`TIER_COLOURS`), dashed by run; the legend names each tier's capacity (``tier_<kind>_capacity_bytes``
    of the summary). Tables longer than :data:`analysis.downsample.MAX_POINTS` rows keep each time bucket's
    minimum and maximum (:func:`analysis.downsample.min_max`)."""
    fig = go.Figure()
    for view in tier_views(views):
        table = view.result.tiers
        x = table["time_us"].to_numpy(dtype=float) / US_PER_S
        for kind in tier_kinds(table):
            px, py = min_max(x, table[f"{kind}_bytes"].to_numpy(dtype=float) / GIB)
            capacity = view.result.summary.get(f"tier_{kind}_capacity_bytes")
            size = f" (capacity {capacity / GIB:,.1f} GiB)" if capacity else ""
            fig.add_scatter(x=px, y=py, mode="lines", line_shape="hv", legendgroup=view.label,
                            name=f"{view.label}: {TIER_NAMES.get(kind, kind)}{size}", opacity=LINE_OPACITY,
                            line=dict(color=TIER_COLOURS.get(kind, view.colour), dash=view.dash,
                                      width=view.width - 0.5),
                            hovertemplate=f"t=%{{x:.3f}} s<br>%{{y:.3f}} GiB<extra>{view.label}: {kind}</extra>")
    return _layout(fig, 400, xaxis_title=TIME_AXIS, yaxis_title="KV resident (GiB)")


TIER_FIGURE = ("tiers", "KV tier occupancy",
               "KV bytes resident in each tier over time, from the run's tiers.parquet (kvsim simulate --kv-tier): "
               "pages cached in HBM by the prefix cache (mapped by requests or not) and pages held in DRAM and SSD, "
               "each a step line changing where an iteration changed it; the legend gives each tier's capacity.",
               tier_figure)
"""Drawn after :data:`FIGURES` only when a run has a tier table (:func:`tier_views`)."""


MAX_REPLICA_VIEWS = 4
"""Replicas of one multi-replica run drawn as series of their own (the first ones; the rest are in the tables)."""


def replicas_of(result: RunResult) -> list[int]:
    """Replica numbers of a run's iterations (``[]`` for a single-replica run: no ``replica`` column)."""
    it = result.iterations
    return sorted(int(k) for k in it["replica"].unique()) if "replica" in it else []


MAX_INSTANCE_VIEWS = 8
"""Instances of one disaggregated run drawn as series of their own (prefill ones first; the rest are in the
tables)."""


def instances_of(result: RunResult) -> list[tuple[str, int]]:
    """``(role, instance)`` of a disaggregated run's iterations, prefill first (``[]`` for a co-located run)."""
    it = result.iterations
    if "role" not in it or "instance" not in it:
        return []
    pairs = it[["role", "instance"]].drop_duplicates()
    return sorted(((str(r), int(i)) for r, i in pairs.itertuples(index=False)),
                  key=lambda pair: (pair[0] != "prefill", pair))


def replica_views(views: list[RunView], max_replicas: int = MAX_REPLICA_VIEWS) -> list[RunView]:
    """The series the figures draw: a run of several replicas as one series per replica (its first
    ``max_replicas``; each replica has its own clock from 0, so one series would interleave their iterations),
    a disaggregated run as one series per prefill and decode instance (its first :data:`MAX_INSTANCE_VIEWS`:
    the instances run at once, so one series would join their iterations), every other run as it is. When a
    run is split, every series gets its own style as :func:`run_views` gives them; otherwise ``views`` is
    returned unchanged."""
    expanded = []
    for view in views:
        replicas, instances = replicas_of(view.result), instances_of(view.result)
        if len(replicas) > 1:
            expanded += [replace(view, label=f"{view.label} · replica {k}", replica=k) for k in replicas[:max_replicas]]
        elif instances:
            expanded += [replace(view, label=f"{view.label} · {role} {k}", role=role, instance=k)
                         for role, k in instances[:MAX_INSTANCE_VIEWS]]
        else:
            expanded.append(view)
    if len(expanded) == len(views):
        return views
    return [replace(view, colour=RUN_COLOURS[i % len(RUN_COLOURS)], dash=RUN_DASHES[i % len(RUN_DASHES)],
                    symbol=RUN_SYMBOLS[i % len(RUN_SYMBOLS)], width=max(3.0 - 0.5 * i, 1.5))
            for i, view in enumerate(expanded)]


def run_views(runs: list[RunResult], labels: list[str]) -> list[RunView]:
    """Pair each run with its label, a colour (plotly's qualitative palette), a dash style and a marker symbol,
    each cycling on its own, so that no two of the first 30 runs share all three."""
    return [RunView(label, RUN_COLOURS[i % len(RUN_COLOURS)], run, RUN_DASHES[i % len(RUN_DASHES)],
                    RUN_SYMBOLS[i % len(RUN_SYMBOLS)], max(3.0 - 0.5 * i, 1.5))
            for i, (run, label) in enumerate(zip(runs, labels))]
