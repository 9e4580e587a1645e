"""One iteration of the serving loop (a part of :class:`sim.core.engine.Simulator`): the step targets of a
batch, the policy's step plan, the block-table cost, and the liveness check that every loop pass changes state
or advances time.

:class:`IterationStep` is a mixin: its methods use the simulator's state set up by
:meth:`sim.core.engine.Simulator.__init__`.
"""
from __future__ import annotations

from sim.core.request import Request
from sim.core.scheduler import Batch
from sim.memory.plan import EMPTY_PLAN


class IterationStep:
    """The iteration step of :class:`sim.core.engine.Simulator` (module docstring)."""

    def _fingerprint(self) -> tuple:
        """What a pass of the serving loop must change when it runs no iteration (liveness invariant)."""
        mapper = self.mapper
        kv_tokens = (sum(r.computed for r in self._solo) + self.cohort.kv_tokens() if self.cohort is not None
                     else sum(r.computed for r in self.running))
        return (self.env.now, self.num_done, self._next_arrival, self._admissions, len(self.waiting),
                len(self.running), kv_tokens, self.policy.free_page_groups,
                self.policy.mapped_page_groups, len(mapper.queue) if mapper else 0,
                mapper.current is not None if mapper else False)

    def _may_wait_for_pages(self) -> bool:
        """Whether a request running alone that the pool cannot hold is preempted to wait for pages instead of
        rejected: never here (nothing else holds this pool's pages); a co-located tenant's may
        (:class:`sim.cluster.colocate.TenantSimulator`)."""
        return False

    def _check_progress(self, phase: str) -> None:
        """Raise instead of spinning: of two consecutive passes that run no iteration, the second must leave
        the serving state (:meth:`_fingerprint`) other than the first did (the fingerprint is taken only on
        such passes, so iterations pay nothing for the check).

        Raises:
            RuntimeError: naming the phase and the state, when nothing changed.
        """
        state = self._fingerprint()
        stalled, self._stalled_state = self._stalled_state == state, state
        if stalled:
            raise RuntimeError(f"internal error: no progress in the {phase} phase at t={self.env.now:.1f} us "
                               f"(a loop pass changed nothing) with {self._state_line()}")

    def _state_line(self) -> str:
        """The serving state in one line, for internal-error messages."""
        policy = self.policy
        return (f"{len(self.running)} running (slot, computed, target): "
                f"{[(r.slot, *self._tokens_of(r)) for r in self.running][:8]}, {len(self.waiting)} waiting, "
                f"{self.num_done} done of {len(self.requests)}, free page groups {policy.free_page_groups}, "
                f"mapped {policy.mapped_page_groups}, deferred {policy.deferred_page_groups}, mapper "
                f"{'idle' if not self.mapper or self.mapper.idle else f'{len(self.mapper.queue)} queued'}")

    def _tokens_of(self, request: Request) -> tuple[int, int]:
        """A running request's (computed, seq_len) now (a cohort member's attributes lag while it is one)."""
        if self.cohort is not None and request in self.cohort:
            computed = self.cohort.computed_of(request)
            return computed, computed + 1
        return request.computed, request.seq_len

    def _step(self, batch: Batch):
        """Map what the batch needs; preempt (recompute) the most recently admitted request while the
        pool cannot cover it. Returns the (possibly smaller) batch and the applied plan."""
        while True:
            targets, short = self._step_targets(batch)
            if self.mapper:
                in_progress = self.mapper.take_over(short)
                if in_progress is not None:
                    yield in_progress
            if not targets:                 # every slot within its mapped pages: step() would map nothing
                return batch, EMPTY_PLAN
            plan = self.policy.step(targets)
            self._take_window_unmaps()
            if plan is not None:
                return batch, plan
            if (yield from self._settle_mapper()):
                continue
            victim = max(self.running, key=lambda r: r.admitted_order)
            if len(self.running) == 1 and not self._may_wait_for_pages():
                victim.reject_reason = "pages"       # alone, and the pool still cannot hold its next step
                self._drop(victim, status="rejected")
                self._iteration_rejections += 1
                return [], EMPTY_PLAN
            self._preempt(victim)
            batch = [(r, t) for r, t in batch if r is not victim]
            if not batch and not (self._cohort_scheduled and self.cohort.size):
                return [], EMPTY_PLAN

    def _background_since_last_record(self) -> tuple[int, int]:
        """Page groups the mapper mapped / unmapped since the previous iteration record."""
        if not self.mapper:
            return 0, 0
        done = (self.mapper.maps_done, self.mapper.unmaps_done)
        delta = (done[0] - self._bg_recorded[0], done[1] - self._bg_recorded[1])
        self._bg_recorded = done
        return delta

    def _block_table_us(self, batch: Batch, members: int = 0) -> float:
        """PagedAttention's CPU time to build this iteration's block tables (0 for other policies); ``members``:
        the decode cohort runs too (its blocks counted)."""
        if self.config.policy != "paged":
            return 0.0
        cohort_blocks = self.cohort.mapped_sum if members else 0
        return self._block_table_us_of(sum(self.policy.mapped[r.slot] for r, _ in batch) + cohort_blocks)

    def _block_table_us_of(self, blocks: int) -> float:
        """PagedAttention's CPU time (us) to build block tables of ``blocks`` blocks (0 for other policies)."""
        if self.config.policy != "paged":
            return 0.0
        return self.config.block_table_base_us + self.config.block_table_per_block_us * blocks

    def _step_targets(self, batch: Batch) -> tuple[dict[int, int], list[int]]:
        """One pass over the batch: the policy's step targets (slot -> tokens it holds after this iteration)
        and the slots whose target needs more pages than are mapped (``short``, in batch order).

        Only the short slots' targets are passed on (``VAttentionPolicy.step`` maps nothing for a slot whose
        target is within its mapped pages, and a running slot is active and within its capacity, so the plan
        is the same), except under prefix caching, whose ``step`` checks every slot of the batch."""
        per_page, mapped = self.policy.config.tokens_per_page, self.policy.mapped
        every_target, hint = self.prefix, self._computed_hint
        targets, short = {}, []
        for request, tokens in batch:
            slot, target = request.slot, request.computed + tokens
            if target > mapped[slot] * per_page:          # pages_for_tokens(target) > mapped[slot]
                targets[slot] = target
                short.append(slot)
                if hint is not None:
                    hint[slot] = request.computed
            elif every_target:
                targets[slot] = target
        return targets, short
