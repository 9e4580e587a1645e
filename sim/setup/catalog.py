"""Catalogue of models and GPUs: built-in entries read from ``catalog.toml`` (data, not code), or a user's file
(a ``model`` path to a Hugging Face ``config.json`` or a TOML, a ``gpu`` path to a TOML; :mod:`sim.setup.model_files`).
The shapes and every derived size (weights, KV bytes per token, tokens per page, pipeline stages) are in
:mod:`sim.setup.specs`, re-exported here.
"""
from __future__ import annotations

import tomllib
from pathlib import Path
from functools import cache
from importlib import resources

from sim.setup.specs import DTYPE_BYTES, GPU_FIELDS, MODEL_FIELDS, CatalogError, GPUSpec, ModelSpec

__all__ = ["DTYPE_BYTES", "GPU_FIELDS", "MODEL_FIELDS", "CatalogError", "GPUSpec", "ModelSpec", "get_gpu", "get_model",
           "gpu_names", "is_file_reference", "model_names", "default_profile", "PROFILE_KEYWORDS",
           "is_profile_keyword"]

CATALOG_ONLY_GPU_FIELDS = ("default_profile", "host_copy_profile")
"""Keys of a catalogue GPU entry that are not :class:`GPUSpec` fields (read by :func:`default_profile`)."""

PROFILE_KEYWORDS = ("roofline", "none")
"""Profile names that force the built-in models (the roofline) even where the GPU names a default profile."""


def is_file_reference(name: str) -> bool:
    """Whether a ``model`` / ``gpu`` name is a file (a path separator or a ``.json``/``.toml`` suffix) rather
    than a catalogue entry."""
    return "/" in name or "\\" in name or Path(name).suffix.lower() in (".json", ".toml")


def is_profile_keyword(profile: object) -> bool:
    """Whether a profile name is one of :data:`PROFILE_KEYWORDS` (any case): no file to read or check."""
    return profile is not None and str(profile).lower() in PROFILE_KEYWORDS


@cache
def _catalog() -> dict:
    with resources.files("sim.setup").joinpath("catalog.toml").open("rb") as handle:
        return tomllib.load(handle)


def model_names() -> list[str]:
    """Names of the catalogued models."""
    return sorted(_catalog()["models"])


def gpu_names() -> list[str]:
    """Names of the catalogued GPUs."""
    return sorted(_catalog()["gpus"])


def get_model(name: str) -> ModelSpec:
    """Look a model up by name (case-insensitive), or read it from a Hugging Face ``config.json`` or a TOML file
    (:func:`sim.setup.model_files.load_model_file`; a relative path is tried from the working directory, then from the
    repository root, so ``models/mixtral-8x7b.json`` works from anywhere).

    Raises:
        CatalogError: for an unknown name (the message lists the known models), or a missing, unreadable or
            inconsistent file (one line naming the file and the field).
    """
    from pathlib import Path
    if is_file_reference(name) or (name.lower() not in _catalog()["models"] and Path(name).is_dir()):
        from sim.setup.model_files import load_model_file      # a user's file (imported only then: start-up)
        return load_model_file(name)
    entry = _catalog()["models"].get(name.lower())
    if entry is None:
        raise CatalogError(f"unknown model {name!r}; known models: {', '.join(model_names())}; or give a "
                           "Hugging Face config.json or a model TOML file (e.g. models/mixtral-8x7b.json)")
    return ModelSpec(name=name.lower(), **entry)


def get_gpu(name: str) -> GPUSpec:
    """Look a GPU up by name (case-insensitive), or read it from a TOML file (:func:`sim.setup.model_files.load_gpu_file`).

    Raises:
        CatalogError: for an unknown name (the message lists the known GPUs), or a bad file (naming the field).
    """
    if is_file_reference(name):
        from sim.setup.model_files import load_gpu_file
        return load_gpu_file(name)
    entry = _catalog()["gpus"].get(name.lower())
    if entry is None:
        raise CatalogError(f"unknown GPU {name!r}; known GPUs: {', '.join(gpu_names())}; or give a GPU TOML file")
    return GPUSpec(name=name.lower(), **{k: (int(v) if k == "hbm_bytes" else v) for k, v in entry.items()
                                         if k not in CATALOG_ONLY_GPU_FIELDS})


def default_profile(gpu: str) -> str | None:
    """The calibration profile a catalogued GPU uses when no profile is given: the entry's
    ``default_profile`` (a file name under the repository's ``profiles/``), as an absolute path, or None (the
    built-in roofline). GPU files and GPUs without the key have none.

    Raises:
        CatalogError: a ``default_profile`` that names no file under ``profiles/``.
    """
    return _profile_of(gpu, "default_profile")


def host_copy_profile(gpu: str) -> str | None:
    """The profile whose ``host_copy`` section (pinned host <-> device copies into mapped pages, measured by
    ``hwbackend/beyond/host_copy_bench.py``) gives a catalogued GPU's DRAM-tier defaults when the run's own
    profile has none: the entry's ``host_copy_profile``, as an absolute path, or None (the built-in PCIe
    defaults of :mod:`sim.memory.tiers`).

    Raises:
        CatalogError: a ``host_copy_profile`` that names no file under ``profiles/``.
    """
    return _profile_of(gpu, "host_copy_profile")


def _profile_of(gpu: str, key: str) -> str | None:
    """The file under ``profiles/`` that a catalogued GPU's ``key`` names (absolute path), or None."""
    if is_file_reference(gpu):
        return None
    name = (_catalog()["gpus"].get(gpu.lower()) or {}).get(key)
    if not name:
        return None
    path = Path(__file__).resolve().parents[2] / "profiles" / str(name)
    if not path.is_file():
        raise CatalogError(f"sim/setup/catalog.toml: gpus.{gpu.lower()}.{key} {name!r}: no such file {path}")
    return str(path)
