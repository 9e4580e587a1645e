"""The Ray executor gives the same sweep table as the local process pool (a local Ray instance)."""
from __future__ import annotations

import pandas as pd
import pytest

from analysis.planning.sweep import base_settings, make_jobs, parse_grid, sweep_table
from analysis.planning.sweep_run import run_sweep
from tests.test_sweep import sweep_args

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'kvsim[ray]'); the Ray executor is untested")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_and_local_sweeps_are_identical(tmp_path, local_ray):
    grid = parse_grid(["policy=vattention,paged:block=16", "memory_util=0.9,0.05"])
    jobs = make_jobs(grid, base_settings(sweep_args()))
    local, _ = run_sweep(jobs, tmp_path / "local", executor="local", workers=2)
    remote, ran = run_sweep(jobs, tmp_path / "ray", executor="ray")
    assert ran == 4
    table = sweep_table(jobs, remote)
    assert list(table["status"]) == ["ok", "error", "ok", "error"]
    pd.testing.assert_frame_equal(sweep_table(jobs, local), table)
