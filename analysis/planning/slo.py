"""Service-level objectives (SLOs) on latency percentiles, and the queueing-stability check.

An SLO list is written ``metric=duration[,metric=duration...]``::

    ttft_p99=2s,tpot_p99=100ms          e2e_p90=30s          ttft_p50=250us

Metrics are ``{ttft,tpot,e2e,tbt,sched_delay}_{p50,p90,p99,mean}`` and ``tbt_max`` (the run summary's
``ttft_p99_ms``, ``tpot_p99_ms``, ``e2e_p99_s``, ``tbt_p99_ms``, ``sched_delay_p50_ms``, ...): TTFT, TPOT, E2E and
scheduling delay over the finished requests, TBT (time between tokens) over all their output tokens after the
first; durations take a unit (us, ms, s, min) and are held in microseconds. A capacity search adds a median
scheduling-delay bound of 2 s unless one is given (:func:`with_default_bounds`).

**Per-request objectives and SLO attainment** (DistServe, Zhong et al., OSDI'24, section 2; vLLM issue 9338's
goodput). The metrics ``ttft``, ``tpot`` and ``e2e`` without a statistic bound *each request's own* value
(``ttft=200ms,tpot=50ms``), and ``--slo-attainment F`` asks that a share of at least F of the requests meet
every one of them at once (:class:`SloAttainment`)::

    met(r)      = r finished  and  ttft_us(r) <= TTFT  and  tpot_us(r) <= TPOT  and  e2e_us(r) <= E2E
    attainment  = #met / #requests          (every request of the run: rejected and unfinished ones are misses)
    goodput     = #met / makespan_s         (the span of throughput_req_per_s: first arrival to last completion)

``tpot_us`` is the request's own mean gap after its first token, ``(completion - first token) / (output - 1)``
(:mod:`sim.core.request`); a request of one output token has none, and meets any TPOT bound (no token of it was
late; vLLM's benchmark counts its TPOT as 0). A capacity search with ``--allow-rejected`` leaves the requests
that can never fit one replica out of the denominator, as it leaves them out of the capacity
(:func:`attainment_of`). The capacity found under an attainment objective is DistServe's goodput: the highest
rate at which the share of requests meeting every SLO stays >= F.

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

import numpy as np
import pandas as pd

from sim.results.summary import SCHED_DELAY_P50_BOUND_US
from sim.units import US_PER_MS, US_PER_S, parse_duration_us

# metric family -> (summary key unit suffix, microseconds per unit of the summary value)
_FAMILIES = {"ttft": ("ms", US_PER_MS), "tpot": ("ms", US_PER_MS), "e2e": ("s", US_PER_S),
             "tbt": ("ms", US_PER_MS), "sched_delay": ("ms", US_PER_MS)}
_STATS = ("p50", "p90", "p99", "mean")
PER_REQUEST_METRICS = {"ttft": "ttft_us", "tpot": "tpot_us", "e2e": "e2e_us"}
"""Per-request objective -> the request-table column it bounds (module docstring)."""
SLO_METRICS = (tuple(f"{family}_{stat}" for family in _FAMILIES for stat in _STATS) + ("tbt_max",)
               + tuple(PER_REQUEST_METRICS))
ATTAINMENT = "slo_attainment"
DEFAULT_STABILITY_TOL = 0.05
DEFAULT_SCHED_DELAY_P50_US = SCHED_DELAY_P50_BOUND_US
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
    def per_request(self) -> bool:
        """Whether this bounds each request's own value (``ttft``, ``tpot``, ``e2e``; judged through
        :class:`SloAttainment`), not a statistic of the run."""
        return self.metric in PER_REQUEST_METRICS

    @property
    def family(self) -> str:
        """``ttft``, ``tpot``, ``e2e``, ``tbt`` or ``sched_delay``."""
        return self.metric if self.per_request else self.metric.rsplit("_", 1)[0]

    def met_by(self, requests: pd.DataFrame) -> np.ndarray:
        """Per request (bool array, rows in order): finished, and its value within the limit (a per-request
        objective only; an undefined TPOT, one output token, meets it: module docstring)."""
        values_us = requests[PER_REQUEST_METRICS[self.metric]].to_numpy(dtype=float)
        within = (values_us <= self.limit_us) | (np.isnan(values_us) & (self.metric == "tpot"))
        return within & (requests["status"].to_numpy() == "finished")

    def header(self) -> str:
        """The column title of this objective's value in the capacity steps (milliseconds)."""
        return f"{self.metric} (ms)"

    def cell(self, value: float) -> str:
        """The value (us) as that column shows it."""
        return f"{value / 1e3:.1f}"

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

    def excess(self, summary: dict) -> float:
        """value / limit (> 1 when it fails; inf when undefined)."""
        ratio = self.value_us(summary) / self.limit_us
        return math.inf if math.isnan(ratio) else ratio

    def __str__(self) -> str:
        return f"{self.metric}<={format_duration(self.limit_us)}"


@dataclass(frozen=True)
class SloAttainment:
    """The objective that a share of at least ``target_frac`` of the requests meet every per-request objective in
    ``slos`` at once (module docstring). Its value is the run's :data:`ATTAINMENT` share, which the run summary holds
    when the objectives are given (:func:`analysis.results.goodput_figures`)."""

    target_frac: float
    slos: tuple[Slo, ...]

    metric = ATTAINMENT
    per_request = False
    family = ATTAINMENT

    def __post_init__(self) -> None:
        if not 0 < self.target_frac <= 1:
            raise ValueError(f"--slo-attainment must lie in (0, 1], got {self.target_frac}")
        if not self.slos or not all(slo.per_request for slo in self.slos):
            raise ValueError("--slo-attainment needs per-request objectives in --slo: "
                             f"{', '.join(f'{m}=DURATION' for m in PER_REQUEST_METRICS)} (e.g. ttft=200ms,tpot=50ms)")

    def value_us(self, summary: dict) -> float:
        """The share of requests meeting every objective (a fraction, not microseconds: the name is the
        interface :class:`Slo` shares); NaN when the summary lacks it."""
        return float(summary.get(ATTAINMENT, float("nan")))

    def holds(self, summary: dict) -> bool:
        value = self.value_us(summary)
        return not math.isnan(value) and value >= self.target_frac

    def excess(self, summary: dict) -> float:
        """How far the run misses: target / attainment (> 1 when it fails; inf at attainment 0 or undefined)."""
        value = self.value_us(summary)
        return math.inf if math.isnan(value) or value <= 0 else self.target_frac / value

    def header(self) -> str:
        return "attained (%)"

    def cell(self, value: float) -> str:
        return f"{100 * value:.1f}"

    def __str__(self) -> str:
        return f"attainment>={self.target_frac:.4g} of ({', '.join(map(str, self.slos))})"


def attainment_of(requests: pd.DataFrame, slos, excluded: int = 0) -> tuple[int, float]:
    """``(requests meeting every per-request objective of slos, that count / (len(requests) - excluded))``.

    Args:
        requests: per-request table (``status``, ``ttft_us``, ``tpot_us``, ``e2e_us``).
        slos: objectives; only the per-request ones (:attr:`Slo.per_request`) count.
        excluded: requests left out of the denominator (a capacity search's accepted unservable requests).
    Returns:
        The count and the share (NaN for no request left).
    """
    met = np.ones(len(requests), dtype=bool)
    for slo in slos:
        if getattr(slo, "per_request", False):
            met &= slo.met_by(requests)
    count, total = int(met.sum()), len(requests) - excluded
    return count, count / total if total > 0 else float("nan")


def per_request_slos(slos) -> tuple[Slo, ...]:
    """The per-request objectives of ``slos``, also those inside an :class:`SloAttainment`."""
    out = []
    for slo in slos:
        out += list(slo.slos) if isinstance(slo, SloAttainment) else [slo] if slo.per_request else []
    return tuple(out)


def objectives(text: str, attainment_frac: float | None = None) -> tuple:
    """The objectives of ``--slo text`` and ``--slo-attainment``: the per-statistic ones, then (when any) one
    :class:`SloAttainment` holding the per-request ones.

    Raises:
        ValueError: :func:`parse_slos`'s errors; per-request objectives without ``--slo-attainment``, or
            ``--slo-attainment`` without per-request objectives, or outside (0, 1].
    """
    slos = parse_slos(text)
    per_request = tuple(slo for slo in slos if slo.per_request)
    if per_request and attainment_frac is None:
        raise ValueError(f"--slo {','.join(str(s) for s in per_request)}: a per-request objective needs "
                         "--slo-attainment F (the share of requests that must meet every one, e.g. 0.9)")
    rest = tuple(slo for slo in slos if not slo.per_request)
    if attainment_frac is None:
        return rest
    return (*rest, SloAttainment(attainment_frac, per_request))


def point_objectives(args) -> tuple:
    """A simulate point's objectives: :func:`objectives` of ``--slo`` and ``--slo-attainment``; none without
    ``--slo``."""
    return objectives(args.slo, getattr(args, "slo_attainment", None)) if getattr(args, "slo", None) else ()


def search_objectives(args) -> tuple:
    """What a capacity search judges for parsed options: :func:`objectives` of ``--slo`` and
    ``--slo-attainment``, with the default bounds (:func:`with_default_bounds`)."""
    return with_default_bounds(objectives(args.slo, getattr(args, "slo_attainment", None)))


def parse_slos(text: str) -> tuple[Slo, ...]:
    """``"ttft_p99=2s,tpot_p99=100ms"`` -> ``(Slo('ttft_p99', 2e6), Slo('tpot_p99', 1e5))``; per-request
    metrics (``ttft=200ms``) parse to :class:`Slo` too (:func:`objectives` groups them).

    Raises:
        ValueError: for an empty list, an empty item (a stray comma), a missing ``=``, an unknown metric (the
            message lists the valid ones), a repeated metric, or a duration without a unit.
    """
    from sim.units import comma_items

    slos: dict[str, Slo] = {}
    for item in comma_items(text, f"--slo {text!r}", "objective"):   # "ttft_p99=2s,": an objective left out?
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
