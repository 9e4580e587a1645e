"""Fast-forwarded decoding (a part of :class:`sim.core.engine.Simulator`): runs of identical pure-decode
iterations advanced in one SimPy event, and the decode cohort (:class:`sim.core.cohort.DecodeCohort`) that
advances plain decodes in aggregate; the records are those of stepping every iteration (``tests/test_engine.py``,
``tests/test_cohort.py``, ``python bench/engine_hashes.py``).

:class:`DecodeRuns` is a mixin: its methods use the simulator's state set up by
:meth:`sim.core.engine.Simulator.__init__`.
"""
from __future__ import annotations

import bisect
from array import array

import numpy as np

from sim.core.request import Request
from sim.core.scheduler import Batch
from sim.results.recorder import extend_array
from sim.timing.decode_run_times import steps_until

PLAIN_RUN_STEPS = 64
"""A fast-forwarded decode run expected to be at most this long is computed one step at a time in plain floats
(cheaper than numpy's per-call overhead); a longer one as arrays, with the same floats."""


class DecodeRuns:
    """Decode runs and the decode cohort of :class:`sim.core.engine.Simulator` (module docstring)."""

    def _stepped_pass(self, batch: Batch) -> tuple:
        """:meth:`_iteration_pass` of a stepped iteration (look-ahead with the asynchronous mapper), the decode
        cohort's members left out of the running requests it walks and counted as the cohort."""
        cohort, lookahead = self.cohort, self.mapper is not None
        if cohort is None:
            return self._iteration_pass(batch, lookahead)
        if not cohort.size:
            return self._iteration_pass(batch, lookahead, self._solo)
        return self._iteration_pass(batch, lookahead, self._solo, (self._cohort_scheduled, cohort))

    def _cohort_tokens(self, done_us: float) -> None:
        """TBT of one cohort iteration ending at ``done_us``: members that joined since the last one from their
        own last token, the others (one gap for all of them) from the cohort's last emission."""
        cohort, tbt = self.cohort, self.tbt_us
        for request in cohort.joiners:
            tbt.append(done_us - request.last_token_at_us)
        rest = cohort.size - len(cohort.joiners)
        if rest:
            self.tbt_run_gaps_us.append(done_us - cohort.last_emit_us)
            self.tbt_run_weights.append(rest)

    def _cohort_iteration_done(self, done_us: float, members: int) -> None:
        """After a stepped iteration: the cohort's tokens (when it ran), then members in and out."""
        if members:
            self._cohort_tokens(done_us)
            self.cohort.advance(1)
            self.cohort.last_emit_us = done_us
        self._cohort_regroup()

    def _cohort_regroup(self) -> None:
        """Members due to be handled alone go back to :attr:`_solo` (in running order); running requests in
        plain decode that can run >= 2 iterations without finishing or needing a page (mapped, and with the
        asynchronous mapper ``eager_lookahead_steps`` ahead: :func:`_decode_steps_left`), with no background
        map in flight for their slot, join. Then the TBT buffers are folded if they are full (:meth:`_fold_tbt`)."""
        cohort, solo = self.cohort, self._solo
        for request in cohort.due():
            cohort.leave(request)
            bisect.insort(solo, request, key=_admitted_order)
        tokens_per_page, mapped, in_flight = self.config.tokens_per_page, self.policy.mapped, self.policy.in_flight_maps
        ahead = self.config.eager_lookahead_steps if self.mapper else 0
        keep = []
        for request in solo:
            generated, slot = request.generated, request.slot
            if generated and request.prompt_tokens + generated - request.computed == 1 and not in_flight[slot]:
                steps = _decode_steps_left(request, mapped[slot] * tokens_per_page, ahead)
                if steps >= 2:
                    cohort.join(request, steps, mapped[slot])
                    continue
            keep.append(request)
        if len(keep) != len(solo):
            self._solo = keep
        if len(self.tbt_us) + len(self.tbt_run_gaps_us) >= self._tbt_fold_at:
            self._fold_tbt()

    def _dissolve_cohort(self) -> None:
        """Write every member back and hand it to :attr:`_solo` (end of run)."""
        if self.cohort is None:
            return
        for request in [r for r in self.running if r in self.cohort]:
            self.cohort.leave(request)
            bisect.insort(self._solo, request, key=_admitted_order)

    def _run_blocked(self, batch: Batch) -> bool:
        """Whether no decode run can start now (checked before :meth:`_decode_run`'s generator is made): work
        pending (plans, zeroing, copies, the mapper's ops, tier transfers), or a batch that is not every running
        request in plain decode (with a cohort: the cohort alone, every running request in it)."""
        if (self._pending_plans or self._pending_zero_groups or self._pending_copy_bytes
                or (self.mapper and not self.mapper.idle) or (self.tiers and self.tiers.pending)):
            return True
        cohort = self.cohort
        if cohort is not None:
            return bool(batch) or not self._cohort_scheduled or cohort.size != len(self.running)
        return len(batch) != len(self.running)

    def _decode_run(self, batch: Batch, iteration: int):
        """Fast-forward k >= 2 pure-decode iterations in one event when nothing can change inside them:
        no arrival before the last one starts, no completion, every step and look-ahead target already
        mapped, the mapper idle with no background work (the caller checked :meth:`_run_blocked` first). The
        steps are cut at the next arrival (:meth:`_run_steps`). With a decode cohort the run is the whole
        cohort's (every running request in it), up to the first member due to leave, its shape and page
        crossings from the cohort's totals; without one, from two passes over the batch (:meth:`_run_shape`).
        Returns k (0 when not eligible)."""
        cohort = self.cohort
        if cohort is not None:
            steps, shape = cohort.steps_left(), None
        else:
            shape = self._run_shape(batch)
            steps = shape[0] if shape is not None else 0
        if steps < 2:
            return 0
        if self.mapper and self.policy.has_background_work():
            # look-ahead targets are within the mapped pages (run length >= 2), so only eager or
            # low-watermark work can come back
            background = self.policy.background_plan({})
            if background:
                self.mapper.submit(background)  # the mapper has work: step normally this time
                return 0
        if cohort is not None:
            kv_read, longest, active_mapped = cohort.kv_tokens(), cohort.longest(), cohort.mapped_sum
        else:
            _, kv_read, longest, active_mapped, used, crossings = shape
            used -= self.policy.duplicate_refs       # shared pages used once (as _iteration_pass counts them)
        size = len(self.running)
        block_table_us = self._block_table_us_of(active_mapped)   # constant: no block is added inside the run
        finishing = self._finishing_after(steps, block_table_us) if cohort is not None else None
        asked = steps + 1 if finishing else steps
        starts_us, compute_us, gaps_us = self._run_steps(size, kv_read, longest, asked, block_table_us)
        steps = len(compute_us)
        if finishing:
            finishing = self._fold_holds(finishing, starts_us, steps == asked, iteration + asked - 2)
            if steps == asked and not finishing:        # the last token's iteration is stepped after all
                steps -= 1
                starts_us, compute_us, gaps_us = starts_us[:steps + 1], compute_us[:steps], gaps_us[:steps]
        if steps < 2:
            return 0
        yield self.env.timeout(starts_us[steps] - self.env.now)
        if cohort is not None:
            used, crossings = cohort.used_now + cohort.crossing_now(), cohort.crossings()
        self._record_decode_run(iteration, starts_us, compute_us, used, crossings, kv_read, active_mapped,
                                block_table_us)
        if finishing:
            self._finish_folded_run(iteration, steps, starts_us, gaps_us)
            return steps
        extend_array(self.tbt_run_gaps_us, gaps_us[1:])
        self.tbt_run_weights.extend(array("q", [size]) * (steps - 1))
        if cohort is not None:
            self._cohort_tokens(starts_us[1])
            cohort.advance(steps)
            cohort.last_emit_us = starts_us[steps]
        else:
            first_done_us, last_done_us = starts_us[1], starts_us[steps]
            tbt = self.tbt_us
            for request, _ in batch:
                request.computed += steps
                request.generated += steps
                tbt.append(first_done_us - request.last_token_at_us)
                request.last_token_at_us = last_done_us
        self.policy.iteration_completed(iteration + steps - 1)
        if cohort is not None:
            self._cohort_regroup()
        return steps

    # ---- a cohort run that ends with its finishing members' last token (issue 32) -------------------------
    # Stepping would run the cohort's k steps, then one iteration in which the members due to leave emit their
    # last token and finish, the rest of the cohort stepping with them. When nothing but that can happen in
    # that iteration, it is folded into the run as step k + 1, and its completions are applied as the stepped
    # iteration applies them (same records, tokens and completions: ``bench/engine_hashes.py``).

    def _finishing_after(self, steps: int, block_table_us: float) -> list[Request] | None:
        """The members due to leave after ``steps`` steps, when each leaves to emit its last token within its
        mapped pages and the iteration that emits them would be a plain one (nothing waiting, no open
        arrivals, no clearing, swap or block-table time, no background page groups unrecorded); else None."""
        mapper = self.mapper
        if (self.waiting or self._open or self.zero_mode != "off" or block_table_us
                or self.swap.pending_us or (mapper and (mapper.maps_done, mapper.unmaps_done) != self._bg_recorded)):
            return None
        cohort, per_page, mapped = self.cohort, self.config.tokens_per_page, self.policy.mapped
        due = cohort.due_at(steps)
        for request in due:
            if (cohort.generated_of(request) + steps != request.output_tokens - 1
                    or request.final_kv_tokens > mapped[request.slot] * per_page):
                return None
        return due or None

    def _fold_holds(self, finishing: list[Request], starts_us, complete: bool, completed_iteration: int):
        """Whether the run computed with the extra step can stand for stepping (``finishing``, else None):
        that step started before the next arrival (``complete``), the clock lands on the same floats (the
        stepped iteration starts at ``now + (start - now)`` and ends at ``start + compute``), and once the
        run's iterations up to ``completed_iteration`` are completed the policy has no background work and the
        same pool figures (the stepped iteration's record and look-ahead see them). When the step is complete,
        completes those iterations (the run's own ``iteration_completed``, done early: it is a max)."""
        if not complete:
            return None
        now_us, steps, policy = self.env.now, len(starts_us) - 2, self.policy
        before = (policy.physical_page_groups, policy.free_page_groups, policy.deferred_page_groups)
        policy.iteration_completed(completed_iteration)      # (a max: the run's own call repeats it harmlessly)
        start_us, end_us = starts_us[steps], starts_us[steps + 1]
        if now_us + (start_us - now_us) != start_us or now_us + (end_us - now_us) != end_us:
            return None
        if (policy.physical_page_groups, policy.free_page_groups, policy.deferred_page_groups) != before:
            return None
        if self.mapper and policy.has_background_work():
            return None
        return finishing

    def _finish_folded_run(self, iteration: int, steps: int, starts_us, gaps_us) -> None:
        """After a run of ``steps`` steps whose last one is the finishing members' iteration: the tokens of the
        first ``steps - 1`` steps as a run gives them, the members due leave, then that iteration's tokens,
        completions and cohort bookkeeping in the stepped order (its record is the run's last row)."""
        cohort, size = self.cohort, len(self.running)
        extend_array(self.tbt_run_gaps_us, gaps_us[1:steps - 1])
        self.tbt_run_weights.extend(array("q", [size]) * (steps - 2))
        self._cohort_tokens(starts_us[1])
        cohort.advance(steps - 1)
        cohort.last_emit_us = starts_us[steps - 1]
        self._cohort_regroup()          # the finishing members leave (iteration_completed: _fold_holds)
        members = cohort.size
        self._background_since_last_record()
        self.policy.iteration_completed(iteration + steps - 1)
        self._finish_iteration([(request, 1) for request in self._solo], self.env.now, iteration + steps - 1)
        if self.cohort is not None:
            self._cohort_iteration_done(self.env.now, members)

    def _run_shape(self, batch: Batch) -> tuple | None:
        """Two passes over a pure-decode batch. ``None`` if a request is not a plain decode (a chunk, or the
        1-token last chunk of a prefill that emits the first token) or the run would be shorter than 2 steps
        (the first pass stops there); else ``(steps, kv_read_tokens, longest_context, active_mapped_page_groups,
        used_page_groups, crossings)``: the iterations before a completion, a page map or (async) a look-ahead
        map would be needed, the cached tokens read by the first step, the longest context, the page groups the
        batch holds and uses in the first step, and ``crossings`` (step % tokens_per_page -> requests whose
        used pages grow by one at such a step)."""
        tokens_per_page, mapped = self.config.tokens_per_page, self.policy.mapped
        ahead = self.config.eager_lookahead_steps if self.mapper else 0
        if batch[-1][1] != 1:        # a prefill chunk (they come last): not a run
            return None
        steps = batch[0][0].output_tokens
        for request, tokens in batch:
            if tokens != 1 or request.generated == 0:
                return None
            steps = _decode_steps_left(request, mapped[request.slot] * tokens_per_page, ahead, steps)
            if steps < 2:
                return None
        kv_read = longest = active_mapped = used = 0
        crossings: dict[int, int] = {}
        for request, _ in batch:
            computed = request.computed
            kv_read += computed
            if computed > longest:
                longest = computed
            active_mapped += mapped[request.slot]
            used += -(-(computed + 1) // tokens_per_page)
            residue = -computed % tokens_per_page     # its used pages grow at steps j with j % per_page == residue
            crossings[residue] = crossings.get(residue, 0) + 1
        return steps, kv_read, longest, active_mapped, used, crossings

    def _run_steps(self, size: int, kv_read: int, longest: int, steps: int, block_table_us: float):
        """The steps of a decode run of at most ``steps`` iterations that start before the next arrival:
        computed one at a time in plain floats while the run looks short (the next arrival within
        :data:`PLAIN_RUN_STEPS` steps of the first step's length: the compute model's ``decode_run_until``),
        else all ``steps`` as arrays and cut there (the same floats). Returns ``(starts_us, compute_us,
        gaps_us)``: k + 1 start times (the last one the run's end), k compute times and k durations (us; lists
        of floats, or float arrays for a long run)."""
        next_arrival_us = (self.requests[self._next_arrival].arrival_at_us
                           if self._next_arrival < len(self.requests) else float("inf"))
        if self._open:                    # requests not submitted yet may arrive: stop at the router's next one
            next_arrival_us = min(next_arrival_us, self.arrival_horizon_us)
        compute, start_us = self.compute, self.env.now
        pairs = float(kv_read + size)
        if hasattr(compute, "decode_run_until"):
            run = compute.decode_run_until(size, kv_read, pairs, steps, longest + 1, start_us, block_table_us,
                                           next_arrival_us, PLAIN_RUN_STEPS)
        else:                             # a model with the array form only
            run = steps_until(compute.decode_run_us(size, kv_read, pairs, steps, longest + 1).tolist(), start_us,
                              block_table_us, next_arrival_us, PLAIN_RUN_STEPS)
        if run is not None:
            return run
        all_us = compute.decode_run_us(size, kv_read, pairs, steps, longest + 1)
        ends_us = np.cumsum(np.concatenate(([start_us], all_us + block_table_us)))
        k = int(np.searchsorted(ends_us[:-1], next_arrival_us, side="left"))
        return ends_us[: k + 1], all_us[:k], np.diff(ends_us[: k + 1])

    def _record_decode_run(self, iteration: int, starts_us, compute_us, used: int, crossings: dict,
                           kv_read: int, active_mapped: int, block_table_us: float) -> None:
        """One block of iteration records for a decode run (:meth:`IterationRecorder.add_run`); its used page
        groups and tail waste bytes step by step follow from the first step's and the page crossings."""
        size, policy = len(self.running), self.policy   # the batch is every running request
        tokens_per_page, kv_bytes_per_token = self.config.tokens_per_page, self._kv_bytes_per_token
        waste = (active_mapped * tokens_per_page - (kv_read + size)) * kv_bytes_per_token
        self.recorder.add_run(iteration, starts_us, compute_us, (
            size, len(self.running), len(self.waiting), policy.physical_page_groups, policy.free_page_groups,
            policy.deferred_page_groups), block_table_us,
            (used, waste, size * kv_bytes_per_token, tokens_per_page, crossings))


def _admitted_order(request: Request) -> int:
    return request.admitted_order


def _decode_steps_left(request: Request, mapped_tokens: int, ahead: int, bound: int | None = None) -> int:
    """Iterations a request in plain decode can run (at most ``bound``) before the one that emits its last token,
    or before its step or its look-ahead (``ahead`` tokens past it, with the asynchronous mapper) needs a page
    beyond ``mapped_tokens``: the length of a fast-forwarded run, and a cohort member's stay."""
    steps = request.output_tokens - request.generated - 1
    if bound is not None and bound < steps:
        steps = bound
    if request.final_kv_tokens > mapped_tokens and mapped_tokens - request.computed - ahead < steps:
        steps = mapped_tokens - request.computed - ahead
    return steps
