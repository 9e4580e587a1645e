"""A profile's compute fits apply to the GPU they were measured on only (issue 18's fresh-user review: an H200
profile's tiled fit was silently applied to an H100)."""
from pathlib import Path

import pytest

from sim.setup.config import SimConfig
from sim.core.runner import (_gpu_token, compute_gpu_note, compute_overrides, measured_on_other_gpu, read_profile,
                             resolve_compute_model)

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
