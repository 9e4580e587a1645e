"""The discrete-event serving loop (SimPy; time in microseconds).

One process serves iterations back to back::

    accept arrivals -> schedule (admission = slot + pages) -> take over the mapper's work for these slots
    -> policy.step(targets) [preempt by recompute and retry while it fails] -> synchronous mapping stall
    -> launch: the asynchronous mapper starts the background plan -> compute -> tokens, completions

A second process (:class:`sim.mapper.AsyncMapper`) maps in the background while compute runs.
"""
from __future__ import annotations

import bisect
import itertools
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import simpy

from sim.compute import BatchShape, RooflineComputeModel
from sim.cohort import DecodeCohort
from sim.config import SimConfig
from sim.latency import VmmLatencyModel
from sim.lifecycle import RequestBookkeeping
from sim.mapper import AsyncMapper
from sim.memory import build_policy
from sim.plan import EMPTY_PLAN, MapOp, Plan, UnmapOp
from sim.records import ITERATION_COLUMNS, REQUEST_COLUMNS, tbt_distinct_us, tbt_stats_us
from sim.recorder import IterationRecorder, extend_array
from sim.request import Request
from sim.scheduler import SCHEDULERS, Batch
from sim.units import US_PER_S

ARRIVAL_TICKS_PER_S = 10_000_000
ARRIVAL_TICK_US = US_PER_S / ARRIVAL_TICKS_PER_S
PLAIN_RUN_STEPS = 64
"""A fast-forwarded decode run expected to be at most this long is computed one step at a time in plain floats
(cheaper than numpy's per-call overhead); a longer one as arrays, with the same floats."""
TBT_FOLD_ENTRIES = 1 << 21
"""With the decode cohort, the TBT buffers are folded into (distinct gap, tokens) pairs whenever they hold this
many entries (or twice the distinct gaps of the last fold): a week-long replica's 47 M gaps take ~300,000
pairs instead of 750 MB, and every TBT figure depends only on the token multiset
(:func:`sim.records.tbt_distinct_us`)."""



@dataclass
class SimOutput:
    """Raw records of one run: request tuples in the order of :data:`REQUEST_COLUMNS`, the iteration records
    (a :class:`sim.recorder.IterationRecorder`: columnar chunks in memory, or row groups streamed to
    Parquet), and counters."""

    request_records: list[tuple]
    recorder: IterationRecorder
    counters: dict

    @property
    def decode_runs(self) -> int:
        """Fast-forwarded decode runs recorded as blocks (coalescing statistics)."""
        return self.recorder.blocks_recorded

    def iterations_frame(self, columns: list[str] | None = None) -> pd.DataFrame:
        """All iteration records (columns :data:`ITERATION_COLUMNS`, or ``columns``), in iteration order."""
        return self.recorder.frame(columns)

    def requests_frame(self) -> pd.DataFrame:
        """Per-request records (columns :data:`REQUEST_COLUMNS`), in request order."""
        return pd.DataFrame.from_records(self.request_records, columns=list(REQUEST_COLUMNS))


class VmmCost:
    """Modelled latency (us) of executing plans, from a :class:`VmmLatencyModel` and one generator.

    Mapping a page group costs one measured page-group growth (or ``2N'`` x (cuMemMap + cuMemSetAccess),
    see :meth:`VmmLatencyModel.page_group_map_us`); unmapping costs ``2N'`` x cuMemUnmap; pages created on
    demand add cuMemCreate / cuMemRelease per page. With batched set-access, a map op of k >= 2 pages costs
    the serial cost times :attr:`VmmLatencyModel.batched_ratio` (measured: 64 maps into one range and one
    cuMemSetAccess over it, against 64 x (map + set-access)).

    With tensor parallelism every one of the ``tp`` workers maps its own 2N' sub-tensors (same slots, same
    page indices): each worker's latency is drawn independently, times the measured per-worker slowdown when
    all workers map at once (:attr:`VmmLatencyModel.tp_worker_scale`, profile ``vmm_tp``: 1.38 for two H200s
    with one process per GPU, ``docs/tp2/README.md``; 1 where not measured), and the plan takes the slowest
    worker's time (the iteration, or a background op's commit, waits for all). Per-worker totals are kept in
    :attr:`worker_us` and the critical path (sum of the maxima) in :attr:`critical_us`.
    """

    def __init__(self, vmm: VmmLatencyModel, config: SimConfig, rng: np.random.Generator,
                 create_on_demand: bool = False):
        self.vmm, self.rng, self.create_on_demand = vmm, rng, create_on_demand
        self.pages_per_group = config.num_sub_tensors
        # pages per page group of each layer group (sim.memory.hybrid; one group without window-aware allocation)
        self.group_pages = config.group_sub_tensors if config.hybrid_alloc else (config.num_sub_tensors,)
        self.page_size_bytes = config.page_size_bytes
        self.worker_us = [0.0] * config.tp
        self.worker_scale = vmm.tp_worker_scale.get(config.tp, 1.0) if config.tp > 1 else 1.0
        self.critical_us = 0.0
        self.batched = config.batched_set_access
        self.calls = {"map": 0, "unmap": 0}     # cuMemMap / cuMemUnmap calls of every op (all groups)

    def _map_one_us(self, page_groups: int, group: int = 0) -> float:
        pages = self.group_pages[group]
        total = self.vmm.page_group_map_us(page_groups, pages, self.page_size_bytes, self.rng)
        if self.create_on_demand:
            total += self.vmm.total_us("cuMemCreate", self.page_size_bytes, page_groups * pages, self.rng)
        return total

    def _unmap_one_us(self, page_groups: int, group: int = 0) -> float:
        calls = page_groups * self.group_pages[group]
        total = self.vmm.total_us("cuMemUnmap", self.page_size_bytes, calls, self.rng)
        if self.create_on_demand:
            total += self.vmm.total_us("cuMemRelease", self.page_size_bytes, calls, self.rng)
        return total

    def _ops_one_us(self, ops) -> float:
        total = 0.0
        for op in ops:
            self.calls["unmap" if isinstance(op, UnmapOp) else "map"] += op.num_pages * self.group_pages[op.group]
            if isinstance(op, UnmapOp):
                total += self._unmap_one_us(op.num_pages, op.group)
            else:
                cost = self._map_one_us(op.num_pages, op.group)
                # k >= 2 pages of one slot are adjacent in every tensor: one set-access over the range
                total += cost * self.vmm.batched_ratio if self.batched and op.num_pages >= 2 else cost
        return total

    def _over_workers(self, ops) -> float:
        if not ops:
            return 0.0
        per_worker = [self._ops_one_us(ops) * self.worker_scale for _ in self.worker_us]
        for worker, spent_us in enumerate(per_worker):
            self.worker_us[worker] += spent_us
        slowest = max(per_worker)
        self.critical_us += slowest
        return slowest

    def plan_us(self, plan: Plan) -> float:
        return self._over_workers([*plan.unmaps, *plan.maps])

    def op_us(self, op) -> float:
        if isinstance(op, float):       # non-VMM background work (zeroing), already a duration
            return op
        return self._over_workers([op])


class NoCost:
    """PagedAttention blocks and static reservations are bookkeeping: no driver call on any path."""

    def plan_us(self, plan: Plan) -> float:
        return 0.0

    def op_us(self, op) -> float:
        return 0.0


class SwapSpace:
    """Host memory for swapped-out KV and the PCIe transfer time model (bytes / per-direction bandwidth)."""

    def __init__(self, config: SimConfig):
        self.enabled = config.preemption == "swap"
        self.capacity_bytes = config.host_swap_bytes
        self.bytes_per_us = config.gpu_spec.pcie_bytes_per_s / US_PER_S
        self.kv_bytes_per_token = config.model_spec.kv_bytes_per_token(config.tp)
        self.used_bytes = 0
        self.out_bytes = self.in_bytes = 0
        self.pending_us = 0.0
        self.total_us = 0.0

    def swap_out(self, tokens: int) -> bool:
        """Copy ``tokens`` of KV to the host if there is room; returns whether it did."""
        size = tokens * self.kv_bytes_per_token
        if not self.enabled or tokens == 0 or self.used_bytes + size > self.capacity_bytes:
            return False
        self.used_bytes += size
        self.out_bytes += size
        self.pending_us += size / self.bytes_per_us
        return True

    def swap_in(self, tokens: int) -> None:
        size = tokens * self.kv_bytes_per_token
        self.used_bytes -= size
        self.in_bytes += size
        self.pending_us += size / self.bytes_per_us

    def take_pending_us(self) -> float:
        pending, self.pending_us = self.pending_us, 0.0
        self.total_us += pending
        return pending


class Simulator(RequestBookkeeping):
    """Replays a canonical trace table through a scheduler and the vAttention memory policy.

    Args:
        config: the run configuration.
        trace: canonical table (``request_id, arrival_s, prompt_tokens, output_tokens``), sorted by arrival;
            every request must fit a slot (``prompt + output - 1 <= config.slot_max_tokens``).
        vmm: VMM latency model (default: the built-in H200 calibration profile).
        compute: compute model (default: roofline for the config's model/GPU/TP).
        progress: called as ``progress(done_requests, total_requests)`` every 2,000 iterations.
        coalesce: fast-forward runs of identical pure-decode iterations (no arrival, completion, page map or
            mapper activity inside the run) in one SimPy event; records are identical to stepping them one
            by one (``tests/test_engine.py`` checks this), only faster. With it, requests in plain decode are
            also advanced together as a :class:`sim.cohort.DecodeCohort` (when every decode fits the token
            budget and there is no prefix cache), with the same records (``tests/test_cohort.py``).
        env: a shared SimPy environment (several replicas behind a router); default: a new one.
        records_path: stream the iteration records into this Parquet file as the run goes (memory stays flat);
            default: columnar chunks in memory (:class:`sim.recorder.IterationRecorder`).
        max_iterations: a step bound (liveness checks): exceeding it raises RuntimeError naming the state;
            default none (every loop pass already changes state or advances time, see ``_check_progress``).

    Raises:
        ValueError: if a request does not fit a slot.
    """

    _cohort_ok = True               # subclasses that change the request lifecycle (sim.disagg) turn the cohort off

    def __init__(self, config: SimConfig, trace: pd.DataFrame, vmm: VmmLatencyModel | None = None,
                 compute: RooflineComputeModel | None = None, progress: Callable[[int, int], None] | None = None,
                 coalesce: bool = True, env: simpy.Environment | None = None, max_iterations: int | None = None,
                 records_path: str | None = None):
        self.config = config
        self.rng = np.random.default_rng(config.seed)
        self.env = env or simpy.Environment()
        self._open, self._closed, self._arrival = False, True, None
        self.arrival_horizon_us = float("inf")   # open arrivals: time of the router's next submission
        self.compute = compute or RooflineComputeModel(config.model_spec, config.gpu_spec, config.tp)
        self._block_terms = bool(getattr(self.compute, "attention_key_us", 0.0))   # only the block forms read them
        if config.policy == "paged" and hasattr(self.compute, "paged_attention_factor"):
            self.compute = replace(self.compute, paged_attention_factor=config.paged_attention_factor)
        if config.uses_vmm and config.kv_layout == "cross-layer" and hasattr(self.compute, "layout_attention_factor"):
            self.compute = replace(self.compute, layout_attention_factor=config.layout_attention_factor)
        self.cost = (VmmCost(vmm or VmmLatencyModel.builtin(), config, self.rng, config.create_on_demand)
                     if config.uses_vmm else NoCost())
        self.policy = build_policy(config)
        # window-aware allocation (sim.memory.hybrid) reads each stepped slot's computed tokens
        self._computed_hint = self.policy.computed if getattr(self.policy, "needs_computed", False) else None
        self.mapper = AsyncMapper(self.env, self.policy, self._background_op_us) if config.has_async_mapper else None
        self.prefix = self._donates = config.prefix_caching
        self._admission_refused = False        # set by _admit when the policy refused a slot
        self._pending_copy_bytes = 0          # copy-on-write of partially shared pages, owed by the next iteration
        self.zero_mode = config.zero_on_reuse
        default_bw = config.gpu_spec.mem_bw_bytes_per_s * (4.3 / 4.8)
        self._zero_bytes_per_us = (config.memset_bytes_per_s or default_bw) / US_PER_S
        self._copy_bytes_per_us = (config.copy_bytes_per_s or default_bw) / US_PER_S
        self._pending_zero_groups = 0
        self.zero_bytes = {"critical": 0, "background": 0}
        self.cow_bytes = 0
        self.swap = SwapSpace(config)
        self.scheduler = SCHEDULERS[config.scheduler]
        self.requests = _requests_from_trace(trace, config.slot_max_tokens)
        self.progress = progress
        self.coalesce = coalesce
        self.max_iterations = max_iterations
        self._stalled_state: tuple | None = None      # fingerprint after the last pass that ran no iteration
        self._iteration_rejections = 0
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.recorder = IterationRecorder(records_path)
        self.tbt_us = array("d")             # gaps (us) of stepped iterations, one per token
        self.tbt_run_gaps_us = array("d")    # decode runs: each step's duration after the first ...
        self.tbt_run_weights = array("q")    # ... and the tokens it stands for (the batch size)
        self._tbt_fold_at = TBT_FOLD_ENTRIES
        self.num_done = 0
        self._next_arrival = 0
        self._admissions = 0
        self._pending_plans: list[Plan] = []   # critical-path work charged to the next iteration
        self._iteration_preemptions = 0
        self._bg_recorded = (0, 0)
        self._sync_maps = self._sync_unmaps = 0
        self._kv_bytes_per_token = config.model_spec.kv_bytes_per_token(config.tp)
        # plain decodes advanced in aggregate (sim.cohort): with fast-forwarding, when every decode always fits
        # the token budget (so the scheduler's order among decodes cannot matter), without a prefix cache
        self.cohort = (DecodeCohort(config.tokens_per_page) if coalesce and self._cohort_ok
                       and config.max_batch_slots <= config.token_budget and not config.prefix_caching else None)
        self._solo: list[Request] = []       # with a cohort: the running requests outside it, in running order
        self._cohort_scheduled = False       # whether the iteration being scheduled runs the cohort's decodes

    # ---- driver ----------------------------------------------------------------------------------------
    def run(self) -> SimOutput:
        """Run to the last request; returns the raw records."""
        self.start()
        self.env.run()
        return self.output()

    # ---- open arrivals (requests pushed over time, e.g. by a router in a shared environment) -------------
    def start(self) -> None:
        """Start the serving process in :attr:`env` (``run`` does this; a shared environment runs it)."""
        self.env.process(self._serve())

    def open_arrivals(self) -> None:
        """Take requests pushed with :meth:`submit` until :meth:`close`, instead of only the trace's."""
        self._open, self._closed = True, False

    def submit(self, request_id: int, prompt_tokens: int, output_tokens: int, hash_ids=None,
               computed_tokens: int = 0) -> Request:
        """A request arrives now (``env.now``); returns it. ``computed_tokens`` > 0: its prompt's KV was computed
        elsewhere and its first token emitted (disaggregated decode, :mod:`sim.disagg`): it arrives with
        ``computed = computed_tokens`` and ``generated = 1``. Raises ValueError if it cannot fit a slot."""
        if prompt_tokens + output_tokens - 1 > self.config.slot_max_tokens:
            raise ValueError(f"request {request_id} does not fit a slot ({self.config.slot_max_tokens} tokens)")
        request = Request(request_id, self.env.now, prompt_tokens, output_tokens)
        request.hash_ids = tuple(hash_ids) if hash_ids is not None else None
        if computed_tokens:
            request.computed, request.generated = computed_tokens, 1
        self.requests.append(request)
        if self._arrival is not None and not self._arrival.triggered:
            self._arrival.succeed()
        return request

    def close(self) -> None:
        """No more submissions: the process ends once every request is done."""
        self._closed = True
        if self._arrival is not None and not self._arrival.triggered:
            self._arrival.succeed()

    @property
    def outstanding(self) -> int:
        """Requests arrived (or submitted) and not yet finished or rejected."""
        return len(self.requests) - self.num_done

    def output(self) -> SimOutput:
        """The raw records of a finished run."""
        self._dissolve_cohort()
        for plan in self._pending_plans:    # unmaps of the last frees: performed, but after the last iteration
            self._sync_unmaps += plan.num_page_groups_unmapped
        self._pending_plans = []
        counters = {
            "sync_map_page_groups": self._sync_maps, "sync_unmap_page_groups": self._sync_unmaps,
            "bg_map_page_groups": self.mapper.maps_done if self.mapper else 0,
            "bg_unmap_page_groups": self.mapper.unmaps_done if self.mapper else 0,
            "mapper_busy_us": self.mapper.busy_us if self.mapper else 0.0,
            "swap_out_bytes": self.swap.out_bytes, "swap_in_bytes": self.swap.in_bytes,
            "swap_total_us": self.swap.total_us,
            "mapping_worker_us": list(getattr(self.cost, "worker_us", [])),
            "mapping_critical_us": getattr(self.cost, "critical_us", 0.0),
            "zero_critical_bytes": self.zero_bytes["critical"], "zero_background_bytes": self.zero_bytes["background"],
            "cow_bytes": self.cow_bytes, **{f"prefix_{k}": v for k, v in getattr(self.policy, "stats", {}).items()},
            "pool_page_groups": self.config.pool_page_groups, "end_at_us": self.env.now,
            **(self._hybrid_counters() if self._computed_hint is not None else {}),
            **tbt_stats_us(self.tbt_us, [(self.tbt_run_gaps_us, self.tbt_run_weights)]),
            # the gaps themselves, for merging replicas' TBT distributions (sim.routing.merge_replicas)
            "tbt_samples": (self.tbt_us, self.tbt_run_gaps_us, self.tbt_run_weights),
        }
        self.recorder.close()
        return SimOutput([r.record(self.config.frontend_overhead_us) for r in self.requests], self.recorder, counters)

    def _serve(self):
        env, iteration = self.env, 0
        while self.num_done < len(self.requests) or (self._open and not self._closed):
            self._accept_arrivals(env.now)
            if not self.running and not self.waiting:
                if self._next_arrival < len(self.requests):
                    yield env.timeout(self.requests[self._next_arrival].arrival_at_us - env.now)
                elif self._open and not self._closed:
                    self._arrival = env.event()
                    yield self._arrival
                continue
            start_at_us = env.now
            self._iteration_preemptions = self._iteration_rejections = 0
            batch, plan, preempted = yield from self._schedule()
            members = self.cohort.size if self._cohort_scheduled else 0
            if not batch and not members:
                if not preempted and not self._iteration_rejections and env.now == start_at_us:
                    yield from self._unblock_admission()     # scheduling changed nothing: unblock it
                self._check_progress("scheduling")
                continue
            self._stalled_state = None
            if self.coalesce and not preempted and not plan and env.now == start_at_us:
                steps = yield from self._decode_run(batch, iteration)
                if steps:
                    iteration += steps
                    continue
            waited_us = env.now - start_at_us          # waiting for the mapper's op in progress
            block_table_us = self._block_table_us(batch, members)
            swap_us = self.swap.take_pending_us()
            if self._pending_plans or plan:
                plans = [p for p in (*self._pending_plans, plan) if p]     # an empty plan costs nothing (0.0)
                self._pending_plans = []
                mapping_us = sum(self.cost.plan_us(p) for p in plans) if plans else 0.0
                mapped_sync = sum(p.num_page_groups_mapped for p in plans)
                unmapped_sync = sum(p.num_page_groups_unmapped for p in plans)
            else:
                mapping_us, mapped_sync, unmapped_sync = 0.0, 0, 0
            clear_copy_us = self._take_clear_copy_us()
            sync_us = mapping_us + block_table_us + swap_us + clear_copy_us
            self._sync_maps += mapped_sync
            self._sync_unmaps += unmapped_sync
            if sync_us > 0:
                yield env.timeout(sync_us)
            stall_us = waited_us + mapping_us
            new, pairs, kv_read, logits, longest, prefill, targets, snapshot, blocks, block_keys = self._iteration_pass(
                batch, lookahead=self.mapper is not None, **self._cohort_pass_args())
            compute_us = self.compute.iteration_us(BatchShape(new, pairs, kv_read, logits, longest, blocks, block_keys))
            if self.mapper and (targets or self.policy.has_background_work()):   # else the plan is empty
                self.mapper.submit(self.policy.background_plan(targets))
            yield env.timeout(compute_us)
            self.policy.iteration_completed(iteration)
            bg_maps, bg_unmaps = self._background_since_last_record()
            self.recorder.add((
                iteration, start_at_us, env.now - start_at_us, compute_us, stall_us,
                mapped_sync, bg_maps, unmapped_sync + bg_unmaps, prefill,
                new - prefill, len(batch) + members, len(self.running), len(self.waiting),
                *snapshot, self._iteration_preemptions, block_table_us, swap_us, clear_copy_us))
            self._finish_iteration(batch, env.now, iteration)
            if self.cohort is not None:
                self._cohort_iteration_done(env.now, members)
            iteration += 1
            if self.max_iterations is not None and iteration > self.max_iterations:
                raise RuntimeError(f"internal error: more than {self.max_iterations} iterations at "
                                   f"t={env.now:.1f} us with {self._state_line()}")
            if self.progress and iteration % 2000 == 0:
                self.progress(self.num_done, len(self.requests))
        if self.progress:
            self.progress(self.num_done, len(self.requests))

    # ---- phases ----------------------------------------------------------------------------------------
    def _admit(self, request: Request, first_tokens: int) -> int:
        """Take a slot and map the first chunk's pages now, so that several admissions in one scheduling
        round cannot promise the same free pages (vLLM allocates blocks at admission the same way). With a
        prefix cache, the cached prefix is mapped first and its tokens are skipped. Returns the tokens
        scheduled for the request (0: not admitted)."""
        first, reserve, committed = self._admission_args(request, first_tokens)
        cached = (0, 0)
        if self.prefix and request.hash_ids is not None and not request.computed:
            # look the cache up first, then ask only for the pages beyond the hit (vLLM v1)
            hit_tokens, *cached = self.policy.admission_credit(request.hash_ids, request.prompt_tokens)
            first = hit_tokens + min(first_tokens, request.remaining - hit_tokens)
        slot = self.policy.alloc_slot(first, reserve, committed, tuple(cached))
        if slot is None:
            self._admission_refused = True
            return 0
        stale_groups = self.policy.mapped[slot]      # deferred pages: hold the previous request's KV
        hit_tokens = self._map_prefix(request, slot)
        first_tokens = min(first_tokens, request.remaining)
        if self._computed_hint is not None:
            self._computed_hint[slot] = request.computed
        plan = self.policy.step({slot: request.computed + first_tokens})
        self._take_window_unmaps()
        if plan is None:
            request.computed -= hit_tokens
            self._perform_free(self.policy.free_slot(slot, self.policy.completed_iteration))
            return 0
        if self.prefix:
            self.policy.record_admission(self._last_hit, preempted=request.preemptions > 0)
            if request.preemptions:
                request.preempted_hit_tokens += hit_tokens
            else:
                request.prefix_hit_tokens = hit_tokens
        if self.zero_mode == "on-reuse":
            self._pending_zero_groups += stale_groups
        self._pending_plans.append(plan)
        if request.swapped:
            self.swap.swap_in(request.computed)
            request.swapped = False
        self._start_running(request, slot, self.env.now)
        return first_tokens

    def _map_prefix(self, request: Request, slot: int) -> int:
        """Map the cached prefix of a request that starts from scratch; returns the tokens it skips."""
        if not self.prefix:
            return 0
        # every admission prepares the slot; only a request starting from scratch looks the cache up
        ids = request.hash_ids if request.hash_ids is not None and not request.computed else ()
        hit = self.policy.admit_prefix(slot, ids, request.prompt_tokens)
        self._pending_plans.append(hit.plan)
        self._pending_copy_bytes += hit.cow_tokens * self._kv_bytes_per_token
        request.computed += hit.hit_tokens     # a swapped-in request keeps its KV (no lookup: hit 0)
        self._last_hit = hit
        return hit.hit_tokens

    def _schedule(self):
        """Schedule one iteration (order in :mod:`sim.scheduler`): the running part gets its memory first
        (preempting while the pool is short), then waiting requests are admitted unless that preempted.
        Returns ``(batch, plan of the running part, preempted)``; admissions' plans are pending."""
        scheduler, budget = self.scheduler, self.config.token_budget
        cohort = self.cohort
        running, members = (self._solo, cohort.size) if cohort is not None else (self.running, 0)
        self._cohort_scheduled = False
        if scheduler.prefill_first:
            admitted = yield from self._admit_waiting(budget)
            if admitted:
                return admitted, EMPTY_PLAN, False
            batch, _ = scheduler.running_part(running, budget)
            if not batch and not members:
                return batch, EMPTY_PLAN, False
            self._cohort_scheduled = members > 0
            batch, plan = yield from self._step(batch)
            return batch, plan, self._iteration_preemptions > 0
        # the cohort's decodes come first (every decode fits the budget when there is a cohort)
        batch, budget = scheduler.running_part(running, budget - members)
        plan = EMPTY_PLAN
        self._cohort_scheduled = members > 0
        if batch or members:
            batch, plan = yield from self._step(batch)
        preempted = self._iteration_preemptions > 0
        if not preempted:
            batch = batch + (yield from self._admit_waiting(budget))
        return batch, plan, preempted

    def _admit_waiting(self, budget: int):
        """The scheduler's waiting part; when an admission was refused while the mapper holds maps on idle
        slots (eager allocation), those maps are taken over - queued ones cancelled, one in progress waited
        for (a synchronous stall) - and admission is tried again with the budget left: eager allocation
        never delays an admission that a free slot and free pages allow (issue 28, ``eager_admit.csv``)."""
        self._admission_refused = False
        admitted = self.scheduler.admit_part(self.waiting, budget, self._admit)
        if self._admission_refused and self.mapper and (yield from self._take_over_idle_maps()):
            self._admission_refused = False
            left = budget - sum(tokens for _, tokens in admitted)
            if left > 0:
                admitted = admitted + self.scheduler.admit_part(self.waiting, left, self._admit)
        return admitted

    def _take_over_idle_maps(self):
        """Cancel the mapper's queued maps on idle slots and wait for its op in progress if it maps one;
        returns whether there were any (so that retrying an admission can succeed)."""
        idle = self.policy.idle_slots_mapping()
        if not idle:
            return False
        in_progress = self.mapper.take_over(idle)
        if in_progress is not None:
            yield in_progress
        return True

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

    def _fingerprint(self) -> tuple:
        """What a pass of the serving loop must change when it runs no iteration (liveness invariant)."""
        mapper = self.mapper
        kv_tokens = (sum(r.computed for r in self._solo) + self.cohort.kv_tokens() if self.cohort is not None
                     else sum(r.computed for r in self.running))
        return (self.env.now, self.num_done, self._next_arrival, self._admissions, len(self.waiting),
                len(self.running), kv_tokens, self.policy.free_page_groups,
                self.policy.mapped_page_groups, len(mapper.queue) if mapper else 0,
                mapper.current is not None if mapper else False)

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
            if len(self.running) == 1:
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
        for request, tokens in batch:
            slot, target = request.slot, request.computed + tokens
            if target > mapped[slot] * per_page:          # -(-target // per_page) > mapped[slot]
                targets[slot] = target
                short.append(slot)
        return targets, short

    def _preempt(self, victim: Request) -> None:
        """Preempt by swap (KV copied to host, kept) when enabled and the host has room, else by recompute."""
        self._release(victim)
        victim.swapped = self.swap.swap_out(victim.computed)
        if not victim.swapped:
            self._drop_kv(victim)
        self._iteration_preemptions += 1
        self._requeue(victim)

    def _release(self, request: Request) -> None:
        self.running.remove(request)
        if self.cohort is not None:
            if request in self.cohort:
                self.cohort.leave(request)
            else:
                self._solo.remove(request)
        self._free_slot(request)

    def _free_slot(self, request: Request) -> None:
        """Give the request's slot back to the policy (clearing its pages first under zero on-free)."""
        if self.zero_mode == "on-free":
            self._zero_at_free(self.policy.mapped[request.slot])
        self._perform_free(self.policy.free_slot(request.slot, self.policy.completed_iteration))
        request.slot = -1

    # ---- zero-on-reuse -----------------------------------------------------------------------------------
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
        return {"kv_groups": self.config.hybrid.figures(), "window_crossings": self.policy.window_crossings,
                **({"map_calls": calls["map"], "unmap_calls": calls["unmap"]} if calls is not None else {})}

    def _take_window_unmaps(self) -> None:
        """Pages that left a window (sim.memory.hybrid, ``window=unmap``): unmapped by the background mapper,
        or on the critical path of the next iteration without one."""
        if self._computed_hint is not None:
            self._perform_free(self.policy.take_window_unmaps())

    def _perform_free(self, plan: Plan) -> None:
        """Unmaps a free returns (deferred reclamation off): in the background, or on the critical path."""
        if plan and self.mapper:
            self.mapper.submit(plan, reserved=False)
        elif plan:
            self._pending_plans.append(plan)

    # ---- the decode cohort (sim.cohort) ---------------------------------------------------------------
    def _start_running(self, request: Request, slot: int, now_us: float) -> None:
        super()._start_running(request, slot, now_us)
        if self.cohort is not None:
            self._solo.append(request)

    def _admission_pool(self) -> list:
        return self._solo if self.cohort is not None else self.running

    def _cohort_pass_args(self) -> dict:
        """Keyword arguments of :meth:`_iteration_pass` for the cohort (none without one)."""
        if self.cohort is None:
            return {}
        if not self.cohort.size:
            return {"running": self._solo}
        return {"running": self._solo, "cohort": (self._cohort_scheduled, self.cohort)}

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

    def _fold_tbt(self) -> None:
        """Replace the TBT buffers by their (distinct gap, tokens) pairs (:data:`TBT_FOLD_ENTRIES`)."""
        gaps_us, tokens = tbt_distinct_us(self.tbt_us, [(self.tbt_run_gaps_us, self.tbt_run_weights)])
        self.tbt_us = array("d")
        self.tbt_run_gaps_us = array("d")
        self.tbt_run_gaps_us.frombytes(gaps_us.tobytes())
        self.tbt_run_weights = array("q")
        self.tbt_run_weights.frombytes(tokens.astype(np.int64).tobytes())
        self._tbt_fold_at = max(TBT_FOLD_ENTRIES, 2 * len(gaps_us))

    def _decode_run(self, batch: Batch, iteration: int):
        """Fast-forward k >= 2 pure-decode iterations in one event when nothing can change inside them:
        no arrival before the last one starts, no completion, every step and look-ahead target already
        mapped, the mapper idle with no background work. The steps are cut at the next arrival
        (:meth:`_run_steps`). With a decode cohort the run is the whole cohort's (every running request in it),
        up to the first member due to leave, its shape and page crossings from the cohort's totals; without
        one, from two passes over the batch (:meth:`_run_shape`). Returns k (0 when not eligible)."""
        cohort = self.cohort
        if (self._pending_plans or self._pending_zero_groups or self._pending_copy_bytes
                or (self.mapper and not self.mapper.idle)):
            return 0
        if cohort is not None:
            if batch or not self._cohort_scheduled or cohort.size != len(self.running):
                return 0
            steps, shape = cohort.steps_left(), None
        else:
            if len(batch) != len(self.running):
                return 0
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
        size = len(self.running)
        block_table_us = self._block_table_us_of(active_mapped)   # constant: no block is added inside the run
        starts_us, compute_us, gaps_us = self._run_steps(size, kv_read, longest, steps, block_table_us)
        steps = len(compute_us)
        if steps < 2:
            return 0
        yield self.env.timeout(starts_us[steps] - self.env.now)
        if cohort is not None:
            used, crossings = cohort.used_now + cohort.crossing_now(), cohort.crossings()
        self._record_decode_run(iteration, starts_us, compute_us, used, crossings, kv_read, active_mapped,
                                block_table_us)
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
        :data:`PLAIN_RUN_STEPS` steps of the first step's length), else all ``steps`` as arrays and cut there
        (the same floats). Returns ``(starts_us, compute_us, gaps_us)``: k + 1 start times (the last one the
        run's end), k compute times and k durations (us; lists of floats, or float arrays for a long run)."""
        next_arrival_us = (self.requests[self._next_arrival].arrival_at_us
                           if self._next_arrival < len(self.requests) else float("inf"))
        if self._open:                    # requests not submitted yet may arrive: stop at the router's next one
            next_arrival_us = min(next_arrival_us, self.arrival_horizon_us)
        compute, start_us = self.compute, self.env.now
        pairs = float(kv_read + size)
        if hasattr(compute, "decode_run_iter"):
            durations = compute.decode_run_iter(size, kv_read, pairs, steps, longest + 1)
        else:
            durations = iter(compute.decode_run_us(size, kv_read, pairs, steps, longest + 1).tolist())
        first_us = next(durations)
        if steps > PLAIN_RUN_STEPS and next_arrival_us - start_us > PLAIN_RUN_STEPS * (first_us + block_table_us):
            all_us = compute.decode_run_us(size, kv_read, pairs, steps, longest + 1)
            ends_us = np.cumsum(np.concatenate(([start_us], all_us + block_table_us)))
            k = int(np.searchsorted(ends_us[:-1], next_arrival_us, side="left"))
            return ends_us[: k + 1], all_us[:k], np.diff(ends_us[: k + 1])
        starts_us, compute_us, gaps_us = [start_us], [], []
        for duration_us in itertools.chain((first_us,), durations):
            if start_us >= next_arrival_us:
                break
            end_us = start_us + (duration_us + block_table_us)
            compute_us.append(duration_us)
            gaps_us.append(end_us - start_us)
            starts_us.append(end_us)
            start_us = end_us
        return starts_us, compute_us, gaps_us

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

    def _after_compute(self, request: Request) -> None:
        if self.prefix and request.hash_ids is not None and request.computed <= request.prompt_tokens:
            self.policy.donate(request.slot, request.hash_ids, request.prompt_tokens, request.computed)


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


def _requests_from_trace(trace: pd.DataFrame, slot_max_tokens: int) -> list[Request]:
    too_long = trace.index[trace["prompt_tokens"] + trace["output_tokens"] - 1 > slot_max_tokens]
    if len(too_long):
        row = trace.loc[too_long[0]]
        raise ValueError(f"request {int(row.request_id)} needs {int(row.prompt_tokens + row.output_tokens - 1)} "
                         f"KV tokens, more than a slot holds ({slot_max_tokens}); clip the trace first")
    # Quantised to 100 ns, the Azure trace's tick, so that one trace in two file forms (absolute timestamps
    # vs float seconds with ~1e-12 s noise) gives bit-identical runs.
    arrivals_us = (np.round(trace["arrival_s"].to_numpy(dtype=float) * ARRIVAL_TICKS_PER_S) * ARRIVAL_TICK_US).tolist()
    requests = [Request(int(i), a, int(p), int(o)) for i, a, p, o in zip(
        trace["request_id"], arrivals_us, trace["prompt_tokens"], trace["output_tokens"])]
    if "hash_ids" in trace.columns:
        for request, ids in zip(requests, trace["hash_ids"]):
            request.hash_ids = tuple(int(x) for x in ids) if ids is not None else None
    return requests


__all__ = ["Simulator", "SimOutput", "ITERATION_COLUMNS", "REQUEST_COLUMNS", "VmmCost"]
