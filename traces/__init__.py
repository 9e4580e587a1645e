"""Request traces for kvsim: loading public formats, generating, transforming, stats.

Every loader and generator returns the canonical table (see :mod:`traces.canonical`).

Public API (imported on first use): loaders (``load_trace``, ``detect_format``, ``write_parquet``,
``FORMAT_NAMES``), public traces by name (``resolve_trace``, ``fetch_trace``, ``NAMED_TRACES``, ``data_dir``),
generators (``synthesize``, ``synthetic_default``, ``poisson_arrivals``, ``gamma_arrivals``, length samplers,
``servegen_mix``), transformations (``scale_rate``, ``first_n``, ``skip_n``, ``sample_n``, ``shuffle_sample``, ``time_window``,
``clip_context``, ``merge``), statistics (``trace_stats``, ``ideal_prefix_hit``), errors (``TraceError``,
``TraceWarning``); the workload of a run from options: :mod:`traces.workload`.
"""
from sim.lazy import lazy_exports

_EXPORTS = {
    "ArrivalSpec": "traces.generators",
    "CANONICAL_COLUMNS": "traces.canonical",
    "FORMAT_NAMES": "traces.loader",
    "LengthTarget": "traces.generators",
    "NAMED_TRACES": "traces.named",
    "TraceError": "traces.errors",
    "TraceWarning": "traces.errors",
    "arrivals_from_spec": "traces.generators",
    "clip_context": "traces.transforms",
    "data_dir": "traces.named",
    "detect_format": "traces.loader",
    "empirical_lengths": "traces.generators",
    "fetch_trace": "traces.named",
    "first_n": "traces.transforms",
    "fitted_lengths": "traces.generators",
    "gamma_arrivals": "traces.generators",
    "ideal_prefix_hit": "traces.stats",
    "load_trace": "traces.loader",
    "lognormal_lengths": "traces.generators",
    "merge": "traces.transforms",
    "parse_arrival": "traces.generators",
    "poisson_arrivals": "traces.generators",
    "renumber": "traces.canonical",
    "resolve_trace": "traces.named",
    "sample_n": "traces.transforms",
    "scale_rate": "traces.transforms",
    "servegen_mix": "traces.servegen",
    "shuffle_sample": "traces.transforms",
    "skip_n": "traces.transforms",
    "spliced_lengths": "traces.generators",
    "synthesize": "traces.generators",
    "synthetic_default": "traces.generators",
    "time_window": "traces.transforms",
    "trace_stats": "traces.stats",
    "write_parquet": "traces.loader",
}


__getattr__ = lazy_exports(globals(), _EXPORTS)


__all__ = sorted(_EXPORTS)
