"""The two kinds of instance of a disaggregated deployment (:mod:`sim.cluster.disagg`): a
:class:`PrefillInstance` computes prompts and holds a handed-over request's pages until its KV has landed on
the decode side; a :class:`DecodeInstance` admits handed-over requests, maps their pages and decodes once the KV
has landed. Each is a :class:`sim.core.engine.Simulator` with hooks the cluster
(:class:`sim.cluster.disagg.DisaggCluster`) sets; the request flow and its sources are in the docstring of
:mod:`sim.cluster.disagg`.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import simpy

from sim.core.engine import Simulator
from sim.core.request import Request
from sim.setup.config import SimConfig


class _ComputeClock:
    """A compute model that tells its instance when an iteration's compute starts. The engine asks for an
    iteration's compute time once its synchronous phase (page maps, block tables, swap, clearing) has ended,
    at the simulated time compute starts; everything else is delegated to the wrapped model."""

    def __init__(self, model, on_start: Callable[[float], None]):
        self._model, self._on_start = model, on_start

    def iteration_us(self, shape) -> float:
        compute_us = self._model.iteration_us(shape)
        self._on_start(compute_us)
        return compute_us

    def __getattr__(self, name):
        return getattr(self._model, name)


class PrefillInstance(Simulator):
    """A prefill instance: requests arrive with one output token; a request handed over keeps its slot and
    pages (``held``) after its prefill until :meth:`free_held` (the transfer has landed).

    While slots are held, a request that cannot get pages is preempted (and waits at the head of the queue)
    rather than rejected as ``pages``, and an empty iteration waits for a slot to be freed: the pool is full of
    KV on its way out, which every landing gives back.

    Args:
        index: instance number within the role.
        on_prefilled: ``(instance, request) -> bool`` called when a request's prefill emits its first token;
            True: keep its KV for a transfer.
        on_started: ``(instance, request)`` called when an iteration first schedules a request (streaming:
            the hand-over to a decode instance); None: not called.
        on_rejected: ``(instance, request)`` called when a request is rejected at run time.
        record_chunks: keep each request's prefill chunks ``(compute start, compute end, tokens)`` for
            layer-wise streaming.
    """

    _cohort_ok = False    # the request lifecycle differs here (sim.core.cohort assumes the plain one)

    role = "prefill"

    def __init__(self, index: int, config: SimConfig, env: simpy.Environment, vmm, compute,
                 on_prefilled: Callable[["PrefillInstance", Request], bool],
                 on_started: Callable[["PrefillInstance", Request], None] | None = None,
                 on_rejected: Callable[["PrefillInstance", Request], None] | None = None, record_chunks: bool = False):
        super().__init__(config, _empty_trace(), vmm=vmm, compute=compute, env=env)
        self.index = index
        self.compute = _ComputeClock(self.compute, self._compute_started)
        self._on_prefilled, self._on_started, self._on_rejected = on_prefilled, on_started, on_rejected
        self._started: set[Request] = set()
        self.chunks: dict[Request, list] | None = {} if record_chunks else None
        self.held: set[Request] = set()
        self._await_release = False               # a request was preempted to wait for held KV (_drop)
        self.compute_start_us = 0.0               # when the current (or last) iteration's compute started
        self._release_wait: simpy.Event | None = None
        self.process: simpy.Process | None = None
        self.kv_bytes_sent = 0

    def start(self) -> None:
        """Start the serving process and keep it (the cluster waits for every prefill instance to end)."""
        self.process = self.env.process(self._serve())

    def _compute_started(self, compute_us: float) -> None:
        self.compute_start_us = self.env.now

    def _schedule(self):
        batch, plan, preempted = yield from super()._schedule()
        if self._on_started is not None:
            for request, _ in batch:
                if request not in self._started:
                    self._started.add(request)
                    self._on_started(self, request)
        return batch, plan, preempted

    def _finish_iteration(self, batch, done_us, iteration=None):
        if self.chunks is not None:
            for request, tokens in batch:
                if tokens:
                    if request.computed == 0 or request not in self.chunks:      # (re-)prefill from scratch
                        self.chunks[request] = []
                    self.chunks[request].append((self.compute_start_us, done_us, tokens))
        super()._finish_iteration(batch, done_us, iteration)

    def _release(self, request: Request) -> None:
        if request.generated == request.output_tokens and self._on_prefilled(self, request):
            self.running.remove(request)
            self.held.add(request)
            return
        super()._release(request)

    def _drop(self, request: Request, status: str) -> None:
        if status == "rejected" and request.reject_reason == "pages" and self.held:
            request.reject_reason = ""          # no pages now, but held KV will be freed: wait for it
            self._preempt(request)
            self._await_release = True          # (re-admitted at once, it recomputed its first chunk in a loop)
            return
        super()._drop(request, status)
        if status == "rejected" and self._on_rejected is not None:
            self._on_rejected(self, request)

    def _admit(self, request: Request, first_tokens: int) -> int:
        """As :meth:`Simulator._admit`, but none while a request preempted for want of pages waits for held KV to
        be freed (helper-62: under chunk admission the victim was re-admitted at once and preempted again, 313
        times, recomputing its first chunk until the transfer landed)."""
        if self._await_release and self.held:
            self._admission_refused = True
            return 0
        return super()._admit(request, first_tokens)

    def free_held(self, request: Request) -> None:
        """The transfer of ``request``'s KV has landed: give its slot back (as a finished request's)."""
        self._await_release = False
        self.held.remove(request)
        self._free_slot(request)
        if self._release_wait is not None and not self._release_wait.triggered:
            self._release_wait.succeed()

    def _unblock_admission(self):
        """Nothing could be scheduled and nothing runs: while slots are held for transfers, wait for one to
        be freed instead of rejecting the head of the queue."""
        if self.held and not self.running:
            if (yield from self._settle_mapper()):
                return
            self._release_wait = self.env.event()
            yield self._release_wait
            return
        head = self.waiting[0] if self.waiting else None
        yield from super()._unblock_admission()
        if head is not None and head.status == "rejected" and self._on_rejected is not None:
            self._on_rejected(self, head)


class DecodeInstance(Simulator):
    """A decode instance: requests are handed over with their prompt KV computed elsewhere
    (:meth:`hand_over`); admission maps their pages; they join the running set when their KV lands
    (:meth:`land`). No fast-forwarding of decode runs (hand-overs arrive at times no router knows ahead)."""

    _cohort_ok = False    # the request lifecycle differs here (sim.core.cohort assumes the plain one)

    role = "decode"

    def __init__(self, index: int, config: SimConfig, env: simpy.Environment, vmm, compute,
                 on_mapped: Callable[["DecodeInstance", Request], None]):
        super().__init__(config, _empty_trace(), vmm=vmm, compute=compute, env=env, coalesce=False)
        self.index = index
        self.compute = _ComputeClock(self.compute, self._compute_started)
        self._on_mapped = on_mapped
        self.awaiting: set[Request] = set()       # handed over, KV not landed yet
        self.in_transfer: list[Request] = []      # admitted (pages mapped), KV not landed yet
        self._just_admitted: list[Request] = []
        self._landing_wait: simpy.Event | None = None
        self._await_landing = False               # a request was preempted to wait for a landing (_drop)
        self.compute_start_us = 0.0               # when the current (or last) iteration's compute started
        self.kv_bytes_received = 0

    def hand_over(self, request_id: int, prompt_tokens: int, output_tokens: int) -> Request:
        """A request whose prompt KV is being computed or sent elsewhere arrives now; returns it."""
        request = self.submit(request_id, prompt_tokens, output_tokens, computed_tokens=prompt_tokens)
        self.awaiting.add(request)
        return request

    def _schedule(self):
        """Schedule as usual; requests admitted now whose KV has not landed leave the batch and the running
        set (their pages are mapped in this iteration, charged as usual). When nothing else runs, the
        iteration maps their pages only (zero tokens: no compute)."""
        batch, plan, preempted = yield from super()._schedule()
        admitted = [request for request, _ in batch if request in self.awaiting]
        if admitted:
            for request in admitted:
                self.running.remove(request)
                self.in_transfer.append(request)
            self._just_admitted.extend(admitted)
            batch = [(r, t) for r, t in batch if r not in self.awaiting] or [(r, 0) for r in admitted]
        return batch, plan, preempted

    def _drop(self, request: Request, status: str) -> None:
        if status == "rejected" and request.reject_reason == "pages" and self.in_transfer:
            request.reject_reason = ""          # no pages now, but requests in transfer hold them: wait
            self._preempt(request)
            self._await_landing = True          # (as the prefill instance's _await_release)
            return
        super()._drop(request, status)

    def _admit(self, request: Request, first_tokens: int) -> int:
        """As :meth:`Simulator._admit`, but none while a request preempted for want of pages waits for a landing."""
        if self._await_landing and self.in_transfer:
            self._admission_refused = True
            return 0
        return super()._admit(request, first_tokens)

    def _compute_started(self, compute_us: float) -> None:
        self.compute_start_us = self.env.now
        if self._just_admitted:
            admitted, self._just_admitted = self._just_admitted, []
            for request in admitted:
                self._on_mapped(self, request)

    def land(self, request: Request) -> None:
        """``request``'s KV has landed now: it joins the running set; its first token is emitted now."""
        self.awaiting.discard(request)
        self.in_transfer.remove(request)
        request.first_token_at_us = request.last_token_at_us = self.env.now
        self.running.append(request)
        self._wake()

    def cancel(self, request: Request, reason: str) -> None:
        """A handed-over request will never get its KV (its prefill was rejected): drop it as rejected."""
        self._accept_arrivals(self.env.now)
        self.awaiting.discard(request)
        if request in self.in_transfer:
            self.in_transfer.remove(request)
            self._perform_free(self.policy.free_slot(request.slot, self.policy.completed_iteration))
            request.slot = -1
        elif request in self.waiting:
            self.waiting.remove(request)
        else:
            raise RuntimeError(f"internal error: request {request.request_id} is neither waiting nor in transfer")
        request.status, request.reject_reason = "rejected", reason
        self.num_done += 1
        self._wake()

    def _wake(self) -> None:
        self._await_landing = False
        for event in (self._arrival, self._landing_wait):
            if event is not None and not event.triggered:
                event.succeed()

    def _unblock_admission(self):
        """Nothing could be scheduled and nothing runs: while admitted requests wait for their KV, wait for a
        landing (their pages fill the pool) instead of rejecting the head of the queue."""
        if self.in_transfer and not self.running:
            if (yield from self._settle_mapper()):
                return
            self._landing_wait = self.env.event()
            yield self._landing_wait
            return
        yield from super()._unblock_admission()


def _empty_trace() -> pd.DataFrame:
    return pd.DataFrame({"request_id": pd.Series([], dtype=np.int64), "arrival_s": pd.Series([], dtype=float),
                         "prompt_tokens": pd.Series([], dtype=np.int64), "output_tokens": pd.Series([], dtype=np.int64)})
