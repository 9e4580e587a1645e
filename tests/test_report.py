"""The HTML report: figures and trace counts, downsampling that keeps every stall, size on a large run,
``kvsim report`` refusals and errors. (The real-browser check is in test_report_browser.py.)"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import RunResult, compare, load_run, write_report
from analysis.downsample import bin_sums, cdf_points, min_max, nice_window
from analysis.figures import FIGURES, latency_figure, pool_parts, run_views
from analysis.comparison import run_labels
from analysis.report import build_report_html
from analysis.results import summarize
from cli import main
from sim.results.records import ITERATION_COLUMNS, REQUEST_COLUMNS

TRACES_PER_RUN = {"latency": 3, "batch": 2, "pool": 4, "tail_waste": 2, "cdf": 3, "mapping": 3}
CONFIG = {"page_group_bytes": 128 * 2**20, "num_sub_tensors": 64, "policy": "vattention"}


def synthetic_run(num_iterations: int, num_stalls: int, label: str = "synthetic", seed: int = 0) -> RunResult:
    """A run built directly (no simulation): ~5 ms iterations, ``num_stalls`` of them stalled."""
    rng = np.random.default_rng(seed)
    n = num_iterations
    it = pd.DataFrame(0, index=np.arange(n), columns=list(ITERATION_COLUMNS))
    duration_us = rng.uniform(4000.0, 6000.0, n)
    stalled = np.sort(rng.choice(n, num_stalls, replace=False))
    stall_us = np.zeros(n)
    stall_us[stalled] = rng.uniform(100.0, 3000.0, num_stalls)
    duration_us += stall_us
    mapped = rng.integers(100, 200, n)
    it = it.assign(iteration=np.arange(n), start_at_us=np.cumsum(duration_us) - duration_us, duration_us=duration_us,
                   sync_stall_us=stall_us, sync_map_page_groups=(stall_us > 0).astype(int),
                   bg_map_page_groups=rng.integers(0, 2, n), unmap_page_groups=rng.integers(0, 2, n),
                   batch_size=rng.integers(1, 256, n), mapped_page_groups=mapped, used_page_groups=mapped // 2,
                   deferred_page_groups=mapped // 4, free_page_groups=900 - mapped,
                   tail_waste_bytes=rng.integers(0, 2**32, n))
    m = max(n // 30, 10)
    req = pd.DataFrame(0, index=np.arange(m), columns=list(REQUEST_COLUMNS)).assign(
        status="finished", ttft_us=rng.lognormal(10, 1, m), tpot_us=rng.normal(5000, 300, m),
        e2e_us=rng.lognormal(14, 1, m), output_tokens=10, prompt_tokens=100,
        arrival_at_us=np.linspace(0, it["start_at_us"].iloc[-1], m), completion_at_us=it["start_at_us"].iloc[-1])
    counters = {"sync_map_page_groups": num_stalls, "bg_map_page_groups": 1, "sync_unmap_page_groups": 0,
                "bg_unmap_page_groups": 0, "pool_page_groups": 900}
    config = {**CONFIG, "label": label}
    return RunResult(req, it, summarize(req, it, counters, config), config)


@pytest.fixture(scope="module")
def small_runs(tmp_path_factory) -> list:
    """Two simulated run directories: asynchronous and synchronous mapping."""
    base = tmp_path_factory.mktemp("runs")
    for name, extra in (("async", []), ("sync", ["--sync-mapping"])):
        assert main(["simulate", "--out", str(base / name), "--num-requests", "80", "--quiet", *extra]) == 0
    return [base / "async", base / "sync"]


@pytest.mark.parametrize("num_runs", [1, 2])
def test_each_figure_has_its_traces_per_run(small_runs, num_runs):
    views = run_views([load_run(p) for p in small_runs[:num_runs]], ["a", "b"][:num_runs])
    counts = {fig_id: len(build(views).data) for fig_id, _, _, build in FIGURES}
    assert counts == {fig_id: n * num_runs for fig_id, n in TRACES_PER_RUN.items()}


def test_runs_have_one_colour_each_and_share_the_axes(small_runs):
    views = run_views([load_run(p) for p in small_runs], ["async", "sync"])
    fig = latency_figure(views)   # every run's band, then every run's line on top, then the stall markers
    assert [t.line.color if t.mode == "lines" else t.marker.color for t in fig.data] == [
        views[0].colour, views[1].colour] * 3
    assert views[0].colour != views[1].colour
    assert {t.xaxis for t in fig.data} == {None}   # one set of axes (plotly's default x)


def test_downsampling_keeps_every_stall_and_bounds_the_points():
    run = synthetic_run(600_000, num_stalls=1234)
    fig = latency_figure(run_views([run], ["big"]))
    band, line, stalls = fig.data
    assert len(line.x) <= 5000 and len(band.x) <= 2 * 5000 + 5000
    stalled = run.iterations[run.iterations["sync_stall_us"] > 0]
    assert len(stalls.x) == 1234
    np.testing.assert_allclose(np.asarray(stalls.x), stalled["start_at_us"] / 1e6)
    # the min/max band still reaches the slowest and the fastest iteration
    band_y = [y for y in band.y if y is not None]
    assert max(band_y) == pytest.approx(run.iterations["duration_us"].max() / 1e3)
    assert min(band_y) == pytest.approx(run.iterations["duration_us"].min() / 1e3)


def test_min_max_keeps_each_buckets_extremes_in_time_order():
    x = np.arange(100.0)
    y = np.zeros(100)
    y[[7, 55]] = [9.0, -3.0]
    xs, ys = min_max(x, y, max_points=10)
    assert len(xs) <= 10 and list(xs) == sorted(xs)
    assert (7.0, 9.0) in zip(xs, ys) and (55.0, -3.0) in zip(xs, ys)
    assert min_max(x[:5], y[:5], max_points=10)[0].tolist() == [0, 1, 2, 3, 4]


def test_pool_parts_add_up_to_mapped_plus_free():
    run = synthetic_run(20_000, num_stalls=0)
    parts = pool_parts(run_views([run], ["x"])[0], max_points=100)
    total = parts[["used_gib", "slack_gib", "deferred_gib", "free_gib"]].sum(axis=1)
    assert len(parts) == 100
    np.testing.assert_allclose(total, 900 * CONFIG["page_group_bytes"] / 2**30)


def test_bin_sums_and_windows():
    bins = bin_sums(np.array([0.1, 0.2, 2.5]), {"n": np.array([1, 2, 5])}, window=1.0)
    assert bins["x"].tolist() == [0.5, 1.5, 2.5] and bins["n"].tolist() == [3, 0, 5]
    assert nice_window(3600.0) == 20.0 and nice_window(30.0) == 0.2 and nice_window(0.0) == 1.0
    x, p = cdf_points(np.array([3.0, np.nan, 1.0, 2.0, np.inf]))
    assert x.tolist() == [1.0, 2.0, 3.0] and p[-1] == 1.0


def test_report_of_a_large_run_stays_small():
    runs = [synthetic_run(600_000, num_stalls=2000, label="a"), synthetic_run(600_000, 50, label="b", seed=1)]
    size_bytes = len(build_report_html(runs).encode())
    assert size_bytes < 20 * 2**20, f"report is {size_bytes / 2**20:.1f} MiB"


def test_report_is_self_contained(tmp_path, small_runs):
    text = write_report([load_run(small_runs[0])], tmp_path / "r.html").read_text()
    assert "<script src" not in text and "cdn.plot.ly" not in text.split("</script>", 1)[1]
    assert text.count('class="plotly-graph-div"') == len(FIGURES)


def test_write_report_to_a_directory_names_the_directory(tmp_path, small_runs):
    """Helper-48: the API raised ``IsADirectoryError`` naming its hidden temporary file; now one message names the
    directory given and a file to give instead, and the directory is left as it was."""
    import pytest
    target = tmp_path / "userdir"
    target.mkdir()
    (target / "mine.txt").write_text("kept")
    with pytest.raises(IsADirectoryError, match="userdir is a directory; the report is one HTML file") as raised:
        write_report([load_run(small_runs[0])], target)
    assert ".kvsim-new" not in str(raised.value)
    assert [p.name for p in tmp_path.iterdir()] == ["userdir"] and (target / "mine.txt").read_text() == "kept"


def test_compare_has_one_row_per_run_and_keeps_equal_labels_apart(small_runs):
    runs = [load_run(p) for p in small_runs] + [load_run(small_runs[0])]
    table = compare(runs)
    assert len(table) == 3 and table.index.is_unique
    assert list(table.index) == run_labels(runs)
    assert table.iloc[1]["sync mapping stall (ms)"] > 0


def test_report_command_refuses_to_overwrite(tmp_path, small_runs, capsys):
    out = tmp_path / "report.html"
    assert main(["report", *map(str, small_runs), "--out", str(out)]) == 0
    assert main(["report", str(small_runs[0]), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["report", str(small_runs[0]), "--out", str(out), "--force"]) == 0
    mine = tmp_path / "mine.parquet"          # a user's file, not a report: --force does not replace it
    mine.write_bytes(b"PAR1 my trace")
    assert main(["report", str(small_runs[0]), "--out", str(mine), "--force"]) == 2
    assert "exists and is not a kvsim report; --force replaces only such a file" in capsys.readouterr().err
    assert mine.read_bytes() == b"PAR1 my trace"


def test_bad_run_dir_gives_one_clear_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvsim: error: ") and "Traceback" not in err
    assert str(tmp_path / "empty") in err and "not a kvsim run directory" in err
    assert not (tmp_path / "r.html").exists()


def test_simulate_report_writes_it_next_to_the_results(tmp_path):
    assert main(["simulate", "--out", str(tmp_path / "run"), "--num-requests", "30", "--quiet", "--report"]) == 0
    assert (tmp_path / "run" / "report.html").stat().st_size > 1_000_000


def test_a_multi_replica_run_is_drawn_one_series_per_replica():
    """Replicas each keep their own clock from 0: drawn as one series their iterations would interleave. The
    figures draw the first MAX_REPLICA_VIEWS replicas as series of their own; single runs are left as they are."""
    from analysis.figures import MAX_REPLICA_VIEWS, replica_views

    parts = [synthetic_run(200, 3, seed=k) for k in range(6)]
    it = pd.concat([p.iterations.assign(replica=k) for k, p in enumerate(parts)], ignore_index=True)
    req = pd.concat([p.requests.assign(replica=k) for k, p in enumerate(parts)], ignore_index=True)
    multi = RunResult(req, it, parts[0].summary, {**CONFIG, "label": "six replicas"})
    single = synthetic_run(200, 3, label="single")
    views = run_views([single, multi], ["single", "six"])
    single_only = views[:1]
    assert replica_views(single_only) is single_only          # nothing to split: the same views, same styles
    drawn = replica_views(views)
    assert [v.label for v in drawn] == ["single"] + [f"six · replica {k}" for k in range(MAX_REPLICA_VIEWS)]
    assert len({(v.colour, v.dash, v.symbol) for v in drawn}) == len(drawn)
    for k, view in enumerate(drawn[1:]):
        assert view.iterations["start_at_us"].tolist() == parts[k].iterations["start_at_us"].tolist()
        assert len(view.finished) == len(parts[k].requests)
    fig = latency_figure(drawn)
    assert {t.name for t in fig.data if t.name} >= {"six · replica 3", "single"}
    html = build_report_html([single, multi])
    assert "6 replicas, figures draw replicas 0, 1, 2, 3 as series of their own (the tables hold all)" in html


# ---- issue 36, item 14: --pd runs, idle gaps, runs without iterations, settings per policy, band under lines --
from analysis.figures import BAND_OPACITY, idle_cuts, replica_views  # noqa: E402
from analysis.report import NOT_APPLICABLE, config_rows, run_settings  # noqa: E402


@pytest.fixture(scope="module")
def pd_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("pd") / "run"
    assert main(["simulate", "--pd", "1:2", "--num-requests", "40", "--out", str(out), "--quiet"]) == 0
    return load_run(out)


def test_a_pd_report_fills_its_tables_and_draws_each_instance_apart(pd_run):
    views = replica_views(run_views([pd_run], ["pd"]))
    assert [v.label for v in views] == ["pd · prefill 0", "pd · decode 0", "pd · decode 1"]
    for view in views:        # each series holds only its instance's iterations, and its own pool size
        assert set(view.iterations["role"]) == {view.role} and set(view.iterations["instance"]) == {view.instance}
        assert view.page_group_gib == pytest.approx(128 / 1024)        # 2 MiB pages x 64 sub-tensors (8B)
    assert sum(len(v.iterations) for v in views) == len(pd_run.iterations)
    settings = run_settings(pd_run.config)
    assert settings["P:D"] == "1:2" and settings["GPUs"] == 3 and settings["KV link"] == "ib"
    assert settings["prefill: policy"] == settings["decode: policy"] == "vattention"
    page = build_report_html([pd_run])
    assert "prefill: page size (bytes)" in page and "decode 1" in page and "prefill 0" in page
    assert "TTFT p99 (ms)" in page                    # the summary table is filled from summary.json


def test_lines_break_at_idle_gaps_and_nowhere_else():
    x = np.array([0.0, 1.0, 2.0, 100.0, 101.0])       # busy 0-3 s, idle 3-100 s, busy again
    ends = x + 1.0                                     # back-to-back 1 s iterations within a busy period
    assert idle_cuts(x, ends, gap=0.1).tolist() == [3]
    run = synthetic_run(50, num_stalls=0)
    it = run.iterations
    late = it.index >= 25                              # the second half starts 60 s after the first ends
    it.loc[late, "start_at_us"] += 60e6
    fig = latency_figure(run_views([run], ["gap"]))
    line = next(t for t in fig.data if t.mode == "lines" and t.fill != "toself")
    y = np.asarray(line.y, dtype=float)
    assert np.isnan(y).sum() == 1 and np.isnan(y[25]) and len(y) == 51


def test_a_run_without_iterations_says_so():
    req = pd.DataFrame(0, index=np.arange(3), columns=list(REQUEST_COLUMNS)).assign(
        status="rejected", reject_reason="slot", arrival_at_us=[0.0, 1.0, 2.0])
    it = pd.DataFrame({c: pd.Series(dtype=float) for c in ITERATION_COLUMNS})
    counters = {"sync_map_page_groups": 0, "bg_map_page_groups": 0, "sync_unmap_page_groups": 0,
                "bg_unmap_page_groups": 0, "pool_page_groups": 900}
    empty = RunResult(req, it, summarize(req, it, counters, CONFIG), CONFIG)
    page = build_report_html([empty])
    assert "no iterations: all 3 requests were rejected" in page
    assert page.count("Nothing to draw: no run has iterations.") == len(FIGURES)
    with_one = build_report_html([empty, synthetic_run(100, 3)])    # the other run is still drawn
    assert "Nothing to draw" not in with_one and "no iterations: all 3 requests" in with_one


def test_the_run_table_shows_only_the_settings_of_each_policy():
    vat = {"policy": "vattention", "page_size_bytes": 2**21, "sync_mapping": False, "block_size_tokens": 16,
           "max_len_tokens": None, "model": "m"}
    paged = {**vat, "policy": "paged"}
    assert "block size (tokens)" not in run_settings(vat) and "page size (bytes)" in run_settings(vat)
    assert "page size (bytes)" not in run_settings(paged) and run_settings(paged)["block size (tokens)"] == 16
    rows = dict(config_rows([RunResult(None, None, {}, vat), RunResult(None, None, {}, paged)]))
    assert rows["page size (bytes)"] == [2**21, NOT_APPLICABLE] and rows["block size (tokens)"] == [NOT_APPLICABLE, 16]
    assert "tokens reserved per request" not in rows       # no static run in the table


def test_bands_are_light_and_under_every_line(small_runs):
    fig = latency_figure(run_views([load_run(p) for p in small_runs], ["async", "sync"]))
    kinds = ["band" if t.fill == "toself" else t.mode for t in fig.data]
    assert kinds == ["band", "band", "lines", "lines", "markers", "markers"]
    assert BAND_OPACITY <= 0.1 and fig.data[0].fillcolor.endswith(f"{BAND_OPACITY})")


def test_simulate_pd_report_writes_the_instances_report(tmp_path):
    out = tmp_path / "pd"
    assert main(["simulate", "--pd", "1:1", "--num-requests", "20", "--out", str(out), "--quiet", "--report"]) == 0
    page = (out / "report.html").read_text()
    assert "prefill 0" in page and "decode 0" in page and "P:D" in page


# ---- KV tier occupancy (tiers.parquet, analysis.figures.TIER_FIGURE) -------------------------------------------
def _tiny_mooncake(path) -> str:
    """A Mooncake-format trace (timestamp ms, hash blocks of 512 tokens): 12 requests, every third repeating
    the first prompt's blocks, so that the prefix cache and its DRAM tier hold pages."""
    import json
    lines = [{"timestamp": 200 * i, "input_length": 2048, "output_length": 8,
              "hash_ids": [0, 1, 2, 3] if i % 3 == 0 else [4 * i + k for k in range(10, 14)]} for i in range(12)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_a_tiered_run_writes_its_occupancy_and_its_report_draws_it(tmp_path):
    """--kv-tier (write-through): tiers.parquet holds the HBM and DRAM occupancy in time order, and DRAM fills to
    exactly its 1 GiB (9 distinct 2,048-token prompts x 128 blocks of 16 tokens x 128 KiB = 2.25 GiB stored; 1 GiB is
    512 whole 2 MiB blocks), load_run reads it back, and the report has the tier figure (one line per tier); the same run without tiers writes no
    tiers.parquet and its report has no tier figure."""
    trace_file = _tiny_mooncake(tmp_path / "t.jsonl")
    common = ["simulate", "--trace", trace_file, "--policy", "paged:prefix=on", "--quiet", "--report"]
    assert main([*common, "--kv-tier", "dram:1GiB", "--kv-tier-write", "write-through", "--out", str(tmp_path / "tiered")]) == 0
    assert main([*common, "--out", str(tmp_path / "plain")]) == 0
    tiered, plain = load_run(tmp_path / "tiered"), load_run(tmp_path / "plain")
    table = tiered.tiers
    assert list(table.columns) == ["time_us", "hbm_pages", "hbm_bytes", "dram_pages", "dram_bytes"]
    assert table["time_us"].is_monotonic_increasing and table["hbm_pages"].max() > 0
    assert table["dram_bytes"].max() == 2**30 and table["dram_pages"].max() == 512
    assert table["dram_pages"].iloc[-1] == tiered.summary["tier_dram_resident_pages"]
    assert plain.tiers is None and not (tmp_path / "plain" / "tiers.parquet").exists()
    tiered_page = (tmp_path / "tiered" / "report.html").read_text()
    plain_page = (tmp_path / "plain" / "report.html").read_text()
    assert 'id="fig-tiers"' in tiered_page and tiered_page.count('class="plotly-graph-div"') == len(FIGURES) + 1
    assert 'id="fig-tiers"' not in plain_page and plain_page.count('class="plotly-graph-div"') == len(FIGURES)
    from analysis.figures import tier_figure
    views = run_views([tiered, plain], ["tiered", "plain"])
    assert [trace.name for trace in tier_figure(views).data] == ["tiered: HBM prefix cache",
                                                                  "tiered: DRAM (capacity 1.0 GiB)"]
