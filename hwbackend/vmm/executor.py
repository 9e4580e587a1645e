"""Executor: performs the plans of :class:`sim.memory.vattention.VAttentionPolicy` (the simulator's own
policy object, not a copy) on a :class:`~hwbackend.vmm.kvcache.KVCache`, real or emulated.

One serving iteration, as the engine drives it::

    ok = ex.step({slot: computed + scheduled tokens})   # foreground: stop background work, map what is
                                                        # missing, synchronously; False -> preempt, retry
    ... launch the iteration's kernels ...
    ex.iteration_launched(i)                            # CUDA event after the last kernel of iteration i
    ex.map_ahead({slot: predicted tokens})              # background thread maps while the GPU computes
    ex.free_slot(slot, last_read_iteration=i)           # finished requests

Threads: one background *mapper* thread takes reserved ops from a FIFO queue and applies them one at a
time, committing each to the policy. The foreground ``step`` first cancels queued ops (newest first, as the
policy requires), waits for the op in progress, and only then asks the policy what is still missing.
The policy is touched only under one lock; driver calls run outside it.

Slot safety: unmapping a slot's pages waits until the GPU has finished the last iteration that read the
slot (its event), and the policy hands a freed slot out again only after :meth:`Executor.poll_completed`
has reported that iteration complete.

Failures: a failed foreground plan is rolled back in the cache (transaction) and in the policy (its state
is restored from a snapshot), then the error is raised. A failed background op is cancelled in the policy,
the queue behind it too, and the error is raised as :class:`BackgroundMappingError` by the next foreground
call. Teardown (context manager, also on Ctrl-C) stops the thread, waits for the GPU and releases all.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from hwbackend.vmm.kvcache import KVCache
from sim.memory.vattention import VAttentionConfig, VAttentionPolicy
from sim.memory.plan import MapOp, Plan, UnmapOp


class BackgroundMappingError(RuntimeError):
    """The background mapper failed; its ops were cancelled and rolled back (the cause is chained)."""


def policy_config_for(cache: KVCache, **knobs: Any) -> VAttentionConfig:
    """A :class:`VAttentionConfig` whose sizes match ``cache`` (``knobs``: deferred_reclaim, eager_*, ...)."""
    layout = cache.layout
    return VAttentionConfig(num_slots=layout.num_slots, max_pages_per_slot=layout.max_pages_per_slot,
                            pool_page_groups=cache.pool_page_groups, tokens_per_page=layout.tokens_per_page,
                            **knobs)


def _snapshot(obj: Any) -> dict[str, Any]:
    """Shallow copy of an object's state, copying its lists, sets and dicts (policies hold plain ones)."""
    return {k: (v.copy() if isinstance(v, (list, set, dict)) else v) for k, v in vars(obj).items()}


def _with_window_unmaps(policy: Any, plan: Plan | None) -> Plan | None:
    """``plan`` with the unmaps of pages that left a window (:meth:`sim.memory.hybrid.HybridPolicy.take_window_unmaps`;
    none for other policies) performed first, in the foreground: they are already applied to the accounting and
    are never committed, so they do not go through the reserved background queue. ``None`` stays ``None`` with
    the drops kept for the retry."""
    take = getattr(policy, "take_window_unmaps", None)
    if take is None or plan is None:
        return plan
    dropped = take()
    return Plan(maps=plan.maps, unmaps=(*dropped.unmaps, *plan.unmaps)) if dropped else plan


class Executor:
    """Applies a vAttention policy's plans to a KV cache, with an optional background mapper thread.

    Args:
        policy: the simulator's policy, sized like ``cache`` (see :func:`policy_config_for`).
        cache: a KV cache (opened by :meth:`open` if it is not yet).
        background: run the asynchronous mapper thread (``map_ahead`` does nothing without it).
        stream_handle: CUDA stream on which iteration events are recorded (0: legacy default stream).
        condition: the lock (a ``threading.Condition``) guarding the policy; executors whose policies share
            state (co-located tenants drawing from one :class:`sim.memory.shared_pool.SharedPagePool`) must
            share one, so that no mapper thread changes the pool while another tenant's policy reads it.
            Default: a condition of its own.

    Attributes:
        metrics: counters and foreground step latencies (``step_latency_us``) for benchmarks.
    """

    def __init__(self, policy: VAttentionPolicy, cache: KVCache, background: bool = True,
                 stream_handle: int = 0, condition: threading.Condition | None = None):
        cfg, layout = policy.config, cache.layout
        if (cfg.num_slots, cfg.max_pages_per_slot, cfg.pool_page_groups) != (
                layout.num_slots, layout.max_pages_per_slot, cache.pool_page_groups):
            raise ValueError("policy config and KV cache disagree on slots, pages per slot or pool size")
        self.policy, self.cache, self.stream_handle = policy, cache, stream_handle
        self._cv = condition or threading.Condition()  # guards the policy, the queue and the fields below
        self._queue: deque[MapOp | UnmapOp] = deque()
        self._in_progress: MapOp | UnmapOp | None = None
        self._error: BaseException | None = None
        self._stopping = False
        self._events: deque[tuple[int, Any]] = deque()
        self._events_lock = threading.Lock()
        self._last_read: dict[int, int] = {}
        self._thread = threading.Thread(target=self._mapper, name="kv-mapper", daemon=True) if background else None
        self.metrics: dict[str, Any] = {"steps": 0, "step_failures": 0, "sync_page_groups": 0,
                                        "background_page_groups": 0, "cancelled_ops": 0, "step_latency_us": []}

    # ---- lifetime ------------------------------------------------------------------------------------
    def open(self) -> "Executor":
        """Open the cache if needed and start the mapper thread."""
        if not self.cache.bases:
            self.cache.open()
        if self._thread is not None and not self._thread.is_alive():
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop the mapper, wait for the GPU, unmap and release everything (idempotent)."""
        try:
            self._stop_mapper()
            self._wait_iteration(None)
        finally:
            self.cache.close()

    def __enter__(self) -> "Executor":
        try:
            return self.open()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stop_mapper(self) -> None:
        with self._cv:
            self._cancel_queued()
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join()

    # ---- slots ---------------------------------------------------------------------------------------
    def alloc_slot(self, first_target_tokens: int, reserve_tokens: int | None = None,
                   committed_page_groups: int = 0) -> int | None:
        """A slot for a new request, or ``None`` (no slot free on the GPU yet, or not enough memory); the
        arguments are those of :meth:`sim.memory.VAttentionPolicy.alloc_slot`."""
        self.poll_completed()
        with self._cv:
            return self.policy.alloc_slot(first_target_tokens, reserve_tokens, committed_page_groups)

    def free_slot(self, slot: int, last_read_iteration: int) -> None:
        """Release ``slot``; without deferred reclamation its pages are unmapped once the GPU is done.

        Background work is drained first (as in :meth:`step`): a page group committed after the policy
        released the slot would break the slot's mapped prefix.
        """
        self._drain_background()
        with self._cv:
            snapshot = _snapshot(self.policy)
            plan = self.policy.free_slot(slot, last_read_iteration)
            self._last_read[slot] = last_read_iteration
        if plan:
            self._apply_foreground(plan, snapshot)

    # ---- iterations and events -----------------------------------------------------------------------
    def iteration_launched(self, iteration: int, event: Any = None) -> None:
        """Record that iteration ``iteration``'s kernels are queued; ``event`` (``query()``/``synchronize()``)
        defaults to a driver event recorded on ``stream_handle``."""
        event = event if event is not None else self.cache.driver.record_event(self.stream_handle)
        with self._events_lock:
            self._events.append((iteration, event))

    def poll_completed(self) -> None:
        """Report every iteration whose event has completed to the policy (slots it read become reusable)."""
        with self._events_lock:
            while self._events and self._events[0][1].query():
                self._retire_event()

    def _retire_event(self) -> None:
        iteration, event = self._events.popleft()
        getattr(event, "close", lambda: None)()
        with self._cv:
            self.policy.iteration_completed(iteration)

    def _wait_iteration(self, iteration: int | None) -> None:
        """Block until the GPU finished ``iteration`` (every launched iteration when None)."""
        with self._events_lock:
            while self._events and (iteration is None or self._events[0][0] <= iteration):
                self._events[0][1].synchronize()
                self._retire_event()

    def _wait_for_unmapped_slots(self, plan: Plan) -> None:
        last = [self._last_read.get(op.slot, -1) for op in plan.unmaps]
        if last and max(last) >= 0:
            self._wait_iteration(max(last))

    # ---- foreground ----------------------------------------------------------------------------------
    def step(self, target_tokens: Mapping[int, int]) -> bool:
        """Make every slot's target length mapped before the iteration launches.

        Returns:
            True when mapped; False when the pool cannot cover it (nothing changed: preempt and retry).

        Raises:
            BackgroundMappingError: the mapper failed since the last call (its work was rolled back).
            VmmError: a driver call failed; cache and policy are as before the call.
        """
        start_ns = time.perf_counter_ns()
        self._raise_background_error()
        self._drain_background()
        with self._cv:
            snapshot = _snapshot(self.policy)
            plan = self.policy.step(target_tokens)
            plan = _with_window_unmaps(self.policy, plan)
        if plan is None:
            self.metrics["step_failures"] += 1
            return False
        self._apply_foreground(plan, snapshot)
        self.metrics["steps"] += 1
        self.metrics["sync_page_groups"] += plan.num_page_groups_mapped
        self.metrics["step_latency_us"].append((time.perf_counter_ns() - start_ns) * 1e-3)
        return True

    def _apply_foreground(self, plan: Plan, snapshot: dict[str, Any]) -> None:
        try:
            self._wait_for_unmapped_slots(plan)
            self.cache.apply(plan)
        except BaseException:
            with self._cv:
                vars(self.policy).update(snapshot)
            raise

    def _drain_background(self) -> None:
        """Cancel queued background ops and wait for the one in progress (the foreground check)."""
        with self._cv:
            self._cancel_queued()
            while self._in_progress is not None:
                self._cv.wait()
        self._raise_background_error()

    def _cancel_queued(self) -> None:
        while self._queue:  # newest first: the policy cancels a slot's reservations in reverse order
            self.policy.cancel(self._queue.pop())
            self.metrics["cancelled_ops"] += 1

    def _raise_background_error(self) -> None:
        with self._cv:
            error, self._error = self._error, None
        if error is not None:
            raise BackgroundMappingError(f"background mapper failed: {error}") from error

    # ---- background ----------------------------------------------------------------------------------
    def reclaim_idle(self) -> int:
        """Unmap the deferred pages of every idle slot now, in the foreground (a calibration grid does this
        between points whose slots hold more pages than the next point can spare; a serving loop never needs
        it: :meth:`step` reclaims what it is short of). Returns the page groups unmapped.

        Raises:
            VmmError: a driver call failed; cache and policy are as before the call.
        """
        self._raise_background_error()
        self._drain_background()
        with self._cv:
            snapshot = _snapshot(self.policy)
            plan = self.policy.reclaim_idle()
        if plan.unmaps:
            self._apply_foreground(plan, snapshot)
        return sum(op.num_pages for op in plan.unmaps)

    def map_ahead(self, lookahead_tokens: Mapping[int, int]) -> int:
        """Queue the policy's background plan (``step_async``): map ahead, pre-map idle slots, reclaim
        below the low watermark. Returns the number of ops queued (0 without a mapper thread)."""
        self._raise_background_error()
        if self._thread is None:
            return 0
        self.poll_completed()
        with self._cv:
            plan = self.policy.background_plan(lookahead_tokens)
            self._queue.extend(plan.unmaps + plan.maps)
            self._cv.notify_all()
        return len(plan.maps) + len(plan.unmaps)

    def wait_background(self) -> None:
        """Block until the mapper has emptied its queue (for tests and benchmarks)."""
        with self._cv:
            while self._queue or self._in_progress is not None:
                self._cv.wait()

    def _mapper(self) -> None:
        try:
            self.cache.driver.make_current()
        except BaseException as exc:
            with self._cv:
                self._error = exc
            return
        while (op := self._next_op()) is not None:
            self._run_op(op)

    def _next_op(self) -> MapOp | UnmapOp | None:
        with self._cv:
            while not self._queue and not self._stopping:
                self._cv.wait()
            if self._stopping:
                return None
            self._in_progress = self._queue.popleft()
            return self._in_progress

    def _run_op(self, op: MapOp | UnmapOp) -> None:
        plan = Plan(maps=(op,)) if isinstance(op, MapOp) else Plan(unmaps=(op,))
        try:
            self._wait_for_unmapped_slots(plan)
            self.cache.apply(plan)
        except BaseException as exc:
            with self._cv:
                self._cancel_queued()
                self.policy.cancel(op)
                self._error, self._in_progress = exc, None
                self._cv.notify_all()
            return
        with self._cv:
            self.policy.commit(op)
            self.metrics["background_page_groups"] += op.num_pages if isinstance(op, MapOp) else 0
            self._in_progress = None
            self._cv.notify_all()
