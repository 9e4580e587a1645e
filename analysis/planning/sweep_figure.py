"""The sweep figure: one panel per metric, the first grid axis on x, one bar series per combination of the
other axes; a self-contained HTML file (plotly.js embedded, works offline)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

# (table column, panel title) per job
FIGURE_METRICS = {
    "simulate": (("throughput_req_per_s", "throughput (req/s)"), ("output_tokens_per_s", "output tokens/s"),
                 ("ttft_p99_ms", "TTFT p99 (ms)"), ("tpot_p99_ms", "TPOT p99 (ms)"), ("e2e_p99_s", "E2E p99 (s)"),
                 ("peak_mapped_bytes", "peak mapped KV (bytes)")),
    "capacity": (("capacity_req_per_s", "capacity (req/s per replica)"),
                 ("capacity_output_tokens_per_s", "capacity (output tokens/s per replica)"),
                 ("at_capacity_ttft_p99_ms", "TTFT p99 at capacity (ms)"),
                 ("at_capacity_tpot_p99_ms", "TPOT p99 at capacity (ms)")),
}


def sweep_figure(table: pd.DataFrame, axes: list[str], job: str = "simulate"):
    """A plotly figure of the sweep table (failed points are left out and listed in the title)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    metrics = [(c, t) for c, t in FIGURE_METRICS[job] if c in table.columns]
    ok = table[table["status"] == "ok"]
    x_axis, series_axes = axes[0], axes[1:]
    fig = make_subplots(rows=max(len(metrics), 1), cols=1, subplot_titles=[t for _, t in metrics],
                        vertical_spacing=0.06)
    groups = ok.groupby(series_axes, sort=False) if series_axes else [((), ok)]
    for number, (values, rows) in enumerate(groups):
        values = values if isinstance(values, tuple) else (values,)
        name = " ".join(f"{a}={v}" for a, v in zip(series_axes, values)) or "all"
        for row, (column, _) in enumerate(metrics, start=1):
            fig.add_trace(go.Bar(x=rows[x_axis].astype(str), y=rows[column], name=name, legendgroup=name,
                                 showlegend=row == 1, marker_color=_colour(number)), row=row, col=1)
    failed = len(table) - len(ok)
    title = f"kvsim sweep: {len(table)} points" + (f", {failed} failed (see sweep.csv)" if failed else "")
    fig.update_layout(title=title, barmode="group", height=300 * max(len(metrics), 1) + 120,
                      legend_title_text=", ".join(series_axes) or None)
    fig.update_xaxes(title_text=x_axis, type="category")
    return fig


def _colour(number: int) -> str:
    import plotly.express as px
    palette = px.colors.qualitative.Plotly
    return palette[number % len(palette)]


def write_figure(table: pd.DataFrame, axes: list[str], out_path: Path, job: str = "simulate") -> Path:
    """Write ``sweep.html`` (plotly.js embedded)."""
    sweep_figure(table, axes, job).write_html(Path(out_path), include_plotlyjs=True, full_html=True)
    return Path(out_path)
