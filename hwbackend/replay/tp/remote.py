"""The tensor-parallel executor with workers in other processes: the coordinator's
:class:`hwbackend.vmm.tp.TPExecutor` (one policy, two-phase plans, background mapper, rollback) drives
worker 0 in its own process and every other rank through a pipe to that rank's process. No torch.

Two GPUs measured (``docs/tp2/README.md``): threads of one process map no faster on two GPUs than on one;
one process per GPU maps mostly in parallel. So each rank's VMM calls run in that rank's process::

    coordinator process (rank 0)                               peer process (rank r)
    ─────────────────────────────                              ─────────────────────
    TPExecutor ── RemoteTPCacheGroup.apply(plan): two-phase
       ├─ TPWorker 0 (thread, driver 0, KVCache 0)
       └─ RemoteWorker r ── Channel ══ pipe ══▶ WorkerService r (thread) ── InlineWorker r (driver r, KVCache r)
            stage / commit / rollback / close / queries             the same stage_plan, transactions, undo log

A remote worker's iteration event (what an unmap of a freed slot waits for) is
:class:`CollectiveOrderedEvent`: complete when rank 0's own event is. In the tensor-parallel forward every
rank's last reads of the KV cache (layer N-1's attention) come before its contribution to that layer's
all-reduces, and rank 0's iteration cannot pass those all-reduces before every rank has contributed: once
rank 0's event has completed, every rank has finished reading (and writing) the cache for that iteration.
This saves a round trip to every peer at each poll; it holds only when the iteration has a collective after
its last attention, which the sharded decoder always has (:mod:`hwbackend.replay.tp.shard`).
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from hwbackend.replay.tp.rpc import Channel, portable_error, serve
from hwbackend.vmm.executor import Executor
from hwbackend.vmm.kvcache import KVCache
from hwbackend.vmm.tp import TPCacheGroup, TPExecutor
from hwbackend.vmm.tp_worker import TPWorker
from sim.memory.vattention import VAttentionPolicy
from sim.memory.plan import Plan

DRIVER_CALLS = ("live_objects", "inject_fault", "clear_faults", "pending_faults", "mem_info")
"""Driver methods a coordinator may call on a peer's driver (tests inject faults; checks read leaks)."""


def _done(fn: Any, *args: Any) -> Future:
    """``fn(*args)`` run now, as a completed future (its exception set on it)."""
    future: Future = Future()
    try:
        future.set_result(fn(*args))
    except Exception as exc:
        future.set_exception(exc)
    return future


class InlineWorker(TPWorker):
    """A :class:`TPWorker` whose commands run in the calling thread: in a peer process the service thread
    is the worker's thread (its driver's context is made current there by ``open``)."""

    def submit(self, fn: Any, *args: Any) -> Future:
        return _done(fn, *args)

    def shutdown(self) -> None:
        self._shut_down = True
        self._thread_pool.shutdown(wait=False)


class WorkerService:
    """Rank ``rank``'s VMM worker in its own process, serving a :class:`RemoteWorker` over ``conn``.

    Commands: ``open`` (-> reservation bases), ``stage`` (plan -> mapping us), ``commit``, ``rollback``
    (-> undo errors), ``close``, ``mapped`` (sorted (slot, page) pairs), ``free_page_groups``,
    ``free_handles`` (the pool in order, as strings), ``unmap_calls``, ``driver`` (a :data:`DRIVER_CALLS`
    method), ``shutdown``. If the coordinator goes away (end of file) the cache is closed: staged plan
    rolled back, everything unmapped and released.
    """

    def __init__(self, rank: int, cache: KVCache, conn: Any):
        self.rank, self.cache, self.conn = rank, cache, conn
        self.worker = InlineWorker(rank, cache)
        self.outcome: str | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"tp-service-{rank}", daemon=True)

    def start(self) -> "WorkerService":
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _handlers(self) -> dict:
        w, cache = self.worker, self.cache
        return {"open": lambda: (w.open().result(), list(cache.bases))[1],
                "stage": lambda plan: w.stage(plan).result(),
                "commit": lambda: w.commit().result(),
                "rollback": lambda: [portable_error(e) for e in w.rollback().result()],
                "close": lambda: w.close().result(),
                "mapped": lambda: list(cache.iter_mapped()),
                "free_page_groups": lambda: cache.num_free_page_groups,
                "free_handles": lambda: [str(h) for h in cache._free_handles],
                "unmap_calls": lambda: cache.driver.stats.count("cuMemUnmap"),
                "driver": self._driver_call,
                "shutdown": lambda: None}

    def _driver_call(self, name: str, *args: Any) -> Any:
        if name not in DRIVER_CALLS or not hasattr(self.cache.driver, name):
            raise ValueError(f"driver call {name!r} is not served (served: {', '.join(DRIVER_CALLS)})")
        return getattr(self.cache.driver, name)(*args)

    def _run(self) -> None:
        try:
            self.outcome = serve(self.conn, self._handlers())
        except BaseException as exc:  # pragma: no cover - serve answers errors; this is a broken pipe or worse
            self.error, self.outcome = exc, "error"
        finally:
            if self.outcome != "shutdown":  # the coordinator is gone: leave nothing mapped
                try:
                    self.worker.close().result()
                except Exception as exc:
                    self.error = self.error or exc
            self.worker.shutdown()


class _PeerEventDriver:
    """What :class:`hwbackend.vmm.tp.TPCacheGroup` asks of a remote worker's driver: iteration events."""

    def record_event(self, stream_handle: int = 0) -> "CollectiveOrderedEvent":
        return CollectiveOrderedEvent()

    def make_current(self) -> None:
        """Nothing: the peer's context is current in its own service thread."""


class CollectiveOrderedEvent:
    """A peer's iteration event, complete when rank 0's is (see the module docstring: the forward's
    all-reduces order every rank's KV reads before rank 0's end of the iteration)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """Rank 0's event of the same iteration is waited for beside this one."""

    def close(self) -> None:
        """Nothing to free."""


class RemoteCache:
    """The coordinator's view of a peer's cache: what the executor and the group read of a worker's cache
    (``layout``, ``pool_page_groups``, ``bases``, ``driver``, ``iter_mapped``, ``num_free_page_groups``)."""

    def __init__(self, worker: "RemoteWorker", layout: Any, pool_page_groups: int):
        self._worker, self.layout, self.pool_page_groups = worker, layout, pool_page_groups
        self.bases: list[int] = []
        self.driver = _PeerEventDriver()

    def iter_mapped(self):
        return iter(self._worker.query("mapped"))

    @property
    def num_free_page_groups(self) -> int:
        return self._worker.query("free_page_groups")

    @property
    def free_handles(self) -> list[str]:
        """The peer's free handles, in pool order (tests: rollback restores the order)."""
        return self._worker.query("free_handles")


class RemoteWorker:
    """A :class:`TPWorker` look-alike for rank ``rank`` in another process: commands go over ``conn`` to
    its :class:`WorkerService`, in order, from one local thread (so that the two-phase group waits for every
    worker at once); local work (event queries) runs inline.

    Args:
        rank: the peer's rank (>= 1). conn: the coordinator's end of the VMM pipe. layout, pool_page_groups:
            the peer cache's (identical to worker 0's).
    """

    def __init__(self, rank: int, conn: Any, layout: Any, pool_page_groups: int):
        self.rank = rank
        self.channel = Channel(conn, f"tensor-parallel worker {rank}")
        self.cache = RemoteCache(self, layout, pool_page_groups)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tp-remote-{rank}")
        self._shut_down = False

    @property
    def thread_name(self) -> str:
        return f"tp-remote-{self.rank}_0"

    def submit(self, fn: Any, *args: Any) -> Future:
        """Run local work (an event's ``query``) inline; see the class docstring."""
        return _done(fn, *args)

    def _remote(self, command: str, *args: Any) -> Future:
        return self._pool.submit(self.channel.call, command, *args)

    def query(self, command: str, *args: Any) -> Any:
        """A query answered by the peer, in order after every command sent before."""
        return self._remote(command, *args).result()

    # ---- TPWorker's commands ---------------------------------------------------------------------------
    def open(self) -> Future:
        return self._pool.submit(self._open)

    def _open(self) -> None:
        self.cache.bases = self.channel.call("open")

    def stage(self, plan: Plan) -> Future:
        return self._remote("stage", plan)

    def commit(self) -> Future:
        return self._remote("commit")

    def rollback(self) -> Future:
        return self._remote("rollback")

    def close(self) -> Future:
        return self._pool.submit(self._close)

    def _close(self) -> None:
        self.channel.call("close")
        self.cache.bases = []

    def shutdown(self) -> None:
        """Stop the peer's service (it has closed its cache by then) and the local thread (idempotent)."""
        if self._shut_down:
            return
        self._shut_down = True
        try:
            self._remote("shutdown").result()
        except Exception:  # the peer is already gone: nothing left to stop
            pass
        self._pool.shutdown(wait=True)
        self.channel.close()


class RemoteTPCacheGroup(TPCacheGroup):
    """:class:`TPCacheGroup` over given workers (a :class:`TPWorker` for rank 0, :class:`RemoteWorker` for the
    others). An empty plan is not sent to any worker (nothing to stage: no hand-off, no round trip)."""

    def __init__(self, workers: Sequence[Any], stream_handles: Sequence[int] | None = None):
        if [w.rank for w in workers] != list(range(len(workers))):
            raise ValueError(f"workers must be ranks 0..{len(workers) - 1} in order, got {[w.rank for w in workers]}")
        super().__init__([w.cache for w in workers], stream_handles)
        for placeholder in self.workers:  # the base class made a thread-less TPWorker per cache
            placeholder.shutdown()
        self.workers = list(workers)

    def apply(self, plan: Plan) -> None:
        if not plan:
            return
        super().apply(plan)


class RemoteTPExecutor(TPExecutor):
    """:class:`TPExecutor` over given workers (see :class:`RemoteTPCacheGroup`); API as :class:`TPExecutor`."""

    def __init__(self, policy: VAttentionPolicy, workers: Sequence[Any], background: bool = True,
                 stream_handles: Sequence[int] | None = None):
        group = RemoteTPCacheGroup(workers, stream_handles)
        try:
            Executor.__init__(self, policy, group, background=background)
        except BaseException:
            group.close()
            raise
        group.background_thread = self._thread
        self.group = group
