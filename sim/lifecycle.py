"""Request bookkeeping shared by the simulator's serving loop (:mod:`sim.engine`) and the hardware replay
(:mod:`hwbackend.replay`), so that both run the very same admission, look-ahead, pool-accounting and
token-emission rules; neither depends on a clock (times are passed in, in microseconds).

A class using the mixin provides: ``requests`` (list of :class:`sim.request.Request` in arrival order),
``_next_arrival`` (index), ``waiting`` (deque), ``running`` (list), ``num_done`` (int), ``policy`` (a memory
policy), ``config`` (:class:`sim.config.SimConfig`), ``_kv_bytes_per_token`` and ``_release(request)`` (give
the request's slot back to its memory manager).
"""
from __future__ import annotations

from sim.request import Request


class RequestBookkeeping:
    """Mixin: the time-free phases of one serving iteration."""

    _donates = False   # whether _after_compute does anything (set by a loop that overrides it)

    def _accept_arrivals(self, now_us: float) -> None:
        """Move requests that arrived by ``now_us`` to the waiting queue (or reject one that can never fit)."""
        requests = self.requests
        while self._next_arrival < len(requests) and requests[self._next_arrival].arrival_at_us <= now_us:
            request = requests[self._next_arrival]
            self._next_arrival += 1
            if self._cannot_ever_fit(request):
                request.status = "rejected"
                self.num_done += 1
            else:
                self.waiting.append(request)

    def _cannot_ever_fit(self, request: Request) -> bool:
        """Whether the request's last iteration needs more page groups than the pool minus its watermark."""
        policy = self.policy.config
        usable = policy.pool_page_groups - int(policy.admission_watermark_frac * policy.pool_page_groups)
        return policy.pages_for_tokens(request.final_kv_tokens) > usable

    def _lookahead(self, batch: list) -> dict[int, int]:
        """Slot -> tokens each running request is predicted to hold a few iterations ahead (decodes:
        ``eager_lookahead_steps`` more tokens; prefills: the next chunk)."""
        steps, budget, targets = self.config.eager_lookahead_steps, self.config.token_budget, {}
        for request, tokens in batch:
            after = request.computed + tokens
            if after == request.seq_len:
                if request.generated + 1 < request.output_tokens:
                    targets[request.slot] = min(after + steps, request.final_kv_tokens)
            else:
                targets[request.slot] = min(request.seq_len, after + budget)
        return targets

    def _pool_snapshot(self, batch: list) -> tuple[int, int, int, int, int]:
        """(physical, used, free, deferred page groups, tail waste bytes) during this iteration."""
        policy, tokens_per_page = self.policy, self.config.tokens_per_page
        scheduled = {r.slot: t for r, t in batch}
        held_tokens = [r.computed + scheduled.get(r.slot, 0) for r in self.running]
        used = sum(-(-t // tokens_per_page) for t in held_tokens)
        active_mapped = sum(policy.mapped[r.slot] for r in self.running)
        waste = (active_mapped * tokens_per_page - sum(held_tokens)) * self._kv_bytes_per_token
        return (policy.physical_page_groups, used, policy.free_page_groups, policy.deferred_page_groups, waste)

    def _start_running(self, request: Request, slot: int) -> None:
        """An admitted request holds ``slot`` and joins the running set, after every earlier admission."""
        request.slot = request.last_slot = slot
        request.admitted_order = self._admissions
        request.status = "running"
        self._admissions += 1
        self.running.append(request)

    def _drop(self, request: Request, status: str) -> None:
        """The request leaves for good (``finished`` or ``rejected``): its slot is released."""
        self._release(request)
        request.status = status
        self.num_done += 1

    def _requeue(self, victim: Request) -> None:
        """A preempted request goes back to the head of the waiting queue (its slot already released)."""
        victim.preemptions += 1
        victim.status = "waiting"
        self.waiting.appendleft(victim)

    def _after_compute(self, request: Request) -> None:
        """Hook after a request's KV grew (the simulator donates full prefix pages here)."""

    def _finish_iteration(self, batch: list, done_us: float, iteration: int | None = None) -> None:
        """Apply an iteration's tokens: KV grows; a chunk that completes the sequence emits a token; the
        request finishes at its last output token (its slot is freed through ``_drop``)."""
        donates = self._donates
        for request, tokens in batch:
            request.computed += tokens
            if donates:
                self._after_compute(request)
            if request.computed != request.prompt_tokens + request.generated:
                continue
            request.generated += 1
            if request.generated == 1:
                request.first_token_at_us = done_us
            if request.generated == request.output_tokens:
                request.completion_at_us = done_us
                self._drop(request, status="finished")
