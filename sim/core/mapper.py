"""The asynchronous mapper: a SimPy process standing for vAttention's background mapping thread.

It executes reserved background ops one page group at a time, serially (domain.md: the driver
serialises VMM calls, so parallel mapper threads do not help), committing each op to the policy when
its modelled latency has elapsed. The foreground takes over work it needs now: queued ops for the slots
of the next iteration are cancelled (and then mapped synchronously by the step), and an op in progress
for such a slot is waited for; the wait is charged to the iteration as a synchronous stall.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

import simpy

from sim.memory.plan import MapOp, Plan, UnmapOp


class AsyncMapper:
    """Background mapper process.

    Args:
        env: the SimPy environment (time in us).
        policy: object with ``commit(op)`` and ``cancel(op)`` (a vAttention policy).
        op_cost_us: modelled duration (us) of one op.
    """

    def __init__(self, env: simpy.Environment, policy, op_cost_us: Callable[[MapOp | UnmapOp], float]):
        self.env = env
        self.policy = policy
        self.op_cost_us = op_cost_us
        self.queue: deque[tuple[MapOp | UnmapOp, bool]] = deque()  # (op, reserved-in-policy)
        self.current: MapOp | UnmapOp | float | None = None
        self.current_reserved = False            # whether the op in progress changes the policy's accounting
        self.current_done: simpy.Event | None = None
        self.maps_done = 0
        self.unmaps_done = 0
        self.busy_us = 0.0
        self._wake = env.event()
        env.process(self._run())

    def submit_work(self, duration_us: float) -> None:
        """Queue background work that is not a VMM op (e.g. clearing freed pages), as a duration (us)."""
        if duration_us > 0:
            self.queue.append((float(duration_us), False))
            if not self._wake.triggered:
                self._wake.succeed()

    def submit(self, plan: Plan, reserved: bool = True) -> None:
        """Queue a plan's ops (unmaps first). ``reserved=False``: accounting already applied, time only."""
        for op in plan.unmaps:
            self.queue.append((op, reserved))
        for op in plan.maps:
            self.queue.append((op, reserved))
        if self.queue and not self._wake.triggered:
            self._wake.succeed()

    def take_over(self, slots: Iterable[int]) -> simpy.Event | None:
        """Cancel queued reserved maps for ``slots`` (newest first, keeping each slot's pages a prefix);
        return the event of the op in progress if it maps one of these slots, else ``None``."""
        wanted = set(slots)
        if not wanted or (not self.queue and self.current is None):   # nothing to cancel or wait for
            self._queue_settled_unmaps()
            return None
        kept: deque = deque()
        while self.queue:
            op, reserved = self.queue.pop()
            if reserved and isinstance(op, MapOp) and op.slot in wanted:
                self.policy.cancel(op)
            else:
                kept.appendleft((op, reserved))
        self.queue = kept
        self._queue_settled_unmaps()
        if self.current is not None and isinstance(self.current, MapOp) and self.current.slot in wanted:
            return self.current_done
        return None

    def cancel_all(self) -> tuple[int, simpy.Event | None]:
        """Cancel every queued reserved op (newest first).

        Returns:
            ``(cancelled, event)``: how many reserved ops were cancelled (each one changed the policy's
            accounting), and the completion event of the op in progress when that op is reserved (its
            commit will change the accounting), else ``None``. Queued and in-progress ops that are not
            reserved (unmaps already applied to the accounting, clearing work) are kept and not waited
            for: their completion frees nothing the foreground could use. ``(0, None)`` therefore means
            the mapper cannot change what the foreground sees, so waiting for it cannot make progress.
        """
        kept: deque = deque()
        cancelled = 0
        while self.queue:
            op, reserved = self.queue.pop()
            if reserved:
                self.policy.cancel(op)
                cancelled += 1
            else:
                kept.appendleft((op, reserved))
        self.queue = kept
        self._queue_settled_unmaps()
        return cancelled, (self.current_done if self.current is not None and self.current_reserved else None)

    def _queue_settled_unmaps(self) -> None:
        settled = self.policy.take_settled_unmaps()
        if settled:
            self.submit(settled, reserved=False)

    @property
    def idle(self) -> bool:
        return self.current is None and not self.queue

    def _run(self):
        while True:
            if not self.queue:
                self._wake = self.env.event()
                yield self._wake
                continue
            op, reserved = self.queue.popleft()
            self.current, self.current_reserved, self.current_done = op, reserved, self.env.event()
            cost_us = self.op_cost_us(op)
            yield self.env.timeout(cost_us)
            self.busy_us += cost_us
            if isinstance(op, float):            # background work that is not a VMM op (zeroing)
                self.current = None
                self.current_done.succeed()
                continue
            if reserved:
                self.policy.commit(op)
                self._queue_settled_unmaps()
            if isinstance(op, MapOp):
                self.maps_done += op.num_pages
            else:
                self.unmaps_done += op.num_pages
            self.current = None
            self.current_done.succeed()
