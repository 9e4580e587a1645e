"""The serving loop's admission and release side (a part of :class:`sim.core.engine.Simulator`): schedule an
iteration (:mod:`sim.core.scheduler`), admit a request into a slot (its pages, a prefix-cache hit), preempt,
release and free a slot, with the zeroing and clearing costs of freed memory.

:class:`Admission` is a mixin: its methods use the simulator's state (``self.policy``, ``self.cost``, the
counters) set up by :meth:`sim.core.engine.Simulator.__init__`.
"""
from __future__ import annotations

from collections import deque

from sim.core.request import Request
from sim.memory.plan import EMPTY_PLAN, MapOp, Plan


class Admission:
    """Admission, preemption and release of :class:`sim.core.engine.Simulator` (module docstring)."""

    def _admit(self, request: Request, first_tokens: int) -> int:
        """Take a slot and map the first chunk's pages now, so that several admissions in one scheduling
        round cannot promise the same free pages (vLLM allocates blocks at admission the same way). With a
        prefix cache, the cached prefix is mapped first and its tokens are skipped. Returns the tokens
        scheduled for the request (0: not admitted).

        An attempt that repeats the last refused one (the same request and arguments) while the policy's
        admission epoch is unchanged and no more page groups are free is refused without asking the policy
        (:mod:`sim.memory.vattention`, "Admission epoch": it would be refused again; the refusal itself changes
        nothing). ``_skip_refusals`` off (tests) asks every time."""
        first, reserve, committed = self._admission_args(request, first_tokens)
        skips = self._skip_refusals and getattr(self.policy, "refusals_repeat", False)   # a policy set after start
        if skips and request is self._refused_request:
            key = self._refusal_key(request, first_tokens, first, reserve, committed)
            if key == self._refused_key and self.policy.free_page_groups <= self._refused_free:
                self._admission_refused = True          # refused again: nothing it reads changed for the better
                self._admissions_skipped += 1
                return 0
        cached, target = (0, 0), first
        own = self._own_pages_arg(request)
        if self.prefix and (request.hash_ids is not None or own) and not request.computed:
            # look the cache up first, then ask only for the pages beyond the hit (vLLM v1)
            hit_tokens, *cached = self.policy.admission_credit(request.hash_ids or (), request.prompt_tokens, *own)
            if self.tiers is not None and request.hash_ids is not None:   # tier pages need fresh groups, not credit
                hit_tokens += self.tiers.credit_tokens(request, hit_tokens)
            target = hit_tokens + min(first_tokens, request.remaining - hit_tokens)
        slot = self.policy.alloc_slot(target, reserve, committed, tuple(cached))
        if slot is None:
            self._admission_refused = True
            if skips:         # a refusal changes nothing: the epoch and arguments are those it was asked with
                self._refused_request, self._refused_free = request, self.policy.free_page_groups
                self._refused_key = self._refusal_key(request, first_tokens, first, reserve, committed)
            return 0
        stale_groups = self.policy.mapped[slot]      # deferred pages: hold the previous request's KV
        hit_tokens = self._map_prefix(request, slot, own)
        first_tokens = min(first_tokens, request.remaining)
        if self._computed_hint is not None:
            self._computed_hint[slot] = request.computed
        plan = self.policy.step({slot: request.seq_len if self._allocates_whole_prompt else request.computed + first_tokens})
        self._take_window_unmaps()
        if plan is None:
            request.computed -= hit_tokens
            self._perform_free(self.policy.free_slot(slot, self.policy.completed_iteration))
            return 0
        if self.prefix:
            self.policy.record_admission(self._last_hit, preempted=request.preemptions > 0)
            tier_tokens = self.tiers.commit(request) if self.tiers is not None else 0
            if request.preemptions:
                request.preempted_hit_tokens += hit_tokens - tier_tokens
            else:
                request.prefix_hit_tokens = hit_tokens - tier_tokens
        if self.zero_mode == "on-reuse":
            self._pending_zero_groups += stale_groups
        self._pending_plans.append(plan)
        if request.swapped:
            self.swap.swap_in(request.computed)
            request.swapped = False
        self._start_running(request, slot, self._iteration_start_us)   # (not now: a wait for the mapper came first)
        if self._donates_when_scheduled:
            self._donate_scheduled(((request, first_tokens),))
        return first_tokens

    def _donate_scheduled(self, batch) -> None:
        """vLLM v1 caches a request's full blocks when it schedules them (``KVCacheManager.allocate_slots`` ->
        ``cache_blocks(min(computed + new, num_tokens))``, before the forward pass), so a request scheduled later
        in the same step hits blocks this step computes (the attention of layer L reads the KV the step wrote at
        layer L). Paged prefix caching only: vAttention's copy-on-write of a partial page copies before the
        forward pass, so its pages are donated once computed (``_after_compute``)."""
        policy = self.policy
        for request, tokens in batch:
            if request.hash_ids is not None and request.computed < request.prompt_tokens:
                policy.donate(request.slot, request.hash_ids, request.prompt_tokens,
                              min(request.prompt_tokens, request.computed + tokens))

    def _refusal_key(self, request, first_tokens: int, first: int, reserve, committed: int) -> tuple:
        """What a refused admission was asked with (:meth:`_admit`): a repeat with the same key, at the same
        admission epoch and no more free page groups, is refused again."""
        return first_tokens, first, reserve, committed, request.generated, self.policy.admission_epoch

    def _map_prefix(self, request: Request, slot: int, own: tuple = ()) -> int:
        """Map the cached prefix of a request from scratch (``own``: :meth:`_own_pages_arg`); the tokens skipped."""
        if not self.prefix:
            return 0
        # every admission prepares the slot; only a request starting from scratch looks the cache up
        ids = request.hash_ids if request.hash_ids is not None and not request.computed else ()
        hit = self.policy.admit_prefix(slot, ids, request.prompt_tokens, *(own if not request.computed else ()))
        self._pending_plans.append(hit.plan)
        self._pending_copy_bytes += hit.cow_tokens * self._kv_bytes_per_token
        request.computed += hit.hit_tokens     # a swapped-in request keeps its KV (no lookup: hit 0)
        self._last_hit = hit
        if self.tiers is not None:             # pages past the HBM hit loaded from DRAM / SSD
            loaded = self.tiers.plan(request, ids, hit)
            request.computed += loaded
            return hit.hit_tokens + loaded
        return hit.hit_tokens

    def _own_pages_arg(self, request: Request) -> tuple:
        """The lookup's ``own`` argument, ``((owner, seq_len),)``, for a prefix cache's re-admission after a recompute
        preemption (vLLM v1 looks up ``seq_len - 1`` tokens; pages kept by
        :meth:`sim.memory.donation.Donation.keep_own_pages`); else ``()``."""
        own = self.prefix and request.preemptions and not request.swapped
        return ((request.request_id, request.seq_len),) if own else ()

    def _schedule(self):
        """Schedule one iteration (order in :mod:`sim.core.scheduler`): the running part gets its memory first
        (preempting while the pool is short), then waiting requests are admitted unless that preempted.
        Returns ``(batch, plan of the running part, preempted)``; admissions' plans are pending."""
        scheduler, budget = self.scheduler, self.config.token_budget
        cohort = self.cohort
        running, members = (self._solo, cohort.size) if cohort is not None else (self.running, 0)
        self._cohort_scheduled = False
        # vLLM v0 (_schedule_default): while a request is swapped out no prompt is admitted; the running requests
        # decode, and swapped requests come back into that decode iteration unless it preempted
        swapped_back = scheduler.prefill_first and self.waiting and self.waiting[0].swapped
        if scheduler.prefill_first and not swapped_back:
            admitted = yield from self._admit_waiting(budget)
            if admitted:
                return admitted, EMPTY_PLAN, False
            batch, _ = scheduler.running_part(running, budget)
            if not batch and not members:
                return batch, EMPTY_PLAN, False
            self._cohort_scheduled = members > 0
            batch, plan = yield from self._step(batch)
            if self._donates_when_scheduled:
                self._donate_scheduled(batch)
            return batch, plan, self._iteration_preemptions > 0
        # the cohort's decodes come first (every decode fits the budget when there is a cohort)
        batch, budget = scheduler.running_part(running, budget - members)
        plan = EMPTY_PLAN
        self._cohort_scheduled = members > 0
        if batch or members:
            batch, plan = yield from self._step(batch)
            if self._donates_when_scheduled:
                self._donate_scheduled(batch)
        preempted = self._iteration_preemptions > 0
        if not preempted:
            batch = batch + (self._admit_swapped(budget) if swapped_back else (yield from self._admit_waiting(budget)))
        return batch, plan, preempted

    def _admit_swapped(self, budget: int) -> list:
        """The swapped-out requests at the head of the queue, admitted in order by the scheduler's waiting part
        (swap-in) while they fit; the rest go back to the head, in order."""
        waiting, swapped = self.waiting, deque()
        while waiting and waiting[0].swapped:
            swapped.append(waiting.popleft())
        admitted = self.scheduler.admit_part(swapped, budget, self._admit)
        waiting.extendleft(reversed(swapped))
        return admitted

    def _admit_waiting(self, budget: int):
        """The scheduler's waiting part; when an admission was refused while the mapper holds maps on idle
        slots (eager allocation), those maps are taken over - queued ones cancelled, one in progress waited
        for (a synchronous stall) - and admission is tried again with the budget left: eager allocation
        never delays an admission that a free slot and free pages allow (issue 28, ``eager_admit.csv``)."""
        self._admission_refused = False
        admitted = self.scheduler.admit_part(self.waiting, budget, self._admit)
        idle = self.policy.idle_slots_mapping() if self._admission_refused and self.mapper else None
        if idle:       # (no generator made when no idle slot has maps in flight: the common refusal)
            yield from self._take_over_idle_maps(idle)
            self._admission_refused = False
            left = budget - sum(tokens for _, tokens in admitted)
            if left > 0:
                admitted = admitted + self.scheduler.admit_part(self.waiting, left, self._admit)
        return admitted

    def _take_over_idle_maps(self, idle: list[int]):
        """Cancel the mapper's queued maps on the idle slots ``idle`` (those with maps in flight, from the
        policy's ``idle_slots_mapping``) and wait for its op in progress if it maps one."""
        in_progress = self.mapper.take_over(idle)
        if in_progress is not None:
            yield in_progress

    def _settle_mapper(self):
        """Cancel the mapper's reserved ops, or wait for its reserved op in progress; returns whether the
        policy's accounting changed (so that retrying can succeed). Unreserved background work (unmaps already
        applied, clearing) is not waited for: it frees nothing the foreground can use."""
        if not self.mapper or self.mapper.idle:
            return False
        cancelled, in_progress = self.mapper.cancel_all()
        if cancelled:
            return True
        if in_progress is not None:
            yield in_progress
            return True
        return False

    def _unblock_admission(self):
        """Nothing could be scheduled: let the mapper's reserved work settle (it holds pages), else reject
        an unservable head of the queue. Every pass changes state (ops cancelled, time advanced, or a
        request rejected) or raises: an empty batch with requests running is an internal error."""
        if (yield from self._settle_mapper()):
            return
        if self.running:
            raise RuntimeError(f"internal error: the scheduler returned an empty batch at t={self.env.now:.1f} us "
                               f"with {self._state_line()}")
        head = self.waiting.popleft()
        head.status = "rejected"
        head.reject_reason = "pages"
        self.num_done += 1

    def _admission_pool(self) -> list:
        return self._solo if self.cohort is not None else self.running

    def _start_running(self, request: Request, slot: int, now_us: float) -> None:
        super()._start_running(request, slot, now_us)
        if self.cohort is not None:
            self._solo.append(request)

    def _preempt(self, victim: Request) -> None:
        """Preempt by swap (KV copied to host, kept) when enabled and the host has room, else by recompute (where
        the policy caches a request's own pages, its full pages of KV stay cached for its re-admission first)."""
        self._leave_running(victim)
        victim.swapped = self.swap.swap_out(victim.computed)
        if not victim.swapped and self._keeps_own_pages:
            self.policy.keep_own_pages(victim.slot, victim.request_id, victim.computed)
        self._free_slot(victim)
        if not victim.swapped:
            self._drop_kv(victim)
        self._iteration_preemptions += 1
        self._requeue(victim)

    def _release(self, request: Request) -> None:
        self._leave_running(request)
        self._free_slot(request)

    def _leave_running(self, request: Request) -> None:
        """Off the running list and the decode cohort (which brings its tokens up to date); the slot is kept."""
        self.running.remove(request)
        if self.cohort is not None:
            if request in self.cohort:
                self.cohort.leave(request)
            else:
                self._solo.remove(request)

    def _free_slot(self, request: Request) -> None:
        """Give the request's slot back to the policy (clearing its pages first under zero on-free)."""
        if self.zero_mode == "on-free":
            self._zero_at_free(self.policy.mapped[request.slot])
        self._perform_free(self.policy.free_slot(request.slot, self.policy.completed_iteration))
        request.slot = -1

    def _zero_us(self, page_groups: int) -> float:
        """Clearing ``page_groups`` page groups: bytes / memset bandwidth (``config.memset_bytes_per_s``)."""
        return page_groups * self.config.page_group_bytes / self._zero_bytes_per_us

    def _zero_at_free(self, page_groups: int) -> None:
        if not page_groups:
            return
        if self.mapper:
            self.zero_bytes["background"] += page_groups * self.config.page_group_bytes
            self.mapper.submit_work(self._zero_us(page_groups))
        else:
            self._pending_zero_groups += page_groups

    def _take_clear_copy_us(self) -> float:
        """Critical-path memory clearing and copying owed by this iteration: stale pages of reused slots and
        recycled pages taken by synchronous maps (zero on-reuse), frees under synchronous mapping (zero
        on-free), and copy-on-write of partially shared prefix pages."""
        if not (self._pending_zero_groups or self._pending_copy_bytes) and self.zero_mode != "on-reuse":
            return 0.0                  # nothing owed (the sum below would be 0.0 + 0.0)
        if self.zero_mode == "on-reuse":
            self._pending_zero_groups += self.policy.take_recycled()
        groups, self._pending_zero_groups = self._pending_zero_groups, 0
        self.zero_bytes["critical"] += groups * self.config.page_group_bytes
        copy_bytes, self._pending_copy_bytes = self._pending_copy_bytes, 0
        self.cow_bytes += copy_bytes
        # a copy reads and writes every byte: 2 x bytes at the (read + written) copy bandwidth
        return self._zero_us(groups) + 2 * copy_bytes / self._copy_bytes_per_us

    def _background_op_us(self, op) -> float:
        """A background op's duration: its VMM calls, plus clearing a recycled page under on-reuse."""
        cost_us = self.cost.op_us(op)
        if self.zero_mode == "on-reuse" and isinstance(op, MapOp) and self.policy.reserved_is_recycled(op):
            self.zero_bytes["background"] += op.num_pages * self.config.page_group_bytes
            cost_us += self._zero_us(op.num_pages)
        return cost_us

    def _hybrid_counters(self) -> dict:
        """Window-aware allocation's figures for the summary: per-group sizes, window crossings, VMM calls."""
        calls = getattr(self.cost, "calls", None)
        return {"kv_groups": self.config.hybrid.figures(), "window_crossings": getattr(self.policy, "window_crossings", 0),
                **({"map_calls": calls["map"], "unmap_calls": calls["unmap"]} if calls is not None else {})}

    def _take_window_unmaps(self) -> None:
        """Pages that left a window (sim.memory.hybrid, ``window=unmap``): unmapped by the background mapper,
        or on the critical path of the next iteration without one."""
        if self._computed_hint is not None:
            self._perform_free(self.policy.take_window_unmaps())

    def _perform_free(self, plan: Plan) -> None:
        """Unmaps a free returns (deferred reclamation off): in the background, or on the critical path."""
        if not plan:
            return
        if self.mapper:
            self.mapper.submit(plan, reserved=False)
        else:
            self._pending_plans.append(plan)
