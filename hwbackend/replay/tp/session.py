"""Processes of a tensor-parallel replay: one per rank, rank 0 the coordinator (the process that replays),
ranks 1..tp-1 spawned by it (:class:`Peers`), each running :func:`peer_main`: its VMM worker
(:class:`hwbackend.replay.tp.remote.WorkerService`) in a thread and its compute runner in the main thread,
each answering its own pipe from rank 0. No torch at import (the model runner imports it when built).

Environment: NVLink multicast stays off in every process (:data:`NO_MULTICAST`, set before any
``torch.distributed`` or NCCL initialisation; the lent two-GPU machines require it).
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from hwbackend.replay.tp.peers import RUNNER_COMMANDS, RecordingRunner
from hwbackend.replay.tp.remote import RemoteTPExecutor, RemoteWorker, WorkerService
from hwbackend.replay.tp.rpc import Channel, serve
from hwbackend.vmm.emulated import EmulatedVmmDriver
from hwbackend.vmm.kvcache import KVCache, KVCacheLayout
from hwbackend.vmm.tp_worker import TPWorker

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
"""Set in every rank's environment: NCCL, PyTorch and NVSHMEM never use NVLink multicast."""


def set_no_multicast() -> None:
    os.environ.update(NO_MULTICAST)


@dataclass(frozen=True)
class PeerSpec:
    """What every rank needs to build its part (picklable: it is sent to spawned processes).

    Attributes:
        tp: the tensor-parallel degree (processes). devices: one per rank, ``cuda:N`` or ``cpu``.
        runner: ``model`` (:class:`hwbackend.replay.tp.shard.ModelRunner`, torch) or ``recording``
            (:class:`hwbackend.replay.tp.peers.RecordingRunner`, no torch: CPU tests).
        dist_backend: ``nccl`` or ``gloo`` for the model runner's all-reduces (None: recording).
        init_method: ``torch.distributed`` rendezvous (``file://...``). layout, pool_page_groups,
        create_on_demand: every rank's KV cache (identical). shape: the whole model's decoder shape (each
        rank computes ``shape.per_worker(tp)``). seed: weights' seed (every rank draws the whole model's weights
        as the one-GPU replay does, then keeps its shard). timeout_s: collectives' and joins' timeout.
        emulated_delay_us: on ``cpu``, the emulated driver's per-call delays (tests). emulated_compute_us: the
            recording runner's iteration time after launch (tests of the mapper thread).
    """

    tp: int
    devices: tuple[str, ...]
    layout: KVCacheLayout
    pool_page_groups: int
    runner: str = "model"
    dist_backend: str | None = None
    init_method: str | None = None
    create_on_demand: bool = False
    shape: Any = None
    seed: int = 0
    timeout_s: float = 300.0
    emulated_delay_us: dict = field(default_factory=dict)
    emulated_compute_us: float = 0.0

    def __post_init__(self) -> None:
        if len(self.devices) != self.tp:
            raise ValueError(f"{len(self.devices)} devices for tp {self.tp}: give one per rank")
        if self.runner not in ("model", "recording"):
            raise ValueError(f"runner {self.runner!r}: model or recording")


class PeerDriver(EmulatedVmmDriver):
    """The emulated driver of a CPU rank; its injected faults can be listed and dropped (tests)."""

    def clear_faults(self) -> None:
        self._faults.clear()

    def pending_faults(self) -> int:
        return sum(len(by_index) for by_index in self._faults.values())


def make_runner(spec: PeerSpec, rank: int) -> Any:
    """Rank ``rank``'s compute runner (the model runner joins the process group: it waits for every rank)."""
    if spec.runner == "recording":
        return RecordingRunner(rank, spec.emulated_compute_us)
    from hwbackend.replay.tp.shard import ModelRunner

    return ModelRunner(spec, rank)


def make_cache(spec: PeerSpec, rank: int) -> KVCache:
    """Rank ``rank``'s unopened KV cache over its own driver: real VMM on ``cuda:N``, emulated on ``cpu``."""
    device = spec.devices[rank]
    if device.startswith("cuda"):
        from hwbackend.vmm.driver import CudaVmmDriver

        ordinal = int(device.partition(":")[2] or 0)
        if spec.runner == "model":  # the driver takes torch's primary context: initialise torch's first
            import torch

            torch.cuda.init()
        driver = CudaVmmDriver(ordinal)
    else:
        layout = spec.layout
        capacity = spec.pool_page_groups * layout.num_sub_tensors * layout.page_size_bytes
        driver = PeerDriver(layout.page_size_bytes, capacity_bytes=capacity, va_limit_bytes=1 << 50,
                            delay_us=spec.emulated_delay_us, device_ordinal=rank)
    return KVCache(driver, spec.layout, spec.pool_page_groups, create_on_demand=spec.create_on_demand)


def peer_main(rank: int, spec: PeerSpec, vmm_conn: Any, compute_conn: Any) -> str:
    """Rank ``rank`` (>= 1): build the runner and the cache, serve the VMM pipe in a thread and the compute
    pipe here until rank 0 says ``stop`` (returned) or goes away (``eof``)."""
    set_no_multicast()
    runner = make_runner(spec, rank)
    cache = service = None
    outcome = "error"
    try:
        cache = make_cache(spec, rank)
        runner.attach_cache(cache)
        service = WorkerService(rank, cache, vmm_conn).start()
        handlers = {name: getattr(runner, name) for name in RUNNER_COMMANDS}
        handlers["stop"] = lambda: None
        outcome = serve(compute_conn, handlers, stop=("stop",))
        return outcome
    finally:
        if service is not None:
            service.join(spec.timeout_s)
        # leave the process group with rank 0 only when it said stop: with NCCL, leaving waits for every rank
        runner.close(leave_group=outcome == "stop")
        if cache is not None and not (service is not None and service.alive):
            cache.driver.close()


def _exit_with_parent() -> None:
    """End this process as soon as rank 0's process is gone, whatever the main thread is blocked in (a
    CUDA synchronisation on an all-reduce rank 0 will never join, say): a peer left behind would hold its GPU."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(4)

    threading.Thread(target=watch, name="tp-parent-watch", daemon=True).start()


def _peer_process(rank: int, spec: PeerSpec, vmm_conn: Any, compute_conn: Any) -> None:
    _exit_with_parent()
    try:
        outcome = peer_main(rank, spec, vmm_conn, compute_conn)
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # no interpreter teardown: a process group's destructor could wait for rank 0 forever
    if outcome != "stop":
        sys.stderr.flush()
        os._exit(3)
    sys.exit(0)


class Peers:
    """Ranks 1..tp-1, started by rank 0: spawned processes (``mode="process"``, the replay) or threads of this
    process (``mode="thread"``: CPU tests of the orchestration; recording runner only).

    Args:
        spec: every rank's :class:`PeerSpec`. mode: see above.
        exit_after_peer_loss_s: when a peer process dies before :meth:`stop`, end this process (exit code 70)
            after that many seconds (a dead peer leaves NCCL collectives of rank 0 waiting forever); None: only
            report it (``lost``).
    """

    def __init__(self, spec: PeerSpec, mode: str = "process", exit_after_peer_loss_s: float | None = None):
        if mode not in ("process", "thread"):
            raise ValueError(f"mode {mode!r}: process or thread")
        if mode == "thread" and spec.runner != "recording":
            raise ValueError("peers as threads run the recording runner only (torch.distributed needs processes)")
        self.spec, self.mode = spec, mode
        self.vmm_conns: list[Any] = []
        self.channels: list[Channel] = []
        self.handles: list[Any] = []
        self.lost: list[tuple[int, int | None]] = []
        self._stopping = threading.Event()
        self._exit_after = exit_after_peer_loss_s
        set_no_multicast()
        ctx = multiprocessing.get_context("spawn")
        try:
            for rank in range(1, spec.tp):
                vmm_here, vmm_there = ctx.Pipe()
                compute_here, compute_there = ctx.Pipe()
                if mode == "process":
                    handle = ctx.Process(target=_peer_process, args=(rank, spec, vmm_there, compute_there),
                                         name=f"tp-rank-{rank}", daemon=True)
                    handle.start()
                    vmm_there.close()
                    compute_there.close()
                else:
                    handle = threading.Thread(target=peer_main, args=(rank, spec, vmm_there, compute_there),
                                              name=f"tp-rank-{rank}", daemon=True)
                    handle.start()
                self.handles.append(handle)
                self.vmm_conns.append(vmm_here)
                self.channels.append(Channel(compute_here, f"tensor-parallel rank {rank}"))
        except BaseException:
            self.stop(timeout_s=5)
            raise
        if mode == "process" and self.handles:
            threading.Thread(target=self._watch, name="tp-peer-watch", daemon=True).start()

    def remote_workers(self, layout: KVCacheLayout, pool_page_groups: int) -> list[RemoteWorker]:
        """A :class:`RemoteWorker` per peer over its VMM pipe (ranks 1..tp-1)."""
        return [RemoteWorker(rank, conn, layout, pool_page_groups)
                for rank, conn in enumerate(self.vmm_conns, start=1)]

    def _watch(self) -> None:
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.handles, start=1)}
        while sentinels and not self._stopping.is_set():
            for ready in multiprocessing.connection.wait(list(sentinels), timeout=0.5):
                rank = sentinels.pop(ready)
                if self._stopping.is_set():
                    return
                code = self.handles[rank - 1].exitcode
                self.lost.append((rank, code))
                print(f"replay: error: tensor-parallel rank {rank} exited (code {code}) during the replay",
                      file=sys.stderr, flush=True)
                if self._exit_after is not None and not self._stopping.wait(self._exit_after):
                    print("replay: error: giving up on the replay (its collectives would wait forever)",
                          file=sys.stderr, flush=True)
                    os._exit(70)

    def request_stop(self) -> None:
        """End every peer's VMM service (its pipe closes: the service closes its cache and returns) and tell
        its compute loop to stop; returns once every peer has answered, before they leave the process group.
        Rank 0 must then leave the process group too (:meth:`ModelRunner.close`: with NCCL, destroying a
        process group waits for every rank to do so), then :meth:`join`."""
        self._stopping.set()
        for conn in self.vmm_conns:
            conn.close()
        for channel in self.channels:
            try:
                channel.call_within(30.0, "stop")
            except Exception:  # already gone, or stuck (join terminates it)
                pass

    def join(self, timeout_s: float = 60.0) -> list[int | None]:
        """Wait for every peer to end (terminating a process still running after ``timeout_s``); returns the
        exit codes (threads: 0 if ended, None if still running)."""
        codes: list[int | None] = []
        deadline = time.monotonic() + timeout_s
        for handle in self.handles:
            handle.join(max(0.0, deadline - time.monotonic()))
            if self.mode == "process":
                if handle.is_alive():
                    handle.terminate()
                    handle.join(5)
                codes.append(handle.exitcode)
            else:
                codes.append(None if handle.is_alive() else 0)
        for channel in self.channels:
            channel.close()
        return codes

    def stop(self, timeout_s: float = 60.0) -> list[int | None]:
        """:meth:`request_stop` then :meth:`join` (peers without a process group to leave with rank 0)."""
        self.request_stop()
        return self.join(timeout_s)


@dataclass
class TPReplayKV:
    """Rank 0's open cache for :class:`hwbackend.replay.loop.ReplayLoop` (the attributes of
    :class:`hwbackend.replay.kv.ReplayKV`): ``executor`` the :class:`RemoteTPExecutor` over every rank,
    ``k`` / ``v`` rank 0's views, ``driver`` rank 0's (its unmap count is the loop's counter)."""

    executor: RemoteTPExecutor
    k: list[Any]
    v: list[Any]
    slot_tokens: int
    driver: Any
    stack: ExitStack

    def close(self) -> None:
        """Stop the mapper, unmap and release everything on every rank."""
        self.stack.close()


def open_tp_kv(policy: Any, background: bool, local_cache: KVCache, peers: Peers, group: Any,
               stream_handle: int = 0) -> TPReplayKV:
    """Open every rank's cache through one :class:`RemoteTPExecutor` (worker 0 here, the others remote),
    then have every rank build its K/V views (``kv_open``).

    Args:
        policy: the one vAttention policy. background: run the mapper thread. local_cache: rank 0's unopened
            cache. group: the :class:`hwbackend.replay.tp.peers.ComputeGroup`. stream_handle: rank 0's stream
            for iteration events.
    """
    workers: list[Any] = [TPWorker(0, local_cache)]
    workers += peers.remote_workers(local_cache.layout, local_cache.pool_page_groups)
    stack = ExitStack()
    try:
        executor = stack.enter_context(RemoteTPExecutor(policy, workers, background=background,
                                                        stream_handles=[stream_handle] + [0] * (len(workers) - 1)))
        group.call_all("kv_open")
    except BaseException:
        stack.close()
        raise
    local = group.local
    return TPReplayKV(executor, local.k, local.v, local_cache.layout.max_tokens_per_slot, local_cache.driver, stack)
