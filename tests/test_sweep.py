"""Sweeps: grid parsing and expansion, point keys, failing points, resumability, local executors."""
from __future__ import annotations

import argparse

import pandas as pd
import pytest

from analysis.planning.sweep import base_settings, expand_grid, make_jobs, parse_grid, point_args, sweep_table
from analysis.planning.sweep_run import run_sweep


def sweep_args(*extra: str) -> argparse.Namespace:
    import cli
    from analysis.planning.cli import register
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if "sweep" not in sub.choices:
        register(sub)
    return parser.parse_args(["sweep", "--grid", "seed=0", "--out", "unused", "--num-requests", "30", *extra])


def test_grid_expansion_is_the_cartesian_product_last_axis_fastest():
    grid = parse_grid(["page_size=64KiB,256KiB,2MiB", "policy=vattention,paged", "max_batch=128,256"])
    points = expand_grid(grid)
    assert len(points) == 12
    assert points[0] == {"page_size": "64KiB", "policy": "vattention", "max_batch": "128"}
    assert points[1] == {"page_size": "64KiB", "policy": "vattention", "max_batch": "256"}
    assert points[-1] == {"page_size": "2MiB", "policy": "paged", "max_batch": "256"}


def test_policy_axis_keeps_full_specs_with_commas():
    grid = parse_grid(["policy=vattention:page=256KiB,sync,paged:block=16,static"])
    assert grid["policy"] == ["vattention:page=256KiB,sync", "paged:block=16", "static"]


def test_repeated_axis_appends_values():
    assert parse_grid(["max_batch=8", "max_batch=16,8"]) == {"max_batch": ["8", "16"]}


@pytest.mark.parametrize("item, message", [
    ("pagesize=2MiB", "unknown axis 'pagesize'; valid axes: "),
    ("page_size=2MB2", "page_size"),
    ("max_batch", "expected AXIS=V1,V2"),
    ("scheduler=fifo", "choose one of sarathi, vllm"),
])
def test_grid_errors_name_the_axis(item, message):
    with pytest.raises(ValueError, match=message):
        parse_grid([item])


@pytest.mark.parametrize("policy, items, message", [
    ("paged:block=32", ["block_size_tokens=16,64"], "--grid block_size_tokens sets block_size_tokens, which --policy "
     "paged:block=32 also sets"),
    ("vattention:sync", ["sync_mapping=off"], "which --policy vattention:sync also sets"),
    ("vattention:page=256KiB", ["page_size=2MiB"], "--grid page_size sets page_size_bytes"),
    (None, ["policy=vattention:sync,paged", "sync_mapping=on,off"], "which --grid policy=vattention:sync also sets"),
    (None, ["deferred_reclaim=off,on", "no_deferred_reclaim=on"], "--grid deferred_reclaim and --grid "
     "no_deferred_reclaim set the same setting"),
])
def test_an_axis_a_spec_would_override_is_refused(policy, items, message):
    """A grid axis whose field the base --policy spec (or a policy axis's value) also sets would be overridden at
    every point, its rows mislabelled (both rows of ``block_size_tokens=16,64`` ran ``block=32``): refused."""
    base = base_settings(sweep_args(*(["--policy", policy] if policy else [])))
    with pytest.raises(ValueError, match=message):
        make_jobs(parse_grid(items), base)
    assert len(make_jobs(parse_grid(["policy=vattention,paged", "page_size=256KiB,2MiB"]), base_settings(
        sweep_args()))) == 4                    # specs that leave the axis's field alone: kept


def test_a_kv_tier_axis_keeps_each_tier_s_options_and_stacks_with_plus(tmp_path):
    """A kv_tier value keeps its own key=value options (a comma starts a new value only before a tier kind or
    none), "+" stacks tiers in one point, none runs HBM only; each point's run has those tiers (a kv_tier axis
    ended in a TypeError: the repeatable option got one TierSpec, not a list)."""
    from tests.test_routing import write_mooncake

    grid = parse_grid(["kv_tier=none,dram:1GiB,bw=10GB/s,dram:1GiB+ssd:4GiB"])
    assert grid == {"kv_tier": ["none", "dram:1GiB,bw=10GB/s", "dram:1GiB+ssd:4GiB"]}
    trace = str(write_mooncake(f"{tmp_path}/mc.jsonl", 20))
    jobs = make_jobs(grid, base_settings(sweep_args("--trace", trace, "--policy", "vattention:prefix=on")))
    records, ran = run_sweep(jobs, tmp_path / "out", workers=1)
    table = sweep_table(jobs, records)
    assert ran == 3 and list(table["status"]) == ["ok"] * 3, table["error"].tolist()
    tiers = [records[job.key]["result"].get("tier_dram_hit_tokens") for job in jobs]
    assert tiers[0] is None and tiers[1] is not None and tiers[2] is not None
    assert "tier_ssd_hit_tokens" in records[jobs[2].key]["result"]
    assert "tier_ssd_hit_tokens" not in records[jobs[1].key]["result"]


@pytest.mark.parametrize("flags, item, flag", [(["--no-deferred-reclaim"], "deferred_reclaim=off,on",
                                                "--no-deferred-reclaim"),
                                               (["--page-size", "64KiB"], "page_size=2MiB,256KiB", "--page-size")])
def test_an_axis_over_a_flag_given_on_the_command_line_is_refused(flags, item, flag):
    """A flag the command line sets and a grid axis over the same option: the axis replaced the flag at every
    point, silently (the "on" point of deferred_reclaim reclaimed); refused, naming both. An axis over an option
    left at its default runs."""
    with pytest.raises(ValueError, match=f"sets what {flag} also sets on the command line"):
        make_jobs(parse_grid([item]), base_settings(sweep_args(*flags)))
    assert len(make_jobs(parse_grid([item]), base_settings(sweep_args()))) == 2


def test_unknown_axis_lists_each_valid_name_once():
    with pytest.raises(ValueError) as err:
        parse_grid(["nosuch=1"])
    options, fields = str(err.value).split("valid axes: the simulate options ")[1].split("; and the SimConfig fields ")
    names = options.split(", ") + fields.split(", ")
    assert len(names) == len(set(names)) and {"page_size", "tp", "eager_lookahead_steps"} <= set(names)
    assert "explicit_fields" not in names         # bookkeeping, not an axis


def test_axes_map_to_options_and_config_fields():
    base = base_settings(sweep_args())
    job = make_jobs(parse_grid(["page_size=256KiB", "deferred_reclaim=off", "sync_mapping=on",
                                "eager_lookahead_steps=3", "rate_scale=2"]), base)[0]
    args, overrides = point_args(job)
    assert args.page_size == 256 * 1024 and args.no_deferred_reclaim and args.sync_mapping and args.rate_scale == 2.0
    assert overrides == {"eager_lookahead_steps": 3, "explicit_fields": ("eager_lookahead_steps",)}


def test_point_key_is_stable_and_covers_base_options():
    grid = parse_grid(["max_batch=8,16"])
    first, second = make_jobs(grid, base_settings(sweep_args())), make_jobs(grid, base_settings(sweep_args()))
    assert [j.key for j in first] == [j.key for j in second] and first[0].key != first[1].key
    other = make_jobs(grid, base_settings(sweep_args("--gpu", "h100")))
    assert other[0].key != first[0].key


def test_sweep_reports_a_failing_point_and_resumes(tmp_path):
    base = base_settings(sweep_args())
    grid = parse_grid(["memory_util=0.9,0.05", "max_batch=8,64"])
    jobs = make_jobs(grid, base)
    records, ran = run_sweep(jobs, tmp_path, workers=1)
    assert ran == 4
    table = sweep_table(jobs, records)
    assert list(table["status"]) == ["ok", "ok", "error", "error"]
    assert table.loc[2, "error"].startswith("ConfigError:") and "memory_util_frac=0.05" in table.loc[2, "error"]
    assert (table.loc[:1, "finished"] == 30).all()
    again, ran_again = run_sweep(jobs, tmp_path, workers=1)
    assert ran_again == 2               # the stored failed points run again; the finished ones are reused
    pd.testing.assert_frame_equal(sweep_table(jobs, again).drop(columns="wall_s", errors="ignore"),
                                  table.drop(columns="wall_s", errors="ignore"))


def test_a_grid_run_over_another_says_which_points_its_table_leaves_out(tmp_path, capsys):
    """A sweep directory caches points: an unrelated grid run into it tables its own points only, and says that
    the stored points of the other grid stay under points/ but leave the table (it rewrote sweep.csv silently);
    rerunning the first grid tables them again without simulating."""
    from cli import main

    out = tmp_path / "sw"
    common = ["--num-requests", "20", "--quiet", "--out", str(out)]
    assert main(["sweep", "--grid", "policy=vattention,paged", *common]) == 0
    capsys.readouterr()
    assert main(["sweep", "--grid", "seed=7", *common]) == 0
    captured = capsys.readouterr()
    assert "holds 2 finished points of another grid" in captured.err and len(pd.read_csv(out / "sweep.csv")) == 1
    assert main(["sweep", "--grid", "policy=vattention,paged", *common]) == 0
    captured = capsys.readouterr()
    assert "(0 run now, 2 already in" in captured.out and "holds 1 finished point of another grid" in captured.err
    assert main(["sweep", "--grid", "policy=vattention,paged", *common, "--force"]) == 0
    assert "another grid" not in capsys.readouterr().err


def format_args(fmt: str, directory) -> tuple[str, ...]:
    """The trace options of a sweep over 30 requests of trace format ``fmt`` (``tests.test_routing.TRACE_FORMATS``):
    none for the synthetic workload, ``--trace`` of a Mooncake file (with ``hash_ids``) written in ``directory``."""
    from tests.test_routing import write_mooncake

    return () if fmt == "synthetic" else ("--trace", str(write_mooncake(f"{directory}/mooncake.jsonl", 30)))


@pytest.mark.parametrize("fmt", ["synthetic", "mooncake"])
def test_process_pool_matches_inline_run(tmp_path, fmt):
    """Points run in this process and on a local process pool give the same table, for each trace format."""
    jobs = make_jobs(parse_grid(["policy=vattention,paged:block=16"]),
                     base_settings(sweep_args(*format_args(fmt, tmp_path))))
    inline, _ = run_sweep(jobs, tmp_path / "inline", workers=1)
    pooled, _ = run_sweep(jobs, tmp_path / "pool", workers=2)
    table = sweep_table(jobs, inline)
    assert list(table["status"]) == ["ok", "ok"] and (table["finished"] == 30).all()
    pd.testing.assert_frame_equal(table, sweep_table(jobs, pooled))


def test_cli_sweep_writes_table_and_self_contained_figure(tmp_path, capsys):
    args = sweep_args("--quiet", "--workers", "1")
    # memory_util=0.1 leaves no KV room beside llama-3-8b's weights at tp=1 only (14.0 GiB < 14.96 GiB)
    args.grid, args.out = ["memory_util=0.9,0.1", "tp=1,2"], str(tmp_path)
    assert args.func(args) == 1          # the sweep completes, and its exit status reports the failed points
    out = capsys.readouterr().out
    assert "4 points (4 run now, 0 already" in out and "1 failed" in out
    table = pd.read_parquet(tmp_path / "sweep.parquet")
    assert len(table) == 4 and len(pd.read_csv(tmp_path / "sweep.csv")) == 4
    html = (tmp_path / "sweep.html").read_text()
    assert "plotly" in html and '<script src="http' not in html and len(html) > 1_000_000   # plotly.js embedded
    assert args.func(args) == 1 and "(1 run now, 3 already" in capsys.readouterr().out


def test_capacity_job_per_point(tmp_path):
    args = sweep_args("--slo", "ttft_p99=500ms,tpot_p99=50ms", "--tolerance", "0.2")
    jobs = make_jobs(parse_grid(["gpu=h100,h200"]), base_settings(args), job="capacity")
    records, _ = run_sweep(jobs, tmp_path, workers=1)
    table = sweep_table(jobs, records)
    assert list(table["status"]) == ["ok", "ok"] and (table["capacity_req_per_s"] > 0).all()


def test_cli_sweep_refuses_a_folder_that_is_not_a_kvsim_result_even_with_force(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    args = sweep_args("--quiet", "--workers", "1")
    args.grid, args.out = ["seed=0"], str(tmp_path)
    for force in (False, True):    # --force replaces only a kvsim result; a user's folder is never touched
        args.force = force
        with pytest.raises(FileExistsError, match="--out .*notes.txt"):
            args.func(args)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"] and (tmp_path / "notes.txt").read_text() == "mine"


def test_a_bad_profile_stops_the_sweep_before_any_point(tmp_path, capsys):
    """A profile with a field out of range is one error before any point runs (it used to fail every point
    and report that no point met the SLOs)."""
    import json
    from pathlib import Path

    from cli import main

    profile = json.loads((Path(__file__).resolve().parents[1] / "profiles" / "h200.json").read_text())
    profile["compute_in_loop"]["params"]["attention_tail_serial"] = 2
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(profile))
    out = tmp_path / "sweep"
    assert main(["sweep", "--grid", "gpu=h100,h200", "--profile", str(bad), "--num-requests", "20",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "attention_tail_serial must be a finite number 0 to 1, got 2" in err and not out.exists()


def test_a_policy_axis_refuses_a_misspelt_value_by_name_before_any_point_runs():
    """Helper-48: ``policy=paged,bogus`` was one point, ``unknown policy 'paged,bogus'``, failing only when run. A
    bare item that is not a key of the spec before it starts a value; a policy value is parsed in parse_grid."""
    import pytest

    from analysis.planning.sweep import parse_grid
    assert parse_grid(["policy=vattention:page=256KiB,sync,paged:block=16,static"])["policy"] == \
        ["vattention:page=256KiB,sync", "paged:block=16", "static"]
    with pytest.raises(ValueError, match=r"--grid policy=bogus: policy 'bogus': unknown policy 'bogus'"):
        parse_grid(["policy=paged,bogus"])
    with pytest.raises(ValueError, match=r"policy=vattention:page=64KiB,eager=off: .*eager=off: expected a whole"):
        parse_grid(["policy=vattention:page=64KiB,eager=off,paged"])


def test_two_spellings_of_one_policy_on_an_axis_are_refused():
    """``policy=paged,paged:block=16`` spells one configuration twice (16 is the default block): the table held the
    same point under two labels; refused, as kvsim compare refuses it. Under an --engine preset the defaults differ
    (sglang's paged has 1-token blocks), so the same axis there is two configurations and runs."""
    with pytest.raises(ValueError, match="'paged' and 'paged:block=16' are the same configuration"):
        make_jobs(parse_grid(["policy=paged,paged:block=16"]), base_settings(sweep_args()))
    with pytest.raises(ValueError, match="same configuration"):
        make_jobs(parse_grid(["policy=vattention:mapping=async,vattention"]), base_settings(sweep_args()))
    assert len(make_jobs(parse_grid(["policy=paged,paged:block=32"]), base_settings(sweep_args()))) == 2
    assert len(make_jobs(parse_grid(["policy=paged,paged:block=16"]),
                         base_settings(sweep_args("--engine", "sglang")))) == 2
