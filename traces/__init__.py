"""Request traces for kvsim: loading public formats, generating, transforming, stats.

Every loader and generator returns the canonical table (see :mod:`traces.canonical`).
"""

from traces.canonical import CANONICAL_COLUMNS, renumber
from traces.errors import TraceError, TraceWarning
from traces.generators import (ArrivalSpec, LengthTarget, arrivals_from_spec,
                               empirical_lengths, fitted_lengths, gamma_arrivals,
                               lognormal_lengths, parse_arrival, poisson_arrivals,
                               spliced_lengths, synthesize, synthetic_default)
from traces.loader import FORMAT_NAMES, detect_format, load_trace, write_parquet
from traces.transforms import (clip_context, first_n, merge, sample_n, scale_rate, skip_n,
                               time_window)
from traces.named import NAMED_TRACES, data_dir, fetch_trace, resolve_trace
from traces.servegen import servegen_mix
from traces.stats import ideal_prefix_hit, trace_stats

__all__ = [
    "CANONICAL_COLUMNS", "FORMAT_NAMES", "NAMED_TRACES", "data_dir", "fetch_trace",
    "resolve_trace", "servegen_mix", "ArrivalSpec", "LengthTarget", "TraceError",
    "TraceWarning", "arrivals_from_spec", "clip_context", "detect_format",
    "empirical_lengths", "first_n", "fitted_lengths", "gamma_arrivals",
    "ideal_prefix_hit", "load_trace", "lognormal_lengths", "merge", "parse_arrival",
    "poisson_arrivals", "renumber", "sample_n", "scale_rate", "spliced_lengths",
    "skip_n", "synthesize", "synthetic_default", "time_window", "trace_stats", "write_parquet",
]
