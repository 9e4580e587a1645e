"""The discrete-event serving loop (SimPy; time in microseconds).

One process serves iterations back to back::

    accept arrivals -> schedule (admission = slot + pages) -> take over the mapper's work for these slots
    -> policy.step(targets) [preempt by recompute and retry while it fails] -> synchronous mapping stall
    -> launch: the asynchronous mapper starts the background plan -> compute -> tokens, completions

A second process (:class:`sim.core.mapper.AsyncMapper`) maps in the background while compute runs.
"""
from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property

from typing import TYPE_CHECKING

import numpy as np
import simpy

from sim.timing.compute import BatchShape, RooflineComputeModel
from sim.core.admission import Admission
from sim.core.cohort import DecodeCohort
from sim.core.collector import quiet_collector
from sim.core.costs import NoCost, SwapSpace, VmmCost  # noqa: F401  (VmmCost re-exported)
from sim.core.decode_runs import DecodeRuns
from sim.setup.config import SimConfig
from sim.timing.latency import VmmLatencyModel
from sim.timing.layer_reads import batch_reads, read_groups
from sim.core.lifecycle import RequestBookkeeping
from sim.core.mapper import AsyncMapper
from sim.memory import build_policy
from sim.memory.plan import Plan
from sim.results.records import ITERATION_COLUMNS, REQUEST_COLUMNS, tbt_distinct_us, tbt_stats_us
from sim.results.recorder import IterationRecorder
from sim.core.request import Request
from sim.core.scheduler import SCHEDULERS
from sim.core.step import IterationStep
from sim.units import US_PER_S

if TYPE_CHECKING:
    import pandas as pd

REQUEST_KINDS = {name: (str if name in ("status", "reject_reason") else
                        int if name in ("request_id", "prompt_tokens", "output_tokens", "preemptions", "slot",
                                        "prefix_hit_tokens", "prefix_hit_tokens_preempted", "recomputed_tokens")
                        else float) for name in REQUEST_COLUMNS}
"""The Python type of each :data:`REQUEST_COLUMNS` value in :meth:`sim.core.request.Request.record`
(:meth:`SimOutput.request_table`)."""
_FLOAT_TYPES = {float, np.float64, int}
ARRIVAL_TICKS_PER_S = 10_000_000
ARRIVAL_TICK_US = US_PER_S / ARRIVAL_TICKS_PER_S
TBT_FOLD_ENTRIES = 1 << 21
"""With the decode cohort, the TBT buffers are folded into (distinct gap, tokens) pairs whenever they hold this
many entries (or twice the distinct gaps of the last fold): a week-long replica's 47 M gaps take ~300,000
pairs instead of 750 MB, and every TBT figure depends only on the token multiset
(:func:`sim.results.records.tbt_distinct_us`)."""


@dataclass
class SimOutput:
    """Raw records of one run: request tuples in the order of :data:`REQUEST_COLUMNS`, the iteration records
    (a :class:`sim.results.recorder.IterationRecorder`: columnar chunks in memory, or row groups streamed to
    Parquet), and counters."""

    request_records: list[tuple]
    recorder: IterationRecorder
    counters: dict
    extra_request_columns: dict | None = None     # column -> values in request order (KV tiers: hit tokens)
    tier_occupancy: dict | None = None            # KV tiers: pages per tier over time (TierCharges.occupancy_columns)

    @property
    def decode_runs(self) -> int:
        """Fast-forwarded decode runs recorded as blocks (coalescing statistics)."""
        return self.recorder.blocks_recorded

    def iterations_frame(self, columns: list[str] | None = None) -> pd.DataFrame:
        """All iteration records (columns :data:`ITERATION_COLUMNS`, or ``columns``), in iteration order."""
        return self.recorder.frame(columns)

    def request_table(self):
        """The per-request records as a :class:`sim.results.columns.ColumnTable` (no pandas; issue 32): int64,
        float64 and string columns as :meth:`requests_frame` infers them (ints of a float column as floats);
        None where a column holds another mix of types (a None, a float column of ints only, a bool) or there
        are extra request columns, whose frame only pandas builds."""
        if self.extra_request_columns or not self.request_records:
            return None
        from sim.results.columns import ColumnTable

        columns = {}
        for name, values in zip(REQUEST_COLUMNS, zip(*self.request_records)):
            kind = REQUEST_KINDS[name]
            if kind is str:
                if not all(type(value) is str for value in values):
                    return None
                columns[name] = np.array(values, dtype=object)
                continue
            types = set(map(type, values))
            if kind is int and types != {int}:
                return None
            # a float column: floats, numpy floats and ints (pandas' float64; all ints would make it int64)
            if kind is float and not (types <= _FLOAT_TYPES and types & {float, np.float64}):
                return None
            columns[name] = np.array(values, dtype=np.int64 if kind is int else np.float64)
        return ColumnTable(columns)

    def requests_frame(self) -> pd.DataFrame:
        """Per-request records (columns :data:`REQUEST_COLUMNS`), in request order."""
        import pandas as pd

        frame = pd.DataFrame.from_records(self.request_records, columns=list(REQUEST_COLUMNS))
        return frame.assign(**self.extra_request_columns) if self.extra_request_columns else frame


class Simulator(Admission, IterationStep, DecodeRuns, RequestBookkeeping):
    """Replays a canonical trace table through a scheduler and the vAttention memory policy.

    Args:
        config: the run configuration.
        trace: canonical table (``request_id, arrival_s, prompt_tokens, output_tokens``; a DataFrame or a
            :class:`traces.canonical.TraceColumns`), sorted by arrival;
            every request must fit a slot (``prompt + output - 1 <= config.slot_max_tokens``).
        vmm: VMM latency model (default: the built-in H200 calibration profile).
        compute: compute model (default: roofline for the config's model/GPU/TP).
        progress: called as ``progress(done_requests, total_requests)`` every 2,000 iterations.
        coalesce: fast-forward runs of identical pure-decode iterations (no arrival, completion, page map or
            mapper activity inside the run) in one SimPy event; records are identical to stepping them one
            by one (``tests/test_engine.py`` checks this), only faster. With it, requests in plain decode are
            also advanced together as a :class:`sim.core.cohort.DecodeCohort` (when every decode fits the token
            budget and there is no prefix cache), with the same records (``tests/test_cohort.py``).
        env: a shared SimPy environment (several replicas behind a router); default: a new one.
        records_path: stream the iteration records into this Parquet file as the run goes (memory stays flat);
            default: columnar chunks in memory (:class:`sim.results.recorder.IterationRecorder`).
        max_iterations: a step bound (liveness checks): exceeding it raises RuntimeError naming the state;
            default none (every loop pass already changes state or advances time, see ``_check_progress``).

    Raises:
        ValueError: if a request does not fit a slot.
    """

    _cohort_ok = True               # subclasses that change the request lifecycle (sim.cluster.disagg) turn the cohort off

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
            self.compute = replace(self.compute, **config.paged_compute_fields())    # sim.timing.paged_kernels
        if config.uses_vmm and config.kv_layout == "cross-layer" and hasattr(self.compute, "layout_attention_factor"):
            self.compute = replace(self.compute, layout_attention_factor=config.layout_attention_factor)
        self.cost = (VmmCost(vmm or VmmLatencyModel.builtin(), config, self.rng, config.create_on_demand)
                     if config.uses_vmm else NoCost())
        self.policy = build_policy(config)
        # window-aware allocation (sim.memory.hybrid) reads each stepped slot's computed tokens
        self._computed_hint = self.policy.computed if getattr(self.policy, "needs_computed", False) else None
        self.mapper = AsyncMapper(self.env, self.policy, self._background_op_us) if config.has_async_mapper else None
        self.prefix = self._donates = config.prefix_caching
        # paged prefix caching caches blocks when they are scheduled (vLLM v1; sim.core.admission._donate_scheduled)
        self._donates_when_scheduled = bool(self.prefix and getattr(self.policy, "caches_when_scheduled", False))
        # ... and keeps a recompute-preempted request's own full pages cached for its re-admission (vLLM v1;
        # every prefix cache looks a re-admission up over seq_len - 1 tokens, sim.core.admission._own_pages_arg)
        self._keeps_own_pages = bool(self.prefix and getattr(self.policy, "caches_own_pages", False))
        self._admission_refused = False        # set by _admit when the policy refused a slot
        # refused admissions repeated with nothing changed are not asked again where the policy's refusals_repeat
        # says so (sim.core.admission._admit); the switch is private: tests turn it off to compare
        self._skip_refusals = True
        self._refused_request, self._refused_key, self._refused_free = None, None, 0
        self._admissions_skipped = 0
        self._pending_copy_bytes = 0          # copy-on-write of partially shared pages, owed by the next iteration
        self.zero_mode = config.zero_on_reuse
        default_bw = config.gpu_spec.mem_bw_bytes_per_s * (4.3 / 4.8)
        self._zero_bytes_per_us = (config.memset_bytes_per_s or default_bw) / US_PER_S
        self._copy_bytes_per_us = (config.copy_bytes_per_s or default_bw) / US_PER_S
        self._pending_zero_groups = 0
        self.zero_bytes = {"critical": 0, "background": 0}
        self.cow_bytes = 0
        self.swap = SwapSpace(config)
        self.tiers = None
        if getattr(self.policy, "tier_store", None) is not None:     # KV tiers (imported only for them)
            from sim.core.tier_charges import TierCharges
            self.tiers = TierCharges(self)
        self.scheduler = SCHEDULERS[config.scheduler]
        self.requests = _requests_from_trace(trace, config.slot_max_tokens)
        self.progress = progress
        # a hybrid model's attention reads per layer group (sim.timing.layer_reads), per sequence: stepped only
        roofline = isinstance(self.compute, RooflineComputeModel) and config.pp == 1   # not the stage models
        self._read_groups = read_groups(config.model_spec, config.tp) if roofline else None
        self.coalesce = coalesce and self._read_groups is None
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
        self.num_done = self._next_arrival = self._admissions = 0
        self._pending_plans: list[Plan] = []   # critical-path work charged to the next iteration
        self._iteration_preemptions = 0
        self._carried_preemptions = 0         # preemptions of passes that recorded no iteration (_serve)
        self._iteration_start_us = 0.0       # start of the iteration being scheduled (set by _serve each pass)
        self._bg_recorded = (0, 0)
        self._sync_maps = self._sync_unmaps = 0
        self._kv_bytes_per_token = config.model_spec.kv_bytes_per_token(config.tp)
        # plain decodes advanced in aggregate (sim.core.cohort): with fast-forwarding, when every decode always fits
        # the token budget (so the scheduler's order among decodes cannot matter), without a prefix cache
        self.cohort = (DecodeCohort(config.tokens_per_page) if self.coalesce and self._cohort_ok
                       and config.max_batch_slots <= config.token_budget and not config.prefix_caching else None)
        self._solo: list[Request] = []       # with a cohort: the running requests outside it, in running order
        self._cohort_scheduled = False       # whether the iteration being scheduled runs the cohort's decodes

    # ---- driver ----------------------------------------------------------------------------------------
    def run(self) -> SimOutput:
        """Run to the last request; returns the raw records."""
        self.start()
        with quiet_collector():
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
        elsewhere and its first token emitted (disaggregated decode, :mod:`sim.cluster.disagg`): it arrives with
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
            "swap_refused_preemptions": self.swap.refused,
            "swap_total_us": self.swap.total_us, **(self.tiers.counters() if self.tiers else {}),
            "mapping_worker_us": list(getattr(self.cost, "worker_us", [])),
            "mapping_critical_us": getattr(self.cost, "critical_us", 0.0),
            "zero_critical_bytes": self.zero_bytes["critical"], "zero_background_bytes": self.zero_bytes["background"],
            "cow_bytes": self.cow_bytes, **{f"prefix_{k}": v for k, v in getattr(self.policy, "stats", {}).items()},
            "pool_page_groups": self.config.pool_page_groups, "end_at_us": self.env.now,
            **(self._hybrid_counters() if self._computed_hint is not None or self.config.hybrid_alloc else {}),
            **tbt_stats_us(self.tbt_us, [(self.tbt_run_gaps_us, self.tbt_run_weights)]),
            # the gaps themselves, for merging replicas' TBT distributions (sim.cluster.routing.merge_replicas)
            "tbt_samples": (self.tbt_us, self.tbt_run_gaps_us, self.tbt_run_weights),
        }
        self.recorder.close()
        if self.tiers is not None:
            self.tiers.sample(self.env.now)          # the state the counters report
        return SimOutput([r.record(self.config.frontend_overhead_us) for r in self.requests], self.recorder, counters,
                         self.tiers.request_columns(self.requests) if self.tiers else None,
                         self.tiers.occupancy_columns() if self.tiers else None)

    def _serve(self):
        env, iteration, requests = self.env, 0, self.requests      # fixed for the run (set by __init__): read once
        policy, mapper, tiers, cohort, recorder = self.policy, self.mapper, self.tiers, self.cohort, self.recorder
        while self.num_done < len(requests) or (self._open and not self._closed):
            self._accept_arrivals(env.now)
            if not self.running and not self.waiting:
                if self._next_arrival < len(requests):
                    yield env.timeout(requests[self._next_arrival].arrival_at_us - env.now)
                elif self._open and not self._closed:
                    self._arrival = env.event()
                    yield self._arrival
                continue
            start_at_us = self._iteration_start_us = env.now      # (an admission's first scheduling time)
            self._iteration_preemptions = self._iteration_rejections = 0
            batch, plan, preempted = yield from self._schedule()
            now_us = env.now            # (read once after each resumption: a property of SimPy's)
            members = cohort.size if self._cohort_scheduled else 0
            if not batch and not members:
                if not preempted and not self._iteration_rejections and now_us == start_at_us:
                    yield from self._unblock_admission()     # scheduling changed nothing: unblock it
                # (a pass that only preempted, P/D's wait for held KV, records no iteration: carried to the next)
                self._carried_preemptions += self._iteration_preemptions
                self._check_progress("scheduling")
                continue
            self._stalled_state = None
            has_plan = bool(plan)        # (read twice below)
            if (self.coalesce and not (preempted or has_plan or self._carried_preemptions) and now_us == start_at_us
                    and not self._run_blocked(batch)):
                steps = yield from self._decode_run(batch, iteration)
                if steps:
                    iteration += steps
                    if tiers is not None:
                        tiers.sample(env.now)
                    continue
            waited_us = now_us - start_at_us          # waiting for the mapper's op in progress
            block_table_us = self._block_table_us(batch, members)
            swap_us = self.swap.take_pending_us() + (tiers.take_critical_us() if tiers else 0.0)
            if self._pending_plans or has_plan:
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
            new, pairs, kv_read, logits, longest, prefill, targets, snapshot, blocks, block_keys = (
                self._stepped_pass(batch))
            reads = batch_reads(self._read_groups, ((r.computed, t) for r, t in batch)) if self._read_groups else ()
            compute_us = self.compute.iteration_us(BatchShape(new, pairs, kv_read, logits, longest, blocks, block_keys,
                                                              reads))
            if mapper and (targets or policy.has_background_work()):   # else the plan is empty
                mapper.submit(policy.background_plan(targets))
            if self._compute_hooked:
                yield from self._run_compute(compute_us)
            else:                         # the hook's own body, without a generator per iteration
                yield env.timeout(compute_us)
            if tiers is not None:        # a layer-by-layer load: the part the compute did not hide
                exposed_us = tiers.take_exposed_us(compute_us)
                if exposed_us:
                    yield env.timeout(exposed_us)
                    swap_us += exposed_us
            now_us = env.now
            policy.iteration_completed(iteration)
            bg_maps, bg_unmaps = self._background_since_last_record()
            recorder.add((
                iteration, start_at_us, now_us - start_at_us, compute_us, stall_us,
                mapped_sync, bg_maps, unmapped_sync + bg_unmaps, prefill,
                new - prefill, len(batch) + members, len(self.running), len(self.waiting),
                *snapshot, self._iteration_preemptions + self._carried_preemptions, block_table_us, swap_us,
                clear_copy_us))
            self._carried_preemptions = 0
            self._finish_iteration(batch, now_us, iteration)
            if tiers is not None:
                tiers.sample(now_us)
            if cohort is not None:
                self._cohort_iteration_done(now_us, members)
            iteration += 1
            if self.max_iterations is not None and iteration > self.max_iterations:
                raise RuntimeError(f"internal error: more than {self.max_iterations} iterations at "
                                   f"t={env.now:.1f} us with {self._state_line()}")
            if self.progress and iteration % 2000 == 0:
                self.progress(self.num_done, len(requests))
        if self.progress:
            self.progress(self.num_done, len(requests))

    # ---- phases ----------------------------------------------------------------------------------------
    def _run_compute(self, compute_us: float):
        """The iteration's GPU compute (a hook: :mod:`sim.cluster.colocate` serialises several tenants' compute
        on one GPU here; the loop yields this body's timeout itself unless a subclass replaces it)."""
        yield self.env.timeout(compute_us)

    @cached_property
    def _compute_hooked(self) -> bool:
        """Whether a subclass replaced :meth:`_run_compute`."""
        return type(self)._run_compute is not Simulator._run_compute

    # ---- zero-on-reuse -----------------------------------------------------------------------------------
    # ---- the decode cohort (sim.core.cohort) ---------------------------------------------------------------
    def _fold_tbt(self) -> None:
        """Replace the TBT buffers by their (distinct gap, tokens) pairs (:data:`TBT_FOLD_ENTRIES`)."""
        gaps_us, tokens = tbt_distinct_us(self.tbt_us, [(self.tbt_run_gaps_us, self.tbt_run_weights)])
        self.tbt_us = array("d")
        self.tbt_run_gaps_us = array("d")
        self.tbt_run_gaps_us.frombytes(gaps_us.tobytes())
        self.tbt_run_weights = array("q")
        self.tbt_run_weights.frombytes(tokens.astype(np.int64).tobytes())
        self._tbt_fold_at = max(TBT_FOLD_ENTRIES, 2 * len(gaps_us))

    def _after_compute(self, request: Request) -> None:
        if self.prefix and request.hash_ids is not None and request.computed <= request.prompt_tokens:
            self.policy.donate(request.slot, request.hash_ids, request.prompt_tokens, request.computed)


class TraceTableError(ValueError):
    """A trace table handed to the simulator that is not canonical (:func:`check_trace_table`); the message names
    the column and the first bad row."""


TRACE_COLUMNS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens")


def check_trace_table(trace) -> None:
    """Refuse a trace table the simulator cannot replay exactly (the file loaders of :mod:`traces` check files;
    this checks a table given directly, e.g. through the Python API): a table with the columns of
    :data:`TRACE_COLUMNS` (a pandas DataFrame or :class:`traces.canonical.TraceColumns`), ``request_id`` unique,
    ``arrival_s`` finite, >= 0, not decreasing and within the clock's exact range (2**53 ticks of 100 ns), token
    counts whole numbers >= 1. An arrival that is NaN would never be reached (the run would not end), an unsorted
    one would be served out of order: both are refused, not repaired (``traces.renumber`` sorts a table).

    Raises:
        TypeError: not a table. TraceTableError: naming the column, the row (0-based position) and the value.
    """
    if not hasattr(trace, "columns") or not hasattr(trace, "__getitem__") or isinstance(trace, np.ndarray):
        raise TypeError(f"trace: expected a table with columns {', '.join(TRACE_COLUMNS)} (a pandas DataFrame, or "
                        f"traces.load_trace / traces.synthesize's result), got {type(trace).__name__}")
    missing = [name for name in TRACE_COLUMNS if name not in trace.columns]
    if missing:
        raise TraceTableError(f"trace: missing column(s) {', '.join(missing)} (a canonical trace has "
                              f"{', '.join(TRACE_COLUMNS)})")

    def first(bad: np.ndarray, column: str, what: str, values: np.ndarray):
        if bad.any():
            row = int(np.argmax(bad))
            value = values[row].item() if isinstance(values[row], np.generic) else values[row]
            raise TraceTableError(f"trace: column {column!r}, row {row}: {what} (got {value!r})")

    for column in ("prompt_tokens", "output_tokens"):
        values = np.asarray(trace[column])
        if values.dtype.kind not in "iuf":
            raise TraceTableError(f"trace: column {column!r}: token counts must be numbers, not {values.dtype}")
        as_float = values.astype(float)
        first(~np.isfinite(as_float) | (as_float != np.floor(as_float)), column, "not a whole number", values)
        first(as_float < 1, column, "a token count must be >= 1", values)
    arrival = np.asarray(trace["arrival_s"])
    if arrival.dtype.kind not in "iuf":
        raise TraceTableError(f"trace: column 'arrival_s': must be numbers (seconds), not {arrival.dtype}")
    arrival = arrival.astype(float)
    first(~np.isfinite(arrival), "arrival_s", "not a finite time", arrival)
    first(arrival < 0, "arrival_s", "negative (a canonical trace starts at 0 s)", arrival)
    first(arrival * ARRIVAL_TICKS_PER_S > 2.0 ** 53, "arrival_s", "beyond the clock's exact range "
          f"({2 ** 53 / ARRIVAL_TICKS_PER_S:,.0f} s)", arrival)
    if len(arrival) > 1:
        first(np.concatenate(([False], arrival[1:] < arrival[:-1])), "arrival_s",
              "earlier than the row before it: rows must be sorted by arrival (traces.renumber sorts a table)",
              arrival)
    ids = np.asarray(trace["request_id"])
    _, index = np.unique(ids, return_index=True)       # each id's first row
    if len(index) != len(ids):
        repeated = np.ones(len(ids), dtype=bool)
        repeated[index] = False
        first(repeated, "request_id", "appears twice (ids are unique)", ids)


def _requests_from_trace(trace, slot_max_tokens: int) -> list[Request]:
    """The trace's requests (a canonical DataFrame or :class:`traces.canonical.TraceColumns`), in its order.

    Raises:
        TypeError / TraceTableError: not a canonical table (:func:`check_trace_table`).
        ValueError: the first request that needs more KV tokens than a slot holds.
    """
    check_trace_table(trace)
    prompt, output = np.asarray(trace["prompt_tokens"]), np.asarray(trace["output_tokens"])
    too_long = np.flatnonzero(prompt + output - 1 > slot_max_tokens)
    if len(too_long):
        row = int(too_long[0])
        raise ValueError(f"request {int(np.asarray(trace['request_id'])[row])} needs "
                         f"{int(prompt[row] + output[row] - 1)} "
                         f"KV tokens, more than a slot holds ({slot_max_tokens}); clip the trace first")
    # Quantised to 100 ns, the Azure trace's tick, so that one trace in two file forms (absolute timestamps
    # vs float seconds with ~1e-12 s noise) gives bit-identical runs.
    arrivals_us = (np.round(np.asarray(trace["arrival_s"], dtype=float) * ARRIVAL_TICKS_PER_S)
                   * ARRIVAL_TICK_US).tolist()
    requests = [Request(int(i), a, int(p), int(o)) for i, a, p, o in zip(
        np.asarray(trace["request_id"]).tolist(), arrivals_us, prompt.tolist(), output.tolist())]
    if "hash_ids" in trace.columns:
        for request, ids in zip(requests, trace["hash_ids"]):
            request.hash_ids = tuple(int(x) for x in ids) if ids is not None else None
    return requests


__all__ = ["Simulator", "SimOutput", "ITERATION_COLUMNS", "REQUEST_COLUMNS", "VmmCost"]
