"""Run one simulation end to end: configuration + trace + latency profile -> :class:`RunResult`."""
from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from analysis.results import RunResult, build_result
from sim.compute import RooflineComputeModel
from sim.config import SimConfig
from sim.engine import Simulator
from sim.latency import VmmLatencyModel, read_profile


def load_models(config: SimConfig, profile_path: str | None,
                compute_model: str = "auto") -> tuple[VmmLatencyModel, RooflineComputeModel]:
    """The VMM latency and compute models for ``config``: built-in defaults (the committed H200 profile and the
    roofline), or a calibration profile's
    ``vmm`` and optional ``compute`` sections.

    Raises:
        ProfileError: for an unreadable profile (names the file and field).
    """
    compute = RooflineComputeModel(config.model_spec, config.gpu_spec, config.tp)
    if profile_path is None:
        return VmmLatencyModel.builtin(), compute
    vmm = VmmLatencyModel.from_profile(profile_path)
    return vmm, compute.with_overrides(compute_overrides(read_profile(profile_path), compute_model))


def compute_overrides(profile: dict, compute_model: str = "auto") -> dict:
    """Compute-model fields from a profile: ``auto``: the fitted ``compute.tiled_roofline`` (roofline + launch
    floor + mixed-batch tile term) when present, else ``compute.roofline``; ``roofline``: only the latter;
    ``tiled``: only the former. Empty when the profile has none of them.

    Raises:
        ValueError: ``tiled`` asked for and absent.
    """
    compute = profile.get("compute") or {}
    tiled = (compute.get("tiled_roofline") or {}).get("params")
    if compute_model == "tiled" and not tiled:
        raise ValueError("the profile has no compute.tiled_roofline (kvsim calibrate --compute)")
    if tiled and compute_model != "roofline":
        fields = dict(tiled)
        fields["mixed_tile_rows"] = fields.pop("tile_rows", 0.0)
        return fields
    return dict(compute.get("roofline") or {})


# SimConfig field -> (profile section, key): measured values that replace a field left at its default
PROFILE_FIELDS = {
    "paged_attention_factor": ("paged_attention", "factor"),
    "layout_attention_factor": ("layout", "cross_layer_attention_factor"),
    "memset_bytes_per_s": ("memory", "memset_bytes_per_s"),
    "copy_bytes_per_s": ("memory", "copy_bytes_per_s"),
}


def profile_config_overrides(config: SimConfig, profile_path: str | None) -> SimConfig:
    """Apply a profile's measurements (:data:`PROFILE_FIELDS`: the PagedAttention kernel factor, the
    cross-layer layout's attention factor, the memset bandwidth) to fields left at their defaults."""
    if profile_path is None:
        return config
    profile = read_profile(profile_path)
    overrides = {}
    for field_name, (section, key) in PROFILE_FIELDS.items():
        value = (profile.get(section) or {}).get(key)
        if value and getattr(config, field_name) == SimConfig.__dataclass_fields__[field_name].default:
            overrides[field_name] = float(value)
    return config.with_overrides(overrides) if overrides else config


def run_simulation(config: SimConfig, trace: pd.DataFrame, profile_path: str | None = None,
                   progress: Callable[[int, int], None] | None = None, extra_config: dict | None = None,
                   compute_model: str = "auto") -> RunResult:
    """Simulate ``trace`` under ``config``; the result's config records the sources of trace and latencies.
    ``compute_model`` chooses the profile's compute section (see :func:`compute_overrides`)."""
    config = profile_config_overrides(config, profile_path)
    vmm, compute = load_models(config, profile_path, compute_model)
    output = Simulator(config, trace, vmm=vmm, compute=compute, progress=progress).run()
    meta = config.to_dict()
    meta.update(trace_source=trace.attrs.get("source", "in-memory table"), vmm_latency_source=vmm.source,
                compute_model=compute_model if profile_path else "roofline defaults",
                **(extra_config or {}))
    return build_result(output, meta)
