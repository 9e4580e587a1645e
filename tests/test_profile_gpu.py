"""A profile's compute fits apply to the GPU they were measured on only (issue 18's fresh-user review: an H200
profile's tiled fit was silently applied to an H100)."""
from pathlib import Path

import pytest

from sim.setup.config import SimConfig
from sim.core.runner import (_gpu_token, compute_gpu_note, compute_overrides, harness_compute_warning,
                             measured_on_other_gpu, read_profile, resolve_compute_model)

PROFILE = str(Path(__file__).resolve().parents[1] / "profiles" / "h200.json")


def test_gpu_names_reduce_to_catalogue_keys():
    assert _gpu_token("NVIDIA H200") == _gpu_token("H200 141GB") == "h200"
    assert _gpu_token("NVIDIA A100-SXM4-80GB") == _gpu_token("A100-SXM 80GB") == "a100"
    assert _gpu_token("NVIDIA H100 80GB HBM3") == _gpu_token("H100-SXM 80GB") == "h100"


def test_an_h200_profile_gives_its_compute_fits_to_the_h200_only():
    profile = read_profile(PROFILE)
    h200, h100 = SimConfig(gpu="h200"), SimConfig(gpu="h100")
    assert measured_on_other_gpu(profile, h200) is None and resolve_compute_model(profile, "auto", h200) == "in-loop"
    assert measured_on_other_gpu(profile, h100) == "NVIDIA H200"
    assert resolve_compute_model(profile, "auto", h100) == "roofline"
    assert compute_overrides(profile, "auto", h100) == {}
    with pytest.raises(ValueError, match="compute.tiled_roofline was measured on NVIDIA H200, not on h100"):
        resolve_compute_model(profile, "tiled", h100)
    assert compute_gpu_note(h100, PROFILE) == [f"{PROFILE}'s compute fits were measured on NVIDIA H200: h100 uses "
                                               "the built-in roofline (config.json compute_model)"]
    assert compute_gpu_note(h200, PROFILE) == [] and compute_gpu_note(h100, None) == []


def test_a_profile_timed_on_the_replay_harness_is_warned_about_and_an_engine_profile_is_not(tmp_path):
    """A new-user trial: --profile profiles/h200.json used the harness-timed fits (~2x an engine) silently. The
    warning is keyed on what the file records (compute_in_loop.replay_compute; compute.roofline / tiled_roofline
    of kvsim calibrate --compute), not on the file's name."""
    import json
    profiles = Path(PROFILE).parent
    h200, qwen, h100 = SimConfig(gpu="h200"), SimConfig(gpu="h200", model="qwen2.5-7b"), SimConfig(gpu="h100")
    for name in ("h200.json", "h200-cross-workload.json"):
        (line,) = harness_compute_warning(h200, str(profiles / name))
        assert "compute_in_loop" in line and "replay's PyTorch harness, not a serving engine" in line
        assert 'README.md, "Which compute model to plan with"' in line
    (line,) = harness_compute_warning(qwen, PROFILE)      # outside compute_in_loop's model: the tiled grid fit
    assert "compute.tiled_roofline, kvsim calibrate --compute" in line
    assert harness_compute_warning(h200, str(profiles / "h200-engine.json")) == []
    assert harness_compute_warning(qwen, str(profiles / "h200-engine.json")) == []      # the built-in roofline
    assert harness_compute_warning(h100, PROFILE) == []          # fits of another GPU are not used
    for keyword in ("roofline", "none", None):
        assert harness_compute_warning(h200, keyword) == []
    # the same engine fit under another name: no warning; marked as a harness fit: warned
    profile = json.loads((profiles / "h200-engine.json").read_text())
    (tmp_path / "h200.json").write_text(json.dumps(profile))
    assert harness_compute_warning(h200, str(tmp_path / "h200.json")) == []
    profile["compute_in_loop"]["replay_compute"] = "harness"
    (tmp_path / "engine.json").write_text(json.dumps(profile))
    (line,) = harness_compute_warning(h200, str(tmp_path / "engine.json"))
    assert "compute_in_loop, replay_compute harness" in line
