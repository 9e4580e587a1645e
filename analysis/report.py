"""The HTML report of one or more runs: one self-contained file (plotly.js inline, works offline).

Page layout::

    kvsim report                 <- title, one line per run (label, directory, trace)
    Runs                         <- configuration side by side
    Summary                      <- analysis.comparison's metrics side by side (+ every summary.json key, folded)
    one section per figure       <- analysis.figures.FIGURES, each a <div id="fig-<id>">
    KV tier occupancy            <- analysis.figures.TIER_FIGURE, only when a run has tiers.parquet (--kv-tier)

Long timelines are downsampled (analysis.downsample: a line of bucket means in a min/max band): a report of the 19,366-request Azure conversation
trace (~620,000 iterations) is ~5.8 MB, of which ~4.8 MB is plotly.js.
"""
from __future__ import annotations

import html
import math
from pathlib import Path

import pandas as pd
import plotly.io as pio
from plotly.offline import get_plotlyjs

from analysis.comparison import comparison_table, run_labels
from analysis.downsample import BAND_BUCKETS
from analysis.figures import (FIGURES, MAX_REPLICA_VIEWS, TIER_FIGURE, RunView, replica_views, replicas_of,
                              run_views, tier_views)
from analysis.results import RunResult

PLOT_CONFIG = {"displaylogo": False, "responsive": True}
CONFIG_ROWS = (  # (label, config key, policies it applies to: None = every policy)
    ("policy", "policy", None), ("model", "model", None), ("GPU", "gpu", None), ("tensor parallel", "tp", None),
    ("page size (bytes)", "page_size_bytes", ("vattention",)), ("synchronous mapping", "sync_mapping", ("vattention",)),
    ("deferred reclaim", "deferred_reclaim", ("vattention",)), ("KV layout", "kv_layout", ("vattention",)),
    ("block size (tokens)", "block_size_tokens", ("paged",)),
    ("tokens reserved per request", "max_len_tokens", ("static",)),
    ("scheduler", "scheduler", None), ("token budget", "token_budget", None),
    ("request slots", "max_batch_slots", None), ("memory utilisation", "memory_util_frac", None),
    ("slot length (tokens)", "slot_max_tokens", None), ("preemption", "preemption", None),
    ("prefix caching", "prefix_caching", ("vattention", "paged")), ("seed", "seed", None),
    ("trace", "trace_source", None),
    ("VMM latencies", "vmm_latency_source", ("vattention",)), ("compute model", "compute_model", None),
)
DISAGG_ROWS = (("P:D", "pd"), ("GPUs", "gpus"), ("KV link", "kv_link"), ("KV streaming", "kv_stream"),
               ("deployment", "label"), ("trace", "trace_source"))
"""A disaggregated run's own settings (``kvsim simulate --pd``); each role's policy settings follow, from
``config.json``'s ``prefill`` and ``decode`` sections."""
# The page never scrolls sideways (checked at 1,400 px in tests/test_report_screens.py): long paths and labels
# wrap anywhere, a table wider than the page scrolls inside its own box, plots take the page's width.
STYLE = """
*, *::before, *::after { box-sizing: border-box; }
body { font-family: system-ui, sans-serif; margin: 1.5em auto; padding: 0 1em; max-width: 1400px; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
li, p, th, td.text, .path { overflow-wrap: anywhere; }
.table-wrap { max-width: 100%; overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right; vertical-align: top; }
th { max-width: 24em; }
th:first-child, td:first-child { text-align: left; }
td.text { text-align: left; max-width: 36em; }
tr.differs td { background: #fff6d5; } tr.differs td:first-child { font-weight: bold; }
.note { color: #555; font-size: 0.9em; }
.plotly-graph-div { max-width: 100%; }
"""


def _cell(value) -> str:
    if isinstance(value, bool) or value is None:
        return html.escape(str(value))
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return html.escape(str(value))


def html_table(rows: list[tuple[str, list]], labels: list[str], mark_differences: bool = False) -> str:
    """A table with one column per run: ``rows`` are ``(row label, [value per run])``; with
    ``mark_differences``, rows whose values differ between runs are highlighted (class ``differs``)."""
    head = "".join(f"<th>{html.escape(label)}</th>" for label in labels)
    body = []
    for name, values in rows:
        cells = "".join(f'<td class="text">{_cell(v)}</td>' if isinstance(v, str) else f"<td>{_cell(v)}</td>"
                        for v in values)
        differs = mark_differences and len(values) > 1 and len({_cell(v) for v in values}) > 1
        body.append(f"<tr{' class=differs' if differs else ''}><td>{html.escape(name)}</td>{cells}</tr>")
    return (f"<div class='table-wrap'><table><thead><tr><th></th>{head}</tr></thead><tbody>{''.join(body)}</tbody>"
            "</table></div>")


def _tidy(value):
    """numpy / pandas scalars to plain Python (for formatting)."""
    return value.item() if hasattr(value, "item") else value


NOT_APPLICABLE = "n/a"
"""A setting's cell for a run whose policy does not have it (another run of the table does)."""


def run_settings(config: dict) -> dict[str, object]:
    """A run's settings as ``{row label: value}``: the :data:`CONFIG_ROWS` that apply to its policy, and for a
    disaggregated run (``config["disaggregated"]``) :data:`DISAGG_ROWS` then each role's rows, labelled
    ``prefill: ...`` / ``decode: ...``."""
    if config.get("disaggregated"):
        settings = {name: config.get(key, "") for name, key in DISAGG_ROWS}
        if isinstance(settings["KV link"], dict):        # the link's spec: its name (the rest is in config.json)
            settings["KV link"] = settings["KV link"].get("name", "")
        for role in ("prefill", "decode"):
            own = run_settings({k: v for k, v in (config.get(role) or {}).items() if k != "trace_source"})
            settings.update({f"{role}: {name}": value for name, value in own.items() if name != "trace"})
        return settings
    policy = config.get("policy", "vattention")
    return {name: config.get(key, "") for name, key, policies in CONFIG_ROWS
            if (policies is None or policy in policies) and (key in config or key in ("policy", "trace_source"))}


def config_rows(runs: list[RunResult]) -> list[tuple[str, list]]:
    """The Runs table: a directory row, then every setting that applies to at least one run's policy
    (:func:`run_settings`), :data:`NOT_APPLICABLE` in the cells of the runs it does not apply to."""
    per_run = [run_settings(r.config) for r in runs]
    names = list(dict.fromkeys(name for settings in per_run for name in settings))
    rows = [(name, [settings.get(name, NOT_APPLICABLE) for settings in per_run]) for name in names]
    return [("directory", [str(r.path) if r.path else "(in memory)" for r in runs]), *rows]


def summary_section(runs: list[RunResult], labels: list[str]) -> str:
    """The Runs and Summary sections: configuration, the comparison metrics, and every summary key."""
    config_rows_ = config_rows(runs)
    table = comparison_table(dict(zip(labels, (r.summary for r in runs))))
    metric_rows = [(column, [_tidy(v) for v in table[column]]) for column in table.columns]
    keys = list(dict.fromkeys(k for r in runs for k in r.summary))
    all_rows = [(key, [r.summary.get(key, float("nan")) for r in runs]) for key in keys]
    note = ("<p class='note'>Highlighted rows differ between the runs.</p>" if len(runs) > 1 else "")
    return (f"<h2>Runs</h2>{note}{html_table(config_rows_, labels, mark_differences=True)}"
            f"<h2>Summary</h2>{html_table(metric_rows, labels)}"
            f"<details><summary>every summary.json key</summary>{html_table(all_rows, labels)}</details>")


def no_iterations_reason(run: RunResult) -> str:
    """Why a run has no iterations, in words (for the header and the empty figures)."""
    summary = run.summary
    requests, rejected = int(summary.get("requests", 0)), int(summary.get("rejected", 0))
    if requests == 0:
        return "its workload has no requests"
    if rejected == requests:
        reasons = summary.get("rejected_by_reason") or {}
        why = f" ({', '.join(f'{n:,} {r}' for r, n in sorted(reasons.items()))})" if reasons else ""
        return f"all {requests:,} requests were rejected{why}"
    return "no iteration was run"


def figure_sections(views: list[RunView]) -> list[str]:
    """One ``<section>`` per figure of :data:`analysis.figures.FIGURES` (plotly.js not included), then the tier
    occupancy figure (:data:`analysis.figures.TIER_FIGURE`) when a run has a tier table; series without
    iterations are left out, and a figure with none left says so instead of drawing empty axes."""
    sections = []
    drawn = [view for view in views if len(view.iterations)]
    for fig_id, heading, note, build in FIGURES + ((TIER_FIGURE,) if tier_views(views) else ()):
        if not drawn:
            sections.append(f'<section id="section-{fig_id}"><h2>{html.escape(heading)}</h2>'
                            f'<p class="note empty">Nothing to draw: no run has iterations.</p></section>')
            continue
        div = pio.to_html(build(drawn), config=PLOT_CONFIG, include_plotlyjs=False, full_html=False,
                          div_id=f"fig-{fig_id}")
        sections.append(f'<section id="section-{fig_id}"><h2>{html.escape(heading)}</h2>'
                        f'<p class="note">{html.escape(note)}</p>{div}</section>')
    return sections


def _header(runs: list[RunResult], labels: list[str], views: list[RunView]) -> str:
    items = "".join(f"<li><b>{html.escape(label)}</b> ({_style_name(view)}): <span class='path'>"
                    f"{html.escape(str(r.path or '(in memory)'))}</span>, "
                    f"{r.summary.get('requests', 0):,} requests, {r.summary.get('iterations', 0):,} iterations"
                    f"{_replica_note(r)}{_empty_note(r)}</li>"
                    for r, label, view in zip(runs, labels, views))
    return (f"<h1>kvsim report</h1><ul>{items}</ul><p class='note'>Each run has its own colour, dash style and "
            f"marker. Timelines longer than {BAND_BUCKETS:,} points are drawn as the mean per time bucket "
            f"({BAND_BUCKETS:,} buckets) inside a shaded band from the bucket's minimum to its maximum; stacked "
            "areas are bucket means; every synchronous-mapping stall is drawn. Drag to zoom, double-click to "
            "reset; click a legend entry to hide it.</p>")


def _empty_note(run: RunResult) -> str:
    """For a run without iterations: a line saying so and why (its figures are left out)."""
    if run.summary.get("iterations", 0):
        return ""
    return (f" <b class='empty'>&mdash; no iterations: {html.escape(no_iterations_reason(run))}; its figures are "
            "empty</b>")


def _replica_note(run: RunResult) -> str:
    """For a multi-replica run: which replicas the figures draw, each as a series of its own."""
    replicas = replicas_of(run)
    if len(replicas) <= 1:
        return ""
    shown = replicas[:MAX_REPLICA_VIEWS]
    return (f"; {len(replicas)} replicas, figures draw replica{'s' if len(shown) > 1 else ''} "
            f"{', '.join(map(str, shown))} as series of their own"
            f"{'' if len(shown) == len(replicas) else ' (the tables hold all)'}")


def _style_name(view: RunView) -> str:
    """How a run is drawn, in words (the swatch of the header list)."""
    return (f"<span style='color:{view.colour}'>&#9632;</span> {html.escape(view.dash)} line, "
            f"{html.escape(view.symbol.replace('-open', ''))} markers")


def build_report_html(runs: list[RunResult]) -> str:
    """The whole report page as one HTML string (plotly.js embedded inline).

    Raises:
        ValueError: if ``runs`` is empty.
    """
    if not runs:
        raise ValueError("a report needs at least one run")
    labels = run_labels(runs)
    views = run_views(runs, labels)
    title = html.escape("kvsim report: " + ", ".join(labels))
    body = (_header(runs, labels, views) + summary_section(runs, labels)
            + "".join(figure_sections(replica_views(views))))
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>{title}</title>'
            f'<style>{STYLE}</style>\n<script type="text/javascript">{get_plotlyjs()}</script>\n</head>\n'
            f"<body>{body}</body></html>\n")


def write_report(runs: list[RunResult], out_path) -> Path:
    """Write the report of ``runs`` to ``out_path`` (replacing it atomically; callers decide whether they may).

    Args:
        runs: one or more runs (e.g. from :func:`analysis.results.load_run`); one colour each.
        out_path: the HTML file to write; its parent directory is created.

    Returns:
        The path written.

    Raises:
        ValueError: ``out_path`` is one of the runs' own files (``summary.json``, ``requests.parquet``, ...):
            kvsim never writes over what it reads (the command line's ``report --out`` rule).
        IsADirectoryError: ``out_path`` is a directory (the report is one file: name it, e.g.
            ``DIR/report.html``); nothing is written.
    """
    from analysis.output import refuse_inputs, write_file_atomic
    from analysis.results import OPTIONAL_RUN_FILES, RUN_FILES
    if Path(out_path).is_dir():
        raise IsADirectoryError(f"out_path {out_path} is a directory; the report is one HTML file: name it, e.g. "
                                f"{Path(out_path) / 'report.html'}")
    for run in runs:
        if getattr(run, "path", None) is not None:
            refuse_inputs(out_path, [Path(run.path) / name for name in RUN_FILES + OPTIONAL_RUN_FILES
                                     if (Path(run.path) / name).exists()], "out_path")
    text = build_report_html(runs)
    return write_file_atomic(out_path, lambda temporary: temporary.write_text(text, encoding="utf-8"))
