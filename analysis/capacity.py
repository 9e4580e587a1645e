"""Capacity planning: the highest arrival rate one GPU replica sustains under latency SLOs.

The search runs the simulator on the trace with its arrival rate multiplied by a *scale* factor
(:func:`traces.scale_rate`, which divides every arrival time by the factor) and asks at each scale
whether every SLO holds and the queue is stable (:mod:`analysis.slo`)::

    bracket:  s = 1, then double while it passes (halve while it fails) -> lo passes, hi = 2 lo fails
    bisect:   s = sqrt(lo * hi) until hi / lo - 1 <= tolerance        (geometric midpoint: a relative
                                                                         tolerance on the rate)
    capacity: rate(lo) = lo * base rate;  replicas for a target R = ceil(R / rate(lo))

The answer assumes pass/fail is monotone in the scale; where it is not (noise near the boundary), the
search returns *a* passing scale with a failing one within the tolerance above it. The simulator is
deterministic for a fixed seed, so the whole search is reproducible.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

import traces
from analysis import runner
from analysis.slo import DEFAULT_STABILITY_TOL, Slo, ttft_growth
from sim.config import SimConfig

MAX_BRACKET_STEPS = 16   # 2**16: the bracket spans rates from 1/65536 to 65536 times the trace's own
STABILITY = "stability"


@dataclass(frozen=True)
class Evaluation:
    """One simulated point of the search.

    Attributes:
        scale: arrival-rate multiplier applied to the base trace.
        rate_per_s: offered request rate at this scale (requests/s).
        values_us: SLO metric -> measured value (us).
        ttft_growth: TTFT slope over arrival time in the steady state, s/s (see :mod:`analysis.slo`).
        failed: names of the violated constraints (SLO metrics, ``"stability"``), tightest first.
        summary: the run summary.
    """

    scale: float
    rate_per_s: float
    values_us: dict
    ttft_growth: float
    failed: tuple[str, ...]
    summary: dict = field(default_factory=dict, repr=False)

    @property
    def passed(self) -> bool:
        return not self.failed


@dataclass(frozen=True)
class CapacityResult:
    """Outcome of :func:`search_capacity` (rates per replica)."""

    slos: tuple[Slo, ...]
    tolerance: float
    base_rate_per_s: float
    steps: tuple[Evaluation, ...]
    best: Evaluation | None     # highest passing point (None: fails even at the lowest scale)
    above: Evaluation | None    # lowest failing point above it (None: never failed up to the highest)
    mean_output_tokens: float = float("nan")
    mean_total_tokens: float = float("nan")

    @property
    def rate_per_s(self) -> float:
        """Capacity in requests/s per replica (0 when no scale passed)."""
        return self.best.rate_per_s if self.best else 0.0

    @property
    def output_tokens_per_s(self) -> float:
        return self.rate_per_s * self.mean_output_tokens

    @property
    def total_tokens_per_s(self) -> float:
        """Prompt + output tokens per second at capacity."""
        return self.rate_per_s * self.mean_total_tokens

    @property
    def binding(self) -> str:
        """The constraint that stops a higher rate: the tightest one violated just above capacity."""
        if self.above is None:
            return "none (passes at the highest rate tried)"
        return self.above.failed[0]

    def replicas_for(self, target_rate_per_s: float) -> int | None:
        """Replicas needed for ``target_rate_per_s`` (None when one replica passes at no rate)."""
        if self.rate_per_s <= 0:
            return None
        return max(1, math.ceil(target_rate_per_s / self.rate_per_s - 1e-9))

    def to_dict(self) -> dict:
        """Flat record for tables (sweeps): capacity, binding SLO, scale and the summary at capacity."""
        record = {"capacity_req_per_s": self.rate_per_s, "capacity_output_tokens_per_s": self.output_tokens_per_s,
                  "capacity_total_tokens_per_s": self.total_tokens_per_s, "binding": self.binding,
                  "capacity_scale": self.best.scale if self.best else 0.0, "search_steps": len(self.steps),
                  "base_rate_per_s": self.base_rate_per_s}
        if self.best:
            record.update({f"at_capacity_{k}": v for k, v in self.best.summary.items()})
        return record


def base_rate_per_s(trace: pd.DataFrame) -> float:
    """Offered request rate of a trace: ``(n - 1) / (last arrival - first arrival)``.

    Raises:
        ValueError: when the trace has fewer than 2 requests or all arrive at once.
    """
    arrivals_s = trace["arrival_s"].to_numpy(dtype=float)
    span_s = float(arrivals_s.max() - arrivals_s.min()) if len(arrivals_s) else 0.0
    if len(arrivals_s) < 2 or span_s <= 0:
        raise ValueError("capacity search needs a trace with >= 2 requests spread over time")
    return (len(arrivals_s) - 1) / span_s


def judge(scale: float, rate_per_s: float, summary: dict, growth: float, slos: tuple[Slo, ...],
          stability_tol: float = DEFAULT_STABILITY_TOL) -> Evaluation:
    """Apply the SLOs and the stability criterion to one run's summary; violated ones tightest first."""
    values_us = {slo.metric: slo.value_us(summary) for slo in slos}
    excess = {slo.metric: _excess(values_us[slo.metric] / slo.limit_us) for slo in slos if not slo.holds(summary)}
    if growth > stability_tol:
        excess[STABILITY] = _excess(growth / stability_tol)
    failed = tuple(sorted(excess, key=lambda name: -excess[name]))
    return Evaluation(scale, rate_per_s, values_us, growth, failed, summary)


def _excess(ratio: float) -> float:
    return math.inf if math.isnan(ratio) else ratio


def make_evaluator(config: SimConfig, trace: pd.DataFrame, slos: tuple[Slo, ...], profile_path: str | None = None,
                   stability_tol: float = DEFAULT_STABILITY_TOL) -> Callable[[float], Evaluation]:
    """A function ``scale -> Evaluation`` that simulates ``trace`` at ``scale`` times its rate."""
    base_rate = base_rate_per_s(trace)

    def evaluate(scale: float) -> Evaluation:
        scaled = traces.scale_rate(trace, scale) if scale != 1.0 else trace
        result = runner.run_simulation(config, scaled, profile_path)
        return judge(scale, scale * base_rate, result.summary, ttft_growth(result.requests), slos, stability_tol)
    return evaluate


def _bracket(evaluate: Callable[[float], Evaluation], start_scale: float, steps: list) -> tuple:
    """Double (or halve) the scale from ``start_scale`` until pass/fail flips; returns (lo, hi) evaluations,
    either of which is None when the bracket ran out of steps."""
    first = evaluate(start_scale)
    steps.append(first)
    factor = 2.0 if first.passed else 0.5
    previous = first
    for _ in range(MAX_BRACKET_STEPS):
        current = evaluate(previous.scale * factor)
        steps.append(current)
        if current.passed != previous.passed:
            return (previous, current) if first.passed else (current, previous)
        previous = current
    return (previous, None) if first.passed else (None, previous)


def search_capacity(evaluate: Callable[[float], Evaluation], slos: tuple[Slo, ...], tolerance: float = 0.02,
                    start_scale: float = 1.0, base_rate: float = 1.0,
                    on_step: Callable[[Evaluation], None] | None = None) -> CapacityResult:
    """Exponential bracket, then geometric bisection on the scale until ``hi / lo - 1 <= tolerance``.

    Args:
        evaluate: ``scale -> Evaluation`` (e.g. :func:`make_evaluator`).
        slos: the objectives (recorded in the result).
        tolerance: relative width of the final bracket (0.02 = the capacity is within 2% below the true
            boundary).
        start_scale: first scale tried.
        base_rate: requests/s of the unscaled trace (recorded in the result).
        on_step: called with each evaluation as it completes (progress printing).

    Raises:
        ValueError: for a tolerance outside (0, 1) or a start scale <= 0.
    """
    if not 0 < tolerance < 1:
        raise ValueError(f"--tolerance must lie in (0, 1), got {tolerance}")
    if not start_scale > 0:
        raise ValueError(f"start scale must be > 0, got {start_scale}")
    steps: list[Evaluation] = []

    def tracked(scale: float) -> Evaluation:
        evaluation = evaluate(scale)
        if on_step:
            on_step(evaluation)
        return evaluation

    lo, hi = _bracket(tracked, start_scale, steps)
    while lo is not None and hi is not None and hi.scale / lo.scale - 1 > tolerance:
        middle = tracked(math.sqrt(lo.scale * hi.scale))
        steps.append(middle)
        lo, hi = (middle, hi) if middle.passed else (lo, middle)
    return CapacityResult(tuple(slos), tolerance, base_rate, tuple(steps), lo, hi)


def find_capacity(config: SimConfig, trace: pd.DataFrame, slos: tuple[Slo, ...], tolerance: float = 0.02,
                  profile_path: str | None = None, stability_tol: float = DEFAULT_STABILITY_TOL,
                  on_step: Callable[[Evaluation], None] | None = None) -> CapacityResult:
    """Capacity of one replica under ``config`` for the workload ``trace`` (see the module docstring)."""
    evaluate = make_evaluator(config, trace, slos, profile_path, stability_tol)
    base_rate = base_rate_per_s(trace)
    result = search_capacity(evaluate, slos, tolerance, base_rate=base_rate, on_step=on_step)
    output_tokens = float(trace["output_tokens"].mean())
    total_tokens = output_tokens + float(trace["prompt_tokens"].mean())
    return CapacityResult(result.slos, tolerance, base_rate, result.steps, result.best, result.above,
                          output_tokens, total_tokens)
