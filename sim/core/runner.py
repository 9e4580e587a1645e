"""Run one simulation end to end: configuration + trace + latency profile -> :class:`RunResult`."""
from __future__ import annotations

import os
from dataclasses import replace

from collections.abc import Callable
from typing import TYPE_CHECKING

from sim.timing.compute import ComputeFieldError, RooflineComputeModel
from sim.timing.model_for import compute_model_for
from sim.setup.config import ConfigError, SimConfig
from sim.core.engine import Simulator
from sim.timing.latency import ProfileError, VmmLatencyModel, read_profile

if TYPE_CHECKING:
    import pandas as pd

    from sim.results.summary import RunResult


def effective_profile(config: SimConfig, profile_path: str | None) -> str | None:
    """The profile a run uses: ``profile_path`` as given; when None, the GPU's catalogue default
    (:func:`sim.setup.catalog.default_profile`, e.g. ``default_profile`` of ``gpus.h200`` in ``sim/setup/catalog.toml``), or
    None (the built-in roofline) for a GPU without one; ``roofline`` / ``none`` (:data:`sim.setup.catalog.PROFILE_KEYWORDS`,
    any case) force the built-in models.

    Raises:
        CatalogError: a catalogue default that names no file under ``profiles/``.
    """
    from sim.setup.catalog import default_profile, is_profile_keyword

    if profile_path is None:
        return default_profile(config.gpu)
    if is_profile_keyword(profile_path):
        return None
    return profile_path


def load_models(config: SimConfig, profile_path: str | None,
                compute_model: str = "auto") -> tuple[VmmLatencyModel, RooflineComputeModel]:
    """The VMM latency and compute models for ``config``: built-in defaults (the committed H200 profile and the
    roofline), or a calibration profile's ``vmm`` and compute sections (:func:`compute_overrides`). When the
    compute model is the in-loop fit, the profile's ``vmm_in_loop.growth_scale`` (a page-group growth's cost
    inside the replay's loop over its isolated measurement) scales the mapping times as well, when it was
    measured for this model and page size.

    Raises:
        ProfileError: for an unreadable profile, a field of the wrong type or out of its range
            (:func:`sim.timing.latency.check_profile`), or compute fields that together give a graphed decode iteration
            a negative time; the message names the file and the field.
        ValueError: a ``compute_model`` the profile does not hold.
    """
    compute = compute_model_for(config)     # the roofline, or its pipeline form with config.pp > 1
    profile_path = effective_profile(config, profile_path)
    if profile_path is None:
        if compute_model not in ("auto", "roofline"):
            raise ConfigError(f"compute_model={compute_model} needs a calibration profile (profile_path)",
                              "compute_model", "profile_path")
        return VmmLatencyModel.builtin(), compute
    vmm = VmmLatencyModel.from_profile(profile_path)
    profile = read_profile(profile_path)
    chosen = resolve_compute_model(profile, compute_model, config)
    growth = profile.get("vmm_in_loop") or {}
    if (chosen == "in-loop" and config.model in (growth.get("models") or [growth.get("model")])
            and growth.get("page_size_bytes") == config.page_size_bytes
            and int(growth.get("tp", 1)) == config.tp):   # a growth measured at another tp is another cost
        scale = float(growth["growth_scale"])  # > 0 and finite (check_profile)
        if scale != 1.0:
            vmm.in_loop_scale = scale
            vmm.source += f", growths x{scale:g} (vmm_in_loop)"
    try:
        overrides = compute_overrides(profile, chosen, config)
        fitted = compute.with_overrides(overrides)
        if overrides.get("split_kv_sms") and isinstance(fitted, RooflineComputeModel):   # split-KV form: decodes split the keys of this run's slot length
            fitted = replace(fitted, split_kv_slot_tokens=float(config.slot_max_tokens))
        return vmm, fitted
    except ComputeFieldError as exc:  # fields each in range, together not (a decode correction below -overhead)
        name = "tile_rows" if chosen == "tiled" and exc.field == "mixed_tile_rows" else exc.field
        raise ProfileError(f"profile {profile_path}: field {COMPUTE_SECTIONS[chosen]}.{name} {exc.problem}") from None


COMPUTE_MODELS = ("auto", "in-loop", "tiled", "roofline")
"""``compute_model`` choices: ``in-loop`` (``compute_in_loop``: fitted on a hardware replay's own
iterations, ``kvsim calibrate --from-run``), ``tiled`` (``compute.tiled_roofline``), ``roofline``
(``compute.roofline``; both fitted on the isolated grid of ``kvsim calibrate --compute``); ``auto``: the
first of these the profile holds for the run's model and tensor-parallel degree."""

COMPUTE_SECTIONS = {"in-loop": "compute_in_loop.params", "tiled": "compute.tiled_roofline.params",
                    "roofline": "compute.roofline"}
"""Where in a profile each resolved compute model's fields are (for messages)."""


def _gpu_token(name: str) -> str:
    """``NVIDIA H200`` / ``H200 141GB`` -> ``h200``; ``NVIDIA A100-SXM4-80GB`` / ``A100-SXM 80GB`` -> ``a100``."""
    words = name.lower().replace("nvidia", " ").split()
    return words[0].split("-")[0] if words else ""


def profile_compute_gpu(profile: dict) -> str | None:
    """The GPU a profile's compute sections were measured on (``compute.gpu_name``, else
    ``environment.gpu_name``), or None when the profile does not say."""
    name = (profile.get("compute") or {}).get("gpu_name") or (profile.get("environment") or {}).get("gpu_name")
    return str(name) if name else None


def measured_on_other_gpu(profile: dict, config: SimConfig | None) -> str | None:
    """The GPU name when ``profile``'s compute sections were measured on another GPU than ``config``'s, else None."""
    measured = profile_compute_gpu(profile)
    if config is None or not measured or _gpu_token(measured) == _gpu_token(config.gpu_spec.full_name):
        return None
    return measured


def compute_gpu_note(config: SimConfig, profile_path: str | None) -> list[str]:
    """A note (list of one line, or empty) when ``profile_path``'s compute fits were measured on another GPU than
    ``config``'s and so are not used (an unreadable profile gives none: it is refused elsewhere)."""
    profile_path = effective_profile(config, profile_path)
    if not profile_path:
        return []
    try:
        other = measured_on_other_gpu(read_profile(profile_path), config)
    except Exception:  # noqa: BLE001 - the profile's own errors are reported by its loader
        return []
    return [f"{profile_path}'s compute fits were measured on {other}: {config.gpu} uses the built-in roofline "
            "(config.json compute_model)"] if other else []


PLAN_SECTION = 'README.md, "Which compute model to plan with"'
"""Where the README says which profiles describe a serving engine and which the replay harness."""


def harness_compute_warning(config: SimConfig, profile_path: str | None, compute_model: str = "auto") -> list[str]:
    """A warning (list of one line, or empty) when the compute fit a run of ``config`` takes from ``profile_path``
    was timed on the hardware replay's PyTorch harness (a run's ``compute`` ``harness``; 1.07-2.36x the roofline,
    where an engine's kernels run 1.03-1.56x: docs/validation/engine-replay/README.md), not on a serving engine. The
    profile records it: ``compute_in_loop.replay_compute`` is the replay compute of the runs the fit was made on (a
    fit made before the field existed has none, and its runs were harness runs: ``hwbackend.calibration.inloop``
    reads a run without ``compute`` as ``harness``); ``compute.roofline`` / ``compute.tiled_roofline`` (the grid fits
    of ``kvsim calibrate --compute``) always time the harness's forward (``hwbackend.cli.HARNESS_COMPUTE_FITS``). No
    warning for the built-in roofline (no profile, the profile names ``roofline`` / ``none``, a fit not used for this
    model or GPU), an engine fit, a roofline imported from Vidur's kernel profiles (a ``compute.vidur`` section),
    or an unreadable profile (refused elsewhere)."""
    profile_path = effective_profile(config, profile_path)
    if not profile_path:
        return []
    try:
        profile = read_profile(profile_path)
        chosen = resolve_compute_model(profile, compute_model, config)
        used = bool(compute_overrides(profile, chosen, config))
    except Exception:  # noqa: BLE001 - the profile's own errors are reported by its loader
        return []
    if not used:
        return []
    if chosen == "in-loop":
        replay = (profile.get("compute_in_loop") or {}).get("replay_compute", "harness")
        if replay == "engine":
            return []
        section = f"compute_in_loop, replay_compute {replay}" if "replay_compute" in profile["compute_in_loop"] else \
            "compute_in_loop, fitted before replay_compute was recorded"
    else:
        if chosen == "roofline" and "vidur" in (profile.get("compute") or {}):
            return []    # imported from Vidur's CUDA kernel profiles (compute.vidur), not timed on the harness
        section = COMPUTE_SECTIONS[chosen].removesuffix(".params") + ", kvsim calibrate --compute"
    return [f"{profile_path}'s compute timing ({section}) was measured on the hardware replay's PyTorch harness, not a "
            f"serving engine (~2x slower than engine kernels, so times are long and capacities pessimistic for an "
            f"engine): see {PLAN_SECTION}"]


def resolve_compute_model(profile: dict, compute_model: str, config: SimConfig | None = None) -> str:
    """The compute model ``compute_model`` stands for with this profile (``auto`` resolved; ``roofline`` when
    the profile has no fitted section, meaning the built-in defaults). ``profile`` as :func:`read_profile`
    returns it (its fields checked).

    A profile whose compute sections were measured on another GPU (:func:`measured_on_other_gpu`) gives its
    tiled and roofline fits to no other GPU: ``auto`` resolves to the built-in roofline.

    Raises:
        ValueError: ``in-loop`` or ``tiled`` asked for and absent (or, for ``in-loop``, fitted for another
            model, GPU or tensor-parallel degree; for ``tiled``, measured on another GPU).
    """
    if compute_model not in COMPUTE_MODELS:
        raise ValueError(f"compute model {compute_model!r}: choose one of {', '.join(COMPUTE_MODELS)}")
    other_gpu = measured_on_other_gpu(profile, config)
    in_loop = profile.get("compute_in_loop") or {}
    fitted_for = (in_loop.get("model"), in_loop.get("gpu", config.gpu if config else None), int(in_loop.get("tp", 1)))
    models = in_loop.get("models") or [fitted_for[0]]   # a fit over runs of one decoder shape lists their models
    if in_loop and config is not None and (config.model not in models or fitted_for[1:] != (config.gpu, config.tp)):
        if compute_model == "in-loop":
            raise ValueError(f"the profile's compute_in_loop was fitted for {fitted_for[0]} on {fitted_for[1]} at tp "
                             f"{fitted_for[2]}, not {config.model} on {config.gpu} at tp {config.tp}")
        in_loop = {}
    tiled = ((profile.get("compute") or {}).get("tiled_roofline") or {}).get("params")
    if other_gpu and compute_model == "tiled":
        raise ValueError(f"the profile's compute.tiled_roofline was measured on {other_gpu}, not on {config.gpu}")
    if other_gpu:
        tiled = None
    if compute_model == "in-loop" and not in_loop.get("params"):
        raise ValueError("the profile has no compute_in_loop (kvsim calibrate --from-run RUN_DIR)")
    if compute_model == "tiled" and not tiled:
        raise ValueError("the profile has no compute.tiled_roofline (kvsim calibrate --compute)")
    if compute_model != "auto":
        return compute_model
    return "in-loop" if in_loop.get("params") else "tiled" if tiled else "roofline"


def compute_overrides(profile: dict, compute_model: str = "auto", config: SimConfig | None = None) -> dict:
    """Compute-model fields from a profile (as :func:`read_profile` returns it) for ``compute_model`` (see
    :data:`COMPUTE_MODELS`); empty when the profile has none of the sections.

    Raises:
        ValueError: as :func:`resolve_compute_model`.
    """
    chosen = resolve_compute_model(profile, compute_model, config)
    if chosen == "in-loop":
        return dict(profile["compute_in_loop"]["params"])
    if chosen == "tiled":
        fields = dict(profile["compute"]["tiled_roofline"]["params"])
        fields["mixed_tile_rows"] = fields.pop("tile_rows", 0.0)
        return fields
    if measured_on_other_gpu(profile, config):
        return {}
    return dict((profile.get("compute") or {}).get("roofline") or {})


# SimConfig field -> (profile section, key): measured values that replace a field left at its default
PROFILE_FIELDS = {
    "paged_attention_factor": ("paged_attention", "factor"),
    "layout_attention_factor": ("layout", "cross_layer_attention_factor"),
    "memset_bytes_per_s": ("memory", "memset_bytes_per_s"),
    "copy_bytes_per_s": ("memory", "copy_bytes_per_s"),
}


def profile_config_overrides(config: SimConfig, profile_path: str | None) -> SimConfig:
    """Apply a profile's measurements (:data:`PROFILE_FIELDS`: the PagedAttention kernel factor, the
    cross-layer layout's attention factor, the memset and copy bandwidths in bytes/s) to fields left at their
    defaults and not set by the user (``config.explicit_fields``).

    Raises:
        ProfileError: an unreadable profile or a bad field (:func:`sim.timing.latency.check_profile`: the factors and
            rates must be finite, the paged factor >= 1, the others > 0).
    """
    profile_path = effective_profile(config, profile_path)
    if profile_path is None:
        return _with_catalogue_host_copy(config)
    profile = read_profile(profile_path)
    overrides = {}
    for field_name, (section, key) in PROFILE_FIELDS.items():
        value = (profile.get(section) or {}).get(key)
        if (value is not None and field_name not in config.explicit_fields
                and getattr(config, field_name) == SimConfig.__dataclass_fields__[field_name].default):
            overrides[field_name] = float(value)
    if config.kv_tiers and profile.get("host_copy"):     # the DRAM tier's measured host-copy rates
        from sim.memory.tiers import with_host_copy_profile
        overrides["kv_tiers"] = with_host_copy_profile(config.kv_tiers, profile)
    config = config.with_overrides(overrides) if overrides else config
    return config if profile.get("host_copy") else _with_catalogue_host_copy(config)


def _with_catalogue_host_copy(config: SimConfig) -> SimConfig:
    """``config`` with a DRAM tier at its defaults taking the GPU's measured host-copy rates
    (:func:`sim.setup.catalog.host_copy_profile`: the H200's ``profiles/h200.json``, measured 2026-12-02,
    ``docs/device/session5/host_copy.json``), when the GPU has them; otherwise unchanged."""
    if not config.kv_tiers:
        return config
    from sim.memory.tiers import with_host_copy_profile
    from sim.setup.catalog import host_copy_profile
    path = host_copy_profile(config.gpu)
    if path is None:
        return config
    tiers = with_host_copy_profile(config.kv_tiers, read_profile(path))
    return config.with_overrides({"kv_tiers": tiers}) if tiers != tuple(config.kv_tiers) else config


def compute_model_source(config: SimConfig, profile_path: str | None,
                         compute_model: str = "auto") -> tuple[str, str]:
    """Which compute model a run of ``config`` uses: ``(chosen, description)``, ``chosen`` one of
    :data:`COMPUTE_MODELS` but ``auto``, ``description`` as recorded in ``config.json``'s ``compute_model``,
    e.g. ``"roofline (built-in defaults)"`` or ``"in-loop (compute_in_loop of profiles/h200.json)"``.

    Raises:
        ProfileError / ValueError: as :func:`resolve_compute_model` (an unreadable profile, a missing section).
    """
    profile_path = effective_profile(config, profile_path)
    if not profile_path:
        return compute_model, "roofline (built-in defaults)"
    profile = read_profile(profile_path)
    chosen = resolve_compute_model(profile, compute_model, config)
    section = {"in-loop": "compute_in_loop", "tiled": "compute.tiled_roofline", "roofline": "compute.roofline"}
    other_gpu = measured_on_other_gpu(profile, config)
    still = _measurements_used(config, profile, profile_path)
    if other_gpu and chosen == "roofline":
        return chosen, (f"roofline (built-in defaults: {profile_path}'s compute fits were measured on {other_gpu})"
                        + still)
    in_loop = profile.get("compute_in_loop") or {}
    if chosen == "roofline" and not (profile.get("compute") or {}).get("roofline"):
        if in_loop:          # the profile's only fit is for other models: say so, it is not used here
            covered = ", ".join(in_loop.get("models") or [str(in_loop.get("model"))])
            return chosen, (f"roofline (built-in defaults: {profile_path}'s compute_in_loop was fitted for {covered} "
                            f"on {in_loop.get('gpu')} at tp {in_loop.get('tp', 1)}, not {config.model} on "
                            f"{config.gpu} at tp {config.tp})" + still)
        return chosen, f"roofline (built-in defaults: {profile_path} has no compute fit)" + still
    fields = compute_overrides(profile, chosen, config)
    unfitted = [name for name in CORE_FIT_FIELDS if name not in fields]
    built_in = f"; {', '.join(unfitted)} built-in (absent from the section)" if unfitted else ""
    fitted_for = (profile.get("compute") or {}).get("model") if chosen in ("roofline", "tiled") else None
    other_model = (f"; fitted for {fitted_for}, applied to {config.model}"       # efficiencies of another shape
                   if isinstance(fitted_for, str) and fitted_for != config.model else "")
    return chosen, f"{chosen} ({section[chosen]} of {profile_path}{built_in}{other_model})"


def _measurements_used(config: SimConfig, profile: dict, profile_path: str) -> str:
    """What of ``profile`` a run whose compute fit does not apply still takes from it (its VMM latencies, the
    measured paged-attention and cross-layer factors that :func:`profile_config_overrides` applies), as
    ``"; from PATH: ..."``, or ``""``."""
    parts = ["VMM latencies"] if config.uses_vmm else []
    for field_name, condition, what in (("paged_attention_factor", config.policy == "paged", "paged-attention factor"),
                                        ("layout_attention_factor", config.uses_vmm and config.kv_layout == "cross-layer",
                                         "cross-layer attention factor")):
        section, key = PROFILE_FIELDS[field_name]
        value = (profile.get(section) or {}).get(key)
        default = SimConfig.__dataclass_fields__[field_name].default
        if (condition and value is not None and field_name not in config.explicit_fields
                and getattr(config, field_name) in (default, float(value))):     # (before or after it is applied)
            parts.append(f"{what} {float(value):g}")
    return f"; from {profile_path}: {', '.join(parts)}" if parts else ""


CORE_FIT_FIELDS = ("flops_efficiency", "bw_efficiency")
"""The compute fields every fit writes (``hwbackend.calibration``'s grid, in-loop and Vidur fits); a hand-written
section without one runs with the built-in value, which the compute model's description says."""


def run_simulation(config: SimConfig, trace: pd.DataFrame, profile_path: str | None = None,
                   progress: Callable[[int, int], None] | None = None, extra_config: dict | None = None,
                   compute_model: str = "auto", records_path: str | None = None) -> RunResult:
    """Simulate ``trace`` under ``config``; the result's config records the sources of trace and latencies.
    ``compute_model`` chooses the profile's compute section (see :func:`compute_overrides`); ``records_path``
    streams the per-iteration records into that Parquet file as the run goes (memory stays flat).
    ``trace``: a canonical DataFrame or :class:`traces.canonical.TraceColumns`; pandas is imported once the
    run has results (:func:`sim.results.summary.build_result`)."""
    if not isinstance(config, SimConfig):
        raise TypeError(f"config: expected a sim.setup.config.SimConfig (e.g. SimConfig(model=..., gpu=...)), "
                        f"got {type(config).__name__}")
    if profile_path is not None and not isinstance(profile_path, (str, os.PathLike)):
        raise TypeError(f"profile_path: expected a profile JSON's path or the keyword 'roofline', got "
                        f"{type(profile_path).__name__} {profile_path!r}")
    if hasattr(trace, "columns") and hasattr(trace, "__len__") and len(trace) == 0:
        raise ValueError("trace: no requests (an empty table: its summary would be percentiles of nothing)")
    # each helper resolves the profile itself (effective_profile): pass them what was given, never its resolution,
    # since None (no profile given: the GPU's default) and the keyword roofline (resolved to None) differ
    config = profile_config_overrides(config, profile_path)
    chosen, resolved = compute_model_source(config, profile_path, compute_model)
    if profile_path is None and effective_profile(config, None):
        resolved += f"; the default profile of {config.gpu} (sim/setup/catalog.toml; the profile name roofline for the roofline)"
    vmm, compute = load_models(config, profile_path, chosen)
    if config.tp > 1 and vmm.tp_worker_scale.get(config.tp, 1.0) != 1.0:
        vmm.source += f", each of {config.tp} workers x{vmm.tp_worker_scale[config.tp]:g} (vmm_tp)"
    output = Simulator(config, trace, vmm=vmm, compute=compute, progress=progress, records_path=records_path).run()
    from sim.results.summary import build_result      # pandas: once there are results

    meta = config.to_dict()
    meta.update(trace_source=trace.attrs.get("source", "in-memory table"), vmm_latency_source=vmm.source,
                compute_model=resolved,
                **(extra_config or {}))
    return build_result(output, meta)
