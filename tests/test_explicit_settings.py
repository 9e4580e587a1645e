"""What a user writes is what runs: a ``--policy`` key or a sweep axis equal to SimConfig's default is not
replaced by a profile's measurement; a stray comma in ``--slo`` is refused; ``kvsim sweep`` warns of compute
timed on the replay harness as ``simulate`` and ``capacity`` do."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.planning.slo import parse_slos  # noqa: E402
from analysis.planning.sweep import PointJob, point_args  # noqa: E402
from cli import main  # noqa: E402
from sim.core.runner import profile_config_overrides  # noqa: E402
from sim.frontend.policy_spec import parse_policy  # noqa: E402
from sim.setup.config import SimConfig  # noqa: E402

HARNESS_PROFILE = str(ROOT / "profiles" / "h200.json")     # compute fitted on the replay harness (2026-11)


def _profile_factor() -> float:
    return float(json.loads(Path(HARNESS_PROFILE).read_text())["paged_attention"]["factor"])


def test_a_written_factor_equal_to_the_default_is_kept():
    """``paged:factor=1.23`` (SimConfig's default) stays 1.23; ``paged`` alone takes the profile's measured factor."""
    default = SimConfig.__dataclass_fields__["paged_attention_factor"].default
    assert _profile_factor() != default          # else the test could not tell the two apart
    written = profile_config_overrides(SimConfig(**parse_policy(f"paged:factor={default}")), HARNESS_PROFILE)
    assert written.paged_attention_factor == default
    assert written.explicit_fields == ("paged_attention_factor",)
    plain = profile_config_overrides(SimConfig(**parse_policy("paged")), HARNESS_PROFILE)
    assert plain.paged_attention_factor == _profile_factor()


def test_the_written_factor_reaches_config_json(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", "--num-requests", "20", "--policy", "paged:factor=1.23", "--profile", HARNESS_PROFILE,
                 "--out", str(out), "--quiet"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["paged_attention_factor"] == 1.23 and config["explicit_fields"] == ["paged_attention_factor"]


def test_a_sweep_axis_is_explicit():
    job = PointJob(0, {"paged_attention_factor": "1.23"}, {}, "simulate")
    _, overrides = point_args(job)
    assert overrides == {"paged_attention_factor": 1.23, "explicit_fields": ("paged_attention_factor",)}


@pytest.mark.parametrize("text, position", [("ttft_p99=2s,", "2 of 2"), ("ttft_p99=2s,,tpot_p99=100ms", "2 of 3"),
                                            (",ttft_p99=2s", "1 of 2")])
def test_a_stray_comma_in_slo_is_refused(text, position):
    with pytest.raises(ValueError, match=f"objective {position} is empty"):
        parse_slos(text)


def test_slo_without_stray_commas_parses():
    assert [slo.metric for slo in parse_slos(" ttft_p99=2s , tpot_p99=100ms ")] == ["ttft_p99", "tpot_p99"]


def test_sweep_warns_of_harness_compute_once(tmp_path, capsys):
    assert main(["sweep", "--grid", "policy=vattention,paged", "--num-requests", "20", "--profile", HARNESS_PROFILE,
                 "--out", str(tmp_path / "s"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err.count("measured on the hardware replay's PyTorch harness") == 1
    assert main(["sweep", "--grid", "policy=vattention,paged", "--num-requests", "20",
                 "--out", str(tmp_path / "t"), "--quiet"]) == 0          # the default H200 profile: an engine fit
    assert "PyTorch harness" not in capsys.readouterr().err
