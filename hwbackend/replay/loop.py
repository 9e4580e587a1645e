"""Hardware replay: the simulator's serving loop (``sim/core/engine.py``) run in real time on the GPU.

The same scheduler (:data:`sim.core.scheduler.SCHEDULERS`), the same memory policy (:func:`sim.memory.build_policy`,
applied by :class:`hwbackend.vmm.executor.Executor` with real VMM calls) and the same request bookkeeping
(:class:`sim.core.request.Request`) as the simulator; compute is a real decoder forward pass
(:class:`hwbackend.replay.model.DecoderModel`) over the VMM-backed K/V. One iteration, timed on the host clock::

    start ─ accept arrivals ─ schedule (admit = alloc_slot) ─ executor.step(targets) [preempt, retry] ─┐
      ┌──────────────────────────────────────────── sync_stall_us (wall time of the step loop) ────────┘
      └─ launch forward ─ iteration_launched(i) ─ map_ahead(look-ahead) ─ wait for the tokens (GPU sync)
         ─ tokens, first-token / completion times ─ free finished slots ─ end

``duration_us = end - start`` (iterations tile the busy timeline as in the simulator);
``compute_us = duration_us - sync_stall_us`` (host scheduling and bookkeeping included: that is what a
serving loop costs). Requests arrive by their trace timestamps on the wall clock (``now - t0``).
Records follow :mod:`sim.results.records` exactly; times in microseconds since the replay's start.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from hwbackend.replay.model import BatchInputs, SeqWork
from sim.timing.compute import attention_block_terms
from sim.core.lifecycle import RequestBookkeeping
from sim.results.records import ITERATION_COLUMNS, REQUEST_COLUMNS, tbt_stats_us
from sim.core.request import Request
from sim.core.scheduler import SCHEDULERS, schedule_iteration

SHAPE_COLUMNS = ("iteration", "new_tokens", "attention_pairs", "kv_read_tokens", "logit_sequences",
                 "max_context_tokens", "attention_blocks", "block_keys")
"""``shapes.parquet``: :class:`sim.timing.compute.BatchShape` of each hardware iteration (tokens; pairs = (query, key)
pairs attention computes, ``sum t * (context + (t + 1) / 2)``; attention thread blocks and the keys they read,
:func:`sim.timing.compute.attention_block_terms`, logged since 2026-12-01)."""
ARRIVAL_TICKS_PER_S = 10_000_000  # as sim.core.engine: arrivals quantised to the Azure trace's 100 ns tick


@dataclass
class ReplayOutput:
    """Raw records (tuples in the order of :mod:`sim.results.records`) and counters (as ``SimOutput.counters``)."""

    request_records: list[tuple]
    iteration_records: list[tuple]
    counters: dict
    shape_records: list[tuple] = field(default_factory=list)

    def shapes_frame(self) -> pd.DataFrame:
        """Per iteration, what it computed (:data:`SHAPE_COLUMNS`): the simulator's
        :class:`sim.timing.compute.BatchShape`, so that a compute model can be fitted on the loop's own iterations
        (:mod:`hwbackend.calibration.inloop`)."""
        return pd.DataFrame.from_records(self.shape_records, columns=list(SHAPE_COLUMNS))

    def requests_frame(self) -> pd.DataFrame:
        return pd.DataFrame.from_records(self.request_records, columns=list(REQUEST_COLUMNS))

    def iterations_frame(self) -> pd.DataFrame:
        if not self.iteration_records:   # numeric columns even when nothing ran (every request rejected)
            return pd.DataFrame({c: pd.Series(dtype=float) for c in ITERATION_COLUMNS})
        return pd.DataFrame.from_records(self.iteration_records, columns=list(ITERATION_COLUMNS))


def requests_from_trace(trace: pd.DataFrame, slot_max_tokens: int) -> list[Request]:
    """Requests of a canonical trace, arrivals quantised as in ``sim.core.engine._requests_from_trace``.

    Raises:
        ValueError: if a request needs more KV tokens than a slot holds (clip the trace first).
    """
    need = trace["prompt_tokens"] + trace["output_tokens"] - 1
    if (need > slot_max_tokens).any():
        row = trace[need > slot_max_tokens].iloc[0]
        raise ValueError(f"request {int(row.request_id)} needs more KV tokens than a slot holds ({slot_max_tokens})")
    arrivals_us = (np.round(trace["arrival_s"].to_numpy(dtype=float) * ARRIVAL_TICKS_PER_S)
                   * (1e6 / ARRIVAL_TICKS_PER_S)).tolist()
    return [Request(int(i), a, int(p), int(o)) for i, a, p, o in zip(
        trace["request_id"], arrivals_us, trace["prompt_tokens"], trace["output_tokens"])]


REPLAYED_FIELDS = {"preemption": "recompute", "policy": "vattention", "kv_layout": "per-layer", "zero_on_reuse": "off",
                   "prefix_caching": False, "window_alloc": "off"}
"""Configuration field -> the one value the hardware replay implements (swap preemption, the paged and static
policies, the cross-layer layout, zeroing, prefix caching and window-aware allocation are simulated only)."""


def unreplayed_field(config: Any) -> str | None:
    """The first field of ``config`` whose value the replay does not implement (:data:`REPLAYED_FIELDS`), as one
    line naming field, value and what is implemented; None when every one is replayable."""
    for name, value in REPLAYED_FIELDS.items():
        if getattr(config, name, value) != value:
            return (f"{name} {getattr(config, name)!r}: the hardware replay implements "
                    f"{value if isinstance(value, str) else f'{name}={value}'} only")
    return None


class ReplayLoop(RequestBookkeeping):
    """Serves a trace on a model and an open :class:`hwbackend.replay.kv.ReplayKV`.

    Args:
        config: the :class:`sim.setup.config.SimConfig` (scheduler, budget, policy knobs; ``preemption`` must be
            ``recompute``: swapping is not implemented on hardware; nor are prefix caching and window-aware allocation).
        trace: canonical table, arrival-sorted. model: a :class:`hwbackend.replay.model.DecoderModel` (or any
            object with ``device`` and ``forward``; an optional ``batch_inputs`` replaces :class:`BatchInputs`:
            the tensor-parallel model of :mod:`hwbackend.replay.tp`, and CPU tests without torch).
        kv: the open cache. sleep: ``sleep(seconds)`` while idle (tests may pass a no-op).
    """

    def __init__(self, config: Any, trace: pd.DataFrame, model: Any, kv: Any,
                 sleep: Callable[[float], None] = time.sleep):
        problem = unreplayed_field(config)
        if problem:
            raise ValueError(problem)
        self.config, self.model, self.kv, self.sleep = config, model, kv, sleep
        self.executor, self.policy = kv.executor, kv.executor.policy
        self.scheduler = SCHEDULERS[config.scheduler]
        self.tbt_us: list[float] = []
        self.requests = requests_from_trace(trace, config.slot_max_tokens)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.iteration_records: list[tuple] = []
        self.shape_records: list[tuple] = []
        self.num_done = self._next_arrival = self._admissions = self._preemptions = 0
        self._sync_unmaps = 0
        self._recorded = (0, 0)  # background maps, unmaps at the previous record
        self._sub_tensors = kv.executor.cache.layout.num_sub_tensors
        self._kv_bytes_per_token = config.model_spec.kv_bytes_per_token(config.tp)
        self._t0_ns = 0
        self._iteration, self._drained = 0, False

    # ---- clock and counters ----------------------------------------------------------------------------
    def now_us(self) -> float:
        return (time.perf_counter_ns() - self._t0_ns) * 1e-3

    def _unmapped_groups(self) -> int:
        return self.kv.driver.stats.count("cuMemUnmap") // self._sub_tensors

    def _foreground(self, call: Callable, *args: Any) -> Any:
        """Run an executor call on the critical path, counting the unmaps it performs as synchronous."""
        before = self._unmapped_groups()
        result = call(*args)
        self._sync_unmaps += self._unmapped_groups() - before
        return result

    # ---- the loop -----------------------------------------------------------------------------------
    def run(self) -> ReplayOutput:
        """Serve every request; returns the records."""
        self.begin()
        while not self.done:
            start_us = self.now_us()
            self._accept_arrivals(start_us)
            if not self.running and not self.waiting:
                self.sleep(max(0.0, self.next_arrival_us - self.now_us()) * 1e-6)
                continue
            self.serve_pass(start_us)
        return self.output()

    # ---- the loop in parts (a co-located replay interleaves several loops: hwbackend.replay.colocate) ----
    def begin(self, t0_ns: int | None = None) -> None:
        """Start the clock (``time.perf_counter_ns()`` now, or the given origin shared with other loops)."""
        self._t0_ns = time.perf_counter_ns() if t0_ns is None else t0_ns
        self._iteration, self._drained = 0, False

    @property
    def done(self) -> bool:
        """Every request finished or rejected."""
        return self.num_done >= len(self.requests)

    @property
    def next_arrival_us(self) -> float:
        """Arrival (us on this loop's clock) of the next request not yet accepted; ``inf`` when none is left."""
        return self.requests[self._next_arrival].arrival_at_us if self._next_arrival < len(self.requests) \
            else float("inf")

    def accept_arrivals(self) -> bool:
        """Accept the requests arrived by now; returns whether there is work (requests running or waiting)."""
        self._accept_arrivals(self.now_us())
        return bool(self.running or self.waiting)

    def serve_pass(self, start_us: float) -> bool:
        """One pass with work present: schedule, map and run one iteration (``start_us``: when the pass began).
        Returns whether an iteration ran (False: nothing could be scheduled, and admission was unblocked)."""
        self._preemptions = 0
        step_us = self.now_us()
        sync_maps = self.executor.metrics["sync_page_groups"]
        batch = schedule_iteration(self.scheduler, self.running, self.waiting, self.config.token_budget,
                                   self._admit, self._reserve)
        if not batch:
            if not self._preemptions:
                self._drained = self._unblock_admission(self._drained)
            return False
        self._drained = False
        stall_us = self.now_us() - step_us
        self._iterate(batch, self._iteration, start_us, stall_us, self.executor.metrics["sync_page_groups"] - sync_maps)
        self._iteration += 1
        return True

    def output(self) -> ReplayOutput:
        """The records and counters of the run so far."""
        return ReplayOutput([r.record() for r in self.requests], self.iteration_records, self._counters(),
                            self.shape_records)

    def _iterate(self, batch: list, iteration: int, start_us: float, stall_us: float, sync_maps: int) -> None:
        snapshot = self._pool_snapshot(batch)
        work = [SeqWork(r.slot, r.computed, t, r.computed + t == r.seq_len) for r, t in batch]
        inputs = getattr(self.model, "batch_inputs", BatchInputs)(work, self.kv.slot_tokens, self.model.device)
        tokens = self.model.forward(inputs, self.kv.k, self.kv.v)
        self.executor.iteration_launched(iteration)
        self.executor.map_ahead(self._lookahead(batch))
        tokens.cpu()  # the sampled tokens come back to the host: the iteration is over on the GPU
        if tokens.numel() == 0 and tokens.is_cuda:  # only partial prefill chunks: no token, so no copy waited
            import torch
            torch.cuda.current_stream(tokens.device).synchronize()
        done_us = self.now_us()
        blocks = [attention_block_terms(w.tokens, w.computed) for w in work]
        self.shape_records.append((iteration, inputs.num_tokens,
                                   sum(w.tokens * (w.computed + (w.tokens + 1) / 2) for w in work),
                                   sum(w.computed for w in work), sum(w.emits for w in work),
                                   max(w.computed + w.tokens for w in work),
                                   sum(b for b, _ in blocks), sum(k for _, k in blocks)))
        self.executor.poll_completed()
        bg_maps, unmaps = self._since_last_record()
        prefill = sum(t for r, t in batch if r.remaining > 1 or t > 1)
        record = dict(zip(("mapped_page_groups", "used_page_groups", "free_page_groups", "deferred_page_groups",
                           "tail_waste_bytes"), snapshot),
                      iteration=iteration, start_at_us=start_us, sync_stall_us=stall_us, sync_map_page_groups=sync_maps,
                      bg_map_page_groups=bg_maps, unmap_page_groups=unmaps, prefill_tokens=prefill,
                      decode_tokens=sum(t for _, t in batch) - prefill, batch_size=len(batch),
                      num_running=len(self.running), num_waiting=len(self.waiting), preemptions=self._preemptions)
        self._finish_iteration(batch, done_us)
        record["duration_us"] = self.now_us() - start_us
        record["compute_us"] = record["duration_us"] - stall_us
        # columns the hardware has no counterpart for (block tables, swap, zeroing) are 0
        self.iteration_records.append(tuple(record.get(c, 0.0) for c in ITERATION_COLUMNS))

    # ---- phases (mirroring sim.core.engine.Simulator) ------------------------------------------------------
    def _admit(self, request: Request, first_tokens: int) -> int:
        """The scheduler's ``admit``: tokens scheduled (``first_tokens``; no prefix cache here), 0 if refused."""
        slot = self.executor.alloc_slot(*self._admission_args(request, first_tokens))
        if slot is None:
            return 0
        # map the first chunk now, as the simulator does, so that admissions in one round cannot promise the
        # same free pages; a refused map gives the slot back (the request is not admitted)
        if not self._foreground(self.executor.step, {slot: request.computed + first_tokens}):
            self._foreground(self.executor.free_slot, slot, self.policy.completed_iteration)
            return 0
        self._start_running(request, slot, self.now_us())
        return first_tokens

    def _reserve(self, batch: list) -> tuple[list, bool]:
        """The running part's memory (:func:`sim.core.scheduler.schedule_iteration`): ``(batch, preempted)``."""
        before = self._preemptions
        return self._step(batch), self._preemptions > before

    def _unblock_admission(self, drained: bool) -> bool:
        """Nothing could be scheduled: first let the mapper's queued work go (as the simulator cancels its
        mapper), then reject an unservable head. Returns whether the mapper was just drained."""
        if self.config.has_async_mapper and not drained:
            self._foreground(self.executor.step, {})  # cancels queued background ops, waits for the current one
            return True
        if self.running:
            raise RuntimeError("scheduler returned an empty batch while requests are running")
        head = self.waiting.popleft()
        head.status = "rejected"
        self.num_done += 1
        return False

    def _step(self, batch: list) -> list:
        """Map what the batch needs; preempt (recompute) the most recently admitted request while the pool
        cannot cover it. Returns the (possibly smaller) batch."""
        while True:
            if self._foreground(self.executor.step, {r.slot: r.computed + t for r, t in batch}):
                return batch
            victim = max(self.running, key=lambda r: r.admitted_order)
            if len(self.running) == 1:
                victim.reject_reason = "pages"
                self._drop(victim, status="rejected")
                return []
            self._release(victim)
            self._drop_kv(victim)
            self._preemptions += 1
            self._requeue(victim)
            batch = [(r, t) for r, t in batch if r is not victim]
            if not batch:
                return []

    def _since_last_record(self) -> tuple[int, int]:
        done = (self.executor.metrics["background_page_groups"], self._unmapped_groups())
        delta = (done[0] - self._recorded[0], done[1] - self._recorded[1])
        self._recorded = done
        return delta


    def _release(self, request: Request) -> None:
        self.running.remove(request)
        self._foreground(self.executor.free_slot, request.slot, self.policy.completed_iteration)
        request.slot = -1

    def _counters(self) -> dict:
        unmaps = self._unmapped_groups()
        metrics = self.executor.metrics
        return {"sync_map_page_groups": metrics["sync_page_groups"], "sync_unmap_page_groups": self._sync_unmaps,
                "bg_map_page_groups": metrics["background_page_groups"],
                "bg_unmap_page_groups": unmaps - self._sync_unmaps, "mapper_busy_us": float("nan"),
                "swap_out_bytes": 0, "swap_in_bytes": 0, "swap_total_us": 0.0,
                "pool_page_groups": self.config.pool_page_groups, "end_at_us": self.now_us(),
                **tbt_stats_us(self.tbt_us, [])}   # time between tokens, as the simulator reports it
