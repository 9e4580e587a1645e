"""Run one simulation end to end: configuration + trace + latency profile -> :class:`RunResult`."""
from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from analysis.results import RunResult, build_result
from sim.compute import RooflineComputeModel
from sim.config import SimConfig
from sim.engine import Simulator
from sim.latency import VmmLatencyModel, read_profile


def load_models(config: SimConfig, profile_path: str | None) -> tuple[VmmLatencyModel, RooflineComputeModel]:
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
    overrides = read_profile(profile_path).get("compute", {}).get("roofline", {})
    return vmm, compute.with_overrides(overrides) if overrides else compute


def run_simulation(config: SimConfig, trace: pd.DataFrame, profile_path: str | None = None,
                   progress: Callable[[int, int], None] | None = None, extra_config: dict | None = None) -> RunResult:
    """Simulate ``trace`` under ``config``; the result's config records the sources of trace and latencies."""
    vmm, compute = load_models(config, profile_path)
    output = Simulator(config, trace, vmm=vmm, compute=compute, progress=progress).run()
    meta = config.to_dict()
    meta.update(trace_source=trace.attrs.get("source", "in-memory table"), vmm_latency_source=vmm.source,
                **(extra_config or {}))
    return build_result(output, meta)
