"""The tensor-parallel replay on rank 0: :func:`replay_tp`, the counterpart of
:func:`hwbackend.replay.cli.replay` (same loop, same records, same run directory).

One scheduler and ONE vAttention policy (:class:`hwbackend.replay.loop.ReplayLoop`, unchanged) drive every
rank's VMM executor through the two-phase tensor-parallel executor
(:class:`hwbackend.replay.tp.remote.RemoteTPExecutor`: worker 0 here, the others in their own processes),
and every rank computes its shard of each iteration (:mod:`hwbackend.replay.tp.peers`). Start-up::

    spawn ranks 1..tp-1 ─ join the process group (model runner) ─ hello (identities) ─ attention backend
    ─ warm-up (CUDA; every forward mirrored on every rank) ─ open the caches (one RemoteTPExecutor) and views
    ─ decode CUDA graphs on every rank (used only if every rank captured them) ─ ReplayLoop.run
    ─ synchronise every rank ─ close the caches ─ stop the peers
"""
from __future__ import annotations

import gc
import sys
import time
from typing import Any

import pandas as pd

from hwbackend.replay.loop import ReplayLoop
from hwbackend.replay.tp.peers import ComputeGroup, TPModel
from hwbackend.replay.tp.session import Peers, PeerSpec, make_cache, make_runner, open_tp_kv
from sim.memory import build_policy


def tp_warm_up(group: ComputeGroup, seconds: float) -> int:
    """The one-GPU warm-up (:func:`hwbackend.replay.cli.warm_up`: every shape twice, then rounds until
    ``seconds`` have passed), every forward posted to the peers first. Returns the forwards run."""
    from hwbackend.replay.cli import WARMUP_SHAPES

    started, runs = time.perf_counter(), 0
    while runs < 2 * len(WARMUP_SHAPES) or time.perf_counter() - started < seconds:
        for index in range(len(WARMUP_SHAPES)):
            group.post("warm", index)
            group.local.warm(index, True)
            runs += 1
    group.call_all("warm_done")
    return runs


def capture_tp_graphs(group: ComputeGroup, kv: Any, max_batch: int) -> dict:
    """Decode graphs on every rank over one scratch slot mapped on every rank; used only if every rank
    captured them. Returns the run metadata (``cuda_graphs``, ``graph_capture_s``, ``graph_capture_error``)."""
    slot = kv.executor.alloc_slot(1)
    if slot is None or not kv.executor.step({slot: max_batch}):
        return {"cuda_graphs": False, "graph_capture_error": "no slot or page group free for the capture"}
    try:
        statuses = group.call_all("capture", slot, max_batch)
    finally:
        kv.executor.iteration_launched(-1)
        kv.executor.free_slot(slot, -1)
    ok = all(status["ok"] for status in statuses)
    group.call_all("use_graphs", ok)
    meta: dict = {"cuda_graphs": ok, "graph_capture_s": max(status["seconds"] for status in statuses)}
    if not ok:
        meta["graph_capture_error"] = "; ".join(f"rank {rank}: {status['error']}"
                                                for rank, status in enumerate(statuses) if not status["ok"])
        print(f"replay: warning: CUDA graph capture failed, decodes run eagerly on every rank: "
              f"{meta['graph_capture_error']}", file=sys.stderr)
    return meta


def replay_tp(config: Any, trace: pd.DataFrame, spec: PeerSpec, attention: str = "auto", sleep=time.sleep,
              cuda_graphs: bool = True, warmup_s: float = 20.0, peer_mode: str = "process",
              exit_after_peer_loss_s: float | None = None) -> tuple[Any, dict]:
    """Replay ``trace`` under ``config`` (``config.tp == spec.tp``) on ``spec.tp`` ranks; returns the
    :class:`hwbackend.replay.loop.ReplayOutput` (rank 0's clock; its ``rank_launches`` attribute: every rank's
    launch times, :data:`LAUNCH_COLUMNS`) and the run metadata.

    Args:
        spec: every rank's :class:`PeerSpec` (devices, runner, backend, cache layout and pool).
        attention: ``auto`` (CUDA: varlen if it matches gather; CPU: reference) or a backend.
        peer_mode: ``process`` (the replay) or ``thread`` (CPU tests with the recording runner).
        exit_after_peer_loss_s: see :class:`Peers`.
    """
    if config.tp != spec.tp:
        raise ValueError(f"config tp {config.tp} but {spec.tp} ranks")
    peers = Peers(spec, peer_mode, exit_after_peer_loss_s)
    local = local_cache = None
    try:
        local = make_runner(spec, 0)
        local_cache = make_cache(spec, 0)
        local.attach_cache(local_cache)
        group = ComputeGroup(local, peers.channels)
        ranks = group.call_all("hello")
        backend, check = (local.choose_attention(attention) if hasattr(local, "choose_attention")
                          else (attention, {}))
        group.call_all("set_attention", backend)
        extra: dict = {"cuda_graphs": False}
        is_cuda = getattr(local, "is_cuda", False)
        if is_cuda:
            started = time.perf_counter()
            extra["warmup_forwards"] = tp_warm_up(group, warmup_s)
            extra["warmup_s"] = round(time.perf_counter() - started, 1)
        kv = open_tp_kv(build_policy(config), config.has_async_mapper, local_cache, peers, group,
                        getattr(local, "stream_handle", 0))
        try:
            if cuda_graphs and is_cuda and backend != "varlen":
                extra["graph_capture_error"] = f"decode graphs need the varlen attention backend, not {backend}"
                print(f"replay: warning: {extra['graph_capture_error']}; decodes run eagerly", file=sys.stderr)
            elif cuda_graphs and is_cuda:
                extra.update(capture_tp_graphs(group, kv, config.max_batch_slots))
            group.post("gc_off")  # on every peer too: a collection there would stall every rank's all-reduce
            gc.collect()
            gc.freeze()
            gc.disable()  # a full collection mid-run costs ~50 ms (docs/hwbackend.md)
            started = time.perf_counter()
            loop = ReplayLoop(config, trace, TPModel(group), kv, sleep=sleep)
            output = loop.run()
            wall_s = time.perf_counter() - started
            group.call_all("sync")
            output.rank_launches = launch_frame(group.call_all("launch_times"), loop._t0_ns * 1e-9)
            extra["tp_launch"] = launch_summary(output.rank_launches)
            mapping = {kind: _short_report(kv.executor.timing_report(kind)) for kind in ("foreground", "background")}
            consistent = _consistency(kv.executor)  # every rank maps what the policy holds, after the whole run
        finally:
            gc.enable()
            kv.close()
        if spec.runner == "recording":
            extra["rank_batches"] = group.call_all("log")
    finally:
        peers.request_stop()
        try:
            if local is not None:
                local.close()  # leaves the process group while the peers leave it too (NCCL needs every rank)
        finally:
            codes = peers.join(timeout_s=min(spec.timeout_s, 120.0))
            if local_cache is not None:
                local_cache.driver.close()
    shape = spec.shape.per_worker(spec.tp) if spec.shape is not None else config.model_spec.per_worker(config.tp)
    meta = {"backend": "hardware", "device": spec.devices[0], "devices": list(spec.devices),
            "tp_processes": spec.tp, "dist_backend": spec.dist_backend, "tp_runner": spec.runner,
            "attention_backend": backend, "replay_wall_s": wall_s, "transformer_shape": shape.decoder_shape(),
            "ranks": ranks, "peer_exit_codes": codes, "tp_mapping": mapping, "tp_page_tables": consistent,
            **extra, **check}
    for key in ("torch_version", "python_version", "gpu_name", "gpu_uuid", "nccl_version"):
        if key in ranks[0]:
            meta[key] = ranks[0][key]
    return output, meta


LAUNCH_COLUMNS = ("iteration", "rank", "start_us", "launched_us")
"""``tp_launches.parquet``: per iteration and rank, host time (us since the replay's start, the clock of
``iterations.parquet``) when the rank started building the iteration's inputs and when it had launched its
forward (rank r > 0 starts when rank 0's post reaches it)."""


def launch_frame(per_rank: list, t0_s: float) -> pd.DataFrame:
    """:data:`LAUNCH_COLUMNS` from every rank's ``launch_times`` (host seconds of one monotonic clock)."""
    rows = [(i, rank, (start - t0_s) * 1e6, (end - t0_s) * 1e6)
            for rank, launches in enumerate(per_rank) for i, (start, end) in enumerate(launches)]
    return pd.DataFrame.from_records(rows, columns=list(LAUNCH_COLUMNS))


def launch_summary(frame: pd.DataFrame) -> dict:
    """Per rank, the host time to launch a forward (p50 / p90 / p99 us), and for ranks > 0 how much later than
    rank 0 they started and finished launching the same iteration (what the pipe and the peer's own input
    building add before its first all-reduce can meet rank 0's)."""
    import numpy as np

    def quantiles(values) -> dict:
        values = np.asarray(values, dtype=float)
        if not len(values):
            return {}
        return {f"p{q}": round(float(np.percentile(values, q)), 1) for q in (50, 90, 99)} | {
            "max": round(float(values.max()), 1)}

    summary: dict = {"launch_us": {}, "start_lag_us": {}, "launched_lag_us": {}}
    by_rank = {rank: part.set_index("iteration") for rank, part in frame.groupby("rank")}
    for rank, part in by_rank.items():
        summary["launch_us"][str(rank)] = quantiles(part["launched_us"] - part["start_us"])
        if rank:
            first = by_rank[0].reindex(part.index)
            summary["start_lag_us"][str(rank)] = quantiles((part["start_us"] - first["start_us"]).dropna())
            summary["launched_lag_us"][str(rank)] = quantiles((part["launched_us"] - first["launched_us"]).dropna())
    return summary


def _consistency(executor: Any) -> str:
    """``"identical"`` when every rank maps the policy's (slot, page) pairs with the same free page groups, else
    the first difference (recorded in config.json rather than raised: the run is kept)."""
    try:
        executor.check_consistent()
    except RuntimeError as exc:
        print(f"replay: error: {exc}", file=sys.stderr)
        return str(exc)
    return "identical"


def _short_report(report: dict) -> dict:
    """:func:`hwbackend.vmm.tp.timing_report` rounded for config.json (per-worker and critical-path us)."""
    def rounded(figures: dict) -> dict:
        return {k: round(v, 1) for k, v in figures.items()}

    return {"num_plans": report["num_plans"], "critical_path": rounded(report["critical_path"]),
            "wall": rounded(report["wall"]),
            "per_worker": [{"rank": w["rank"], **rounded({k: v for k, v in w.items() if k != "rank"})}
                           for w in report["per_worker"]],
            "critical_path_over_mean_worker": (None if report["critical_path_over_mean_worker"] is None
                                               else round(report["critical_path_over_mean_worker"], 4))}
