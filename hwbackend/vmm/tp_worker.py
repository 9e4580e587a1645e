"""One tensor-parallel worker: a thread of its own (its driver's context made current there), its own
driver instance, VMM reservations and physical handle pool, holding ``H / tp`` KV heads of the model.

Every call on a worker's driver or cache runs in the worker's thread, in submission order (a
single-thread :class:`concurrent.futures.ThreadPoolExecutor`), so that a real driver's calls always find
the worker's context current. The coordinator (:mod:`hwbackend.vmm.tp`) talks to a worker through futures::

    coordinator                       worker r's thread
    ───────────                       ─────────────────
    w.open()          ──────────────▶ make_current(); cache.open()
    w.stage(plan)     ──────────────▶ unmaps, maps inside a Transaction kept OPEN -> mapping time (us)
    w.commit()        ──────────────▶ drop the undo log   (all workers staged)
    w.rollback()      ──────────────▶ run the undo log    (some worker failed)
    w.close()         ──────────────▶ roll back what is staged; unmap, release, free everything

Staging is :meth:`hwbackend.vmm.kvcache.KVCache.apply` split in two: ``apply`` commits its transaction on
leaving, two-phase commit needs it to stay open until every worker has answered.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from hwbackend.vmm.kvcache import KVCache
from hwbackend.vmm.transaction import Transaction
from sim.memory.plan import Plan


def stage_plan(cache: KVCache, plan: Plan) -> Transaction:
    """Perform ``plan`` on ``cache`` (unmaps first, then maps) inside a transaction left open.

    The steps are those of :meth:`KVCache.apply` (its ``_unmap_pages`` and ``_map_pages``, each registering
    its undo actions); only the commit at the end is left to the caller.

    Returns:
        The open transaction: ``commit()`` keeps the plan, ``rollback()`` restores mappings and pool exactly.

    Raises:
        VmmError, RuntimeError, ValueError: as :meth:`KVCache.apply`; what was done is undone first.
    """
    tx = Transaction().__enter__()
    with cache._lock:
        try:
            for unmap_op in plan.unmaps:
                cache._unmap_pages(tx, unmap_op)
            for map_op in plan.maps:
                cache._map_pages(tx, map_op)
        except BaseException as exc:
            tx.__exit__(type(exc), exc, exc.__traceback__)
            raise
    return tx


class TPWorker:
    """Tensor-parallel rank ``rank``: a thread, and the KV cache (with its driver) that only it touches.

    Args:
        rank: worker index, ``0..tp-1`` (named in errors and timings).
        cache: this worker's KV cache, not yet opened (it is opened in the worker's thread).
    """

    def __init__(self, rank: int, cache: KVCache):
        self.rank, self.cache = rank, cache
        self._thread_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tp-worker-{rank}")
        self._staged: Transaction | None = None
        self._shut_down = False

    @property
    def thread_name(self) -> str:
        """Name of the worker's thread (``tp-worker-<rank>_0``)."""
        return f"tp-worker-{self.rank}_0"

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run ``fn(*args)`` in the worker's thread, after everything submitted before."""
        return self._thread_pool.submit(fn, *args)

    # ---- commands (each returns a future) ------------------------------------------------------------
    def open(self) -> Future:
        """Make the driver's context current in the worker's thread, then open the cache."""
        return self.submit(self._open)

    def stage(self, plan: Plan) -> Future:
        """Apply ``plan`` and keep it revocable; the future's result is the mapping time in microseconds."""
        return self.submit(self._stage, plan)

    def commit(self) -> Future:
        """Keep the staged plan."""
        return self.submit(self._commit)

    def rollback(self) -> Future:
        """Undo the staged plan, if any; the future's result lists undo steps that failed (empty: clean)."""
        return self.submit(self._rollback)

    def close(self) -> Future:
        """Undo any staged plan, then unmap, release and free everything (:meth:`KVCache.close`)."""
        return self.submit(self._close)

    def shutdown(self) -> None:
        """Stop the worker's thread once every submitted command has run (idempotent)."""
        self._shut_down = True
        self._thread_pool.shutdown(wait=True)

    # ---- in the worker's thread ----------------------------------------------------------------------
    def _open(self) -> None:
        self.cache.driver.make_current()
        if not self.cache.bases:
            self.cache.open()

    def _stage(self, plan: Plan) -> float:
        if self._staged is not None:
            raise RuntimeError(f"worker {self.rank} already holds a staged plan")
        start_ns = time.perf_counter_ns()
        self._staged = stage_plan(self.cache, plan)
        return (time.perf_counter_ns() - start_ns) * 1e-3

    def _commit(self) -> None:
        if self._staged is None:
            raise RuntimeError(f"worker {self.rank} has no staged plan to commit")
        self._staged.commit()
        self._staged = None

    def _rollback(self) -> list[BaseException]:
        staged, self._staged = self._staged, None
        if staged is None:
            return []
        with self.cache._lock:
            staged.rollback()
        return list(staged.rollback_errors)

    def _close(self) -> None:
        rollback_errors = self._rollback()
        self.cache.close()
        if rollback_errors:
            raise RuntimeError(f"worker {self.rank}: rolling back a staged plan at close failed: "
                               f"{rollback_errors[0]!r}")
