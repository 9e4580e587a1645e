"""The Ray executor gives the same sweep table as the local process pool (a local Ray instance)."""
from __future__ import annotations

import pandas as pd
import pytest

from analysis.planning.sweep import base_settings, make_jobs, parse_grid, sweep_table
from analysis.planning.sweep_run import run_sweep
from tests.test_sweep import format_args, sweep_args

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'kvsim[ray]'); the Ray executor is untested")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.parametrize("fmt", ["synthetic", "mooncake"])
def test_ray_and_local_sweeps_are_identical(tmp_path, local_ray, fmt):
    grid = parse_grid(["policy=vattention,paged:block=16", "memory_util=0.9,0.05"])
    jobs = make_jobs(grid, base_settings(sweep_args(*format_args(fmt, tmp_path))))
    local, _ = run_sweep(jobs, tmp_path / "local", executor="local", workers=2)
    remote, ran = run_sweep(jobs, tmp_path / "ray", executor="ray")
    assert ran == 4
    table = sweep_table(jobs, remote)
    assert list(table["status"]) == ["ok", "error", "ok", "error"]
    pd.testing.assert_frame_equal(sweep_table(jobs, local), table)


@pytest.mark.parametrize("fmt", ["synthetic", "mooncake"])
@pytest.mark.parametrize("records", [False, True])
def test_ray_replicas_equal_the_local_ones(tmp_path, local_ray, fmt, records):
    """Replicas simulated as Ray tasks (rows through the object store, or a records directory) merge to exactly
    the in-process run's requests and summary, for a synthetic table and a Mooncake one (``hash_ids``)."""
    import traces
    from sim.setup.config import SimConfig
    from sim.cluster.routing import run_routed
    from tests.test_routing import trace_of_format

    trace, _ = traces.clip_context(traces.scale_rate(trace_of_format(fmt, tmp_path, 40), 20.0), 8192)
    local = run_routed(SimConfig(), trace, 2, "session-hash")
    remote = run_routed(SimConfig(), trace, 2, "session-hash", executor="ray",
                        records_dir=str(tmp_path / "records") if records else None)
    assert local.summary["finished"] == 40
    pd.testing.assert_frame_equal(remote.requests, local.requests)
    assert remote.summary == local.summary
