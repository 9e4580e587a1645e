"""Capacity planning: the highest arrival rate one GPU replica sustains under latency SLOs.

The search runs the simulator on the trace with its arrival rate multiplied by a *scale* factor
(:func:`traces.scale_rate`, which divides every arrival time by the factor) and asks at each scale
whether every SLO holds and the queue is stable (:mod:`analysis.planning.slo`)::

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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

import traces
from sim.core import runner
from analysis.planning.slo import DEFAULT_STABILITY_TOL, Slo, SloAttainment, ttft_growth
from analysis.results import goodput_figures
from sim.setup.config import SimConfig

MAX_BRACKET_STEPS = 16   # 2**16: the bracket spans rates from 1/65536 to 65536 times the trace's own
ZERO_LOAD_HALVINGS = 3
"""The halving walk stops once every failing SLO metric stayed within 1% over this many halvings of the rate
(:func:`at_zero_load`): the latency no longer falls with the load, so no lower rate meets the SLO (an SLO below
the zero-load latency ran 17 simulations down to 1/65536 of the rate)."""
STABILITY = "stability"
REJECTED = "rejected"     # a point where requests were rejected beyond those that can never fit one replica


class UnservableWorkloadError(ValueError):
    """The workload holds requests that can never be served on one replica (the message says how many and
    why); a capacity search proceeds only when the user accepts that (``allow_rejected``)."""


def unservable_reasons(config: SimConfig, trace: pd.DataFrame) -> list[str]:
    """Per request of ``trace``, why one replica of ``config`` can never serve it whatever the load (``""``
    when it can; :func:`sim.core.lifecycle.unservable_reason`: longer than a slot or than the usable page pool)."""
    from sim.core.lifecycle import unservable_reason
    from sim.memory import build_policy

    policy_config = build_policy(config).config
    final_kv = (trace["prompt_tokens"] + trace["output_tokens"] - 1).to_numpy()
    return [unservable_reason(policy_config, int(tokens)) for tokens in final_kv]


def unservable_requests(config: SimConfig, trace: pd.DataFrame) -> dict[str, int]:
    """Reason -> number of requests of ``trace`` that one replica of ``config`` can never serve."""
    return dict(Counter(filter(None, unservable_reasons(config, trace))))


def unservable_line(counts: dict[str, int], total: int) -> str:
    """``200 of 400 requests (50.0%) can never be served on one replica: 200 need more KV ...``."""
    from sim.results.records import REJECT_REASONS

    rejected = sum(counts.values())
    reasons = "; ".join(f"{n:,} need {REJECT_REASONS[reason]}" for reason, n in sorted(counts.items()))
    return (f"{rejected:,} of {total:,} requests ({rejected / total:.1%}) can never be served on one replica "
            f"({reasons})")


def check_servable(config: SimConfig, trace: pd.DataFrame, allow_rejected: bool) -> list[str]:
    """Per-request reasons (:func:`unservable_reasons`).

    Raises:
        UnservableWorkloadError: when some request can never be served and ``allow_rejected`` is false.
    """
    reasons = unservable_reasons(config, trace)
    counts = Counter(filter(None, reasons))
    if counts and not allow_rejected:
        raise UnservableWorkloadError(unservable_line(dict(counts), len(trace)) + "; the capacity would count "
                                      "only the others: pass --allow-rejected to accept that")
    return reasons


@dataclass(frozen=True)
class Evaluation:
    """One simulated point of the search.

    Attributes:
        scale: arrival-rate multiplier applied to the base trace.
        rate_per_s: offered request rate at this scale (requests/s).
        values_us: SLO metric -> measured value (us; ``slo_attainment``: the share of requests meeting every
            per-request objective).
        ttft_growth: TTFT slope over arrival time in the steady state, s/s (see :mod:`analysis.planning.slo`).
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
    unservable: dict = field(default_factory=dict)   # reason -> requests rejected at every rate (accepted)
    served_fraction: float = 1.0                     # share of the trace's requests that can be served
    num_requests: int = 0                            # requests in the trace

    @property
    def rate_per_s(self) -> float:
        """Capacity in served requests/s per replica (0 when no scale passed); requests that can never be
        served (:attr:`unservable`) are not counted."""
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

    @property
    def span_at_capacity_s(self) -> float:
        """Seconds the trace's requests span at the capacity's arrival rate: ``(n - 1) / (base rate x scale)``
        (NaN without a passing point)."""
        if self.best is None or self.num_requests < 2 or not self.base_rate_per_s > 0:
            return float("nan")
        return (self.num_requests - 1) / (self.base_rate_per_s * self.best.scale)

    @property
    def short_span_warning(self) -> str | None:
        """A warning when :attr:`span_at_capacity_s` is below :data:`MIN_STEADY_SPAN_S`, else None."""
        span = self.span_at_capacity_s
        if not span < MIN_STEADY_SPAN_S:
            return None
        return (f"the {self.num_requests:,} requests span only {span:,.0f} s at this rate, less than the "
                f"{MIN_STEADY_SPAN_S:.0f} s a performance run lasts at least (MLPerf Inference, server scenario): a "
                "queue that builds more slowly goes unseen and the capacity reads high (docs/capacity.md, "
                "\"Short traces\"); give more requests (--num-requests) before planning on it")

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
                  "base_rate_per_s": self.base_rate_per_s, "served_fraction": self.served_fraction,
                  "unservable_requests": int(sum(self.unservable.values())),
                  "capacity_is_lower_bound": self.best is not None and self.above is None,
                  "num_requests": self.num_requests, "span_at_capacity_s": self.span_at_capacity_s}
        if self.best:
            record.update({f"at_capacity_{k}": v for k, v in self.best.summary.items()})
        return record


MIN_STEADY_SPAN_S = 600.0
"""The shortest span of simulated arrivals at capacity that is taken as steady state: the minimum duration of an
MLPerf Inference performance run (``min_duration`` 600 s, server scenario; MLCommons inference policies,
``mlperf.conf``). A capacity found on a shorter span is printed with :attr:`CapacityResult.short_span_warning`."""


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
          stability_tol: float = DEFAULT_STABILITY_TOL, allowed_rejected: int = 0,
          requests: pd.DataFrame | None = None) -> Evaluation:
    """Apply the SLOs, the stability criterion and the rejection check (no more rejected requests than the
    ``allowed_rejected`` that can never fit) to one run's summary; violated ones tightest first.

    With an attainment objective (:class:`analysis.planning.slo.SloAttainment`) the run's ``requests`` table
    gives the share of requests meeting every per-request objective, the ``allowed_rejected`` requests left out
    of the denominator (:func:`analysis.planning.slo.attainment_of`); it and the goodput join the evaluation's
    summary (:func:`analysis.results.goodput_figures`).

    Raises:
        ValueError: an attainment objective without the ``requests`` table.
    """
    if any(isinstance(slo, SloAttainment) for slo in slos):
        if requests is None:
            raise ValueError("an --slo-attainment objective is judged on the run's request table; none was given")
        summary = {**summary, **goodput_figures(requests, slos, summary.get("makespan_s", 0.0), allowed_rejected)}
    values_us = {slo.metric: slo.value_us(summary) for slo in slos}
    excess = {slo.metric: slo.excess(summary) for slo in slos if not slo.holds(summary)}
    if growth > stability_tol:
        excess[STABILITY] = _excess(growth / stability_tol)
    if summary.get("rejected", 0) > allowed_rejected:
        excess[REJECTED] = math.inf
    failed = tuple(sorted(excess, key=lambda name: -excess[name]))
    return Evaluation(scale, rate_per_s, values_us, growth, failed, summary)


def _excess(ratio: float) -> float:
    return math.inf if math.isnan(ratio) else ratio


class ScaleEvaluator:
    """``scale -> Evaluation``: simulates the trace at ``scale`` times its rate and judges it; the rate counts
    served requests only (``scale x base rate x finished / requests``). A plain object, so that a process
    pool can run it (:func:`search_capacity` with ``workers``)."""

    def __init__(self, config: SimConfig, trace: pd.DataFrame, slos: tuple[Slo, ...], profile_path: str | None,
                 stability_tol: float, allowed_rejected: int):
        self.config, self.trace, self.slos, self.profile_path = config, trace, slos, profile_path
        self.stability_tol, self.allowed_rejected = stability_tol, allowed_rejected
        self.base_rate = base_rate_per_s(trace)

    def __call__(self, scale: float) -> Evaluation:
        scaled = traces.scale_rate(self.trace, scale) if scale != 1.0 else self.trace
        result = runner.run_simulation(self.config, scaled, self.profile_path)
        requests = result.summary.get("requests", 0)
        served = result.summary.get("finished", requests) / requests if requests else 1.0
        return judge(scale, scale * self.base_rate * served, result.summary, ttft_growth(result.requests),
                     self.slos, self.stability_tol, self.allowed_rejected, result.requests)


def make_evaluator(config: SimConfig, trace: pd.DataFrame, slos: tuple[Slo, ...], profile_path: str | None = None,
                   stability_tol: float = DEFAULT_STABILITY_TOL,
                   allowed_rejected: int = 0) -> Callable[[float], Evaluation]:
    """A function ``scale -> Evaluation`` that simulates ``trace`` at ``scale`` times its rate
    (:class:`ScaleEvaluator`)."""
    return ScaleEvaluator(config, trace, slos, profile_path, stability_tol, allowed_rejected)


def at_zero_load(steps) -> bool:
    """Whether the last :data:`ZERO_LOAD_HALVINGS` + 1 evaluations all failed on SLO metrics only (no stability or
    rejection failure) whose values stayed within 1% of each other: the failure is the zero-load latency."""
    tail = list(steps)[-(ZERO_LOAD_HALVINGS + 1):]
    if len(tail) <= ZERO_LOAD_HALVINGS or any(e.passed for e in tail):
        return False
    metrics = tail[-1].failed
    if not metrics or any(m not in e.values_us for m in metrics for e in tail):
        return False
    for metric in metrics:
        values = [e.values_us[metric] for e in tail]
        if any(v != v for v in values) or max(values) > 1.01 * min(values):
            return False
    return True


def zero_load_line(steps) -> str | None:
    """Why a search that found no capacity stopped early (:func:`at_zero_load`), or None."""
    if not at_zero_load(steps):
        return None
    last = list(steps)[-1]
    shown = ", ".join(f"{m} {last.values_us[m]:.1%}" if m == "slo_attainment" else
                      f"{m} {last.values_us[m] / 1000:.4g} ms" for m in last.failed)
    return (f"{shown} stays the same as the rate falls {2 ** ZERO_LOAD_HALVINGS}-fold: that is the latency at zero "
            "load, and no rate meets the SLO")


def _bracket(evaluate: Callable[[float], Evaluation], start_scale: float, steps: list,
             prefetch: Callable[[list[float]], None] = lambda scales: None, width: int = 1) -> tuple:
    """Double (or halve) the scale from ``start_scale`` until pass/fail flips; returns (lo, hi) evaluations,
    either of which is None when the bracket ran out of steps. ``prefetch`` is told the next ``width``
    scales the walk may need (speculation; the walk itself is unchanged)."""
    prefetch([start_scale] + ([start_scale * 2.0, start_scale * 0.5] if width >= 3 else []))
    first = evaluate(start_scale)
    steps.append(first)
    factor = 2.0 if first.passed else 0.5
    previous = first
    for _ in range(MAX_BRACKET_STEPS):
        ahead, scale = [], previous.scale
        for _ in range(width):
            scale *= factor                      # powers of two: the same floats the walk computes
            ahead.append(scale)
        prefetch(ahead)
        current = evaluate(previous.scale * factor)
        steps.append(current)
        if current.passed != previous.passed:
            return (previous, current) if first.passed else (current, previous)
        if not first.passed and at_zero_load(steps):
            return None, current
        previous = current
    return (previous, None) if first.passed else (None, previous)


def _bisection_tree(lo: float, hi: float, depth: int) -> list[float]:
    """The geometric midpoints the next ``depth`` bisection steps may need (breadth first)."""
    scales, level = [], [(lo, hi)]
    for _ in range(depth):
        following = []
        for low, high in level:
            middle = math.sqrt(low * high)
            scales.append(middle)
            following += [(low, middle), (middle, high)]
        level = following
    return scales


def search_capacity(evaluate: Callable[[float], Evaluation], slos: tuple[Slo, ...], tolerance: float = 0.02,
                    start_scale: float = 1.0, base_rate: float = 1.0,
                    on_step: Callable[[Evaluation], None] | None = None,
                    evaluate_many: Callable[[list[float]], list[Evaluation]] | None = None,
                    width: int = 1) -> CapacityResult:
    """Exponential bracket, then geometric bisection on the scale until ``hi / lo - 1 <= tolerance``.

    With ``evaluate_many`` and ``width`` > 1 the search evaluates the points it may need next several at a
    time (the next ``width`` bracket scales; the midpoints of the next bisection levels, 3 points for two
    levels at ``width`` >= 3, 7 for three at >= 7; at ``width`` 2 the midpoint and the one after it should it
    pass) and then walks exactly the serial path through them: the
    simulator is deterministic, so the answer and the recorded steps equal the serial search's; points off
    the path are computed and discarded.

    Args:
        evaluate: ``scale -> Evaluation`` (e.g. :func:`make_evaluator`).
        slos: the objectives (recorded in the result).
        tolerance: relative width of the final bracket (0.02 = the capacity is within 2% below the true
            boundary).
        start_scale: first scale tried.
        base_rate: requests/s of the unscaled trace (recorded in the result).
        on_step: called with each evaluation on the serial path, in order (progress printing).
        evaluate_many: ``scales -> evaluations`` in parallel (e.g. a process pool's map of ``evaluate``).
        width: how many points to evaluate at once.

    Raises:
        ValueError: for a tolerance outside (0, 1) or a start scale <= 0.
    """
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance (--tolerance) must lie in (0, 1), got {tolerance}")
    if not start_scale > 0:
        raise ValueError(f"start scale must be > 0, got {start_scale}")
    steps: list[Evaluation] = []
    cache: dict[float, Evaluation] = {}
    width = width if evaluate_many is not None else 1

    def prefetch(scales: list[float]) -> None:
        todo = [scale for scale in dict.fromkeys(scales) if scale not in cache]
        if len(todo) > 1:
            cache.update(zip(todo, evaluate_many(todo)))

    def tracked(scale: float) -> Evaluation:
        evaluation = cache.pop(scale) if scale in cache else evaluate(scale)
        if on_step:
            on_step(evaluation)
        return evaluation

    lo, hi = _bracket(tracked, start_scale, steps, prefetch, width)
    depth = max(1, int(math.log2(width + 1)))
    while lo is not None and hi is not None and hi.scale / lo.scale - 1 > tolerance:
        if width == 2:     # the midpoint and the next one if it passes (the more common branch near capacity)
            middle_scale = math.sqrt(lo.scale * hi.scale)
            prefetch([middle_scale, math.sqrt(middle_scale * hi.scale)])
        else:
            prefetch(_bisection_tree(lo.scale, hi.scale, depth))
        middle = tracked(math.sqrt(lo.scale * hi.scale))
        steps.append(middle)
        lo, hi = (middle, hi) if middle.passed else (lo, middle)
    return CapacityResult(tuple(slos), tolerance, base_rate, tuple(steps), lo, hi)


def capacity_result(search: CapacityResult, trace: pd.DataFrame, reasons: list[str]) -> CapacityResult:
    """A search's result with the workload's figures: mean output and prompt + output tokens of the servable
    requests, the unservable ones by reason (``reasons``: one per request, ``""`` when servable), the served
    share and the request count."""
    servable = trace[[not reason for reason in reasons]]
    output_tokens = float(servable["output_tokens"].mean())
    total_tokens = output_tokens + float(servable["prompt_tokens"].mean())
    return CapacityResult(search.slos, search.tolerance, search.base_rate_per_s, search.steps, search.best,
                          search.above, output_tokens, total_tokens, dict(Counter(filter(None, reasons))),
                          len(servable) / len(trace), len(trace))


def _slo_tuple(slos) -> tuple[Slo, ...]:
    """``slos`` as a tuple of objectives: a text (``"ttft_p99=2s,tpot_p99=100ms"``, parsed as ``--slo`` is) or
    objective objects (:class:`Slo`, :class:`analysis.planning.slo.SloAttainment`); at least one.

    Raises:
        ValueError: no objective, or a text that is not one. TypeError: something else.
    """
    from analysis.planning.slo import parse_slos
    if isinstance(slos, str):
        return parse_slos(slos)
    if not isinstance(slos, (list, tuple)) or any(isinstance(slo, (str, int, float)) for slo in slos):
        raise TypeError(f"slos: expected objectives (Slo, SloAttainment) or a text such as "
                        f"'ttft_p99=2s,tpot_p99=100ms', got {slos!r}")
    slos = tuple(slos)
    if not slos:
        raise ValueError("slos: capacity needs at least one objective, e.g. 'ttft_p99=2s,tpot_p99=100ms'")
    return slos


def find_capacity(config: SimConfig, trace: pd.DataFrame, slos, tolerance: float = 0.02,
                  profile_path: str | None = None, stability_tol: float = DEFAULT_STABILITY_TOL,
                  on_step: Callable[[Evaluation], None] | None = None,
                  allow_rejected: bool = False, workers: int = 1) -> CapacityResult:
    """Capacity of one replica under ``config`` for the workload ``trace`` (see the module docstring),
    counting served requests only.

    ``workers`` > 1 evaluates candidate scales in parallel on a local process pool, with the serial answer
    (:func:`search_capacity`).

    ``slos``: :class:`Slo` objects, or their text as ``--slo`` takes it (``"ttft_p99=2s,tpot_p99=100ms"``).

    Raises:
        ValueError / TypeError: no objective, or ``slos`` of another kind.
        UnservableWorkloadError: when some requests can never be served on one replica (how many and why)
            and ``allow_rejected`` is false; with it, those requests are left out of the capacity (and
            recorded in :attr:`CapacityResult.unservable`) and any further rejection fails a point.
    """
    slos = _slo_tuple(slos)
    reasons = check_servable(config, trace, allow_rejected)
    unservable = dict(Counter(filter(None, reasons)))
    evaluate = make_evaluator(config, trace, slos, profile_path, stability_tol, sum(unservable.values()))
    base_rate = base_rate_per_s(trace)
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(max_workers=workers) as pool:
            result = search_capacity(evaluate, slos, tolerance, base_rate=base_rate, on_step=on_step,
                                     evaluate_many=lambda scales: list(pool.map(evaluate, scales)), width=workers)
    else:
        result = search_capacity(evaluate, slos, tolerance, base_rate=base_rate, on_step=on_step)
    return capacity_result(result, trace, reasons)
