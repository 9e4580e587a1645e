"""Capacity of disaggregated deployments and the search over P:D ratios (and tensor parallelism per role).

A deployment's capacity is found exactly as one replica's (:mod:`analysis.planning.capacity`): the trace's
arrival rate is scaled until the SLOs or the queue's stability fail, bracketing then bisecting; here the
simulated system is the whole deployment of P prefill and D decode instances (:mod:`sim.cluster.disagg`), so the
capacity is in served requests/s for ``P * tp_prefill + D * tp_decode`` GPUs. **Goodput per GPU** is that
capacity divided by the GPUs (DistServe, Zhong et al. OSDI'24, section 2: "per-GPU goodput", the request rate
served within the SLOs per GPU), the figure that ranks deployments of different sizes; a co-located replica's
is its capacity over its tensor-parallel degree.

:func:`search_deployments` evaluates, within a GPU budget, co-located deployments of ``R`` replicas at each
tensor-parallel degree (behind least-outstanding routing, co-simulated: :func:`sim.cluster.routing.run_routed`) and
every P:D with every degree per role, and ranks them by goodput per GPU. Deployments are compared at equal GPU
counts as well: more instances absorb bursts better (a router spreads a burst over more queues), so a 4-GPU
P:D deployment is weighed against 4 co-located replicas, not against one. For a target rate R a deployment
is replicated as a unit: ``ceil(R / capacity)`` units.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from analysis.planning.capacity import (CapacityResult, Evaluation, UnservableWorkloadError, base_rate_per_s,
                                        capacity_result, find_capacity, judge, search_capacity, unservable_line)
from analysis.planning.slo import DEFAULT_STABILITY_TOL, Slo, ttft_growth

STALLED = "stalled"      # a failed point: the deployment stalled (sim.cluster.disagg.DisaggStallError)


def disagg_unservable_reasons(config, trace: pd.DataFrame) -> list[str]:
    """Per request, why the deployment ``config`` (:class:`sim.cluster.disagg.DisaggConfig`) can never serve it: its
    prompt exceeds a prefill instance's slot or pool, or its last KV a decode instance's (``""`` if it can)."""
    from sim.core.lifecycle import unservable_reason
    from sim.memory import build_policy

    prefill, decode = build_policy(config.prefill).config, build_policy(config.decode).config
    reasons = []
    for prompt, output in zip(trace["prompt_tokens"].to_numpy(), trace["output_tokens"].to_numpy()):
        reason = unservable_reason(prefill, int(prompt))
        if not reason and output > 1:
            reason = unservable_reason(decode, int(prompt + output - 1))
        reasons.append(reason)
    return reasons


def make_disagg_evaluator(config, trace: pd.DataFrame, slos: tuple[Slo, ...], profile_path: str | None = None,
                          stability_tol: float = DEFAULT_STABILITY_TOL,
                          allowed_rejected: int = 0) -> Callable[[float], Evaluation]:
    """``scale -> Evaluation``: the deployment serving ``trace`` at ``scale`` times its rate; the rate counts
    served requests only, over the whole deployment."""
    import traces
    from sim.cluster.disagg import DisaggStallError, run_disagg

    base_rate = base_rate_per_s(trace)

    def evaluate(scale: float) -> Evaluation:
        scaled = traces.scale_rate(trace, scale) if scale != 1.0 else trace
        try:
            run = run_disagg(config, scaled, profile_path)
        except DisaggStallError:      # pools full in a cycle at this load: the point fails
            return Evaluation(scale, scale * base_rate, {slo.metric: math.nan for slo in slos}, math.inf, (STALLED,))
        requests = run.summary.get("requests", 0)
        served = run.summary.get("finished", requests) / requests if requests else 1.0
        return judge(scale, scale * base_rate * served, run.summary, ttft_growth(run.requests), slos, stability_tol,
                     allowed_rejected, run.requests)
    return evaluate


def find_disagg_capacity(config, trace: pd.DataFrame, slos: tuple[Slo, ...], tolerance: float = 0.02,
                         profile_path: str | None = None, stability_tol: float = DEFAULT_STABILITY_TOL,
                         on_step: Callable[[Evaluation], None] | None = None, allow_rejected: bool = False,
                         start_scale: float = 1.0) -> CapacityResult:
    """Capacity of the whole deployment ``config`` (served requests/s) for ``trace`` under ``slos``.

    Raises:
        UnservableWorkloadError: requests that no instance of one role can ever hold, unless ``allow_rejected``.
    """
    reasons = disagg_unservable_reasons(config, trace)
    counts = Counter(filter(None, reasons))
    if counts and not allow_rejected:
        raise UnservableWorkloadError(unservable_line(dict(counts), len(trace)).replace("one replica", "the deployment")
                                      + "; the capacity would count only the others: pass --allow-rejected to accept that")
    evaluate = make_disagg_evaluator(config, trace, slos, profile_path, stability_tol, sum(counts.values()))
    base_rate = base_rate_per_s(trace)
    result = search_capacity(evaluate, slos, tolerance, start_scale=start_scale, base_rate=base_rate, on_step=on_step)
    return capacity_result(result, trace, reasons)


@dataclass(frozen=True)
class Deployment:
    """One candidate: ``replicas`` co-located replicas at ``tp`` (``num_prefill = num_decode = 0``), or P:D with
    a tensor-parallel degree per role."""

    num_prefill: int = 0
    num_decode: int = 0
    prefill_tp: int = 1
    decode_tp: int = 1
    tp: int = 1
    replicas: int = 1

    @property
    def colocated(self) -> bool:
        return self.num_prefill == 0

    @property
    def gpus(self) -> int:
        if self.colocated:
            return self.replicas * self.tp
        return self.num_prefill * self.prefill_tp + self.num_decode * self.decode_tp

    @property
    def label(self) -> str:
        if self.colocated:
            return f"co-located {self.replicas} x tp{self.tp}"
        return f"P:D {self.num_prefill}:{self.num_decode} tp{self.prefill_tp}/tp{self.decode_tp}"


def candidate_deployments(max_gpus: int, tps: list[int]) -> list[Deployment]:
    """Co-located deployments of 1, 2, ... replicas at each degree of ``tps``, then every P:D with a degree of
    ``tps`` per role, all within ``max_gpus`` GPUs (each group ordered by GPUs)."""
    colocated = [Deployment(tp=tp, replicas=r) for tp in tps for r in range(1, max_gpus // tp + 1)]
    colocated.sort(key=lambda c: (c.gpus, c.tp))
    pd_list = []
    for prefill_tp in tps:
        for decode_tp in tps:
            for num_prefill in range(1, max_gpus + 1):
                for num_decode in range(1, max_gpus + 1):
                    candidate = Deployment(num_prefill, num_decode, prefill_tp, decode_tp)
                    if candidate.gpus <= max_gpus:
                        pd_list.append(candidate)
    pd_list.sort(key=lambda c: (c.gpus, c.num_prefill, c.num_decode, c.prefill_tp, c.decode_tp))
    return colocated + pd_list


def find_colocated_capacity(config, trace: pd.DataFrame, replicas: int, slos: tuple[Slo, ...],
                            tolerance: float = 0.02, profile_path: str | None = None,
                            stability_tol: float = DEFAULT_STABILITY_TOL,
                            on_step: Callable[[Evaluation], None] | None = None, allow_rejected: bool = False,
                            start_scale: float = 1.0) -> CapacityResult:
    """Capacity (served requests/s) of ``replicas`` co-located replicas of ``config`` behind least-outstanding
    routing, co-simulated (:func:`sim.cluster.routing.run_routed`); one replica is :func:`find_capacity`.

    Raises:
        UnservableWorkloadError: as :func:`find_capacity`.
    """
    if replicas == 1:
        return find_capacity(config, trace, slos, tolerance, profile_path, stability_tol, on_step,
                             allow_rejected=allow_rejected)
    import traces
    from analysis.planning.capacity import check_servable
    from sim.cluster.routing import run_routed

    reasons = check_servable(config, trace, allow_rejected)
    counts = Counter(filter(None, reasons))
    base_rate = base_rate_per_s(trace)

    def evaluate(scale: float) -> Evaluation:
        scaled = traces.scale_rate(trace, scale) if scale != 1.0 else trace
        routed = run_routed(config, scaled, replicas, "least-outstanding", profile_path)
        requests = routed.summary.get("requests", 0)
        served = routed.summary.get("finished", requests) / requests if requests else 1.0
        return judge(scale, scale * base_rate * served, routed.summary, ttft_growth(routed.requests), slos,
                     stability_tol, sum(counts.values()), routed.requests)

    result = search_capacity(evaluate, slos, tolerance, start_scale=start_scale, base_rate=base_rate, on_step=on_step)
    return capacity_result(result, trace, reasons)


@dataclass(frozen=True)
class DeploymentResult:
    """A candidate and its capacity (``error``: why it could not be evaluated, e.g. a tp the model refuses)."""

    deployment: Deployment
    capacity: CapacityResult | None
    error: str = ""

    @property
    def rate_per_s(self) -> float:
        return self.capacity.rate_per_s if self.capacity else 0.0

    @property
    def per_gpu(self) -> float:
        """Goodput per GPU: served requests/s under the SLOs per GPU."""
        return self.rate_per_s / self.deployment.gpus

    def units_for(self, target_rate_per_s: float) -> int | None:
        """Copies of the deployment needed for ``target_rate_per_s`` (None: no capacity)."""
        return self.capacity.replicas_for(target_rate_per_s) if self.capacity and self.rate_per_s > 0 else None

    def to_dict(self, target_rate_per_s: float | None = None) -> dict:
        d = self.deployment
        record = {"deployment": d.label, "colocated": d.colocated, "num_prefill": d.num_prefill,
                  "num_decode": d.num_decode, "prefill_tp": d.prefill_tp, "decode_tp": d.decode_tp, "tp": d.tp,
                  "replicas": d.replicas if d.colocated else 0,
                  "gpus": d.gpus, "capacity_req_per_s": self.rate_per_s, "capacity_req_per_s_per_gpu": self.per_gpu,
                  "binding": self.capacity.binding if self.capacity else "", "error": self.error,
                  "search_steps": len(self.capacity.steps) if self.capacity else 0,
                  "span_at_capacity_s": self.capacity.span_at_capacity_s if self.capacity else math.nan}
        if self.capacity and self.capacity.best:
            summary = self.capacity.best.summary
            for key in ("ttft_p99_ms", "tpot_p99_ms", "tbt_p99_ms", "kv_handover_p99_ms", "prefill_utilisation_mean",
                        "decode_utilisation_mean"):
                record[f"at_capacity_{key}"] = summary.get(key, math.nan)
            for key in ("slo_attainment", "goodput_req_per_s"):      # with --slo-attainment only
                if key in summary:
                    record[f"at_capacity_{key}"] = summary[key]
        if target_rate_per_s:
            units = self.units_for(target_rate_per_s)
            record.update(target_rate_per_s=target_rate_per_s, units=units,
                          gpus_for_target=units * d.gpus if units else None)
        return record


def search_deployments(args, trace: pd.DataFrame, slos: tuple[Slo, ...], max_gpus: int, tps: list[int],
                       on_result: Callable[[DeploymentResult], None] | None = None,
                       on_step: Callable[[Deployment, Evaluation], None] | None = None) -> list[DeploymentResult]:
    """Capacity of every :func:`candidate_deployments` for ``trace`` (the options of ``args`` for everything
    else: model, GPU, policies, link, streaming, profile, tolerance, stability, allow_rejected). A search's
    bracket starts at the highest passing scale found so far for as many GPUs (or scaled up from fewer GPUs):
    fewer steps, the same bracketing from there. Returns the results in candidate order."""
    from sim.setup.catalog import CatalogError
    from sim.setup.config import ConfigError
    from sim.frontend.disagg_options import disagg_config_from_args, role_config

    results: list[DeploymentResult] = []
    scale_at_gpus: dict[int, float] = {}          # GPUs -> highest passing scale so far (bracket starts)

    def start_scale(gpus: int) -> float:
        if gpus in scale_at_gpus:
            return scale_at_gpus[gpus]
        smaller = [(g, s) for g, s in scale_at_gpus.items() if g < gpus]
        return max(s * gpus / g for g, s in smaller) if smaller else 1.0

    candidates = candidate_deployments(max_gpus, tps)
    if not candidates:
        raise ValueError(f"--pd-search {max_gpus}: no deployment fits {max_gpus} GPU(s) with --pd-tp "
                         f"{','.join(map(str, tps))} (a replica or instance needs tp GPUs)")
    for deployment in candidates:
        step = (lambda e, d=deployment: on_step(d, e)) if on_step else None
        start = start_scale(deployment.gpus)
        try:
            if deployment.colocated:
                config = role_config(args, "colocated", deployment.tp)
                capacity = find_colocated_capacity(config, trace, deployment.replicas, slos, args.tolerance,
                                                   args.profile, args.stability_tol, step, args.allow_rejected, start)
            else:
                config = disagg_config_from_args(args, f"{deployment.num_prefill}:{deployment.num_decode}",
                                                 deployment.prefill_tp, deployment.decode_tp)
                capacity = find_disagg_capacity(config, trace, slos, args.tolerance, args.profile, args.stability_tol,
                                                step, args.allow_rejected, start_scale=start)
            result = DeploymentResult(deployment, capacity)
        except (ConfigError, CatalogError) as exc:
            result = DeploymentResult(deployment, None, str(exc))
        if result.capacity and result.capacity.best:
            scale_at_gpus[deployment.gpus] = max(scale_at_gpus.get(deployment.gpus, 0.0), result.capacity.best.scale)
        results.append(result)
        if on_result:
            on_result(result)
    return results


def ranking_lines(results: list[DeploymentResult], target_rate_per_s: float | None = None) -> list[str]:
    """The table of candidates by goodput per GPU, the best disaggregated and co-located deployments at each GPU
    count and overall, how they compare, and (with a target) the fewest GPUs each kind needs for it (copies of
    one deployment)."""
    from analysis.disagg_report import format_table

    ranked = sorted((r for r in results if r.capacity), key=lambda r: -r.per_gpu)
    header = ("deployment", "GPUs", "capacity req/s", "per GPU", "binding", "TTFT p99 ms", "TPOT p99 ms")
    rows = []
    for r in ranked:
        summary = r.capacity.best.summary if r.capacity.best else {}
        rows.append((r.deployment.label, r.deployment.gpus, f"{r.rate_per_s:.3f}", f"{r.per_gpu:.3f}", r.capacity.binding
                     if r.capacity.best else "fails at every rate", f"{summary.get('ttft_p99_ms', math.nan):,.0f}",
                     f"{summary.get('tpot_p99_ms', math.nan):.1f}"))
    lines = ["deployments ranked by goodput per GPU (served req/s under the SLOs / GPUs):", *format_table(header, rows)]
    lines += [f"skipped {r.deployment.label}: {r.error}" for r in results if r.error]
    colocated = [r for r in ranked if r.deployment.colocated and r.rate_per_s > 0]
    disagg = [r for r in ranked if not r.deployment.colocated and r.rate_per_s > 0]
    for gpus in sorted({r.deployment.gpus for r in disagg} & {r.deployment.gpus for r in colocated}):
        c = next(r for r in colocated if r.deployment.gpus == gpus)
        d = next(r for r in disagg if r.deployment.gpus == gpus)
        lines.append(f"at {gpus} GPUs: best disaggregated {d.deployment.label} {d.per_gpu:.3f} vs best co-located "
                     f"{c.deployment.label} {c.per_gpu:.3f} req/s per GPU: {d.per_gpu / c.per_gpu - 1:+.1%}")
    best_c, best_d = (colocated[0] if colocated else None), (disagg[0] if disagg else None)
    if best_d:
        d = best_d.deployment
        lines.append(f"best disaggregated: {d.label}: {best_d.per_gpu:.3f} req/s per GPU ({best_d.rate_per_s:.3f} req/s "
                     f"on {d.num_prefill} prefill x tp{d.prefill_tp} + {d.num_decode} decode x tp{d.decode_tp} = "
                     f"{d.gpus} GPUs)")
    if best_c:
        lines.append(f"best co-located: {best_c.deployment.label}: {best_c.per_gpu:.3f} req/s per GPU "
                     f"({best_c.rate_per_s:.3f} req/s on {best_c.deployment.gpus} GPUs)")
    if best_c and best_d:
        ratio = best_d.per_gpu / best_c.per_gpu - 1
        lines.append(f"disaggregated vs co-located, best of each: {ratio:+.1%} goodput per GPU "
                     f"({'disaggregated is better' if ratio > 0 else 'co-located is better'})")
    if target_rate_per_s:      # per kind, the deployment that needs the fewest GPUs for the target
        def fewest_gpus(kind: list[DeploymentResult]) -> DeploymentResult | None:
            return min(kind, key=lambda r: (r.units_for(target_rate_per_s) * r.deployment.gpus, -r.per_gpu),
                       default=None)
        for r in filter(None, (fewest_gpus(disagg), fewest_gpus(colocated))):
            units = r.units_for(target_rate_per_s)
            d = r.deployment
            what = (f"{units} x {d.replicas} = {units * d.replicas} co-located replicas x tp{d.tp}" if d.colocated else
                    f"{units} x ({d.num_prefill}:{d.num_decode}) = {units * d.num_prefill * d.prefill_tp} prefill GPUs + "
                    f"{units * d.num_decode * d.decode_tp} decode GPUs")
            lines.append(f"for {target_rate_per_s:g} req/s: {what} = {units * d.gpus} GPUs")
    short = [r for r in ranked if r.capacity.short_span_warning]
    if short:             # the shortest span among the candidates: the capacity that most likely reads high
        shortest = min(short, key=lambda r: r.capacity.span_at_capacity_s)
        others = (f" (and {len(short) - 1} more of the {len(ranked)} deployments below 600 s: every deployment's "
                  "span_at_capacity_s is in --out's JSON)" if len(short) > 1 else "")
        lines.append(f"WARNING: {shortest.deployment.label}: {shortest.capacity.short_span_warning}{others}")
    return lines


__all__ = ["Deployment", "DeploymentResult", "candidate_deployments", "disagg_unservable_reasons",
           "find_colocated_capacity", "find_disagg_capacity", "make_disagg_evaluator", "ranking_lines", "search_deployments"]
