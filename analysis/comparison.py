"""Policy what-if: several memory policies on one trace, one model and one GPU, side by side.

A policy is written ``NAME[:key=value,key=value,...]`` (``kvsim compare --policy ...``)::

    vattention:page=2MiB            vattention:page=256KiB,sync      vattention:deferred=off
    vattention:create=ondemand      vattention:lookahead=0,eager=0   paged:block=16   static:max_len=4096
    vattention:layout=cross-layer   vattention:batched=on            vattention:zero=on-reuse

Keys (see :class:`sim.config.SimConfig` for meanings and defaults): every policy takes ``preempt``
(recompute|swap), ``zero`` (off|on-reuse|on-free) and ``prefix`` (on|off: prefix caching, vattention and paged); vattention takes page, sync / mapping (sync|async),
deferred (on|off), lookahead, eager, eager_slots, watermark, create (startup|ondemand), layout
(per-layer|cross-layer), layout_factor, batched (on|off); paged takes block, factor, bt_base_us,
bt_per_block_us; static takes max_len.
"""
from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

import pandas as pd

from sim.config import POLICIES, ConfigError, SimConfig
from sim.units import parse_size_bytes

_ON_OFF = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False}


def _on_off(value: str) -> bool:
    if value.lower() not in _ON_OFF:
        raise ValueError(f"expected on/off, got {value!r}")
    return _ON_OFF[value.lower()]


def _choice(*choices: str):
    def parse(value: str) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return value
    return parse


# key -> (SimConfig field, parser)
_COMMON = {"preempt": ("preemption", _choice("recompute", "swap")),
           "prefix": ("prefix_caching", _on_off),
           "zero": ("zero_on_reuse", _choice("off", "on-reuse", "on-free")),
           "admission": ("admission", _choice("whole-prompt", "chunk"))}
POLICY_KEYS: dict[str, dict] = {
    "vattention": {
        "page": ("page_size_bytes", parse_size_bytes),
        "sync": ("sync_mapping", lambda v: True if v == "" else _on_off(v)),
        "mapping": ("sync_mapping", lambda v: _choice("sync", "async")(v) == "sync"),
        "deferred": ("deferred_reclaim", _on_off),
        "lookahead": ("eager_lookahead_steps", int),
        "eager": ("eager_page_groups", int),
        "eager_slots": ("eager_idle_slots", int),
        "watermark": ("low_watermark_frac", float),
        "create": ("create_on_demand", lambda v: _choice("startup", "ondemand")(v) == "ondemand"),
        "layout": ("kv_layout", _choice("per-layer", "cross-layer")),
        "layout_factor": ("layout_attention_factor", float),
        "batched": ("batched_set_access", _on_off),
        **_COMMON},
    "paged": {
        "block": ("block_size_tokens", int), "factor": ("paged_attention_factor", float),
        "bt_base_us": ("block_table_base_us", float), "bt_per_block_us": ("block_table_per_block_us", float),
        **_COMMON},
    "static": {"max_len": ("max_len_tokens", int), **_COMMON},
}


def parse_policy(spec: str) -> dict:
    """``"vattention:page=256KiB,sync"`` -> SimConfig overrides ``{"policy": ..., "page_size_bytes": ...}``.

    Raises:
        ConfigError: naming the spec, the key and the valid keys or values.
    """
    name, _, rest = spec.partition(":")
    name = name.strip().lower()
    if name not in POLICY_KEYS:
        raise ConfigError(f"policy {spec!r}: unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
    overrides: dict = {"policy": name}
    seen: dict[str, str] = {}    # SimConfig field -> the key that set it (sync and mapping set one field)
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in POLICY_KEYS[name]:
            raise ConfigError(f"policy {spec!r}: unknown key {key!r} for {name}; "
                              f"valid keys: {', '.join(POLICY_KEYS[name])}")
        field_name, parse = POLICY_KEYS[name][key][:2]
        if field_name in seen:
            first = seen[field_name]
            raise ConfigError(f"policy {spec!r}: key {key!r} given twice" if first == key else
                              f"policy {spec!r}: keys {first!r} and {key!r} both set {field_name}; give one")
        seen[field_name] = key
        try:
            overrides[field_name] = parse(value.strip())
        except ValueError as exc:
            raise ConfigError(f"policy {spec!r}: {key}={value!r}: {exc}") from None
    return overrides


# summary key -> column label in the comparison table
COMPARE_METRICS = {
    "throughput_req_per_s": "throughput (req/s)", "output_tokens_per_s": "output tokens/s",
    "ttft_p50_ms": "TTFT p50 (ms)", "ttft_p99_ms": "TTFT p99 (ms)", "tpot_p50_ms": "TPOT p50 (ms)",
    "tpot_p99_ms": "TPOT p99 (ms)", "e2e_p50_s": "E2E p50 (s)", "e2e_p99_s": "E2E p99 (s)",
    "mean_batch_size": "batch mean", "max_batch_size": "batch max",
    "peak_mapped_bytes": "peak mapped/allocated (GiB)", "mean_tail_waste_bytes": "tail waste mean (GiB)",
    "map_page_groups": "page groups/blocks mapped", "map_calls": "VMM map calls", "unmap_calls": "VMM unmap calls",
    "sync_stall_total_ms": "sync mapping stall (ms)", "mapping_critical_ms": "VMM time, critical path (ms)",
    "block_table_total_ms": "block-table CPU (ms)",
    "preemptions": "preemptions", "swap_out_bytes": "swapped out (GiB)", "swap_total_ms": "swap time (ms)",
    "clear_copy_total_ms": "clear/copy on critical path (ms)",
    "prefix_hit_ratio": "prefix hit ratio", "prefill_tokens_saved": "prefill tokens saved",
    "prefix_pages_shared": "shared pages mapped", "prefix_map_calls_added": "map calls added by sharing",
    "finished": "finished", "rejected": "rejected",
}
_GIB_COLUMNS = ("peak_mapped_bytes", "mean_tail_waste_bytes", "swap_out_bytes")


def comparison_table(summaries: dict[str, dict]) -> pd.DataFrame:
    """One row per policy label, the :data:`COMPARE_METRICS` as columns (bytes shown in GiB)."""
    rows = []
    for label, summary in summaries.items():
        row = {"policy": label}
        for key, column in COMPARE_METRICS.items():
            value = summary.get(key, float("nan"))
            row[column] = value / 2**30 if key in _GIB_COLUMNS else value
        rows.append(row)
    return pd.DataFrame(rows).set_index("policy")


def _run_one(job: tuple[str, SimConfig, pd.DataFrame, str | None, bool]):
    from analysis.runner import run_simulation
    label, config, trace, profile, keep_tables = job
    result = run_simulation(config, trace, profile, extra_config={"policy_spec": label})
    if not keep_tables:    # only the summary crosses the process boundary (tables can be ~100 MB)
        result.requests, result.iterations = result.requests.iloc[:0], result.iterations.iloc[:0]
    return label, result


def run_policies(base: SimConfig, specs: list[str], trace: pd.DataFrame, profile: str | None = None,
                 workers: int | None = None, keep_tables: bool = True) -> dict:
    """Simulate ``trace`` once per policy spec (in parallel processes); returns ``{spec: RunResult}`` in
    the order given. Results do not depend on ``workers`` (each run has its own seeded generator).
    ``keep_tables=False`` returns summaries only (empty request/iteration tables).

    Raises:
        ConfigError: for a bad spec or an impossible configuration (before anything runs).
    """
    if len(set(specs)) != len(specs):
        raise ConfigError("each --policy must be different")
    jobs = [(spec, base.with_overrides(parse_policy(spec)), trace, profile, keep_tables) for spec in specs]
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    if workers <= 1:
        return dict(map(_run_one, jobs))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return dict(pool.map(_run_one, jobs))


def run_labels(runs) -> list[str]:
    """Labels for runs (:class:`analysis.results.RunResult`): the config's ``policy_spec`` or ``label``, else
    the directory name, else ``run N``; a label shared by several runs gets the directory (or position)
    appended, so that no two runs collapse into one row or legend entry."""
    raw = [str(r.config.get("policy_spec") or r.config.get("label") or (r.path.name if r.path else f"run {i + 1}"))
           for i, r in enumerate(runs)]
    labels = []
    for i, (label, run) in enumerate(zip(raw, runs)):
        if raw.count(label) > 1:
            label = f"{label} ({run.path.name if run.path else i + 1})"
        labels.append(label if label not in labels else f"{label} #{i + 1}")
    return labels


def compare(runs) -> pd.DataFrame:
    """The comparison table of several runs (e.g. from :func:`analysis.load_run`): one row per run, indexed
    by :func:`run_labels`, the :data:`COMPARE_METRICS` as columns (bytes in GiB)."""
    runs = list(runs)
    return comparison_table(dict(zip(run_labels(runs), (run.summary for run in runs))))
