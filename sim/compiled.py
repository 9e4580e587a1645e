"""The simulator's hot modules, compiled by Cython at install time, and the guard that runs a module from its
source whenever its compiled form is not of the source beside it (issue 32).

:data:`COMPILED_MODULES` lists the modules compiled: the compute model's per-iteration times, the decode-run
timing and the VMM cost draws (numeric code the serving loop calls), then those every simulation imports and runs
once (configuration, sizes, the compute model's tables, records, summary). ``setup.py`` has Cython translate
their source to C (no type declarations from annotations: ``annotation_typing=False``, so Python semantics hold,
floats and ints alike; where an augmenting ``.pxd`` beside a module declares C types, as
``sim/timing/decode_run_times.pxd`` does for the plain-float decode-run loop, the same floats bit for bit; the
tables are the same bit for bit: ``tests/test_compiled.py``, ``bench/engine_hashes.py``), and builds each as an
*optional* extension next to its ``.py``: without a C compiler or Cython the install goes on and the modules
run as Python.

:data:`SOURCE_MODULES`, the serving loop's object-heavy modules (the loop, admission, the decode cohort and
runs, the step, the mapper, the vAttention policy, the recorder), run as Python: compiled untyped, their
attribute reads and method calls go through the generic C API, which CPython 3.11's specialising interpreter
beats. Measured on the project's 2-core machines (``docs/scale.md``, "Round 8"): splitwise_conv's whole process
0.82 of its time with them compiled (paired runs), the conversation trace 0.94; on one earlier machine
(Round 5) compiling them had gained 25%, on two others (Rounds 6, 7) nothing.

The guard (:func:`install_guard`, called by ``sim/__init__.py`` before any of these modules is imported): an
extension module beside a ``.py`` file would be imported in its place even after the source was edited, so the
build records each source's hash in :data:`HASHES_FILE`; a module whose source no longer has that hash (or
that has no record) is imported from its ``.py`` instead, and so is every listed module when the environment
sets :data:`PURE_ENV` (e.g. ``KVSIM_PURE_PYTHON=1 kvsim simulate ...`` to compare or to debug).
``pip install -e .`` rebuilds them; :func:`status` says which form each module runs in (``kvsim --version``
prints the count).

This module imports nothing of the project: ``setup.py`` loads it on its own, before ``sim`` exists.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path

COMPILED_MODULES = (
    "sim.timing.decode_run_times", "sim.timing.compute", "sim.timing.draws", "sim.timing.latency",
    # imported and run by every simulation (configuration, sizes, the compute model's tables, the summary)
    "sim.core.runner", "sim.setup.config", "sim.setup.config_checks", "sim.setup.config_sizes", "sim.setup.specs",
    "sim.setup.model_sizes", "sim.memory.layer_groups", "sim.memory.hybrid_sizing", "sim.timing.attention_blocks",
    "sim.timing.paged_kernels", "sim.timing.layer_reads", "sim.timing.compute_fields", "sim.results.records",
    "sim.results.columns", "sim.results.summary",
)
"""Modules compiled at install (names; each ``sim/.../name.py``): numeric code a serving-loop pass calls, then
those every simulation imports and runs once (compiled, they also skip compiling their source to bytecode at
every start where bytecode is not written: ``PYTHONDONTWRITEBYTECODE``)."""

SOURCE_MODULES = (
    "sim.core.engine", "sim.core.decode_runs", "sim.core.lifecycle", "sim.core.admission", "sim.core.scheduler",
    "sim.core.cohort", "sim.core.step", "sim.core.costs", "sim.core.mapper", "sim.core.request",
    "sim.core.tier_charges", "sim.memory.vattention", "sim.memory.background", "sim.memory.plan",
    "sim.results.recorder",
)
"""Modules of the serving loop that run as Python (module docstring: faster so here). Compiled by an earlier build,
their extension may still lie beside them: the guard imports them from their source whatever the record says."""

HASHES_FILE = "_compiled.json"
"""In the ``sim`` package directory: ``{module: source hash}`` of the sources the build compiled (written by
``setup.py``; not in git)."""

PURE_ENV = "KVSIM_PURE_PYTHON"
"""An environment variable: ``1`` (or ``true``, ``yes``, ``on``, any other value but the off ones) runs every listed
module from its source (and ``setup.py`` compiles nothing); unset, empty, ``0``, ``false``, ``no`` or ``off``
(any case) leaves them compiled."""

OFF_VALUES = ("", "0", "false", "no", "off")

COMPILE_ARGS = ("-ffp-contract=off",)
"""C compiler flags of every extension: no fused multiply-add contraction, so that a module typed as C doubles
(an augmenting ``.pxd``: ``sim/timing/decode_run_times.pxd``) rounds each operation once, as Python's floats do."""

CYTHON_DIRECTIVES = {"language_level": 3, "annotation_typing": False, "binding": True,
                     "embedsignature": False}
"""Cython's compiler directives for these modules: annotations are not C types (``x: int`` stays any
Python object), functions stay introspectable Python-like functions."""

SIM_DIR = Path(__file__).resolve().parent


def source_path(module: str, sim_dir: Path = SIM_DIR) -> Path:
    """``sim/core/engine.py`` for ``"sim.core.engine"`` (under ``sim_dir``, the ``sim`` package directory)."""
    return sim_dir.joinpath(*module.split(".")[1:]).with_suffix(".py")


def source_hash(path: Path) -> str:
    """The hash Python's hash-based bytecode files use (:func:`importlib.util.source_hash`, hex), of a module's
    source bytes, followed by those of its augmenting ``.pxd`` (Cython's static types for the compiled form,
    beside the ``.py``) where it has one: a change of either, not a proof of identity."""
    data = path.read_bytes()
    declarations = path.with_suffix(".pxd")
    if declarations.is_file():
        data += b"\0" + declarations.read_bytes()
    return importlib.util.source_hash(data).hex()


def extension_path(module: str, sim_dir: Path = SIM_DIR) -> Path | None:
    """The compiled extension file of ``module`` beside its source, or ``None`` when there is none."""
    source = source_path(module, sim_dir)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = source.with_name(source.stem + suffix)
        if candidate.is_file():
            return candidate
    return None


def pure_requested(environ=os.environ) -> bool:
    """Whether :data:`PURE_ENV` asks for the source form of every module (:data:`OFF_VALUES` do not)."""
    return environ.get(PURE_ENV, "").strip().lower() not in OFF_VALUES


def module_forms(sim_dir: Path = SIM_DIR, environ=os.environ) -> dict[str, str]:
    """Each listed module's form in a process started with ``environ``: ``"compiled"``, ``"source"`` (no
    extension built), ``"source: changed since compiled"`` (the guard's case), ``"source: not built by the last install"``
    (:data:`HASHES_FILE` missing, unreadable or without the module: its last build failed, e.g. without a
    working C compiler, and an extension of an earlier build is left; ``pip install -v`` shows why),
    ``"source: KVSIM_PURE_PYTHON"``, or ``"compiled: its source is missing"`` (an extension whose ``.py`` was
    deleted: the extension is all there is to import). Reads :data:`HASHES_FILE` and hashes only the sources that
    have an extension beside them; never raises for a damaged record or a missing source."""
    forms, recorded = {}, None
    pure = pure_requested(environ)
    for module in COMPILED_MODULES:
        if extension_path(module, sim_dir) is None:
            forms[module] = "source"
            continue
        if pure:
            forms[module] = f"source: {PURE_ENV}"
            continue
        if recorded is None:
            try:
                recorded = json.loads((sim_dir / HASHES_FILE).read_text())
            except (OSError, ValueError):
                recorded = {}
            if not isinstance(recorded, dict):
                recorded = {}
        try:
            current = source_hash(source_path(module, sim_dir))
        except OSError:
            forms[module] = "compiled: its source is missing"
            continue
        if module not in recorded:
            forms[module] = "source: not built by the last install"
        else:
            forms[module] = "compiled" if recorded[module] == current else "source: changed since compiled"
    return forms


class SourceFinder:
    """A :data:`sys.meta_path` finder that imports the given modules from their ``.py`` files (the extension
    beside them is passed over)."""

    def __init__(self, sources: dict[str, Path]):
        self.sources = sources

    def find_spec(self, name: str, path=None, target=None):
        source = self.sources.get(name)
        if source is None:
            return None
        return importlib.util.spec_from_file_location(name, source)


def install_guard(sim_dir: Path = SIM_DIR, environ=os.environ) -> SourceFinder | None:
    """Put a :class:`SourceFinder` first on :data:`sys.meta_path` for the modules that must run from source
    although an extension is beside them (:func:`module_forms`, and every :data:`SOURCE_MODULES` module with
    an extension of an earlier build beside its source); returns it, or ``None`` when none must. The forms found
    are kept for :func:`status`."""
    global _FORMS
    forms = module_forms(sim_dir, environ)
    if sim_dir == SIM_DIR and environ is os.environ:
        _FORMS = forms
    sources = {module: source_path(module, sim_dir) for module, form in forms.items() if form.startswith("source:")}
    sources.update({module: source_path(module, sim_dir) for module in SOURCE_MODULES      # an earlier build's
                    if extension_path(module, sim_dir) is not None and source_path(module, sim_dir).is_file()})
    if not sources:
        return None
    finder = SourceFinder(sources)
    sys.meta_path.insert(0, finder)
    return finder


_FORMS: dict[str, str] | None = None     # this process's forms, as the guard found them at start


def status(sim_dir: Path = SIM_DIR, environ=os.environ) -> str:
    """One line: how many listed modules run compiled (in this process: as the guard found them when ``sim`` was
    imported), and why the others do not (``"compiled: 19 of 19 simulator modules"``; ``"compiled: 18 of 19
    simulator modules, the rest from source: changed since compiled (sim.timing.draws) (pip install -e .
    rebuilds them)"``: the modules are named where only some of them fall back)."""
    forms = _FORMS if (_FORMS is not None and sim_dir == SIM_DIR and environ is os.environ) else module_forms(
        sim_dir, environ)
    compiled = sum(form.startswith("compiled") for form in forms.values())
    line = f"compiled: {compiled} of {len(forms)} simulator modules"
    by_reason: dict[str, list[str]] = {}
    for module, form in sorted(forms.items()):
        if not form.startswith("compiled"):
            by_reason.setdefault(form.split(": ", 1)[1] if ": " in form else "not built", []).append(module)
    reasons = sorted(by_reason)
    if reasons:
        # the modules by name where only some of the listed ones fall back (an edit since the build, say)
        shown = [reason if compiled == 0 else f"{reason} ({_names(by_reason[reason])})" for reason in reasons]
        line += f", {'the rest' if compiled else 'all'} from source: {'; '.join(shown)}"
        if {"changed since compiled", "not built by the last install"} & set(reasons):
            line += " (pip install -e . rebuilds them)"
    missing = sum(form == "compiled: its source is missing" for form in forms.values())
    if missing:
        line += f"; {missing} compiled without its source (the .py was deleted)"
    return line


def _names(modules: list[str], shown: int = 4) -> str:
    """``modules`` by name, the first ``shown`` of them and how many more."""
    more = len(modules) - shown
    return ", ".join(modules[:shown]) + (f" and {more} more" if more > 0 else "")
