"""What the KV tiers below HBM cost in simulated time (:class:`sim.core.engine.Simulator` with ``kv_tiers``).

The tier store (:class:`sim.memory.tiers.TierStore`) keeps the tiers' contents and traffic; this module turns an
admission's tier hit into a load and charges its link time to the iteration that admitted it:

* ``sync``: before the iteration computes (with swap time, in the iteration's ``swap_us`` column: host-link
  time on the critical path);
* ``layerwise``: overlapped with the iteration's compute layer by layer; only ``max(0, load - compute) +
  min(load, compute) / num_layers`` is added after the compute (also in ``swap_us``);
* ``auto``: a request's tier hit is loaded only when its load time is below the compute model's time for
  prefilling those tokens alone, else they are recomputed (counted as tier misses).

Write-back stores of HBM evictions are owed by the next iteration (critical path, :mod:`sim.memory.tiers`);
write-through stores are asynchronous (counted, not charged). The loaded pages are mapped by the admission's
own step (fresh page groups: VMM maps for vAttention, blocks for paged), as computed prompt pages would be.

Occupancy over time (:meth:`TierCharges.sample`, written as the run directory's ``tiers.parquet``): after each
iteration or decode run the engine samples the pages cached in HBM (prefix-cache entries, mapped or not) and
resident in each tier, keeping a row only when they changed, so the table is a step function (each row holds
from its ``time_us`` to the next row's).
"""
from __future__ import annotations

from array import array

from sim.timing.compute import BatchShape
from sim.memory.tiers import tier_keys


class TierCharges:
    """The engine's side of the KV tiers: admission credit, loads, charges, per-request hit tokens.

    Args:
        simulator: the :class:`sim.core.engine.Simulator` whose policy carries a ``tier_store``.
    """

    def __init__(self, simulator):
        self.sim = simulator
        self.store = simulator.policy.tier_store
        self.load_policy = simulator.config.tier_load_policy
        self.num_layers = simulator.config.model_spec.num_layers
        self.per_page = simulator.config.tokens_per_page
        self.load_pending_us = 0.0         # sync loads owed by the next iteration
        self.overlap_pending_us = 0.0      # layer-wise loads to overlap with the next iteration's compute
        self.recomputed_tokens = 0         # tier hits that ``auto`` chose to recompute
        self._planned: tuple | None = None
        self.hits: dict[int, list[int]] = {}     # request id -> tokens loaded per tier (first admission)
        self.hits_preempted: dict[int, list[int]] = {}    # request id -> tokens loaded per tier (re-admissions)
        self._sample_times_us = array("d")
        self._sample_pages = [array("q") for _ in range(1 + len(self.store.tiers))]   # HBM, then each tier

    @property
    def pending(self) -> bool:
        """Whether link time is owed to the next iteration (no decode run may fast-forward over it)."""
        return bool(self.load_pending_us or self.overlap_pending_us or self.store.pending_critical_us)

    # ---- admission -------------------------------------------------------------------------------------
    def _found(self, request, ids, start_page: int) -> tuple[list, int, int]:
        """``(found, looked_up_pages, recomputed_tokens)``: the tier pages to load after ``start_page`` HBM
        pages, the pages looked up, and the tier-hit tokens ``auto`` recomputes instead."""
        keys = tier_keys(self.sim.policy, ids, request.prompt_tokens, start_page)
        found = self.store.find(keys)
        if found and self.load_policy == "auto" and not self._load_beats_recompute(found, start_page):
            return [], len(keys), len(found) * self.per_page
        return found, len(keys), 0

    def _load_beats_recompute(self, found: list, start_page: int) -> bool:
        """Load time of ``found`` below the compute model's prefill of those tokens after ``start_page`` pages."""
        tokens, context = len(found) * self.per_page, start_page * self.per_page
        pairs = tokens * context + tokens * (tokens + 1) / 2
        recompute_us = self.sim.compute.iteration_us(BatchShape(tokens, pairs, context, 0, context + tokens))
        return self.store.load_us(found) < recompute_us

    def credit_tokens(self, request, hbm_hit_tokens: int) -> int:
        """Tokens an admission would load from the tiers after an HBM hit of ``hbm_hit_tokens`` (whole pages);
        changes nothing."""
        if hbm_hit_tokens % self.per_page:
            return 0
        found, _, _ = self._found(request, request.hash_ids, hbm_hit_tokens // self.per_page)
        return len(found) * self.per_page

    def plan(self, request, ids, hit) -> int:
        """After the HBM hit ``hit`` was mapped: the tokens to load from the tiers (0 without ids or after a
        copy-on-write partial page). Remembered for :meth:`commit`."""
        self._planned = None
        if not ids or hit.cow_tokens:
            return 0
        self._planned = self._found(request, ids, hit.cached_pages)
        found = self._planned[0]
        return len(found) * self.per_page

    def commit(self, request) -> int:
        """The admission succeeded: count the planned load, owe its time; returns the tokens loaded."""
        if self._planned is None:
            return 0
        found, looked_up, recomputed = self._planned
        self._planned = None
        self.recomputed_tokens += recomputed
        load_us = self.store.commit_load(found, looked_up)
        if self.load_policy == "layerwise":
            self.overlap_pending_us += load_us
        else:
            self.load_pending_us += load_us
        per_tier = [0] * len(self.store.tiers)
        for _, tier in found:
            per_tier[tier] += self.per_page
        if not request.preemptions:
            self.hits[request.request_id] = per_tier
        elif found:       # a re-admission after a preemption: kept apart, as the HBM hits are (helper-54)
            earlier = self.hits_preempted.get(request.request_id, [0] * len(per_tier))
            self.hits_preempted[request.request_id] = [a + b for a, b in zip(earlier, per_tier)]
        return len(found) * self.per_page

    # ---- charges ---------------------------------------------------------------------------------------
    def take_critical_us(self) -> float:
        """Link time the next iteration waits for before computing: sync loads and write-back stores."""
        pending, self.load_pending_us = self.load_pending_us, 0.0
        return pending + self.store.take_critical_us()

    def take_exposed_us(self, compute_us: float) -> float:
        """The part of this iteration's layer-wise loads its compute did not hide:
        ``max(0, load - compute) + min(load, compute) / num_layers``. A two-stage pipeline of L equal layers
        (layer i computes once its load and layer i - 1's compute are done) takes ``l + c + (L - 1) max(l, c)``
        with ``l = load / L``, ``c = compute / L``: ``load / L`` more than the compute when the compute is the
        longer stage, ``load - compute + compute / L`` more when the load is, never more than loading first."""
        load_us, self.overlap_pending_us = self.overlap_pending_us, 0.0
        if not load_us:
            return 0.0
        return max(0.0, load_us - compute_us) + min(load_us, compute_us) / self.num_layers

    # ---- records ---------------------------------------------------------------------------------------
    def counters(self) -> dict:
        """Per-tier figures for the run's counters (``tier_<kind>_<figure>``)."""
        return {**self.store.summary(), "tier_recomputed_tokens": self.recomputed_tokens,
                "tier_load_policy": self.load_policy, "tier_write_policy": self.store.write_policy}

    def sample(self, now_us: float) -> None:
        """Record the pages cached in HBM and resident per tier at ``now_us`` (simulated us, non-decreasing)
        when they differ from the last sample (the first call always records)."""
        pages = (len(self.sim.policy.cache), *self.store.occupancy_pages())
        if self._sample_times_us and all(column[-1] == n for column, n in zip(self._sample_pages, pages)):
            return
        self._sample_times_us.append(now_us)
        for column, n in zip(self._sample_pages, pages):
            column.append(n)

    def occupancy_columns(self) -> dict:
        """The samples as columns (one row per change, time order): ``time_us``, then per tier from HBM down
        (``hbm``, ``dram``, ``ssd``) ``<tier>_pages`` and ``<tier>_bytes`` (pages x the KV bytes of one cache
        page, ``tokens_per_page x kv_bytes_per_token``: the KV held, not the pool's padding)."""
        columns = {"time_us": list(self._sample_times_us)}
        kinds = ("hbm", *(tier.kind for tier in self.store.tiers))
        for kind, pages in zip(kinds, self._sample_pages):
            columns[f"{kind}_pages"] = list(pages)
            columns[f"{kind}_bytes"] = [n * self.store.page_bytes for n in pages]
        return columns

    def request_columns(self, requests) -> dict:
        """``<kind>_hit_tokens`` per request (request order): tokens loaded from each tier at its first
        admission (0 when none); ``<kind>_hit_tokens_preempted``: at its re-admissions after preemptions (as
        ``prefix_hit_tokens_preempted`` for HBM), so that every loaded token is in one column."""
        none = [0] * len(self.store.tiers)
        columns = {}
        for index, tier in enumerate(self.store.tiers):
            columns[f"{tier.kind}_hit_tokens"] = [self.hits.get(r.request_id, none)[index] for r in requests]
            columns[f"{tier.kind}_hit_tokens_preempted"] = [self.hits_preempted.get(r.request_id, none)[index]
                                                            for r in requests]
        return columns
