"""The summary of a disaggregated run (:mod:`sim.cluster.disagg`): the deployment's figures over all requests
(the co-located summary of :func:`sim.results.summary.summarize` over the merged tables, the P:D figures, the
KV transfers) and each instance's own (:func:`instance_figures`); :func:`disagg_run_result` turns a
:class:`sim.cluster.disagg.DisaggRun` into a :class:`sim.results.summary.RunResult`. Annotations name
``DisaggConfig`` / ``DisaggRun`` of :mod:`sim.cluster.disagg`, which imports this module (not the reverse).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from sim.units import US_PER_MS

_ADDITIVE_KEYS = ("map_page_groups", "unmap_page_groups", "map_calls", "unmap_calls", "swap_out_bytes",
                  "swap_in_bytes", "swap_refused_preemptions", "swap_total_ms", "pool_bytes", "peak_mapped_bytes",
                  "mapping_critical_ms")


def _stats_ms(values_us, name: str) -> dict:
    finite = np.asarray(values_us, dtype=float)
    finite = finite[np.isfinite(finite)]
    out = {f"{name}_p{q}_ms": float(np.percentile(finite, q) / US_PER_MS) if len(finite) else math.nan
           for q in (50, 90, 99)}
    out[f"{name}_mean_ms"] = float(finite.mean() / US_PER_MS) if len(finite) else math.nan
    out[f"{name}_max_ms"] = float(finite.max() / US_PER_MS) if len(finite) else math.nan
    return out


def instance_figures(result, instance, span_us: float) -> dict:
    """One instance's utilisation, queueing and memory.

    ``utilisation`` = time in iterations / the run's span (first arrival to last completion); ``compute_share``
    = time computing / span; ``queue_delay_*_ms`` = arrival at the instance (hand-over for a decode instance)
    to its first scheduling there, over the requests it served; ``mean_waiting`` = requests waiting per
    iteration, mean over iterations; memory per tensor-parallel worker.
    """
    iterations, summary, config = result.iterations, result.summary, result.config
    group_bytes = config["page_group_bytes"]
    served = result.requests[result.requests["status"] == "finished"]
    busy_us = float(iterations["duration_us"].sum()) if len(iterations) else 0.0
    figures = {
        "role": instance.role, "instance": instance.index, "tp": int(config["tp"]), "policy": config["label"],
        "requests": int(len(result.requests)), "iterations": int(len(iterations)),
        "utilisation": busy_us / span_us if span_us > 0 else math.nan,
        "compute_share": float(iterations["compute_us"].sum()) / span_us if span_us > 0 and len(iterations) else 0.0,
        "mean_batch_size": summary["mean_batch_size"],
        "mean_waiting": float(iterations["num_waiting"].mean()) if len(iterations) else 0.0,
        **{k.replace("sched_delay", "queue_delay"): v for k, v in _stats_ms(served["sched_delay_us"],
                                                                            "sched_delay").items()},
        "peak_mapped_bytes": summary["peak_mapped_bytes"], "pool_bytes": summary["pool_bytes"],
        "mean_used_bytes": float(iterations["used_page_groups"].mean() * group_bytes) if len(iterations) else 0.0,
        "preemptions": summary["preemptions"], "sync_stall_total_ms": summary["sync_stall_total_ms"],
        "kv_bytes_sent": int(getattr(instance, "kv_bytes_sent", 0)),
        "kv_bytes_received": int(getattr(instance, "kv_bytes_received", 0)),
    }
    return figures


def summarize_disagg(config: DisaggConfig, requests: pd.DataFrame, iterations: pd.DataFrame, instances: list,
                     tbt: dict, simulators: list) -> dict:
    """The run summary: the co-located summary's keys over the whole deployment (latencies from the merged
    request table; counters summed over instances, ``peak_mapped_bytes`` and ``pool_bytes`` as sums of each
    instance's own), then the deployment (``pd``, ``gpus``), the transfers (``kv_transfer_bytes``,
    ``kv_transfer_*_ms``: link time, latency included; ``kv_handover_*_ms``: prefill end to landing), flat
    per-role figures (``prefill_utilisation``, ``decode_queue_delay_p99_ms``, ...) and the nested tables
    ``roles`` and ``instances`` (:func:`instance_figures`)."""
    from sim.results.summary import summarize

    counters = {"sync_map_page_groups": 0, "sync_unmap_page_groups": 0, "bg_map_page_groups": 0,
                "bg_unmap_page_groups": 0, "pool_page_groups": 0, **tbt}
    decode_dict = config.decode.to_dict()
    summary = summarize(requests, iterations, counters, decode_dict)
    for key in _ADDITIVE_KEYS:
        summary[key] = sum(result.summary.get(key, 0) for result in instances)
    maps = summary["map_page_groups"]
    background = sum(r.summary["map_page_groups"] * np.nan_to_num(r.summary["background_map_share"]) for r in instances)
    summary["background_map_share"] = background / maps if maps else math.nan
    summary["mapping_worker_ms"] = []
    finished = requests[requests["status"] == "finished"]
    moved = finished[finished["kv_transfer_bytes"] > 0]
    start_us = float(requests["arrival_at_us"].min()) if len(requests) else 0.0
    end_us = float(finished["completion_at_us"].max()) if len(finished) else start_us
    span_us = max(end_us - start_us, 1e-3)
    per_instance = [instance_figures(result, sim, span_us) for result, sim in zip(instances, simulators)]
    roles = {}
    for role, role_config, count in (("prefill", config.prefill, config.num_prefill),
                                     ("decode", config.decode, config.num_decode)):
        rows = [row for row in per_instance if row["role"] == role]
        delays = (finished["first_scheduled_at_us"] - finished["arrival_at_us"] if role == "prefill"
                  else finished["decode_admitted_at_us"] - finished["prefill_done_at_us"])
        if role == "decode" and config.streaming:      # handed over when the prefill starts
            delays = finished["decode_admitted_at_us"] - finished["first_scheduled_at_us"]
        roles[role] = {
            "instances": count, "tp": role_config.tp, "gpus": count * role_config.tp, "policy": role_config.label,
            "utilisation_mean": float(np.mean([r["utilisation"] for r in rows])),
            "utilisation_max": float(np.max([r["utilisation"] for r in rows])),
            "compute_share_mean": float(np.mean([r["compute_share"] for r in rows])),
            **{k.replace("sched_delay", "queue_delay"): v for k, v in _stats_ms(delays, "sched_delay").items()},
            "mean_waiting": float(np.mean([r["mean_waiting"] for r in rows])),
            "peak_mapped_bytes_max": int(max(r["peak_mapped_bytes"] for r in rows)),
            "pool_bytes_per_instance": int(rows[0]["pool_bytes"]),
            "preemptions": int(sum(r["preemptions"] for r in rows)),
            "iterations": int(sum(r["iterations"] for r in rows)),
            "mean_batch_size": float(np.mean([r["mean_batch_size"] for r in rows])),
        }
    summary.update({
        "disaggregated": True, "pd": config.pd, "gpus": config.gpus, "prefill_gpus": config.prefill_gpus,
        "decode_gpus": config.decode_gpus, "kv_link": config.link.name, "kv_stream": "layerwise" if config.streaming else "off",
        "throughput_req_per_s_per_gpu": summary["throughput_req_per_s"] / config.gpus,
        "kv_transfer_bytes": int(requests["kv_transfer_bytes"].sum()), "kv_transfers": int((requests["kv_transfer_bytes"] > 0).sum()),
        **_stats_ms(moved["kv_transfer_us"], "kv_transfer"), **_stats_ms(moved["kv_handover_us"], "kv_handover"),
    })
    for role, table in roles.items():
        summary.update({f"{role}_{key}": value for key, value in table.items()
                        if key in ("utilisation_mean", "queue_delay_p50_ms", "queue_delay_p99_ms", "peak_mapped_bytes_max",
                                   "preemptions", "mean_batch_size")})
    summary["roles"] = roles
    summary["instances"] = {f"{row['role']}{row['instance']}": row for row in per_instance}
    return summary


def disagg_run_result(run: DisaggRun, trace_source: str = ""):
    """The run as an :class:`analysis.results.RunResult` (``write_run`` writes its directory: requests and
    iterations with the extra columns, the summary with the per-role tables, ``config.json`` with both roles)."""
    from sim.results.summary import RunResult

    config = {**run.config.to_dict(), "trace_source": trace_source,
              "instances": [result.config for result in run.instances]}
    return RunResult(run.requests, run.iterations, run.summary, config)
