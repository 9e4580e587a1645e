"""Tensor-parallel executor: ONE vAttention policy and one scheduler driving ``tp`` workers, one per GPU,
each holding ``H / tp`` KV heads in its own reservations and handle pool (issue 9, point 2).

Every worker must map the same slots and pages, and a failure on any worker must stop the whole
iteration (domain.md, "tensor-parallel consistency"). Each plan is therefore applied in two phases::

    policy.step ──Plan──▶ TPCacheGroup.apply
                           ├─ stage(plan) on worker 0 ┐  in parallel, one thread per worker, each in a
                           ├─ stage(plan) on worker 1 ├─ transaction kept open; mapping time per worker
                           └─ ...                     ┘
                           all succeeded? ── yes ─▶ commit on every worker         -> step returns True
                                          └─ no ──▶ roll back on every worker,     -> TPStepError naming
                                                    policy restored from snapshot     the failed worker(s)

:class:`TPExecutor` is :class:`hwbackend.vmm.executor.Executor` (same foreground step, background mapper,
slot reuse after events, teardown) over a :class:`TPCacheGroup`, which offers the executor the
interface of one :class:`~hwbackend.vmm.kvcache.KVCache`. So the executor's guarantees carry over
unchanged: a failed foreground step or free restores the policy from its snapshot and re-raises (no kernel
may launch); a background op counts as done (``policy.commit``) only once every worker has committed it,
else it is cancelled with the queue behind it and the next foreground call raises
:class:`~hwbackend.vmm.executor.BackgroundMappingError` (its cause a :class:`TPStepError`).

Timing: every applied plan leaves a :class:`TPStepTiming` (each worker's mapping time, the critical path =
the slowest worker, the coordinator's wall time); :func:`timing_report` summarises them.
"""
from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from hwbackend.vmm.executor import Executor
from hwbackend.vmm.kvcache import KVCache
from hwbackend.vmm.tp_worker import TPWorker
from sim.memory.vattention import VAttentionPolicy
from sim.memory.plan import Plan


class TPStepError(RuntimeError):
    """A plan failed on one or more workers; every worker rolled it back (the first failure is chained).

    Attributes:
        kind: ``"foreground"``, ``"background"`` or ``"open"``.
        worker_errors: rank -> the error that worker raised.
        num_workers: tp degree.
    """

    def __init__(self, kind: str, worker_errors: dict[int, BaseException], num_workers: int):
        self.kind, self.worker_errors, self.num_workers = kind, dict(worker_errors), num_workers
        ranks = sorted(worker_errors)
        first = worker_errors[ranks[0]]
        super().__init__(f"tensor-parallel {kind} plan failed on worker {', '.join(map(str, ranks))} of "
                         f"{num_workers} ({type(first).__name__}: {first}); every worker rolled it back")


@dataclass(frozen=True)
class TPStepTiming:
    """Timing of one plan applied on every worker.

    Attributes:
        index: plan number, from 0, in application order.
        kind: ``"foreground"`` (step / free_slot) or ``"background"`` (mapper thread).
        page_groups_mapped: page groups the plan mapped on each worker.
        page_groups_unmapped: page groups the plan unmapped on each worker.
        worker_mapping_us: per worker, time spent performing the plan in its thread (us).
        wall_us: coordinator's time from sending the plan to the last commit (us; includes hand-offs).
    """

    index: int
    kind: str
    page_groups_mapped: int
    page_groups_unmapped: int
    worker_mapping_us: tuple[float, ...]
    wall_us: float

    @property
    def critical_path_us(self) -> float:
        """The slowest worker's mapping time: what the iteration waits for (us)."""
        return max(self.worker_mapping_us)

    def as_record(self) -> dict[str, Any]:
        """One flat record (``worker_<r>_mapping_us`` per worker), ready for ``pandas.DataFrame``."""
        record = {"index": self.index, "kind": self.kind, "page_groups_mapped": self.page_groups_mapped,
                  "page_groups_unmapped": self.page_groups_unmapped,
                  "critical_path_us": self.critical_path_us, "wall_us": self.wall_us}
        record.update({f"worker_{r}_mapping_us": us for r, us in enumerate(self.worker_mapping_us)})
        return record


class TPEvent:
    """One iteration's events, one per worker (each used in its worker's thread); done when all are."""

    def __init__(self, workers: Sequence[TPWorker], events: Sequence[Any]):
        self._pairs = list(zip(workers, events))

    def query(self) -> bool:
        """True once every worker's GPU has passed its event."""
        return all(worker.submit(event.query).result() for worker, event in self._pairs)

    def synchronize(self) -> None:
        """Block until every worker's GPU has passed its event."""
        _results([worker.submit(event.synchronize) for worker, event in self._pairs])

    def close(self) -> None:
        """Destroy the per-worker events."""
        _results([worker.submit(getattr(event, "close", _nothing)) for worker, event in self._pairs])


def _nothing() -> None:
    """No-op, for events without ``close``."""


class _GroupDriver:
    """What the executor asks of ``cache.driver``: coordinator threads bind no context; an iteration's
    event is recorded by every worker on its own stream (``stream_handle`` is the group's, per worker)."""

    def __init__(self, group: "TPCacheGroup"):
        self._group = group

    def make_current(self) -> None:
        """Nothing: driver calls run only in worker threads."""

    def record_event(self, stream_handle: int = 0) -> TPEvent:
        """Events recorded by each worker on its stream of ``group.stream_handles`` (the argument is unused)."""
        return self._group.record_event()


class TPCacheGroup:
    """The KV caches of ``tp`` workers behind the interface :class:`Executor` uses of one cache.

    Args:
        caches: one unopened :class:`KVCache` per worker, each over its own driver instance; identical
            layouts (``H' = H / tp`` heads each, see :meth:`KVCacheLayout.for_model`) and pool sizes.
        stream_handles: per worker, the CUDA stream its iteration events are recorded on (default 0).

    Attributes:
        workers: the :class:`TPWorker` of each rank.
        timings: a :class:`TPStepTiming` per plan applied on every worker.
        background_thread: the executor's mapper thread (plans it applies are timed as ``background``).
    """

    def __init__(self, caches: Sequence[KVCache], stream_handles: Sequence[int] | None = None):
        _check_caches(caches)
        self.workers = [TPWorker(rank, cache) for rank, cache in enumerate(caches)]
        self.layout, self.pool_page_groups = caches[0].layout, caches[0].pool_page_groups
        self.stream_handles = tuple(stream_handles) if stream_handles is not None else (0,) * len(caches)
        if len(self.stream_handles) != len(caches):
            raise ValueError(f"{len(self.stream_handles)} stream handles for {len(caches)} workers")
        self.driver = _GroupDriver(self)
        self.timings: list[TPStepTiming] = []
        self.background_thread: threading.Thread | None = None
        self._closed = False

    @property
    def bases(self) -> list[int]:
        """Worker 0's reservation bases (empty until opened)."""
        return self.workers[0].cache.bases

    # ---- lifetime ------------------------------------------------------------------------------------
    def open(self) -> "TPCacheGroup":
        """Open every worker (in parallel, each in its thread); all or nothing.

        Raises:
            TPStepError: a worker failed to open (kind ``"open"``); every worker was closed again.
        """
        outcomes = _outcomes([worker.open() for worker in self.workers])
        failures = {rank: exc for rank, (_, exc) in enumerate(outcomes) if exc is not None}
        if failures:
            error = TPStepError("open", failures, len(self.workers))
            _results([worker.close() for worker in self.workers], error)
            raise error from failures[min(failures)]
        return self

    def close(self) -> None:
        """Close every worker's cache in its thread, then stop the threads (idempotent).

        Raises:
            Exception: the first worker's teardown failure, after every worker was closed.
        """
        if self._closed:
            return
        self._closed = True
        futures = [worker.close() for worker in self.workers]
        try:
            _results(futures)
        finally:
            for worker in self.workers:
                worker.shutdown()

    # ---- applying plans ------------------------------------------------------------------------------
    def apply(self, plan: Plan) -> None:
        """Apply ``plan`` on every worker, committed only if every worker succeeded (two-phase).

        Raises:
            TPStepError: some worker failed; every worker's mappings and pool are as before.
            BaseException: an interrupt (Ctrl-C) while waiting: every worker rolls back first.
        """
        start_ns = time.perf_counter_ns()
        futures = [worker.stage(plan) for worker in self.workers]
        try:
            outcomes = _outcomes(futures)
        except BaseException:
            _results([worker.rollback() for worker in self.workers])
            raise
        failures = {rank: exc for rank, (_, exc) in enumerate(outcomes) if exc is not None}
        if failures:
            self._abort(failures)
        _results([worker.commit() for worker in self.workers])
        self.timings.append(TPStepTiming(
            index=len(self.timings), kind=self._kind(), page_groups_mapped=plan.num_page_groups_mapped,
            page_groups_unmapped=plan.num_page_groups_unmapped,
            worker_mapping_us=tuple(us for us, _ in outcomes), wall_us=(time.perf_counter_ns() - start_ns) * 1e-3))

    def _kind(self) -> str:
        return "background" if threading.current_thread() is self.background_thread else "foreground"

    def _abort(self, failures: dict[int, BaseException]) -> None:
        """Roll back the workers that staged the plan, then raise a :class:`TPStepError`."""
        error = TPStepError(self._kind(), failures, len(self.workers))
        staged = [worker for worker in self.workers if worker.rank not in failures]
        for worker, undo_errors in zip(staged, _results([worker.rollback() for worker in staged], error)):
            for undo_error in undo_errors or ():
                error.add_note(f"worker {worker.rank}: rollback step failed too: {undo_error!r}")
        raise error from failures[min(failures)]

    def record_event(self) -> TPEvent:
        """An iteration event recorded by every worker on its stream (in its thread, context current)."""
        futures = [worker.submit(worker.cache.driver.record_event, handle)
                   for worker, handle in zip(self.workers, self.stream_handles)]
        return TPEvent(self.workers, _results(futures))

    # ---- queries -------------------------------------------------------------------------------------
    def worker_mappings(self) -> list[list[tuple[int, int]]]:
        """Per worker, the (slot, page) pairs mapped now, sorted."""
        return [list(worker.cache.iter_mapped()) for worker in self.workers]

    def check_consistent(self, policy: VAttentionPolicy | None = None) -> None:
        """Check that every worker maps the same (slot, page) pairs and has the same free page groups,
        and, given the ``policy`` with nothing in flight, that these are the policy's.

        Raises:
            RuntimeError: naming the first worker that differs, and how.
        """
        expected = self.worker_mappings()[0], self.workers[0].cache.num_free_page_groups
        if policy is not None:
            expected = ([(s, p) for s in range(len(policy.mapped)) for p in range(policy.mapped[s])],
                        policy.free_page_groups)
        for worker, mapped in zip(self.workers, self.worker_mappings()):
            found = mapped, worker.cache.num_free_page_groups
            if found != expected:
                raise RuntimeError(f"worker {worker.rank} is out of step: maps {_short(found[0])} with "
                                   f"{found[1]} free page groups, expected {_short(expected[0])} with "
                                   f"{expected[1]} free")


class TPExecutor(Executor):
    """:class:`Executor` over ``tp`` workers: one policy, every plan applied on every worker, two-phase.

    Args:
        policy: the simulator's policy, sized like each worker's cache (:func:`policy_config_for` of any).
        caches: one unopened KV cache per worker, each over its own driver (see :class:`TPCacheGroup`).
        background: run the asynchronous mapper thread.
        stream_handles: per worker, the CUDA stream iteration events are recorded on (default 0 each).

    Use as a context manager; teardown (also on errors and Ctrl-C) stops the mapper, waits for every
    worker's GPU, and closes every worker. API as :class:`Executor`, plus :attr:`timings`,
    :meth:`timing_report` and :meth:`check_consistent`.
    """

    def __init__(self, policy: VAttentionPolicy, caches: Sequence[KVCache], background: bool = True,
                 stream_handles: Sequence[int] | None = None):
        group = TPCacheGroup(caches, stream_handles)
        try:
            super().__init__(policy, group, background=background)
        except BaseException:
            group.close()
            raise
        group.background_thread = self._thread
        self.group = group

    @property
    def workers(self) -> list[TPWorker]:
        """The workers, by rank."""
        return self.group.workers

    @property
    def timings(self) -> list[TPStepTiming]:
        """One record per plan applied on every worker."""
        return self.group.timings

    def timing_report(self, kind: str | None = "foreground") -> dict[str, Any]:
        """Per-worker and critical-path mapping time of the plans of ``kind`` (None: all); see
        :func:`timing_report`."""
        return timing_report(self.group.timings, len(self.workers), kind)

    def check_consistent(self) -> None:
        """:meth:`TPCacheGroup.check_consistent` against the policy, once the mapper is idle.

        Raises:
            RuntimeError: a worker is out of step with another or with the policy.
        """
        self.wait_background()
        with self._cv:
            self.group.check_consistent(self.policy)


def make_tp_caches(drivers: Sequence[Any], layout: Any, pool_page_groups: int, **cache_options: Any) -> list[KVCache]:
    """One unopened :class:`KVCache` per driver (one driver instance per worker), same layout and pool."""
    return [KVCache(driver, layout, pool_page_groups, **cache_options) for driver in drivers]


def timing_report(timings: Sequence[TPStepTiming], num_workers: int, kind: str | None = None) -> dict[str, Any]:
    """Summary of per-worker and critical-path mapping times.

    Args:
        timings: records of :attr:`TPCacheGroup.timings`.
        num_workers: tp degree.
        kind: keep only ``"foreground"`` or ``"background"`` plans; None keeps all.

    Returns:
        ``{"num_workers", "kind", "num_plans", "per_worker": [{"rank", "total_us", "mean_us", "p50_us",
        "max_us"}, ...], "critical_path": {...}, "wall": {...}, "critical_path_over_mean_worker"}``; the
        last is the critical path's total over the mean worker's total (1.0: perfectly balanced).
    """
    chosen = [t for t in timings if kind is None or t.kind == kind]
    per_worker = [{"rank": rank, **_summary_us([t.worker_mapping_us[rank] for t in chosen])}
                  for rank in range(num_workers)]
    critical = _summary_us([t.critical_path_us for t in chosen])
    mean_worker_total_us = statistics.fmean(w["total_us"] for w in per_worker) if per_worker else 0.0
    return {"num_workers": num_workers, "kind": kind or "all", "num_plans": len(chosen),
            "per_worker": per_worker, "critical_path": critical, "wall": _summary_us([t.wall_us for t in chosen]),
            "critical_path_over_mean_worker": critical["total_us"] / mean_worker_total_us if mean_worker_total_us else None}


# ---- helpers -----------------------------------------------------------------------------------------
def _summary_us(values_us: Sequence[float]) -> dict[str, float]:
    if not values_us:
        return {"total_us": 0.0, "mean_us": 0.0, "p50_us": 0.0, "max_us": 0.0}
    return {"total_us": float(sum(values_us)), "mean_us": statistics.fmean(values_us),
            "p50_us": statistics.median(values_us), "max_us": max(values_us)}


def _check_caches(caches: Sequence[KVCache]) -> None:
    if not caches:
        raise ValueError("tensor parallelism needs at least one worker cache")
    if len({id(cache) for cache in caches}) != len(caches):
        raise ValueError("each worker needs its own KV cache object")
    first = caches[0]
    for rank, cache in enumerate(caches):
        if (cache.layout, cache.pool_page_groups) != (first.layout, first.pool_page_groups):
            raise ValueError(f"worker {rank}'s cache ({cache.layout}, pool {cache.pool_page_groups}) differs from "
                             f"worker 0's ({first.layout}, pool {first.pool_page_groups})")


def _outcomes(futures: Sequence[Future]) -> list[tuple[Any, Exception | None]]:
    """(result, None) or (None, error) per future, waiting for all; interrupts propagate."""
    outcomes = []
    for future in futures:
        try:
            outcomes.append((future.result(), None))
        except Exception as exc:
            outcomes.append((None, exc))
    return outcomes


def _results(futures: Sequence[Future], error: BaseException | None = None) -> list[Any]:
    """Wait for every future; raise the first failure (others as notes), or attach them all to ``error``."""
    outcomes = _outcomes(futures)
    failures = [exc for _, exc in outcomes if exc is not None]
    if error is not None:
        for exc in failures:
            error.add_note(f"while undoing: {exc!r}")
    elif failures:
        for other in failures[1:]:
            failures[0].add_note(f"another worker failed too: {other!r}")
        raise failures[0]
    return [result for result, _ in outcomes]


def _short(pairs: list[tuple[int, int]], limit: int = 8) -> str:
    shown = ", ".join(f"{s}:{p}" for s, p in pairs[:limit])
    return f"[{shown}{', ...' if len(pairs) > limit else ''}] ({len(pairs)} pages)"
