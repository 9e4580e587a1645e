"""Service-level objectives (SLOs) on latency percentiles, and the queueing-stability check.

An SLO list is written ``metric=duration[,metric=duration...]``::

    ttft_p99=2s,tpot_p99=100ms          e2e_p90=30s          ttft_p50=250us

Metrics are ``{ttft,tpot,e2e,tbt,sched_delay}_{p50,p90,p99,mean}`` and ``tbt_max`` (the run summary's
``ttft_p99_ms``, ``tpot_p99_ms``, ``e2e_p99_s``, ``tbt_p99_ms``, ``sched_delay_p50_ms``, ...): TTFT, TPOT, E2E and
scheduling delay over the finished requests, TBT (time between tokens) over all their output tokens after the
first; durations take a unit (us, ms, s, min) and are held in microseconds. A capacity search adds a median
scheduling-delay bound of 2 s unless one is given (:func:`with_default_bounds`).

**Stability.** A finite trace can hide an overloaded server: the queue grows for the whole run, but a short
run ends before latencies explode. The criterion is the *queueing trend*: the least-squares slope of TTFT
against arrival time over the steady-state window (finished requests arriving after the first quartile;
the first quarter is warm-up), in seconds of extra TTFT per second of trace time::

    ttft_growth = slope of ttft_s over arrival_s          stable iff ttft_growth <= stability_tol (0.05)

In an overloaded queue (arrivals at rate L, service at rate M < L) the backlog after t seconds is
(L - M) t, so a request arriving at t waits about (L / M - 1) t: the slope is L / M - 1. A bound of 0.05
thus means the server keeps up with at least 1 / 1.05 = 95% of the offered rate. Unlike completions
counted in a window, TTFT excludes decode time, so the criterion is not biased when a run lasts only
a few end-to-end latencies.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from sim.units import US_PER_MS, US_PER_S, parse_duration_us

# metric family -> (summary key unit suffix, microseconds per unit of the summary value)
_FAMILIES = {"ttft": ("ms", US_PER_MS), "tpot": ("ms", US_PER_MS), "e2e": ("s", US_PER_S),
             "tbt": ("ms", US_PER_MS), "sched_delay": ("ms", US_PER_MS)}
_STATS = ("p50", "p90", "p99", "mean")
SLO_METRICS = tuple(f"{family}_{stat}" for family in _FAMILIES for stat in _STATS) + ("tbt_max",)
DEFAULT_STABILITY_TOL = 0.05
DEFAULT_SCHED_DELAY_P50_US = 2 * US_PER_S
"""Median scheduling delay bound added to every capacity search that sets no ``sched_delay`` objective:
Sarathi-Serve (Agrawal et al., OSDI'24, section 5) defines capacity as the highest load whose median
scheduling delay stays under 2 s, so a run whose queue holds requests for tens of seconds cannot pass a
TPOT-only objective."""


@dataclass(frozen=True)
class Slo:
    """One objective: ``metric`` (e.g. ``ttft_p99``) must not exceed ``limit_us`` microseconds."""

    metric: str
    limit_us: float

    def __post_init__(self) -> None:
        if self.metric not in SLO_METRICS:
            raise ValueError(f"unknown SLO metric {self.metric!r}; valid metrics: {', '.join(SLO_METRICS)}")
        if not self.limit_us > 0:
            raise ValueError(f"SLO {self.metric}: limit must be > 0 us, got {self.limit_us}")

    @property
    def family(self) -> str:
        """``ttft``, ``tpot``, ``e2e``, ``tbt`` or ``sched_delay``."""
        return self.metric.rsplit("_", 1)[0]

    @property
    def summary_key(self) -> str:
        """The run-summary key holding this metric, e.g. ``ttft_p99_ms``."""
        return f"{self.metric}_{_FAMILIES[self.family][0]}"

    def value_us(self, summary: dict) -> float:
        """The metric in microseconds from a run summary (NaN when no request finished)."""
        value = summary.get(self.summary_key, float("nan"))
        return float(value) * _FAMILIES[self.family][1]

    def holds(self, summary: dict) -> bool:
        """Whether the run meets this objective (an undefined value, NaN, does not)."""
        value_us = self.value_us(summary)
        return not math.isnan(value_us) and value_us <= self.limit_us

    def __str__(self) -> str:
        return f"{self.metric}<={format_duration(self.limit_us)}"


def parse_slos(text: str) -> tuple[Slo, ...]:
    """``"ttft_p99=2s,tpot_p99=100ms"`` -> ``(Slo('ttft_p99', 2e6), Slo('tpot_p99', 1e5))``.

    Raises:
        ValueError: for an empty list, a missing ``=``, an unknown metric (the message lists the valid
            ones), a repeated metric, or a duration without a unit.
    """
    slos: dict[str, Slo] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        metric, sep, value = item.partition("=")
        metric = metric.strip().lower()
        if not sep:
            raise ValueError(f"--slo {item!r}: expected METRIC=DURATION, e.g. ttft_p99=2s")
        if metric not in SLO_METRICS:
            raise ValueError(f"--slo: unknown metric {metric!r}; valid metrics: {', '.join(SLO_METRICS)}")
        if metric in slos:
            raise ValueError(f"--slo: metric {metric!r} given twice")
        try:
            slos[metric] = Slo(metric, parse_duration_us(value.strip()))
        except ValueError as exc:
            raise ValueError(f"--slo {metric}: {exc}") from None
    if not slos:
        raise ValueError("--slo: no objective given (e.g. ttft_p99=2s,tpot_p99=100ms)")
    return tuple(slos.values())


def with_default_bounds(slos: tuple[Slo, ...]) -> tuple[Slo, ...]:
    """The objectives plus the default median scheduling-delay bound (:data:`DEFAULT_SCHED_DELAY_P50_US`)
    unless they already bound the scheduling delay."""
    if any(slo.family == "sched_delay" for slo in slos):
        return tuple(slos)
    return (*slos, Slo("sched_delay_p50", DEFAULT_SCHED_DELAY_P50_US))


def format_duration(value_us: float) -> str:
    """``2e6 -> '2s'``, ``1e5 -> '100ms'``, ``250 -> '250us'``."""
    if math.isnan(value_us):
        return "nan"
    for unit, scale in (("s", US_PER_S), ("ms", US_PER_MS)):
        if value_us >= scale:
            return f"{value_us / scale:.4g}{unit}"
    return f"{value_us:.4g}us"


# the queueing trend is computed with the run summary, below analysis (sim.results.summary); re-exported here
from sim.results.summary import ttft_growth, ttft_growth_of  # noqa: E402,F401
