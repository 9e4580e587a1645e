"""``bench/bench_tp_processes.py``: TP workers as processes (emulated drivers on CPU) and the profile section
``vmm_tp`` it writes from a saved GPU result."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_tp_processes import add_to_profile, main, tp_section  # noqa: E402

RESULT = ROOT / "docs" / "tp2" / "run2" / "processes-0-1.json"
PROFILE = ROOT / "profiles" / "h200.json"


def test_emulated_workers_in_processes_map_independently(tmp_path):
    # the emulated driver sleeps a fixed time per call and processes share nothing: both workers mapping at
    # once take about as long as one alone (the GPU measurement, 1.38x, is contention of the real driver)
    out = tmp_path / "tp.json"
    assert main(["--emulated", "--rounds", "1", "--max-pages", "3", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    both = result["modes"]["both"]["map_page_group"]
    assert [w["n"] for w in both["per_worker"]] == [3, 3] and both["critical_path"]["n"] == 3
    assert result["modes"]["alone"]["map_page_group"]["per_worker"][0]["n"] == 3
    # independent: about 1; serialised workers would give about 2. The lower end only rejects nonsense (a loaded
    # 2-core machine gave 0.755 once, both-at-once sleeping less than alone by scheduling noise)
    assert 0.5 < result["both_over_alone_p50"]["worker_0"] < 1.6


def test_section_is_the_ratio_of_mean_worker_times():
    result = json.loads(RESULT.read_text())
    alone = result["modes"]["alone"]["map_page_group"]["per_worker"][0]["mean_us"]
    workers = [w["mean_us"] for w in result["modes"]["both"]["map_page_group"]["per_worker"]]
    section = tp_section(result, str(RESULT))
    assert section["worker_scale"] == {"2": round((workers[0] + workers[1]) / 2 / alone, 3)} == {"2": 1.381}
    assert json.loads(PROFILE.read_text())["vmm_tp"]["worker_scale"] == section["worker_scale"]


def test_only_gpu_results_of_this_script_go_into_a_profile(tmp_path, capsys):
    profile = tmp_path / "p.json"
    shutil.copy(PROFILE, profile)
    before = profile.read_text()
    assert add_to_profile(RESULT, profile, force=False) == 1          # already holds vmm_tp: ask first
    threads = ROOT / "docs" / "tp2" / "run1" / "tp2-two-gpus.json"  # bench_tp.py: threads, not processes
    assert add_to_profile(threads, profile, force=True) == 2
    emulated = tmp_path / "emulated.json"
    emulated.write_text(json.dumps({**json.loads(RESULT.read_text()), "emulated": True}))
    assert add_to_profile(emulated, profile, force=True) == 2
    assert profile.read_text() == before
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 3 and "pass --force" in errors[0] and "bench/bench_tp.py" in errors[1]
    assert "--emulated" in errors[2]
