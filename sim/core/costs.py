"""What the serving loop charges for memory work: the VMM time of a plan (:class:`VmmCost`, drawn from
:class:`sim.timing.latency.VmmLatencyModel` per tensor-parallel worker; :class:`NoCost` for policies that make no
VMM calls) and the host swap space of preemption by swapping (:class:`SwapSpace`). Used by
:class:`sim.core.engine.Simulator` (which re-exports them)."""
from __future__ import annotations

import numpy as np

from sim.memory.plan import Plan, UnmapOp
from sim.setup.config import SimConfig
from sim.timing.draws import BufferedDraws
from sim.timing.latency import VmmLatencyModel
from sim.units import US_PER_S


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
        # the generator's draws taken in blocks (the same values in the same order: BufferedDraws); the
        # generator is this cost's alone while it draws
        self.vmm, self.create_on_demand = vmm, create_on_demand
        self.rng = BufferedDraws(rng) if isinstance(rng.bit_generator, np.random.PCG64) else rng
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
        self.refused = 0          # swap preemptions that found no room on the host: recomputed instead
        self.pending_us = 0.0
        self.total_us = 0.0

    def swap_out(self, tokens: int) -> bool:
        """Copy ``tokens`` of KV to the host if there is room; returns whether it did (a refusal for want of room
        is counted in :attr:`refused`: the victim is recomputed)."""
        size = tokens * self.kv_bytes_per_token
        if not self.enabled or tokens == 0:
            return False
        if self.used_bytes + size > self.capacity_bytes:
            self.refused += 1
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
