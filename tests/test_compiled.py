"""The compiled hot modules (:mod:`sim.compiled`, issue 32): the compiled and the source forms give the same
tables bit for bit over every engine path the test can reach quickly (each form in its own process), and the
guard runs a module from its source when the source changed since it was compiled, or when
``KVSIM_PURE_PYTHON`` asks for it."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import compiled
from tests.conftest import REPO_ROOT

SCRIPT = r"""
import hashlib, json, sys
import pandas as pd
import traces
from sim.core.runner import run_simulation
from sim.setup.config import SimConfig
shared = sys.argv[1]
splitwise = traces.first_n(traces.load_trace(shared + "/vidur_processed_traces/splitwise_conv.csv"), 300)
mooncake = traces.scale_rate(traces.first_n(traces.load_trace(shared + "/mooncake_fast25/conversation_trace.jsonl"),
                                            200), 0.3)
a100 = {"model": "llama-2-7b", "gpu": "a100"}
runs = [
    ("sarathi-async", {**a100}, splitwise),
    ("vllm-pressure-recompute", {**a100, "scheduler": "vllm", "memory_util_frac": 0.2}, splitwise),
    ("sarathi-pressure-swap", {**a100, "memory_util_frac": 0.2, "preemption": "swap"}, splitwise),
    ("sync-nodefer-64k", {**a100, "sync_mapping": True, "deferred_reclaim": False, "page_size_bytes": 64 << 10},
     splitwise),
    ("zero-on-reuse", {**a100, "zero_on_reuse": "on-reuse", "eager_lookahead_steps": 0}, splitwise),
    ("paged", {**a100, "policy": "paged"}, splitwise),
    ("static", {**a100, "policy": "static"}, splitwise),
    ("chunk-admission", {**a100, "admission": "chunk"}, splitwise),
    ("prefix-caching", {"model": "llama-3.1-8b", "prefix_caching": True}, mooncake),
]
def digest(frame):
    h = hashlib.sha256(",".join(map(str, frame.columns)).encode())
    h.update(pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes())
    return h.hexdigest()[:16]
from sim.compiled import status
out = {"status": status()}
for label, kwargs, trace in runs:
    config = SimConfig(**kwargs)
    trace, _ = traces.clip_context(trace, config.slot_max_tokens)
    result = run_simulation(config, trace)
    out[label] = [digest(result.requests), digest(result.iterations),
                  hashlib.sha256(json.dumps(result.summary, sort_keys=True, default=str).encode()).hexdigest()[:16],
                  int(result.summary["preemptions"])]
print(json.dumps(out))
"""


def _run(pure: bool, shared_traces: Path) -> dict:
    env = {**os.environ, compiled.PURE_ENV: "1" if pure else "0"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(shared_traces)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_compiled_and_source_forms_give_identical_tables(shared_traces):
    forms = compiled.module_forms(environ={})
    if "compiled" not in forms.values():
        pytest.skip(f"no module is compiled in this install ({compiled.status(environ={})}): nothing to compare")
    fast, pure = _run(False, shared_traces), _run(True, shared_traces)
    assert fast.pop("status").startswith(f"compiled: {sum(f == 'compiled' for f in forms.values())} of ")
    assert pure.pop("status").startswith("compiled: 0 of ")
    assert fast == pure
    # the pressure runs reached preemption (else they would not test that path)
    assert fast["vllm-pressure-recompute"][3] > 0 and fast["sarathi-pressure-swap"][3] > 0


def _fake_sim(tmp_path: Path, modules: dict[str, bytes]) -> Path:
    """A ``sim`` directory holding the given modules' sources, each with an (empty) extension file beside it."""
    sim_dir = tmp_path / "sim"
    for module, text in modules.items():
        source = compiled.source_path(module, sim_dir)
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_bytes(text)
        source.with_name(source.stem + importlib.machinery.EXTENSION_SUFFIXES[0]).write_bytes(b"")
    return sim_dir


def test_module_forms_follow_the_recorded_hashes(tmp_path):
    engine, cohort = compiled.COMPILED_MODULES[0], compiled.COMPILED_MODULES[5]
    sim_dir = _fake_sim(tmp_path, {engine: b"x = 1\n", cohort: b"y = 2\n"})
    recorded = {engine: compiled.source_hash(compiled.source_path(engine, sim_dir)),
                cohort: compiled.source_hash(compiled.source_path(cohort, sim_dir))}
    (sim_dir / compiled.HASHES_FILE).write_text(json.dumps(recorded))
    forms = compiled.module_forms(sim_dir, environ={})
    assert forms[engine] == forms[cohort] == "compiled"
    assert all(forms[m] == "source" for m in compiled.COMPILED_MODULES if m not in (engine, cohort))   # none built
    compiled.source_path(cohort, sim_dir).write_bytes(b"y = 3\n")          # edited after the build
    forms = compiled.module_forms(sim_dir, environ={})
    assert forms[engine] == "compiled" and forms[cohort] == "source: changed since compiled"
    assert compiled.status(sim_dir, environ={}).startswith(f"compiled: 1 of {len(compiled.COMPILED_MODULES)} ")
    assert f"changed since compiled ({cohort}); not built (" in compiled.status(sim_dir, environ={})   # named
    pure = compiled.module_forms(sim_dir, environ={compiled.PURE_ENV: "1"})
    assert pure[engine] == pure[cohort] == f"source: {compiled.PURE_ENV}"
    assert compiled.module_forms(sim_dir, environ={compiled.PURE_ENV: "0"})[engine] == "compiled"
    assert compiled.module_forms(sim_dir, environ={compiled.PURE_ENV: " False "})[engine] == "compiled"
    assert compiled.module_forms(sim_dir, environ={compiled.PURE_ENV: "yes"})[engine].startswith("source: ")
    (sim_dir / compiled.HASHES_FILE).unlink()                               # no record: source
    assert compiled.module_forms(sim_dir, environ={})[engine] == "source: not built by the last install"
    assert "(pip install -e . rebuilds them)" in compiled.status(sim_dir, environ={})
    for damaged in ("null", "[1, 2]", "{not json"):                        # a damaged record: source, no error
        (sim_dir / compiled.HASHES_FILE).write_text(damaged)
        assert compiled.module_forms(sim_dir, environ={})[engine] == "source: not built by the last install"


def test_an_extension_without_its_source_is_imported_as_it_is(tmp_path):
    """A ``.py`` deleted beside its extension: the extension is all there is (no error at ``import sim``)."""
    engine = compiled.COMPILED_MODULES[0]
    sim_dir = _fake_sim(tmp_path, {engine: b"x = 1\n"})
    compiled.source_path(engine, sim_dir).unlink()
    assert compiled.module_forms(sim_dir, environ={})[engine] == "compiled: its source is missing"
    assert compiled.install_guard(sim_dir, environ={}) is None
    assert "1 compiled without its source" in compiled.status(sim_dir, environ={})


def test_guard_imports_a_changed_module_from_its_source(tmp_path, monkeypatch):
    engine = compiled.COMPILED_MODULES[0]
    sim_dir = _fake_sim(tmp_path, {engine: b"x = 1\n"})
    (sim_dir / compiled.HASHES_FILE).write_text(json.dumps({engine: "0" * 16}))      # not this source's hash
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    finder = compiled.install_guard(sim_dir, environ={})
    assert sys.meta_path[0] is finder
    spec = finder.find_spec(engine)
    assert spec.origin == str(compiled.source_path(engine, sim_dir))
    assert isinstance(spec.loader, importlib.machinery.SourceFileLoader)       # not the extension beside it
    assert finder.find_spec("sim.core.cohort") is None                         # not listed as changed
    (sim_dir / compiled.HASHES_FILE).write_text(json.dumps({engine: compiled.source_hash(
        compiled.source_path(engine, sim_dir))}))
    assert compiled.install_guard(sim_dir, environ={}) is None                 # fresh: nothing to guard


def test_every_listed_module_exists_and_the_build_lists_them():
    for module in compiled.COMPILED_MODULES:
        assert compiled.source_path(module).is_file(), module
    assert "sim.compiled" not in compiled.COMPILED_MODULES          # setup.py loads it before sim exists
    assert "COMPILED_MODULES" in (REPO_ROOT / "setup.py").read_text()


def test_an_edited_pxd_counts_as_a_changed_source(tmp_path):
    """The augmenting ``.pxd`` (static types of the compiled form) is hashed with its ``.py``: editing it alone
    sends the module back to its source until the next build."""
    module = "sim.timing.decode_run_times"
    sim_dir = _fake_sim(tmp_path, {module: b"x = 1\n"})
    declarations = compiled.source_path(module, sim_dir).with_suffix(".pxd")
    declarations.write_text("cpdef int f(int x)\n")
    (sim_dir / compiled.HASHES_FILE).write_text(json.dumps({module: compiled.source_hash(
        compiled.source_path(module, sim_dir))}))
    assert compiled.module_forms(sim_dir, environ={})[module] == "compiled"
    declarations.write_text("cpdef long f(long x)\n")
    assert compiled.module_forms(sim_dir, environ={})[module] == "source: changed since compiled"


def _source_form(module: str):
    """``module`` imported from its ``.py`` under another name (beside the form this process runs)."""
    spec = importlib.util.spec_from_file_location(f"_source_{module.replace('.', '_')}", compiled.source_path(module))
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


_finite = st.floats(min_value=0.0, max_value=1e7, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(head_us=_finite, comm_us=_finite, graph_overhead_us=st.none() | _finite, correction_us=_finite,
       overhead_us=_finite, floor_us=_finite, kv_bytes_per_token=st.integers(1, 1 << 20),
       bytes_factor=st.floats(0.5, 2.0), bytes_per_us=st.floats(1e3, 1e8), attention_factor=st.floats(0.5, 2.0),
       layout_factor=st.floats(0.5, 2.0), kv_tokens=st.integers(1, 1 << 24), growth=st.integers(1, 512),
       steps=st.integers(0, 80), start_us=st.floats(0.0, 1e12), numpy_start=st.booleans(),
       step_extra_us=st.sampled_from([0.0, 0.5, 13.25]), stop_after_us=st.none() | _finite,
       long_steps=st.none() | st.sampled_from([4, 64]))
def test_typed_decode_run_kernel_gives_the_source_floats(head_us, comm_us, graph_overhead_us, correction_us,
                                                         overhead_us, floor_us, kv_bytes_per_token, bytes_factor,
                                                         bytes_per_us, attention_factor, layout_factor, kv_tokens,
                                                         growth, steps, start_us, numpy_start, step_extra_us,
                                                         stop_after_us, long_steps):
    """The compiled ``_memory_bound_run`` (C doubles, ``sim/timing/decode_run_times.pxd``) returns the source
    form's floats bit for bit, and the same cut (the next arrival) and long-run refusal (None)."""
    import sim.timing.decode_run_times as running
    if not str(running.__file__).endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
        pytest.skip(f"decode_run_times runs from its source here ({compiled.status()}): nothing to compare")
    source = _source_form("sim.timing.decode_run_times")
    start = np.float64(start_us) if numpy_start else start_us      # the loop's clock is often a numpy scalar
    stop_us = start_us + stop_after_us if stop_after_us is not None else float("inf")
    args = (head_us, comm_us, graph_overhead_us, correction_us, overhead_us, floor_us, kv_bytes_per_token,
            bytes_factor, bytes_per_us, attention_factor, layout_factor, kv_tokens + 0.0, float(growth), steps,
            start, step_extra_us, stop_us, long_steps)
    typed, reference = running._memory_bound_run(*args), source._memory_bound_run(*args)
    if reference is None:
        assert typed is None
        return
    assert [[float.hex(float(x)) for x in part] for part in typed] == \
        [[float.hex(float(x)) for x in part] for part in reference]


def test_a_loop_module_left_compiled_by_an_earlier_build_runs_from_its_source(tmp_path, monkeypatch):
    """:data:`sim.compiled.SOURCE_MODULES` run as Python: an extension an earlier build left beside one (in-place
    builds do not delete it) is passed over even with a record that matches its source."""
    engine = "sim.core.engine"
    assert engine in compiled.SOURCE_MODULES and engine not in compiled.COMPILED_MODULES
    assert not set(compiled.SOURCE_MODULES) & set(compiled.COMPILED_MODULES)
    sim_dir = _fake_sim(tmp_path, {engine: b"x = 1\n"})
    (sim_dir / compiled.HASHES_FILE).write_text(json.dumps({engine: compiled.source_hash(
        compiled.source_path(engine, sim_dir))}))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    finder = compiled.install_guard(sim_dir, environ={})
    assert finder is not None and finder.find_spec(engine).origin == str(compiled.source_path(engine, sim_dir))
    assert engine not in compiled.module_forms(sim_dir, environ={})        # not counted among the compiled
