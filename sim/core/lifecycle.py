"""Request bookkeeping shared by the simulator's serving loop (:mod:`sim.core.engine`) and the hardware replay
(:mod:`hwbackend.replay.loop`), so that both run the very same admission, look-ahead, pool-accounting and
token-emission rules; neither depends on a clock (times are passed in, in microseconds).

A class using the mixin provides: ``requests`` (list of :class:`sim.core.request.Request` in arrival order),
``_next_arrival`` (index), ``waiting`` (deque), ``running`` (list), ``num_done`` (int), ``tbt_us`` (list of
time-between-token gaps, us, appended to per emitted token after a request's first), ``policy`` (a memory
policy), ``config`` (:class:`sim.setup.config.SimConfig`), ``_kv_bytes_per_token`` and ``_release(request)`` (give
the request's slot back to its memory manager).
"""
from __future__ import annotations

from functools import cached_property

from sim.memory.layer_groups import kv_bytes_for_tokens

from sim.timing.compute import ATTENTION_TILE_ROWS
from sim.core.request import Request


class RequestBookkeeping:
    """Mixin: the time-free phases of one serving iteration."""

    _donates = False   # whether _after_compute does anything (set by a loop that overrides it)
    _donates_when_scheduled = False   # paged prefix caching caches blocks as scheduled (sim.core.admission)
    _keeps_own_pages = False          # ... and a preempted request's own pages (sim.core.admission._preempt)
    _block_terms = False   # whether _iteration_pass counts attention thread blocks (a block-form compute model)

    def _accept_arrivals(self, now_us: float) -> None:
        """Move requests that arrived by ``now_us`` to the waiting queue (or reject one that can never fit)."""
        requests = self.requests
        while self._next_arrival < len(requests) and requests[self._next_arrival].arrival_at_us <= now_us:
            request = requests[self._next_arrival]
            self._next_arrival += 1
            reason = self._cannot_ever_fit(request)
            if reason:
                request.status = "rejected"
                request.reject_reason = reason
                self.num_done += 1
            else:
                self.waiting.append(request)

    def _cannot_ever_fit(self, request: Request) -> str:
        """Why the request can never be served on this replica (``""`` if it can), see :func:`unservable_reason`;
        a window-aware policy (:class:`sim.memory.hybrid.HybridPolicy`) counts its groups' units at the
        request's peak (:meth:`~sim.memory.hybrid.HybridPolicy.peak_units`, the chunks this scheduler gives a
        request alone: the whole prompt for ``vllm``, the token budget for ``sarathi``)."""
        reason = unservable_reason(self.policy.config, request.final_kv_tokens)
        peak_units = getattr(self.policy, "peak_units", None)
        if reason or peak_units is None:
            return reason
        config = self.config
        chunk = request.prompt_tokens if config.scheduler == "vllm" else config.token_budget
        need = peak_units(request.prompt_tokens, request.final_kv_tokens, chunk,
                          request.prompt_tokens if self._whole_prompt_admission else None)
        return "pool" if beyond_pool(self.policy.config, need) else ""

    def _admission_args(self, request: Request, first_tokens: int) -> tuple[int, int | None, int]:
        """Arguments of the policy's ``alloc_slot`` under the run's admission rule
        (:data:`sim.core.scheduler.ADMISSION_RULES`): ``(first_target_tokens, reserve_tokens,
        committed_page_groups)``. ``whole-prompt`` reserves the request's whole (re-)prefill, ``seq_len``
        tokens, on top of the prompt pages that running requests still in their prefill have not mapped
        (mapped or in flight) yet; ``chunk`` only the first chunk."""
        first = request.computed + first_tokens
        if not self._whole_prompt_admission:
            return first, None, 0
        policy = self.policy
        pages_for, mapped, in_flight = policy.config.pages_for_tokens, policy.mapped, policy.in_flight_maps
        committed = 0
        for other in self._admission_pool():
            if other.prompt_tokens + other.generated - other.computed > 1:      # still in its (re-)prefill
                committed += max(0, pages_for(other.prompt_tokens + other.generated) - mapped[other.slot]
                                 - in_flight[other.slot])
        return first, request.seq_len, committed

    def _admission_pool(self) -> list:
        """Running requests that may still be in their (re-)prefill (all of them here; the simulator leaves
        out its decode cohort, :mod:`sim.core.cohort`)."""
        return self.running

    @cached_property
    def _groups_count_used(self) -> bool:
        """Whether the policy counts used pages and tail waste per layer group itself
        (:meth:`sim.memory.hybrid.HybridPolicy.used_and_waste`: window-aware allocation, in pool units)."""
        return hasattr(self.policy, "used_and_waste") and self.cohort is None

    @cached_property
    def _static_groups(self):
        """``(layer groups, unit bytes)`` of static reservation per layer group (``static:window=reserve``), whose
        unit is one request's reservation over every group (:class:`sim.memory.hybrid_sizing.HybridSizing`), so
        its tail waste is the reservation's bytes less the bytes the request's tokens hold in each group (not
        ``max_len`` tokens at every layer's bytes, which put 311 GB of waste on an H200); else None."""
        config = self.config
        if config.policy != "static" or not config.hybrid_alloc:
            return None
        return config.layer_groups, config.hybrid.unit_bytes

    @cached_property
    def _whole_prompt_admission(self) -> bool:
        """Whether the run admits under the ``whole-prompt`` rule (``config.admission_rule``, fixed for a run)."""
        return self.config.admission_rule == "whole-prompt"

    @cached_property
    def _allocates_whole_prompt(self) -> bool:
        """Whether an admission allocates the blocks of the request's whole (re-)prefill at once: paged block tables
        under the ``whole-prompt`` rule (vLLM v0 ``BlockSpaceManager.allocate`` and Sarathi-Serve
        ``BaseBlockSpaceManager.allocate`` take ``len(seq.logical_token_blocks)`` blocks at admission), so that
        running decodes cannot take blocks a prompt was admitted with (helper-64: a chunked prefill admitted whole
        was preempted after 78 tokens when decodes took its counted blocks). vAttention maps chunk by chunk (its
        engine clears ``promised_blocks`` each iteration); window-aware (hybrid) groups keep their own rule."""
        return (self._whole_prompt_admission and self.config.policy == "paged"
                and not getattr(self.config, "hybrid_alloc", False))

    def _iteration_pass(self, batch: list, lookahead: bool = True, running: list | None = None,
                        cohort=None) -> tuple:
        """Everything one iteration needs from its batch, in one pass over it (and over running requests left
        out of it, if any).

        Returns:
            ``(new_tokens, attention_pairs, kv_read_tokens, logit_sequences, max_context_tokens, prefill_tokens,
            targets, snapshot, attention_blocks, block_keys)``: the batch shape (the block terms 0 unless
            ``_block_terms``) (:class:`sim.timing.compute.BatchShape` fields), the tokens of chunks
            that are not single decode tokens, the look-ahead targets (slot -> tokens a few iterations ahead:
            decodes ``eager_lookahead_steps`` more tokens, prefills the next chunk; only the slots whose target
            is beyond their mapped and in-flight pages, the only ones ``VAttentionPolicy.background_plan`` maps
            for; empty unless ``lookahead``), and the pool snapshot ``(physical, used, free, deferred page
            groups, tail waste bytes)`` during the iteration. ``running``: the running requests ``batch`` is drawn from (default
            :attr:`running`); ``cohort``: ``(scheduled, DecodeCohort)``, running requests held apart
            (:mod:`sim.core.cohort`), counted as decodes of this iteration when ``scheduled``, else as idle.
        """
        policy, tokens_per_page = self.policy, self.config.tokens_per_page
        mapped = policy.mapped
        in_flight = policy.in_flight_maps   # look-ahead targets already mapped or in flight that far are left out
        steps, budget = self.config.eager_lookahead_steps, self.config.token_budget
        new = pairs = kv_read = logits = longest = prefill = idle_held = used = active_mapped = blocks = block_keys = 0
        targets = {}
        rows, block_terms = ATTENTION_TILE_ROWS, self._block_terms
        for request, tokens in batch:
            context = request.computed
            generated = request.generated
            after = context + tokens
            new += tokens
            kv_read += context
            if after > longest:
                longest = after
            used += -(-after // tokens_per_page)
            slot = request.slot
            slot_mapped = mapped[slot]
            active_mapped += slot_mapped
            if tokens == 1 and generated and after == request.prompt_tokens + generated:   # a decode
                pairs += context + 1.0        # tokens * (context + (tokens + 1) / 2), same float
                logits += 1
                if block_terms:
                    blocks += 1
                    block_keys += context + 1
                if lookahead and generated + 1 < request.output_tokens:
                    final = request.final_kv_tokens
                    target = after + steps if after + steps < final else final
                    if target > (slot_mapped + in_flight[slot]) * tokens_per_page:
                        targets[slot] = target
                continue
            seq_len = request.prompt_tokens + generated
            pairs += tokens * (context + (tokens + 1) / 2)
            if block_terms:                         # sim.timing.compute.attention_block_terms, inlined
                tiles = -(-tokens // rows)
                blocks += tiles
                block_keys += tiles * context + rows * tiles * (tiles - 1) // 2 + tokens
            logits += after == seq_len
            if generated == 0 or seq_len - context > 1:
                prefill += tokens
            if lookahead:
                if after == seq_len:
                    if generated + 1 < request.output_tokens:
                        target = min(after + steps, request.final_kv_tokens)
                    else:
                        continue
                else:
                    target = min(seq_len, after + budget)
                if target > (slot_mapped + in_flight[slot]) * tokens_per_page:
                    targets[slot] = target
        if cohort is not None:
            scheduled, members = cohort
            kv_tokens = members.kv_tokens()
            active_mapped += members.mapped_sum
            if scheduled:
                size = members.size
                new += size
                kv_read += kv_tokens
                pairs += float(kv_tokens + size)       # each member: context + 1.0 (exact integers)
                logits += size
                longest = max(longest, members.longest() + 1)
                used += members.used_now + members.crossing_now()
                if block_terms:
                    blocks += size
                    block_keys += kv_tokens + size
            else:
                idle_held += kv_tokens
                used += members.used_now
        running = self.running if running is None else running
        if len(batch) != len(running):        # running requests without tokens this iteration
            scheduled = {request.slot for request, _ in batch}
            for request in running:
                if request.slot not in scheduled:
                    idle_held += request.computed
                    used += -(-request.computed // tokens_per_page)
                    active_mapped += mapped[request.slot]
        held = kv_read + new + idle_held         # every request's computed + scheduled tokens
        waste = (active_mapped * tokens_per_page - held) * self._kv_bytes_per_token
        used -= policy.duplicate_refs            # a page shared by running requests (prefix cache) is used once
        if self._groups_count_used:              # window-aware groups: units, and each group's own pages
            held_tokens = {request.slot: request.computed + tokens for request, tokens in batch}
            for request in running:
                held_tokens.setdefault(request.slot, request.computed)
            used, waste = policy.used_and_waste(held_tokens)
        elif self._static_groups is not None:    # static window=reserve: one unit = one request's reservation
            groups, unit_bytes = self._static_groups
            held_bytes = sum(kv_bytes_for_tokens(groups, request.computed + tokens) for request, tokens in batch)
            scheduled = {request.slot for request, _ in batch}
            held_bytes += sum(kv_bytes_for_tokens(groups, request.computed) for request in running
                              if request.slot not in scheduled)
            waste = active_mapped * unit_bytes - held_bytes
        snapshot = (policy.physical_page_groups, used, policy.free_page_groups, policy.deferred_page_groups, waste)
        return new, pairs, kv_read, logits, longest, prefill, targets, snapshot, blocks, block_keys

    def _lookahead(self, batch: list) -> dict[int, int]:
        """Slot -> tokens each running request is predicted to hold a few iterations ahead, for the slots whose
        mapped and in-flight pages do not cover that yet (:meth:`_iteration_pass`)."""
        return self._iteration_pass(batch)[6]

    def _pool_snapshot(self, batch: list) -> tuple[int, int, int, int, int]:
        """(physical, used, free, deferred page groups, tail waste bytes) during this iteration
        (:meth:`_iteration_pass`)."""
        return self._iteration_pass(batch, lookahead=False)[7]

    def _start_running(self, request: Request, slot: int, now_us: float) -> None:
        """An admitted request holds ``slot`` and joins the running set, after every earlier admission;
        ``now_us``: the start of the iteration that schedules it (its first one sets the scheduling delay)."""
        if request.first_scheduled_at_us != request.first_scheduled_at_us:      # NaN: never scheduled yet
            request.first_scheduled_at_us = now_us
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

    def _drop_kv(self, victim: Request) -> None:
        """Recompute preemption: the victim's KV is dropped and computed again after re-admission."""
        victim.recomputed_tokens += victim.computed
        victim.computed = 0

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
        donates, tbt_append = self._donates, self.tbt_us.append
        for request, tokens in batch:
            computed = request.computed + tokens
            request.computed = computed
            if donates:
                self._after_compute(request)
            generated = request.generated
            if computed != request.prompt_tokens + generated:
                continue
            generated += 1
            request.generated = generated
            if generated == 1:
                request.first_token_at_us = done_us
            else:
                tbt_append(done_us - request.last_token_at_us)
            request.last_token_at_us = done_us
            if generated == request.output_tokens:
                request.completion_at_us = done_us
                self._drop(request, status="finished")


def unservable_reason(policy_config, final_kv_tokens: int) -> str:
    """Why a request whose last iteration holds ``final_kv_tokens`` KV tokens can never be served by a policy
    of ``policy_config`` (:class:`sim.memory.VAttentionConfig`), ``""`` if it can: it needs more allocation
    units than one slot holds (``"slot"``: a static reservation of ``max_len`` tokens shorter than the
    request) or than the pool minus its admission watermark (``"pool"``); reasons in
    :data:`sim.results.records.REJECT_REASONS`."""
    need = policy_config.pages_for_tokens(final_kv_tokens)
    if need > policy_config.max_pages_per_slot:
        return "slot"
    return "pool" if beyond_pool(policy_config, need) else ""


def beyond_pool(policy_config, need: int) -> bool:
    """Whether ``need`` allocation units exceed the pool of ``policy_config`` above its admission watermark."""
    pool = policy_config.pool_page_groups
    return need > pool - int(policy_config.admission_watermark_frac * pool)
