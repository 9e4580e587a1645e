"""The HTML report in a real browser: headless Chromium (Debian's ``chromium``; ``.ci/run`` installs it).

No browser driver is downloaded: a copy of the report gets two small scripts, one at the top of ``<head>``
that records every JavaScript error, one at the end of ``<body>`` that, after the page has loaded, writes
what plotly drew (traces and points per figure) into a ``<pre>`` element as JSON. ``chromium --dump-dom``
prints the page after its scripts ran; ``--screenshot`` saves the PNG under ``test-artifacts/``.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from analysis import load_run, write_report
from cli import main

REPO_ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO_ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed "
                                "(Debian: apt-get install chromium; .ci/run installs it)")

ERROR_HOOK = """<script>
window.__kvsimErrors = [];
window.addEventListener('error', e => window.__kvsimErrors.push('error: ' + e.message));
window.addEventListener('unhandledrejection', e => window.__kvsimErrors.push('rejection: ' + e.reason));
const __kvsimConsoleError = console.error;
console.error = (...a) => { window.__kvsimErrors.push('console.error: ' + a.join(' ')); __kvsimConsoleError(...a); };
</script>"""
PROBE = """<script>
window.addEventListener('load', () => setTimeout(() => {
  const figures = {};
  for (const gd of document.querySelectorAll('.plotly-graph-div')) {
    figures[gd.id] = {traces: (gd.data || []).length, drawn: !!gd._fullLayout,
                      points: (gd.calcdata || []).map(c => c.length), names: (gd.data || []).map(t => t.name)};
  }
  const pre = document.createElement('pre');
  pre.id = 'kvsim-probe';
  pre.textContent = JSON.stringify({errors: window.__kvsimErrors, figures: figures});
  document.body.appendChild(pre);
}, 0));
</script>"""
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
         "--disable-default-apps", "--hide-scrollbars", "--mute-audio")


def instrumented_copy(report: Path, out: Path) -> Path:
    """``report`` with the error hook first in ``<head>`` and the probe last in ``<body>``."""
    text = report.read_text(encoding="utf-8")
    text = text.replace("<head>", "<head>" + ERROR_HOOK, 1)
    end = text.rindex("</body>")
    text = text[:end] + PROBE + text[end:]
    out.write_text(text, encoding="utf-8")
    return out


def chromium(page: Path, *args: str, timeout_s: float = 60) -> str:
    """Run headless Chromium on ``page`` with a throw-away profile; returns stdout."""
    with tempfile.TemporaryDirectory(prefix="kvsim-chromium-") as profile:
        done = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()],
                              capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise AssertionError(f"chromium exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def probe(report: Path, tmp_path: Path) -> dict:
    """What the page reported after loading: ``{"errors": [...], "figures": {div id: {...}}}``."""
    page = instrumented_copy(report, tmp_path / "probed.html")
    dom = chromium(page, "--virtual-time-budget=10000", "--dump-dom")
    found = re.search(r'<pre id="kvsim-probe">(.*?)</pre>', dom, re.S)
    assert found, "the probe never ran: the page did not finish loading"
    return json.loads(found.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> list[Path]:
    """A synthetic run with asynchronous mapping and one with synchronous mapping (stalls)."""
    base = tmp_path_factory.mktemp("runs")
    for name, extra in (("async", []), ("sync", ["--sync-mapping"])):
        assert main(["simulate", "--out", str(base / name), "--num-requests", "150", "--quiet", *extra]) == 0
    return [base / "async", base / "sync"]


@pytest.fixture(scope="module")
def report(two_runs, tmp_path_factory) -> Path:
    """The report comparing the two runs."""
    return write_report([load_run(path) for path in two_runs], tmp_path_factory.mktemp("report") / "report.html")


def test_report_loads_without_errors_and_draws_every_figure(two_runs, report, tmp_path):
    result = probe(report, tmp_path)
    assert result["errors"] == []
    per_run = {"latency": 3, "batch": 2, "pool": 4, "tail_waste": 2, "cdf": 3, "mapping": 3}
    figures = result["figures"]
    assert {fig_id: f["traces"] for fig_id, f in figures.items()} == {f"fig-{k}": 2 * n for k, n in per_run.items()}
    assert all(f["drawn"] for f in figures.values())
    # trace 5 of the latency figure (every run's band, then lines, then markers) is the sync run's stall markers: one drawn
    # point per stalled iteration
    stalls = int((load_run(two_runs[1]).iterations["sync_stall_us"] > 0).sum())
    assert stalls > 0 and figures["fig-latency"]["points"][5] == stalls


def test_report_screenshot(report):
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    chromium(report, "--virtual-time-budget=10000", "--window-size=1400,4800", f"--screenshot={shot}")
    assert shot.is_file() and shot.stat().st_size > 20_000
