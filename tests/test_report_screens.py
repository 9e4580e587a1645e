"""The report as a reader sees it (issue 16, part 3): two nearly identical runs stay apart (each run its own
dash style and marker), dense timelines read as a line inside a min/max band, long paths wrap and the page
never scrolls sideways at 1,400 px.

The figure checks run in Python; the layout checks open the report in headless Chromium (Debian's ``chromium``,
as in test_report_browser.py: no browser driver) with a probe that reports, after load, the page's scroll and
client widths, where each run-directory path ends and how many lines it takes, and what plotly drew per trace
(dash, marker symbol, fill, points). Screenshots go to ``test-artifacts/report-screens/``;
``python tests/test_report_screens.py [DIR]`` regenerates the ones in ``docs/report-screens/`` from real runs.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":      # run as a script: make the repository importable as in pytest
    sys.path.insert(0, str(REPO_ROOT))

from analysis import load_run, write_report  # noqa: E402
from analysis.downsample import BAND_BUCKETS  # noqa: E402
from analysis.figures import FIGURES, run_views  # noqa: E402
from cli import main  # noqa: E402
from tests.test_report_browser import CHROMIUM, chromium  # noqa: E402

ARTIFACTS = REPO_ROOT / "test-artifacts" / "report-screens"
WIDTH = 1400
TIMELINES = ("latency", "batch", "tail_waste")   # figures drawn as band + line per run
LONG_DIR = ("an-unusually-long-experiment-directory-name-that-a-script-generated-for-vattention-async-mapping/"
            "llama-3-8b_h200_tp1_page-2MiB_batch-256_budget-2048_memory-util-{util}_seed-0_run-2026-12-01T02-30-00Z")

LAYOUT_PROBE = """<script>
window.addEventListener('load', () => setTimeout(() => {
  const root = document.documentElement;
  const lineHeight = el => parseFloat(getComputedStyle(el).lineHeight) || 1.2 * parseFloat(getComputedStyle(el).fontSize);
  const paths = [...document.querySelectorAll('.path')].map(el => {
    const r = el.getBoundingClientRect();
    return {text: el.textContent, right: r.right, lines: Math.round(el.getClientRects().length)};
  });
  const cells = [...document.querySelectorAll('td, th')].map(el => el.getBoundingClientRect().right);
  const figures = {};
  for (const gd of document.querySelectorAll('.plotly-graph-div')) {
    figures[gd.id] = (gd._fullData || []).filter(t => t.visible !== false).map(t => ({
      name: t.name, mode: t.mode, fill: t.fill || 'none', dash: t.line ? t.line.dash : null,
      colour: t.line ? t.line.color : null, symbol: t.marker ? t.marker.symbol : null,
      points: t.x ? t.x.length : 0}));
  }
  const pre = document.createElement('pre');
  pre.id = 'kvsim-layout';
  pre.textContent = JSON.stringify({scrollWidth: root.scrollWidth, clientWidth: root.clientWidth,
                                    bodyScrollWidth: document.body.scrollWidth, paths: paths,
                                    widestCell: Math.max(...cells), figures: figures});
  document.body.appendChild(pre);
}, 0));
</script>"""

# what each saved screenshot shows: name -> (CSS that leaves only that part visible, window height)
# (only the report's own elements are hidden: plotly measures text in an element it appends to <body>)
_PAGE_PARTS = "body > h1, body > ul, body > p, body > h2, body > .table-wrap, body > details"
SCREENS = {
    "header-and-tables": ("section, details { display: none; }", 900),
    "latency": (f"{_PAGE_PARTS}, section:not(#section-latency) {{ display: none; }}", 560),
    "batch": (f"{_PAGE_PARTS}, section:not(#section-batch) {{ display: none; }}", 520),
    "cdf": (f"{_PAGE_PARTS}, section:not(#section-cdf) {{ display: none; }}", 560),
}


def make_runs(base: Path, extra: list[str]) -> list[Path]:
    """Two runs that differ only in --memory-util (0.9 vs 0.89: the same schedule, lines on top of each other),
    in long, machine-made directory names."""
    paths = []
    for util in ("0.90", "0.89"):
        path = base / LONG_DIR.format(util=util)
        assert main(["simulate", "--out", str(path), "--memory-util", util, "--quiet", *extra]) == 0
        paths.append(path)
    return paths


def with_extra(report: Path, out: Path, head: str = "", body_end: str = "") -> Path:
    text = report.read_text(encoding="utf-8")
    text = text.replace("</head>", head + "</head>", 1)
    end = text.rindex("</body>")
    out.write_text(text[:end] + body_end + text[end:], encoding="utf-8")
    return out


def layout(report: Path, work: Path, width: int = WIDTH) -> dict:
    page = with_extra(report, work / "layout.html", body_end=LAYOUT_PROBE)
    dom = chromium(page, "--virtual-time-budget=10000", f"--window-size={width},1000", "--dump-dom")
    found = re.search(r'<pre id="kvsim-layout">(.*?)</pre>', dom, re.S)
    assert found, "the layout probe never ran: the page did not finish loading"
    return json.loads(found.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))


def screenshots(report: Path, out_dir: Path, work: Path) -> list[Path]:
    """One PNG per entry of :data:`SCREENS`, 1,400 px wide."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shots = []
    for name, (css, height) in SCREENS.items():
        page = with_extra(report, work / f"{name}.html", head=f"<style>{css}</style>")
        shot = out_dir / f"{name}.png"
        shot.unlink(missing_ok=True)
        chromium(page, "--virtual-time-budget=10000", f"--window-size={WIDTH},{height}", f"--screenshot={shot}")
        shots.append(shot)
    return shots


@pytest.fixture(scope="module")
def near_identical(tmp_path_factory) -> list[Path]:
    return make_runs(tmp_path_factory.mktemp("runs"), ["--num-requests", "150"])


@pytest.fixture(scope="module")
def views(near_identical):
    runs = [load_run(p) for p in near_identical]
    from analysis.comparison import run_labels
    return run_views(runs, run_labels(runs))


# ---- figures (Python) ----------------------------------------------------------------------------------------
def test_near_identical_runs_get_distinct_dash_styles_and_markers(views):
    assert views[0].label != views[1].label
    assert views[0].dash != views[1].dash and views[0].symbol != views[1].symbol
    figures = {fig_id: build(views) for fig_id, _, _, build in FIGURES}
    for fig_id in (*TIMELINES, "cdf"):
        lines = [t for t in figures[fig_id].data if t.mode == "lines" and t.fill != "toself"]
        styles = {(t.name, t.line.dash, t.line.color) for t in lines}
        assert {s[1] for s in styles} == {"solid", "dash"}, (fig_id, styles)
        for view in views:   # every line of a run carries its dash
            assert {t.line.dash for t in lines if t.name == view.label} == {view.dash}
    stalls = [t for t in figures["latency"].data if t.mode == "markers"]
    assert [t.marker.symbol for t in stalls] == [views[0].symbol, views[1].symbol]


def test_downsampled_timelines_are_a_line_in_a_min_max_band(views):
    iterations = views[0].iterations
    assert len(iterations) > BAND_BUCKETS    # 150 requests: ~5,000 iterations
    figures = {fig_id: build(views) for fig_id, _, _, build in FIGURES if fig_id in TIMELINES}
    for fig_id, column, scale in (("latency", "duration_ms", 1), ("batch", "batch_size", 1),
                                  ("tail_waste", "tail_waste_bytes", 2**30)):
        bands = [t for t in figures[fig_id].data if t.fill == "toself"]
        lines = [t for t in figures[fig_id].data if t.mode == "lines" and t.fill != "toself"]
        assert len(bands) == len(lines) == 2, fig_id
        for band, line, view in zip(bands, lines, views):
            values = view.iterations[column].to_numpy(dtype=float) / scale
            assert 0 < len(line.x) <= BAND_BUCKETS
            assert band.legendgroup == line.legendgroup == view.label and band.showlegend is False
            # the band spans every value; the line (bucket means) stays inside it: outlines of adjacent
            # buckets, upper edge forward then lower edge back, separated by None at idle gaps
            ys = [y for y in band.y if y is not None]
            drawn = ~np.isnan(np.asarray(line.y, dtype=float))    # NaN: the line breaks at an idle gap
            line_y = np.asarray(line.y, dtype=float)[drawn]
            assert len(ys) == 2 * len(line_y) and (~drawn).sum() == sum(y is None for y in band.y) - 1
            assert max(ys) == pytest.approx(values.max()) and min(ys) == pytest.approx(values.min())
            upper, lower = [], []
            for part in _split(list(band.y)):
                half = len(part) // 2
                upper += part[:half]
                lower += part[half:][::-1]
            assert all(lo - 1e-9 <= m <= hi + 1e-9 for lo, m, hi in zip(lower, line_y, upper))


def _split(values: list) -> list[list]:
    parts, current = [], []
    for value in values:
        if value is None:
            parts.append(current)
            current = []
        else:
            current.append(value)
    return parts + ([current] if current else [])


def test_short_timelines_are_drawn_whole_without_a_band(tmp_path):
    run = tmp_path / "short"
    assert main(["simulate", "--out", str(run), "--num-requests", "10", "--quiet"]) == 0
    view = run_views([load_run(run)], ["short"])
    assert len(view[0].iterations) <= BAND_BUCKETS
    for fig_id, _, _, build in FIGURES:
        if fig_id in TIMELINES:
            band, line = build(view).data[:2]
            drawn = np.count_nonzero(~np.isnan(np.asarray(line.x, dtype=float)))   # NaN: breaks at idle gaps
            assert len(band.x) == 0 and drawn == len(view[0].iterations)


# ---- the page in a browser at 1,400 px -------------------------------------------------------------------------
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed "
                                    "(Debian: apt-get install chromium)")


@pytest.fixture(scope="module")
def report(near_identical, tmp_path_factory) -> Path:
    return write_report([load_run(p) for p in near_identical], tmp_path_factory.mktemp("report") / "report.html")


@needs_chromium
def test_no_horizontal_scroll_and_long_paths_wrap(report, near_identical, tmp_path):
    found = layout(report, tmp_path)
    assert found["clientWidth"] >= WIDTH - 20      # the window really is ~1,400 px wide
    assert found["scrollWidth"] <= found["clientWidth"], found["scrollWidth"]
    assert found["bodyScrollWidth"] <= found["clientWidth"]
    assert found["widestCell"] <= found["clientWidth"]
    paths = [p for p in found["paths"] if p["text"] in map(str, near_identical)]
    assert len(paths) == 2
    for path in paths:   # ~230 characters without a space: wrapped onto several lines, inside the page
        assert path["lines"] >= 2 and path["right"] <= found["clientWidth"], path


@needs_chromium
def test_the_browser_draws_each_run_in_its_own_style_with_bands(report, views, tmp_path):
    figures = layout(report, tmp_path)["figures"]
    for fig_id in TIMELINES:
        traces = figures[f"fig-{fig_id}"]
        bands = [t for t in traces if t["fill"] == "toself"]
        lines = [t for t in traces if t["mode"] == "lines" and t["fill"] != "toself"]
        assert [t["points"] > 0 for t in bands] == [True, True], fig_id
        assert [(t["name"], t["dash"]) for t in lines] == [(v.label, v.dash) for v in views], fig_id
    cdf_dashes = {t["dash"] for t in figures["fig-cdf"]}
    assert cdf_dashes == {"solid", "dash"}
    stall_symbols = [t["symbol"] for t in figures["fig-latency"] if t["mode"] == "markers"]
    assert stall_symbols == [v.symbol for v in views]


@needs_chromium
def test_screenshots_at_1400_px(report, tmp_path):
    shots = screenshots(report, ARTIFACTS, tmp_path)
    assert [s.name for s in shots] == [f"{name}.png" for name in SCREENS]
    assert all(s.stat().st_size > 10_000 for s in shots)


if __name__ == "__main__":
    # Regenerate docs/report-screens from two near-identical runs of the real Azure conversation trace.
    import tempfile
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO_ROOT / "docs" / "report-screens"
    trace = REPO_ROOT.parent / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    extra = ["--trace", str(trace.resolve()), "--num-requests", "2000"] if trace.is_file() else ["--num-requests", "2000"]
    with tempfile.TemporaryDirectory(prefix="kvsim-screens-") as work:
        runs = make_runs(Path(work) / "runs", extra)
        page = write_report([load_run(p) for p in runs], Path(work) / "report.html")
        found = layout(page, Path(work))
        print(f"scrollWidth {found['scrollWidth']} <= clientWidth {found['clientWidth']}; paths on "
              f"{[p['lines'] for p in found['paths']]} lines")
        import shutil
        import subprocess
        for shot in screenshots(page, out, Path(work)):
            if shutil.which("pngquant"):   # 256 colours: a third of the size, the same look
                subprocess.run(["pngquant", "--force", "--skip-if-larger", "--output", str(shot), "256", str(shot)],
                               check=False)
            print(f"{shot} ({shot.stat().st_size / 1e3:.0f} kB)")
