"""Policy what-if: several memory policies on one trace, one model and one GPU, side by side.

A policy is written ``NAME[:key=value,key=value,...]`` (``kvsim compare --policy ...``)::

    vattention:page=2MiB            vattention:page=256KiB,sync      vattention:deferred=off
    vattention:create=ondemand      vattention:lookahead=0,eager=0   paged:block=16   static:max_len=4096
    vattention:layout=cross-layer   vattention:batched=on            vattention:zero=on-reuse

Keys (see :class:`sim.setup.config.SimConfig` for meanings and defaults): every policy takes ``preempt``
(recompute|swap), ``zero`` (off|on-reuse|on-free) and ``prefix`` (on|off: prefix caching, vattention and paged); vattention takes page, sync / mapping (sync|async),
deferred (on|off), lookahead, eager, eager_slots, watermark, create (startup|ondemand), layout
(per-layer|cross-layer), layout_factor, batched (on|off); paged takes block, factor, bt_base_us,
bt_per_block_us; static takes max_len.
"""
from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import pandas as pd

from sim.setup.config import ConfigError, SimConfig
from sim.frontend.policy_spec import parse_policy

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
    "slo_attainment": "SLO attainment (share of requests)", "goodput_req_per_s": "goodput (req/s)",
    **{key.format(kind=kind): label.format(kind=kind.upper()) for kind in ("dram", "ssd") for key, label in (
        ("tier_{kind}_hit_ratio", "{kind} hit ratio"), ("tier_{kind}_bytes_read", "read from {kind} (GiB)"),
        ("tier_{kind}_bytes_written", "written to {kind} (GiB)"), ("tier_{kind}_read_ms", "{kind} load time (ms)"))},
    "tier_recomputed_tokens": "tier hits recomputed (tokens)",
}
_TIER_COLUMNS = tuple(key for key in COMPARE_METRICS if key.startswith("tier_"))
# columns only when a summary has them (per-request SLOs; KV tiers, sim.memory.tiers)
_WHEN_GIVEN = ("slo_attainment", "goodput_req_per_s", *_TIER_COLUMNS)
_GIB_COLUMNS = ("peak_mapped_bytes", "mean_tail_waste_bytes", "swap_out_bytes",
                *(key for key in _TIER_COLUMNS if key.endswith("_bytes_read") or key.endswith("_bytes_written")))


def comparison_table(summaries: dict[str, dict]) -> pd.DataFrame:
    """One row per policy label, the :data:`COMPARE_METRICS` as columns (bytes shown in GiB); the SLO attainment
    and goodput (:func:`analysis.results.goodput_figures`) and the KV tiers' figures only when some summary holds
    them."""
    rows = []
    given = {key for key in _WHEN_GIVEN if any(key in summary for summary in summaries.values())}
    metrics = {key: column for key, column in COMPARE_METRICS.items() if key not in _WHEN_GIVEN or key in given}
    for label, summary in summaries.items():
        row = {"policy": label}
        for key, column in metrics.items():
            value = summary.get(key, float("nan"))
            row[column] = value / 2**30 if key in _GIB_COLUMNS else value
        rows.append(row)
    return pd.DataFrame(rows).set_index("policy")


def _run_one(job: tuple[str, SimConfig, pd.DataFrame, str | None, bool]):
    from sim.core.runner import run_simulation
    label, config, trace, profile, keep_tables = job
    result = run_simulation(config, trace, profile, extra_config={"policy_spec": label})
    if not keep_tables:    # only the summary crosses the process boundary (tables can be ~100 MB)
        result.requests, result.iterations = result.requests.iloc[:0], result.iterations.iloc[:0]
    return label, result


def run_policies(base: SimConfig, specs: list[str], trace: pd.DataFrame, profile: str | None = None,
                 workers: int | None = None, keep_tables: bool = True, on_done=None) -> dict:
    """Simulate ``trace`` once per policy spec (in parallel processes); returns ``{spec: RunResult}`` in
    the order given. Results do not depend on ``workers`` (each run has its own seeded generator).
    ``keep_tables=False`` returns summaries only (empty request/iteration tables). ``on_done(done, total)``,
    when given, is called as each run finishes (in the order given; a progress display).

    Raises:
        ConfigError: for a bad spec, an impossible configuration, or two specs that give one configuration
            (before anything runs).
    """
    if not isinstance(base, SimConfig):
        raise TypeError(f"base: expected a SimConfig, got {type(base).__name__}")
    if isinstance(specs, str) or not all(isinstance(spec, str) for spec in specs):
        raise TypeError(f"specs: expected a list of policy specs (e.g. ['vattention', 'paged:block=16']), "
                        f"got {specs!r}")
    if len(set(specs)) != len(specs):
        raise ConfigError("each --policy must be different")
    jobs = [(spec, base.with_overrides(parse_policy(spec)), trace, profile, keep_tables) for spec in specs]
    seen: dict = {}
    for spec, config, *_ in jobs:     # two spellings of one configuration (e.g. vattention and vattention:page=2MiB)
        key = replace(config, explicit_fields=())
        if key in seen:
            raise ConfigError(f"--policy {seen[key]!r} and --policy {spec!r} are the same configuration (the same "
                              "values with the other options given); each --policy must be different")
        seen[key] = spec
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    if workers <= 1:
        return dict(_reporting(map(_run_one, jobs), len(jobs), on_done))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return dict(_reporting(pool.map(_run_one, jobs), len(jobs), on_done))


def _reporting(results, total: int, on_done):
    """``results`` passed through, calling ``on_done(done, total)`` after each (when given)."""
    for done, item in enumerate(results, start=1):
        yield item
        if on_done is not None:
            on_done(done, total)


def run_labels(runs) -> list[str]:
    """Labels for runs (:class:`analysis.results.RunResult`): the config's ``policy_spec`` or ``label``, else
    the directory name, else ``run N``; a label shared by several runs gets the directory (or position)
    appended, so that no two runs collapse into one row or legend entry."""
    raw = [str(r.config.get("policy_spec") or r.config.get("label") or (r.path.name if r.path else f"run {i + 1}"))
           + (f" x {r.config['replicas']} replicas ({r.config.get('routing', 'round-robin')})"
              if int(r.config.get("replicas", 1) or 1) > 1 else "")
           for i, r in enumerate(runs)]
    labels = []
    for i, (label, run) in enumerate(zip(raw, runs)):
        if raw.count(label) > 1:
            label = f"{label} ({run.path.name if run.path else i + 1})"
        labels.append(label if label not in labels else f"{label} #{i + 1}")
    return labels


def compare(runs) -> pd.DataFrame:
    """The comparison table of several runs (:class:`analysis.results.RunResult`, e.g. from
    :func:`analysis.load_run`, or run directories as paths, loaded here; or :func:`run_policies`' dict of them):
    one row per run, indexed by :func:`run_labels`, the :data:`COMPARE_METRICS` as columns (bytes in GiB).

    Raises:
        FileNotFoundError / ValueError: a path that is not a run directory (from :func:`analysis.load_run`).
    """
    from analysis.results import load_run
    if isinstance(runs, dict):              # run_policies' {spec: RunResult}
        runs = list(runs.values())
    if isinstance(runs, (str, os.PathLike)) or not hasattr(runs, "__iter__"):
        raise TypeError(f"compare: expected a list of runs (RunResult objects or run directories) or "
                        f"run_policies' dict, got {type(runs).__name__}")
    runs = [load_run(run) if isinstance(run, (str, os.PathLike)) else run for run in runs]
    if not runs:
        raise ValueError("compare: no runs given")
    return comparison_table(dict(zip(run_labels(runs), (run.summary for run in runs))))
